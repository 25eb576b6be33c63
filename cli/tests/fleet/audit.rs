//! Reading the fleet back offline: every acknowledged decision in its host's ledger, the
//! attempts distinct across the fleet, and the merged audit of all the ledgers.

use super::*;

/// Every allow and outcome a daemon acknowledged is in its ledger at that seq with that
/// hash, and is the decision asked for. Returns the ledger's allows and outcomes on `run`
/// (attempt, reserve, settled).
pub(crate) fn acknowledged_are_in_ledgers(
    fleet: &Fleet,
    run: &str,
    seen: &[Vec<Seen>],
) -> Vec<(Vec<u64>, u64, u64)> {
    let mut per_host = Vec::new();
    for (d, seen) in seen.iter().enumerate() {
        let ledger = fleet.ledger(d);
        for s in seen {
            match &s.what {
                What::Allow {
                    attempt,
                    seq,
                    hash,
                    op,
                } => {
                    let (h, dec) = ledger
                        .get(seq)
                        .unwrap_or_else(|| panic!("host {d}: acknowledged allow seq {seq} lost"));
                    assert_eq!(h, hash, "host {d}: seq {seq} is another entry");
                    assert_eq!(dec["kind"], "allow", "host {d}: {dec}");
                    assert_eq!(dec["run"], run, "host {d}: {dec}");
                    assert_eq!(dec["operation"], op.as_str(), "host {d}: {dec}");
                    assert_eq!(dec["attempt"], *attempt, "host {d}: {dec}");
                }
                What::Outcome { attempt, seq, hash } => {
                    let (h, dec) = ledger
                        .get(seq)
                        .unwrap_or_else(|| panic!("host {d}: acknowledged outcome seq {seq} lost"));
                    assert_eq!(h, hash, "host {d}: seq {seq} is another entry");
                    assert_eq!(dec["kind"], "outcome", "host {d}: {dec}");
                    assert_eq!(dec["attempt"], *attempt, "host {d}: {dec}");
                }
                _ => {}
            }
        }
        let on_run = |kind: &str| {
            ledger
                .values()
                .filter(move |(_, d)| d["run"] == run && d["kind"] == kind)
                .map(|(_, d)| d.clone())
                .collect::<Vec<Value>>()
        };
        let attempts: Vec<u64> = on_run("allow")
            .iter()
            .map(|d| d["attempt"].as_u64().expect("attempt"))
            .collect();
        let reserved = on_run("allow")
            .iter()
            // The gate records nanodollars; counted here in cents, exactly.
            .map(|d| d["reserve_nanos"].as_u64().unwrap_or(0) / 10_000_000)
            .sum();
        let settled = on_run("outcome")
            .iter()
            .map(|d| d["settled_nanos"].as_u64().unwrap_or(0) / 10_000_000)
            .sum();
        per_host.push((attempts, reserved, settled));
    }
    per_host
}

/// No attempt number was given twice across the fleet; returns how many were given.
pub(crate) fn distinct_attempts(per_host: &[(Vec<u64>, u64, u64)]) -> u64 {
    let mut all = BTreeSet::new();
    for (attempts, _, _) in per_host {
        for a in attempts {
            assert!(all.insert(*a), "attempt {a} allowed twice across the fleet");
        }
    }
    all.len() as u64
}

/// What the merged replay may find.
#[derive(PartialEq)]
pub(crate) enum Replayed {
    /// Nothing.
    Clean,
    /// Attempts the state issued that no ledger records (a daemon killed between its
    /// state's commit and its ledger's write), and nothing else.
    CrashGapsAllowed,
}

/// The three ledgers read as one (docs/FLEET.md, "The merged audit"): every chain intact,
/// the merge clean, the replay as `replayed` says, and one handoff for each of `runs`.
pub(crate) fn merged_audit_is_one(fleet: &Fleet, runs: &[&str], replayed: Replayed) {
    let (code, v) = fleet.merged("verify");
    assert_eq!(v["verdict"], "intact", "{v:#}");
    assert_eq!(v["merge"]["findings"], json!([]), "{v:#}");
    let audit = v["audit"]["findings"].as_array().expect("audit findings");
    let findings = v["replay"]["findings"].as_array().expect("replay findings");
    match replayed {
        Replayed::Clean => {
            assert!(audit.is_empty(), "{:#}", v["audit"]);
            assert!(findings.is_empty(), "{:#}", v["replay"]);
            assert_eq!(code, Some(0), "{v:#}");
        }
        // The core's own finding for such a gap (an audit finding since the core judges).
        Replayed::CrashGapsAllowed => assert!(
            findings.is_empty() && audit.iter().all(|f| f["kind"] == "attempts_unrecorded"),
            "{:#}",
            v["replay"]
        ),
    }
    let (_, h) = fleet.merged("handoff");
    let mut named: Vec<&str> = h["handoffs"]
        .as_array()
        .expect("handoffs")
        .iter()
        .filter_map(|x| x["run"].as_str())
        .collect();
    named.sort_unstable();
    let mut want = runs.to_vec();
    want.sort_unstable();
    assert_eq!(named, want, "one handoff per run, whichever hosts wrote it");
}

/// Each host's allows and outcomes on a run: (attempts, reserved cents, settled cents).
pub(crate) type PerHost = Vec<(Vec<u64>, u64, u64)>;

/// A stopped fleet whose daemons all lived through a fault on `run` (nothing killed),
/// read back: the merged audit clean but for crash gaps; every acknowledged decision in
/// its ledger; every allow in a ledger acknowledged, and the other way; the run's state
/// (`standing`, read before the stop) never behind the ledgers and ahead by at most one
/// commit per daemon whose answer was lost with the fault (refused as unavailable, so
/// never recorded). The ledgers' allows and outcomes per host, the allows given, and
/// the attempts the state issued.
pub(crate) fn none_lost_state_at_most_one_ahead(
    fleet: &Fleet,
    run: &str,
    seen: &[Vec<Seen>],
    standing: &Value,
) -> (PerHost, u64, u64) {
    merged_audit_is_one(fleet, &[run], Replayed::CrashGapsAllowed);
    let per_host = acknowledged_are_in_ledgers(fleet, run, seen);
    let given = distinct_attempts(&per_host);
    let acked: usize = seen.iter().map(|s| count(s, is_allow)).sum();
    assert_eq!(given, acked as u64);
    let issued = standing["calls_allowed"].as_u64().expect("calls_allowed");
    assert!(
        issued >= given && issued <= given + DAEMONS as u64,
        "state {issued}, ledgers {given}"
    );
    (per_host, given, issued)
}
