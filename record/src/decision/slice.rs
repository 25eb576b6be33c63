//! A leased slice of a budget, as a `lease` record carries it (docs/FORMAT.md, "Leases"):
//! one event of the slice's life in its holder's ledger (grant, renewal, return,
//! reclaim), its holder and epoch, the scope it is cut from, its bounds per dimension and
//! its times; a return or reclaim also says what the holder used.

use serde::{Deserialize, Serialize};

use crate::decision::MAX_TEXT_BYTES;
use crate::error::DecisionError;
use crate::strict::present;
use crate::Dimension;

/// What happened to a slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LeaseEvent {
    /// The database granted it to the holder.
    Grant,
    /// The holder extended its expiry.
    Renew,
    /// The holder gave it back, saying what it used.
    Return,
    /// It was reclaimed after its expiry (counted as spent whole).
    Reclaim,
}

impl LeaseEvent {
    /// Whether the event closes the slice (a return or a reclaim).
    pub fn closes(self) -> bool {
        matches!(self, LeaseEvent::Return | LeaseEvent::Reclaim)
    }

    /// The event's name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseEvent::Grant => "grant",
            LeaseEvent::Renew => "renew",
            LeaseEvent::Return => "return",
            LeaseEvent::Reclaim => "reclaim",
        }
    }
}

/// What kind of budget a slice is cut from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LeaseScope {
    /// A run's budget (key: the run's name).
    Run,
    /// A principal's budget across its runs (key: the uid).
    Principal,
    /// A credential's spend backstop (key: the credential's name).
    Credential,
    /// A rate bucket (key: the bucket's name).
    Bucket,
}

impl LeaseScope {
    /// The scope kind's name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseScope::Run => "run",
            LeaseScope::Principal => "principal",
            LeaseScope::Credential => "credential",
            LeaseScope::Bucket => "bucket",
        }
    }
}

/// An amount per dimension a slice covers, in the units runs count in (absent: that
/// dimension is not sliced, or nothing said of it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SliceAmounts {
    /// Attempts.
    pub attempts: Option<u64>,
    /// Spend, nanodollars.
    pub nanos: Option<u64>,
    /// Side effects.
    pub side_effects: Option<u64>,
    /// Polls.
    pub polls: Option<u64>,
}

impl SliceAmounts {
    /// The dimensions' names, in the order of [`SliceAmounts::each`].
    pub const NAMES: [&'static str; 4] = [
        Dimension::Attempts.as_str(),
        "nanos",
        Dimension::SideEffects.as_str(),
        Dimension::Polls.as_str(),
    ];

    /// The four in the order of [`SliceAmounts::NAMES`].
    pub fn each(&self) -> [Option<u64>; 4] {
        [self.attempts, self.nanos, self.side_effects, self.polls]
    }
}

/// One event of a leased slice (a `lease` record's `slice`). Build it with
/// [`Slice::grant`] and its events with [`Slice::renewed`], [`Slice::returned`],
/// [`Slice::reclaimed`]; [`Slice::validate`] holds the rules of docs/FORMAT.md.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Slice {
    /// What happened.
    pub event: LeaseEvent,
    /// The holder: the daemon's name, unique in the fleet.
    pub holder: String,
    /// The holder's epoch the slice was granted (or adopted) under.
    pub epoch: u64,
    /// The kind of budget it is cut from.
    pub scope_kind: LeaseScope,
    /// Which one (a run's name, a uid, a credential's or bucket's name).
    pub scope_key: String,
    /// Attempts it covers (absent: not sliced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub attempts: Option<u64>,
    /// Spend it covers, nanodollars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub nanos: Option<u64>,
    /// Side effects it covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub side_effects: Option<u64>,
    /// Polls it covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub polls: Option<u64>,
    /// When it was granted, ms since the Unix epoch (the database's clock).
    pub granted_at_ms: u64,
    /// When it expires (after a renewal, the new expiry), on the same clock.
    pub expires_at_ms: u64,
    /// When it was returned or reclaimed (those events only), on the same clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub closed_at_ms: Option<u64>,
    /// Attempts used (a return or reclaim; a bounded dimension only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub used_attempts: Option<u64>,
    /// Nanodollars used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub used_nanos: Option<u64>,
    /// Side effects used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub used_side_effects: Option<u64>,
    /// Polls used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "present")]
    pub used_polls: Option<u64>,
}

impl Slice {
    /// The grant of a slice of `bounds` from the scope `scope_kind`/`scope_key` to
    /// `holder` under its `epoch`, valid from `granted_at_ms` to `expires_at_ms`.
    pub fn grant(
        holder: &str,
        epoch: u64,
        (scope_kind, scope_key): (LeaseScope, &str),
        bounds: SliceAmounts,
        granted_at_ms: u64,
        expires_at_ms: u64,
    ) -> Slice {
        Slice {
            event: LeaseEvent::Grant,
            holder: holder.to_owned(),
            epoch,
            scope_kind,
            scope_key: scope_key.to_owned(),
            attempts: bounds.attempts,
            nanos: bounds.nanos,
            side_effects: bounds.side_effects,
            polls: bounds.polls,
            granted_at_ms,
            expires_at_ms,
            closed_at_ms: None,
            used_attempts: None,
            used_nanos: None,
            used_side_effects: None,
            used_polls: None,
        }
    }

    /// This slice renewed to expire at `expires_at_ms`.
    pub fn renewed(&self, expires_at_ms: u64) -> Slice {
        Slice {
            event: LeaseEvent::Renew,
            expires_at_ms,
            ..self.opened()
        }
    }

    /// This slice returned at `closed_at_ms`, having used `used`.
    pub fn returned(&self, used: SliceAmounts, closed_at_ms: u64) -> Slice {
        self.closed(LeaseEvent::Return, used, closed_at_ms)
    }

    /// This slice reclaimed at `closed_at_ms`; `used`, what the holder's ledger says it
    /// used, where known.
    pub fn reclaimed(&self, used: SliceAmounts, closed_at_ms: u64) -> Slice {
        self.closed(LeaseEvent::Reclaim, used, closed_at_ms)
    }

    fn opened(&self) -> Slice {
        Slice {
            closed_at_ms: None,
            used_attempts: None,
            used_nanos: None,
            used_side_effects: None,
            used_polls: None,
            ..self.clone()
        }
    }

    fn closed(&self, event: LeaseEvent, used: SliceAmounts, closed_at_ms: u64) -> Slice {
        Slice {
            event,
            closed_at_ms: Some(closed_at_ms),
            used_attempts: used.attempts,
            used_nanos: used.nanos,
            used_side_effects: used.side_effects,
            used_polls: used.polls,
            ..self.clone()
        }
    }

    /// Its bounds per dimension (absent: not sliced).
    pub fn bounds(&self) -> SliceAmounts {
        SliceAmounts {
            attempts: self.attempts,
            nanos: self.nanos,
            side_effects: self.side_effects,
            polls: self.polls,
        }
    }

    /// What a return or reclaim says was used.
    pub fn used(&self) -> SliceAmounts {
        SliceAmounts {
            attempts: self.used_attempts,
            nanos: self.used_nanos,
            side_effects: self.used_side_effects,
            polls: self.used_polls,
        }
    }

    /// The rules of docs/FORMAT.md ("Leases"), in this order: holder and scope key
    /// non-empty and bounded, at least one dimension bounded, an expiry after the grant,
    /// `closed_at_ms` on a return or reclaim only and not before the grant, `used_*` on
    /// those only, each for a bounded dimension and within its bound.
    pub fn validate(&self) -> Result<(), DecisionError> {
        for (field, text) in [
            ("slice.holder", &self.holder),
            ("slice.scope_key", &self.scope_key),
        ] {
            if text.is_empty() {
                return Err(DecisionError::Invalid {
                    field,
                    why: "must not be empty",
                });
            }
            if text.len() > MAX_TEXT_BYTES {
                return Err(DecisionError::TooLong {
                    field,
                    len: text.len(),
                    max: MAX_TEXT_BYTES,
                });
            }
        }
        if self.bounds().each().iter().all(Option::is_none) {
            return Err(DecisionError::Invalid {
                field: "slice",
                why: "a slice bounds at least one of attempts, nanos, side_effects, polls",
            });
        }
        if self.expires_at_ms <= self.granted_at_ms {
            return Err(DecisionError::Invalid {
                field: "slice.expires_at_ms",
                why: "a slice expires after it is granted",
            });
        }
        self.validate_close()
    }

    /// `closed_at_ms` and `used_*`: a closing event's, within the bounds.
    fn validate_close(&self) -> Result<(), DecisionError> {
        let closes = self.event.closes();
        match self.closed_at_ms {
            None if closes => {
                return Err(DecisionError::Missing {
                    field: "slice.closed_at_ms",
                })
            }
            Some(_) if !closes => {
                return Err(DecisionError::Invalid {
                    field: "slice.closed_at_ms",
                    why: "is a return's or a reclaim's only",
                })
            }
            Some(at) if at < self.granted_at_ms => {
                return Err(DecisionError::Invalid {
                    field: "slice.closed_at_ms",
                    why: "a slice is not closed before it is granted",
                })
            }
            _ => {}
        }
        let bounds = self.bounds().each();
        let used = self.used().each();
        for (i, field) in [
            "slice.used_attempts",
            "slice.used_nanos",
            "slice.used_side_effects",
            "slice.used_polls",
        ]
        .into_iter()
        .enumerate()
        {
            match (used[i], bounds[i]) {
                (None, _) => {}
                (Some(_), _) if !closes => {
                    return Err(DecisionError::Invalid {
                        field,
                        why: "is a return's or a reclaim's only",
                    })
                }
                (Some(_), None) => {
                    return Err(DecisionError::Invalid {
                        field,
                        why: "the slice does not bound this dimension",
                    })
                }
                _ => {}
            }
        }
        Ok(())
    }
}
