//! Loops, consistency audit and handoffs, on the scenario corpus and on small
//! hand-written sequences. Expected reports are asserted field by field.

mod budgets;
mod grants;
mod loops;
mod refill;
mod reports;
mod scale;
mod scenarios;

use serde_json::{json, Value};
use tally_ledger::decision::args_digest;
use tally_ledger::{Action, Decision, Effect, Reason};
use tally_verify::analysis::*;
use tally_verify::{Event, Seq};

/// Wall time of seq 0; each later record is 10 ms later (one ledger batch).
const T0: u64 = 1_700_000_000_000;

/// The stories of `corpus/stories/`, in file-name order.
/// Nanodollars in a cent: the scenarios' records count cents, the reports nanodollars.
const CENT: u64 = 10_000_000;

fn scenarios() -> Vec<(String, Vec<Decision>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../corpus/stories");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|f| f.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "ndjson"))
        .collect();
    files.sort();
    assert!(files.len() >= 13, "stories missing from {}", dir.display());
    files
        .iter()
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(p).unwrap();
            let ds = text
                .lines()
                .enumerate()
                .map(|(i, l)| {
                    Decision::from_json(l)
                        .unwrap_or_else(|e| panic!("{}:{}: {e}", p.display(), i + 1))
                })
                .collect();
            (name, ds)
        })
        .collect()
}

fn wall(seq: u64) -> u64 {
    T0 + 10 * seq
}

fn at(run_ms: u64, seq: u64) -> When {
    When {
        run_ms,
        wall_ms: wall(seq),
    }
}

fn events(ds: &[Decision]) -> Vec<Event> {
    (0u64..)
        .zip(ds)
        .map(|(seq, d)| Event {
            seq: Seq::single(seq),
            wall_ms: wall(seq),
            epoch: 0,
            decision: Box::new(d.clone()),
        })
        .collect()
}

fn analyse(ds: &[Decision]) -> Report {
    Analysis::analyse(Config::default(), &events(ds))
}

fn scenario(name: &str) -> Vec<Decision> {
    scenarios()
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, ds)| ds)
        .unwrap_or_else(|| panic!("no scenario {name}"))
}

/// One decision from the agent's JSON, validated and sealed as the ledger would.
fn d(v: Value) -> Decision {
    let mut d = Decision::from_json(&v.to_string()).expect("valid decision JSON");
    d.validate().expect("valid decision");
    d.seal_args();
    d
}

fn digest(v: Value) -> Option<String> {
    Some(args_digest(&v))
}

fn s(x: &str) -> Option<String> {
    Some(x.to_owned())
}

fn finding(seq: u64, run: &str, kind: Inconsistency) -> AuditFinding {
    AuditFinding {
        seq: Seq::single(seq),
        run: run.to_owned(),
        kind,
    }
}

fn stopped(reason: Reason, seq: u64, when: When) -> StopReason {
    StopReason {
        status: StopStatus::Stopped,
        reason: Some(reason),
        action: Some(reason.action()),
        cause: None,
        seq: Some(Seq::single(seq)),
        at: Some(when),
    }
}

fn actions(h: &Handoff) -> Vec<(ResumeAction, Option<u64>)> {
    h.safe_resume
        .iter()
        .map(|s| (s.action, s.seq.map(|q| q.seq)))
        .collect()
}

fn unsafe_kinds(h: &Handoff) -> Vec<(UnsafeKind, u64)> {
    h.unsafe_actions
        .iter()
        .map(|u| (u.kind, u.seq.seq))
        .collect()
}

fn only_handoff(r: &Report) -> &Handoff {
    assert_eq!(r.handoffs.len(), 1, "one run expected");
    &r.handoffs[0]
}

/// A run with a budget of `attempts`, as its first record.
fn start(run: &str, budget: Value) -> Decision {
    d(json!({"run": run, "kind": "start", "at_ms": 0, "goal": "test", "budget": budget}))
}

/// A read of `args` (its logical operation is its tool and arguments: a read of another
/// file is another operation, as the gate counts retries).
fn read(run: &str, at_ms: u64, attempt: u64, args: Value) -> Decision {
    d(
        json!({"run": run, "kind": "allow", "at_ms": at_ms, "tool": "repo.read",
             "args": args, "effect": "read", "attempt": attempt}),
    )
}

fn ok(run: &str, at_ms: u64, attempt: u64) -> Decision {
    d(json!({"run": run, "kind": "outcome", "at_ms": at_ms, "attempt": attempt, "status": "ok"}))
}
