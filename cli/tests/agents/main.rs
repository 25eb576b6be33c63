//! Real agents through tally, offline: the real `tally serve --proxy-listen` with its
//! agent socket, the fake upstream (testkit) speaking each API, and the agent itself as
//! a user runs it. Claude Code (`claude -p`, npm `@anthropic-ai/claude-code`, installed
//! by .ci/run under `tests/agents/node`) with the settings file docs/PROXY.md gives: its
//! model calls go through the proxy with the run token from `apiKeyHelper`, its tool
//! calls through `tally hook claude-code`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use tally_testkit::upstream::{
    assert_bill, FakeOptions, FakeUpstream, Ledger, Price, Script, Unbilled,
};
use tally_testkit::{Daemon, Tally};

fn tally() -> Tally {
    Tally::new(env!("CARGO_BIN_EXE_tally"))
}

/// Claude Code's launcher as npm installs it: `cli-wrapper.cjs` finds the platform's
/// native binary (an optional dependency) whether or not npm ran the package's
/// postinstall step.
fn claude_wrapper() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/agents/node/node_modules/@anthropic-ai/claude-code/cli-wrapper.cjs")
}

/// Whether Claude Code runs here at the pinned version; if not, SKIPPED (CI: fails).
fn claude_code() -> bool {
    let wrapper = claude_wrapper();
    let fix = "npm install --prefix cli/tests/agents/node (.ci/run does)";
    if !wrapper.exists() {
        tally_testkit::skip("Claude Code is not installed", fix);
        return false;
    }
    let out = Command::new("node")
        .arg(&wrapper)
        .arg("--version")
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) if String::from_utf8_lossy(&o.stdout).starts_with("2.1.332 ") => true,
        Ok(o) => {
            tally_testkit::skip(
                &format!(
                    "`claude --version` said {:?}, not 2.1.332",
                    String::from_utf8_lossy(&o.stdout)
                ),
                fix,
            );
            false
        }
        Err(e) => {
            tally_testkit::skip(&format!("node cannot run Claude Code ({e})"), fix);
            false
        }
    }
}

/// The model Claude Code is told to use, priced in the policy as Claude Code prices it
/// in its own table ($3 per million input tokens, $15 per million output), so that its
/// `total_cost_usd` and the ledger can be compared.
const MODEL: &str = "claude-sonnet-4-5";

fn price() -> Price {
    Price::usd(3, 15)
}

/// The policy docs/PROXY.md gives a Claude Code session (its ceilings and breaker), a
/// spend limit, the fake upstream as Anthropic, and the model priced, its cache writes
/// too (Claude Code marks its prompt for the cache on every turn: unpriced, the proxy
/// refuses the marker).
fn policy(upstream: &FakeUpstream, spend_cents: u64) -> String {
    format!(
        r#"
[ceiling]
spend_cents = {spend_cents}
attempts = 1000
side_effects = 500
[breaker]
failures = 1000
[approvals]
ask_on = []

[upstreams.anthropic]
url = "{url}"
kind = "anthropic"
credential = "anthropic"
paths = ["/v1/messages"]
max_request_bytes = 4194304

[prices.anthropic."{MODEL}"]
input_per_mtok = 3
cached_input_per_mtok = "0.30"
cache_write_per_mtok = "3.75"
cache_write_1h_per_mtok = 6
output_per_mtok = 15
max_output_tokens = 64000
"#,
        url = upstream.url()
    )
}

/// `tally serve` with the proxy on a loopback port; the run started; the project's
/// `.claude/settings.json` as docs/PROXY.md writes it.
struct Session {
    daemon: Daemon,
    project: PathBuf,
    home: PathBuf,
    run: String,
}

impl Session {
    fn start(dir: &Path, policy: &str, run: &str) -> Session {
        tally().init(dir, policy);
        let secret = dir.join("anthropic.secret");
        std::fs::write(&secret, "sk-real").expect("secret");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let proxy = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let listen = proxy.to_string();
        let daemon = tally().serve(
            dir,
            &[
                "--proxy-listen",
                &listen,
                "--credential",
                "anthropic=anthropic.secret",
            ],
        );
        let (status, v) = daemon.agent(
            "POST",
            "/v1/runs",
            Some(json!({"run": run, "goal": "make the tests pass"})),
        );
        assert_eq!(status, 201, "{v}");
        let token = v["token"].as_str().expect("a run token").to_owned();
        let token_file = dir.join("token");
        std::fs::write(&token_file, &token).expect("token");
        let project = dir.join("project");
        let home = dir.join("home");
        std::fs::create_dir_all(project.join(".claude")).expect("project");
        std::fs::create_dir_all(&home).expect("home");
        let hook = format!(
            "{} hook claude-code --socket {} --run {run} --state-dir {}",
            env!("CARGO_BIN_EXE_tally"),
            daemon.agent_socket().display(),
            dir.join("hook-state").display()
        );
        let hooks = |matcher: bool| {
            let h = json!([{"type": "command", "command": hook}]);
            if matcher {
                json!([{"matcher": "*", "hooks": h}])
            } else {
                json!([{"hooks": h}])
            }
        };
        let settings = json!({
            "env": {
                "ANTHROPIC_BASE_URL": format!("http://{proxy}/anthropic"),
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"
            },
            "apiKeyHelper": format!("cat {}", token_file.display()),
            "hooks": {
                "PreToolUse": hooks(true),
                "PostToolUse": hooks(true),
                "PostToolUseFailure": hooks(true),
                "SessionEnd": hooks(false)
            }
        });
        std::fs::write(
            project.join(".claude/settings.json"),
            serde_json::to_string_pretty(&settings).expect("settings"),
        )
        .expect("settings file");
        Session {
            daemon,
            project,
            home,
            run: run.to_owned(),
        }
    }

    /// `claude -p PROMPT --output-format json`, in the project, with a home of its own
    /// and nothing from this machine's Claude Code configuration but `env`: its JSON
    /// result.
    fn claude(&self, prompt: &str, env: &[(&str, &str)]) -> Value {
        let out = Command::new("node")
            .arg(claude_wrapper())
            .args(["-p", prompt, "--output-format", "json", "--model", MODEL])
            .current_dir(&self.project)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.home)
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .expect("run claude");
        let stdout = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "claude's output is not its JSON result ({e}): {stdout}\nstderr: {}\ndaemon log: {}",
                String::from_utf8_lossy(&out.stderr),
                self.daemon.log()
            )
        })
    }

    fn standing(&self) -> Value {
        let (status, v) = self
            .daemon
            .agent("GET", &format!("/v1/runs/{}", self.run), None);
        assert_eq!(status, 200, "{v}");
        v
    }

    /// The run's decisions, in seq order, from `tally handoff`'s view of the ledger.
    fn handoff(&mut self) -> Value {
        self.daemon.stop();
        let (out, v) = tally().report(self.daemon.dir(), "handoff", &["--run", &self.run]);
        assert!(out.status.success(), "{v}");
        v["handoffs"][0].clone()
    }
}

/// Claude Code's reported cost, in nanodollars (its JSON carries a float of dollars).
fn cost_nanos(result: &Value) -> u64 {
    let usd = result["total_cost_usd"]
        .as_f64()
        .unwrap_or_else(|| panic!("no total_cost_usd: {result}"));
    (usd * 1e9).round() as u64
}

/// A model that keeps asking for the same failing Bash command: the hook lets the first
/// run through and the gate refuses the same command again with nothing changed
/// (`retries_exhausted`, within the loop bound); Claude Code's reported cost equals the
/// ledger's settled spend and the upstream's bill; the handoff says how it ended.
#[test]
fn claude_code_a_failing_loop_is_stopped_and_the_bill_is_the_ledger() {
    if !claude_code() {
        return;
    }
    let upstream = FakeUpstream::start(FakeOptions::default());
    let failing = json!({"command": "exit 3", "description": "Run the test suite"});
    upstream.script(
        MODEL,
        Script::repeat("Bash", failing, 6, "The tests still fail; I stop here."),
    );
    let dir = tempfile::tempdir().expect("dir");
    let mut s = Session::start(dir.path(), &policy(&upstream, 500), "cc-loop");
    let result = s.claude("Run the test suite until it passes.", &[]);
    assert_eq!(result["is_error"], false, "{result}");
    let st = s.standing();
    assert_eq!(st["held_nanos"], 0, "{st}");
    let settled = st["settled_nanos"].as_u64().expect("settled");
    assert!(settled > 0, "{st}");
    assert_eq!(
        cost_nanos(&result),
        settled,
        "Claude Code's cost against the ledger: {result} {st}"
    );
    // What Claude Code sends (2.1.332): streamed `/v1/messages?beta=true` turns with
    // `max_tokens` 32000, its `anthropic-beta` list, and the key as `x-api-key`.
    let seen = upstream.seen();
    assert!(
        seen.iter()
            .all(|r| r.path == "/v1/messages?beta=true" && r.stream && r.real_key),
        "{seen:?}"
    );
    // How it ended: the model's last turn (its final answer) was allowed, so the run is
    // open, and what must not be repeated is the failing command the gate stopped.
    let h = s.handoff();
    assert_bill(
        &[&upstream],
        &[(MODEL, price())],
        Ledger::of(std::slice::from_ref(&h)),
        Unbilled::NONE,
    );
    assert_eq!(h["stop"]["status"], "running", "{h:#}");
    assert!(
        h.to_string().contains("do not repeat claude-code/Bash"),
        "the handoff says what must not be repeated: {h:#}"
    );
}

/// The spend budget stops the model calls: each turn reports 100,000 input tokens
/// ($0.30), and Claude Code's worst case per call ($0.48 of output alone at
/// `max_tokens` 32,000) no longer fits in a $1 budget after the first; the refusal
/// ends the session, and what was spent is what Claude Code reports.
#[test]
fn claude_code_the_spend_budget_stops_the_model_calls() {
    if !claude_code() {
        return;
    }
    let upstream = FakeUpstream::start(FakeOptions::default());
    let mut script = Script::repeat(
        "Bash",
        json!({"command": "true", "description": "Look"}),
        10,
        "done",
    );
    script.usage = (100_000, 1_000);
    upstream.script(MODEL, script);
    let dir = tempfile::tempdir().expect("dir");
    let mut s = Session::start(dir.path(), &policy(&upstream, 100), "cc-spend");
    // Claude Code retries a 403 ten times with backoff (about four minutes here) before
    // it gives up; this test is about what was spent, so it gives up at once.
    let result = s.claude("Look around.", &[("CLAUDE_CODE_MAX_RETRIES", "0")]);
    let st = s.standing();
    assert_eq!(st["held_nanos"], 0, "{st}");
    let settled = st["settled_nanos"].as_u64().expect("settled");
    assert!(settled <= 100 * 10_000_000, "{st}");
    assert!(
        upstream.billed().len() < 10,
        "the budget stopped the model calls: {result}"
    );
    assert_eq!(cost_nanos(&result), settled, "{result} {st}");
    let h = s.handoff();
    assert_bill(
        &[&upstream],
        &[(MODEL, price())],
        Ledger::of(std::slice::from_ref(&h)),
        Unbilled::NONE,
    );
    let text = h.to_string();
    assert!(
        text.contains("reservation_insufficient") || text.contains("budget_exceeded"),
        "the handoff says the budget stopped it: {h:#}"
    );
}

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
/// Completions), its model calls streamed or not: a model that keeps asking for the same failing function tool, gated
/// through the Python client, is stopped by the gate at the tool's second run
/// (`retries_exhausted`); the model calls settle what the upstream billed, and the SDK's
/// own usage count agrees with it.
fn agents_sdk_loop(api: &str, stream: bool) {
    if !agents_sdk() {
        return;
    }
    let upstream = FakeUpstream::start(FakeOptions::default());
    let model = "fake-agents";
    upstream.script(
        model,
        Script::repeat("run_tests", json!({}), 4, "The tests still fail."),
    );
    let dir = tempfile::tempdir().expect("dir");
    let text = format!(
        r#"
[ceiling]
spend_cents = 500
attempts = 1000
side_effects = 500
[approvals]
ask_on = []

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
    // The first run of the failing tool is allowed, the same call again refused.
    assert_eq!(result["gate"][0], "allow", "{result}");
    assert!(
        result["gate"].as_array().expect("gate")[1..]
            .iter()
            .all(|r| r == "retries_exhausted"),
        "{result}"
    );
    assert_eq!(result["final"], "The tests still fail.", "{result}");
    let (status, st) = daemon.agent("GET", &format!("/v1/runs/{run}"), None);
    assert_eq!(status, 200, "{st}");
    assert_eq!(st["held_nanos"], 0, "{st}");
    let settled = st["settled_nanos"].as_u64().expect("settled");
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
    let (out, h) = tally().report(d, "handoff", &["--run", &run]);
    assert!(out.status.success(), "{h}");
    // How it ended: the agent's last call (its model's final answer) was allowed, so the
    // run is open; what must not be repeated is the failing tool call, by name.
    let h = &h["handoffs"][0];
    assert_eq!(h["spend"]["settled_nanos"], settled, "{h:#}");
    assert_bill(
        &[&upstream],
        &[(model, Price::usd(10, 1000))],
        Ledger::of(std::slice::from_ref(h)),
        Unbilled::NONE,
    );
    assert_eq!(h["stop"]["status"], "running", "{h:#}");
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
