//! The OpenAI Agents SDK through tally: its model calls through the proxy with the
//! OpenAI client's own retries, its function tool through the gate (the Python client).

use super::*;

/// Whether python3 has the OpenAI Agents SDK at its pinned version; if not, SKIPPED.
fn agents_sdk() -> bool {
    tally_testkit::have(
        "python3",
        &[
            "-c",
            "import importlib.metadata as m, sys; \
             sys.exit(0 if m.version('openai-agents') == '0.24.0' else 1)",
        ],
        "python3 -m pip install openai-agents==0.24.0 (.ci/run does)",
    )
}

/// The OpenAI Agents SDK on `api` (`responses`, its default, or `chat`, Chat
/// Completions), its model calls streamed or not: a model that keeps asking for the same
/// failing function tool (never giving up), gated through the Python client, is stopped
/// by the gate after [`BASH_RUNS`] run(s) of it (`retries_exhausted`, the policy's retry
/// bound), every later request for it refused; the turns go on until the spend budget
/// cannot pay for the next model call, refused once (the client at its default
/// `max_retries`) and raised out of the run with tally's reason and action. The model
/// calls settle what the upstream billed, and the SDK's own usage count agrees with it;
/// the handoff says the run is open, its last call refused for the budget, and that the
/// failing tool call must not be repeated.
fn agents_sdk_loop(api: &str, stream: bool) {
    if !agents_sdk() {
        return;
    }
    let upstream = FakeUpstream::start(FakeOptions::default());
    let model = "fake-agents";
    upstream.script(
        model,
        Script::repeat("run_tests", json!({}), 1000, "The tests pass."),
    );
    let dir = tempfile::tempdir().expect("dir");
    // Each call reserves about 10 cents (its 100 output tokens at $1000 per million)
    // and settles 5.1: the budget pays for a handful of turns.
    let text = format!(
        r#"
[ceiling]
spend_cents = 50
attempts = 1000
side_effects = 500
[approvals]
ask_on = []
[retries]
non_idempotent_write = {BASH_RUNS}

[upstreams.openai]
url = "{url}"
kind = "openai"
credential = "openai"
paths = ["/v1/chat/completions", "/v1/responses"]

[prices.openai."{model}"]
input_per_mtok = 10
output_per_mtok = 1000
max_output_tokens = 100
"#,
        url = upstream.url()
    );
    let d = dir.path();
    tally().init(d, &text);
    let secret = d.join("openai.secret");
    std::fs::write(&secret, "sk-real").expect("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let proxy = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let listen = proxy.to_string();
    let mut daemon = tally().serve(
        d,
        &[
            "--proxy-listen",
            &listen,
            "--credential",
            "openai=openai.secret",
        ],
    );
    let run = format!("agents-{api}-{stream}");
    let (status, v) = daemon.agent(
        "POST",
        "/v1/runs",
        Some(json!({"run": run, "goal": "make the tests pass"})),
    );
    assert_eq!(status, 201, "{v}");
    let token = v["token"].as_str().expect("token").to_owned();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/openai_agents.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(api)
        .args(stream.then_some("stream"))
        .env(
            "PYTHONPATH",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python"),
        )
        .env("TALLY_SOCKET", daemon.agent_socket())
        .env("TALLY_RUN", &run)
        .env("TALLY_TOKEN", &token)
        .env("PROXY_URL", format!("http://{proxy}/openai/v1"))
        .env("MODEL", model)
        .env("OPENAI_AGENTS_DISABLE_TRACING", "1")
        .stdin(Stdio::null())
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "the agent's output is not its JSON line ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    // What the tool saw: its first run allowed, the same call again refused.
    let gate = result["gate"].as_array().expect("gate");
    assert_eq!(
        gate[..BASH_RUNS],
        vec![json!("allow"); BASH_RUNS],
        "{result}"
    );
    assert!(
        gate[BASH_RUNS..].iter().all(|r| r == "retries_exhausted"),
        "{result}"
    );
    // How the run ended: the refused model call raised out of it, in tally's words.
    assert_eq!(result["error"], "PermissionDeniedError", "{result}");
    assert_eq!(result["status"], 403, "{result}");
    assert_eq!(result["should_retry"], "false", "{result}");
    let m = result["message"].as_str().unwrap_or_default();
    assert!(
        m.contains("reservation_insufficient") && m.contains("action ask"),
        "{result}"
    );
    let (status, st) = daemon.agent("GET", &format!("/v1/runs/{run}"), None);
    assert_eq!(status, 200, "{st}");
    assert_eq!(st["held_nanos"], 0, "{st}");
    let settled = st["settled_nanos"].as_u64().expect("settled");
    let ledger = Ledger {
        settled_nanos: settled,
        held_nanos: 0,
    };
    let prices = [(model, Price::usd(10, 1000))];
    assert_bill(&[&upstream], &prices, ledger, Unbilled::NONE);
    // The SDK's own count of the model's usage is the upstream's bill.
    let billed = upstream.billed();
    assert_eq!(result["requests"], billed.len(), "{result}");
    assert_eq!(
        result["output_tokens"],
        billed.iter().map(|b| b.output).sum::<u64>(),
        "{result}"
    );
    let path = if api == "responses" {
        "/v1/responses"
    } else {
        "/v1/chat/completions"
    };
    assert!(
        upstream
            .seen()
            .iter()
            .all(|r| r.path == path && r.stream == stream),
        "{:?}",
        upstream.seen()
    );
    daemon.stop();
    // In the ledger: every request the model made for the tool reached the gate (each
    // answer asked for it), within the bound allowed, the rest refused;
    // each model call the upstream billed allowed, and one refused, sent once.
    let decisions = ledger::decisions(d);
    let shell = ledger::checks(&decisions, &run, "shell");
    assert_eq!(shell.len(), gate.len(), "{shell:#?}");
    assert_eq!(shell.len(), billed.len(), "{shell:#?}");
    assert_eq!(ledger::count(&shell, "allow"), BASH_RUNS, "{shell:#?}");
    assert!(
        shell[BASH_RUNS..]
            .iter()
            .all(|d| d["kind"] == "deny" && d["reason"] == "retries_exhausted"),
        "{shell:#?}"
    );
    assert!(shell.len() >= BASH_RUNS + 2, "{shell:#?}");
    let calls = ledger::checks(&decisions, &run, "openai");
    assert_eq!(ledger::count(&calls, "allow"), billed.len(), "{calls:#?}");
    assert_eq!(ledger::count(&calls, "deny"), 1, "sent once: {calls:#?}");
    assert_eq!(
        calls.last().map(|c| &c["reason"]),
        Some(&json!("reservation_insufficient")),
        "{calls:#?}"
    );
    let (out, h) = tally().report(d, "handoff", &["--run", &run]);
    assert!(out.status.success(), "{h}");
    // How it ended: open, its last call (the model call) refused for the budget; what
    // must not be repeated is the failing tool call, by name.
    let h = &h["handoffs"][0];
    assert_eq!(h["stop"]["status"], "refused", "{h:#}");
    assert_eq!(h["stop"]["reason"], "reservation_insufficient", "{h:#}");
    assert!(h.to_string().contains("do not repeat shell"), "{h:#}");
}

/// The Agents SDK's default model API, Responses.
#[test]
fn openai_agents_sdk_on_responses() {
    agents_sdk_loop("responses", false);
}

/// The same, streamed (`Runner.run_streamed`).
#[test]
fn openai_agents_sdk_on_responses_streamed() {
    agents_sdk_loop("responses", true);
}

/// The Agents SDK on Chat Completions (`OpenAIChatCompletionsModel`).
#[test]
fn openai_agents_sdk_on_chat_completions() {
    agents_sdk_loop("chat", false);
}

/// The same, streamed.
#[test]
fn openai_agents_sdk_on_chat_completions_streamed() {
    agents_sdk_loop("chat", true);
}
