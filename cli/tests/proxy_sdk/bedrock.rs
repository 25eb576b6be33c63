//! Amazon Bedrock's Converse API (boto3's `bedrock-runtime` client) through the proxy,
//! as docs/PROXY.md ("Amazon Bedrock") sets it up, against the fake upstream: the agent
//! holds no AWS credential, only its run token as the Bedrock API key
//! (`AWS_BEARER_TOKEN_BEDROCK`); the proxy signs each call with the operator's, and the
//! fake recomputes the signature with botocore; the ledger settles what the fake
//! billed. Crafted model ids, queries, bodies and sizes are refused in Bedrock's error
//! shape and never forwarded; a stream whose frame fails its CRC, or that cannot be
//! classified, is held at its reservation; usage above the reservation is an overrun.

use std::io::{Read, Write};

use super::*;

/// A cross-region inference profile id, priced by the base model's price
/// (`anthropic.claude-3-5-haiku`).
const HAIKU: &str = "us.anthropic.claude-3-5-haiku-20241022-v1:0";
/// A system inference profile's ARN for [`HAIKU`]: priced as its id, sent with its `/`
/// encoded (`%2F`) as botocore encodes it.
const HAIKU_ARN: &str =
    "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-5-haiku-20241022-v1:0";
/// 100 input tokens, 50 output, 10 read from the cache ($0.25/M), 20 written ($1.25/M).
const CACHED: &str = "fake-usage-100-50-10-20";
/// Billed far past any reservation of a 100-token limit.
const OVER: &str = "fake-usage-100-1000000";
/// The largest body the bedrock upstream takes.
const MAX_BODY: usize = 65_536;

/// The bedrock upstream and its prices, on the fake over HTTP.
pub(super) fn policy(http: &FakeUpstream) -> String {
    let mut p = format!(
        "[upstreams.bedrock]\nurl = \"{}\"\nkind = \"bedrock\"\ncredential = \"aws\"\n\
         aws_region = \"{}\"\npaths = [\"/model\"]\ntimeout_ms = 30000\nmax_request_bytes = {MAX_BODY}\n\
         [prices.bedrock.\"anthropic.claude-3-5-haiku\"]\ninput_per_mtok = \"{INPUT_PER_MTOK}\"\n\
         output_per_mtok = \"{OUTPUT_PER_MTOK}\"\nmax_output_tokens = 4096\n\
         [prices.bedrock.\"{CACHED}\"]\ninput_per_mtok = \"{INPUT_PER_MTOK}\"\n\
         cached_input_per_mtok = \"0.25\"\ncache_write_per_mtok = \"1.25\"\n\
         output_per_mtok = \"{OUTPUT_PER_MTOK}\"\nmax_output_tokens = 4096\n",
        http.url(),
        tally_testkit::upstream::AWS_REGION,
    );
    for model in [
        "fake-ok",
        "fake-cut",
        "fake-bad-crc",
        "fake-bad-frame",
        "fake-cut-frame",
        "fake-exception",
        "fake-metadata-twice",
        OVER,
    ] {
        p.push_str(&format!(
            "[prices.bedrock.\"{model}\"]\ninput_per_mtok = \"{INPUT_PER_MTOK}\"\n\
             output_per_mtok = \"{OUTPUT_PER_MTOK}\"\nmax_output_tokens = 4096\n"
        ));
    }
    p
}

/// What the fake bills Bedrock's calls at, by the model id it was called with.
pub(super) fn prices() -> Vec<(&'static str, Price)> {
    let price = Price::usd(INPUT_PER_MTOK, OUTPUT_PER_MTOK);
    vec![
        (HAIKU, price),
        (HAIKU_ARN, price),
        ("fake-ok", price),
        (OVER, price),
        (
            CACHED,
            Price {
                cached_input_per_mtok: 250_000_000,
                cache_write_per_mtok: 1_250_000_000,
                ..price
            },
        ),
    ]
}

/// Whether python3 has boto3 (and botocore) at the pinned version; if not, SKIPPED (CI:
/// fails).
fn boto3() -> bool {
    sdks()
        && tally_testkit::have(
            "python3",
            &[
                "-c",
                "import boto3, botocore, sys; \
                 sys.exit(0 if (boto3.__version__, botocore.__version__) == ('1.43.11', '1.43.11') else 1)",
            ],
            "python3 -m pip install boto3==1.43.11 botocore==1.43.11",
        )
}

impl Proxy {
    /// `bedrock.py` with `token` as the Bedrock API key; its JSON line.
    fn bedrock(&self, token: &str, model: &str, args: &[&str]) -> Value {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/proxy_sdk/bedrock.py");
        let mut c = Command::new("python3");
        c.arg(script)
            .arg(format!("http://127.0.0.1:{}/bedrock", self.port))
            .arg(model)
            .args(args);
        // No AWS credential, configuration or metadata service: only the API key.
        for v in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_PROFILE",
            "AWS_DEFAULT_REGION",
            "AWS_REGION",
        ] {
            c.env_remove(v);
        }
        c.env("AWS_BEARER_TOKEN_BEDROCK", token)
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::null());
        let out = c.output().expect("python3");
        assert!(out.status.success(), "bedrock.py failed: {}", text(&out));
        let line = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {line}"))
    }
}

/// boto3's `converse` and `converse_stream`, through the proxy: settled at the usage the
/// fake reported, at the price the id's rules find (a cross-region profile at its base
/// model's, an inference profile's ARN at its id's), cache reads and writes at their own
/// prices; the fake got a SigV4 signature botocore recomputes, the model id in the path
/// encoded as the SDK encodes it (`%3A`, and an ARN's `/` as `%2F`), the output limit in
/// `inferenceConfig.maxTokens` (the proxy's where the agent gave none), and none of the
/// agent's key or its own signing headers.
#[test]
fn boto3_converse_through_the_proxy_is_signed_and_the_ledger_is_the_bill() {
    if !boto3() {
        return;
    }
    let mut proxy = Proxy::start("");
    let mut tokens = vec![];
    for (model, stream) in [
        (HAIKU, false),
        (HAIKU, true),
        (CACHED, false),
        (CACHED, true),
        (HAIKU_ARN, false),
        (HAIKU_ARN, true),
    ] {
        tokens.push(converses(&proxy, tokens.len(), model, stream));
    }
    tokens.push(limit_set_by_the_proxy(&proxy));
    tokens.push(agent_signing_headers_dropped(&proxy));
    let t: Vec<&str> = tokens.iter().map(String::as_str).collect();
    assert!(proxy.upstreams_saw_only_the_key(&t) >= 8);
    proxy.verifies_the_bill();
}

/// One boto3 call (the `n`th) to `model`, streamed or not, on a run of its own: what it
/// was settled at, and what the fake got. The run's token.
fn converses(proxy: &Proxy, n: usize, model: &str, stream: bool) -> String {
    let run = format!("bedrock-{n}-{stream}");
    let token = proxy.run(&run, json!({"spend_cents": 100}));
    let before = proxy.http.seen().len();
    let args: &[&str] = if stream { &["--stream"] } else { &[] };
    let r = proxy.bedrock(&token, model, args);
    assert_eq!(r["ok"], true, "{run}: {r}");
    assert_eq!(r["headers"]["x-tally-run"], run.as_str(), "{r}");
    assert_eq!(r["usage"]["inputTokens"], 100, "{r}");
    assert!(!r["text"].as_str().unwrap_or("").is_empty(), "{r}");
    let s = proxy.standing_settled(&run);
    let want = if model == CACHED {
        100 * IN_NANOS + 10 * 250 + 20 * 1250 + 50 * OUT_NANOS
    } else {
        100 * IN_NANOS + 50 * OUT_NANOS
    };
    assert_eq!(nanos(&s, "settled"), want, "{run}: {s}");
    let seen = &proxy.http.seen()[before];
    let method = if stream {
        "converse-stream"
    } else {
        "converse"
    };
    let sent = model.replace(':', "%3A").replace('/', "%2F");
    assert_eq!(seen.path, format!("/model/{sent}/{method}"));
    assert!(
        seen.real_key,
        "botocore did not verify the signature: {seen:?}"
    );
    assert_eq!(seen.max_tokens, Some(100), "{seen:?}");
    token
}

/// No limit given: the proxy sets `inferenceConfig.maxTokens` to what the run can pay.
fn limit_set_by_the_proxy(proxy: &Proxy) -> String {
    let token = proxy.run("bedrock-nomax", json!({"spend_cents": 10}));
    let r = proxy.bedrock(&token, "fake-ok", &["--no-max-tokens"]);
    assert_eq!(r["ok"], true, "{r}");
    let injected = proxy.http.seen().last().and_then(|s| s.max_tokens);
    assert!(
        injected.is_some_and(|n| (100..=200).contains(&n)),
        "{injected:?} output tokens for a 10-cent budget at 0.05 cent each"
    );
    token
}

/// The agent's own signing headers are dropped: the session token and date the fake
/// checks are the proxy's, and no content hash is forwarded.
fn agent_signing_headers_dropped(proxy: &Proxy) -> String {
    let token = proxy.run("bedrock-headers", json!({"spend_cents": 100}));
    let (status, head, body) = raw(
        proxy.port,
        "/bedrock/model/fake-ok/converse",
        &[
            ("authorization", &format!("Bearer {token}")),
            ("x-amz-date", "20200101T000000Z"),
            ("x-amz-security-token", "agent-session-token"),
            ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
        ],
        r#"{"messages":[{"role":"user","content":[{"text":"hi"}]}],"inferenceConfig":{"maxTokens":10}}"#,
    );
    assert_eq!(status, 200, "{head}{body}");
    let seen = proxy.http.seen().last().cloned().expect("seen");
    assert!(seen.real_key, "{seen:?}");
    assert!(
        !seen.headers.iter().any(|h| h == "x-amz-content-sha256"),
        "{seen:?}"
    );
    token
}

/// One request to the proxy on a connection of its own: the status, the head and the
/// body as text.
fn raw(port: u16, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String, String) {
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    // A refusal may come before the whole body is read.
    let _ = c.write_all(req.as_bytes());
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out).into_owned();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (status, head.to_lowercase(), body.to_owned())
}

/// Crafted model ids (a dot segment, an encoded `.`, upper case, a prompt's ARN), a
/// query, members no price covers, the body's own `modelId`, an unpriced model and a
/// body past `max_request_bytes` are refused in Bedrock's shape (boto3 raises
/// `ClientError` with the code and tally's reason) and never forwarded; a stream whose
/// frame fails its CRC, or is of a type ConverseStream never sends, is cut and held at
/// its reservation (unknown); usage past the reservation is settled whole, an overrun
/// `tally verify` lists.
#[test]
fn crafted_bedrock_calls_are_refused_and_bad_streams_held() {
    if !boto3() {
        return;
    }
    let mut proxy = Proxy::start("");
    let token = proxy.run("crafted", json!({"spend_cents": 100}));
    let hi = r#"{"messages":[{"role":"user","content":[{"text":"hi"}]}]}"#;
    let big = format!(
        r#"{{"messages":[{{"role":"user","content":[{{"text":"{}"}}]}}]}}"#,
        "x".repeat(MAX_BODY)
    );
    let before = proxy.http.seen().len();
    for case in crafted(hi, &big) {
        refused_in_bedrocks_shape(&proxy, &token, case);
    }
    assert_eq!(
        proxy.http.seen().len(),
        before,
        "a refused request reached the upstream"
    );
    // boto3 raises ClientError with Bedrock's code and tally's reason.
    let poor = proxy.run("poor-bedrock", json!({"spend_cents": 1}));
    let r = proxy.bedrock(&poor, HAIKU, &[]);
    assert_eq!(r["code"], "AccessDeniedException", "{r}");
    raised(&r, "ClientError", 403, "reservation_insufficient");
    let r = proxy.bedrock("tly_not.a-token", HAIKU, &[]);
    assert_eq!(r["code"], "UnrecognizedClientException", "{r}");
    raised(&r, "ClientError", 401, "invalid_token");
    bad_frames_are_held(&proxy);
    overrun_settled_whole(&mut proxy);
}

/// A crafted request: (path, body, status, `x-amzn-errortype`, what the message names).
type Crafted<'a> = (&'static str, &'a str, u16, &'static str, &'static str);

/// The crafted requests, each refused before the upstream.
fn crafted<'a>(hi: &'a str, big: &'a str) -> Vec<Crafted<'a>> {
    vec![
        (
            "/bedrock/model/..%2F..%2Fetc/converse",
            hi,
            403,
            "accessdenied",
            "path",
        ),
        (
            "/bedrock/model/%2E%2E/converse",
            hi,
            403,
            "accessdenied",
            "path",
        ),
        (
            "/bedrock/model/fake-ok/../x/converse",
            hi,
            403,
            "accessdenied",
            "path",
        ),
        (
            "/bedrock/model/Fake-OK/converse",
            hi,
            403,
            "accessdenied",
            "meter",
        ),
        (
            "/bedrock/model/fake-ok/invoke",
            hi,
            403,
            "accessdenied",
            "meter",
        ),
        (
            "/bedrock/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Aprompt%2Fp1/converse",
            hi,
            403,
            "accessdenied",
            "path",
        ),
        (
            "/bedrock/model/fake-ok/converse?x=1",
            hi,
            403,
            "accessdenied",
            "query",
        ),
        (
            "/bedrock/model/fake-ok/converse",
            r#"{"messages":[],"guardrailConfig":{"guardrailIdentifier":"g","guardrailVersion":"1"}}"#,
            403,
            "accessdenied",
            "guardrailConfig",
        ),
        (
            "/bedrock/model/fake-ok/converse",
            r#"{"messages":[],"additionalModelRequestFields":{"max_tokens":100000}}"#,
            403,
            "accessdenied",
            "additionalModelRequestFields",
        ),
        (
            "/bedrock/model/fake-ok/converse",
            r#"{"messages":[],"modelId":"other"}"#,
            403,
            "accessdenied",
            "modelId",
        ),
        (
            "/bedrock/model/amazon.nova-pro-v1%3A0/converse",
            hi,
            403,
            "accessdenied",
            "no price",
        ),
        (
            "/bedrock/model/fake-ok/converse",
            r#"{"messages":[],"inferenceConfig":{"maxTokens":5,"maxTokens":9}}"#,
            400,
            "validationexception",
            "JSON",
        ),
        (
            "/bedrock/model/fake-ok/converse",
            big,
            413,
            "validationexception",
            "max_request_bytes",
        ),
    ]
}

/// `case` sent with `token`: refused in Bedrock's shape, with tally's reason.
fn refused_in_bedrocks_shape(proxy: &Proxy, token: &str, case: Crafted<'_>) {
    let (path, body, status, kind, why) = case;
    let bearer = format!("Bearer {token}");
    let auth = [("authorization", bearer.as_str())];
    let (got, head, answer) = raw(proxy.port, path, &auth, body);
    assert_eq!(got, status, "{path}: {head}{answer}");
    assert!(
        head.contains(&format!("x-amzn-errortype: {kind}")),
        "{path}: {head}"
    );
    let v: Value = serde_json::from_str(&answer).unwrap_or(Value::Null);
    let m = v["message"].as_str().unwrap_or("");
    assert!(m.contains(why), "{path}: {why} not in {answer}");
}

/// A stream cut by a frame that fails its CRC, or that cannot be classified: boto3 sees
/// an error, the call is held at its reservation.
fn bad_frames_are_held(proxy: &Proxy) {
    for model in ["fake-bad-crc", "fake-bad-frame"] {
        let run = format!("stream-{model}");
        let token = proxy.run(&run, json!({"spend_cents": 100}));
        let r = proxy.bedrock(&token, model, &["--stream"]);
        assert!(
            r.get("error").is_some() && r.get("ok").is_none(),
            "{model}: {r}"
        );
        let s = proxy.standing(&run);
        assert_eq!(nanos(&s, "settled"), 0, "{model}: {s}");
        assert!(
            nanos(&s, "held") > 50 * OUT_NANOS,
            "{model}: held at its reservation: {s}"
        );
    }
}

/// Billed past its reservation: settled whole, an overrun `tally verify` lists.
fn overrun_settled_whole(proxy: &mut Proxy) {
    let token = proxy.run("overrun", json!({"spend_cents": 100}));
    let r = proxy.bedrock(&token, OVER, &[]);
    assert_eq!(r["ok"], true, "{r}");
    let s = proxy.standing_settled("overrun");
    assert_eq!(
        nanos(&s, "settled"),
        100 * IN_NANOS + 1_000_000 * OUT_NANOS,
        "{s}"
    );
    let report = proxy.verifies_the_bill();
    let overruns: Vec<&Value> = report["audit"]["overruns"]
        .as_array()
        .expect("overruns")
        .iter()
        .filter(|o| o["run"] == "overrun")
        .collect();
    assert_eq!(overruns.len(), 1, "{report}");
}

/// Streams that go wrong in their frames: one cut inside a frame (the body ending
/// cleanly) is cut for the agent and held at its reservation; one with an exception
/// frame and then usage anyway, or with two `metadata` events (a huge one with a
/// wrong total, then a tiny one), is never settled at the usage it says last: its
/// usage is refused (`implausible`) and it is settled at its reservation.
#[test]
fn bedrock_streams_cut_in_a_frame_excepted_or_told_twice_are_not_believed() {
    if !boto3() {
        return;
    }
    let proxy = Proxy::start("");
    let token = proxy.run("cut-frame", json!({"spend_cents": 100}));
    let r = proxy.bedrock(&token, "fake-cut-frame", &["--stream"]);
    assert!(r.get("error").is_some() && r.get("ok").is_none(), "{r}");
    let s = proxy.standing("cut-frame");
    assert_eq!(nanos(&s, "settled"), 0, "{s}");
    assert!(
        nanos(&s, "held") > 50 * OUT_NANOS,
        "held at its reservation: {s}"
    );
    // (model, whether boto3 raises, the usage it said last)
    for (model, agent_sees_an_error, said) in [
        ("fake-exception", true, 100 * IN_NANOS + 50 * OUT_NANOS),
        ("fake-metadata-twice", false, IN_NANOS + OUT_NANOS),
    ] {
        let run = format!("stream-{model}");
        let token = proxy.run(&run, json!({"spend_cents": 100}));
        let r = proxy.bedrock(&token, model, &["--stream"]);
        assert_eq!(
            r.get("error").is_some(),
            agent_sees_an_error,
            "{model}: {r}"
        );
        let s = proxy.standing_settled(&run);
        let settled = nanos(&s, "settled");
        assert!(
            settled != said && settled > 50 * OUT_NANOS,
            "{model}: settled at its reservation, not at the last usage said: {s}"
        );
    }
}
