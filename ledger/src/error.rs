//! Typed errors. Each names what was wrong and where.

use std::path::PathBuf;

pub use tally_record::{ArgsError, DecisionError};

/// A malformed entry, checkpoint, key or export (strict decoding).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// Fewer bytes than the structure needs.
    #[error("truncated: {what} needs {need} bytes, {have} present")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// Bytes after the end of the structure.
    #[error("{count} trailing bytes after {what}")]
    TrailingBytes {
        /// What was read.
        what: &'static str,
        /// How many bytes were left over.
        count: usize,
    },
    /// A version this build does not read.
    #[error("unknown {what} version {version}")]
    UnknownVersion {
        /// What carries the version.
        what: &'static str,
        /// The version found.
        version: u32,
    },
    /// An entry type this build does not know.
    #[error("unknown entry type {0}")]
    UnknownEntryType(u8),
    /// A field whose value breaks the format's rules.
    #[error("{what}: {why}")]
    Invalid {
        /// The structure or field.
        what: &'static str,
        /// The rule broken.
        why: String,
    },
}

impl FormatError {
    pub(crate) fn invalid(what: &'static str, why: impl Into<String>) -> FormatError {
        FormatError::Invalid {
            what,
            why: why.into(),
        }
    }
}

/// Cryptographic failure: a signature or ciphertext that does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CryptoError {
    /// The signature does not verify under the expected key.
    #[error("bad signature on {what}")]
    BadSignature {
        /// What was signed.
        what: &'static str,
    },
    /// The key id on a signature is not the expected key's.
    #[error("{what} is signed by key {found}, expected key {expected}")]
    WrongKey {
        /// What was signed.
        what: &'static str,
        /// The expected key id (hex).
        expected: String,
        /// The key id found (hex).
        found: String,
    },
    /// A ciphertext that does not authenticate (wrong key, or modified).
    #[error("record does not decrypt (wrong auditor key, or modified ciphertext or header)")]
    Decrypt,
    /// A key that is not a valid point or scalar.
    #[error("invalid key: {0}")]
    InvalidKey(&'static str),
}

/// Any error of the ledger library.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The decision was refused; nothing was written.
    #[error(transparent)]
    Decision(#[from] DecisionError),
    /// Decision number `index` of a batch was refused; nothing of the batch was written.
    #[error("decision {index} of the batch: {source}")]
    InBatch {
        /// 0-based position in the batch.
        index: usize,
        /// Why it was refused.
        source: DecisionError,
    },
    /// Malformed bytes.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A signature or ciphertext failed.
    #[error(transparent)]
    Crypto(#[from] CryptoError),
    /// A file system operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The embedded store failed.
    #[error("store: {0}")]
    Store(String),
    /// A write to the index (the sled store beside the log, `DIR/index`) failed, or was
    /// refused because an earlier one did (a full disk): the index takes no more writes
    /// from this process. The log, the record of truth, keeps everything acknowledged.
    #[error("{}: index write failed: {why}", path.display())]
    Index {
        /// The index directory.
        path: PathBuf,
        /// What was being written, and the error.
        why: String,
    },
    /// A public key file given where a secret key is read (`--auditor-key auditor.pub`).
    #[error("{path} is a public key ({what}); this takes the secret half: give {secret} (the file `tally keygen` wrote beside it, mode 0600)")]
    PublicKeyGiven {
        /// The file given.
        path: PathBuf,
        /// Its first line, e.g. `tally auditor public key v1`.
        what: String,
        /// Where its secret half would be (the same name ending in `.key`).
        secret: PathBuf,
    },
    /// A key file has permissions that let others read it.
    #[error("{path}: key file is readable by others (mode {mode:o}); run `chmod 600 {path}`")]
    KeyPermissions {
        /// The key file.
        path: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// Another writer (another `tally` process or `tally serve`) holds the store.
    #[error("{0}: the ledger is held by another writer (is `tally serve` running? use its API, or stop it)")]
    Busy(PathBuf),
    /// The directory holds a ledger in layout 1 (entries inside the sled store
    /// `store/`), which this build neither reads nor writes.
    #[error("{0}: this ledger is in layout 1 (its entries inside the sled store `store/`); this build reads and writes layout 3 only (append-only segments in `log/`, docs/FORMAT.md). Export it with the tally build that wrote it (`tally export --ledger DIR --out FILE`; this build verifies that file, a `tally export v1`, with `tally verify FILE --key DIR/ledger.pub`). There is no import into layout 3: start a new ledger with `tally init` in another directory, and keep the old directory and its export as the old ledger's record")]
    OldLayout(PathBuf),
    /// The directory holds a ledger in layout 2 (segments whose entries are chained over
    /// their bytes, not their Merkle leaf hashes), which this build neither reads nor
    /// writes; its exports (`tally export v1`) this build verifies.
    #[error("{0}: this ledger is in layout 2 (its log's segments start `tally segment 2`: entries chained over their bytes); this build reads and writes layout 3 only (entries chained over their Merkle leaf hashes, docs/FORMAT.md). Export it with the tally build that wrote it (`tally export --ledger DIR --out FILE`); this build verifies that file, a `tally export v1`, with `tally verify FILE --key DIR/ledger.pub`. There is no import into layout 3: start a new ledger with `tally init` in another directory, and keep the old directory and its export as the old ledger's record")]
    Layout2(PathBuf),
    /// A log segment that is not what the layout says (header, name, numbering).
    #[error("{path}: {why}")]
    Segment {
        /// The segment file (or the log directory).
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The directory already holds a ledger.
    #[error("{0}: a ledger already exists here")]
    AlreadyExists(PathBuf),
    /// The directory holds no ledger.
    #[error("{0}: no ledger here (create one with `tally init`)")]
    NotALedger(PathBuf),
    /// The writer key does not belong to the ledger's current epoch.
    #[error("writer key is for epoch {key_epoch} but the ledger is at epoch {ledger_epoch}; the writer cannot continue this ledger")]
    KeyEpochMismatch {
        /// The key file's epoch.
        key_epoch: u32,
        /// The stored chain's epoch.
        ledger_epoch: u32,
    },
    /// Derived state too long for one state frame (`docs/FORMAT.md`, tag 4); nothing
    /// was written.
    #[error("derived state of up to {len} bytes is more than a state frame holds ({max} bytes)")]
    StateTooLong {
        /// The state's length as a state frame may hold it, at most.
        len: usize,
        /// The most a state frame holds.
        max: usize,
    },
    /// An earlier write failed in a way that leaves durability unknown; the ledger
    /// refuses all further appends until reopened (fail closed).
    #[error("ledger is closed after a failed write: {0}")]
    Poisoned(String),
    /// The log's tail does not verify when the ledger is opened for writing
    /// (docs/FORMAT.md, "Opening for writing"): the writer will not append after it, and
    /// nothing was written.
    #[error("{}: refusing to write: the log's tail does not verify ({at}: {why}). Nothing was written. Run `tally verify {} --key {}` to see what is damaged; restore the ledger from a backup, or keep it as evidence and start a new one with `tally init`", dir.display(), dir.display(), dir.join("ledger.pub").display())]
    TailDamaged {
        /// The ledger directory.
        dir: PathBuf,
        /// Where: a segment and byte, or a seq.
        at: String,
        /// What is wrong.
        why: String,
    },
    /// The stored chain does not verify on open.
    #[error("stored chain is inconsistent at seq {seq}: {why}")]
    Corrupt {
        /// First bad entry.
        seq: u64,
        /// What is wrong.
        why: String,
    },
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// Result alias for the ledger library.
pub type Result<T, E = Error> = std::result::Result<T, E>;
