//! The JSON log: a line per decision, no arguments.

use super::*;

/// `serve --log-format json`: every line one JSON object, a line per decision with run,
/// tool, decision, reason and seq; never the arguments.
#[test]
fn the_json_log_has_a_line_per_decision_and_no_arguments() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    let mut served = tally().serve(dir, &["--log-format", "json"]);
    served.start_run("logged", 10);
    let secret = "do-not-log-this-3f9a";
    let mut seqs = Vec::new();
    for _ in 0..4 {
        let a = served.call("logged", "search", json!({ "token": secret }));
        seqs.push(a["seq"].as_u64().expect("seq"));
    }
    // The live page's event stream open on the operator socket: SIGTERM still drains
    // and stops (the stream ends), and the stop line is JSON too.
    let mut page = tally_testkit::have("curl", &[], "apt-get install curl").then(|| {
        Command::new("curl")
            .args(["-sN", "--unix-socket"])
            .arg(dir.join("operator.sock"))
            .arg("http://localhost/v1/live/events")
            .stdout(Stdio::piped())
            .spawn()
            .expect("curl")
    });
    if let Some(p) = &mut page {
        let mut first = String::new();
        BufReader::new(p.stdout.as_mut().expect("stdout"))
            .read_line(&mut first)
            .expect("the stream");
        assert!(first.starts_with("event: snapshot"), "{first:?}");
    }
    let stopping = Instant::now();
    served.stop();
    assert!(
        stopping.elapsed() < Duration::from_secs(15),
        "{:?}",
        stopping.elapsed()
    );
    if let Some(mut p) = page {
        let _ = p.kill();
        let _ = p.wait();
    }
    let log = std::fs::read_to_string(dir.join("serve.log")).expect("log");
    assert!(log.contains("stopped cleanly"), "{log}");
    assert!(!log.contains(secret), "{log}");
    let decisions: Vec<Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {l}"));
            (v["msg"] == "decision").then_some(v)
        })
        .collect();
    let outcomes = decisions.iter().filter(|d| d["kind"] == "outcome").count();
    assert_eq!(outcomes, 3, "{log}");
    let decisions: Vec<&Value> = decisions.iter().filter(|d| d["kind"] == "check").collect();
    assert_eq!(decisions.len(), 4, "{log}");
    for (d, seq) in decisions.iter().zip(&seqs) {
        assert_eq!(d["level"], "info");
        assert_eq!(d["run"], "logged");
        assert_eq!(d["tool"], "search");
        assert_eq!(d["seq"], *seq);
        assert!(d.get("args").is_none());
    }
    assert_eq!(decisions[3]["decision"], "deny");
    assert_eq!(decisions[3]["reason"], "loop_repeated_call");
}
