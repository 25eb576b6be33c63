//! Real agents through tally, offline: the real `tally serve --proxy-listen` with its
//! agent socket, the fake upstream (testkit) speaking each API, and the agent itself as
//! a user runs it. Claude Code (`claude -p`, npm `@anthropic-ai/claude-code`, installed
//! by .ci/run under `tests/agents/node`) with the settings file docs/PROXY.md gives: its
//! model calls go through the proxy with the run token from `apiKeyHelper`, its tool
//! calls through `tally hook claude-code` (claude_code.rs); the OpenAI Agents SDK with
//! the Python client (openai_agents.rs). What each did is counted in the ledger.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use tally_testkit::upstream::{
    assert_bill, FakeOptions, FakeUpstream, Ledger, Price, Script, Unbilled,
};
use tally_testkit::{Daemon, Tally};

mod claude_code;
#[path = "../common/ledger.rs"]
mod ledger;
mod openai_agents;
mod relay;

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

/// How many times the gate lets one failing `Bash` command run with nothing changed in
/// between: the policy's `[retries] non_idempotent_write` (the default, written out).
const BASH_RUNS: usize = 1;

/// The policy tally ships for Claude Code sessions (`tally policy example claude-code`:
/// its ceilings, and no breaker for Claude Code's own tools) with a spend limit added
/// to its ceiling, the fake upstream as Anthropic, and the model priced, its cache
/// writes too (Claude Code marks its prompt for the cache on every turn: unpriced, the
/// proxy refuses the marker). A call the budget cannot pay is refused, not asked of a
/// human (`ask_on = []`).
fn policy(upstream: &FakeUpstream, spend_cents: u64) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(["policy", "example", "claude-code"])
        .stdin(Stdio::null())
        .output()
        .expect("tally policy example");
    assert!(out.status.success(), "tally policy example claude-code");
    let shipped = String::from_utf8(out.stdout).expect("utf-8");
    assert!(shipped.contains("\n[ceiling]\n"), "{shipped}");
    let shipped = shipped.replacen(
        "\n[ceiling]\n",
        &format!("\n[ceiling]\nspend_cents = {spend_cents}\n"),
        1,
    );
    format!(
        r#"{shipped}
[approvals]
ask_on = []
[retries]
non_idempotent_write = {BASH_RUNS}

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
/// `.claude/settings.json` as docs/PROXY.md writes it, its base URL a [`relay::Relay`]
/// to the proxy that counts Claude Code's model calls.
struct Session {
    daemon: Daemon,
    relay: relay::Relay,
    project: PathBuf,
    home: PathBuf,
    run: String,
}

impl Session {
    fn start(dir: &Path, policy: &str, run: &str) -> Session {
        Session::start_with(
            dir,
            policy,
            json!({"run": run, "goal": "make the tests pass"}),
        )
    }

    /// [`Session::start`] with the run's start request `start` (its `run`, `budget`).
    fn start_with(dir: &Path, policy: &str, start: Value) -> Session {
        let run = start["run"].as_str().expect("a run name").to_owned();
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
        let (status, v) = daemon.agent("POST", "/v1/runs", Some(start));
        assert_eq!(status, 201, "{v}");
        let token = v["token"].as_str().expect("a run token").to_owned();
        let relay = relay::Relay::start(proxy, "POST /anthropic/v1/messages");
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
                "ANTHROPIC_BASE_URL": format!("http://{}/anthropic", relay.addr()),
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
            relay,
            project,
            home,
            run,
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

    /// Every decision in the ledger, in seq order (the daemon stopped first).
    fn decisions(&mut self) -> Vec<Value> {
        self.daemon.stop();
        ledger::decisions(self.daemon.dir())
    }

    /// The run's handoff, `tally handoff`'s view of the ledger (the daemon stopped
    /// first).
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
