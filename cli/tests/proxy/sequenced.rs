//! A proxied call's outcome is sequenced before the end of its answer is released: a
//! check the agent makes once it has the whole answer decides on the settled spend, and
//! is durable only after the outcome (docs/PROXY.md, "The outcome off the answer's path").

use super::*;

/// A check of `run` on the agent socket reserving `nanos`: its decision and seq.
async fn check(served: &Served, run: &str, nanos: u64) -> (String, Value) {
    let body = json!({"run": run, "tool": "search", "effect": "read", "reserve_nanos": nanos});
    let (status, v) = served.agent("POST", "/v1/check", Some(body)).await;
    assert_eq!(status, 200, "{v}");
    (v["decision"].as_str().unwrap_or_default().to_owned(), v)
}

/// The ceiling of [`policy`] here: $0.20.
const CEILING: u64 = 200_000_000;
/// What `fake-ok` settles: 100 tokens in at $10/M and 50 out at $1,000/M.
const FAKE_OK: u64 = 51_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_right_after_a_proxied_answer_decides_on_its_settled_spend() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 20));
    for (run, extra) in [("plain", json!({})), ("stream", json!({"stream": true}))] {
        let token = served.start_run(run).await;
        let a = call(
            served.proxy,
            "/openai/v1/chat/completions",
            &[("authorization", &bearer(&token))],
            chat("fake-ok", extra),
        )
        .await;
        assert_eq!((a.status, a.cut), (200, false), "{}", a.text());
        // No wait: the answer's end came after the outcome was sequenced. What is left
        // is the ceiling less the settled spend, not less the reservation (about $0.10):
        // exactly that fits, and not a nanodollar more.
        let (fits, v) = check(&served, run, CEILING - FAKE_OK).await;
        assert_eq!(fits, "allow", "{run}: {v}");
        let (over, v) = check(&served, run, 1).await;
        assert_ne!(over, "allow", "{run}: {v}");
        assert_eq!(v["limits"]["spend_nanos"]["used"], CEILING, "{run}: {v}");
    }
    served.verifies_the_bill(&upstream, &prices(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_outcome_is_in_the_log_before_a_later_acknowledged_decision() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-ok", json!({})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    // A later decision, acknowledged (so durable), then the daemon killed at once.
    let (allowed, v) = check(&served, "r", 1).await;
    assert_eq!(allowed, "allow", "{v}");
    let later = v["seq"].as_u64().expect("an acknowledged decision's seq");
    served.kill9();
    let report = tally().verifies(served.dir());
    assert_eq!(report["verdict"], "intact", "{report}");
    let decisions = served.decisions("r");
    let outcome = decisions
        .iter()
        .find(|d| d["decision"]["kind"] == "outcome" && d["decision"]["proxied"] == true)
        .expect("the proxied outcome, durable");
    assert_eq!(outcome["decision"]["settled_nanos"], FAKE_OK, "{outcome}");
    let seq = outcome["seq"].as_u64().expect("seq");
    assert!(
        seq < later,
        "the outcome ({seq}) before the check ({later})"
    );
}

/// The outcome's record rides the next decision's fsync, or commits alone 5 ms later: a
/// `kill -9` right after the answer lands inside that window (or just after it). Either
/// the outcome is in the log, settled, or, no decision having been acknowledged after
/// it, it is lost whole: then the call's reservation is held after the restart, in the
/// run's standing and in `tally handoff`, and `tally verify` finds the ledger intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_right_after_a_proxied_answer_loses_its_outcome_only_whole_and_held() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-ok", json!({})),
    )
    .await;
    assert_eq!((a.status, a.cut), (200, false), "{}", a.text());
    // Nothing decided after it: the daemon killed at once.
    served.kill9();
    let report = tally().verifies(served.dir());
    assert_eq!(report["verdict"], "intact", "{report}");
    let decisions = served.decisions("r");
    let allowed = decisions
        .iter()
        .find(|d| d["decision"]["kind"] == "allow")
        .expect("the check, durable before the call was forwarded");
    let reserved = allowed["decision"]["reserve_nanos"]
        .as_u64()
        .expect("reserved");
    let outcome = decisions
        .iter()
        .find(|d| d["decision"]["kind"] == "outcome");
    let dir = served.dir().to_owned();
    drop(served);
    let served = Served::start(&dir);
    let st = served.standing("r").await;
    let h = served.handoff("r");
    match outcome {
        Some(o) => {
            // Durable in time: whole and settled.
            assert_eq!(o["decision"]["settled_nanos"], FAKE_OK, "{o}");
            assert_eq!(
                (st["held_nanos"].as_u64(), st["settled_nanos"].as_u64()),
                (Some(0), Some(FAKE_OK)),
                "{st}"
            );
        }
        None => {
            // Lost: the reservation held, never a settlement the ledger lacks.
            assert_eq!(
                (st["held_nanos"].as_u64(), st["settled_nanos"].as_u64()),
                (Some(reserved), Some(0)),
                "{st}"
            );
            assert_eq!(h["spend"]["reserved_nanos"], reserved, "{h}");
        }
    }
}

/// SIGTERM right after a proxied answer: its outcome, still waiting to ride the next
/// commit group, is committed before `tally serve` says how large the ledger is, so the
/// size it says is what `tally verify` counts. (Whether the outcome is still waiting when
/// the signal lands is up to the machine's timing: the daemon's own test holds the
/// ledger's clock so that it always is.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_right_after_a_proxied_answer_says_the_size_verify_counts() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-ok", json!({})),
    )
    .await;
    assert_eq!((a.status, a.cut), (200, false), "{}", a.text());
    // Nothing decided after it: the daemon stopped at once.
    let stopped = served.daemon.stop().expect("it was running");
    assert!(stopped.success(), "{stopped:?}");
    let log = std::fs::read_to_string(served.dir().join("serve.log")).expect("serve.log");
    let said: u64 = log
        .split("ledger size ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the stop line says the size: {log}"));
    let report = tally().verifies(served.dir());
    assert_eq!(report["entries"], said, "{log}\n{report}");
    let outcomes = served
        .decisions("r")
        .into_iter()
        .filter(|d| d["decision"]["kind"] == "outcome")
        .count();
    assert_eq!(outcomes, 1, "the proxied outcome is in the ledger");
}
