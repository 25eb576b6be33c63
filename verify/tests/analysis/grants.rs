//! Approvals, refunds and unknown writes: what a grant puts in force and what it does
//! not, a refund's slot, records after a stop, a repeat after an unknown write.

use super::*;

fn over(run: &str, at_ms: u64, attempt: u64, args: Value) -> Decision {
    d(
        json!({"run": run, "kind": "allow", "at_ms": at_ms, "tool": "deploy.push",
             "operation": "deploy.push", "args": args, "effect": "idempotent_write",
             "attempt": attempt}),
    )
}

/// The approver of the tests' policy.
fn dana() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[9u8; 32])
}

/// Runs read under a policy that lists dana as an approver.
fn with_dana() -> Config {
    let key = hex::encode(dana().verifying_key().as_bytes());
    let text = format!("[approvals]\napprovers = {{ dana = \"{key}\" }}\n");
    Config {
        policy: std::sync::Arc::new(tally_policy::Policy::from_toml(&text).expect("policy")),
        ..Config::default()
    }
}

/// An approval of run `r`, signed by dana: the override record and its digest.
fn approval(at_ms: u64, scope: Value, expires_ms: u64) -> (Decision, String) {
    let sc: tally_ledger::decision::Scope = serde_json::from_value(scope.clone()).expect("scope");
    let digest = tally_policy::approval::digest("r", "dana", &sc, expires_ms);
    let signature = tally_policy::approval::sign(&dana(), &digest);
    let record = d(
        json!({"run": "r", "kind": "override", "at_ms": at_ms, "approver": "dana",
                          "scope": scope, "digest": digest, "expires_ms": expires_ms,
                          "signature": signature}),
    );
    (record, digest)
}

/// An allow that uses the approval `digest`.
fn granted(mut allow: Decision, digest: &str) -> Decision {
    allow.grant = Some(digest.to_owned());
    allow
}

fn analyse_with(config: Config, ds: &[Decision]) -> Report {
    Analysis::analyse(config, &events(ds))
}

#[test]
fn a_signed_grant_puts_its_attempts_in_force_as_the_cli_says() {
    // dana grants 3 more attempts: the allow that needs them names the grant, and the
    // run's limit is 1 + 3 from there on (three calls, one grant used once).
    let (grant, digest) = approval(500, json!({"attempts": 3}), 60_000);
    let ds = vec![
        start("r", json!({"attempts": 1})),
        over("r", 100, 1, json!({"r": 1})),
        grant,
        granted(over("r", 600, 2, json!({"r": 2})), &digest),
        over("r", 700, 3, json!({"r": 3})),
        over("r", 800, 4, json!({"r": 4})),
    ];
    let r = analyse_with(with_dana(), &ds);
    assert_eq!(r.findings, vec![], "an honest approval is consistent");
    let h = only_handoff(&r);
    assert_eq!(
        (h.attempts.used, h.attempts.limit, h.attempts.approved_extra),
        (4, Some(4), 3)
    );
    // A fifth call is beyond even the granted limit.
    let mut more = ds.clone();
    more.push(over("r", 900, 5, json!({"r": 5})));
    assert_eq!(
        analyse_with(with_dana(), &more).findings,
        vec![finding(
            6,
            "r",
            Inconsistency::AllowBeyondLimit {
                dimension: Dimension::Attempts,
                used: 5,
                limit: 4
            }
        )]
    );
}

#[test]
fn an_expired_grant_covers_nothing() {
    let (grant, digest) = approval(500, json!({"attempts": 1}), 1000);
    let ds = vec![
        start("r", json!({"attempts": 1})),
        over("r", 100, 1, json!({"r": 1})),
        grant,
        granted(over("r", 2000, 2, json!({"r": 2})), &digest),
    ];
    assert_eq!(
        analyse_with(with_dana(), &ds).findings,
        vec![
            finding(
                3,
                "r",
                Inconsistency::GrantExpired {
                    digest,
                    expires_ms: 1000,
                    at_ms: 2000
                }
            ),
            finding(
                3,
                "r",
                Inconsistency::AllowBeyondLimit {
                    dimension: Dimension::Attempts,
                    used: 2,
                    limit: 1
                }
            )
        ]
    );
}

#[test]
fn a_grant_for_another_tool_covers_nothing_and_is_not_used_up() {
    let (grant, digest) = approval(500, json!({"attempts": 1, "tool": "other"}), 60_000);
    let ds = vec![
        start("r", json!({"attempts": 1})),
        over("r", 100, 1, json!({"r": 1})),
        grant,
        granted(over("r", 600, 2, json!({"r": 3})), &digest),
    ];
    let r = analyse_with(with_dana(), &ds);
    assert_eq!(
        r.findings,
        vec![
            finding(
                3,
                "r",
                Inconsistency::GrantMismatch {
                    digest: digest.clone()
                }
            ),
            finding(
                3,
                "r",
                Inconsistency::AllowBeyondLimit {
                    dimension: Dimension::Attempts,
                    used: 2,
                    limit: 1
                }
            )
        ]
    );
    assert_eq!(r.handoffs[0].attempts.approved_extra, 0);
}

#[test]
fn an_unsigned_or_unlisted_approval_grants_nothing() {
    // No signature, or signed by a key the policy does not list: not an approval.
    let (mut unsigned, digest) = approval(500, json!({"attempts": 5}), 60_000);
    unsigned.signature = None;
    let ds = vec![
        start("r", json!({"attempts": 1})),
        over("r", 100, 1, json!({"r": 1})),
        unsigned,
        granted(over("r", 600, 2, json!({"r": 2})), &digest),
    ];
    assert_eq!(
        analyse_with(with_dana(), &ds).findings,
        vec![
            finding(
                2,
                "r",
                Inconsistency::InvalidApproval {
                    why: "approval has no `signature`".into()
                }
            ),
            finding(
                3,
                "r",
                Inconsistency::GrantNotHeld {
                    digest: digest.clone()
                }
            ),
            finding(
                3,
                "r",
                Inconsistency::AllowBeyondLimit {
                    dimension: Dimension::Attempts,
                    used: 2,
                    limit: 1
                }
            ),
        ]
    );
    // Under a policy that lists no approver, dana's signature grants nothing either.
    let (grant, digest) = approval(500, json!({"attempts": 5}), 60_000);
    let ds = vec![
        start("r", json!({"attempts": 1})),
        over("r", 100, 1, json!({"r": 1})),
        grant,
        granted(over("r", 600, 2, json!({"r": 2})), &digest),
    ];
    let found = analyse(&ds).findings;
    assert!(
        matches!(&found[0].kind, Inconsistency::InvalidApproval { why } if why.contains("not listed")),
        "{found:?}"
    );
}

#[test]
fn a_valid_refund_returns_its_slot_once() {
    let refund = |at_ms: u64| {
        d(json!({"run": "r", "kind": "refund", "at_ms": at_ms, "of": 1, "slots": 1, "cents": 10}))
    };
    let ds = vec![
        start("r", json!({"attempts": 2})),
        d(
            json!({"run": "r", "kind": "allow", "at_ms": 0, "tool": "t", "args": {}, "attempt": 1,
                 "reserve_cents": 10}),
        ),
        d(json!({"run": "r", "kind": "outcome", "at_ms": 5, "attempt": 1, "status": "error"})),
        refund(6),
        refund(7),
        read("r", 10, 2, json!({"p": 2})),
        read("r", 20, 3, json!({"p": 3})),
    ];
    let r = analyse(&ds);
    assert_eq!(
        r.findings,
        vec![finding(4, "r", Inconsistency::RefundedTwice { of: 1 })],
        "three allows less one refunded slot is within two attempts"
    );
    let h = only_handoff(&r);
    assert_eq!(
        h.attempts,
        Attempts {
            used: 2,
            limit: Some(2),
            approved_extra: 0,
            refunded: 1,
            carved_out: 0,
        }
    );
    assert_eq!(h.spend.reserved_nanos, 0);
}

#[test]
fn records_after_a_stop_and_outcomes_never_allowed() {
    let ds = vec![
        start("r", json!({})),
        d(json!({"run": "r", "kind": "outcome", "at_ms": 1, "attempt": 4, "status": "ok"})),
        d(json!({"run": "r", "kind": "stop", "at_ms": 2, "reason": "completed"})),
        read("r", 3, 1, json!({})),
    ];
    assert_eq!(
        analyse(&ds).findings,
        vec![
            finding(1, "r", Inconsistency::OutcomeWithoutAllow { attempt: 4 }),
            finding(
                3,
                "r",
                Inconsistency::AfterStop {
                    record: tally_ledger::Kind::Allow,
                    stop: Reason::Completed
                }
            ),
        ]
    );
}

fn charge(at_ms: u64, attempt: u64, key: Option<&str>) -> Decision {
    let mut v = json!({"run": "r", "kind": "allow", "at_ms": at_ms, "tool": "pay",
                       "operation": "pay:1", "args": {"n": 1}, "effect": "non_idempotent_write",
                       "attempt": attempt});
    if let Some(k) = key {
        v["idempotency_key"] = json!(k);
    }
    d(v)
}

#[test]
fn a_repeat_after_an_unknown_write_is_fine_only_after_a_human_check() {
    let lost =
        d(json!({"run": "r", "kind": "outcome", "at_ms": 10, "attempt": 1, "status": "unknown"}));
    // A human checked the remote side and approved the call (a grant naming its tool).
    let (grant, digest) = approval(20, json!({"tool": "pay"}), 60_000);
    let checked = vec![
        start("r", json!({})),
        charge(0, 1, None),
        lost.clone(),
        grant,
        granted(charge(30, 2, None), &digest),
    ];
    assert_eq!(analyse_with(with_dana(), &checked).findings, vec![]);
    // An idempotency key does not make a non-idempotent write repeatable: the gate
    // refuses the repeat, so the audit finds it (declare such a call idempotent_write).
    let keyed = vec![
        start("r", json!({})),
        charge(0, 1, Some("k1")),
        lost.clone(),
        charge(30, 2, Some("k1")),
    ];
    assert_eq!(
        analyse(&keyed).findings,
        vec![finding(
            3,
            "r",
            Inconsistency::RepeatedUnknownWrite { attempt: 1 }
        )]
    );
    let timed_out = vec![
        start("r", json!({})),
        charge(0, 1, None),
        d(json!({"run": "r", "kind": "outcome", "at_ms": 10, "attempt": 1, "status": "timeout"})),
        charge(30, 2, None),
    ];
    assert_eq!(
        analyse(&timed_out).findings,
        vec![finding(
            3,
            "r",
            Inconsistency::RepeatedUnknownWrite { attempt: 1 }
        )]
    );
}
