//! Decision records: every kind round-trips; every kind of bad input gets its typed error.

use serde_json::json;
use tally_ledger::decision::{args_digest, canonical_json, Reason};
use tally_ledger::{ArgsError, Decision, DecisionError, Kind};

/// One valid decision of each kind, with every field that kind may carry.
pub fn every_kind() -> Vec<Decision> {
    [
        json!({"run":"r1","kind":"start","worker":"w1","at_ms":0,"goal":"export the Q3 report",
               "budget":{"attempts":5,"deadline_ms":60000,"spend_cents":500,"side_effects":2,"polls":10,"depth":3},
               "parent":"r0"}),
        json!({"run":"r1","kind":"allow","worker":"w1","at_ms":10,"tool":"http","operation":"export.create",
               "args":{"url":"https://x.example/export","body":{"q":3}},"args_preview":"POST /export",
               "effect":"non_idempotent_write","idempotency_key":"k1","target":"billing-api","channel":"http",
               "depth":1,"attempt":1,"reserve_cents":25,"limits":{"attempts":{"used":1,"limit":5}}}),
        json!({"run":"r1","kind":"deny","at_ms":20,"tool":"http","operation":"export.create","effect":"read",
               "reason":"upstream_backoff","attempt":2,"retry_after_ms":1000,"limits":{"rate":{"used":10,"limit":10}}}),
        json!({"run":"r1","kind":"outcome","at_ms":30,"attempt":1,"status":"running","settled_cents":20,
               "remote_ref":"ea91","observed":"queued","retry_after_ms":500}),
        json!({"run":"r1","kind":"refund","at_ms":40,"of":2,"slots":1,"cents":5}),
        json!({"run":"r1","kind":"override","at_ms":50,"approver":"alice@example.com",
               "scope":{"attempts":2,"cents":100,"tool":"http","operation":"export.create"},
               "digest":"0000000000000000000000000000000000000000000000000000000000000000",
               "expires_ms":3600000,"note":"one more try"}),
        json!({"run":"r1","kind":"stop","at_ms":60,"reason":"completed","note":"done",
               "limits":{"spend_cents":{"used":45,"limit":500}}}),
    ]
    .into_iter()
    .map(|v| Decision::from_json(&v.to_string()).unwrap())
    .collect()
}

#[test]
fn every_kind_round_trips_canonically() {
    let kinds: Vec<Kind> = every_kind().iter().map(|d| d.kind()).collect();
    assert_eq!(kinds.len(), 7);
    for mut d in every_kind() {
        d.validate().unwrap();
        d.seal_args();
        let stored = d.to_canonical_json();
        let back = Decision::from_stored(&stored).unwrap();
        assert_eq!(back, d, "{}", d.kind());
        assert_eq!(back.to_canonical_json(), stored);
    }
}

#[test]
fn raw_args_never_reach_the_stored_form() {
    let mut d = every_kind().remove(1);
    let digest = d.args.as_ref().unwrap().digest();
    d.seal_args();
    let stored = String::from_utf8(d.to_canonical_json()).unwrap();
    assert!(!stored.contains("x.example"), "{stored}");
    assert!(!stored.contains("\"args\""), "{stored}");
    assert!(stored.contains(&digest));
    let with_args = stored.replacen('{', r#"{"args":{"a":1},"#, 1);
    assert!(matches!(
        Decision::from_stored(with_args.as_bytes()),
        Err(DecisionError::Invalid { field: "args", .. })
    ));
}

#[test]
fn canonical_json_sorts_keys_and_drops_whitespace() {
    let v: serde_json::Value =
        serde_json::from_str(r#"{ "b" : 1, "a" : [1, {"d": 2, "c": "x y"}] }"#).unwrap();
    let mut out = Vec::new();
    canonical_json(&v, &mut out);
    assert_eq!(out, br#"{"a":[1,{"c":"x y","d":2}],"b":1}"#);
    assert_eq!(
        args_digest(&v),
        blake3::hash(br#"{"a":[1,{"c":"x y","d":2}],"b":1}"#)
            .to_hex()
            .to_string()
    );
}

#[test]
fn stored_form_must_be_canonical() {
    let mut d = every_kind().remove(0);
    d.seal_args();
    let stored = String::from_utf8(d.to_canonical_json()).unwrap();
    let spaced = stored.replacen(':', ": ", 1);
    assert_eq!(
        Decision::from_stored(spaced.as_bytes()),
        Err(DecisionError::NotCanonical)
    );
}

fn refused(json: &str) -> DecisionError {
    match Decision::from_json(json) {
        Err(e) => e,
        Ok(d) => d.validate().expect_err(json),
    }
}

#[test]
fn bad_input_gets_a_typed_error_naming_the_field() {
    use DecisionError::*;
    let cases: &[(&str, DecisionError)] = &[
        (r#"{"kind":"start"}"#, Missing { field: "run" }),
        (r#"{"run":"r"}"#, Missing { field: "kind" }),
        (
            r#"{"run":"r","kind":"deny","tool":"t"}"#,
            Missing { field: "reason" },
        ),
        (r#"{"run":"r","kind":"stop"}"#, Missing { field: "reason" }),
        (
            r#"{"run":"r","kind":"outcome"}"#,
            Missing { field: "status" },
        ),
        (r#"{"run":"r","kind":"refund"}"#, Missing { field: "of" }),
        (
            r#"{"run":"r","kind":"start","tool":"t"}"#,
            NotAllowed {
                field: "tool",
                kind: Kind::Start,
            },
        ),
        (
            r#"{"run":"r","kind":"outcome","status":"ok","reserve_cents":1}"#,
            NotAllowed {
                field: "reserve_cents",
                kind: Kind::Outcome,
            },
        ),
        (
            r#"{"run":"r","kind":"allow","goal":"g"}"#,
            NotAllowed {
                field: "goal",
                kind: Kind::Allow,
            },
        ),
        (
            r#"{"run":"r","kind":"allow","note":"n"}"#,
            NotAllowed {
                field: "note",
                kind: Kind::Allow,
            },
        ),
        (
            r#"{"run":"r","kind":"deny","reason":"completed"}"#,
            Invalid {
                field: "reason",
                why: "`completed` is for stop records only",
            },
        ),
        (
            r#"{"run":"r","kind":"override","digest":"ABC"}"#,
            Invalid {
                field: "digest",
                why: "must be 64 lowercase hex characters (a BLAKE3 digest)",
            },
        ),
        (
            r#"{"run":"r","kind":"allow","args":{"a":1},"args_digest":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
            Invalid {
                field: "args_digest",
                why: "does not match the BLAKE3 digest of canonical `args`",
            },
        ),
    ];
    for (json, want) in cases {
        assert_eq!(&refused(json), want, "{json}");
    }
    let long = format!(
        r#"{{"run":"r","kind":"allow","args_preview":"{}"}}"#,
        "x".repeat(257)
    );
    assert_eq!(
        refused(&long),
        TooLong {
            field: "args_preview",
            len: 257,
            max: 256
        }
    );
    let long = format!(r#"{{"run":"{}","kind":"start"}}"#, "x".repeat(1025));
    assert_eq!(
        refused(&long),
        TooLong {
            field: "run",
            len: 1025,
            max: 1024
        }
    );
    assert!(matches!(
        refused(
            r#"{"run":"r","kind":"stop","reason":"completed","limits":{"cpu":{"used":1,"limit":2}}}"#
        ),
        Invalid {
            field: "limits",
            ..
        }
    ));
}

#[test]
fn json_errors_are_strict() {
    for bad in [
        r#"{"run":"r","kind":"start","bogus":1}"#,
        r#"{"run":"r","kind":"start"} trailing"#,
        r#"{"run":"r","kind":"launch"}"#,
        r#"{"run":"r","kind":"start","at_ms":-1}"#,
        r#"{"run":"r","kind":"start","at_ms":"5"}"#,
        r#"{"run":"r","kind":"start","budget":{"attempts":1,"tokens":5}}"#,
        r#"{"run":"r","kind":"deny","reason":"because"}"#,
        r#"[{"run":"r","kind":"start"}]"#,
        r#"["r","start"]"#,
        r#"{"run":"r","kind":"start","budget":[3]}"#,
        r#"{"run":"r","kind":"override","scope":[1,2]}"#,
        r#"{"run":"r","kind":"stop","reason":"completed","limits":{"attempts":[1,2]}}"#,
        "",
    ] {
        assert!(
            matches!(Decision::from_json(bad), Err(DecisionError::Json { .. })),
            "{bad}"
        );
    }
    let e = Decision::from_json(r#"{"run":"r","kind":"start","bogus":1}"#).unwrap_err();
    assert!(e.to_string().contains("unknown field `bogus`"), "{e}");
}

#[test]
fn every_reason_says_what_to_do() {
    // Each code and its action serialize as their names (docs/GATE.md's table lists them:
    // tests/tests/reasons.rs holds it to `Reason::ALL`).
    for r in Reason::ALL {
        assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        let action = r.action();
        assert_eq!(serde_json::to_value(action).unwrap(), action.as_str());
        assert!(!r.meaning().is_empty(), "{r:?}");
    }
}

/// The digest an `allow` with these raw `args` (JSON text) is stored with.
fn digest_of(args: &str) -> String {
    let mut d = Decision::from_json(&format!(
        r#"{{"run":"r","kind":"allow","tool":"t","args":{args}}}"#
    ))
    .unwrap_or_else(|e| panic!("{args}: {e}"));
    d.validate().unwrap();
    d.seal_args();
    d.args_digest.unwrap()
}

// Numbers were rounded to f64 before hashing, so different amounts
// shared one digest (an approval for one is an approval for the other).
#[test]
fn issue_11_different_arguments_never_share_a_digest() {
    for (a, b) in [
        (
            r#"{"amount":18446744073709551616}"#,
            r#"{"amount":18446744073709551617}"#,
        ),
        ("0.1", "0.1000000000000000000001"),
        ("9007199254740993", "9007199254740992"),
        ("-9223372036854775809", "-9223372036854775808"),
        ("1e400", "1e401"),
        ("[1.00000000000000000001]", "[1]"),
    ] {
        assert_ne!(digest_of(a), digest_of(b), "{a} and {b}");
    }
}

// Duplicate keys were last-wins inside `args` and `limits`.
#[test]
fn issue_11_duplicate_keys_are_refused_at_every_depth() {
    let dup = |path: &str, key: &str, column| DecisionError::DuplicateKey {
        path: path.into(),
        key: key.into(),
        line: 1,
        column,
    };
    for (bad, want) in [
        (
            r#"{"run":"r","kind":"allow","args":{"a":1,"a":2}}"#,
            dup("args", "a", 43),
        ),
        (
            r#"{"run":"r","kind":"allow","args":{"x":[{"a":1,"b":0,"a":2}]}}"#,
            dup("args.x[0]", "a", 55),
        ),
        (
            r#"{"run":"r","kind":"allow","args":{"a":1,"\u0061":1}}"#,
            dup("args", "a", 48),
        ),
        (
            r#"{"run":"r","kind":"allow","limits":{"attempts":{"used":1,"limit":5},"attempts":{"used":0,"limit":9}}}"#,
            dup("limits", "attempts", 78),
        ),
        (
            r#"{"run":"r","kind":"allow","limits":{"attempts":{"used":1,"limit":5,"used":0}}}"#,
            dup("limits.attempts", "used", 73),
        ),
        (
            r#"{"run":"r","kind":"start","budget":{"attempts":1,"attempts":9}}"#,
            dup("budget", "attempts", 59),
        ),
        (
            r#"{"run":"r","kind":"start","goal":"a","goal":"b"}"#,
            dup("", "goal", 43),
        ),
        (
            r#"{"run":"r","kind":"start","run":"again"}"#,
            dup("", "run", 31),
        ),
    ] {
        assert_eq!(Decision::from_json(bad), Err(want), "{bad}");
    }
    let e = Decision::from_json(
        "{\"run\":\"r\",\n\"kind\":\"allow\",\n\"args\":{\"id\":1,\n\"id\":2}}",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "duplicate key `id` in `args` at line 4 column 4: each key may appear once per object; remove one of them"
    );
}

// `"goal": null` was read as absent; a null is never an absent field.
#[test]
fn issue_11_null_is_not_an_absent_field() {
    let null = |field: &str, column| DecisionError::Null {
        field: field.into(),
        line: 1,
        column,
    };
    for (bad, want) in [
        (
            r#"{"run":"r","kind":"start","goal":null}"#,
            null("goal", 37),
        ),
        (
            r#"{"run":"r","kind":"start","budget":null}"#,
            null("budget", 39),
        ),
        (
            r#"{"run":"r","kind":"start","budget":{"attempts":null}}"#,
            null("budget.attempts", 51),
        ),
        (
            r#"{"run":"r","kind":"allow","args":null}"#,
            null("args", 37),
        ),
        (
            r#"{"run":"r","kind":"allow","limits":null}"#,
            null("limits", 39),
        ),
        (
            r#"{"run":"r","kind":"override","scope":{"tool":null}}"#,
            null("scope.tool", 49),
        ),
        (
            r#"{"run":"r","kind":"allow","worker":null,"tool":"t"}"#,
            null("worker", 39),
        ),
        (r#"{"run":null,"kind":"start"}"#, null("run", 11)),
        (r#"{"run":"r","kind":null}"#, null("kind", 22)),
    ] {
        assert_eq!(Decision::from_json(bad), Err(want), "{bad}");
    }
    // Inside `args` a null is a value like any other.
    assert_ne!(digest_of(r#"{"a":null}"#), digest_of("{}"));
    assert_ne!(digest_of("[null]"), digest_of("[]"));
}

// A line holding only U+00A0 was skipped as blank.
#[test]
fn issue_11_only_json_whitespace_is_whitespace() {
    use tally_ledger::decision::is_blank_line;
    assert!(is_blank_line(" \t\r"));
    assert!(is_blank_line(""));
    for line in ["\u{a0}", " \u{2003} ", "\u{b}", "\u{c}", "\u{feff}"] {
        assert!(!is_blank_line(line), "{line:?}");
    }
    assert_eq!(
        Decision::from_json("\u{a0}"),
        Err(DecisionError::NotJsonWhitespace {
            found: '\u{a0}',
            line: 1,
            column: 1
        })
    );
    assert_eq!(
        Decision::from_json("{\"run\":\"r\",\u{2003}\"kind\":\"start\"}"),
        Err(DecisionError::NotJsonWhitespace {
            found: '\u{2003}',
            line: 1,
            column: 12
        })
    );
    // Inside a string it is text like any other.
    let d = Decision::from_json("{\"run\":\"r\u{a0}\",\"kind\":\"start\"}").unwrap();
    assert_eq!(d.run, "r\u{a0}");
    let e = Decision::from_json(" \u{a0}{}").unwrap_err();
    assert_eq!(
        e.to_string(),
        "U+00A0 at line 1 column 2 is not JSON whitespace (JSON allows only space, tab, LF and CR between values): remove it"
    );
}

// What the digest is a function of, and the same value written two
// ways.
#[test]
fn issue_11_one_value_one_digest() {
    for (a, b) in [
        ("1", "1.0"),
        ("100", "1e2"),
        ("-0", "0"),
        (r#""\u00e9""#, r#""é""#),
        (r#"{"b":1,"a":2}"#, r#"{ "a" : 2 , "b" : 1 }"#),
    ] {
        assert_eq!(digest_of(a), digest_of(b), "{a} and {b}");
    }
    // Arguments built in code digest as the same arguments sent as text.
    let v = json!({"url": "https://x.example", "n": [1, -2, 0.5, 1e300, u64::MAX]});
    assert_eq!(args_digest(&v), digest_of(&v.to_string()));
    assert!(matches!(
        Decision::from_json(r#"{"run":"r","kind":"allow","args":[1e9999999999999999999]}"#),
        Err(DecisionError::Args(ArgsError::ExponentOutOfRange { .. }))
    ));
}

/// A decision's trace id is a W3C trace-id, strictly, and only on checks.
#[test]
fn issue_23_trace_ids_are_strict() {
    let with = |kind: &str, id: &str| {
        let extra = if kind == "deny" {
            r#","reason":"loop_repeated_call""#
        } else {
            ""
        };
        Decision::from_json(&format!(
            r#"{{"run":"r","kind":"{kind}","tool":"t","trace_id":"{id}"{extra}}}"#
        ))
        .and_then(|d| d.validate().map(|()| d))
    };
    let good = "4bf92f3577b34da6a3ce929d0e0e4736";
    for kind in ["allow", "deny"] {
        assert_eq!(with(kind, good).unwrap().trace_id.as_deref(), Some(good));
    }
    for bad in [
        "4BF92F3577B34DA6A3CE929D0E0E4736",
        "4bf92f3577b34da6a3ce929d0e0e473",
        "4bf92f3577b34da6a3ce929d0e0e47360",
        "00000000000000000000000000000000",
        "4bf92f3577b34da6a3ce929d0e0e473g",
        "4bf92f35-7b34da6a3ce929d0e0e4736",
        "",
    ] {
        assert!(
            matches!(
                with("allow", bad),
                Err(DecisionError::Invalid {
                    field: "trace_id",
                    ..
                })
            ),
            "{bad:?}"
        );
    }
    // Not on a start, an outcome or a stop.
    let start = Decision::from_json(&format!(
        r#"{{"run":"r","kind":"start","trace_id":"{good}"}}"#
    ))
    .unwrap();
    assert!(matches!(
        start.validate(),
        Err(DecisionError::NotAllowed {
            field: "trace_id",
            ..
        })
    ));
}
