//! tally's ledger: the record format, its cryptography, the embedded store and the one
//! append API through which agents write budget-gate decisions.
//!
//! Data flows one way: [`Decision`] -> encrypted, hash-linked entry ([`format`]) ->
//! [`segment`] (append-only log files, fdatasynced; [`store`] is sled, an index derived
//! from them) -> [`export`] -> the offline verifier (`tally-verify`).
//!
//! * Every entry has a clear header (version, type, ledger id, seq, epoch, wall time,
//!   previous hash, nonce) and a body. A decision's body is XChaCha20-Poly1305 ciphertext
//!   with the header as associated data. The chain hash is keyed BLAKE3 over the entry's
//!   RFC 6962 Merkle leaf hash (SHA-256 of its exact stored bytes), so the chain verifies
//!   with no secret.
//! * Each commit group is sealed by a [`Checkpoint`] signed with the current epoch's
//!   Ed25519 key. Epoch keys rotate; each new key is certified in the chain by the old
//!   one, and the old secret is destroyed.
//! * Each epoch's data key comes from an ephemeral X25519 agreement with the auditor's
//!   public key: the writer never holds a key that opens a past epoch.
//!
//! There is no update, delete or rewind anywhere in this API.
#![forbid(unsafe_code)]

pub use tally_record::clock;
pub use tally_record::decision;
pub use tally_record::money;
pub use tally_record::trace;
pub use tally_record::words;
pub mod error;
pub mod export;
#[cfg(feature = "faults")]
pub mod faults;
mod files;
pub mod format;
pub mod keys;
pub mod ledger;
pub mod merkle;
pub mod prove;
pub mod segment;
pub mod store;
mod tail;
pub mod tlog;
mod tree;

pub use decision::{Action, Decision, Effect, Kind, Reason, Status, Usage, UsageRefused};
pub use error::{ArgsError, CryptoError, DecisionError, Error, FormatError, Result};
pub use format::{Checkpoint, Entry, EntryType, Frame, Hash, Header, LedgerId};
pub use keys::{AuditorKey, LedgerPublic};
pub use ledger::{EpochRead, Ledger, Receipt, Rotation, SyncObserver, LINGER_MS};
