//! What the lease manager speaks in: scopes, amounts, slices granted, and why a call
//! was refused.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// What kind of budget a scope is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum ScopeKind {
    /// A run's budget (key: the run's name).
    Run,
    /// A principal's budget across its runs (key: the uid, or the token's name).
    Principal,
    /// A credential's spend backstop (key: the credential's name).
    Credential,
    /// A rate bucket (key: the bucket's name).
    Bucket,
}

impl ScopeKind {
    /// As stored in `tally_lease_scopes.kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            ScopeKind::Run => "run",
            ScopeKind::Principal => "principal",
            ScopeKind::Credential => "credential",
            ScopeKind::Bucket => "bucket",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<ScopeKind> {
        Some(match s {
            "run" => ScopeKind::Run,
            "principal" => ScopeKind::Principal,
            "credential" => ScopeKind::Credential,
            "bucket" => ScopeKind::Bucket,
            _ => return None,
        })
    }
}

/// One budget slices are leased from.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Scope {
    /// What it is.
    pub kind: ScopeKind,
    /// Which one.
    pub key: String,
}

impl Scope {
    /// The scope of `kind` named `key`.
    pub fn new(kind: ScopeKind, key: &str) -> Scope {
        Scope {
            kind,
            key: key.to_owned(),
        }
    }
}

/// An amount in each dimension a slice covers, in the units runs count in: attempts,
/// nanodollars, side effects, polls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Amounts {
    /// Attempts.
    pub attempts: u64,
    /// Spend, nanodollars.
    pub nanos: u64,
    /// Side effects.
    pub effects: u64,
    /// Polls.
    pub polls: u64,
}

impl Amounts {
    /// The four in the order the tables hold them.
    pub(crate) fn each(&self) -> [u64; 4] {
        [self.attempts, self.nanos, self.effects, self.polls]
    }

    pub(crate) fn from_each(v: [u64; 4]) -> Amounts {
        Amounts {
            attempts: v[0],
            nanos: v[1],
            effects: v[2],
            polls: v[3],
        }
    }

    /// Whether every dimension is at most `other`'s.
    pub fn within(&self, other: &Amounts) -> bool {
        self.each().iter().zip(other.each()).all(|(a, b)| *a <= b)
    }
}

/// A scope's caps, one per dimension; `None`: that dimension has no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caps {
    /// Attempts.
    pub attempts: Option<u64>,
    /// Spend, nanodollars.
    pub nanos: Option<u64>,
    /// Side effects.
    pub effects: Option<u64>,
    /// Polls.
    pub polls: Option<u64>,
}

impl Caps {
    pub(crate) fn each(&self) -> [Option<u64>; 4] {
        [self.attempts, self.nanos, self.effects, self.polls]
    }

    pub(crate) fn from_each(v: [Option<u64>; 4]) -> Caps {
        Caps {
            attempts: v[0],
            nanos: v[1],
            effects: v[2],
            polls: v[3],
        }
    }
}

/// A slice held by this holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Its id in `tally_leases`.
    pub id: i64,
    /// The budget it is a slice of.
    pub scope: Scope,
    /// The holder's epoch it was granted (or last adopted) under.
    pub epoch: i64,
    /// What it covers.
    pub granted: Amounts,
    /// When it was granted, on the database's clock (or the manager's given clock).
    pub granted_at: SystemTime,
    /// When it expires, on the same clock.
    pub expires_at: SystemTime,
    /// How long it was valid for when the database answered: the holder's own deadline
    /// is the moment it sent the request plus this (never later than the database's).
    pub valid_for: Duration,
    /// The use its holder's decisions had committed on it when it was read (granted,
    /// adopted or listed): an upper bound of what the holder answered on it. `None`: not
    /// known (granted by a manager whose uses are not committed, or before schema 11).
    pub committed: Option<Amounts>,
}

/// What a grant gave.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Grant {
    /// The slice.
    Granted(Lease),
    /// Not granted: the slice asked for does not fit in what the scope has left (each
    /// dimension's room: its cap less settled, held and leased; `None`: no cap).
    Refused {
        /// What is left in each dimension.
        left: Caps,
    },
    /// Not granted: the scope's slices are revoked (its run paused or killed).
    Revoked,
}

/// What a central spend did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Spent {
    /// Settled in every scope, in one transaction.
    Spent,
    /// Nothing spent: it does not fit in some scope, slices out or not.
    Refused,
    /// Nothing spent: it would fit in every scope but for the slices out (held by
    /// hosts that return them when used up, idle or expired): retry.
    Leased,
    /// Nothing spent: some scope's slices are revoked.
    Revoked,
}

/// What a return did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Released {
    /// The slice was held: its unused part went back to the scope, its used part is
    /// settled.
    Returned,
    /// The slice had been reclaimed, settling at least what its holder said it used
    /// (the whole slice where its use was not known): what it settled beyond that went
    /// back to the scope now (nothing, where it settled exactly that). A use its holder
    /// counted on it and commits later is counted in it.
    Refunded,
    /// The slice had been reclaimed, settling its committed use, less than what its
    /// holder said it used (uses counted, their decisions not committed yet): nothing
    /// moved (the rest went back to the scope at the reclaim), and those uses are
    /// refused at their commit: never answered, never counted.
    Late,
    /// It was returned before: nothing changed (a return counts once).
    Already,
}

/// A slice reclaimed after its expiry and the skew margin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reclaimed {
    /// Its id.
    pub id: i64,
    /// Its scope.
    pub scope: Scope,
    /// Who held it.
    pub holder: String,
    /// What it covered.
    pub granted: Amounts,
    /// What of it is now counted as settled: its committed use, or all it covered
    /// where that is not known. The rest went back to the scope.
    pub settled: Amounts,
}

/// What a scope has left and who leases from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outlook {
    /// What is left in each dimension (`None`: no cap).
    pub left: Caps,
    /// Distinct holders with a slice out, or granted one within the window asked about.
    pub holders: u64,
}

/// Where the lease manager reads the time: the database's clock (`now()`, the default;
/// every host's slices expire on one clock), or one the caller gives (tests move it).
#[derive(Clone, Default)]
pub struct LeaseClock(Option<Arc<Mutex<SystemTime>>>);

impl std::fmt::Debug for LeaseClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.now() {
            None => f.write_str("LeaseClock(database)"),
            Some(t) => write!(f, "LeaseClock({t:?})"),
        }
    }
}

impl LeaseClock {
    /// The database's `now()`.
    pub fn database() -> LeaseClock {
        LeaseClock(None)
    }

    /// A clock standing at `at` until [`LeaseClock::advance`]d.
    pub fn manual(at: SystemTime) -> LeaseClock {
        LeaseClock(Some(Arc::new(Mutex::new(at))))
    }

    /// Move a manual clock on by `by` (the database's clock is not moved).
    pub fn advance(&self, by: Duration) {
        if let Some(t) = &self.0 {
            let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
            *t += by;
        }
    }

    /// The time to pass to SQL: `None` for the database's own.
    pub(crate) fn now(&self) -> Option<SystemTime> {
        self.0
            .as_ref()
            .map(|t| *t.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Why a lease call failed (a slice that does not fit is [`Grant::Refused`], not an
/// error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The database did not answer, or not in time: nothing is known to have changed;
    /// retry. A grant whose answer was lost may exist: [`crate::Leases::held`] lists it.
    #[error("PostgreSQL at {target} failed {what}: {why}; retry once the database answers")]
    Unavailable {
        /// Host, port and database.
        target: String,
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        why: String,
    },
    /// Another manager took this holder's name since this one opened: it speaks for the
    /// holder now, and this one may grant, renew or return nothing.
    #[error("lease holder `{holder}`: epoch {epoch} is stale (the holder is at epoch {current}); this lease manager was replaced: open a new one")]
    StaleEpoch {
        /// The holder.
        holder: String,
        /// This manager's epoch.
        epoch: i64,
        /// The holder's epoch in the database.
        current: i64,
    },
    /// No such scope: define it first.
    #[error("no lease scope {kind} `{key}`: define its caps first (Leases::define)")]
    UnknownScope {
        /// Its kind.
        kind: &'static str,
        /// Its key (as given).
        key: String,
    },
    /// No such lease, or not this holder's.
    #[error("lease {id} is not held by `{holder}`")]
    NotHolder {
        /// The lease.
        id: i64,
        /// The holder asking.
        holder: String,
    },
    /// The lease is no longer held (returned, or reclaimed after its expiry): it cannot
    /// be renewed; ask for a new slice.
    #[error("lease {id} is {state}: it cannot be renewed; ask for a new slice")]
    Ended {
        /// The lease.
        id: i64,
        /// `returned`, `reclaimed` or `expired`.
        state: String,
    },
    /// A return said more was used than the slice covered.
    #[error("lease {id}: used {used:?} is more than granted {granted:?}; return at most what the slice covered")]
    UsedMoreThanGranted {
        /// The lease.
        id: i64,
        /// What the return said.
        used: Amounts,
        /// What the slice covered.
        granted: Amounts,
    },
    /// A scope's caps, settled and held amounts would leave its outstanding slices past
    /// a cap: refused, nothing changed.
    #[error("lease scope {kind} `{key}`: its slices out would exceed its caps; wait for them to return or expire")]
    Overcommitted {
        /// Its kind.
        kind: &'static str,
        /// Its key.
        key: String,
    },
    /// Slices of the scope are out: a redefinition that would change which dimensions
    /// are capped (each slice's are fixed at its grant), or a reset, waits for them.
    #[error("lease scope {kind} `{key}`: slices of it are out; revoke it and wait for them to return or be reclaimed, then retry")]
    SlicesOut {
        /// Its kind.
        kind: &'static str,
        /// Its key.
        key: String,
    },
    /// An argument the tables cannot hold (above 2^63 - 1), or a grant of nothing.
    #[error("lease: {0}")]
    Invalid(String),
}
