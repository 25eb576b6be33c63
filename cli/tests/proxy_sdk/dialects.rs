//! Gemini (`google-genai`) and Azure OpenAI (`openai.AzureOpenAI`) through the proxy,
//! as docs/PROXY.md ("The Gemini SDK", "Azure OpenAI") sets them up, against the fake
//! upstream: the call goes through streamed and not, the upstream gets the real key in
//! its API's header and the body as the proxy reads it, the ledger settles what the
//! upstream billed; and crafted paths, queries and keys are refused, nothing forwarded.

use std::io::{Read, Write};

use super::*;

/// Whether python3 has `google-genai` at its pinned version (and the pinned `openai`);
/// if not, SKIPPED (CI: fails).
fn genai() -> bool {
    sdks()
        && tally_testkit::have(
            "python3",
            &[
                "-c",
                "import google.genai as g, sys; sys.exit(0 if g.__version__ == '3.6.1' else 1)",
            ],
            "python3 -m pip install google-genai==3.6.1",
        )
}

/// Each SDK's calls, plain and streamed: settled at the usage the fake reported, at the
/// price of the model (Gemini: the path's; Azure: the deployment's), thoughts billed as
/// output and cached prompt tokens at the cached price; the fake got the real key where
/// its API puts it, no token anywhere, and the body with the output limit in place.
#[test]
fn gemini_and_azure_sdks_call_through_the_proxy_and_the_ledger_is_the_bill() {
    if !genai() {
        return;
    }
    let mut proxy = Proxy::start("");
    let mut tokens = vec![];
    for stream in [false, true] {
        let run = format!("gemini-{stream}");
        let token = proxy.run(&run, json!({"spend_cents": 100}));
        let mut args = vec!["--model", GEMINI_CACHED_MODEL];
        if stream {
            args.push("--stream");
        }
        let before = proxy.http.seen().len();
        let r = proxy.call("gemini", false, &token, &args);
        assert_eq!(r["ok"], true, "{run}: {r}");
        assert_eq!(r["headers"]["x-tally-run"], run.as_str(), "{r}");
        assert_eq!(r["usage"]["thoughts_token_count"], 20, "{r}");
        assert!(!r["text"].as_str().unwrap_or("").is_empty(), "{r}");
        let s = proxy.standing_settled(&run);
        // 60 prompt tokens at $1/M, 40 cached at $0.25/M, 50 out (20 thoughts) at $500/M.
        assert_eq!(
            nanos(&s, "settled"),
            60 * IN_NANOS + 40 * 250 + 50 * OUT_NANOS,
            "{s}"
        );
        let seen = &proxy.http.seen()[before];
        let method = if stream {
            "streamGenerateContent?alt=sse"
        } else {
            "generateContent"
        };
        // google-genai 3.6.1 calls `/v1` on a base URL of its user's.
        assert_eq!(
            seen.path,
            format!("/v1/models/{GEMINI_CACHED_MODEL}:{method}")
        );
        let body: Value = serde_json::from_str(&seen.body).expect("a JSON body");
        assert_eq!(body["generationConfig"]["maxOutputTokens"], 100, "{body}");
        assert!(body.get("model").is_none(), "{body}");
        let said = body["contents"][0]["parts"][0]["text"]
            .as_str()
            .unwrap_or("");
        assert!(said.starts_with("Say hello."), "{body}");
        tokens.push(token);
    }
    // No limit given: the proxy sets `generationConfig.maxOutputTokens` to what the run
    // can pay, capped by the model's 4096.
    let token = proxy.run("gemini-nomax", json!({"spend_cents": 10}));
    let r = proxy.call(
        "gemini",
        false,
        &token,
        &["--model", "fake-ok", "--no-max-tokens"],
    );
    assert_eq!(r["ok"], true, "{r}");
    let injected = proxy.http.seen().last().and_then(|s| s.max_tokens);
    assert!(
        injected.is_some_and(|n| (100..=200).contains(&n)),
        "{injected:?} output tokens for a 10-cent budget at 0.05 cent each"
    );
    tokens.push(token);
    for stream in [false, true] {
        let run = format!("azure-{stream}");
        let token = proxy.run(&run, json!({"spend_cents": 100}));
        let mut args = vec!["--model", AZURE_DEPLOYMENT];
        if stream {
            args.push("--stream");
        }
        let before = proxy.http.seen().len();
        let r = proxy.call("azure", false, &token, &args);
        assert_eq!(r["ok"], true, "{run}: {r}");
        assert_eq!(r["headers"]["x-tally-run"], run.as_str(), "{r}");
        let s = proxy.standing_settled(&run);
        // 100 in at $2/M, 50 out at $300/M: the deployment's model's price.
        assert_eq!(nanos(&s, "settled"), 100 * 2_000 + 50 * 300_000, "{s}");
        let seen = &proxy.http.seen()[before];
        assert_eq!(
            seen.path,
            format!(
                "/openai/deployments/{AZURE_DEPLOYMENT}/chat/completions?api-version={AZURE_API_VERSION}"
            )
        );
        assert_eq!(seen.max_tokens, Some(100), "{seen:?}");
        tokens.push(token);
    }
    // The Responses API: the deployment in the body's `model`.
    let token = proxy.run("azure-responses", json!({"spend_cents": 100}));
    let r = proxy.call(
        "azure",
        false,
        &token,
        &["--model", AZURE_DEPLOYMENT, "--responses"],
    );
    assert_eq!(r["ok"], true, "{r}");
    let s = proxy.standing_settled("azure-responses");
    assert_eq!(nanos(&s, "settled"), 100 * 2_000 + 50 * 300_000, "{s}");
    let seen = proxy.http.seen().last().cloned().expect("seen");
    assert_eq!(
        seen.path,
        format!("/openai/responses?api-version={AZURE_API_VERSION}")
    );
    assert_eq!(seen.max_tokens, Some(100), "{seen:?}");
    tokens.push(token);
    let t: Vec<&str> = tokens.iter().map(String::as_str).collect();
    assert_eq!(proxy.upstreams_saw_only_the_key(&t), 6);
    proxy.verifies_the_bill();
}

/// One request to the proxy on a connection of its own: the answer's status and body.
fn raw(port: u16, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, Value) {
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
    c.write_all(req.as_bytes()).expect("send");
    let mut out = String::new();
    c.read_to_string(&mut out).expect("answer");
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let json = out
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (status, json)
}

/// Crafted requests are refused in the dialect and never forwarded: a model id spelt
/// otherwise (an encoded slash, a dot segment, upper case, a second `:method`), a
/// stream without `alt=sse`, a `key=` in the query, the body's own `model` or a
/// snake_case limit beside the path's; an Azure deployment not in the policy (named in
/// the refusal), an `api-version` not listed, a body naming another model. The SDKs
/// raise their own errors with tally's reason.
#[test]
fn crafted_gemini_and_azure_requests_are_refused_and_never_forwarded() {
    if !genai() {
        return;
    }
    let mut proxy = Proxy::start("");
    let token = proxy.run("crafted", json!({"spend_cents": 100}));
    let goog = [("x-goog-api-key", token.as_str())];
    let azure = [("api-key", token.as_str())];
    let text = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#;
    let before = proxy.http.seen().len();
    for (path, body, why) in [
        (
            "/gemini/v1beta/models/fake-ok:generateContent?key=AIza",
            text,
            "query",
        ),
        (
            "/gemini/v1beta/models/fake-ok:streamGenerateContent",
            text,
            "alt=sse",
        ),
        (
            "/gemini/v1beta/models/fake-ok:streamGenerateContent?alt=sse&key=x",
            text,
            "query",
        ),
        (
            "/gemini/v1beta/models/..%2Ffake-ok:generateContent",
            text,
            "path",
        ),
        (
            "/gemini/v1beta/models/x/../fake-ok:generateContent",
            text,
            "path",
        ),
        (
            "/gemini/v1beta/models/Fake-OK:generateContent",
            text,
            "meter",
        ),
        (
            "/gemini/v1beta/models/fake-ok:generateContent:streamGenerateContent",
            text,
            "meter",
        ),
        ("/gemini/v1beta/models/fake-ok:countTokens", text, "meter"),
        (
            "/gemini/v1beta/tunedModels/fake-ok:generateContent",
            text,
            "path",
        ),
        (
            "/gemini/v1beta/models/fake-ok:generateContent",
            r#"{"model":"fake-ok","contents":[]}"#,
            "model",
        ),
        (
            "/gemini/v1beta/models/fake-ok:generateContent",
            r#"{"contents":[],"generation_config":{"max_output_tokens":100000}}"#,
            "generation_config",
        ),
        (
            "/gemini/v1beta/models/fake-ok:generateContent",
            r#"{"contents":[],"tools":[{"googleSearch":{}}]}"#,
            "googleSearch",
        ),
        (
            "/gemini/v1beta/models/fake-ok:generateContent",
            r#"{"contents":[],"cachedContent":"cachedContents/x"}"#,
            "cachedContent",
        ),
    ] {
        let (status, v) = raw(proxy.port, path, &goog, body);
        // A body tally cannot read is 400; what it cannot meter or price, 403.
        let (want, rpc) = if why == "model" {
            (400, "INVALID_ARGUMENT")
        } else {
            (403, "PERMISSION_DENIED")
        };
        assert_eq!(status, want, "{path} {body}: {v}");
        assert_eq!(v["error"]["status"], rpc, "{v}");
        assert_eq!(v["error"]["details"][0]["domain"], "tally", "{v}");
        let m = v["error"]["message"].as_str().unwrap_or("");
        assert!(m.contains(why), "{path}: {why} not in {v}");
    }
    let chat = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":10}"#;
    let v = format!("api-version={AZURE_API_VERSION}");
    for (path, body, why) in [
        (
            format!("/azure/openai/deployments/other/chat/completions?{v}"),
            chat.to_owned(),
            "deployment `other`",
        ),
        (
            format!("/azure/openai/deployments/{AZURE_DEPLOYMENT}/chat/completions?api-version=2099-01-01"),
            chat.to_owned(),
            "api_versions",
        ),
        (
            format!("/azure/openai/deployments/{AZURE_DEPLOYMENT}/chat/completions"),
            chat.to_owned(),
            "api-version",
        ),
        (
            format!("/azure/openai/deployments/{AZURE_DEPLOYMENT}/chat/completions?{v}&x=1"),
            chat.to_owned(),
            "api-version",
        ),
        (
            format!("/azure/openai/deployments/{AZURE_DEPLOYMENT}/chat/completions?{v}"),
            chat.replace("{", r#"{"model":"fake-ok","#),
            "fake-ok",
        ),
        (
            format!("/azure/openai/responses?{v}"),
            r#"{"model":"other","input":"hi"}"#.to_owned(),
            "deployment `other`",
        ),
    ] {
        let (status, j) = raw(proxy.port, &path, &azure, &body);
        assert_eq!(status, 403, "{path} {body}: {j}");
        assert_eq!(j["error"]["type"], "tally_refused", "{j}");
        let m = j["error"]["message"].as_str().unwrap_or("");
        assert!(m.contains(why), "{path}: {why} not in {j}");
    }
    // A Gemini body's key query with no key header: no token, 401.
    let (status, _) = raw(
        proxy.port,
        &format!("/gemini/v1beta/models/fake-ok:generateContent?key={token}"),
        &[],
        text,
    );
    assert_eq!(status, 401);
    assert_eq!(
        proxy.http.seen().len(),
        before,
        "a refused request reached the upstream"
    );
    // The SDKs raise their own errors, with tally's reason in the message.
    let poor = proxy.run("poor-gemini", json!({"spend_cents": 1}));
    let r = proxy.call("gemini", false, &poor, &["--model", "fake-ok"]);
    raised(&r, "ClientError", 403, "reservation_insufficient");
    assert_eq!(r["rpc_status"], "PERMISSION_DENIED", "{r}");
    let r = proxy.call("azure", false, &poor, &["--model", AZURE_DEPLOYMENT]);
    raised(&r, "PermissionDeniedError", 403, "reservation_insufficient");
    let r = proxy.call("gemini", false, "tly_not.a-token", &["--model", "fake-ok"]);
    raised(&r, "ClientError", 401, "invalid_token");
    proxy.verifies_the_bill();
}
