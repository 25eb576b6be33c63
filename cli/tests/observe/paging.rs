//! The live view's runs, paged in order.

use super::*;

/// Ten thousand runs: the snapshot is paged on the server, every run is on exactly one
/// page, and across the pages runs come nearest to a limit first.
#[test]
fn ten_thousand_runs_are_paged_in_order() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    std::fs::write(
        dir.join("policy.toml"),
        // A deadline of 100 days: the runs' nearest limit stays their attempts however
        // long a loaded machine takes to start them (an hour's deadline overtook them at
        // 88 per mille after 316 s).
        format!("max_open_runs_per_uid = 20000\n{POLICY}\n[rate]\ntool_per_sec = 0\ntool_in_flight = 0\n[ceiling]\ndeadline_ms = 8640000000\n"),
    )
    .expect("policy");
    let served = tally().serve(dir, &[]);
    const RUNS: usize = 10_000;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let socket = dir.join("agent.sock");
    rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..16 {
            let socket = socket.clone();
            tasks.push(tokio::spawn(async move {
                let mut c = tally_api::client::Client::unix(&socket)
                    .await
                    .expect("connect");
                for i in (t..RUNS).step_by(16) {
                    let run = format!("run-{i:05}");
                    // One check each: every run's nearest limit is its attempts (at
                    // least 47 per mille), which the passing of time does not move, so
                    // the order is the same at every page asked (a run's deadline would
                    // be nearer by a per mille every 3.6 s).
                    let body = json!({"run": run, "budget": {"attempts": 2 + (i % 20)}});
                    let r = c
                        .request(
                            "POST".parse().unwrap(),
                            "/v1/runs",
                            Some("application/json"),
                            body.to_string(),
                        )
                        .await
                        .expect("start");
                    assert_eq!(r.status.as_u16(), 201);
                    {
                        let body = json!({"run": run, "tool": "search", "effect": "read", "args": {"i": i}});
                        let r = c
                            .request(
                                "POST".parse().unwrap(),
                                "/v1/check",
                                Some("application/json"),
                                body.to_string(),
                            )
                            .await
                            .expect("check");
                        assert_eq!(r.status.as_u16(), 200);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.expect("client");
        }
    });
    let mut seen = std::collections::BTreeSet::new();
    let mut last = u64::MAX;
    let mut page = 0;
    loop {
        let (status, text) = served.operator_text(&format!("/v1/live?page={page}"));
        assert_eq!(status, 200, "{text}");
        let snap: Value = serde_json::from_str(&text).expect("snapshot");
        assert_eq!(snap["total_runs"], RUNS);
        let runs = snap["runs"].as_array().expect("runs");
        if runs.is_empty() {
            break;
        }
        assert!(runs.len() <= 50);
        for r in runs {
            let p = r["closeness"]["permille"].as_u64().expect("permille");
            assert!(
                p <= last,
                "not nearest first at page {page}: {p} after {last}"
            );
            last = p;
            assert!(
                seen.insert(r["run"].as_str().expect("run").to_owned()),
                "{r}"
            );
        }
        page += 1;
    }
    assert_eq!(seen.len(), RUNS);
    assert_eq!(page, RUNS / 50);
    // The first is a run of two attempts that used one: half way.
    let (_, first) = served.operator_text("/v1/live?page=0");
    let first: Value = serde_json::from_str(&first).expect("snapshot");
    assert_eq!(first["runs"][0]["closeness"]["permille"], 500);
    // A page past the end is empty, and a bad parameter is a typed error.
    let (status, text) = served.operator_text("/v1/live?page=x");
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("invalid_query"), "{text}");
}
