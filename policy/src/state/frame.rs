//! How a backend stores state values: one format byte, then postcard of the state type.
//! The embedded gate and gate-postgres both use it, so they read the same formats.
//!
//! * 5 (written now, for a run holding a denied call): format 4 and the run's denied
//!   calls, its last field.
//! * 4 (written now, for a run holding a continuation grant and no denied call): format
//!   3 and the run's continuation grants. Read as format 5 with no denied call appended
//!   ([`Stored::FORMAT_4_TAIL`]).
//! * 3 (written now for every other value): money in nanodollars; a run's proxied
//!   attempts. Read as format 5 with no continuation grant and no denied call appended
//!   ([`Stored::FORMAT_3_TAIL`]).
//! * 2 (written before money was counted in nanodollars): the same fields, every amount
//!   in cents; read exactly, each amount times 10,000,000 (a value that would not fit is
//!   refused, never wrapped), so a gate upgraded in place keeps its open runs' budgets.
//!   A run's state then ended before its last field, `proxied` (no attempt was made
//!   through the proxy): the value is read with that field empty ([`Stored::FORMAT_2_TAIL`]).
//! * 1: refused with its cause (a field read at the wrong place would be a wrong budget).

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{CredentialState, PrincipalState, RunState, ToolState};

/// The format byte of state written now with fields added since format 4 in use.
pub const STATE_FORMAT: u8 = 5;

/// The format byte of state written now with fields added since format 3 in use, but
/// none added since format 4: the bytes of format 4.
const FORMAT_4: u8 = 4;

/// The format byte of state written now without them: the bytes of format 3.
const FORMAT_3: u8 = 3;

/// A state type a backend stores, and how to read it from a format-2 value (in cents).
pub trait Stored: Serialize + DeserializeOwned {
    /// The postcard bytes of the fields added at the end of the type since format 2,
    /// at their empty values: appended to a format-2 value before it is read.
    const FORMAT_2_TAIL: &'static [u8] = &[];

    /// The postcard bytes of the fields added at the end of the type since format 3,
    /// at their empty values: cut from a value written as format 3, appended to one read.
    const FORMAT_3_TAIL: &'static [u8] = &[];

    /// The postcard bytes of the fields added at the end of the type since format 4,
    /// at their empty values: cut from a value written as format 4, appended to one read.
    const FORMAT_4_TAIL: &'static [u8] = &[];

    /// Whether the fields added since format 3 are empty (the value is written as
    /// format 3, byte for byte as before them).
    fn format_3(&self) -> bool {
        true
    }

    /// Whether the fields added since format 4 are empty (the value is written as
    /// format 4, byte for byte as before them).
    fn format_4(&self) -> bool {
        true
    }

    /// The value as kept in cents (format 2), in nanodollars; `None` if an amount
    /// does not fit.
    fn into_nanos(self) -> Option<Self>;
}

impl Stored for RunState {
    // `proxied`, an empty set of attempt ranges, then no continuation grant and no denied
    // call: zero lengths.
    const FORMAT_2_TAIL: &'static [u8] = &[0, 0, 0];
    // `continuations` and `denied`, none: zero lengths.
    const FORMAT_3_TAIL: &'static [u8] = &[0, 0];
    // `denied`, none: a zero length.
    const FORMAT_4_TAIL: &'static [u8] = &[0];

    fn format_3(&self) -> bool {
        self.continuations.is_empty() && self.denied.is_empty()
    }

    fn format_4(&self) -> bool {
        self.denied.is_empty()
    }

    fn into_nanos(self) -> Option<Self> {
        RunState::into_nanos(self)
    }
}

impl Stored for CredentialState {
    fn into_nanos(self) -> Option<Self> {
        CredentialState::into_nanos(self)
    }
}

impl Stored for PrincipalState {
    // Principal budgets came with format 3: a format-2 value of one was never written.
    fn into_nanos(self) -> Option<Self> {
        None
    }
}

impl Stored for ToolState {
    // A tool's state counts calls, never money.
    fn into_nanos(self) -> Option<Self> {
        Some(self)
    }
}

impl Stored for BTreeMap<u64, u64> {
    // A tool's calls in flight: call ids and deadlines.
    fn into_nanos(self) -> Option<Self> {
        Some(self)
    }
}

/// A state value as stored.
pub fn encode<T: Stored>(v: &T) -> Vec<u8> {
    // Structs of numbers, strings, options and maps always serialize.
    let bytes = postcard::to_allocvec(v).unwrap_or_default();
    if v.format_3() {
        if let Some(old) = bytes.strip_suffix(T::FORMAT_3_TAIL) {
            return [&[FORMAT_3], old].concat();
        }
    }
    if v.format_4() {
        if let Some(old) = bytes.strip_suffix(T::FORMAT_4_TAIL) {
            return [&[FORMAT_4], old].concat();
        }
    }
    [&[STATE_FORMAT], &bytes[..]].concat()
}

/// A stored state value, or why it cannot be read (words for an operator). Formats 3
/// to 5 are read strictly: the bytes must be exactly what [`encode`] writes for the
/// value they hold (nothing after it, and the one format its fields call for).
pub fn decode<T: Stored>(bytes: &[u8]) -> Result<T, String> {
    let v = read::<T>(bytes)?;
    // Format 2 is converted to nanodollars as it is read: it has no one form to match.
    if bytes.first() == Some(&2) || encode(&v) == bytes {
        Ok(v)
    } else {
        Err(
            "it is not in the one form this tally writes for it (bytes after the value, or \
             a format that does not match the fields it holds): the state store was \
             written by something else; rebuild it from the ledger"
                .into(),
        )
    }
}

/// A stored state value as its format says, or why it cannot be read.
fn read<T: Stored>(bytes: &[u8]) -> Result<T, String> {
    match bytes.split_first() {
        Some((&STATE_FORMAT, rest)) => postcard::from_bytes(rest).map_err(|e| e.to_string()),
        Some((&FORMAT_4, rest)) => {
            postcard::from_bytes(&[rest, T::FORMAT_4_TAIL].concat()).map_err(|e| e.to_string())
        }
        Some((&FORMAT_3, rest)) => {
            postcard::from_bytes(&[rest, T::FORMAT_3_TAIL].concat()).map_err(|e| e.to_string())
        }
        Some((2, rest)) => postcard::from_bytes::<T>(&[rest, T::FORMAT_2_TAIL].concat())
            .map_err(|e| e.to_string())?
            .into_nanos()
            .ok_or_else(|| {
                "it was written in cents (state format 2) and an amount does not fit in \
                 nanodollars"
                    .to_owned()
            }),
        Some((1, _)) => Err(
            "it was written by an older tally (state format 1; this one reads 2, 3 and 4): \
             finish or stop its runs with that version, or serve a new ledger"
                .into(),
        ),
        Some((other, _)) => Err(format!(
            "unknown state format {other} (this tally reads 2 to 5): was it written by a \
             newer tally?"
        )),
        None => Err("empty".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_record::decision::Scope;

    /// A format-2 value: what the gate wrote before nanodollars (the same layout, less
    /// the fields added at the end since).
    fn format_2<T: Stored>(v: &T) -> Vec<u8> {
        let now = postcard::to_allocvec(v).unwrap();
        let old = now
            .strip_suffix(T::FORMAT_2_TAIL)
            .expect("the new fields are empty");
        [&[2], old].concat()
    }

    #[test]
    fn a_run_without_a_continuation_grant_is_written_as_format_3() {
        let mut run = RunState::new("r");
        run.budget.attempts = Some(3);
        let bytes = encode(&run);
        assert_eq!(bytes[0], 3);
        assert_eq!(
            &bytes[1..],
            postcard::to_allocvec(&run)
                .unwrap()
                .strip_suffix(&[0, 0])
                .unwrap()
        );
        assert_eq!(decode::<RunState>(&bytes).unwrap(), run);
        run.continuations.push(super::super::Continuation {
            new_run: "r2".into(),
            digest: "d".into(),
            approver: "ana".into(),
        });
        let bytes = encode(&run);
        assert_eq!(bytes[0], 4);
        assert_eq!(decode::<RunState>(&bytes).unwrap(), run);
        // Another type is format 3 as before.
        assert_eq!(encode(&CredentialState::default())[0], 3);
    }

    fn denied(request: &str) -> super::super::Denied {
        super::super::Denied {
            tool: "email.send".into(),
            operation: Some("send:0".into()),
            args_digest: Some("ab".repeat(32)),
            request: request.into(),
            approver: "ana".into(),
            note: "not this one".into(),
        }
    }

    #[test]
    fn a_run_with_a_denied_call_is_written_as_format_5_and_formats_3_and_4_read_on() {
        let mut run = RunState::new("r");
        run.budget.attempts = Some(3);
        let three = encode(&run);
        run.continuations.push(super::super::Continuation {
            new_run: "r2".into(),
            digest: "d".into(),
            approver: "ana".into(),
        });
        let four = encode(&run);
        assert_eq!((three[0], four[0]), (3, 4));
        // Format 4 is format 3's bytes and the continuation grants, as before denials.
        assert_eq!(
            &four[1..],
            postcard::to_allocvec(&run)
                .unwrap()
                .strip_suffix(&[0])
                .unwrap()
        );
        run.denied.push(denied("0123456789abcdef"));
        let five = encode(&run);
        assert_eq!(five[0], STATE_FORMAT);
        assert_eq!(decode::<RunState>(&five).unwrap(), run);
        // A denial without a continuation grant is format 5 too.
        run.continuations.clear();
        run.denied.push(denied("fedcba9876543210"));
        let five = encode(&run);
        assert_eq!(five[0], 5);
        assert_eq!(decode::<RunState>(&five).unwrap(), run);
        // States written before denials read with none.
        let old: RunState = decode(&three).unwrap();
        assert!(old.denied.is_empty() && old.continuations.is_empty());
        let old: RunState = decode(&four).unwrap();
        assert!(old.denied.is_empty() && old.continuations.len() == 1);
        assert_eq!(old.budget.attempts, Some(3));
    }

    /// The one stored form: a trailing byte, a format-5 label on a run with no denial,
    /// and a format-4 label on one that holds a denial are each refused.
    #[test]
    fn a_state_is_read_only_in_the_form_it_is_written() {
        let mut run = RunState::new("r");
        run.budget.attempts = Some(3);
        let three = encode(&run);
        assert!(decode::<RunState>(&[&three[..], &[0]].concat()).is_err());
        let mut five = vec![STATE_FORMAT];
        five.extend(postcard::to_allocvec(&run).unwrap());
        assert!(
            decode::<RunState>(&five).is_err(),
            "format 5 with no denial"
        );
        run.denied.push(denied("0123456789abcdef"));
        // Its full bytes under the format-4 label: postcard alone would read them (the
        // tail format 4 appends is left over), and the denial with them.
        let mut four = vec![FORMAT_4];
        four.extend(postcard::to_allocvec(&run).unwrap());
        assert!(
            decode::<RunState>(&four).is_err(),
            "format 4 holding a denial"
        );
        assert_eq!(decode::<RunState>(&encode(&run)).unwrap(), run);
    }

    #[test]
    fn state_kept_in_cents_reads_exactly_in_nanos() {
        let mut cents = RunState::new("r");
        cents.budget.spend_nanos = Some(500); // format 2 kept spend_cents in this slot
        cents.settled_nanos = 120;
        cents.held_nanos = 30;
        cents.overrun_nanos = 2;
        cents.extra_nanos = 50;
        cents.delegated_nanos = 100;
        cents.open.insert(
            1,
            super::super::Attempt {
                tool: None,
                op: 0,
                effect: None,
                reserved: 30,
                held: 30,
                counted: true,
                write: false,
                poll: None,
                settled: false,
                status: None,
                registered: None,
            },
        );
        cents.grants.push(super::super::Grant {
            digest: "d".into(),
            approver: "a".into(),
            scope: Scope {
                nanos: Some(50),
                ..Scope::default()
            },
            expires_ms: 1,
            used: true,
        });
        let run: RunState = decode(&format_2(&cents)).unwrap();
        let c = 10_000_000;
        assert_eq!(run.budget.spend_nanos, Some(500 * c));
        assert_eq!(run.spend_limit(), Some((500 + 50 - 100) * c));
        assert_eq!(
            (
                run.settled_nanos,
                run.held_nanos,
                run.overrun_nanos,
                run.spent_nanos()
            ),
            (120 * c, 30 * c, 2 * c, 150 * c)
        );
        assert_eq!((run.open[&1].reserved, run.open[&1].held), (30 * c, 30 * c));
        assert_eq!(run.grants[0].scope.nanos, Some(50 * c));
        assert!(!run.proxied.contains(1));
        // Format 3 reads as written, and round-trips, proxied attempts and all.
        let mut run = run;
        run.proxied.insert(1);
        assert_eq!(decode::<RunState>(&encode(&run)).unwrap(), run);

        let cred = CredentialState {
            spent_nanos: 7,
            ..CredentialState::default()
        };
        let back: CredentialState = decode(&format_2(&cred)).unwrap();
        assert_eq!(back.spent_nanos, 7 * c);

        // Cents that do not fit in nanodollars are refused, never wrapped.
        let mut huge = RunState::new("r");
        huge.settled_nanos = u64::MAX / c + 1;
        let e = decode::<RunState>(&format_2(&huge)).unwrap_err();
        assert!(e.contains("does not fit"), "{e}");
        assert!(decode::<RunState>(&[1, 0])
            .unwrap_err()
            .contains("format 1"));
        assert!(decode::<RunState>(&[6, 0]).unwrap_err().contains("newer"));
    }
}
