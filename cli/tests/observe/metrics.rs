//! `/metrics` parsed by the Prometheus project's own parser and held against the ledger's own
//! counts after a load.

use super::*;

/// The exposition parsed by prometheus_client's OpenMetrics parser: (name, labels) ->
/// value.
fn parse_metrics(text: &str) -> BTreeMap<(String, BTreeMap<String, String>), f64> {
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
    let samples: Vec<(String, BTreeMap<String, String>, f64)> =
        serde_json::from_slice(&out.stdout).expect("samples");
    samples.into_iter().map(|(n, l, v)| ((n, l), v)).collect()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The counters after a scripted load equal the ledger's own counts: checks by decision,
/// reason and tool; outcomes by status; entries. A tool name an agent made up is never a
/// label (`other`), nor is a run name.
#[test]
fn metrics_parse_and_match_the_ledger_after_a_load() {
    if !python_has(
        "prometheus_client",
        "pip install prometheus-client==0.26.0 (README, Development)",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut served = tally().serve(dir, &["--metrics-listen", &addr]);
    for r in 0..4 {
        let run = format!("load-run-{r}");
        served.start_run(&run, 12);
        for i in 0..6 {
            let a = served.check(&run, "search", json!({"q": i}));
            if let Some(n) = a["attempt"].as_u64() {
                served.outcome(&run, n, if i % 2 == 0 { "ok" } else { "error" });
            }
        }
        // Identical calls: the loop rule refuses after the third.
        for _ in 0..5 {
            served.call(&run, "search", json!({"q": "same"}));
        }
        // Tools an agent made up.
        for i in 0..3 {
            served.check(&run, &format!("invented-tool-{r}-{i}"), json!({"i": i}));
        }
    }
    let (status, text) = served.operator_text("/metrics");
    assert_eq!(status, 200, "{text}");
    // The same series on the loopback listener.
    let over_tcp = std::process::Command::new("curl")
        .args(["-sS", "--fail", &format!("http://{addr}/metrics")])
        .output();
    if let Ok(o) = &over_tcp {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stdout).contains("tally_checks_total"));
    } else if tally_testkit::have("curl", &[], "apt-get install curl") {
        panic!("curl failed: {over_tcp:?}");
    }
    let metrics = parse_metrics(&text);
    for (name, l) in metrics.keys() {
        for v in l.values() {
            assert!(
                !v.contains("invented") && !v.contains("load-run"),
                "an agent-chosen string is a label value: {name} {l:?}"
            );
        }
    }
    served.stop();

    // The ledger's own counts.
    let all = decisions(dir);
    let mut checks: BTreeMap<(String, String, String), f64> = BTreeMap::new();
    let mut outcomes: BTreeMap<String, f64> = BTreeMap::new();
    for d in all.values() {
        let kind = d["kind"].as_str().unwrap_or("");
        let tool = d["tool"].as_str().unwrap_or("");
        let tool = if ["search", "flaky", "write_file"].contains(&tool) {
            tool.to_owned()
        } else {
            "other".to_owned()
        };
        match kind {
            "allow" | "deny" | "require_approval" => {
                let reason = d["reason"].as_str().unwrap_or("none").to_owned();
                *checks.entry((kind.to_owned(), reason, tool)).or_default() += 1.0;
            }
            "outcome" => {
                *outcomes
                    .entry(d["status"].as_str().unwrap_or("").to_owned())
                    .or_default() += 1.0
            }
            _ => {}
        }
    }
    assert!(
        checks.keys().any(|(_, r, _)| r == "loop_repeated_call"),
        "{checks:?}"
    );
    assert!(checks.keys().any(|(_, _, t)| t == "other"), "{checks:?}");
    let mut seen_checks = BTreeMap::new();
    for ((name, l), v) in &metrics {
        if name == "tally_checks_total" {
            seen_checks.insert(
                (
                    l["decision"].clone(),
                    l["reason"].clone(),
                    l["tool"].clone(),
                ),
                *v,
            );
        }
    }
    assert_eq!(seen_checks, checks, "checks by decision, reason and tool");
    for (status, n) in &outcomes {
        assert_eq!(
            metrics.get(&("tally_outcomes_total".into(), labels(&[("status", status)]))),
            Some(n),
            "outcomes {status}"
        );
    }
    let entries = metrics[&("tally_ledger_entries".to_string(), BTreeMap::new())];
    assert_eq!(entries as usize, log_entries(dir), "entries");
    assert_eq!(
        metrics[&("tally_runs".to_string(), labels(&[("state", "running")]))],
        4.0
    );
    assert!(metrics[&("tally_ledger_log_bytes".to_string(), BTreeMap::new())] > 0.0);
    assert!(
        metrics[&(
            "tally_check_duration_seconds_count".to_string(),
            BTreeMap::new()
        )] >= checks.values().sum::<f64>()
    );
    assert!(
        metrics[&(
            "tally_ledger_sync_duration_seconds_count".to_string(),
            BTreeMap::new()
        )] > 0.0
    );
}

/// Entries in the log (genesis, epochs and decisions).
fn log_entries(dir: &Path) -> usize {
    tally_ledger::segment::LogReader::open(&dir.join("ledger"))
        .expect("log")
        .frames()
        .filter(|f| matches!(f, Ok(tally_ledger::Frame::Entry(_))))
        .count()
}

/// The status line of `GET path` on `stream`, read within 20 s.
fn status_of(mut stream: impl std::io::Read + Write, path: &str) -> String {
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("write");
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => got.push(byte[0]),
            other => panic!("no status line ({other:?}): {got:?}"),
        }
    }
    String::from_utf8_lossy(&got).trim_end().to_owned()
}

/// `--max-live-streams` and `--metrics-max-connections` bound what `tally serve` holds for
/// the view: with both at 1, one open event stream on the listener takes the only
/// stream (the operator socket's is refused `503`) and the listener's only connection
/// (a scrape is refused `503`).
#[test]
fn the_views_bounds_are_set_by_flags() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut served = tally().serve(
        dir,
        &[
            "--metrics-listen",
            &addr,
            "--max-live-streams",
            "1",
            "--metrics-max-connections",
            "1",
        ],
    );
    let timeout = Some(Duration::from_secs(20));
    let stream = std::net::TcpStream::connect(&addr).expect("connect");
    stream.set_read_timeout(timeout).expect("timeout");
    assert_eq!(status_of(&stream, "/v1/live/events"), "HTTP/1.1 200 OK");
    let op = std::os::unix::net::UnixStream::connect(served.operator_socket()).expect("op");
    op.set_read_timeout(timeout).expect("timeout");
    assert_eq!(
        status_of(&op, "/v1/live/events"),
        "HTTP/1.1 503 Service Unavailable"
    );
    let scrape = std::net::TcpStream::connect(&addr).expect("connect");
    scrape.set_read_timeout(timeout).expect("timeout");
    assert_eq!(
        status_of(&scrape, "/metrics"),
        "HTTP/1.1 503 Service Unavailable"
    );
    drop(stream);
    served.stop();
}
