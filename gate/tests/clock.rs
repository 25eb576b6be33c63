//! The gate's time-driven rules on a [`ManualClock`] the test moves, never sleeping: the
//! breaker opens, half-opens for one probe, reopens when the probe never reports and
//! closes on an ok probe; upstream back-off (Retry-After) holds polls to the millisecond;
//! token buckets refill with time; a silent call stops holding its in-flight slot at its
//! timeout; a run's deadline refuses at the millisecond; an approval holds until its
//! expiry and not after; the ledger stamps its entries with the same clock.

use std::sync::Arc;

use ed25519_dalek::SigningKey;
use serde_json::json;
use tally_gate::{Approval, Caller, CheckAnswer, CheckRequest, Clock, Gate, ManualClock};
use tally_gate::{OutcomeRequest, StartRequest};
use tally_ledger::decision::{Budget, Scope};
use tally_ledger::keys::AuditorKey;
use tally_ledger::{Ledger, Reason, Rotation};
use tally_policy::{Recorded, Verdict};

const T0: u64 = 1_700_000_000_000;

const AGENT: Caller = Caller {
    uid: Some(1000),
    operator: false,
    proxied: false,
};
const OPERATOR: Caller = Caller {
    uid: None,
    operator: true,
    proxied: false,
};

struct Fixture {
    _dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    gate: Gate,
}

impl Fixture {
    fn new(policy: &str) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("l");
        let clock = Arc::new(ManualClock::new(T0));
        Ledger::init_with_clock(
            &path,
            &AuditorKey::generate().public(),
            Rotation::default(),
            clock.as_ref(),
        )
        .expect("init");
        let ledger =
            Ledger::open_with_clock(&path, Arc::clone(&clock) as Arc<dyn Clock>).expect("open");
        let gate = Gate::open(Arc::new(ledger), Recorded::new(policy).expect("policy"))
            .expect("gate")
            .with_clock(Arc::clone(&clock) as Arc<dyn Clock>);
        Fixture {
            _dir: dir,
            clock,
            gate,
        }
    }

    /// Move the clock to `ms` after T0.
    fn at(&self, ms: u64) {
        self.clock.set(T0 + ms);
    }

    fn start(&self, run: &str, budget: Budget) {
        self.gate
            .start_blocking(
                AGENT,
                StartRequest {
                    run: run.into(),
                    budget: Some(budget),
                    ..StartRequest::default()
                },
            )
            .expect("start");
    }

    fn check(&self, body: serde_json::Value) -> CheckAnswer {
        let req: CheckRequest = serde_json::from_value(body).expect("request");
        self.gate.check_blocking(AGENT, req).expect("an answer")
    }

    /// A read of `tool` by `run`, named `op` (distinct ops keep the loop rules out of it).
    fn read(&self, run: &str, tool: &str, op: &str) -> CheckAnswer {
        self.check(json!({"run": run, "tool": tool, "operation": op, "effect": "read"}))
    }

    fn outcome(&self, run: &str, a: &CheckAnswer, status: &str, extra: serde_json::Value) {
        let mut body =
            json!({"run": run, "attempt": a.attempt.expect("an allow"), "status": status});
        if let (Some(b), serde_json::Value::Object(e)) = (body.as_object_mut(), extra) {
            b.extend(e);
        }
        let req: OutcomeRequest = serde_json::from_value(body).expect("outcome");
        self.gate.outcome_blocking(AGENT, req).expect("outcome");
    }
}

fn verdict(a: &CheckAnswer) -> (Verdict, Option<Reason>) {
    (a.decision, a.reason)
}

const ALLOW: (Verdict, Option<Reason>) = (Verdict::Allow, None);

#[test]
fn the_breaker_opens_half_opens_for_one_probe_reopens_on_a_silent_probe_and_closes_on_ok() {
    let f = Fixture::new("[breaker]\nfailures = 2\nopen_ms = 1000\nprobe_timeout_ms = 500\n");
    f.start("a", Budget::default());
    f.start("b", Budget::default());
    for i in 0..2 {
        let a = f.read("a", "search", &format!("q{i}"));
        assert_eq!(verdict(&a), ALLOW);
        f.outcome("a", &a, "error", json!({}));
    }
    // Open, for every run: the refusal says when to come back.
    let refused = f.read("b", "search", "x");
    assert_eq!(
        verdict(&refused),
        (Verdict::Deny, Some(Reason::CircuitOpen))
    );
    assert_eq!(refused.retry_after_ms, Some(1000));
    f.at(999);
    let refused = f.read("b", "search", "y");
    assert_eq!(
        verdict(&refused).1,
        Some(Reason::CircuitOpen),
        "open for open_ms"
    );
    assert_eq!(refused.retry_after_ms, Some(1));
    // Another tool never notices.
    assert_eq!(verdict(&f.read("b", "fetch", "z")), ALLOW);
    // Half-open at open_ms: exactly one probe.
    f.at(1000);
    let probe = f.read("b", "search", "p1");
    assert_eq!(verdict(&probe), ALLOW, "half-open admits a probe");
    assert_eq!(
        verdict(&f.read("b", "search", "p2")).1,
        Some(Reason::CircuitOpen),
        "and only one"
    );
    // The probe never reports: just before its deadline the breaker still waits for it...
    f.at(1499);
    assert_eq!(
        verdict(&f.read("b", "search", "p3")).1,
        Some(Reason::CircuitOpen)
    );
    // ...at its deadline it counts as failed and the breaker opens again for open_ms.
    f.at(1500);
    assert_eq!(
        verdict(&f.read("b", "search", "p4")).1,
        Some(Reason::CircuitOpen),
        "a silent probe reopens the breaker"
    );
    f.at(2499);
    assert_eq!(
        verdict(&f.read("b", "search", "p5")).1,
        Some(Reason::CircuitOpen)
    );
    f.at(2500);
    let probe = f.read("b", "search", "p6");
    assert_eq!(
        verdict(&probe),
        ALLOW,
        "a stuck probe cannot wedge the breaker"
    );
    f.outcome("b", &probe, "ok", json!({}));
    assert_eq!(
        verdict(&f.read("b", "search", "p7")),
        ALLOW,
        "an ok probe closes the breaker"
    );
    assert_eq!(verdict(&f.read("a", "search", "p8")), ALLOW);
}

#[test]
fn a_failed_probe_opens_the_breaker_again_at_once() {
    let f = Fixture::new("[breaker]\nfailures = 1\nopen_ms = 1000\nprobe_timeout_ms = 500\n");
    f.start("a", Budget::default());
    let a = f.read("a", "search", "q");
    f.outcome("a", &a, "timeout", json!({}));
    f.at(1000);
    let probe = f.read("a", "search", "p");
    assert_eq!(verdict(&probe), ALLOW);
    f.at(1100);
    f.outcome("a", &probe, "error", json!({}));
    let refused = f.read("a", "search", "after");
    assert_eq!(verdict(&refused).1, Some(Reason::CircuitOpen));
    f.at(2099);
    assert_eq!(
        verdict(&f.read("a", "search", "still")).1,
        Some(Reason::CircuitOpen),
        "open for open_ms from the failed probe"
    );
    f.at(2100);
    assert_eq!(verdict(&f.read("a", "search", "again")), ALLOW);
}

#[test]
fn upstream_back_off_holds_polls_until_retry_after_less_the_tolerance() {
    // Tolerance: max(100 ms, 10 %) of a 2,000 ms Retry-After = 200 ms.
    let f = Fixture::new("[polls]\ntolerance_ms = 100\ntolerance_percent = 10\n");
    f.start(
        "p",
        Budget {
            polls: Some(5),
            ..Budget::default()
        },
    );
    let create = f.check(
        json!({"run": "p", "tool": "export", "operation": "export.create",
                                "effect": "idempotent_write", "idempotency_key": "k1"}),
    );
    assert_eq!(verdict(&create), ALLOW);
    f.at(10);
    f.outcome(
        "p",
        &create,
        "running",
        json!({"remote_ref": "ea91", "observed": "queued", "retry_after_ms": 2000}),
    );
    let poll = || {
        f.check(
            json!({"run": "p", "tool": "export", "operation": "export.status:ea91",
                       "effect": "read"}),
        )
    };
    f.at(10 + 1799);
    let early = poll();
    assert_eq!(
        verdict(&early),
        (Verdict::Deny, Some(Reason::UpstreamBackoff))
    );
    assert_eq!(
        early.retry_after_ms,
        Some(1),
        "says exactly how long is left"
    );
    f.at(10 + 1800);
    let on_time = poll();
    assert_eq!(verdict(&on_time), ALLOW, "{on_time:?}");
    f.outcome(
        "p",
        &on_time,
        "running",
        json!({"remote_ref": "ea91", "observed": "running", "retry_after_ms": 1000}),
    );
    // The next hint counts from that outcome: 1,000 ms less max(100, 10 %) = 900 ms.
    f.at(10 + 1800 + 899);
    assert_eq!(verdict(&poll()).1, Some(Reason::UpstreamBackoff));
    f.at(10 + 1800 + 900);
    assert_eq!(verdict(&poll()), ALLOW);
}

#[test]
fn a_tool_bucket_refills_with_the_clock_and_not_before() {
    let f = Fixture::new("[rate]\ntool_per_sec = 2\ntool_burst = 2\n");
    f.start("r", Budget::default());
    assert_eq!(verdict(&f.read("r", "search", "1")), ALLOW);
    assert_eq!(verdict(&f.read("r", "search", "2")), ALLOW);
    let held = f.read("r", "search", "3");
    assert_eq!(
        verdict(&held),
        (Verdict::Deny, Some(Reason::RateLimitExceeded))
    );
    let wait = held.retry_after_ms.expect("says when");
    assert!((1..=500).contains(&wait), "one token at 2/s: {wait} ms");
    f.at(wait - 1);
    assert_eq!(
        verdict(&f.read("r", "search", "4")).1,
        Some(Reason::RateLimitExceeded),
        "not a millisecond early"
    );
    f.at(wait);
    assert_eq!(verdict(&f.read("r", "search", "5")), ALLOW, "refilled");
    assert_eq!(
        verdict(&f.read("r", "search", "6")).1,
        Some(Reason::RateLimitExceeded),
        "one token, not a burst"
    );
    // A full second refills the burst, no more.
    f.at(wait + 1000);
    assert_eq!(verdict(&f.read("r", "search", "7")), ALLOW);
    assert_eq!(verdict(&f.read("r", "search", "8")), ALLOW);
    assert_eq!(
        verdict(&f.read("r", "search", "9")).1,
        Some(Reason::RateLimitExceeded)
    );
}

#[test]
fn a_run_is_allowed_until_its_deadline_and_refused_at_it() {
    let f = Fixture::new("");
    f.start(
        "d",
        Budget {
            deadline_ms: Some(5_000),
            ..Budget::default()
        },
    );
    f.at(4_999);
    let last = f.read("d", "search", "late");
    assert_eq!(verdict(&last), ALLOW);
    assert!(
        last.timeout_ms.is_some_and(|t| t <= 1),
        "an allow at 4,999 ms must end by the deadline: {last:?}"
    );
    f.at(5_000);
    assert_eq!(
        verdict(&f.read("d", "search", "too late")),
        (Verdict::Deny, Some(Reason::RunDeadlineExhausted))
    );
}

fn dana() -> SigningKey {
    SigningKey::from_bytes(&[11u8; 32])
}

fn approval(run: &str, scope: Scope, expires_ms: u64) -> Approval {
    let digest = tally_policy::approval::digest(run, "dana", &scope, expires_ms);
    let signature = tally_policy::approval::sign(&dana(), &digest);
    Approval {
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
fn an_approval_lifts_a_refusal_until_its_expiry_and_not_after() {
    let key = hex_key();
    let f = Fixture::new(&format!(
        "[ceiling]\nattempts = 1\n[approvals.approvers]\ndana = \"{key}\"\n"
    ));
    f.start("r", Budget::default());
    assert_eq!(verdict(&f.read("r", "search", "1")), ALLOW);
    let asked = f.read("r", "search", "2");
    assert_eq!(asked.decision, Verdict::RequireApproval);
    assert_eq!(asked.cause, Some(Reason::AttemptsExhausted));
    let one_more = || Scope {
        attempts: Some(1),
        ..Scope::default()
    };
    // An approval that expired before it arrived is refused, nothing recorded.
    f.at(1_000);
    let before = f.gate.ledger().checkpoint().size;
    assert!(f
        .gate
        .approve_blocking(OPERATOR, approval("r", one_more(), 1_000))
        .is_err());
    assert_eq!(f.gate.ledger().checkpoint().size, before);
    // One valid until run time 2,000 ms: unused at 2,000, it no longer lifts anything.
    f.gate
        .approve_blocking(OPERATOR, approval("r", one_more(), 2_000))
        .expect("approve");
    f.at(2_000);
    let expired = f.read("r", "search", "3");
    assert_ne!(expired.decision, Verdict::Allow, "{expired:?}");
    assert!(
        [expired.reason, expired.cause].contains(&Some(Reason::ApprovalExpired)),
        "{expired:?}"
    );
    // Another, used a millisecond before its expiry: allowed.
    f.gate
        .approve_blocking(OPERATOR, approval("r", one_more(), 3_000))
        .expect("approve");
    f.at(2_999);
    assert_eq!(verdict(&f.read("r", "search", "4")), ALLOW);
}

fn hex_key() -> String {
    dana()
        .verifying_key()
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn the_ledger_stamps_entries_and_checkpoints_with_the_clock_it_is_given() {
    let f = Fixture::new("");
    f.at(42_000);
    f.start("r", Budget::default());
    let cp = f.gate.ledger().checkpoint();
    assert_eq!(cp.wall_ms, T0 + 42_000);
    // A clock that goes back never takes the ledger's times back with it.
    f.clock.set(T0);
    assert_eq!(verdict(&f.read("r", "search", "1")), ALLOW);
    assert_eq!(f.gate.ledger().checkpoint().wall_ms, T0 + 42_000);
}

#[test]
fn a_call_that_never_reports_holds_its_tools_in_flight_slot_until_its_timeout_only() {
    let f = Fixture::new("[rate]\ntool_in_flight = 1\ncall_timeout_ms = 1000\n");
    f.start("r", Budget::default());
    let silent = f.read("r", "search", "1");
    assert_eq!(verdict(&silent), ALLOW);
    assert_eq!(silent.timeout_ms, Some(1000));
    f.at(999);
    let held = f.read("r", "search", "2");
    assert_eq!(
        verdict(&held),
        (Verdict::Deny, Some(Reason::RateLimitExceeded)),
        "one call in flight is the bound"
    );
    f.at(1000);
    assert_eq!(
        verdict(&f.read("r", "search", "3")),
        ALLOW,
        "past its timeout the silent call no longer counts as in flight"
    );
}
