//! The one commit path: the first decision under a policy carries the policy's record
//! just before it, and every answer carries the receipt of its own record.

use std::sync::Arc;

use tally_gate::{Caller, Gate, StartRequest};
use tally_ledger::keys::AuditorKey;
use tally_ledger::{Ledger, Rotation};
use tally_policy::Recorded;

const ALICE: Caller = Caller {
    uid: Some(1000),
    operator: false,
    proxied: false,
};

fn start(gate: &Gate, run: &str) -> u64 {
    gate.start_blocking(
        ALICE,
        StartRequest {
            run: run.into(),
            ..StartRequest::default()
        },
    )
    .expect("start")
    .seq
}

#[test]
fn the_policy_record_goes_once_before_the_first_decision_made_under_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("l");
    Ledger::init(&path, &AuditorKey::generate().public(), Rotation::default()).expect("init");
    let ledger = Arc::new(Ledger::open(&path).expect("open"));
    let first = Recorded::new("").expect("policy");
    let gate = Gate::open(Arc::clone(&ledger), first.clone()).expect("gate");

    // The first commit: the policy's record, then the start, which answers with its own.
    let before = ledger.checkpoint().size;
    assert_eq!(start(&gate, "a"), before + 1);
    assert_eq!(ledger.checkpoint().size, before + 2);
    // Later commits carry no policy record.
    assert_eq!(start(&gate, "b"), before + 2);
    assert_eq!(ledger.checkpoint().size, before + 3);

    // Reopened under the same policy: it is already the last recorded one.
    drop(gate);
    let gate = Gate::open(Arc::clone(&ledger), first).expect("reopen");
    assert_eq!(start(&gate, "c"), before + 3);

    // Under another policy: recorded once more, before the first decision under it.
    drop(gate);
    let other = Recorded::new("max_open_runs_per_uid = 9\n").expect("policy");
    let gate = Gate::open(Arc::clone(&ledger), other).expect("another policy");
    assert_eq!(start(&gate, "d"), before + 5);
    assert_eq!(ledger.checkpoint().size, before + 6);
}

/// The proxy's own caller.
const PROXY: Caller = Caller {
    uid: Some(1000),
    operator: false,
    proxied: true,
};

/// A gate over a fresh ledger in `dir` whose writer runs `at_append` after each group's
/// log append (on its commit thread): what the tests hold it with, or fail it with.
fn held_gate(dir: &std::path::Path, at_append: impl Fn() + Send + Sync + 'static) -> Gate {
    let path = dir.join("l");
    Ledger::init(&path, &AuditorKey::generate().public(), Rotation::default()).expect("init");
    tally_ledger::faults::on_group_appended(&path, at_append);
    let ledger = Arc::new(Ledger::open(&path).expect("open"));
    let policy = Recorded::new("[ceiling]\nspend_cents = 100\n").expect("policy");
    Gate::open(ledger, policy).expect("gate")
}

/// Run `run` started and one proxied call of it allowed, reserving 10 cents: its attempt.
fn allowed(gate: &Gate, run: &str) -> u64 {
    start(gate, run);
    let req = serde_json::from_value(serde_json::json!({
        "run": run, "tool": "model", "effect": "non_idempotent_write", "reserve_cents": 10,
    }))
    .expect("check");
    let answer = gate.check_blocking(PROXY, req).expect("check");
    answer.attempt.expect("an allowed call's attempt")
}

fn settled(run: &str, attempt: u64, nanos: u64) -> tally_gate::OutcomeRequest {
    serde_json::from_value(serde_json::json!({
        "run": run, "attempt": attempt, "status": "ok", "settled_nanos": nanos,
    }))
    .expect("outcome")
}

type Answers<T> = std::sync::mpsc::Receiver<Result<T, tally_gate::GateError>>;

/// A proxied outcome asked sequenced: where its two answers arrive.
fn sequenced(
    gate: &Gate,
    req: tally_gate::OutcomeRequest,
) -> (Answers<()>, Answers<tally_gate::Logged>) {
    let (seq_tx, seq_rx) = std::sync::mpsc::channel();
    let (dur_tx, dur_rx) = std::sync::mpsc::channel();
    gate.outcome_sequenced(
        PROXY,
        req,
        Box::new(move |r| {
            let _ = seq_tx.send(r);
        }),
        Box::new(move |r| {
            let _ = dur_tx.send(r);
        }),
    );
    (seq_rx, dur_rx)
}

const WAIT: std::time::Duration = std::time::Duration::from_secs(10);

#[test]
fn a_sequenced_outcome_is_answered_once_queued_and_seen_before_it_is_durable() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().expect("tempdir");
    // While `hold` is set, the writer waits after each append: nothing more is durable.
    let hold = Arc::new(AtomicBool::new(false));
    let held = Arc::clone(&hold);
    let gate = held_gate(dir.path(), move || {
        while held.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    });
    let attempt = allowed(&gate, "r");
    hold.store(true, Ordering::SeqCst);
    let (seq, durable) = sequenced(&gate, settled("r", attempt, 40_000_000));
    // Answered while its record cannot be durable yet.
    seq.recv_timeout(WAIT).expect("sequenced").expect("queued");
    assert!(
        durable.try_recv().is_err(),
        "not durable while the writer is held"
    );
    // Every later operation decides on state that includes it.
    let s = gate.run(ALICE, "r").expect("standing");
    assert_eq!((s.held_nanos, s.settled_nanos), (0, 40_000_000));
    // Durable once the writer goes on, with its own receipt, before any later decision.
    let before = ledger_size(&gate);
    hold.store(false, Ordering::SeqCst);
    let logged = durable
        .recv_timeout(WAIT)
        .expect("durable")
        .expect("recorded");
    assert_eq!(logged.seq, before);
    // And the gate goes on deciding.
    allowed(&gate, "s");
    assert!(gate.failure().is_none());
}

fn ledger_size(gate: &Gate) -> u64 {
    gate.ledger().checkpoint().size
}

#[test]
fn a_sequenced_outcome_the_ledger_cannot_record_fails_the_gate_closed() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().expect("tempdir");
    let broken = Arc::new(AtomicBool::new(false));
    let breaks = Arc::clone(&broken);
    let gate = held_gate(dir.path(), move || {
        // The writer dies at the append: the ledger refuses the group, and all after it.
        assert!(!breaks.load(Ordering::SeqCst), "the disk fails");
    });
    let attempt = allowed(&gate, "r");
    broken.store(true, Ordering::SeqCst);
    let (seq, durable) = sequenced(&gate, settled("r", attempt, 40_000_000));
    seq.recv_timeout(WAIT).expect("sequenced").expect("queued");
    let failed = durable.recv_timeout(WAIT).expect("answered");
    assert!(
        matches!(failed, Err(tally_gate::GateError::Unavailable(_))),
        "{failed:?}"
    );
    // The gate refuses everything from now on.
    assert!(gate.failure().is_some());
    let req = serde_json::from_value(serde_json::json!({
        "run": "r", "tool": "model", "effect": "read",
    }))
    .expect("check");
    assert!(matches!(
        gate.check_blocking(PROXY, req),
        Err(tally_gate::GateError::Unavailable(_))
    ));
}

#[test]
fn only_the_proxy_has_an_outcome_answered_before_it_is_durable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gate = held_gate(dir.path(), || {});
    let attempt = allowed(&gate, "r");
    let (tx, rx) = std::sync::mpsc::channel();
    gate.outcome_sequenced(
        ALICE,
        settled("r", attempt, 1),
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
        Box::new(|_| panic!("nothing to make durable")),
    );
    let refused = rx.recv_timeout(WAIT).expect("answered");
    assert!(
        matches!(refused, Err(tally_gate::GateError::NotAuthorized(_))),
        "{refused:?}"
    );
    assert_eq!(gate.run(ALICE, "r").expect("standing").settled_nanos, 0);
}

/// Real time in which an outcome whose linger is not up on the ledger's held clock must
/// not become durable: many times `LINGER_MS`.
const QUIET: std::time::Duration = std::time::Duration::from_millis(200);

/// A gate over a fresh ledger in `dir` whose clock the test holds: the ledger's clock,
/// and the ledger's path.
fn clocked_gate(
    dir: &std::path::Path,
) -> (
    Gate,
    Arc<tally_ledger::clock::ManualClock>,
    std::path::PathBuf,
) {
    use tally_ledger::clock::{Clock, ManualClock};
    let path = dir.join("l");
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let auditor = AuditorKey::generate();
    Ledger::init_with_clock(
        &path,
        &auditor.public(),
        Rotation::default(),
        clock.as_ref(),
    )
    .expect("init");
    let ledger = Ledger::open_with_clock(&path, Arc::clone(&clock) as Arc<dyn Clock>);
    let policy = Recorded::new("[ceiling]\nspend_cents = 100\n").expect("policy");
    let gate = Gate::open(Arc::new(ledger.expect("open")), policy).expect("gate");
    (gate, clock, path)
}

#[test]
fn a_sequenced_outcome_starts_no_fsync_and_is_durable_with_the_next_decision_before_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (gate, _clock, path) = clocked_gate(dir.path());
    let attempt = allowed(&gate, "r");
    let on_disk = Ledger::read_checkpoint(&path).expect("checkpoint").size;
    let (seq, durable) = sequenced(&gate, settled("r", attempt, 40_000_000));
    seq.recv_timeout(WAIT).expect("sequenced").expect("queued");
    // Applied: every later operation sees it. Not written, not durable: its linger is
    // not up and nothing else was decided (a kill now loses this record, and only it).
    let s = gate.run(ALICE, "r").expect("standing");
    assert_eq!((s.held_nanos, s.settled_nanos), (0, 40_000_000));
    assert!(durable.recv_timeout(QUIET).is_err(), "not durable alone");
    assert_eq!(Ledger::read_checkpoint(&path).expect("read").size, on_disk);
    // The next decision's commit carries it, just before that decision.
    let req = serde_json::from_value(serde_json::json!({
        "run": "r", "tool": "model", "effect": "read", "reserve_cents": 1,
    }))
    .expect("check");
    let later = gate.check_blocking(PROXY, req).expect("check");
    let later = later.seq.expect("an acknowledged decision's seq");
    let logged = durable
        .recv_timeout(WAIT)
        .expect("durable")
        .expect("recorded");
    assert_eq!(logged.seq + 1, later);
    assert_eq!(
        Ledger::read_checkpoint(&path).expect("read").size,
        later + 1
    );
}

#[test]
fn a_sequenced_outcome_alone_is_durable_once_its_linger_is_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (gate, clock, path) = clocked_gate(dir.path());
    let attempt = allowed(&gate, "r");
    let (seq, durable) = sequenced(&gate, settled("r", attempt, 40_000_000));
    seq.recv_timeout(WAIT).expect("sequenced").expect("queued");
    assert!(durable.recv_timeout(QUIET).is_err(), "not durable alone");
    clock.advance(tally_ledger::LINGER_MS);
    let logged = durable
        .recv_timeout(WAIT)
        .expect("durable")
        .expect("recorded");
    assert_eq!(
        Ledger::read_checkpoint(&path).expect("read").size,
        logged.seq + 1
    );
}
