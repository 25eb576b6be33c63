//! The reader's one promise: whatever it accepts, serde_json reads as an equal
//! decision and re-encodes to the very same bytes. Checked on random decisions
//! (it must also accept all of them) and on random damage to their encodings.

use proptest::prelude::*;

use super::*;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9._:-]{0,12}",
        // Any characters: quotes, backslashes, controls, non-ASCII.
        prop::collection::vec(any::<char>(), 0..10).prop_map(|v| v.into_iter().collect()),
        prop::collection::vec(
            prop::sample::select(vec![
                '"', '\\', '\u{0}', '\u{8}', '\u{1f}', '\u{7f}', 'é', '/'
            ]),
            0..6
        )
        .prop_map(|v| v.into_iter().collect()),
    ]
}

fn num() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0), 0..1000u64, any::<u64>()]
}

fn o<T: std::fmt::Debug>(s: impl Strategy<Value = T>) -> impl Strategy<Value = Option<T>> {
    proptest::option::of(s)
}

fn budget() -> impl Strategy<Value = Budget> {
    (
        o(num()),
        o(num()),
        o(num()),
        o(num()),
        o(num()),
        o(num()),
        o(num()),
    )
        .prop_map(
            |(attempts, deadline_ms, spend_cents, spend_nanos, side_effects, polls, depth)| {
                Budget {
                    attempts,
                    deadline_ms,
                    spend_cents,
                    spend_nanos,
                    side_effects,
                    polls,
                    depth,
                }
            },
        )
}

fn scope() -> impl Strategy<Value = Scope> {
    (
        o(num()),
        o(num()),
        o(num()),
        o(text()),
        o(text()),
        o(text()),
    )
        .prop_map(|(attempts, cents, nanos, tool, operation, new_run)| Scope {
            attempts,
            cents,
            nanos,
            tool,
            operation,
            new_run,
        })
}

fn limits() -> impl Strategy<Value = BTreeMap<LimitKey, Limit>> {
    prop::collection::btree_map(
        text().prop_map(|name| LimitKey::from_name(&name)),
        (num(), num()).prop_map(|(used, limit)| Limit { used, limit }),
        0..4,
    )
}

fn usage() -> impl Strategy<Value = Usage> {
    (o(num()), o(num()), o(num()), o(num()), o(num()), o(num())).prop_map(|u| Usage {
        input_tokens: u.0,
        cached_tokens: u.1,
        cache_write_tokens: u.2,
        cache_write_1h_tokens: u.3,
        output_tokens: u.4,
        web_searches: u.5,
    })
}

/// One of an enum's values.
fn one<T: Clone + std::fmt::Debug + 'static>(values: &[T]) -> impl Strategy<Value = T> {
    prop::sample::select(values.to_vec())
}

/// Any decision of any kind, each field present or not, valid or not: what the
/// reader must read back from its canonical encoding. Built in parts by what the
/// fields are about, each part setting its own on the decision before it.
fn decision() -> BoxedStrategy<Decision> {
    rest(outcome(call_use(call(start(head())))))
}

/// Whose record it is: run, kind, writer and ledger links.
fn head() -> BoxedStrategy<Decision> {
    (
        text(),
        one(Kind::ALL),
        o(text()),
        o(num()),
        o(any::<u32>()),
        o(num()),
        o(num()),
        o(text()),
    )
        .prop_map(
            |(run, kind, worker, at_ms, uid, state_version, prev_seq, policy)| Decision {
                run,
                kind: Some(kind),
                worker,
                at_ms,
                uid,
                state_version,
                prev_seq,
                policy,
                ..Decision::default()
            },
        )
        .boxed()
}

/// A start's fields.
fn start(d: BoxedStrategy<Decision>) -> BoxedStrategy<Decision> {
    (d, o(text()), o(budget()), o(text()), o(text()), o(text()))
        .prop_map(|(mut d, goal, budget, parent, credential, continues)| {
            d.goal = goal;
            d.budget = budget.map(Box::new);
            d.parent = parent;
            d.credential = credential;
            d.continues = continues;
            d
        })
        .boxed()
}

/// What a call is: tool, operation, arguments and where it goes.
fn call(d: BoxedStrategy<Decision>) -> BoxedStrategy<Decision> {
    let effects = [
        Effect::Read,
        Effect::IdempotentWrite,
        Effect::NonIdempotentWrite,
    ];
    let channels = [Channel::Http, Channel::Ssh, Channel::Tool, Channel::Model];
    (
        d,
        (o(text()), o(text()), o(text()), o(text())),
        o(one(&effects)),
        o(text()),
        o(text()),
        o(one(&channels)),
        o(num()),
        o(text()),
    )
        .prop_map(
            |(mut d, texts, effect, key, target, channel, depth, trace)| {
                (d.tool, d.operation, d.args_digest, d.args_preview) = texts;
                d.effect = effect;
                d.idempotency_key = key;
                d.target = target;
                d.channel = channel;
                d.depth = depth;
                d.trace_id = trace;
                d
            },
        )
        .boxed()
}

/// What a call uses and why it was decided: attempt, reservation, limits, reason.
fn call_use(d: BoxedStrategy<Decision>) -> BoxedStrategy<Decision> {
    (
        d,
        o(one(Reason::ALL)),
        o(num()),
        (o(num()), o(num())),
        o(text()),
        o(limits()),
        o(num()),
        o(text()),
        o(any::<bool>()),
    )
        .prop_map(
            |(mut d, reason, attempt, reserve, remote_ref, limits, timeout, grant, proxied)| {
                d.reason = reason;
                d.attempt = attempt;
                (d.reserve_cents, d.reserve_nanos) = reserve;
                d.remote_ref = remote_ref;
                d.limits = limits;
                d.timeout_ms = timeout;
                d.grant = grant;
                d.proxied = proxied;
                d
            },
        )
        .boxed()
}

/// An outcome's fields.
fn outcome(d: BoxedStrategy<Decision>) -> BoxedStrategy<Decision> {
    let statuses = [
        Status::Ok,
        Status::Error,
        Status::Rejected,
        Status::Timeout,
        Status::Running,
        Status::Unknown,
    ];
    let refused = [UsageRefused::Implausible, UsageRefused::Unpriced];
    (
        d,
        o(one(&statuses)),
        (o(num()), o(num())),
        (o(text()), o(num()), o(text())),
        o(num()),
        o(any::<bool>()),
        o(one(&refused)),
        o(usage()),
    )
        .prop_map(
            |(mut d, status, settled, seen, overrun, operator, usage_refused, usage)| {
                d.status = status;
                (d.settled_cents, d.settled_nanos) = settled;
                (d.observed, d.retry_after_ms, d.result_digest) = seen;
                d.overrun_nanos = overrun;
                d.operator = operator;
                d.usage_refused = usage_refused;
                d.usage = usage.map(Box::new);
                d
            },
        )
        .boxed()
}

/// The fields of a refund, an override, a stop's note and a policy record.
fn rest(d: BoxedStrategy<Decision>) -> BoxedStrategy<Decision> {
    (
        d,
        (o(num()), o(num()), o(num()), o(num())),
        (o(text()), o(scope()), o(text()), o(num())),
        o(text()),
        o(text()),
        o(text()),
    )
        .prop_map(|(mut d, refund, approval, signature, note, policy_text)| {
            (d.of, d.slots, d.cents, d.nanos) = refund;
            let scope;
            (d.approver, scope, d.digest, d.expires_ms) = approval;
            d.scope = scope.map(Box::new);
            d.signature = signature;
            d.note = note;
            d.policy_text = policy_text;
            d
        })
        .boxed()
}

/// If the reader accepts `bytes`, serde_json must read the same decision from them,
/// and that decision's canonical encoding must be `bytes` itself.
fn sound(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Some(d) = parse(bytes) {
        let general: Decision = serde_json::from_slice(bytes).map_err(|e| {
            TestCaseError::fail(format!("accepted, serde refuses ({e}): {bytes:?}"))
        })?;
        prop_assert_eq!(&general, &d);
        prop_assert_eq!(serde_json::to_vec(&d).unwrap(), bytes.to_vec());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn reads_every_canonical_encoding(d in decision()) {
        let bytes = serde_json::to_vec(&d).unwrap();
        prop_assert_eq!(parse(&bytes), Some(d));
    }

    #[test]
    fn accepts_nothing_serde_would_read_differently(
        d in decision(),
        edits in prop::collection::vec(
            (any::<prop::sample::Index>(), 0u8..4, prop::sample::select(
                b" \"\\,:{}[]0123456789eE.-+uabfnrtxyz\x00\x1f\x7f".to_vec())),
            1..4,
        ),
    ) {
        let mut bytes = serde_json::to_vec(&d).unwrap();
        for (at, op, b) in edits {
            let i = at.index(bytes.len() + 1);
            match op {
                0 => bytes.insert(i, b),
                1 if i < bytes.len() => { bytes.remove(i); }
                2 if i < bytes.len() => bytes[i] = b,
                3 if i < bytes.len() => bytes[i] ^= 1 << (b % 8),
                _ => {}
            }
        }
        sound(&bytes)?;
    }
}

#[test]
fn every_single_byte_edit_of_a_full_decision() {
    let d = Decision::from_json(
        r#"{"run":"r\"\\\n\u0001é","kind":"override","worker":"w","at_ms":0,"approver":"a","scope":{"attempts":3,"cents":10,"tool":"t","operation":"o"},"digest":"00","expires_ms":18446744073709551615,"note":"n","limits":{"a":{"used":0,"limit":1},"b":{"used":2,"limit":3}}}"#,
    )
    .unwrap();
    let bytes = serde_json::to_vec(&d).unwrap();
    assert_eq!(parse(&bytes), Some(d));
    for i in 0..=bytes.len() {
        if i < bytes.len() {
            let mut cut = bytes.clone();
            cut.remove(i);
            sound(&cut).unwrap();
            for b in 0..=255u8 {
                let mut m = bytes.clone();
                m[i] = b;
                sound(&m).unwrap();
            }
        }
        for b in [b' ', b'0', b',', b'"', b'\\', b'}', b'{'] {
            let mut m = bytes.clone();
            m.insert(i, b);
            sound(&m).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// `Decision::from_stored_boxed` reads what `Decision::from_stored` reads: the same
    /// decision or the same refusal, also when a damaged byte sends it from the reader,
    /// half-way through a decision read in place, to the general parse.
    #[test]
    fn boxed_reads_what_unboxed_reads(
        d in decision(),
        at in any::<prop::sample::Index>(),
        b in any::<u8>(),
    ) {
        let bytes = serde_json::to_vec(&d).unwrap();
        let mut damaged = bytes.clone();
        damaged[at.index(bytes.len())] = b;
        for x in [&bytes, &damaged] {
            prop_assert_eq!(
                Decision::from_stored_boxed(x).map(|d| *d),
                Decision::from_stored(x)
            );
        }
    }
}

/// Texts around each bound: the boxed read (which skips the bounds when no text can
/// exceed one) refuses and accepts exactly what the full validation does.
#[test]
fn boxed_reads_refuse_texts_beyond_their_bounds() {
    use crate::decision::{MAX_POLICY_BYTES, MAX_PREVIEW_BYTES, MAX_TEXT_BYTES};
    use crate::error::DecisionError;
    let allow = |preview: usize, tool: usize| Decision {
        run: "r".into(),
        kind: Some(Kind::Allow),
        tool: Some("t".repeat(tool)),
        args_preview: Some("p".repeat(preview)),
        effect: Some(Effect::Read),
        attempt: Some(1),
        ..Decision::default()
    };
    let policy = |len: usize| {
        let text = "x".repeat(len);
        Decision {
            kind: Some(Kind::Policy),
            policy: Some(crate::decision::policy_digest(&text)),
            policy_text: Some(text),
            ..Decision::default()
        }
    };
    let p = MAX_PREVIEW_BYTES;
    let cases = [
        allow(p, 1),
        allow(p + 1, 1),
        allow(1, p + 1),
        allow(1, MAX_TEXT_BYTES),
        allow(1, MAX_TEXT_BYTES + 1),
        policy(MAX_POLICY_BYTES),
        policy(MAX_POLICY_BYTES + 1),
    ];
    let mut refused = 0;
    for d in cases {
        let bytes = serde_json::to_vec(&d).unwrap();
        let boxed = Decision::from_stored_boxed(&bytes).map(|d| *d);
        assert_eq!(boxed, Decision::from_stored(&bytes));
        if let Err(e) = boxed {
            assert!(matches!(e, DecisionError::TooLong { .. }), "{e}");
            refused += 1;
        }
    }
    assert_eq!(refused, 3);
}
