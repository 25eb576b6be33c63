//! The witness of C2SP tlog-witness (`add-checkpoint`), without its HTTP: it knows the
//! logs it witnesses (one vkey per origin), keeps the latest checkpoint it cosigned for
//! each, and cosigns a new one only if a consistency proof shows it extends that one.
//!
//! Its state is one file per origin (`STATE/<hex SHA-256 of the origin>`, the
//! checkpoint note as received plus the witness's own cosignature), written to a
//! temporary file, fsynced, renamed over the old one and the directory fsynced, all
//! while one lock is held: the check against the old size and the write of the new one
//! are atomic (the race of the spec's "rolling back K leaves" cannot happen), and a
//! cosignature is returned only once its checkpoint is durable.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ed25519_dalek::SigningKey;
use sha2::{Digest, Sha256};

use super::merkle::{empty_root, verify_consistency};
use super::note::{cosign, Note, NoteSig, TreeHead, Vkey};
use super::proof::ConsistencyProof;

/// Why `add-checkpoint` refused, with the HTTP status tlog-witness gives it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// 400: the body does not parse, or the old size is larger than the checkpoint's.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// 403: no valid signature of the origin's log key (or a bad one).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// 404: an origin this witness does not witness.
    #[error("unknown origin {0:?}")]
    UnknownOrigin(String),
    /// 409: the old size is not the size this witness holds (which it returns).
    #[error("conflict: this witness holds size {0}")]
    Conflict(u64),
    /// 422: a proof that does not verify, or the same size with another root.
    #[error("unprocessable: {0}")]
    Unprocessable(String),
    /// 500: the state could not be read or written (nothing was cosigned).
    #[error("witness state: {0}")]
    State(String),
}

impl Refusal {
    /// The HTTP status code tlog-witness assigns.
    pub fn status(&self) -> u16 {
        match self {
            Refusal::BadRequest(_) => 400,
            Refusal::Forbidden(_) => 403,
            Refusal::UnknownOrigin(_) => 404,
            Refusal::Conflict(_) => 409,
            Refusal::Unprocessable(_) => 422,
            Refusal::State(_) => 500,
        }
    }
}

/// What the witness holds for one log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The tree head it cosigned last.
    pub head: TreeHead,
    /// That checkpoint with the log's signatures and this witness's cosignature.
    pub note: Note,
}

/// A witness: its cosigning key and name, the logs it knows, its state directory.
pub struct Witness {
    name: String,
    key: SigningKey,
    logs: BTreeMap<String, Vkey>,
    state: PathBuf,
    lock: Mutex<()>,
}

/// The hex SHA-256 of an origin (the state file's name, and the monitoring path).
pub fn origin_hash(origin: &str) -> String {
    hex::encode(Sha256::digest(origin.as_bytes()))
}

impl Witness {
    /// A witness named `name` (its cosignatures' key name) with `key`, for the logs
    /// `logs` (each a type 0x01 vkey whose name is its origin), keeping its state in
    /// `state` (created 0700 if missing).
    pub fn new(
        name: &str,
        key: SigningKey,
        logs: Vec<Vkey>,
        state: &Path,
    ) -> Result<Witness, Refusal> {
        fs::create_dir_all(state)
            .map_err(|e| Refusal::State(format!("{}: {e}", state.display())))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(state, fs::Permissions::from_mode(0o700))
                .map_err(|e| Refusal::State(format!("{}: {e}", state.display())))?;
        }
        let mut map = BTreeMap::new();
        for v in logs {
            map.insert(v.name.clone(), v);
        }
        Ok(Witness {
            name: name.to_owned(),
            key,
            logs: map,
            state: state.to_path_buf(),
            lock: Mutex::new(()),
        })
    }

    /// The witness's cosigner vkey (type 0x04).
    pub fn vkey(&self) -> Vkey {
        Vkey {
            name: self.name.clone(),
            sig_type: super::note::TYPE_COSIGNATURE,
            public: self.key.verifying_key().to_bytes(),
        }
    }

    fn path(&self, origin: &str) -> PathBuf {
        self.state.join(origin_hash(origin))
    }

    /// What the witness holds for the log whose origin hashes to `hash` (hex), if any.
    pub fn held_by_hash(&self, hash: &str) -> Result<Option<Held>, Refusal> {
        if hash.len() != 64 || !hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Ok(None);
        }
        self.read_held(&self.state.join(hash))
    }

    /// What the witness holds for `origin`, if any.
    pub fn held(&self, origin: &str) -> Result<Option<Held>, Refusal> {
        self.read_held(&self.path(origin))
    }

    fn read_held(&self, path: &Path) -> Result<Option<Held>, Refusal> {
        let bytes = match fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Refusal::State(format!("{}: {e}", path.display()))),
        };
        let note =
            Note::parse(&bytes).map_err(|e| Refusal::State(format!("{}: {e}", path.display())))?;
        let head = TreeHead::parse(&note.text)
            .map_err(|e| Refusal::State(format!("{}: {e}", path.display())))?;
        Ok(Some(Held { head, note }))
    }

    /// Handle an `add-checkpoint` body at `now` (POSIX seconds): the cosignature lines
    /// to answer with, or the refusal.
    pub fn add_checkpoint(&self, body: &[u8], now: u64) -> Result<String, Refusal> {
        let text = std::str::from_utf8(body)
            .map_err(|_| Refusal::BadRequest("the body is not UTF-8".into()))?;
        let req = ConsistencyProof::parse(text).map_err(|e| Refusal::BadRequest(e.to_string()))?;
        let head = TreeHead::parse(&req.checkpoint.text)
            .map_err(|e| Refusal::BadRequest(e.to_string()))?;
        let log = self
            .logs
            .get(&head.origin)
            .ok_or_else(|| Refusal::UnknownOrigin(head.origin.clone()))?;
        // A known key's signature must be there, and verify.
        log.verify(&req.checkpoint)
            .map_err(|e| Refusal::Forbidden(e.to_string()))?;
        if req.old > head.size {
            return Err(Refusal::BadRequest(format!(
                "old size {} is larger than the checkpoint's {}",
                req.old, head.size
            )));
        }
        // Check and persist under one lock: no other request sees the old state after
        // this one has been answered with the new.
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let held = self.held(&head.origin)?;
        let held_size = held.as_ref().map_or(0, |h| h.head.size);
        if req.old != held_size {
            return Err(Refusal::Conflict(held_size));
        }
        if head.size == 0 && head.root != empty_root() {
            return Err(Refusal::Unprocessable(
                "a checkpoint of size 0 must have the empty tree's root".into(),
            ));
        }
        match &held {
            None if !req.proof.is_empty() => {
                return Err(Refusal::Unprocessable(
                    "a proof from size 0 must be empty".into(),
                ))
            }
            None => {}
            Some(h) if req.old == 0 => {
                // Held size 0: the empty tree is a prefix of every tree.
                if !req.proof.is_empty() {
                    return Err(Refusal::Unprocessable(
                        "a proof from size 0 must be empty".into(),
                    ));
                }
                let _ = h;
            }
            Some(h) => {
                verify_consistency(h.head.size, head.size, &h.head.root, &head.root, &req.proof)
                    .map_err(|e| {
                        Refusal::Unprocessable(format!(
                            "not consistent with size {} that this witness holds: {e}",
                            h.head.size
                        ))
                    })?;
            }
        }
        let sig = cosign(&self.key, &self.name, now, &req.checkpoint.text);
        let mut note = req.checkpoint.clone();
        note.sigs.retain(|s| s.name != self.name);
        note.sigs.push(sig.clone());
        self.persist(&head.origin, &note)?;
        Ok(sig.to_line())
    }

    fn persist(&self, origin: &str, note: &Note) -> Result<(), Refusal> {
        let path = self.path(origin);
        let tmp = path.with_extension("tmp");
        let state = |e: std::io::Error| Refusal::State(format!("{}: {e}", path.display()));
        let _ = fs::remove_file(&tmp);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(state)?;
        f.write_all(note.to_text().as_bytes()).map_err(state)?;
        f.sync_all().map_err(state)?;
        drop(f);
        fs::rename(&tmp, &path).map_err(state)?;
        File::open(&self.state)
            .and_then(|d| d.sync_all())
            .map_err(state)
    }
}

/// The cosignatures a witness answered with, parsed (lines of `— name base64`).
pub fn parse_cosignatures(body: &str) -> Result<Vec<NoteSig>, super::note::NoteError> {
    if !body.ends_with('\n') || body.len() < 2 {
        return Err(super::note::NoteError::Malformed {
            what: "cosignature response",
            why: "expected signature lines, each ending in a newline".into(),
        });
    }
    body.split_terminator('\n')
        .map(NoteSig::from_line)
        .collect()
}
