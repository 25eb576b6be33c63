//! The typed record against the flat validation it replaced ([`super::oracle`]): on
//! every decision, `typed` succeeds exactly when the old `validate` did, `Decision ->
//! Record -> Decision` is the identity when it does, and the error is the old one.
//!
//! One order changed: amounts in one unit are now checked by each kind's constructor,
//! after the fields the kind carries, so a decision whose first old fault was an amount
//! may now be refused first for a field its kind does not carry.

use proptest::prelude::*;
use serde_json::json;

use super::oracle;
use crate::args::Args;
use crate::codes::{Channel, Effect, Kind, Reason, Status, UsageRefused};
use crate::decision::{
    policy_digest, Budget, Decision, LeaseScope, Limit, Scope, Slice, SliceAmounts, Usage,
};
use crate::error::DecisionError;
use crate::LimitKey;

const DIGEST: &str = "a3f1c0de00000000000000000000000000000000000000000000000000000001";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const POLICY_TEXT: &str = "[budget]\nattempts = 3\n";

/// The typed form and the oracle agree on `d`; `Ok` when both accept it.
fn agree(d: &Decision) -> Result<bool, TestCaseError> {
    let old = oracle::validate(d);
    let new = d.typed();
    match (&old, &new) {
        (Ok(()), Ok(record)) => {
            prop_assert_eq!(record.kind(), d.kind());
            prop_assert_eq!(&Decision::from(*record), d, "round trip");
            prop_assert_eq!(d.validate(), Ok(()));
            Ok(true)
        }
        (Err(o), Err(n)) => {
            let amount = matches!(
                o,
                DecisionError::BothUnits { .. } | DecisionError::CentsOverflow { .. }
            );
            if !(o == n || amount && matches!(n, DecisionError::NotAllowed { .. })) {
                return Err(TestCaseError::fail(format!(
                    "old {o:?}, new {n:?} on {d:?}"
                )));
            }
            prop_assert_eq!(d.validate(), Err(n.clone()));
            Ok(false)
        }
        _ => Err(TestCaseError::fail(format!(
            "old {old:?}, new {new:?} on {d:?}"
        ))),
    }
}

/// Give `field` (a name of [`FIELDS`]) a value, valid or not as `v` picks (mostly
/// valid: a decision then needs few repairs to be accepted).
fn set(d: &mut Decision, field: &str, v: u64) {
    let text = ["w", "export.status:ea91", "", "é\"\\\n"][(v % 4) as usize].to_owned();
    let long = "x".repeat(1025);
    let text = if v % 23 == 22 { long } else { text };
    let num = [1, 0, 7, 18_446_744_073_709_551_615][(v % 4) as usize];
    let hex = |good: &str| {
        if v % 9 == 8 {
            "NOT-HEX".to_owned()
        } else {
            good.to_owned()
        }
    };
    let flag = v % 7 != 6;
    let args = Args::from_value(&json!({"q": v % 3})).expect("args");
    let limit = Limit { used: 1, limit: 2 };
    let dims = ["attempts", "spend_cents", "spend_nanos", "bogus"];
    match field {
        "run" => d.run = text,
        "worker" => d.worker = Some(text),
        "at_ms" => d.at_ms = Some(num),
        "goal" => d.goal = Some(text),
        "budget" => {
            d.budget = Some(Box::new(Budget {
                attempts: Some(3),
                spend_cents: (!v.is_multiple_of(3)).then_some(num),
                spend_nanos: (v % 3 != 1).then_some(5),
                ..Budget::default()
            }))
        }
        "tool" => d.tool = Some(text),
        "operation" => d.operation = Some(text),
        "args" => d.args = Some(args),
        "args_digest" => {
            d.args_digest = Some(match (v % 5, &d.args) {
                (0, _) | (_, None) => hex(DIGEST),
                (_, Some(a)) => a.digest(),
            })
        }
        "args_preview" => d.args_preview = Some(text),
        "effect" => d.effect = Some([Effect::Read, Effect::NonIdempotentWrite][(v % 2) as usize]),
        "idempotency_key" => d.idempotency_key = Some(text),
        "target" => d.target = Some(text),
        "channel" => d.channel = Some([Channel::Http, Channel::Model][(v % 2) as usize]),
        "depth" => d.depth = Some(num),
        "parent" => d.parent = Some(text),
        "reason" => {
            d.reason = Some(
                [Reason::BudgetExceeded, Reason::Completed, Reason::RunPaused][(v % 3) as usize],
            )
        }
        "attempt" => d.attempt = Some(num),
        "reserve_cents" => d.reserve_cents = Some(num),
        "reserve_nanos" => d.reserve_nanos = Some(num),
        "status" => d.status = Some([Status::Ok, Status::Error, Status::Unknown][(v % 3) as usize]),
        "settled_cents" => d.settled_cents = Some(num),
        "settled_nanos" => d.settled_nanos = Some(num),
        "remote_ref" => d.remote_ref = Some(text),
        "observed" => d.observed = Some(text),
        "retry_after_ms" => d.retry_after_ms = Some(num),
        "of" => d.of = Some(num),
        "slots" => d.slots = Some(num),
        "cents" => d.cents = Some(num),
        "nanos" => d.nanos = Some(num),
        "approver" => d.approver = Some(text),
        "scope" => {
            d.scope = Some(Box::new(Scope {
                attempts: Some(1),
                cents: (!v.is_multiple_of(3)).then_some(num),
                nanos: (v % 3 != 1).then_some(5),
                tool: Some(text.clone()),
                operation: v.is_multiple_of(2).then_some(text.clone()),
                new_run: v.is_multiple_of(5).then_some(text),
            }))
        }
        "digest" => d.digest = Some(hex(DIGEST)),
        "expires_ms" => d.expires_ms = Some(num),
        "note" => d.note = Some(text),
        "limits" => {
            let mut limits = std::collections::BTreeMap::new();
            limits.insert(LimitKey::from_name(dims[(v % 4) as usize]), limit);
            limits.insert(
                LimitKey::from_name(dims[(v / 4 % 3) as usize]),
                Limit {
                    used: num,
                    limit: 9,
                },
            );
            d.limits = Some(limits);
        }
        "policy" => {
            d.policy = Some(match v % 3 {
                1 => policy_digest(d.policy_text.as_deref().unwrap_or(POLICY_TEXT)),
                _ => hex(DIGEST),
            })
        }
        "policy_text" => {
            d.policy_text = Some(if v % 13 == 12 {
                "x".repeat(12 * 1024 + 1)
            } else {
                POLICY_TEXT.to_owned()
            })
        }
        "uid" => d.uid = Some(1000),
        "credential" => d.credential = Some(text),
        "timeout_ms" => d.timeout_ms = Some(num),
        "grant" => d.grant = Some(hex(DIGEST)),
        "signature" => d.signature = Some(hex(&"ab".repeat(64))),
        "continues" => d.continues = Some(text),
        "state_version" => d.state_version = Some(num),
        "result_digest" => d.result_digest = Some(hex(DIGEST)),
        "proxied" => d.proxied = Some(flag),
        "overrun_nanos" => d.overrun_nanos = Some(num),
        "operator" => d.operator = Some(flag),
        "usage_refused" => {
            d.usage_refused =
                Some([UsageRefused::Unpriced, UsageRefused::Implausible][(v % 2) as usize])
        }
        "usage" => {
            d.usage = Some(Box::new(match v % 4 {
                0 => Usage::default(),
                1 => Usage {
                    input_tokens: Some(0),
                    ..Usage::default()
                },
                _ => Usage::of(10, 0, 0, 0, 5, 0),
            }))
        }
        "trace_id" => {
            d.trace_id = Some(match v % 5 {
                0 => "0".repeat(32),
                3 => "4BF92F3577B34DA6A3CE929D0E0E4736".to_owned(),
                _ => hex(TRACE),
            })
        }
        "prev_seq" => d.prev_seq = Some(num),
        "lease" => d.lease = Some(num),
        "slice" => d.slice = Some(Box::new(slice(v, &text))),
        other => panic!("no field {other}"),
    }
}

/// A slice, valid or not as `v` picks (3 is a valid grant): an empty or long holder
/// (through `text`), no bounds, an expiry at the grant, a return without its time or
/// using more than its bound, a renewal saying what it used.
fn slice(v: u64, text: &str) -> Slice {
    let bounds = SliceAmounts {
        attempts: Some(5),
        nanos: (v % 2 == 1).then_some(1_000),
        ..SliceAmounts::default()
    };
    let holder = if v % 5 == 4 { text } else { "host-a" };
    let grant = Slice::grant(holder, 2, (LeaseScope::Run, "r1"), bounds, 1_000, 11_000);
    let used = |attempts| SliceAmounts {
        attempts: Some(attempts),
        ..SliceAmounts::default()
    };
    match v % 11 {
        0 => Slice::grant(
            "host-a",
            2,
            (LeaseScope::Principal, "1000"),
            SliceAmounts::default(),
            1_000,
            11_000,
        ),
        2 => Slice::grant("host-a", 2, (LeaseScope::Bucket, "b"), bounds, 1_000, 1_000),
        6 => grant.returned(used(3), 5_000),
        7 => grant.returned(used(6), 5_000),
        8 => Slice {
            closed_at_ms: None,
            ..grant.reclaimed(used(1), 12_000)
        },
        9 => grant.renewed(21_000),
        10 => Slice {
            used_attempts: Some(1),
            ..grant.renewed(21_000)
        },
        _ => grant,
    }
}

/// Take `field` out of `d` (for `run`, make it what its kind needs).
fn clear(d: &mut Decision, field: &str) {
    macro_rules! none {
        ($($f:ident)*) => {
            match field {
                $(stringify!($f) => d.$f = None,)*
                "run" => d.run = if matches!(d.kind, Some(Kind::Policy | Kind::Lease)) { String::new() } else { "r1".into() },
                other => panic!("no field {other}"),
            }
        };
    }
    none!(worker at_ms goal budget tool operation args args_digest args_preview effect
        idempotency_key target channel depth parent reason attempt reserve_cents
        reserve_nanos status settled_cents settled_nanos remote_ref observed retry_after_ms
        of slots cents nanos approver scope digest expires_ms note limits policy policy_text
        uid credential timeout_ms grant signature continues state_version result_digest
        proxied overrun_nanos operator usage_refused usage trace_id lease slice prev_seq)
}

/// Every field a decision may give, by its JSON name (`kind` aside).
const FIELDS: &[&str] = &[
    "run",
    "worker",
    "at_ms",
    "goal",
    "budget",
    "tool",
    "operation",
    "args",
    "args_digest",
    "args_preview",
    "effect",
    "idempotency_key",
    "target",
    "channel",
    "depth",
    "parent",
    "reason",
    "attempt",
    "reserve_cents",
    "reserve_nanos",
    "status",
    "settled_cents",
    "settled_nanos",
    "remote_ref",
    "observed",
    "retry_after_ms",
    "of",
    "slots",
    "cents",
    "nanos",
    "approver",
    "scope",
    "digest",
    "expires_ms",
    "note",
    "limits",
    "policy_text",
    "policy",
    "uid",
    "credential",
    "timeout_ms",
    "grant",
    "signature",
    "continues",
    "state_version",
    "result_digest",
    "proxied",
    "overrun_nanos",
    "operator",
    "usage_refused",
    "usage",
    "trace_id",
    "lease",
    "slice",
    "prev_seq",
];

/// The field an error names, as [`clear`] and [`set`] know it.
fn named(e: &DecisionError) -> &'static str {
    let field = match e {
        DecisionError::Missing { field }
        | DecisionError::NotAllowed { field, .. }
        | DecisionError::TooLong { field, .. }
        | DecisionError::Invalid { field, .. }
        | DecisionError::CentsOverflow { field, .. } => field,
        DecisionError::BothUnits { cents, .. } => cents,
        other => panic!("validation does not give {other:?}"),
    };
    field.split('.').next().unwrap_or(field)
}

/// Repair `d` toward a valid decision one fault at a time (take out the field the
/// oracle names; give a missing one), checking agreement at every step. Whether it ends
/// valid.
fn repair(d: &mut Decision) -> Result<bool, TestCaseError> {
    for _ in 0..FIELDS.len() * 2 {
        if agree(d)? {
            return Ok(true);
        }
        let e = oracle::validate(d).expect_err("agree said invalid");
        match (&e, named(&e)) {
            (DecisionError::Missing { .. }, field) => set(d, field, 3),
            (DecisionError::Invalid { .. }, "policy") if d.kind == Some(Kind::Policy) => {
                set(d, "policy", 1)
            }
            (_, field) => clear(d, field),
        }
    }
    Ok(false)
}

/// The decision of `kind` that gives every field, each valued by its own pick.
fn full(kind: Kind, picks: &[u64]) -> Decision {
    let mut d = Decision {
        kind: Some(kind),
        ..Decision::default()
    };
    for (field, v) in FIELDS.iter().zip(picks.iter().cycle()) {
        set(&mut d, field, *v);
    }
    d
}

/// Every kind with every field present and absent: from the valid decision of each kind
/// that keeps every field it may carry, each field taken out, given when absent, and
/// given each of its values (good and bad).
#[test]
fn every_kind_every_field() {
    let mut accepted = 0;
    for &kind in Kind::ALL {
        let mut d = full(kind, &[1, 2, 5]);
        assert!(repair(&mut d).unwrap(), "{kind}: {d:?}");
        for field in FIELDS {
            let mut without = d.clone();
            clear(&mut without, field);
            repair(&mut without).unwrap();
            for v in 0..24 {
                let mut with = d.clone();
                set(&mut with, field, v);
                if agree(&with).unwrap() {
                    accepted += 1;
                }
                repair(&mut with).unwrap();
            }
        }
    }
    // Not only refusals: many of the decisions tried are valid ones.
    assert!(accepted > 1000, "{accepted} accepted");
}

/// Two faults at once, for every kind and every pair of fields: the first named is the
/// old first (the order of the checks is the old order).
#[test]
fn every_kind_every_pair_of_fields() {
    for &kind in Kind::ALL {
        let mut d = full(kind, &[1, 2, 5]);
        assert!(repair(&mut d).unwrap(), "{kind}");
        for (i, a) in FIELDS.iter().enumerate() {
            for b in &FIELDS[i + 1..] {
                // 8: a digest that is not hex; 22: a text over its bound; 12: a policy
                // text over its bound, a `usage` written empty; 6: `false` flags.
                for v in [8, 22, 12, 6] {
                    let mut two = d.clone();
                    set(&mut two, a, v);
                    set(&mut two, b, v);
                    agree(&two).unwrap();
                }
            }
        }
    }
}

/// The fields a typed record carries are exactly those its kind's `FIELDS` name: a
/// valid decision that gives all of them comes back whole (checked in `agree`), and
/// no field is listed for a kind that refuses it.
#[test]
fn each_kind_keeps_what_it_carries() {
    for &kind in Kind::ALL {
        let mut d = full(kind, &[2]);
        assert!(repair(&mut d).unwrap(), "{kind}");
        let carried: Vec<&str> = super::fields::carried(kind)
            .iter()
            .flat_map(|list| list.iter().copied())
            .collect();
        for field in FIELDS.iter().filter(|f| **f != "run") {
            let mut one = d.clone();
            set(&mut one, field, 0);
            let refused = matches!(
                oracle::validate(&one),
                Err(DecisionError::NotAllowed { field: f, .. }) if f == *field
            );
            assert_eq!(refused, !carried.contains(field), "{kind} {field}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Random decisions: any kind, any subset of the fields, each with a random value;
    /// then repaired toward validity one fault at a time, agreeing at each step.
    #[test]
    fn typed_agrees_with_the_flat_validation(
        kind in prop::sample::select(Kind::ALL.to_vec()),
        keep in any::<u64>(),
        picks in prop::collection::vec(any::<u64>(), FIELDS.len()),
    ) {
        let mut d = full(kind, &picks);
        for (i, field) in FIELDS.iter().enumerate() {
            if keep >> (i % 64) & 1 == 0 && *field != "run" {
                clear(&mut d, field);
            }
        }
        repair(&mut d)?;
    }
}
