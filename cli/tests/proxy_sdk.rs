//! tally's model proxy with the official `openai` and `anthropic` Python SDKs, end to
//! end and with real parts only: the real `tally serve --proxy-listen`, the fake
//! upstream (testkit) over HTTP and over HTTPS with its test CA, runs started on the
//! agent socket for their tokens, the SDKs configured as a user configures them
//! (`OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL`, the token as the API key), and the ledger
//! read back with `tally handoff --json`.
//!
//! Each SDK call is made by `proxy_sdk/agent.py`, which prints what the SDK returned or
//! raised as a JSON line; the assertions are here.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tally_testkit::upstream::{FakeOptions, FakeUpstream};

fn tally() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tally"))
}

fn agent_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/proxy_sdk/agent.py")
}

/// The key the fake upstream accepts: the operator's secret, never the agent's.
const REAL_KEY: &str = "sk-real-upstream-key-0123456789";

/// Whether python3 has both SDKs at the pinned versions; if not, SKIPPED (CI: fails).
fn sdks() -> bool {
    tally_testkit::have(
        "python3",
        &[
            "-c",
            "import openai, anthropic, sys; \
             sys.exit(0 if (openai.__version__, anthropic.__version__) == ('3.57.0', '2.15.0') else 1)",
        ],
        "python3 -m pip install openai==3.57.0 anthropic==2.15.0",
    )
}

/// Dollars per million tokens in the test policy: one output token is 0.05 cents
/// (500,000 nanodollars), so a call with `max_tokens = 100` reserves 5 cents of output.
const INPUT_PER_MTOK: u64 = 1;
const OUTPUT_PER_MTOK: u64 = 500;
/// Nanodollars per output token and per input token at those prices.
const OUT_NANOS: u64 = OUTPUT_PER_MTOK * 1000;
const IN_NANOS: u64 = INPUT_PER_MTOK * 1000;
/// Nanodollars in a cent.
const CENT: u64 = 10_000_000;

/// The models the fake upstream knows (its behaviour is chosen by the model name),
/// priced alike; `fake-small` has a model limit of 40 output tokens.
const MODELS: &[&str] = &[
    "fake-ok",
    "fake-cut",
    "fake-slow",
    "fake-429",
    "fake-500",
    "fake-redirect",
    "fake-usage-0-0",
    "fake-usage-100-50",
    "fake-usage-100-100",
    "fake-usage-100-20",
    "fake-usage-100-1000000",
    "fake-usage-1000000-1000000",
];

fn policy(http: &FakeUpstream, https: &FakeUpstream, extra: &str) -> String {
    let mut p = String::from(
        "[loops]\ntool_calls = 100000\nidentical_in_window = 1000\n\
         [ceiling]\nspend_cents = 100000\nattempts = 1000\n",
    );
    for (name, kind, path, up) in [
        ("openai", "openai", "/v1/chat/completions", http),
        ("anthropic", "anthropic", "/v1/messages", http),
        ("openai_tls", "openai", "/v1/chat/completions", https),
        ("anthropic_tls", "anthropic", "/v1/messages", https),
    ] {
        p.push_str(&format!(
            "[upstreams.{name}]\nurl = \"{}\"\nkind = \"{kind}\"\ncredential = \"real\"\n\
             paths = [\"{path}\"]\ntimeout_ms = 30000\n",
            up.url()
        ));
        if let Some(ca) = up.ca_pem() {
            p.push_str(&format!("ca_file = \"{}\"\n", ca.display()));
        }
        for model in MODELS.iter().chain(["fake-small"].iter()) {
            let limit = if *model == "fake-small" { 40 } else { 4096 };
            p.push_str(&format!(
                "[prices.{name}.\"{model}\"]\ninput_per_mtok = \"{INPUT_PER_MTOK}\"\n\
                 output_per_mtok = \"{OUTPUT_PER_MTOK}\"\nmax_output_tokens = {limit}\n"
            ));
        }
    }
    p.push_str(extra);
    p
}

/// Two fake upstreams (HTTP, and HTTPS with a test CA) and `tally serve` proxying to
/// both, over a fresh ledger; the daemon is killed on drop.
struct Proxy {
    dir: tempfile::TempDir,
    http: FakeUpstream,
    https: FakeUpstream,
    port: u16,
    child: Option<Child>,
}

impl Proxy {
    fn start(extra_policy: &str) -> Proxy {
        let http = FakeUpstream::start(FakeOptions {
            tls: false,
            key: REAL_KEY.into(),
        });
        let https = FakeUpstream::start(FakeOptions {
            tls: true,
            key: REAL_KEY.into(),
        });
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        ok(d, &["keygen", "--out", "auditor.key"]);
        ok(
            d,
            &["init", "--ledger", "ledger", "--recipient", "auditor.pub"],
        );
        std::fs::write(d.join("policy.toml"), policy(&http, &https, extra_policy)).expect("policy");
        let key = d.join("real.key");
        std::fs::write(&key, format!("{REAL_KEY}\n")).expect("credential");
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod");
        let port = free_port();
        let mut proxy = Proxy {
            dir,
            http,
            https,
            port,
            child: None,
        };
        proxy.serve();
        proxy
    }

    /// Start (or restart) `tally serve` over this directory's ledger.
    fn serve(&mut self) {
        let d = self.dir.path();
        let _ = std::fs::remove_file(d.join("agent.sock"));
        let _ = std::fs::remove_file(d.join("operator.sock"));
        let child = tally()
            .args([
                "serve",
                "--ledger",
                "ledger",
                "--socket",
                "agent.sock",
                "--operator-socket",
                "operator.sock",
                "--policy",
                "policy.toml",
                "--proxy-listen",
                &format!("127.0.0.1:{}", self.port),
                "--credential",
                "real=real.key",
            ])
            .current_dir(d)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tally serve");
        self.child = Some(child);
        let started = Instant::now();
        while !d.join("agent.sock").exists()
            || std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err()
        {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("tally serve exited ({status}) before it listened");
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "tally serve did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `kill -9` of the daemon: no drain, no goodbye.
    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL");
            let _ = child.wait();
        }
    }

    /// SIGTERM, and wait: the daemon drains and frees the ledger.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_child(&child),
                rustix::process::Signal::TERM,
            );
            let _ = child.wait();
        }
    }

    fn agent(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        request(&self.dir.path().join("agent.sock"), method, path, body)
    }

    /// Start a run with `budget`; its token.
    fn run(&self, run: &str, budget: Value) -> String {
        let (status, v) = self.agent(
            "POST",
            "/v1/runs",
            Some(json!({"run": run, "goal": "proxy test", "budget": budget})),
        );
        assert_eq!(status, 201, "{v}");
        v["token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token in the start answer: {v}"))
            .to_string()
    }

    fn standing(&self, run: &str) -> Value {
        let (status, v) = self.agent("GET", &format!("/v1/runs/{run}"), None);
        assert_eq!(status, 200, "{v}");
        v
    }

    /// The run's standing once nothing is held: the proxy records a call's outcome as its
    /// answer ends, so the client can read the end of the answer a moment before the
    /// settlement is durable. Waits at most 10 s, then returns what it has.
    fn standing_settled(&self, run: &str) -> Value {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let s = self.standing(run);
            if nanos(&s, "held") == 0 || Instant::now() > until {
                return s;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The upstream's base URL for `sdk` as the SDK wants it (`/v1` for OpenAI).
    fn base_url(&self, sdk: &str, tls: bool) -> String {
        let name = if tls {
            format!("{sdk}_tls")
        } else {
            sdk.to_string()
        };
        match sdk {
            "openai" => format!("http://127.0.0.1:{}/{name}/v1", self.port),
            _ => format!("http://127.0.0.1:{}/{name}", self.port),
        }
    }

    /// `agent.py SDK MODE ARGS` with the token as the key; its JSON lines.
    fn py(&self, sdk: &str, tls: bool, token: &str, args: &[&str]) -> Vec<Value> {
        let out = self
            .py_command(sdk, tls, token, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("python3");
        assert!(out.status.success(), "agent.py failed: {}", text(&out));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    fn py_command(&self, sdk: &str, tls: bool, token: &str, args: &[&str]) -> Command {
        let mut c = Command::new("python3");
        c.arg(agent_py()).arg(sdk).args(args);
        // Only what a user sets; nothing of the test's own environment leaks a key in.
        c.env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("ANTHROPIC_BASE_URL")
            .env_remove("ANTHROPIC_AUTH_TOKEN");
        match sdk {
            "openai" => c
                .env("OPENAI_BASE_URL", self.base_url(sdk, tls))
                .env("OPENAI_API_KEY", token),
            _ => c
                .env("ANTHROPIC_BASE_URL", self.base_url(sdk, tls))
                .env("ANTHROPIC_API_KEY", token),
        };
        c.stdin(Stdio::null());
        c
    }

    /// One call; its JSON line.
    fn call(&self, sdk: &str, tls: bool, token: &str, args: &[&str]) -> Value {
        let mut mode = vec!["call"];
        mode.extend_from_slice(args);
        let mut lines = self.py(sdk, tls, token, &mode);
        assert_eq!(lines.len(), 1, "{lines:?}");
        lines.remove(0)
    }

    /// The run's handoff from `tally handoff --run RUN --json` of the ledger (the daemon
    /// stopped first; `serve` starts it again).
    fn handoff(&mut self, run: &str) -> Value {
        self.stop();
        let out = tally()
            .args([
                "handoff",
                "ledger",
                "--key",
                "ledger/ledger.pub",
                "--auditor-key",
                "auditor.key",
                "--run",
                run,
                "--json",
            ])
            .current_dir(self.dir.path())
            .output()
            .expect("tally handoff");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let v: Value = serde_json::from_slice(&out.stdout).expect("handoff JSON");
        assert_eq!(v["handoffs"][0]["run"], run, "{v}");
        v["handoffs"][0].clone()
    }

    /// Every request each fake upstream received carried the real key, and none a token.
    fn upstreams_saw_only_the_key(&self, tokens: &[&str]) -> usize {
        let mut n = 0;
        for up in [&self.http, &self.https] {
            for seen in up.seen() {
                n += 1;
                assert!(
                    seen.real_key,
                    "the upstream did not get the real key: {seen:?}"
                );
                assert!(!seen.token_seen, "a token reached the upstream: {seen:?}");
                for t in tokens {
                    assert!(
                        !format!("{seen:?}").contains(t),
                        "the token reached the upstream: {seen:?}"
                    );
                }
            }
        }
        n
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let out = tally().args(args).current_dir(dir).output().expect("tally");
    assert!(out.status.success(), "tally {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn request(socket: &Path, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut client = tally_api::client::Client::unix(socket)
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
        let value = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
        (reply.status.as_u16(), value)
    })
}

/// An amount in nanodollars from a standing or a handoff's spend: `WHAT_nanos` where the
/// record has it, else `WHAT_cents` (exact whole cents).
fn nanos(v: &Value, what: &str) -> u64 {
    if let Some(n) = v[format!("{what}_nanos")].as_u64() {
        return n;
    }
    let cents = v[format!("{what}_cents")]
        .as_u64()
        .unwrap_or_else(|| panic!("no {what}_nanos or {what}_cents in {v}"));
    cents * CENT
}

/// What a call of `input` and `output` tokens is charged at the test's prices: its cost in
/// nanodollars, rounded up to the unit the run's standing counts in (whole cents while the
/// gate counts cents; the proxy rounds up, never down).
fn charged(v: &Value, input: u64, output: u64) -> u64 {
    let cost = input * IN_NANOS + output * OUT_NANOS;
    if v.get("settled_nanos").is_some() {
        cost
    } else {
        cost.div_ceil(CENT) * CENT
    }
}

/// The SDK raised `class` with HTTP `status`, and its message names `reason`.
fn raised(r: &Value, class: &str, status: u64, reason: &str) {
    assert_eq!(r["error"], class, "{r}");
    assert_eq!(r["status"], status, "{r}");
    assert!(
        r["message"].as_str().unwrap_or("").contains(reason),
        "the SDK's message does not name {reason}: {r}"
    );
}

const SDKS: [&str; 2] = ["openai", "anthropic"];

/// Each SDK, streaming and not, over HTTP and HTTPS: the call goes through, the SDK
/// parses the answer as the upstream's, tally's headers name the run and the attempt, the
/// upstream got the real key and never the token, and the run settled exactly what the
/// reported usage costs at the policy's prices.
#[test]
fn the_sdks_call_through_the_proxy_with_the_token() {
    if !sdks() {
        return;
    }
    let mut proxy = Proxy::start("");
    let mut tokens = vec![];
    let mut calls = 0;
    for sdk in SDKS {
        for tls in [false, true] {
            for stream in [false, true] {
                let run = format!("{sdk}-{tls}-{stream}");
                let token = proxy.run(&run, json!({"spend_cents": 100}));
                let mut args = vec!["--model", "fake-ok"];
                if stream {
                    args.push("--stream");
                }
                let r = proxy.call(sdk, tls, &token, &args);
                calls += 1;
                assert_eq!(r["ok"], true, "{run}: {r}");
                assert_eq!(r["headers"]["x-tally-run"], run.as_str(), "{r}");
                assert!(r["headers"]["x-tally-attempt"].is_string(), "{r}");
                assert!(r["headers"]["x-tally-seq"].is_string(), "{r}");
                assert!(!r["text"].as_str().unwrap_or("").is_empty(), "{r}");
                // OpenAI streaming: the proxy asked the upstream for usage, and the SDK,
                // which did not ask, sees no usage chunk.
                if sdk == "openai" && stream {
                    assert_eq!(r["usage"], Value::Null, "{r}");
                    assert_eq!(r["empty_choices"], 0, "{r}");
                } else {
                    assert_eq!(
                        r["usage"]["input_tokens"]
                            .as_u64()
                            .or(r["usage"]["prompt_tokens"].as_u64()),
                        Some(100),
                        "{r}"
                    );
                }
                let s = proxy.standing_settled(&run);
                assert_eq!(
                    nanos(&s, "settled"),
                    charged(&s, 100, 50),
                    "{run}: settled from the usage: {s}"
                );
                assert_eq!(nanos(&s, "held"), 0, "{run}: {s}");
                tokens.push(token);
            }
        }
    }
    // OpenAI streaming that asks for usage gets it, as from the upstream.
    let token = proxy.run("openai-usage", json!({"spend_cents": 100}));
    let r = proxy.call(
        "openai",
        false,
        &token,
        &["--model", "fake-ok", "--stream", "--include-usage"],
    );
    calls += 1;
    assert_eq!(r["usage"]["prompt_tokens"], 100, "{r}");
    assert_eq!(r["usage"]["completion_tokens"], 50, "{r}");
    tokens.push(token);
    for up in [&proxy.http, &proxy.https] {
        for seen in up.seen() {
            if seen.path.ends_with("/chat/completions") && seen.stream {
                let options: Value =
                    serde_json::from_str(seen.stream_options.as_deref().unwrap_or("null"))
                        .expect("stream_options JSON");
                assert_eq!(
                    options["include_usage"], true,
                    "the proxy did not ask for usage: {seen:?}"
                );
            }
        }
    }
    let t: Vec<&str> = tokens.iter().map(String::as_str).collect();
    assert_eq!(proxy.upstreams_saw_only_the_key(&t), calls);
    // And the ledger says what the state said.
    let h = proxy.handoff("openai-false-false");
    assert_eq!(
        nanos(&h["spend"], "settled"),
        charged(&h["spend"], 100, 50),
        "{h}"
    );
}

/// 64 calls at once against a budget of 100 cents through each SDK, streaming (over
/// HTTPS) and not (over HTTP), the upstream reporting the usage of `models` in turn: the
/// run never settles more than 100 cents, every call either went through or was refused
/// in the SDK's own error with the reason, and the ledger's settled total is the state's
/// to the unit.
fn race_within_the_budget(models: &str) {
    let mut proxy = Proxy::start("");
    let mut runs = vec![];
    for sdk in SDKS {
        for stream in [false, true] {
            let tls = stream;
            let run = format!("race-{sdk}-{stream}");
            let token = proxy.run(&run, json!({"spend_cents": 100}));
            let mut args = vec!["race", "--n", "64", "--models", models];
            if stream {
                args.push("--stream");
            }
            let results = proxy.py(sdk, tls, &token, &args);
            assert_eq!(results.len(), 64);
            let passed = results.iter().filter(|r| r["ok"] == true).count();
            for r in results.iter().filter(|r| r["ok"] != true) {
                assert_eq!(r["error"], "PermissionDeniedError", "{run}: {r}");
                assert_eq!(r["status"], 403, "{r}");
                let m = r["message"].as_str().unwrap_or("");
                assert!(
                    m.contains("reservation_insufficient") || m.contains("budget_exceeded"),
                    "{run}: refused without the reason: {r}"
                );
            }
            // 5 cents of output reserved per call: 64 never fit, so refusals happened
            // (calls that settle below their reservation free budget for later ones).
            assert!(
                (1..64).contains(&passed),
                "{run}: {passed} calls went through"
            );
            let s = proxy.standing_settled(&run);
            let settled = nanos(&s, "settled");
            let held = nanos(&s, "held");
            assert!(
                settled + held <= 100 * CENT,
                "{run}: settled {settled} + held {held} nanodollars past 100 cents: {s}"
            );
            assert_eq!(held, 0, "{run}: every call ended: {s}");
            runs.push((run, settled));
        }
    }
    proxy.upstreams_saw_only_the_key(&[]);
    for (run, settled) in runs {
        let h = proxy.handoff(&run);
        assert_eq!(
            nanos(&h["spend"], "settled"),
            settled,
            "{run}: the ledger and the state disagree: {h}"
        );
        proxy.serve();
    }
}

/// Honest usage (within what each call reserved: none, some, all of `max_tokens`).
#[test]
fn sixty_four_racing_calls_never_settle_past_the_budget() {
    if sdks() {
        race_within_the_budget("fake-ok,fake-usage-0-0,fake-usage-100-100,fake-usage-100-20");
    }
}

/// Usage far beyond what each call reserved (an upstream that lies or bills past
/// `max_tokens`): still never more than the budget settled, whatever usage they report
/// (a call settles at most its reservation: docs/PROXY.md).
#[test]
fn sixty_four_racing_calls_never_settle_past_the_budget_whatever_the_usage() {
    if sdks() {
        race_within_the_budget("fake-ok,fake-usage-100-1000000,fake-usage-1000000-1000000");
    }
}

/// Calls to one model at once, each its own prompt, are distinct calls, not retries of
/// one logical operation: with a budget that pays for all of them, 8 concurrent calls all
/// go through (none refused `retries_exhausted`, whose action `stop` would end the run).
#[test]
fn concurrent_calls_to_one_model_are_not_retries() {
    if !sdks() {
        return;
    }
    let proxy = Proxy::start("");
    for sdk in SDKS {
        let run = format!("parallel-{sdk}");
        let token = proxy.run(&run, json!({"spend_cents": 1000}));
        let results = proxy.py(
            sdk,
            false,
            &token,
            &["race", "--n", "8", "--model", "fake-ok"],
        );
        for r in &results {
            assert_eq!(r["ok"], true, "{run}: {r}");
        }
        // And one after another, after calls the upstream failed (5xx), new prompts are
        // not retries either.
        let run = format!("sequential-{sdk}");
        let token = proxy.run(&run, json!({"spend_cents": 1000}));
        for _ in 0..3 {
            let r = proxy.call(sdk, false, &token, &["--model", "fake-500"]);
            assert_eq!(r["error"], "InternalServerError", "{r}");
        }
        let r = proxy.call(sdk, false, &token, &["--model", "fake-500"]);
        assert_eq!(
            r["error"], "InternalServerError",
            "{run}: a new prompt refused: {r}"
        );
    }
}

/// An OpenAI agent that sends no `max_tokens` gets one: the most its remaining budget
/// can pay at the output price, capped by the model's limit; the upstream receives it.
#[test]
fn a_call_without_max_tokens_gets_one_its_budget_can_pay() {
    if !sdks() {
        return;
    }
    let proxy = Proxy::start("");
    for stream in [false, true] {
        let run = format!("nomax-{stream}");
        // 10 cents: at 0.05 cent per output token, fewer than 200 tokens.
        let token = proxy.run(&run, json!({"spend_cents": 10}));
        let mut args = vec!["--model", "fake-usage-100-50", "--no-max-tokens"];
        if stream {
            args.push("--stream");
        }
        let before = proxy.http.seen().len();
        let r = proxy.call("openai", false, &token, &args);
        assert_eq!(r["ok"], true, "{r}");
        let seen = proxy.http.seen();
        assert_eq!(seen.len(), before + 1);
        let injected = seen[before]
            .max_tokens
            .unwrap_or_else(|| panic!("no max_tokens reached the upstream: {:?}", seen[before]));
        assert!(injected > 0, "{injected}");
        assert!(
            injected * OUT_NANOS <= 10 * CENT,
            "{injected} output tokens cost more than the 10-cent budget"
        );
        // Not needlessly small: the input estimate is bounded, the rest is output.
        assert!(
            injected >= 100,
            "only {injected} tokens of a 200-token budget"
        );
        // The second call gets what is left after the first settled.
        let s = proxy.standing(&run);
        let left = 10 * CENT - nanos(&s, "settled");
        let r = proxy.call("openai", false, &token, &args);
        assert_eq!(r["ok"], true, "{r}");
        let seen = proxy.http.seen();
        let second = seen.last().and_then(|s| s.max_tokens).expect("max_tokens");
        assert!(
            second * OUT_NANOS <= left,
            "{second} tokens past what was left"
        );
    }
    // The model's own limit caps it when the budget could pay more.
    let token = proxy.run("nomax-small", json!({"spend_cents": 100}));
    let r = proxy.call(
        "openai",
        false,
        &token,
        &["--model", "fake-small", "--no-max-tokens"],
    );
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(
        proxy.http.seen().last().and_then(|s| s.max_tokens),
        Some(40)
    );
}

/// A response cut mid-stream (and a non-streaming body cut short), both SDKs: the SDK
/// raises, the reservation stays held (outcome unknown), nothing is settled below what
/// the call may have cost, and so after a restart of the daemon.
#[test]
fn a_cut_response_stays_held_at_its_reservation() {
    if !sdks() {
        return;
    }
    let mut proxy = Proxy::start("");
    let mut runs = vec![];
    for sdk in SDKS {
        for stream in [false, true] {
            let run = format!("cut-{sdk}-{stream}");
            let token = proxy.run(&run, json!({"spend_cents": 100}));
            let mut args = vec!["--model", "fake-cut"];
            if stream {
                args.push("--stream");
            }
            let r = proxy.call(sdk, false, &token, &args);
            assert_ne!(r["ok"], true, "{run}: a cut response read as whole: {r}");
            let s = proxy.standing(&run);
            assert_eq!(nanos(&s, "settled"), 0, "{run}: {s}");
            assert!(
                nanos(&s, "held") >= 100 * OUT_NANOS,
                "{run}: less held than the output it may have cost: {s}"
            );
            runs.push((run, nanos(&s, "held")));
        }
    }
    proxy.stop();
    proxy.serve();
    for (run, held) in &runs {
        let s = proxy.standing(run);
        assert_eq!(nanos(&s, "held"), *held, "{run}: after a restart: {s}");
        assert_eq!(nanos(&s, "settled"), 0, "{run}: {s}");
    }
    // The ledger holds what the state holds.
    for (run, held) in &runs {
        let h = proxy.handoff(run);
        assert_eq!(nanos(&h["spend"], "reserved"), *held, "{h}");
        assert_eq!(nanos(&h["spend"], "settled"), 0, "{h}");
        proxy.serve();
    }
}

/// `kill -9` of the daemon while a stream is passing through it: the SDK raises, and
/// after a restart the reservation is held (the call may have cost it), never lost and
/// never settled lower.
#[test]
fn kill_9_mid_stream_keeps_the_reservation_held() {
    if !sdks() {
        return;
    }
    let mut proxy = Proxy::start("");
    for sdk in SDKS {
        let run = format!("kill-{sdk}");
        let token = proxy.run(&run, json!({"spend_cents": 100}));
        let mut child = proxy
            .py_command(
                sdk,
                false,
                &token,
                &["hold", "--model", "fake-slow", "--stream"],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = lines.next().expect("a line").expect("read");
        assert_eq!(first, r#"{"first": true}"#, "{first}");
        let held = nanos(&proxy.standing(&run), "held");
        assert!(held >= 100 * OUT_NANOS, "{held}");
        proxy.kill9();
        let last: Value =
            serde_json::from_str(&lines.next().expect("a line").expect("read")).expect("JSON");
        assert_ne!(last["ok"], true, "a killed stream read as whole: {last}");
        let _ = child.wait();
        proxy.serve();
        let s = proxy.standing(&run);
        assert_eq!(nanos(&s, "held"), held, "{run}: after kill -9: {s}");
        assert_eq!(nanos(&s, "settled"), 0, "{run}: {s}");
    }
    let h = proxy.handoff("kill-openai");
    assert!(nanos(&h["spend"], "reserved") >= 100 * OUT_NANOS, "{h}");
}

/// A redirect to another host is refused (`scope_violation`, the SDK's
/// PermissionDeniedError), never followed.
#[test]
fn a_redirect_to_another_host_is_refused() {
    if !sdks() {
        return;
    }
    let proxy = Proxy::start("");
    for sdk in SDKS {
        for stream in [false, true] {
            let token = proxy.run(
                &format!("redirect-{sdk}-{stream}"),
                json!({"spend_cents": 100}),
            );
            let mut args = vec!["--model", "fake-redirect"];
            if stream {
                args.push("--stream");
            }
            let r = proxy.call(sdk, false, &token, &args);
            raised(&r, "PermissionDeniedError", 403, "scope_violation");
        }
    }
    // The redirect's target (127.0.0.2:1) is no upstream: only the four calls reached one.
    assert_eq!(proxy.upstreams_saw_only_the_key(&[]), 4);
}

/// A stopped run's token, and a token never issued, are 401: the SDK raises its
/// AuthenticationError, and nothing reaches the upstream.
#[test]
fn a_stopped_runs_token_is_refused_401() {
    if !sdks() {
        return;
    }
    let proxy = Proxy::start("");
    for sdk in SDKS {
        let run = format!("stopped-{sdk}");
        let token = proxy.run(&run, json!({"spend_cents": 100}));
        assert_eq!(proxy.call(sdk, false, &token, &[])["ok"], true);
        let (status, v) = proxy.agent("POST", &format!("/v1/runs/{run}/stop"), Some(json!({})));
        assert_eq!(status, 200, "{v}");
        let before = proxy.http.seen().len();
        let r = proxy.call(sdk, false, &token, &[]);
        assert_eq!(r["error"], "AuthenticationError", "{r}");
        assert_eq!(r["status"], 401, "{r}");
        let r = proxy.call(sdk, false, "tally-not-a-token", &[]);
        assert_eq!(r["error"], "AuthenticationError", "{r}");
        assert_eq!(
            proxy.http.seen().len(),
            before,
            "a refused call reached the upstream"
        );
    }
}

/// tally's refusals raise the SDK's normal errors with the reason code in the message:
/// `retry` as RateLimitError (429, Retry-After), `ask`/`stop` as PermissionDeniedError.
#[test]
fn refusals_raise_the_sdks_own_errors() {
    if !sdks() {
        return;
    }
    let proxy = Proxy::start("[rate]\nrun_per_sec = 1\nrun_burst = 1\n");
    for sdk in SDKS {
        for stream in [false, true] {
            let mut args = vec!["--model", "fake-ok"];
            if stream {
                args.push("--stream");
            }
            // A run whose budget cannot pay for one call: ask.
            let token = proxy.run(&format!("poor-{sdk}-{stream}"), json!({"spend_cents": 1}));
            let r = proxy.call(sdk, false, &token, &args);
            raised(&r, "PermissionDeniedError", 403, "reservation_insufficient");
            // A run past its rate (one call a second): retry, with Retry-After.
            let token = proxy.run(&format!("fast-{sdk}-{stream}"), json!({"spend_cents": 100}));
            let mut race = vec!["race", "--n", "3"];
            race.extend_from_slice(&args);
            let results = proxy.py(sdk, false, &token, &race);
            let limited: Vec<&Value> = results.iter().filter(|r| r["ok"] != true).collect();
            assert_eq!(results.len() - limited.len(), 1, "{results:?}");
            for r in limited {
                raised(r, "RateLimitError", 429, "rate_limit_exceeded");
                assert!(r["headers"]["retry-after"].is_string(), "{r}");
            }
        }
    }
    // The upstream's own 429 is passed through as the upstream's (and observed rejected).
    let token = proxy.run("upstream-429", json!({"spend_cents": 100}));
    let r = proxy.call("openai", false, &token, &["--model", "fake-429"]);
    assert_eq!(r["error"], "RateLimitError", "{r}");
    let s = proxy.standing_settled("upstream-429");
    assert_eq!(nanos(&s, "held"), 0, "a rejected call holds nothing: {s}");
}

/// The agent cannot report an outcome for an attempt the proxy made: the proxy observes
/// it (403 `outcome_owned_by_proxy`), and the state is what the proxy settled.
#[test]
fn the_agent_cannot_report_a_proxied_attempts_outcome() {
    if !sdks() {
        return;
    }
    let proxy = Proxy::start("");
    for sdk in SDKS {
        let run = format!("owned-{sdk}");
        let token = proxy.run(&run, json!({"spend_cents": 100}));
        let r = proxy.call(sdk, false, &token, &["--model", "fake-cut"]);
        assert_ne!(r["ok"], true, "{r}");
        let r = proxy.call(sdk, false, &token, &["--model", "fake-ok"]);
        let attempt: u64 = r["headers"]["x-tally-attempt"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no attempt header: {r}"));
        let before = proxy.standing(&run);
        // Both the call the proxy settled and the one it holds unknown (the one before).
        for a in [attempt, attempt - 1] {
            for body in [
                json!({"run": run, "attempt": a, "status": "ok", "settled_cents": 0}),
                json!({"run": run, "attempt": a, "status": "rejected"}),
            ] {
                let (status, v) = proxy.agent("POST", "/v1/outcome", Some(body));
                assert_eq!(status, 403, "{v}");
                assert_eq!(v["error"]["code"], "outcome_owned_by_proxy", "{v}");
            }
        }
        let after = proxy.standing(&run);
        assert_eq!(nanos(&after, "settled"), nanos(&before, "settled"));
        assert_eq!(nanos(&after, "held"), nanos(&before, "held"));
    }
}

/// One uid starting run after run draws from its principal budget: the 31st run in a row
/// is refused `principal_budget_exceeded` (action ask), tokens or not.
#[test]
fn thirty_one_runs_in_a_row_stop_at_the_principal_budget() {
    if !sdks() {
        return;
    }
    let proxy = Proxy::start("[principals.default]\nruns = 30\n");
    for i in 0..30 {
        let run = format!("p{i}");
        let token = proxy.run(&run, json!({"spend_cents": 10}));
        let r = proxy.call("openai", false, &token, &["--model", "fake-ok"]);
        assert_eq!(r["ok"], true, "{run}: {r}");
        let (status, v) = proxy.agent("POST", &format!("/v1/runs/{run}/stop"), Some(json!({})));
        assert_eq!(status, 200, "{v}");
    }
    let (status, v) = proxy.agent(
        "POST",
        "/v1/runs",
        Some(json!({"run": "p30", "budget": {"spend_cents": 10}})),
    );
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["code"], "principal_budget_exceeded", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("(action ask)"),
        "{v}"
    );
    // The 31st run got no token: nothing more reached the upstream.
    assert_eq!(proxy.upstreams_saw_only_the_key(&[]), 30);
}
