//! Amounts in records (docs/FORMAT.md, "Money", "Amounts in records"): cents and
//! nanodollars read alike and exactly; one form per amount; no overflow, no float.

use std::collections::BTreeMap;

use tally_record::decision::{limits_in_nanos, one_amount, Limit};
use tally_record::money::Nanos;
use tally_record::{Decision, DecisionError, LimitKey};

fn stored(text: &str) -> Decision {
    let d = Decision::from_stored(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(d.to_canonical_json(), text.as_bytes(), "canonical: {text}");
    d
}

#[test]
fn the_vectors_of_format_md_account_alike() {
    let cents =
        stored(r#"{"run":"r1","kind":"allow","tool":"llm","attempt":1,"reserve_cents":12}"#);
    let nanos =
        stored(r#"{"run":"r1","kind":"allow","tool":"llm","attempt":1,"reserve_nanos":120000000}"#);
    assert_eq!(cents.reserve(), Some(Nanos(120_000_000)));
    assert_eq!(cents.reserve(), nanos.reserve());

    let cents = stored(r#"{"run":"r1","kind":"start","budget":{"attempts":5,"spend_cents":250}}"#);
    let nanos =
        stored(r#"{"run":"r1","kind":"start","budget":{"attempts":5,"spend_nanos":2500000000}}"#);
    let spend = |d: &Decision| d.budget.as_ref().and_then(|b| b.spend());
    assert_eq!(spend(&cents), Some(Nanos(2_500_000_000)));
    assert_eq!(spend(&cents), spend(&nanos));

    let s =
        stored(r#"{"run":"r1","kind":"outcome","attempt":1,"status":"ok","settled_nanos":150}"#);
    assert_eq!(s.settled(), Some(Nanos(150)));
    let r = stored(r#"{"run":"r1","kind":"refund","of":1,"nanos":7}"#);
    assert_eq!(r.refunded(), Some(Nanos(7)));
    let r = stored(r#"{"run":"r1","kind":"refund","of":1,"cents":7}"#);
    assert_eq!(r.refunded(), Some(Nanos(70_000_000)));
}

#[test]
fn both_forms_of_one_amount_are_refused_naming_both_fields() {
    for (text, cents, nanos) in [
        (
            r#"{"run":"r1","kind":"allow","reserve_cents":1,"reserve_nanos":10000000}"#,
            "reserve_cents",
            "reserve_nanos",
        ),
        (
            r#"{"run":"r1","kind":"outcome","attempt":1,"status":"ok","settled_cents":0,"settled_nanos":0}"#,
            "settled_cents",
            "settled_nanos",
        ),
        (
            r#"{"run":"r1","kind":"refund","of":1,"cents":1,"nanos":1}"#,
            "cents",
            "nanos",
        ),
        (
            r#"{"run":"r1","kind":"start","budget":{"spend_cents":1,"spend_nanos":1}}"#,
            "budget.spend_cents",
            "budget.spend_nanos",
        ),
        (
            r#"{"run":"r1","kind":"override","scope":{"cents":1,"nanos":1}}"#,
            "scope.cents",
            "scope.nanos",
        ),
        (
            r#"{"run":"r1","kind":"deny","reason":"budget_exceeded","limits":{"spend_cents":{"used":1,"limit":2},"spend_nanos":{"used":1,"limit":2}}}"#,
            "limits.spend_cents",
            "limits.spend_nanos",
        ),
    ] {
        let d = Decision::from_json(text).expect("parses");
        let e = d.validate().unwrap_err();
        assert_eq!(e, DecisionError::BothUnits { cents, nanos }, "{text}");
        assert!(e.to_string().contains(cents) && e.to_string().contains(nanos));
        // A stored record with both is no valid record either (a finding at verify).
        let mut sealed = d.clone();
        sealed.seal_args();
        assert!(Decision::from_stored(&sealed.to_canonical_json()).is_err());
    }
}

#[test]
fn cents_beyond_nanodollars_are_refused_never_wrapped() {
    let most = 1_844_674_407_370u64;
    let ok = format!(r#"{{"run":"r1","kind":"allow","reserve_cents":{most}}}"#);
    let d = Decision::from_json(&ok).unwrap();
    d.validate().unwrap();
    assert_eq!(d.reserve(), Some(Nanos(18_446_744_073_700_000_000)));
    for text in [
        format!(
            r#"{{"run":"r1","kind":"allow","reserve_cents":{}}}"#,
            most + 1
        ),
        format!(
            r#"{{"run":"r1","kind":"outcome","attempt":1,"status":"ok","settled_cents":{}}}"#,
            u64::MAX
        ),
        format!(
            r#"{{"run":"r1","kind":"refund","of":1,"cents":{}}}"#,
            u64::MAX
        ),
        format!(
            r#"{{"run":"r1","kind":"start","budget":{{"spend_cents":{}}}}}"#,
            most + 1
        ),
        format!(
            r#"{{"run":"r1","kind":"override","scope":{{"cents":{}}}}}"#,
            most + 1
        ),
        format!(
            r#"{{"run":"r1","kind":"stop","reason":"budget_exceeded","limits":{{"spend_cents":{{"used":0,"limit":{}}}}}}}"#,
            most + 1
        ),
    ] {
        let d = Decision::from_json(&text).expect("parses");
        assert!(
            matches!(d.validate(), Err(DecisionError::CentsOverflow { .. })),
            "{text}: {:?}",
            d.validate()
        );
        // Unvalidated, an accessor never wraps: it reads as the most there is.
        if d.reserve().is_some() {
            assert_eq!(d.reserve(), Some(Nanos::MAX));
        }
    }
    assert_eq!(
        one_amount("c", Some(most + 1), "n", None),
        Err(DecisionError::CentsOverflow {
            field: "c",
            cents: most + 1
        })
    );
    assert_eq!(
        one_amount("c", None, "n", Some(u64::MAX)),
        Ok(Some(Nanos::MAX))
    );
    assert_eq!(one_amount("c", None, "n", None), Ok(None));
}

#[test]
fn amounts_are_integers_only() {
    for amount in [
        "-1",
        "1.5",
        "1e3",
        "\"5\"",
        "1.0",
        "18446744073709551616",
        "true",
    ] {
        for field in ["reserve_nanos", "reserve_cents"] {
            let text = format!(r#"{{"run":"r1","kind":"allow","{field}":{amount}}}"#);
            assert!(
                matches!(Decision::from_json(&text), Err(DecisionError::Json { .. })),
                "{text} was not refused as a wrong type"
            );
        }
    }
}

#[test]
fn old_limits_snapshots_read_in_nanodollars() {
    let mut old = BTreeMap::new();
    old.insert(LimitKey::Attempts, Limit { used: 1, limit: 5 });
    old.insert(
        LimitKey::SpendCents,
        Limit {
            used: 30,
            limit: 100,
        },
    );
    let now = limits_in_nanos(&old);
    assert_eq!(now.get("spend_cents"), None);
    assert_eq!(
        now["spend_nanos"],
        Limit {
            used: 300_000_000,
            limit: 1_000_000_000
        }
    );
    assert_eq!(now["attempts"], old["attempts"]);
}
