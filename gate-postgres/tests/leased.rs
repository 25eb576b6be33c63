//! The leased mode on a real PostgreSQL (docs/FLEET.md, "The leased mode"): gates whose
//! runs are decided at home on one holder, inside its slice of the run's scope. Two
//! holders racing one run's last cents and attempts never pass its budget; a pause,
//! resume or stop through another gate takes the run's home back and holds at the
//! home's next call; a holder that dies leaves the run to another once its slice is
//! reclaimed, with nothing it answered lost; an outcome below its reservation gives the
//! difference back on the slice that took it. Lease time is on a manual clock and
//! ticks are given their time: nothing sleeps.

mod common;

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::lease::{amounts, at_noon, MARGIN, TTL};
use common::Cluster;
use serde_json::json;
use tally_gate::{Caller, CheckAnswer, Gate, GateError, StopRequest};
use tally_gate_postgres::{LeaseClock, Leased, Scope, ScopeKind, Slices, ViewLimits};
use tally_ledger::Reason;
use tally_policy::{Recorded, Verdict};

const OPERATOR: Caller = Caller {
    uid: None,
    operator: true,
    proxied: false,
};

/// A leased gate named `holder` over its own ledger in `dir`, leases on `clock`.
fn leased(cluster: &Cluster, dir: &std::path::Path, holder: &str, clock: &LeaseClock) -> Host {
    leased_under(cluster, dir, holder, clock, "[approvals]\nask_on = []\n")
}

/// Two gates on the cluster, `host-a` and `host-b`, each with its own ledger directory
/// (kept alive beside it).
fn two_hosts(cluster: &Cluster, clock: &LeaseClock) -> [(tempfile::TempDir, Host); 2] {
    ["host-a", "host-b"].map(|holder| {
        let dir = tempfile::tempdir().expect("dir");
        let host = leased(cluster, dir.path(), holder, clock);
        (dir, host)
    })
}

/// [`leased`] under `policy`.
fn leased_under(
    cluster: &Cluster,
    dir: &std::path::Path,
    holder: &str,
    clock: &LeaseClock,
    policy: &str,
) -> Host {
    let ledger = common::ledger(dir);
    let backend = common::lease::backend(cluster, &ledger, holder, clock, ViewLimits::default());
    let slices = Arc::clone(backend.slices());
    let policy = Recorded::new(policy).expect("policy");
    let gate = Gate::with_backend(ledger, backend, policy).expect("gate");
    Host { gate, slices }
}

/// A leased gate and its holder's slices.
struct Host {
    gate: Gate<Leased>,
    slices: Arc<Slices>,
}

impl std::ops::Deref for Host {
    type Target = Gate<Leased>;
    fn deref(&self) -> &Gate<Leased> {
        &self.gate
    }
}

fn slices(host: &Host) -> Arc<Slices> {
    Arc::clone(&host.slices)
}

fn start(gate: &Gate<Leased>, req: serde_json::Value) {
    gate.start_blocking(OPERATOR, serde_json::from_value(req).expect("start"))
        .expect("start");
}

/// A check of a call not made before (each a new operation: no loop breaker trips).
fn check(gate: &Gate<Leased>, run: &str, reserve_cents: u64) -> Result<CheckAnswer, GateError> {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let req = json!({"run": run, "tool": "llm", "operation": format!("q{n}"), "effect": "read", "reserve_cents": reserve_cents});
    gate.check_blocking(OPERATOR, serde_json::from_value(req).expect("check"))
}

fn outcome(gate: &Gate<Leased>, run: &str, attempt: u64, cents: u64) -> Result<(), GateError> {
    let req = json!({"run": run, "attempt": attempt, "status": "ok", "settled_cents": cents});
    gate.outcome_blocking(OPERATOR, serde_json::from_value(req).expect("outcome"))
        .map(drop)
}

/// A check retried while it is refused as unavailable (the run at home elsewhere, or
/// its home just taken back), at most `tries` times.
fn check_retried(
    gate: &Gate<Leased>,
    run: &str,
    cents: u64,
    tries: usize,
) -> Result<CheckAnswer, GateError> {
    let mut last = check(gate, run, cents);
    for _ in 1..tries {
        match last {
            Err(GateError::Unavailable(_)) => last = check(gate, run, cents),
            _ => break,
        }
    }
    last
}

fn verdict(r: &Result<CheckAnswer, GateError>) -> String {
    match r {
        Ok(a) => match a.reason {
            None => format!("{:?}", a.decision),
            Some(reason) => format!("{:?} {reason:?}", a.decision),
        },
        Err(GateError::Stopped(a)) => format!("stopped {:?}", a.reason),
        Err(GateError::Unavailable(_)) => "unavailable".into(),
        Err(e) => format!("error {e}"),
    }
}

/// How long a retry loop may go on before the test fails (a hang is a failure).
const PATIENCE: Duration = Duration::from_secs(120);

/// Fails the test once `deadline` passed, saying what was retried.
fn within(deadline: Instant, what: &str) {
    assert!(
        Instant::now() < deadline,
        "{what}: still refused as unavailable after {PATIENCE:?}"
    );
}

/// Whether a refusal says its decision may have been recorded (its `COMMIT` unanswered,
/// as a slow one past the client's bound on a loaded machine is).
fn maybe_recorded(e: &GateError) -> bool {
    matches!(e, GateError::Unavailable(why) if why.contains("may have been recorded"))
}

/// 8 workers per gate check (reserving 30 cents) and settle 30 cents until refused; the
/// holders tick at a time far ahead whenever no worker ended for a while, so a home
/// idle elsewhere is given back. The allows per gate, and the checks refused as maybe
/// recorded (an allow nobody heard of, or a use counted on the conservative side).
fn race(gates: &[Arc<Host>], run: &str) -> (Vec<u64>, u64) {
    let deadline = Instant::now() + PATIENCE;
    let (ended, ends) = mpsc::channel();
    for (g, gate) in gates.iter().enumerate() {
        for _ in 0..8 {
            let (gate, ended, run) = (Arc::clone(gate), ended.clone(), run.to_owned());
            std::thread::spawn(move || {
                let (mut allowed, mut maybe) = (0, 0);
                loop {
                    match check(&gate, &run, 30) {
                        Ok(a) if a.decision == Verdict::Allow => {
                            allowed += 1;
                            let attempt = a.attempt.expect("attempt");
                            // An outcome retried after an unanswered COMMIT may find its
                            // attempt settled by that try: the same outcome, recorded.
                            let mut unsure = false;
                            while let Err(e) = outcome(&gate, &run, attempt, 30) {
                                if unsure && matches!(e, GateError::AttemptSettled { .. }) {
                                    break;
                                }
                                assert!(matches!(e, GateError::Unavailable(_)), "{e}");
                                unsure |= maybe_recorded(&e);
                                within(deadline, "an outcome");
                            }
                        }
                        Err(e) if maybe_recorded(&e) => {
                            maybe += 1;
                            within(deadline, "a check");
                        }
                        Err(GateError::Unavailable(_)) => within(deadline, "a check"),
                        Ok(a) => {
                            assert_eq!(a.reason, Some(Reason::ReservationInsufficient));
                            break;
                        }
                        Err(GateError::Stopped(_)) => break,
                        Err(e) => panic!("{e}"),
                    }
                }
                let _ = ended.send((g, allowed, maybe));
            });
        }
    }
    drop(ended);
    let far = Instant::now() + Duration::from_secs(3600);
    let (mut allows, mut maybe) = (vec![0; gates.len()], 0);
    let mut left = gates.len() * 8;
    while left > 0 {
        within(deadline, "the race");
        match ends.recv_timeout(Duration::from_millis(200)) {
            Ok((g, n, m)) => {
                allows[g] += n;
                maybe += m;
                left -= 1;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                for gate in gates {
                    slices(gate).tick(far);
                }
            }
            Err(e) => panic!("{e}"),
        }
    }
    (allows, maybe)
}

#[test]
fn two_holders_racing_one_runs_last_cents_never_pass_its_budget() {
    race_for_the_last_cents("[approvals]\nask_on = []\n");
}

/// The race above with the tool's breaker read from each holder's view (no tool rate
/// bucket, no limit on calls in flight: the tool's row is not locked by a decision at
/// home; the races' ticks flush and refresh the views meanwhile).
#[test]
fn two_holders_racing_one_runs_last_cents_with_breakers_from_a_view() {
    race_for_the_last_cents(
        "[rate]\ntool_per_sec = 0\ntool_in_flight = 0\n[approvals]\nask_on = []\n",
    );
}

/// Two holders x 8 workers race for a run's 1,000 cents at 30 a call under `policy`:
/// exactly 33 allowed, the scope settles exactly that, and a third holder gets nothing.
fn race_for_the_last_cents(policy: &str) {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    let gates: Vec<Arc<Host>> = ["host-a", "host-b"]
        .iter()
        .zip(&dirs)
        .map(|(h, d)| Arc::new(leased_under(&cluster, d.path(), h, &clock, policy)))
        .collect();
    // 1,000 cents at 30 a call: 33 calls; 40 attempts: the cents run out first.
    start(
        &gates[0],
        json!({"run": "r", "budget": {"attempts": 40, "spend_cents": 1000}}),
    );
    // Exactly 33 uses of 30 cents: each an allow heard of, or a check refused as maybe
    // recorded (an allow not heard of, or its use counted on the conservative side).
    let (allows, maybe) = race(&gates, "r");
    let heard = allows.iter().sum::<u64>();
    assert!(
        heard <= 33 && heard + maybe >= 33,
        "allows per holder: {allows:?}, {maybe} maybe recorded"
    );
    for gate in &gates {
        slices(gate).close();
    }
    let scope = Scope::new(ScopeKind::Run, "r");
    let [settled_a, settled_n, leased_a, leased_n] = amounts(
        &cluster,
        &scope,
        [
            "settled_attempts",
            "settled_nanos",
            "leased_attempts",
            "leased_nanos",
        ],
    );
    assert_eq!([leased_a, leased_n], [0, 0], "every slice given back");
    assert_eq!(settled_a, 33, "the scope settled what was allowed");
    assert_eq!(settled_n, 990 * 10_000_000, "30 cents each, in nanodollars");
    // A third gate, on the run's row: the budget's last 10 cents, nothing more.
    let dir = tempfile::tempdir().expect("dir");
    let late = leased_under(&cluster, dir.path(), "host-c", &clock, policy);
    assert_eq!(
        verdict(&check_retried(&late, "r", 30, 50)),
        "Deny ReservationInsufficient"
    );
}

/// The decisions `host`'s lease guards refused because their run was taken back.
fn guard_taken_back(host: &Host) -> u64 {
    use tally_gate::backend::StateBackend;
    host.backend()
        .lease_counts()
        .and_then(|c| c.into_iter().find(|(n, _)| *n == "guard_taken_back"))
        .map_or(0, |(_, v)| v)
}

#[test]
fn a_pause_through_another_gate_holds_the_run_at_its_homes_next_call() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let [(_da, a), (_db, b)] = two_hosts(&cluster, &clock);
    start(&a, json!({"run": "p", "budget": {"attempts": 20}}));
    let home = verdict(&check(&a, "p", 0));
    let elsewhere = verdict(&check(&b, "p", 0));
    b.pause_blocking(OPERATOR, "p", true)
        .expect("pause through b");
    let first = verdict(&check(&a, "p", 0));
    // The home's refusal by its run's guard is counted (`/metrics`' lease events).
    assert_eq!(guard_taken_back(&a), 1);
    let then = verdict(&check(&a, "p", 0));
    b.pause_blocking(OPERATOR, "p", false)
        .expect("resume through b");
    let resumed = verdict(&check_retried(&a, "p", 0, 3));
    b.stop_blocking(OPERATOR, "p", StopRequest::default())
        .expect("kill through b");
    let killed = verdict(&check_retried(&a, "p", 0, 3));
    assert_eq!(
        format!("home {home}; elsewhere {elsewhere}; paused: {first}, then {then}; resumed {resumed}; killed {killed}"),
        "home Allow; elsewhere unavailable; paused: unavailable, then Deny RunPaused; resumed Allow; killed stopped Some(KilledByOperator)"
    );
}

#[test]
fn a_dead_holders_run_goes_on_elsewhere_once_its_slice_is_reclaimed() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = at_noon();
    let [(_da, a), (_db, b)] = two_hosts(&cluster, &clock);
    start(&a, json!({"run": "d", "budget": {"attempts": 20}}));
    let mut last = 0;
    for _ in 0..5 {
        last = check(&a, "d", 0)
            .expect("allowed at home")
            .attempt
            .expect("attempt");
    }
    // Host a dies holding the run's slice: nothing given back.
    drop(a);
    let now = Instant::now();
    assert_eq!(
        verdict(&check(&b, "d", 0)),
        "unavailable",
        "its slice is still out"
    );
    clock.advance(TTL);
    assert_eq!(
        slices(&b).tick(now).reclaimed,
        0,
        "not before expiry plus the margin"
    );
    assert_eq!(verdict(&check(&b, "d", 0)), "unavailable");
    clock.advance(MARGIN + Duration::from_secs(1));
    assert_eq!(slices(&b).tick(now).reclaimed, 1, "reclaimed once");
    assert_eq!(slices(&b).tick(now).reclaimed, 0, "and only once");
    let next = check(&b, "d", 0).expect("decided on b");
    assert_eq!(next.decision, Verdict::Allow);
    assert_eq!(
        next.attempt,
        Some(last + 1),
        "the row was never behind what a answered"
    );
}

#[test]
fn an_outcome_below_its_reservation_gives_back_on_the_slice_that_took_it() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let dir = tempfile::tempdir().expect("dir");
    let a = leased(&cluster, dir.path(), "host-a", &clock);
    start(&a, json!({"run": "o", "budget": {"spend_cents": 1000}}));
    let scope = Scope::new(ScopeKind::Run, "o");
    let attempt = check(&a, "o", 30).expect("allow").attempt.expect("attempt");
    let (_, used) = slices(&a).held(&scope).expect("a slice");
    assert_eq!(
        used.nanos,
        30 * 10_000_000,
        "the reservation counted in the slice"
    );
    outcome(&a, "o", attempt, 10).expect("outcome");
    let (_, used) = slices(&a).held(&scope).expect("a slice");
    assert_eq!(used.nanos, 10 * 10_000_000, "20 cents given back on it");
    // Settled above a reservation: the overrun is billed to the scope centrally.
    let attempt = check(&a, "o", 10).expect("allow").attempt.expect("attempt");
    outcome(&a, "o", attempt, 25).expect("outcome above its reservation");
    slices(&a).close();
    let [settled] = amounts(&cluster, &scope, ["settled_nanos"]);
    assert_eq!(settled, 35 * 10_000_000, "10 + 25 cents settled");
}

/// A run whose scope has no room left (its row still shows room) is refused as
/// unavailable until twice the group commit's drain bound and one database bound (5 x
/// the 2 s bound) passed on the clock the lease ticks are run with, from the first tick
/// after it was found so; then with the budget's reason. With no use refused for twice
/// the grace it is forgotten: a later refusal is a retry first, not the budget's at once.
#[test]
fn a_scope_with_no_room_is_refused_typed_only_after_the_grace_on_the_ticks_clock() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let dir = tempfile::tempdir().expect("dir");
    let a = out_of_room(&cluster, dir.path(), &clock);
    let grace = tally_gate_postgres::DEFAULT_TIMEOUT * 5;
    let t0 = Instant::now();
    assert_eq!(said_to(&a), "unavailable", "no tick since it was found so");
    slices(&a).tick(t0);
    assert_eq!(said_to(&a), "unavailable", "the grace starts");
    slices(&a).tick(t0 + grace - Duration::from_millis(1));
    assert_eq!(said_to(&a), "unavailable", "many ticks, not yet the grace");
    slices(&a).tick(t0 + grace);
    assert_eq!(said_to(&a), "refused BudgetExceeded");
    assert_eq!(said_to(&a), "refused BudgetExceeded", "every time");
    // No use refused for twice the grace: forgotten; found so again, a retry first.
    slices(&a).tick(t0 + grace * 2);
    slices(&a).tick(t0 + grace * 4 - Duration::from_millis(1));
    assert_eq!(said_to(&a), "refused BudgetExceeded", "not forgotten yet");
    slices(&a).tick(t0 + grace * 4);
    slices(&a).tick(t0 + grace * 6);
    assert_eq!(said_to(&a), "unavailable", "started again");
    slices(&a).tick(t0 + grace * 7);
    assert_eq!(said_to(&a), "unavailable");
}

/// A client that retries slowly (many ticks between its tries, as long as the grace the
/// `503` names) keeps its window: once the grace passed since the first refusal, it is
/// refused with the budget's reason, not `503` forever.
#[test]
fn a_slow_retry_keeps_its_grace_window_and_reaches_the_typed_refusal() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let dir = tempfile::tempdir().expect("dir");
    let a = out_of_room(&cluster, dir.path(), &clock);
    let grace = tally_gate_postgres::DEFAULT_TIMEOUT * 5;
    let tick = grace / 5;
    let t0 = Instant::now();
    assert_eq!(said_to(&a), "unavailable", "first refusal");
    // Ticks every `tick`; the client tries again only after a whole grace of them.
    for k in 0..=4 {
        slices(&a).tick(t0 + tick * k);
    }
    assert_eq!(
        said_to(&a),
        "unavailable",
        "four ticks later, the grace not passed yet"
    );
    for k in 5..=8 {
        slices(&a).tick(t0 + tick * k);
    }
    assert_eq!(
        said_to(&a),
        "refused BudgetExceeded",
        "the grace passed since the first refusal"
    );
}

/// Host `host-a` with run `x` started (3 attempts) and its scope's attempts all settled
/// behind its back: the run's row still shows room, its scope has none.
fn out_of_room(cluster: &Cluster, dir: &std::path::Path, clock: &LeaseClock) -> Host {
    let a = leased(cluster, dir, "host-a", clock);
    start(&a, json!({"run": "x", "budget": {"attempts": 3}}));
    cluster.psql(
        "UPDATE tally_lease_scopes SET settled_attempts = cap_attempts WHERE kind = 'run' AND key = 'x'",
    );
    a
}

/// What a check of run `x` is answered: its verdict, or the budget's typed refusal.
fn said_to(a: &Host) -> String {
    match check(a, "x", 0) {
        Err(GateError::Refused(reason)) => format!("refused {reason:?}"),
        r => verdict(&r),
    }
}

/// The approver whose grants these tests sign.
fn dana() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[11u8; 32])
}

/// A policy where `dana` may approve.
fn approving() -> String {
    let key: String = dana()
        .verifying_key()
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("[approvals.approvers]\ndana = \"{key}\"\n")
}

/// `dana`'s grant of `attempts` more attempts to `run`, valid for an hour of run time.
fn grant(run: &str, attempts: u64) -> tally_gate::Approval {
    let scope = tally_ledger::decision::Scope {
        attempts: Some(attempts),
        ..Default::default()
    };
    let expires_ms = 3_600_000;
    let digest = tally_policy::approval::digest(run, "dana", &scope, expires_ms);
    let signature = tally_policy::approval::sign(&dana(), &digest);
    tally_gate::Approval {
        run: run.into(),
        approver: "dana".into(),
        scope,
        expires_ms,
        digest,
        signature,
        note: None,
        request: None,
    }
}

#[test]
fn an_approvals_grant_raises_the_runs_scope_so_the_granted_attempt_is_allowed() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let dir = tempfile::tempdir().expect("dir");
    let a = leased_under(&cluster, dir.path(), "host-a", &clock, &approving());
    start(&a, json!({"run": "g", "budget": {"attempts": 2}}));
    let first = [verdict(&check(&a, "g", 0)), verdict(&check(&a, "g", 0))];
    let spent = verdict(&check(&a, "g", 0));
    a.approve_blocking(OPERATOR, grant("g", 1))
        .expect("the grant is recorded");
    let granted = verdict(&check(&a, "g", 0));
    let after = verdict(&check(&a, "g", 0));
    assert_eq!(
        format!("{first:?}; spent {spent}; granted {granted}; then {after}"),
        "[\"Allow\", \"Allow\"]; spent RequireApproval ApprovalRequired; granted Allow; then RequireApproval ApprovalRequired"
    );
    slices(&a).close();
    let scope = Scope::new(ScopeKind::Run, "g");
    let [cap, settled] = amounts(&cluster, &scope, ["cap_attempts", "settled_attempts"]);
    assert_eq!(
        [cap, settled],
        [3, 3],
        "the cap raised to the core's limit in the grant's use"
    );
}

#[test]
fn outcomes_below_their_reservations_give_back_so_the_run_reaches_exactly_its_budget() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let dir = tempfile::tempdir().expect("dir");
    let a = leased(&cluster, dir.path(), "host-a", &clock);
    start(&a, json!({"run": "s", "budget": {"spend_cents": 100}}));
    let deadline = Instant::now() + PATIENCE;
    let mut allows = 0;
    // Each call reserves 30 cents and settles 10; between the check and its outcome, a
    // decision that is refused (an outcome for no attempt) lets the run's copy go.
    loop {
        let answer = match check(&a, "s", 30) {
            Err(GateError::Unavailable(e)) => panic!("refused as unavailable: {e}"),
            r => r.expect("a check"),
        };
        if answer.decision != Verdict::Allow {
            assert_eq!(answer.reason, Some(Reason::ReservationInsufficient));
            break;
        }
        allows += 1;
        let attempt = answer.attempt.expect("attempt");
        assert!(
            outcome(&a, "s", attempt + 1000, 10).is_err(),
            "no such attempt"
        );
        outcome(&a, "s", attempt, 10).expect("outcome");
        within(deadline, "the calls");
    }
    assert_eq!(allows, 8, "10 cents each while 30 more fit in 100");
    let last = check(&a, "s", 20).expect("the last 20 cents");
    assert_eq!(last.decision, Verdict::Allow, "{last:?}");
    outcome(&a, "s", last.attempt.expect("attempt"), 20).expect("outcome");
    let over = check(&a, "s", 1).expect("a check");
    assert_eq!(over.reason, Some(Reason::BudgetExceeded), "every cent used");
    slices(&a).close();
    let scope = Scope::new(ScopeKind::Run, "s");
    let [settled, leased] = amounts(&cluster, &scope, ["settled_nanos", "leased_nanos"]);
    assert_eq!(
        [settled, leased],
        [100 * 10_000_000, 0],
        "exactly its budget"
    );
}

#[test]
fn a_deny_through_another_gate_leaves_the_run_at_home() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let [(_da, a), (_db, b)] = two_hosts(&cluster, &clock);
    start(&a, json!({"run": "n", "budget": {"spend_cents": 100}}));
    let home = verdict(&check(&a, "n", 10));
    let denied = verdict(&check(&b, "n", 1000));
    let next = verdict(&check(&a, "n", 10));
    let row = cluster.psql("SELECT home FROM tally_runs WHERE name = 'n'");
    assert_eq!(
        format!(
            "home {home}; through b {denied}; home again {next}; row {}",
            row.trim()
        ),
        "home Allow; through b Deny ReservationInsufficient; home again Allow; row host-a"
    );
}

#[test]
fn a_plain_update_of_a_runs_row_as_an_earlier_build_writes_takes_its_home_back() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let dir = tempfile::tempdir().expect("dir");
    let a = leased(&cluster, dir.path(), "host-a", &clock);
    start(&a, json!({"run": "u", "budget": {"attempts": 20}}));
    let home = verdict(&check(&a, "u", 0));
    let at = cluster.psql("SELECT coalesce(home, '-') FROM tally_runs WHERE name = 'u'");
    // A daemon of schema 7 writes the row centrally, saying nothing of its home.
    cluster.psql("UPDATE tally_runs SET version = version + 1 WHERE name = 'u'");
    let after = cluster.psql("SELECT coalesce(home, '-') FROM tally_runs WHERE name = 'u'");
    let next = verdict(&check_retried(&a, "u", 0, 3));
    assert_eq!(
        format!(
            "{home}; home {}; after the update {}; then {next}",
            at.trim(),
            after.trim()
        ),
        "Allow; home host-a; after the update -; then Allow"
    );
}

#[test]
fn a_second_process_under_one_holder_name_never_writes_over_the_first() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let (d1, d2) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let old = leased(&cluster, d1.path(), "host-a", &clock);
    start(&old, json!({"run": "e", "budget": {"attempts": 20}}));
    let first = verdict(&check(&old, "e", 0));
    // A rolling deploy starts the new process before the old one stopped: it adopts
    // the old one's slices (gives them back) and takes the run in; the old one, still
    // thinking it holds its slice, is refused instead of writing over the new one's.
    let new = leased(&cluster, d2.path(), "host-a", &clock);
    let taken = verdict(&check(&new, "e", 0));
    let stale = verdict(&check(&old, "e", 0));
    let next = check(&new, "e", 0).expect("decided on the new process");
    assert_eq!(
        format!(
            "old {first}; new {taken}; old again {stale}; new {:?} attempt {:?}",
            next.decision, next.attempt
        ),
        "old Allow; new Allow; old again unavailable; new Allow attempt Some(3)"
    );
}

/// A use spent centrally (the scope's last units, another host asking) whose decision
/// then rolled back for certain (its run taken back meanwhile) is given back: the scope
/// settles what the answered decisions used, no more.
#[test]
fn a_central_spend_whose_decision_rolled_back_is_given_back() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = at_noon();
    let dir = tempfile::tempdir().expect("dir");
    // The tool's breaker from a view: the run's guard goes with the last round trip,
    // after the use was taken.
    let policy = "[rate]\ntool_per_sec = 0\ntool_in_flight = 0\n[approvals]\nask_on = []\n";
    let a = leased_under(&cluster, dir.path(), "host-a", &clock, policy);
    start(&a, json!({"run": "g", "budget": {"attempts": 10}}));
    let scope = Scope::new(ScopeKind::Run, "g");
    // Allowed on a's slices until the one it holds has no room left.
    let mut allowed = 0;
    while slices(&a)
        .held(&scope)
        .is_none_or(|(granted, used)| used.attempts != granted.attempts)
    {
        assert_eq!(verdict(&check(&a, "g", 0)), "Allow");
        allowed += 1;
        assert!(allowed < 10, "a slice filled before the budget");
    }
    // Another host takes a slice of what is left but one attempt: the last one is
    // spent centrally (two hosts asking).
    let other = common::lease::manager(&cluster, "host-x", &clock);
    let left = 10 - allowed;
    let want = tally_gate_postgres::Amounts {
        attempts: left - 1,
        ..Default::default()
    };
    assert!(matches!(
        other.grant(&scope, want).expect("granted"),
        tally_gate_postgres::Grant::Granted(_)
    ));
    // The run's home taken back (as an earlier build's central write does) before a's
    // next decision, which spends centrally and then fails its guard.
    cluster.psql("UPDATE tally_runs SET version = version + 1 WHERE name = 'g'");
    assert_eq!(verdict(&check(&a, "g", 0)), "unavailable");
    let [settled] = amounts(&cluster, &scope, ["settled_attempts"]);
    assert_eq!(
        settled,
        i64::try_from(allowed).expect("small"),
        "the rolled-back spend was given back"
    );
}
