use super::*;

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
    served.verifies_the_bill(&upstream, &prices(), 0);
    let h = served.handoff("race");
    assert_eq!(h["spend"]["settled_nanos"].as_u64(), Some(settled), "{h}");
}
