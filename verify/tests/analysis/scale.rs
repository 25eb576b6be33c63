//! Scale: a million decisions in seconds and in bounded memory (ignored; run in
//! release), and the regressions about counting and name tables.

use super::*;

/// Peak resident memory of this process, from `/proc/self/status` (Linux), in MiB.
fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// Feed `n` generated decisions to an analysis and time it; `make(i)` builds the i-th.
fn timed(config: Config, n: u64, make: impl Fn(u64) -> Decision) -> (Report, std::time::Duration) {
    let began = std::time::Instant::now();
    let mut a = Analysis::new(config);
    for seq in 0..n {
        a.push(&Event {
            seq: Seq::single(seq),
            wall_ms: T0 + seq,
            epoch: 0,
            decision: Box::new(make(seq)),
        });
    }
    let report = a.finish();
    (report, began.elapsed())
}

/// Distinct argument digests to draw from, so generating the ledger costs little.
fn digest_pool() -> Vec<String> {
    (0..1024u64)
        .map(|i| args_digest(&json!({"page": i})))
        .collect()
}

/// One million decisions: 10 000 runs of 100 records each (start, 49 reads at a call
/// every 2 s with their outcomes, stop), runs following each other. Run alone, in release:
/// `cargo test --release -p tally-verify -- --ignored --test-threads 1 --nocapture`.
#[test]
#[ignore = "timing: run in release"]
fn a_million_decisions_in_seconds() {
    let pool = digest_pool();
    let allow = read("r", 0, 1, json!({}));
    let done = ok("r", 0, 1);
    let (report, took) = timed(Config::default(), 1_000_000, |seq| {
        let (run, i) = (seq / 100, seq % 100);
        let mut d = match i {
            0 => start("r", json!({"attempts": 60})),
            99 => d(json!({"run": "r", "kind": "stop", "at_ms": 99_000, "reason": "completed"})),
            i if i % 2 == 1 => {
                let mut a = allow.clone();
                a.args_digest = Some(pool[(i as usize) % pool.len()].clone());
                a.attempt = Some(i / 2 + 1);
                a.at_ms = Some(i / 2 * 2000);
                a
            }
            i => {
                let mut o = done.clone();
                o.attempt = Some(i / 2);
                o.at_ms = Some((i / 2 - 1) * 2000 + 5);
                o.settled_cents = Some(1);
                o
            }
        };
        d.run = format!("run-{run}");
        d
    });
    eprintln!(
        "10 000 runs, 1 000 000 decisions: {took:?}, peak RSS {:?} MiB",
        peak_rss_mib()
    );
    assert_eq!(report.handoffs.len(), 10_000);
    assert_eq!(report.handoffs[9_999].attempts.used, 49);
    assert_eq!(report.loops, vec![]);
    assert_eq!(report.findings, vec![]);
    assert!(took.as_secs() < 10, "took {took:?}");
}

/// One run of a million decisions: a start, then 500 000 reads, one a second, and
/// their outcomes.
/// Its loop windows are swept as they fall silent, so its memory stays flat.
#[test]
#[ignore = "timing: run in release"]
fn one_run_of_a_million_decisions_in_bounded_memory() {
    let pool = digest_pool();
    let allow = read("long", 0, 1, json!({}));
    let done = ok("long", 0, 1);
    let mut policy = tally_policy::Policy::default();
    policy.loops.tool_calls = 100;
    let config = Config {
        policy: std::sync::Arc::new(policy),
        ..Config::default()
    };
    let (report, took) = timed(config, 1_000_000, |seq| {
        if seq == 0 {
            return start("long", json!({"attempts": 1_000_000}));
        }
        let call = (seq - 1) / 2;
        if seq % 2 == 1 {
            let mut a = allow.clone();
            a.args_digest = Some(pool[(call as usize) % pool.len()].clone());
            a.attempt = Some(call + 1);
            a.at_ms = Some(call * 1000);
            a
        } else {
            let mut o = done.clone();
            o.attempt = Some(call + 1);
            o.at_ms = Some(call * 1000 + 5);
            o
        }
    });
    eprintln!(
        "one run, 1 000 000 decisions: {took:?}, peak RSS {:?} MiB",
        peak_rss_mib()
    );
    assert_eq!(report.loops, vec![]);
    assert_eq!(report.findings, vec![]);
    assert_eq!(report.handoffs[0].attempts.used, 500_000);
    assert!(took.as_secs() < 10, "took {took:?}");
}

/// A `timeout` outcome, then a late `ok` settling the same reservation, was
/// counted twice, so an honest run was reported over budget. One model (the policy
/// core) counts it once; a refund without `slots` returns one attempt.
#[test]
fn regression_issue_10_a_late_outcome_settles_once_and_refunds_return_one_slot() {
    let ds = vec![
        d(
            json!({"run": "r", "kind": "start", "at_ms": 0, "budget": {"attempts": 2, "spend_cents": 50}}),
        ),
        d(
            json!({"run": "r", "kind": "allow", "at_ms": 1, "tool": "llm", "operation": "a", "attempt": 1, "reserve_cents": 50}),
        ),
        d(json!({"run": "r", "kind": "outcome", "at_ms": 2, "attempt": 1, "status": "timeout"})),
        d(
            json!({"run": "r", "kind": "outcome", "at_ms": 3, "attempt": 1, "status": "ok", "settled_cents": 50}),
        ),
        d(
            json!({"run": "r", "kind": "allow", "at_ms": 4, "tool": "db", "operation": "b", "attempt": 2}),
        ),
        d(json!({"run": "r", "kind": "refund", "at_ms": 5, "of": 2})),
        d(
            json!({"run": "r", "kind": "allow", "at_ms": 6, "tool": "db", "operation": "c", "attempt": 3}),
        ),
        d(json!({"run": "r", "kind": "stop", "at_ms": 7, "reason": "completed"})),
    ];
    let r = analyse(&ds);
    assert_eq!(r.findings, vec![], "an honest run has no finding");
    let h = only_handoff(&r);
    assert_eq!((h.attempts.used, h.attempts.refunded), (2, 1));
    assert_eq!(
        (h.spend.reserved_nanos, h.spend.settled_nanos),
        (0, 50 * CENT)
    );
}

/// Open attempts and loop windows share their tool, operation and worker names, in a
/// bounded table that starts afresh when full: a run with more distinct names than it
/// holds, and a loop at its end, is reported as before (names, workers in order, count).
#[test]
fn a_run_with_very_many_names_and_a_loop_at_the_end() {
    let mut ds = vec![start("r", json!({}))];
    let mut attempt = 0;
    for i in 0..5_000u64 {
        attempt += 1;
        ds.push(d(json!({"run": "r", "kind": "allow", "at_ms": i * 1_000,
            "tool": "repo.read", "operation": format!("op-{i}"), "worker": format!("w{:02}", i % 20),
            "args": {"page": i}, "effect": "read", "attempt": attempt})));
        ds.push(ok("r", i * 1_000 + 5, attempt));
    }
    let t = 5_000 * 1_000;
    for (k, worker) in ["w-z", "w-a", "w-m", "w-a"].into_iter().enumerate() {
        attempt += 1;
        ds.push(d(
            json!({"run": "r", "kind": "allow", "at_ms": t + k as u64 * 1_000,
            "tool": "repo.read", "operation": format!("final-{k}"), "worker": worker,
            "args": {"page": "again"}, "effect": "read", "attempt": attempt}),
        ));
    }
    let r = analyse(&ds);
    assert_eq!(r.loops.len(), 1, "{:?}", r.loops);
    let l = &r.loops[0];
    assert_eq!(l.pattern, Pattern::ExactRepetition);
    assert_eq!(
        l.workers,
        vec!["w-a".to_owned(), "w-m".into(), "w-z".into()]
    );
    assert_eq!(l.tool, s("repo.read"));
    assert_eq!(l.operation, s("final-3"));
    assert_eq!(l.args_digest, digest(json!({"page": "again"})));
    assert_eq!(l.count, 4);
    assert_eq!((l.first_seq.seq, l.last_seq.seq), (10_001, 10_004));
    assert_eq!(l.ended_by, LoopEnd::NeverStopped);
    let h = only_handoff(&r);
    let first: Vec<String> = (0..16).map(|i| format!("w{i:02}")).collect();
    assert_eq!(h.workers, first, "the first 16 workers, in order");
    assert_eq!(
        h.completed_total, 5_000,
        "every read that ended ok completed"
    );
    assert_eq!(h.completed.len(), 50, "the latest 50 are listed");
    assert_eq!(h.attempts.used, 5_004);
    assert_eq!(h.loops, 1);
}
