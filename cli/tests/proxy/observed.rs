//! The operator's view of proxied calls: after the proxy's kind of traffic (allows,
//! upstream errors, refusals made before the gate is asked, a budget refusal, streams),
//! `/metrics` parsed by the Prometheus project's own parser, `tally runs --json` and the
//! live page's snapshot count every allow, refusal and settled nanodollar the ledger holds
//! (`tally stats --json` and the decisions themselves the reference). Before the proxy's
//! decisions were counted where they are made, `/metrics` had no series for them.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use super::*;

/// What one view says of the proxied traffic; a view leaves out what it does not show.
#[derive(Debug, Default, PartialEq)]
struct Counts {
    allows: Option<u64>,
    refusals: Option<u64>,
    outcomes: Option<u64>,
    reserved: Option<u64>,
    settled: Option<u64>,
    /// Settled nanodollars by (upstream, model).
    by_model: Option<BTreeMap<(String, String), u64>>,
    runs: BTreeMap<String, RunCounts>,
}

#[derive(Debug, Default, PartialEq)]
struct RunCounts {
    settled: u64,
    /// Attempts used.
    attempts: Option<u64>,
    /// The reason of the run's last refusal.
    last_refusal: Option<String>,
}

/// The one comparison: everything `seen` (the view `what`) shows equals the ledger's.
fn agrees(what: &str, seen: &Counts, ledger: &Counts) {
    let same = |name: &str, a: Option<u64>, b: Option<u64>| {
        if let Some(a) = a {
            assert_eq!(Some(a), b, "{what}: {name} differs from the ledger's");
        }
    };
    same("allows", seen.allows, ledger.allows);
    same("refusals", seen.refusals, ledger.refusals);
    same("outcomes", seen.outcomes, ledger.outcomes);
    same("reserved nanos", seen.reserved, ledger.reserved);
    same("settled nanos", seen.settled, ledger.settled);
    if let Some(m) = &seen.by_model {
        assert_eq!(
            Some(m),
            ledger.by_model.as_ref(),
            "{what}: settled by upstream and model"
        );
    }
    for (run, ledger_run) in &ledger.runs {
        let Some(s) = seen.runs.get(run) else {
            if seen.runs.is_empty() {
                continue;
            }
            panic!("{what}: run {run} is missing");
        };
        assert_eq!(s.settled, ledger_run.settled, "{what}: run {run}'s settled");
        if let Some(a) = s.attempts {
            assert_eq!(Some(a), ledger_run.attempts, "{what}: run {run}'s attempts");
        }
        assert_eq!(
            s.last_refusal, ledger_run.last_refusal,
            "{what}: run {run}'s last refusal"
        );
    }
}

/// The exposition parsed by prometheus_client's OpenMetrics parser (the observe tests'
/// script): (name, labels) -> value.
pub(super) fn parse_metrics(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    let mut child = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/observe/metrics.py"
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("parser");
    assert!(
        out.status.success(),
        "the Prometheus parser refused the exposition: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("samples")
}

fn metrics_counts(text: &str) -> Counts {
    let samples = parse_metrics(text);
    let sum = |name: &str, keep: &dyn Fn(&BTreeMap<String, String>) -> bool| {
        samples
            .iter()
            .filter(|(n, l, _)| n == name && keep(l))
            .map(|(_, _, v)| *v as u64)
            .sum::<u64>()
    };
    let mut by_model = BTreeMap::new();
    for (n, l, v) in &samples {
        if n == "tally_upstream_spend_settled_nanos_total" && *v > 0.0 {
            by_model.insert((l["upstream"].clone(), l["model"].clone()), *v as u64);
        }
    }
    // Every proxied check is also counted by upstream and model.
    let checks = sum("tally_checks_total", &|_| true);
    assert_eq!(
        sum("tally_upstream_checks_total", &|_| true),
        checks,
        "{text}"
    );
    Counts {
        allows: Some(sum("tally_checks_total", &|l| l["decision"] == "allow")),
        refusals: Some(sum("tally_checks_total", &|l| l["decision"] != "allow")),
        outcomes: Some(sum("tally_outcomes_total", &|_| true)),
        reserved: Some(sum("tally_spend_reserved_nanos_total", &|_| true)),
        settled: Some(sum("tally_spend_settled_nanos_total", &|_| true)),
        by_model: Some(by_model),
        runs: BTreeMap::new(),
    }
}

/// `tally runs --json` or the snapshot's runs: per run, settled, attempts and last refusal.
fn runs_counts(runs: &Value, attempts: &dyn Fn(&Value) -> Option<u64>) -> Counts {
    let mut c = Counts::default();
    for r in runs.as_array().expect("runs") {
        c.runs.insert(
            r["run"].as_str().expect("run").to_owned(),
            RunCounts {
                settled: r["settled_nanos"].as_u64().expect("settled_nanos"),
                attempts: attempts(r),
                last_refusal: r["last_refusal"]["reason"].as_str().map(str::to_owned),
            },
        );
    }
    c
}

/// The ledger's own counts: the decisions of each run, and `tally stats --json`.
fn ledger_counts(served: &Served, runs: &[&str]) -> Counts {
    let mut c = Counts {
        allows: Some(0),
        refusals: Some(0),
        outcomes: Some(0),
        reserved: Some(0),
        settled: Some(0),
        by_model: Some(BTreeMap::new()),
        runs: BTreeMap::new(),
    };
    let add = |x: &mut Option<u64>, n: u64| *x = Some(x.unwrap_or(0) + n);
    let (out, stats) = tally().report(served.dir(), "stats", &[]);
    assert!(out.status.success(), "{stats}");
    for run in runs {
        let mut calls: BTreeMap<u64, (String, String)> = BTreeMap::new();
        let mut rc = RunCounts::default();
        for d in served.decisions(run) {
            let d = &d["decision"];
            match d["kind"].as_str() {
                Some("allow") => {
                    add(&mut c.allows, 1);
                    add(&mut c.reserved, d["reserve_nanos"].as_u64().unwrap_or(0));
                    calls.insert(
                        d["attempt"].as_u64().expect("attempt"),
                        (
                            d["tool"].as_str().expect("tool").to_owned(),
                            d["args_preview"].as_str().expect("model").to_owned(),
                        ),
                    );
                }
                Some("deny") => {
                    add(&mut c.refusals, 1);
                    rc.last_refusal = d["reason"].as_str().map(str::to_owned);
                }
                Some("outcome") => {
                    add(&mut c.outcomes, 1);
                    let n = d["settled_nanos"].as_u64().unwrap_or(0);
                    add(&mut c.settled, n);
                    rc.settled += n;
                    let call = calls[&d["attempt"].as_u64().expect("attempt")].clone();
                    if n > 0 {
                        *c.by_model
                            .as_mut()
                            .expect("by model")
                            .entry(call)
                            .or_default() += n;
                    }
                }
                _ => {}
            }
        }
        let s = stats["runs"]
            .as_array()
            .expect("stats runs")
            .iter()
            .find(|s| s["run"] == *run)
            .expect("the run in stats");
        assert_eq!(s["spend"]["settled_nanos"], rc.settled, "{s}");
        rc.attempts = s["attempts"]["used"].as_u64();
        c.runs.insert((*run).to_owned(), rc);
    }
    c
}

pub(super) async fn operator(served: &Served, path: &str) -> (u16, Vec<u8>) {
    let mut client = tally_api::client::Client::unix(&served.daemon.operator_socket())
        .await
        .expect("connect");
    let reply = client
        .request("GET".parse().expect("method"), path, None, String::new())
        .await
        .expect("request");
    (reply.status.as_u16(), reply.body.to_vec())
}

/// `/metrics` once it counts `outcomes` outcomes (at most 10 s). The gate's state has an
/// outcome (a standing's `held_nanos` shows it) a moment before the outcome is durable
/// and counted, so a scrape right after the standing may miss the last one.
pub(super) async fn metrics_after(served: &Served, outcomes: u64) -> String {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, text) = operator(served, "/metrics").await;
        assert_eq!(status, 200);
        let text = String::from_utf8(text).expect("utf-8");
        let counted: u64 = text
            .lines()
            .filter(|l| l.starts_with("tally_outcomes_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        if counted >= outcomes || std::time::Instant::now() > until {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_runs_and_the_page_count_every_proxied_decision_the_ledger_holds() {
    if !tally_testkit::have(
        "python3",
        &["-c", "import prometheus_client"],
        "pip install prometheus-client==0.26.0 (README, Development)",
    ) {
        return;
    }
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let chat_path = "/openai/v1/chat/completions";

    // Run a: OpenAI calls that settle, stream, fail upstream and are turned away upstream.
    let a = bearer(&served.start_run("a").await);
    let h = [("authorization", a.as_str())];
    for (model, extra, status) in [
        ("fake-ok", json!({"max_tokens": 50}), 200),
        ("fake-ok", json!({"max_tokens": 50, "stream": true}), 200),
        ("fake-500", json!({"max_tokens": 50}), 500),
        ("fake-429", json!({"max_tokens": 50}), 429),
        ("fake-ok", json!({"max_tokens": 20}), 200),
    ] {
        let r = call(served.proxy, chat_path, &h, chat(model, extra)).await;
        assert_eq!(r.status, status, "{model}: {}", r.text());
    }
    // Run b: Anthropic calls, and refusals made before the gate is asked.
    let b = served.start_run("b").await;
    for stream in [false, true] {
        let body = json!({"model": "fake-ok", "max_tokens": 50, "stream": stream,
                          "messages": [{"role": "user", "content": "hi"}]});
        let r = call(
            served.proxy,
            "/anthropic/v1/messages",
            &[("x-api-key", &b)],
            body.to_string(),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let hb = bearer(&b);
    for (path, body, status) in [
        (chat_path, b"not json".to_vec(), 400),
        (chat_path, chat("gpt-4o", json!({})), 403),
        ("/openai/v1/files", chat("fake-ok", json!({})), 403),
        (
            chat_path,
            chat("fake-ok", json!({"pad": "x".repeat(5000)})),
            413,
        ),
    ] {
        let r = call(served.proxy, path, &[("authorization", &hb)], body).await;
        assert_eq!(r.status, status, "{path}: {}", r.text());
    }
    // Run c: a budget no call fits in.
    let (status, v) = served
        .agent(
            "POST",
            "/v1/runs",
            Some(json!({"run": "c", "budget": {"spend_cents": 5}})),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let c = bearer(v["token"].as_str().expect("token"));
    let r = call(
        served.proxy,
        chat_path,
        &[("authorization", &c)],
        chat("fake-ok", json!({"max_tokens": 100})),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    let refused = r.json();
    // A refusal asking a human names its cause.
    assert_eq!(refused["error"]["code"], "approval_required", "{refused}");
    assert_eq!(
        refused["error"]["cause"], "reservation_insufficient",
        "{refused}"
    );
    let words = refused["error"]["message"].as_str().expect("message");
    // The refusal says what the call needed and what is left.
    assert!(
        words.contains("may cost up to $0.1") && words.contains("the run has $0.05 left of $0.05"),
        "{words}"
    );
    for run in ["a", "b", "c"] {
        let st = served.settled(run).await;
        assert_eq!(st["held_nanos"], 0, "{st}");
    }

    let text = metrics_after(&served, 7).await;
    let seen_metrics = metrics_counts(&text);
    // No model an agent named is a label: the unpriced one is `other`, with the
    // refusals whose model was never read.
    assert!(
        text.contains(
            r#"tally_upstream_checks_total{upstream="openai",model="other",decision="deny"} 4"#
        ) && !text.contains("gpt-4o"),
        "{text}"
    );
    let runs_text = tally().ok(
        served.dir(),
        &["runs", "--operator-socket", "operator.sock", "--json"],
        "",
    );
    let listed: Value = serde_json::from_str(&runs_text).expect("runs json");
    let seen_runs = runs_counts(&listed, &|r| r["limits"]["attempts"]["used"].as_u64());
    let (status, snap) = operator(&served, "/v1/live").await;
    assert_eq!(status, 200);
    let snap: Value = serde_json::from_slice(&snap).expect("snapshot");
    let seen_page = runs_counts(&snap["runs"], &|r| {
        r["spark"]["attempts"]["used"]
            .as_array()
            .and_then(|u| u.last())
            .and_then(Value::as_u64)
    });
    // A row's numbers are its bar's: the last point of each trajectory is where the run
    // stands, which its closeness is drawn from.
    for row in snap["runs"].as_array().expect("rows") {
        let listed_row = listed
            .as_array()
            .expect("runs")
            .iter()
            .find(|r| r["run"] == row["run"])
            .expect("the row's run in tally runs");
        for dim in ["attempts", "spend_nanos"] {
            let spark = &row["spark"][dim];
            assert_eq!(
                spark["used"].as_array().and_then(|u| u.last()),
                Some(&listed_row["limits"][dim]["used"]),
                "{dim} of {row}"
            );
            assert_eq!(spark["limit"], listed_row["limits"][dim]["limit"], "{row}");
        }
        // (Read a moment apart: the deadline's clock moved, nothing else.)
        for k in ["nearest", "permille"] {
            assert_eq!(row["closeness"][k], listed_row["closeness"][k], "{row}");
        }
    }

    served.verifies_the_bill(&upstream, &prices(), 0);
    let ledger = ledger_counts(&served, &["a", "b", "c"]);
    assert_eq!(ledger.allows, Some(7), "{ledger:?}");
    assert_eq!(ledger.refusals, Some(5), "{ledger:?}");
    assert!(ledger.settled.unwrap_or(0) > 0, "{ledger:?}");
    agrees("/metrics", &seen_metrics, &ledger);
    agrees("tally runs --json", &seen_runs, &ledger);
    agrees("the live page", &seen_page, &ledger);
}
