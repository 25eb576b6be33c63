//! How a backend stores state values: one format byte, then postcard of the state type.
//! The embedded gate and gate-postgres both use it, so they read the same formats.
//!
//! * 3 (written now): money in nanodollars; a run's proxied attempts.
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

/// The format byte of state written now.
pub const STATE_FORMAT: u8 = 3;

/// A state type a backend stores, and how to read it from a format-2 value (in cents).
pub trait Stored: Serialize + DeserializeOwned {
    /// The postcard bytes of the fields added at the end of the type since format 2,
    /// at their empty values: appended to a format-2 value before it is read.
    const FORMAT_2_TAIL: &'static [u8] = &[];

    /// The value as kept in cents (format 2), in nanodollars; `None` if an amount
    /// does not fit.
    fn into_nanos(self) -> Option<Self>;
}

impl Stored for RunState {
    // `proxied`, an empty set of attempt ranges: a zero length.
    const FORMAT_2_TAIL: &'static [u8] = &[0];

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
    let mut out = vec![STATE_FORMAT];
    // Structs of numbers, strings, options and maps always serialize.
    out.extend(postcard::to_allocvec(v).unwrap_or_default());
    out
}

/// A stored state value, or why it cannot be read (words for an operator).
pub fn decode<T: Stored>(bytes: &[u8]) -> Result<T, String> {
    match bytes.split_first() {
        Some((&STATE_FORMAT, rest)) => postcard::from_bytes(rest).map_err(|e| e.to_string()),
        Some((2, rest)) => postcard::from_bytes::<T>(&[rest, T::FORMAT_2_TAIL].concat())
            .map_err(|e| e.to_string())?
            .into_nanos()
            .ok_or_else(|| {
                "it was written in cents (state format 2) and an amount does not fit in \
                 nanodollars"
                    .to_owned()
            }),
        Some((1, _)) => Err(
            "it was written by an older tally (state format 1; this one reads 2 and 3): \
             finish or stop its runs with that version, or serve a new ledger"
                .into(),
        ),
        Some((other, _)) => Err(format!(
            "unknown state format {other} (this tally reads 2 and 3): was it written by a \
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
        assert!(decode::<RunState>(&[4, 0]).unwrap_err().contains("newer"));
    }
}
