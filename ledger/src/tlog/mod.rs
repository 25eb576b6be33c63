//! Transparency-log interoperability (C2SP): the RFC 6962 Merkle tree over a ledger's
//! entries, its tiles on disk, signed notes and checkpoints, cosignatures, proofs,
//! witness policies and the witness itself.
//!
//! A ledger is a C2SP log whose origin is `tally/<ledger id>` and whose leaf `i` is the
//! exact stored bytes of the entry with seq `i`. Its checkpoints (`origin`, size, root)
//! are signed by the ledger's long-lived **log key** (`DIR/log.key`, the key witnesses
//! and proof verifiers know, printed by `tally checkpoint --vkey`); the epoch keys keep
//! sealing the chain in the log (forward integrity). SECURITY.md says what each protects.

pub use crate::merkle;
pub mod note;
pub mod policy;
pub mod proof;
pub mod tiles;
pub mod witness;

use std::fs;
use std::path::Path;

use ed25519_dalek::SigningKey;
use rand_core::OsRng;
use zeroize::Zeroizing;

use crate::error::{Error, FormatError, Result};
use crate::format::{parse_hex, LedgerId};
use note::{sign_note, Note, TreeHead, Vkey, TYPE_ED25519};

/// The log key's file inside a ledger directory (0600).
pub const LOG_KEY: &str = "log.key";
/// The latest checkpoint the witnesses cosigned, with their cosignatures (a note).
pub const COSIGNED: &str = "checkpoint.cosigned";

const LOG_KEY_HEADER: &str = "tally log key v1\n";

/// The checkpoint origin of a ledger: `tally/<32 hex ledger id>`.
pub fn origin(ledger: LedgerId) -> String {
    format!("tally/{ledger}")
}

/// A ledger's long-lived log key (Ed25519): signs its C2SP checkpoints.
pub struct LogKey {
    origin: String,
    key: SigningKey,
}

impl LogKey {
    /// A new random log key for `ledger`.
    pub fn generate(ledger: LedgerId) -> LogKey {
        LogKey {
            origin: origin(ledger),
            key: SigningKey::generate(&mut OsRng),
        }
    }

    /// From a seed (tests and vectors).
    pub fn from_seed(ledger: LedgerId, seed: [u8; 32]) -> LogKey {
        LogKey {
            origin: origin(ledger),
            key: SigningKey::from_bytes(&seed),
        }
    }

    /// The origin (and key name).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The vkey witnesses and verifiers are configured with.
    pub fn vkey(&self) -> Vkey {
        Vkey {
            name: self.origin.clone(),
            sig_type: TYPE_ED25519,
            public: self.key.verifying_key().to_bytes(),
        }
    }

    /// The checkpoint note of the tree of `size` leaves with `root`, signed.
    pub fn sign(&self, size: u64, root: merkle::TreeHash) -> Note {
        let text = TreeHead::new(&self.origin, size, root).to_text();
        let sig = sign_note(&self.key, &self.origin, &text);
        Note {
            text,
            sigs: vec![sig],
        }
    }

    /// Sign a message outside notes (the signed end of an export; domain-separated by a
    /// NUL byte no note text may hold).
    pub fn sign_raw(&self, msg: &[u8]) -> [u8; 64] {
        use ed25519_dalek::Signer;
        self.key.sign(msg).to_bytes()
    }

    /// Write `DIR/log.key` (0600), refusing to replace one.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(LOG_KEY);
        let seed = Zeroizing::new(hex::encode(self.key.to_bytes()));
        let text = Zeroizing::new(format!(
            "{LOG_KEY_HEADER}origin {}\nsign {}\n",
            self.origin,
            seed.as_str()
        ));
        crate::files::write_secret_file(&path, text.as_bytes())
    }

    /// Read `DIR/log.key` for `ledger`; refuses a file others can read.
    pub fn read(dir: &Path, ledger: LedgerId) -> Result<LogKey> {
        let path = dir.join(LOG_KEY);
        let text = crate::files::read_secret_file(&path)?;
        let bad = || {
            FormatError::invalid(
                "log key",
                "expected `tally log key v1`, `origin`, `sign` lines",
            )
        };
        let rest = text.strip_prefix(LOG_KEY_HEADER).ok_or_else(bad)?;
        let mut lines = rest.split('\n');
        let o = lines
            .next()
            .and_then(|l| l.strip_prefix("origin "))
            .ok_or_else(bad)?;
        let s = lines
            .next()
            .and_then(|l| l.strip_prefix("sign "))
            .ok_or_else(bad)?;
        if lines.next() != Some("") || lines.next().is_some() {
            return Err(bad().into());
        }
        if o != origin(ledger) {
            return Err(FormatError::invalid(
                "log key",
                format!("is the key of {o}, not of {}", origin(ledger)),
            )
            .into());
        }
        let seed = Zeroizing::new(parse_hex::<32>(s, "log key")?);
        Ok(LogKey::from_seed(ledger, *seed))
    }

    /// Read the log key of the ledger in `dir`, or make one if it has none yet (a
    /// ledger made by a build before log keys); `Ok(true)` when it was made.
    pub fn read_or_create(dir: &Path, ledger: LedgerId) -> Result<(LogKey, bool)> {
        match LogKey::read(dir, ledger) {
            Ok(k) => Ok((k, false)),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                let k = LogKey::generate(ledger);
                k.write(dir)?;
                Ok((k, true))
            }
            Err(e) => Err(e),
        }
    }
}

/// Read the latest cosigned checkpoint kept beside the ledger in `dir`, if any.
pub fn read_cosigned(dir: &Path) -> Result<Option<Note>> {
    let path = dir.join(COSIGNED);
    match fs::read(&path) {
        Ok(b) => Note::parse(&b).map(Some).map_err(|e| Error::Corrupt {
            seq: 0,
            why: format!("{}: {e}", path.display()),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(&path, e)),
    }
}

/// The cosigned checkpoint beside the ledger in `dir` with its size, if there is one of at
/// most `size` leaves (an export of `size` entries carries it).
pub fn read_cosigned_at(dir: &Path, size: u64) -> Result<Option<(u64, Note)>> {
    Ok(read_cosigned(dir)?.and_then(|n| {
        let head = TreeHead::parse(&n.text).ok()?;
        (head.size <= size).then_some((head.size, n))
    }))
}

/// Replace the cosigned checkpoint beside the ledger in `dir`, durably (temporary file,
/// fsync, rename, directory fsync).
pub fn write_cosigned(dir: &Path, note: &Note) -> Result<()> {
    let path = dir.join(COSIGNED);
    let tmp = dir.join(format!("{COSIGNED}.tmp"));
    let _ = fs::remove_file(&tmp);
    fs::write(&tmp, note.to_text()).map_err(|e| Error::io(&tmp, e))?;
    fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(&tmp, e))?;
    fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
    crate::files::sync_parent(&path)
}
