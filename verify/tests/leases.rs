//! The lease audit over real ledgers, one or a fleet's several merged: hosts that
//! spend past their slices, slices summing past a run's cap, decisions on slices they
//! may not be decided on, forged lease records; and a clean fleet that verifies.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use tally_ledger::keys::{AuditorKey, LedgerPublic};
use tally_ledger::ledger::{Ledger as Log, Rotation};
use tally_ledger::Decision;
use tally_verify::analysis::Config;
use tally_verify::audit::Ledger;
use tally_verify::{Audit, AuditReport};

fn auditor() -> AuditorKey {
    AuditorKey::from_bytes([9; 32])
}

/// Now on the wall clock, ms: the ledger stamps its entries with it, so slices are
/// granted around it.
fn now_ms() -> u64 {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(d.as_millis()).unwrap()
}

/// A ledger at `dir` holding `records` (JSON values), appended one batch each.
fn ledger(dir: &Path, records: &[Value]) -> LedgerPublic {
    let public = Log::init(dir, &auditor().public(), Rotation::default()).expect("init");
    let log = Log::open(dir).expect("open");
    for v in records {
        let mut d = Decision::from_json(&v.to_string()).unwrap_or_else(|e| panic!("{v}: {e}"));
        d.seal_args();
        log.append(d).unwrap_or_else(|e| panic!("{v}: {e}"));
    }
    public
}

/// The audit `tally verify A B ...` runs over the ledgers, with the auditor key.
fn audit(ledgers: &[(PathBuf, LedgerPublic)]) -> AuditReport {
    let audit = Audit {
        ledgers: ledgers
            .iter()
            .map(|(path, public)| {
                let mut options = tally_verify::Options::new(public.clone());
                options.auditor = Some(auditor());
                Ledger::new(path, options)
            })
            .collect(),
    };
    audit.run(Some(Config::default()), |_| {}).expect("audit")
}

/// A fleet of ledgers in a temporary directory, each from its records.
fn fleet(ledgers: &[Vec<Value>]) -> (tempfile::TempDir, AuditReport) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let written: Vec<_> = (ledgers.iter().enumerate())
        .map(|(i, records)| {
            let dir = tmp.path().join(format!("host{i}"));
            let public = ledger(&dir, records);
            (dir, public)
        })
        .collect();
    let report = audit(&written);
    (tmp, report)
}

/// The findings of `kind` in the report's JSON.
fn findings(report: &AuditReport, kind: &str) -> Vec<Value> {
    let json = report.to_json();
    let all = json["audit"]["findings"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    all.into_iter().filter(|f| f["kind"] == kind).collect()
}

fn start(run: &str, attempts: u64, version: u64) -> Value {
    json!({"run": run, "kind": "start", "uid": 1000, "state_version": version,
           "budget": {"attempts": attempts, "spend_nanos": 10_000_000}})
}

/// A slice event of `id` held by `holder` on run `run`'s budget.
fn lease(id: u64, event: &str, holder: &str, run: &str, attempts: u64, t: u64) -> Value {
    let mut slice = json!({"event": event, "holder": holder, "epoch": 1,
        "scope_kind": "run", "scope_key": run, "attempts": attempts,
        "nanos": 4_000_000, "granted_at_ms": t, "expires_at_ms": t + 3_600_000});
    if event == "return" || event == "reclaim" {
        slice["closed_at_ms"] = json!(t + 1);
    }
    json!({"run": "", "kind": "lease", "lease": id, "slice": slice})
}

fn allow(run: &str, attempt: u64, lease: u64, version: u64) -> Value {
    json!({"run": run, "kind": "allow", "uid": 1000, "tool": "http.get",
           "args": {"n": attempt}, "effect": "read", "attempt": attempt,
           "reserve_nanos": 1_000_000, "lease": lease, "state_version": version})
}

fn outcome(run: &str, attempt: u64, lease: u64, version: u64) -> Value {
    json!({"run": run, "kind": "outcome", "uid": 1000, "attempt": attempt, "status": "ok",
           "settled_nanos": 500_000, "lease": lease, "state_version": version})
}

#[test]
fn a_clean_fleet_of_two_hosts_verifies_consistent() {
    let t = now_ms() - 10_000;
    let mut done = lease(1, "return", "host-a", "r1", 4, t);
    done["slice"]["used_attempts"] = json!(2);
    done["slice"]["used_nanos"] = json!(1_000_000);
    // Returned after host B's slice was granted: both open at once for a while.
    done["slice"]["closed_at_ms"] = json!(t + 1_000);
    let a = vec![
        start("r1", 10, 1),
        lease(1, "grant", "host-a", "r1", 4, t),
        allow("r1", 1, 1, 2),
        outcome("r1", 1, 1, 3),
        allow("r1", 2, 1, 5),
        outcome("r1", 2, 1, 6),
        lease(1, "renew", "host-a", "r1", 4, t),
        done,
    ];
    let b = vec![
        lease(2, "grant", "host-b", "r1", 4, t + 5),
        allow("r1", 3, 2, 4),
        outcome("r1", 3, 2, 7),
        lease(2, "return", "host-b", "r1", 4, t + 5),
    ];
    let (_tmp, report) = fleet(&[a, b]);
    assert!(!report.inconsistent(), "{}", report.to_text());
    let json = report.to_json();
    let scopes = &json["audit"]["leases"];
    assert_eq!(scopes[0]["scope_key"], "r1", "{json}");
    assert_eq!(scopes[0]["slices"], 2);
    assert_eq!(scopes[0]["most_leased"]["attempts"], 8);
    assert_eq!(scopes[0]["cap"]["known"]["attempts"], 10);
    let text = report.to_text();
    assert!(text.contains("Leased slices, per scope:"), "{text}");
    assert!(!text.contains("INCONSISTENT"), "{text}");
}

#[test]
fn a_host_deciding_past_its_slice_is_found_and_its_return_does_not_hide_it() {
    let t = now_ms() - 10_000;
    let mut back = lease(1, "return", "host-a", "r1", 2, t);
    back["slice"]["used_attempts"] = json!(2);
    let a = vec![
        start("r1", 10, 1),
        lease(1, "grant", "host-a", "r1", 2, t),
        allow("r1", 1, 1, 2),
        allow("r1", 2, 1, 3),
        allow("r1", 3, 1, 4),
        back,
    ];
    let (_tmp, report) = fleet(&[a]);
    assert!(report.inconsistent());
    let over = findings(&report, "lease_overspent");
    assert_eq!(over.len(), 1, "{over:?}");
    assert_eq!(over[0]["lease"], 1);
    assert_eq!(over[0]["dimension"], "attempts");
    assert_eq!(
        (over[0]["used"].clone(), over[0]["bound"].clone()),
        (json!(3), json!(2))
    );
    // The third allow, at seq 5 (seq 0 is the genesis).
    assert_eq!(over[0]["seq"], 5);
    let lied = findings(&report, "lease_misrecorded");
    assert_eq!(lied.len(), 1, "{lied:?}");
    assert!(lied[0]["why"]
        .as_str()
        .unwrap()
        .contains("says 2 attempts used, its decisions used 3"));
    let text = report.to_text();
    assert!(
        text.contains("lease_overspent") && text.contains("INCONSISTENT"),
        "{text}"
    );
}

#[test]
fn two_hosts_slices_open_at_once_past_the_runs_cap_are_found() {
    let t = now_ms() - 10_000;
    let a = vec![start("r1", 10, 1), lease(1, "grant", "host-a", "r1", 6, t)];
    // Host B's slice is granted while A's is open: 12 attempts leased of 10.
    let b = vec![lease(2, "grant", "host-b", "r1", 6, t + 10)];
    let (_tmp, report) = fleet(&[a.clone(), b]);
    let over = findings(&report, "slices_over_cap");
    assert_eq!(over.len(), 1, "{}", report.to_text());
    assert_eq!(over[0]["lease"], 2);
    assert_eq!(
        (over[0]["leased"].clone(), over[0]["cap"].clone()),
        (json!(12), json!(10))
    );
    assert_eq!(over[0]["seq"], "2:1", "in the second ledger given");
    assert!(report.inconsistent());
    // The same slice granted after A's was returned (after its return was written):
    // never more than 6 at once.
    let mut a = a;
    a.push(lease(1, "return", "host-a", "r1", 6, t));
    let b = vec![lease(2, "grant", "host-b", "r1", 6, now_ms() + 60_000)];
    let (_tmp, report) = fleet(&[a, b]);
    assert!(!report.inconsistent(), "{}", report.to_text());
}

#[test]
fn decisions_on_returned_expired_unknown_or_another_hosts_slices_are_found() {
    let t = now_ms() - 10_000;
    let mut expired = lease(3, "grant", "host-a", "r1", 2, t - 100_000);
    expired["slice"]["expires_at_ms"] = json!(t - 50_000);
    let a = vec![
        start("r1", 10, 1),
        lease(1, "grant", "host-a", "r1", 2, t),
        lease(1, "return", "host-a", "r1", 2, t),
        allow("r1", 1, 1, 2),
        allow("r1", 2, 99, 3),
        expired,
        allow("r1", 3, 3, 4),
    ];
    let b = vec![
        lease(2, "grant", "host-b", "r1", 2, t),
        // Host B decides on host A's slice.
        allow("r1", 4, 1, 5),
    ];
    let (_tmp, report) = fleet(&[a, b]);
    let outside = findings(&report, "decision_outside_lease");
    let whys: Vec<(Value, Value)> = outside
        .iter()
        .map(|f| (f["lease"].clone(), f["why"].clone()))
        .collect();
    assert_eq!(
        whys,
        [
            (json!(1), json!("closed")),
            (json!(99), json!("unknown")),
            (json!(3), json!("expired")),
            (json!(1), json!("other_holder")),
        ],
        "{}",
        report.to_text()
    );
    assert!(report.inconsistent());
}

#[test]
fn forged_lease_records_are_found() {
    let t = now_ms() - 10_000;
    // A slice of far more than the run's budget, a principal's slice whose cap no
    // ledger records, a return of a slice never granted, a second grant of one id.
    let absurd = lease(1, "grant", "host-a", "r1", 1_000_000_000_000, t);
    let mut principal = lease(2, "grant", "host-a", "r1", 5, t);
    principal["slice"]["scope_kind"] = json!("principal");
    principal["slice"]["scope_key"] = json!("1000");
    let a = vec![
        start("r1", 10, 1),
        absurd.clone(),
        principal,
        lease(7, "return", "host-a", "r1", 2, t),
        absurd,
    ];
    let (_tmp, report) = fleet(&[a]);
    let over = findings(&report, "slices_over_cap");
    assert_eq!(over.len(), 1, "{}", report.to_text());
    assert_eq!(over[0]["leased"], 1_000_000_000_000u64);
    let forged = findings(&report, "lease_misrecorded");
    let whys: Vec<&str> = forged.iter().map(|f| f["why"].as_str().unwrap()).collect();
    assert_eq!(
        whys,
        [
            "a return of a slice never granted",
            "a second grant of one slice id"
        ]
    );
    let json = report.to_json();
    let scopes = json["audit"]["leases"].as_array().unwrap();
    let principal = scopes
        .iter()
        .find(|s| s["scope_kind"] == "principal")
        .expect("the principal's scope");
    assert_eq!(principal["cap"], "unknown");
    let text = report.to_text();
    assert!(text.contains("cap unknown from the ledgers"), "{text}");
}

#[test]
fn a_truthful_return_of_an_overspent_slice_is_recorded_and_found_overspent() {
    let t = now_ms() - 10_000;
    let mut back = lease(1, "return", "host-a", "r1", 2, t);
    // The holder says what it used: 3 attempts of 2.
    back["slice"]["used_attempts"] = json!(3);
    let a = vec![
        start("r1", 10, 1),
        lease(1, "grant", "host-a", "r1", 2, t),
        allow("r1", 1, 1, 2),
        allow("r1", 2, 1, 3),
        allow("r1", 3, 1, 4),
        back,
    ];
    let (_tmp, report) = fleet(&[a]);
    let over = findings(&report, "lease_overspent");
    assert_eq!(over.len(), 1, "{}", report.to_text());
    assert_eq!(
        (over[0]["used"].clone(), over[0]["bound"].clone()),
        (json!(3), json!(2))
    );
    assert!(
        findings(&report, "lease_misrecorded").is_empty(),
        "{}",
        report.to_text()
    );
    assert!(report.inconsistent());
}

#[test]
fn a_give_back_naming_a_slice_its_allow_did_not_take_is_found_and_not_credited() {
    let t = now_ms() - 10_000;
    let mut central = allow("r1", 1, 0, 4);
    central.as_object_mut().unwrap().remove("lease");
    central["reserve_nanos"] = json!(3_000_000);
    // Attempt 1 reserved centrally, attempt 2 on slice 2; their outcomes name slice 1
    // and settle nothing, to make room on slice 1 it never used.
    let free = |attempt: u64, version: u64| {
        let mut o = outcome("r1", attempt, 1, version);
        o["settled_nanos"] = json!(0);
        o
    };
    let a = vec![
        start("r1", 40, 1),
        lease(1, "grant", "host-a", "r1", 20, t),
        lease(2, "grant", "host-a", "r1", 20, t),
        central,
        allow("r1", 2, 2, 5),
        allow("r1", 3, 1, 6),
        allow("r1", 4, 1, 7),
        allow("r1", 5, 1, 8),
        allow("r1", 6, 1, 9),
        free(1, 10),
        free(2, 11),
        // Slice 1 has used its 4,000,000 nanodollars: this allow is past it.
        allow("r1", 7, 1, 12),
    ];
    let (_tmp, report) = fleet(&[a]);
    let outside = findings(&report, "decision_outside_lease");
    let whys: Vec<(Value, Value)> = outside
        .iter()
        .map(|f| (f["lease"].clone(), f["why"].clone()))
        .collect();
    assert_eq!(
        whys,
        [
            (json!(1), json!("not_the_allows")),
            (json!(1), json!("not_the_allows")),
        ],
        "{}",
        report.to_text()
    );
    let over = findings(&report, "lease_overspent");
    assert_eq!(over.len(), 1, "{}", report.to_text());
    assert_eq!(
        (over[0]["lease"].clone(), over[0]["dimension"].clone()),
        (json!(1), json!("nanos"))
    );
    assert_eq!(over[0]["used"], 5_000_000);
    let text = report.to_text();
    assert!(
        text.contains("not the slice its attempt's allow took"),
        "{text}"
    );
}

#[test]
fn decisions_of_runs_outside_a_slices_scope_are_found() {
    let t = now_ms() - 10_000;
    let scoped = |id: u64, kind: &str, key: &str| {
        let mut g = lease(id, "grant", "host-a", "r1", 4, t);
        g["slice"]["scope_kind"] = json!(kind);
        g["slice"]["scope_key"] = json!(key);
        g
    };
    let a = vec![
        start("r1", 10, 1),
        start("r2", 10, 1),
        lease(1, "grant", "host-a", "r1", 4, t),
        scoped(2, "principal", "1001"),
        scoped(3, "principal", "1000"),
        scoped(4, "credential", "cred-x"),
        // Run r2 decides on run r1's slice; uid 1000's run on uid 1001's slice and
        // on a credential's it does not run under.
        allow("r2", 1, 1, 2),
        allow("r1", 1, 2, 2),
        allow("r1", 2, 4, 3),
        // Its own principal's slice and its own run's: within scope.
        allow("r1", 3, 3, 4),
        allow("r1", 4, 1, 5),
    ];
    let (_tmp, report) = fleet(&[a]);
    let outside = findings(&report, "decision_outside_lease");
    let whys: Vec<(Value, Value, Value)> = outside
        .iter()
        .map(|f| (f["lease"].clone(), f["run"].clone(), f["why"].clone()))
        .collect();
    assert_eq!(
        whys,
        [
            (json!(1), json!("r2"), json!("other_scope")),
            (json!(2), json!("r1"), json!("other_scope")),
            (json!(4), json!("r1"), json!("other_scope")),
        ],
        "{}",
        report.to_text()
    );
    let text = report.to_text();
    assert!(text.contains("is cut from another scope"), "{text}");
}

#[test]
fn a_return_backdated_to_before_another_grant_still_overlaps_it() {
    let t = now_ms() - 10_000;
    // Host A's return says it closed at t + 1, but it is written now: its slice was
    // open when host B's was granted at t + 5000, 12 attempts leased of 10.
    let a = vec![
        start("r1", 10, 1),
        lease(1, "grant", "host-a", "r1", 6, t),
        allow("r1", 1, 1, 2),
        lease(1, "return", "host-a", "r1", 6, t),
    ];
    let b = vec![lease(2, "grant", "host-b", "r1", 6, t + 5_000)];
    let (_tmp, report) = fleet(&[a, b]);
    let over = findings(&report, "slices_over_cap");
    assert_eq!(over.len(), 1, "{}", report.to_text());
    assert_eq!(
        (over[0]["lease"].clone(), over[0]["leased"].clone()),
        (json!(2), json!(12))
    );
    assert!(report.inconsistent());
}

#[test]
fn a_renewal_written_after_its_slice_expired_is_found_and_does_not_extend_it() {
    let t = now_ms() - 10_000;
    let mut grant = lease(1, "grant", "host-a", "r1", 4, t - 100_000);
    grant["slice"]["expires_at_ms"] = json!(t - 50_000);
    let mut renew = grant.clone();
    renew["slice"]["event"] = json!("renew");
    renew["slice"]["expires_at_ms"] = json!(t + 3_600_000);
    let a = vec![start("r1", 10, 1), grant, renew, allow("r1", 1, 1, 2)];
    let (_tmp, report) = fleet(&[a]);
    let forged = findings(&report, "lease_misrecorded");
    let whys: Vec<&str> = forged.iter().map(|f| f["why"].as_str().unwrap()).collect();
    assert_eq!(
        whys,
        ["a renewal written after the slice expired"],
        "{}",
        report.to_text()
    );
    let outside = findings(&report, "decision_outside_lease");
    assert_eq!(outside.len(), 1, "{}", report.to_text());
    assert_eq!(outside[0]["why"], "expired");
}
