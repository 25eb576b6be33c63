//! Lease records (docs/FORMAT.md, "Leases"): the table's vectors, byte for byte and
//! digest, and every way a hostile writer may spell one that the parser refuses.

use tally_record::decision::{LeaseEvent, LeaseScope, Slice, SliceAmounts};
use tally_record::{Decision, DecisionError, Kind, Record};

/// The rows of docs/FORMAT.md's lease table: sent, stored, digest.
fn vectors() -> Vec<[String; 3]> {
    let doc = include_str!("../../docs/FORMAT.md");
    let header = "| record as sent | stored (canonical) | BLAKE3 of the stored bytes |";
    let at = doc.find(header).expect("docs/FORMAT.md: no lease table");
    doc[at..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<String> = l
                .split(" | ")
                .map(|c| {
                    c.trim_matches(|c| c == '|' || c == ' ' || c == '`')
                        .to_owned()
                })
                .collect();
            [cells[0].clone(), cells[1].clone(), cells[2].clone()]
        })
        .collect()
}

/// `text` parsed, validated and sealed as the ledger's append does, then encoded.
fn stored(text: &str) -> Result<Vec<u8>, DecisionError> {
    let mut d = Decision::from_json(text)?;
    d.validate()?;
    d.seal_args();
    Ok(d.to_canonical_json())
}

#[test]
fn the_vectors_of_format_md_store_and_digest_as_written() {
    let rows = vectors();
    assert!(rows.len() >= 3, "the lease table has {} rows", rows.len());
    for [sent, want, digest] in rows {
        let bytes = stored(&sent).unwrap_or_else(|e| panic!("{sent}: {e}"));
        let got = String::from_utf8(bytes.clone()).unwrap();
        let hash = blake3::hash(&bytes).to_hex().to_string();
        assert_eq!(
            (got.as_str(), hash.as_str()),
            (want.as_str(), digest.as_str())
        );
        // The stored form reads back as itself, through the stored reader too.
        let back = Decision::from_stored(want.as_bytes()).expect("stored form");
        assert_eq!(back.to_canonical_json(), want.as_bytes());
    }
}

#[test]
fn the_constructors_build_what_the_table_shows() {
    let bounds = SliceAmounts {
        attempts: Some(10),
        nanos: Some(2_000_000),
        ..SliceAmounts::default()
    };
    let grant = Slice::grant(
        "host-a",
        3,
        (LeaseScope::Run, "r1"),
        bounds,
        1_700_000_000_000,
        1_700_000_010_000,
    );
    let mut d = Decision::lease_record(7, grant.clone());
    d.at_ms = Some(5);
    let rows = vectors();
    assert_eq!(d.to_canonical_json(), rows[0][1].as_bytes());
    let used = SliceAmounts {
        attempts: Some(4),
        nanos: Some(1_500_000),
        ..SliceAmounts::default()
    };
    let back = Decision::lease_record(7, grant.returned(used, 1_700_000_004_000));
    let Ok(Record::Lease(l)) = back.typed() else {
        panic!("a lease record: {back:?}");
    };
    assert_eq!((l.id, l.slice.event), (7, LeaseEvent::Return));
    assert_eq!(l.slice.used(), used);
    assert_eq!(l.slice.bounds(), bounds);
    assert_eq!(back.kind(), Kind::Lease);
    let renewed = grant.renewed(1_700_000_020_000);
    assert_eq!(
        (renewed.event, renewed.expires_at_ms, renewed.bounds()),
        (LeaseEvent::Renew, 1_700_000_020_000, bounds)
    );
}

const GRANT: &str = r#"{"run":"","kind":"lease","lease":7,"slice":{"event":"grant","holder":"host-a","epoch":3,"scope_kind":"run","scope_key":"r1","attempts":10,"granted_at_ms":1000,"expires_at_ms":2000}}"#;

/// Refused, with what the error says.
fn refused(text: &str) -> String {
    match stored(text) {
        Ok(bytes) => panic!("accepted: {text} as {}", String::from_utf8_lossy(&bytes)),
        Err(e) => e.to_string(),
    }
}

#[test]
fn duplicate_and_non_canonical_spellings_are_refused() {
    stored(GRANT).expect("the base record is valid");
    let cases = [
        // A field given twice, in the slice and in the record.
        (
            r#""attempts":10,"#,
            r#""attempts":10,"attempts":1,"#,
            "attempts",
        ),
        (
            r#""holder":"host-a","#,
            r#""holder":"host-a","holder":"host-b","#,
            "holder",
        ),
        (r#""lease":7,"#, r#""lease":7,"lease":8,"#, "lease"),
        // Numbers not in plain decimal.
        (r#""epoch":3"#, r#""epoch":3.0"#, ""),
        (r#""epoch":3"#, r#""epoch":3e0"#, ""),
        (r#""lease":7"#, r#""lease":-0"#, ""),
        (r#""lease":7"#, r#""lease":"7""#, ""),
        (r#""attempts":10"#, r#""attempts":010"#, ""),
        (r#""attempts":10"#, r#""attempts":18446744073709551616"#, ""),
        // null, an unknown field, an array for the slice.
        (r#""attempts":10"#, r#""attempts":null"#, "attempts"),
        (r#""epoch":3"#, r#""epoch":3,"bogus":1"#, "bogus"),
        (r#""event":"grant""#, r#""event":"steal""#, ""),
        (r#""scope_kind":"run""#, r#""scope_kind":"planet""#, ""),
    ];
    for (from, to, named) in cases {
        let text = GRANT.replacen(from, to, 1);
        assert_ne!(text, GRANT, "{from}");
        let why = refused(&text);
        assert!(why.contains(named), "{text}: {why}");
    }
    let array = r#"{"run":"","kind":"lease","lease":7,"slice":["grant","host-a",3]}"#;
    assert!(refused(array).contains("slice"));
    // Stored bytes in another order than the canonical one are refused as stored,
    // though they parse as input.
    let reordered = GRANT.replacen(
        r#""event":"grant","holder":"host-a","#,
        r#""holder":"host-a","event":"grant","#,
        1,
    );
    stored(&reordered).expect("valid as input");
    let canonical = stored(GRANT).unwrap();
    assert_eq!(canonical, GRANT.as_bytes());
    assert!(Decision::from_stored(reordered.as_bytes()).is_err());
    assert!(Decision::from_stored(&canonical).is_ok());
}

#[test]
fn the_rules_of_a_slice_are_held() {
    let cases = [
        // Bounds nothing.
        (r#""attempts":10,"#, "", "at least one"),
        // Expires at its grant.
        (
            r#""expires_at_ms":2000"#,
            r#""expires_at_ms":1000"#,
            "expires",
        ),
        (r#""holder":"host-a""#, r#""holder":"""#, "slice.holder"),
        // A grant saying what it used, or when it closed.
        (
            r#""expires_at_ms":2000"#,
            r#""expires_at_ms":2000,"used_attempts":1"#,
            "used_attempts",
        ),
        (
            r#""expires_at_ms":2000"#,
            r#""expires_at_ms":2000,"closed_at_ms":1500"#,
            "closed_at_ms",
        ),
        // A return without its time, using a dimension it does not bound, closed
        // before its grant.
        (r#""event":"grant""#, r#""event":"return""#, "closed_at_ms"),
        (
            r#""event":"grant","#,
            r#""event":"return","#,
            "closed_at_ms",
        ),
        // Belongs to no run; carries no run's fields.
        (r#""run":"""#, r#""run":"r1""#, "run"),
        (
            r#""lease":7,"#,
            r#""lease":7,"reason":"budget_exceeded","#,
            "reason",
        ),
        (r#""lease":7,"#, "", "lease"),
    ];
    for (from, to, named) in cases {
        let text = GRANT.replacen(from, to, 1);
        assert_ne!(text, GRANT, "{from}");
        let why = refused(&text);
        assert!(why.contains(named), "{text}: {why}");
    }
    let ret = |tail: &str| {
        GRANT
            .replacen(r#""event":"grant""#, r#""event":"return""#, 1)
            .replacen(
                r#""expires_at_ms":2000"#,
                &format!(r#""expires_at_ms":2000,{tail}"#),
                1,
            )
    };
    stored(&ret(r#""closed_at_ms":1500,"used_attempts":10"#)).expect("a return within");
    for (tail, named) in [
        (r#""closed_at_ms":1500,"used_nanos":1"#, "used_nanos"),
        (r#""closed_at_ms":999"#, "closed_at_ms"),
    ] {
        let why = refused(&ret(tail));
        assert!(why.contains(named), "{tail}: {why}");
    }
    // A slice on a record of another kind, a lease id on a start.
    let on_allow = GRANT.replacen(
        r#""run":"","kind":"lease","lease":7,"#,
        r#""run":"r1","kind":"allow","tool":"t","#,
        1,
    );
    let why = refused(&on_allow);
    assert!(why.contains("slice"), "{why}");
    let why = refused(r#"{"run":"r1","kind":"start","lease":7}"#);
    assert!(why.contains("lease"), "{why}");
}

#[test]
fn decisions_name_their_lease_and_old_records_encode_as_before() {
    for kind in [
        r#"{"run":"r1","kind":"allow","tool":"t","attempt":1,"lease":7}"#,
        r#"{"run":"r1","kind":"deny","tool":"t","reason":"attempts_exhausted","lease":7}"#,
        r#"{"run":"r1","kind":"outcome","attempt":1,"status":"ok","settled_nanos":5,"lease":7}"#,
        r#"{"run":"r1","kind":"refund","of":1,"lease":7}"#,
    ] {
        let bytes = stored(kind).unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_eq!(String::from_utf8(bytes).unwrap(), kind);
        let d = Decision::from_json(kind).unwrap();
        assert_eq!(d.lease, Some(7));
    }
    let old = r#"{"run":"r1","kind":"allow","tool":"t","attempt":1}"#;
    assert_eq!(stored(old).unwrap(), old.as_bytes());
}

/// A holder that overspent its slice records its return truthfully: the record says
/// more used than the bound (only u64 bounds it), and `tally verify` reports the
/// overspending (`lease_overspent`), never the record.
#[test]
fn a_return_saying_more_used_than_its_bound_is_recorded_as_said() {
    let ret = GRANT
        .replacen(r#""event":"grant""#, r#""event":"return""#, 1)
        .replacen(
            r#""expires_at_ms":2000"#,
            r#""expires_at_ms":2000,"closed_at_ms":1500,"used_attempts":18446744073709551615"#,
            1,
        );
    let bytes = stored(&ret).unwrap_or_else(|e| panic!("{ret}: {e}"));
    assert_eq!(String::from_utf8(bytes).unwrap(), ret);
    let d = Decision::from_json(&ret).unwrap();
    assert_eq!(d.slice.expect("a slice").used().attempts, Some(u64::MAX));
    let eleven = ret.replacen("18446744073709551615", "11", 1);
    stored(&eleven).unwrap_or_else(|e| panic!("{eleven}: {e}"));
    // Past u64 it is still refused, as any amount is.
    let past = ret.replacen("18446744073709551615", "18446744073709551616", 1);
    assert!(!refused(&past).is_empty(), "{past}");
}
