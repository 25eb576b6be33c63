//! The HTTP/model proxy end to end: the real `tally serve` with
//! `--proxy-listen`, a real agent socket, and the fake upstream (testkit) over HTTP and
//! HTTPS; every ledger verifies clean afterwards.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tally_testkit::upstream::{FakeOptions, FakeUpstream};

fn tally() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tally"))
}

fn run(dir: &Path, args: &[&str]) -> Output {
    tally()
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("tally")
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let out = run(dir, args);
    assert!(
        out.status.success(),
        "tally {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// $10 per million input tokens, $1,000 per million output tokens ($0.001 each), at most
/// 100 output tokens: `fake-ok` (100 in, 50 out) costs $0.051 (51,000,000 nanodollars),
/// where its request is at least 100 bytes (the input bound).
fn policy(upstream: &FakeUpstream, spend_cents: u64) -> String {
    let ca = upstream
        .ca_pem()
        .map(|p| format!("ca_file = {:?}\n", p.display().to_string()))
        .unwrap_or_default();
    let mut text = format!(
        r#"
[ceiling]
spend_cents = {spend_cents}
attempts = 1000
side_effects = 1000
[loops]
identical_consecutive = 1000
identical_in_window = 1000
tool_calls = 1000
[rate]
run_per_sec = 0
tool_per_sec = 0
tool_in_flight = 0

[upstreams.openai]
url = "{url}"
kind = "openai"
credential = "openai"
paths = ["/v1/chat/completions"]
max_request_bytes = 4096
{ca}
[upstreams.anthropic]
url = "{url}"
kind = "anthropic"
credential = "anthropic"
paths = ["/v1/messages"]
{ca}
"#,
        url = upstream.url()
    );
    for up in ["openai", "anthropic"] {
        for model in [
            "fake-ok",
            "fake-cut",
            "fake-slow",
            "fake-redirect",
            "fake-redirect-same",
            "fake-500",
            "fake-429",
        ] {
            text.push_str(&format!(
                "[prices.{up}.\"{model}\"]\ninput_per_mtok = 10\noutput_per_mtok = \"1000\"\nmax_output_tokens = 100\n"
            ));
        }
    }
    text
}

/// `tally serve` with the proxy on a loopback port; killed on drop.
struct Served {
    dir: PathBuf,
    child: Option<Child>,
    proxy: SocketAddr,
}

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

impl Served {
    /// A fresh ledger in `dir`, the policy, the credential files, and the daemon.
    fn new(dir: &Path, policy: &str) -> Served {
        ok(dir, &["keygen", "--out", "auditor.key"]);
        ok(
            dir,
            &["init", "--ledger", "ledger", "--recipient", "auditor.pub"],
        );
        std::fs::write(dir.join("policy.toml"), policy).expect("policy");
        for (name, secret) in [("openai", "sk-real\n"), ("anthropic", "sk-real")] {
            let f = dir.join(format!("{name}.secret"));
            std::fs::write(&f, secret).expect("secret");
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        }
        Served::start(dir)
    }

    fn start(dir: &Path) -> Served {
        let _ = std::fs::remove_file(dir.join("agent.sock"));
        let proxy = free_port();
        let child = tally()
            .args([
                "serve",
                "--ledger",
                "ledger",
                "--socket",
                "agent.sock",
                "--policy",
                "policy.toml",
                "--proxy-listen",
                &proxy.to_string(),
                "--proxy-socket",
                "proxy.sock",
                "--credential",
                "openai=openai.secret",
                "--credential",
                "anthropic=anthropic.secret",
            ])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("tally serve");
        let started = Instant::now();
        while !(dir.join("agent.sock").exists() && std::net::TcpStream::connect(proxy).is_ok()) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "tally serve did not open its sockets"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Served {
            dir: dir.to_path_buf(),
            child: Some(child),
            proxy,
        }
    }

    async fn agent(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut client = tally_api::client::Client::unix(&self.dir.join("agent.sock"))
            .await
            .expect("connect");
        let reply = client
            .request(
                method.parse().expect("method"),
                path,
                body.as_ref().map(|_| "application/json"),
                body.map(|b| b.to_string()).unwrap_or_default(),
            )
            .await
            .expect("request");
        let v = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
        (reply.status.as_u16(), v)
    }

    /// Starts `run`; its token.
    async fn start_run(&self, run: &str) -> String {
        let (status, v) = self
            .agent("POST", "/v1/runs", Some(json!({"run": run})))
            .await;
        assert_eq!(status, 201, "{v}");
        v["token"]
            .as_str()
            .expect("a token in the start answer")
            .to_owned()
    }

    async fn standing(&self, run: &str) -> Value {
        let (status, v) = self.agent("GET", &format!("/v1/runs/{run}"), None).await;
        assert_eq!(status, 200, "{v}");
        v
    }

    /// The run's standing once nothing is held: the proxy records a call's outcome as its
    /// answer ends, so the client may read the last byte just before the settlement is
    /// durable. Waits for that (at most 10 s), never for a fixed time.
    async fn settled(&self, run: &str) -> Value {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let v = self.standing(run).await;
            if v["held_nanos"] == 0 || std::time::Instant::now() > until {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().expect("SIGKILL");
            c.wait().expect("reap");
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_child(&child),
                rustix::process::Signal::TERM,
            );
            let started = Instant::now();
            while child.try_wait().expect("wait").is_none() {
                if started.elapsed() > Duration::from_secs(20) {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Stops the daemon; `tally verify` finds the ledger intact and replay nothing; the
    /// handoff of each run (its settled and held cents) as the ledger says.
    fn verifies(&mut self) -> Value {
        self.stop();
        let out = run(
            &self.dir,
            &[
                "verify",
                "ledger",
                "--key",
                "ledger/ledger.pub",
                "--auditor-key",
                "auditor.key",
                "--json",
            ],
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "verify --json: {e}: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert!(out.status.success(), "{report}");
        assert_eq!(report["replay"]["findings"], json!([]), "{report}");
        report
    }

    fn handoff(&self, run: &str) -> Value {
        let text = ok(
            &self.dir,
            &[
                "handoff",
                "ledger",
                "--key",
                "ledger/ledger.pub",
                "--auditor-key",
                "auditor.key",
                "--run",
                run,
                "--json",
            ],
        );
        let v: Value = serde_json::from_str(&text).expect("handoff json");
        v["handoffs"][0].clone()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An answer of the proxy: status, headers, body chunks as received, and whether the
/// body was cut.
struct Answer {
    status: u16,
    headers: hyper::HeaderMap,
    chunks: Vec<Bytes>,
    cut: bool,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.chunks.concat()).unwrap_or(Value::Null)
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.chunks.concat()).into_owned()
    }
}

async fn call(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the proxy");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method("POST")
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let response = send
        .send_request(req.body(Full::new(body.into())).expect("request"))
        .await
        .expect("response");
    let (parts, mut body) = response.into_parts();
    let mut chunks = Vec::new();
    let mut cut = false;
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    chunks.push(d);
                }
            }
            Some(Err(_)) => {
                cut = true;
                break;
            }
        }
    }
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        chunks,
        cut,
    }
}

fn chat(model: &str, extra: Value) -> Vec<u8> {
    let mut v = json!({"model": model, "messages": [{"role": "user", "content": "hello"}]});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    v.to_string().into_bytes()
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_is_injected_the_token_never_leaves_and_usage_settles_over_http_and_https() {
    for tls in [false, true] {
        let upstream = FakeUpstream::start(FakeOptions {
            tls,
            ..Default::default()
        });
        let dir = tempfile::tempdir().expect("dir");
        let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
        let token = served.start_run("r1").await;
        assert!(token.starts_with("tly_"), "{token}");

        let a = call(
            served.proxy,
            "/openai/v1/chat/completions",
            &[
                ("authorization", &bearer(&token)),
                ("x-api-key", &token),
                ("connection", "keep-alive, x-secret-hop"),
                ("x-secret-hop", "1"),
            ],
            chat("fake-ok", json!({"max_tokens": 50})),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text());
        assert_eq!(a.json()["usage"]["completion_tokens"], 50);
        assert_eq!(a.headers["x-tally-run"], "r1");
        assert_eq!(a.headers["x-tally-attempt"], "1");
        assert!(a.headers.contains_key("x-tally-seq"));
        // Anthropic's dialect, its key header.
        let a = call(
            served.proxy,
            "/anthropic/v1/messages",
            &[("x-api-key", &token)],
            br#"{"model":"fake-ok","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}"#
                .to_vec(),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text());
        let seen = upstream.seen();
        assert_eq!(seen.len(), 2);
        for s in &seen {
            assert!(s.real_key, "the upstream got the real key: {s:?}");
            assert!(!s.token_seen, "the run token reached the upstream: {s:?}");
            assert_eq!(s.max_tokens, Some(50));
            for h in ["connection", "x-secret-hop", "cookie"] {
                assert!(
                    !s.headers.iter().any(|n| n == h),
                    "{h} reached the upstream: {s:?}"
                );
            }
        }
        assert!(
            !seen[0].headers.iter().any(|n| n == "x-api-key"),
            "{:?}",
            seen[0]
        );
        assert!(
            !seen[1].headers.iter().any(|n| n == "authorization"),
            "{:?}",
            seen[1]
        );
        // $0.051 for the OpenAI call. The Anthropic request is 97 bytes, so its input is
        // bounded at 97 tokens: the fake's 100 are not believed and it settles at its
        // reservation, $0.05097. Nothing held.
        let st = served.settled("r1").await;
        assert_eq!(st["settled_nanos"], 101_970_000, "{st}");
        assert_eq!(st["held_nanos"], 0, "{st}");

        // Unknown, forged and missing tokens: 401 in the dialect, nothing forwarded.
        for auth in ["Bearer sk-real", "Bearer tly_cjE.00", "Bearer ", ""] {
            let headers: Vec<(&str, &str)> = if auth.is_empty() {
                vec![]
            } else {
                vec![("authorization", auth)]
            };
            let a = call(
                served.proxy,
                "/openai/v1/chat/completions",
                &headers,
                chat("fake-ok", json!({})),
            )
            .await;
            assert_eq!(a.status, 401, "{auth}: {}", a.text());
            assert_eq!(a.json()["error"]["code"], "invalid_token", "{}", a.text());
        }
        // A stopped run's token.
        let (status, v) = served
            .agent("POST", "/v1/runs/r1/stop", Some(json!({})))
            .await;
        assert_eq!(status, 200, "{v}");
        let a = call(
            served.proxy,
            "/anthropic/v1/messages",
            &[("x-api-key", &token)],
            br#"{"model":"fake-ok","max_tokens":5,"messages":[]}"#.to_vec(),
        )
        .await;
        assert_eq!(a.status, 401, "{}", a.text());
        assert_eq!(
            a.json()["error"]["type"],
            "authentication_error",
            "{}",
            a.text()
        );
        assert_eq!(upstream.seen().len(), 2, "nothing more was forwarded");
        served.verifies();
        let h = served.handoff("r1");
        assert_eq!(h["spend"]["settled_nanos"], 101_970_000, "{h}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_are_refused_and_never_forwarded() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let auth = bearer(&token);
    let h = [("authorization", auth.as_str())];
    for (body, status) in [
        // Duplicate keys: tally and the upstream must never read two different values.
        (
            br#"{"model":"fake-ok","max_tokens":1,"max_tokens":100000,"messages":[]}"#.to_vec(),
            400,
        ),
        (
            br#"{"model":"fake-ok","model":"gpt-4o","messages":[]}"#.to_vec(),
            400,
        ),
        (
            br#"{"model":"fake-ok","messages":[{"role":"user","content":"a","content":"b"}]}"#
                .to_vec(),
            400,
        ),
        (b"not json".to_vec(), 400),
        // A model with no price.
        (chat("gpt-4o", json!({})), 403),
        // Over max_request_bytes (4096).
        (chat("fake-ok", json!({"pad": "x".repeat(5000)})), 413),
    ] {
        let a = call(served.proxy, "/openai/v1/chat/completions", &h, body).await;
        assert_eq!(a.status, status, "{}", a.text());
    }
    // A path or upstream outside the policy.
    let a = call(
        served.proxy,
        "/openai/v1/files",
        &h,
        chat("fake-ok", json!({})),
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.text());
    assert_eq!(a.json()["error"]["code"], "scope_violation");
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions/../../files",
        &h,
        chat("fake-ok", json!({})),
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.text());
    let a = call(
        served.proxy,
        "/nope/v1/chat/completions",
        &h,
        chat("fake-ok", json!({})),
    )
    .await;
    assert_eq!(a.status, 404, "{}", a.text());
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
    served.verifies();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_max_tokens_gets_one_its_budget_can_pay() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    // 5 cents: at $0.001 per output token, fewer than 50 tokens after the input.
    let mut served = Served::new(dir.path(), &policy(&upstream, 5));
    let token = served.start_run("r").await;
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-usage-10-5", json!({})),
    )
    .await;
    // fake-usage-* has no price of its own: priced under fake-ok's name it is refused.
    assert_eq!(a.status, 403, "{}", a.text());
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-ok", json!({})),
    )
    .await;
    // The fake reports 100 in / 50 out whatever it was asked; what matters is what it
    // was asked.
    let seen = upstream.seen();
    let asked = seen[0].max_tokens.expect("max_tokens injected");
    // 5 cents pays fewer than 50 tokens at $0.001 once the input bound ($0.00001 a
    // byte of the body) is paid.
    assert!((1..50).contains(&asked), "asked {asked}");
    let st = served.settled("r").await;
    assert!(a.status == 200, "{}", a.text());
    // The usage the fake reports (50 out) is above what was asked, so above the worst
    // case: not believed, it settles at the reservation, which is the whole budget; the
    // next call does not fit.
    assert_eq!(st["settled_nanos"], 50_000_000, "{st}");
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-ok", json!({"max_tokens": 1})),
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.text());
    assert_eq!(upstream.seen().len(), 1);
    served.verifies();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_pass_through_and_settle_and_a_client_that_did_not_ask_sees_no_usage_chunk() {
    let upstream = FakeUpstream::start(FakeOptions {
        tls: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let auth = bearer(&token);
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &auth)],
        chat("fake-ok", json!({"stream": true, "max_tokens": 50})),
    )
    .await;
    assert_eq!(a.status, 200);
    let text = a.text();
    assert!(
        text.contains("w0 ") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
    assert!(
        !text.contains("\"usage\":{"),
        "the usage chunk reached a client that did not ask: {text}"
    );
    assert!(a.chunks.len() > 1, "passed through chunk by chunk");
    let seen = upstream.seen();
    assert_eq!(
        seen[0].stream_options.as_deref(),
        Some(r#"{"include_usage":true}"#)
    );
    // A client that asked sees it.
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &auth)],
        chat(
            "fake-ok",
            json!({"stream": true, "max_tokens": 50, "stream_options": {"include_usage": true}}),
        ),
    )
    .await;
    assert!(
        a.text().contains("\"completion_tokens\":50"),
        "{}",
        a.text()
    );
    // Anthropic's stream.
    let a = call(
        served.proxy,
        "/anthropic/v1/messages",
        &[("x-api-key", &token)],
        br#"{"model":"fake-ok","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#.to_vec(),
    )
    .await;
    assert!(a.text().contains("message_stop"), "{}", a.text());
    let st = served.settled("r").await;
    assert_eq!(st["settled_nanos"], 3 * 51_000_000, "{st}");
    assert_eq!(st["held_nanos"], 0, "{st}");
    served.verifies();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_another_host_is_refused_and_recorded_and_a_cut_stream_stays_held() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let auth = bearer(&token);
    let h = [("authorization", auth.as_str())];
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &h,
        chat("fake-redirect", json!({"max_tokens": 10})),
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.text());
    assert_eq!(a.json()["error"]["code"], "scope_violation", "{}", a.text());
    assert!(a.headers.get("location").is_none());
    // To the upstream itself: passed back as it is.
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &h,
        chat("fake-redirect-same", json!({"max_tokens": 10})),
    )
    .await;
    assert_eq!(a.status, 302, "{}", a.text());
    assert_eq!(a.headers["location"], "/v1/elsewhere");
    let st = served.settled("r").await;
    assert_eq!(
        (st["settled_nanos"].as_u64(), st["held_nanos"].as_u64()),
        (Some(0), Some(0)),
        "{st}"
    );
    // Cut mid-stream: no usage, so the reservation stays held (unknown).
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &h,
        chat("fake-cut", json!({"stream": true, "max_tokens": 50})),
    )
    .await;
    assert!(a.cut, "the client sees the cut: {} {}", a.status, a.text());
    let st = served.standing("r").await;
    assert_eq!(st["settled_nanos"], 0, "{st}");
    assert!(st["held_nanos"].as_u64() >= Some(50_000_000), "{st}");
    // Status classes: 500 error, 429 rejected; nothing charged, nothing held by them.
    let held = st["held_nanos"].clone();
    for model in ["fake-500", "fake-429"] {
        let a = call(
            served.proxy,
            "/openai/v1/chat/completions",
            &h,
            chat(model, json!({"max_tokens": 10})),
        )
        .await;
        assert!(a.status == 500 || a.status == 429, "{}", a.text());
    }
    let st = served.standing("r").await;
    assert_eq!(st["held_nanos"], held, "{st}");
    served.verifies();
    // The refused redirect is in the ledger: the attempt's outcome, rejected, says why.
    let h = served.handoff("r");
    assert!(h.to_string().contains("redirect_refused"), "{h}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_requests_never_settle_more_than_the_budget() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 100));
    let token = served.start_run("race").await;
    let mut tasks = Vec::new();
    for i in 0..64 {
        let (addr, auth) = (served.proxy, bearer(&token));
        tasks.push(tokio::spawn(async move {
            let stream = i % 2 == 0;
            call(
                addr,
                "/openai/v1/chat/completions",
                &[("authorization", &auth)],
                chat(
                    "fake-ok",
                    json!({"max_tokens": 50, "stream": stream, "user": i.to_string()}),
                ),
            )
            .await
        }));
    }
    let mut allowed = 0;
    for t in tasks {
        let a = t.await.expect("task");
        let s = a.status;
        if s != 200 {
            eprintln!("{s} {}", a.text());
        }
        assert!(s == 200 || s == 403 || s == 429, "{s}");
        allowed += usize::from(s == 200);
    }
    let st = served.settled("race").await;
    let settled = st["settled_nanos"].as_u64().expect("settled");
    assert!(settled <= 100 * 10_000_000, "{st}");
    assert_eq!(settled, 51_000_000 * allowed as u64, "{st}");
    assert!(allowed >= 10, "{allowed} allowed");
    assert_eq!(st["held_nanos"], 0, "{st}");
    served.verifies();
    let h = served.handoff("race");
    assert_eq!(h["spend"]["settled_nanos"].as_u64(), Some(settled), "{h}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_stream_keeps_the_reservation_held_after_restart() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let (addr, auth) = (served.proxy, bearer(&token));
    let streaming = tokio::spawn(async move {
        call(
            addr,
            "/openai/v1/chat/completions",
            &[("authorization", &auth)],
            chat("fake-slow", json!({"stream": true, "max_tokens": 50})),
        )
        .await
    });
    // The stream is under way (the upstream got it) when the daemon is killed.
    let started = Instant::now();
    while upstream.seen().is_empty() {
        assert!(started.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    served.kill9();
    let a = streaming.await.expect("task");
    assert!(a.cut, "the client's stream ends with the daemon");
    let mut served = Served::start(dir.path());
    let st = served.standing("r").await;
    assert_eq!(st["settled_nanos"], 0, "{st}");
    assert!(
        st["held_nanos"].as_u64() >= Some(50_000_000),
        "held, never lost: {st}"
    );
    served.verifies();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_deadline_cuts_a_stream_and_keeps_its_reservation_held() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let (status, v) = served
        .agent(
            "POST",
            "/v1/runs",
            Some(json!({"run": "short", "budget": {"deadline_ms": 1500}})),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let token = v["token"].as_str().expect("token").to_owned();
    let started = Instant::now();
    // 50 chunks, one every 200 ms: 10 s, far past the run's 1.5 s.
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-slow", json!({"stream": true, "max_tokens": 50})),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(a.status, 200);
    assert!(a.cut, "the stream is cut at the deadline: {}", a.text());
    assert!(
        !a.chunks.is_empty(),
        "what came before the deadline was passed on"
    );
    assert!(took < Duration::from_secs(5), "cut after {took:?}");
    let st = served.standing("short").await;
    assert_eq!(st["settled_nanos"], 0, "{st}");
    assert!(
        st["held_nanos"].as_u64() >= Some(50_000_000),
        "a timeout keeps it held: {st}"
    );
    // Past its deadline, the token no longer spends.
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-ok", json!({"max_tokens": 5})),
    )
    .await;
    assert_eq!(a.status, 401, "{}", a.text());
    served.verifies();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_answers_on_its_unix_socket_too() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("u").await;
    let sock = dir.path().join("proxy.sock");
    let stream = tokio::net::UnixStream::connect(&sock)
        .await
        .expect("connect to the proxy socket");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method("POST")
        .uri("/openai/v1/chat/completions")
        .header("host", "localhost")
        .header("authorization", bearer(&token))
        .body(Full::new(Bytes::from(chat(
            "fake-ok",
            json!({"max_tokens": 50}),
        ))))
        .expect("request");
    let response = send.send_request(req).await.expect("response");
    assert_eq!(response.status(), 200);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("fake upstream"));
    let mode = std::fs::metadata(&sock)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o660, "the agent socket's mode");
    assert_eq!(served.settled("u").await["settled_nanos"], 51_000_000);
    served.verifies();
    assert!(!sock.exists(), "removed when the daemon stops");
}
