//! tally's decision records: what the gate decides and the ledger stores (one JSON
//! object per decision), the typed reason codes and the one action each carries,
//! canonical JSON and the argument digest, and how a URL is shown ([`url::redacted`]).
//!
//! No cryptography, no I/O: the ledger (bytes, keys, store), the policy core and the
//! verifier all read these types, and none of them defines its own. The one thing read
//! from the world is the time, and only through a [`Clock`] its caller passes in
//! ([`clock`]: the system's, or a manual one in tests).
#![forbid(unsafe_code)]

pub mod args;
mod canonical;
pub mod clock;
mod codes;
pub mod decision;
mod dimension;
pub mod error;
pub mod headroom;
pub mod money;
mod receipt;
mod stored;
mod strict;
pub mod trace;
pub mod typed;
pub mod url;
mod verdict;
pub mod words;

pub use args::Args;
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Action, Decision, Effect, Kind, Reason, Status, Usage, UsageRefused};
pub use dimension::{Dimension, LimitKey};
pub use error::{ArgsError, DecisionError};
pub use headroom::{Closeness, Headroom};
pub use money::{parse_usd, MoneyError, Nanos};
pub use receipt::{Hash, Receipt};
pub use typed::Record;
pub use verdict::Verdict;
