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
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tally_testkit::tally::text;
use tally_testkit::upstream::{
    assert_bill, open_reservations, FakeOptions, FakeUpstream, Ledger, Price, Unbilled,
};
use tally_testkit::{Daemon, Tally};

fn tally() -> Tally {
    Tally::new(env!("CARGO_BIN_EXE_tally"))
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
    // Gemini and Azure OpenAI (cli/tests/proxy_sdk/dialects.rs): the fake over HTTP.
    p.push_str(&format!(
        "[upstreams.gemini]\nurl = \"{url}\"\nkind = \"gemini\"\ncredential = \"real\"\n\
         paths = [\"/v1beta/models\", \"/v1/models\"]\ntimeout_ms = 30000\n\
         [upstreams.azure]\nurl = \"{url}\"\nkind = \"azure_openai\"\ncredential = \"real\"\n\
         paths = [\"/openai/deployments\", \"/openai/responses\"]\ntimeout_ms = 30000\n\
         api_versions = [\"{AZURE_API_VERSION}\"]\n\
         deployments = {{ \"{AZURE_DEPLOYMENT}\" = \"{AZURE_MODEL}\" }}\n\
         [prices.azure.\"{AZURE_MODEL}\"]\ninput_per_mtok = \"{AZURE_INPUT}\"\n\
         output_per_mtok = \"{AZURE_OUTPUT}\"\nmax_output_tokens = 4096\n\
         [prices.gemini.\"{GEMINI_CACHED_MODEL}\"]\ninput_per_mtok = \"{INPUT_PER_MTOK}\"\n\
         cached_input_per_mtok = \"0.25\"\noutput_per_mtok = \"{OUTPUT_PER_MTOK}\"\n\
         max_output_tokens = 4096\n",
        url = http.url()
    ));
    for model in ["fake-ok", "fake-cut"] {
        p.push_str(&format!(
            "[prices.gemini.\"{model}\"]\ninput_per_mtok = \"{INPUT_PER_MTOK}\"\n\
             output_per_mtok = \"{OUTPUT_PER_MTOK}\"\nmax_output_tokens = 4096\n"
        ));
    }
    p.push_str(&bedrock::policy(http));
    p.push_str(extra);
    p
}

/// Azure OpenAI in the test policy: the one deployment, the model it maps to (priced
/// apart from the fake's models, so that only the mapping's price settles it), and the
/// one `api-version` forwarded.
const AZURE_DEPLOYMENT: &str = "prod-chat";
const AZURE_MODEL: &str = "azure-model";
const AZURE_API_VERSION: &str = "2024-10-21";
const AZURE_INPUT: u64 = 2;
const AZURE_OUTPUT: u64 = 300;
/// A Gemini model reporting 100 prompt tokens (40 cached, at $0.25 per million) and 50
/// output tokens (20 of them thoughts).
const GEMINI_CACHED_MODEL: &str = "fake-usage-100-50-40-20";

/// Two fake upstreams (HTTP, and HTTPS with a test CA) and `tally serve` (testkit's
/// [`Daemon`]) proxying to both, over a fresh ledger; the daemon is killed on drop.
struct Proxy {
    daemon: Daemon,
    http: FakeUpstream,
    https: FakeUpstream,
    port: u16,
    // Last: removed after the daemon is gone.
    dir: tempfile::TempDir,
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
        tally().init(d, &policy(&http, &https, extra_policy));
        let key = d.join("real.key");
        std::fs::write(&key, format!("{REAL_KEY}\n")).expect("credential");
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod");
        // Bedrock's: the AWS credential the fake checks signatures against.
        let aws = d.join("aws.key");
        std::fs::write(
            &aws,
            format!("{}\n", tally_testkit::upstream::AWS_CREDENTIAL),
        )
        .expect("credential");
        std::fs::set_permissions(&aws, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod");
        let port = free_port();
        // The proxy's port is bound before the daemon's sockets listen.
        let daemon = tally().serve(
            d,
            &[
                "--proxy-listen",
                &format!("127.0.0.1:{port}"),
                "--credential",
                "real=real.key",
                "--credential",
                "aws=aws.key",
            ],
        );
        Proxy {
            daemon,
            http,
            https,
            port,
            dir,
        }
    }

    /// Start `tally serve` again over this directory's ledger (stopped first if it
    /// runs).
    fn serve(&mut self) {
        self.daemon.stop();
        self.daemon.restart();
    }

    /// `kill -9` of the daemon: no drain, no goodbye.
    fn kill9(&mut self) {
        self.daemon.kill_9();
    }

    /// SIGTERM, and wait: the daemon drains and frees the ledger.
    fn stop(&mut self) {
        self.daemon.stop();
    }

    fn agent(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.daemon.agent(method, path, body)
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
            // The SDKs add `/v1beta/models/...` and `/openai/deployments/...` themselves.
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
        for v in [
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "OPENAI_BASE_URL",
            "ANTHROPIC_BASE_URL",
            "ANTHROPIC_AUTH_TOKEN",
            "GOOGLE_API_KEY",
            "GEMINI_API_KEY",
            "GOOGLE_GEMINI_BASE_URL",
            "GOOGLE_GENAI_USE_VERTEXAI",
            "GOOGLE_CLOUD_PROJECT",
            "AZURE_OPENAI_API_KEY",
            "AZURE_OPENAI_AD_TOKEN",
            "AZURE_OPENAI_ENDPOINT",
            "OPENAI_API_VERSION",
        ] {
            c.env_remove(v);
        }
        match sdk {
            "openai" => c
                .env("OPENAI_BASE_URL", self.base_url(sdk, tls))
                .env("OPENAI_API_KEY", token),
            "gemini" => c
                .env("GOOGLE_GEMINI_BASE_URL", self.base_url(sdk, tls))
                .env("GEMINI_API_KEY", token),
            "azure" => c
                .env("AZURE_OPENAI_ENDPOINT", self.base_url(sdk, tls))
                .env("OPENAI_API_VERSION", AZURE_API_VERSION)
                .env("AZURE_OPENAI_API_KEY", token),
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
        let (out, v) = tally().report(self.dir.path(), "handoff", &["--run", run]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert_eq!(v["handoffs"][0]["run"], run, "{v}");
        v["handoffs"][0].clone()
    }

    /// The daemon stopped, `tally verify --json` finds the ledger intact and replay
    /// nothing, and the upstreams' bill is the ledger's, as [`assert_bill`] compares them:
    /// what both fake upstreams billed at the policy's prices is what the ledger settled
    /// (`tally handoff --json`, every run),
    /// and what it holds is what the calls no outcome settled reserved (each run's
    /// decisions read back). The report.
    fn verifies_the_bill(&mut self) -> Value {
        self.stop();
        let report = tally().verifies(self.dir.path());
        let (out, handoffs) = tally().report(self.dir.path(), "handoff", &[]);
        assert!(out.status.success(), "{handoffs}");
        let held = handoffs["handoffs"]
            .as_array()
            .expect("handoffs")
            .iter()
            .map(|h| {
                let run = h["run"].as_str().expect("run");
                open_reservations(&tally().decisions(self.dir.path(), run))
            })
            .sum();
        let price = Price::usd(INPUT_PER_MTOK, OUTPUT_PER_MTOK);
        let mut prices: Vec<(&str, Price)> = MODELS
            .iter()
            .chain(["fake-small"].iter())
            .map(|m| (*m, price))
            .collect();
        // The fake bills Azure's calls under the deployment's name, at its model's price.
        prices.push((AZURE_DEPLOYMENT, Price::usd(AZURE_INPUT, AZURE_OUTPUT)));
        prices.extend(bedrock::prices());
        prices.push((
            GEMINI_CACHED_MODEL,
            Price {
                cached_input_per_mtok: 250_000_000,
                ..price
            },
        ));
        assert_bill(
            &[&self.http, &self.https],
            &prices,
            Ledger::handed_off(&handoffs),
            Unbilled {
                held_nanos: held,
                settled_nanos: 0,
            },
        );
        report
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
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

/// The exception and HTTP status `sdk` raises for a `stop` or `ask` refusal: 403 in
/// OpenAI's dialect, 402 (`billing_error`) in Anthropic's (docs/PROXY.md, "Refusals in
/// the upstream's own dialect").
fn refused(sdk: &str) -> (&'static str, u64) {
    match sdk {
        "anthropic" => ("PaymentRequiredError", 402),
        _ => ("PermissionDeniedError", 403),
    }
}

mod authority;
mod bedrock;
mod calls;
mod dialects;
mod held;
#[path = "../common/ledger.rs"]
mod ledger;
mod race;
mod retries;
