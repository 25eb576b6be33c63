//! Keys: epoch signing keys, per-epoch data keys agreed with the auditor, key files.
//!
//! No primitive is implemented here: Ed25519 is ed25519-dalek, X25519 is x25519-dalek,
//! the AEAD is XChaCha20-Poly1305 from RustCrypto, the KDF is BLAKE3's derive_key.
//! Secrets live in zeroizing types and in 0600 files; they are never printed.

mod epoch;

use std::fs::{self};
use std::path::Path;

use chacha20poly1305::aead::{Aead, AeadInPlace, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use ed25519_dalek::{Signature, VerifyingKey};
use rand_core::OsRng;
use x25519_dalek::{EphemeralSecret, PublicKey, StaticSecret};
use zeroize::Zeroizing;

use crate::error::{CryptoError, Error, FormatError, Result};
use crate::format::{
    key_id, parse_hex, EntryType, Hash, Header, LedgerId, CONTEXT_DATA_KEY, HEADER_LEN, TAG_LEN,
};

pub use crate::files::{random16, read_secret_file, sync_parent, write_secret_file};
use crate::files::{
    read_secret, strip_line, write_new, write_new_secret, APPROVER_PUBLIC_HEADER,
    APPROVER_SECRET_HEADER, AUDITOR_PUBLIC_HEADER, AUDITOR_SECRET_HEADER, LEDGER_PUBLIC_HEADER,
    LEDGER_PUBLIC_HEADER_V2,
};
pub use epoch::EpochSecrets;

/// An epoch's symmetric key for record encryption. Zeroized on drop.
pub struct DataKey {
    cipher: XChaCha20Poly1305,
}

impl DataKey {
    fn from_bytes(key: &Zeroizing<[u8; 32]>) -> DataKey {
        DataKey {
            cipher: XChaCha20Poly1305::new(key.as_ref().into()),
        }
    }

    /// Build a decision entry (FORMAT.md): header, then `plaintext` sealed with the header
    /// as associated data.
    #[allow(clippy::too_many_arguments)]
    pub fn decision_entry(
        &self,
        ledger_id: LedgerId,
        seq: u64,
        epoch: u32,
        wall_ms: u64,
        prev_hash: Hash,
        nonce: [u8; 24],
        plaintext: &[u8],
    ) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(HEADER_LEN + plaintext.len() + TAG_LEN);
        self.decision_entry_into(
            ledger_id, seq, epoch, wall_ms, prev_hash, nonce, plaintext, &mut bytes,
        );
        bytes
    }

    /// [`DataKey::decision_entry`], appended to `out` (a commit group's frames, so the
    /// entry is built where it is written).
    #[allow(clippy::too_many_arguments)]
    pub fn decision_entry_into(
        &self,
        ledger_id: LedgerId,
        seq: u64,
        epoch: u32,
        wall_ms: u64,
        prev_hash: Hash,
        nonce: [u8; 24],
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) {
        let header = Header {
            entry_type: EntryType::Decision,
            ledger_id,
            seq,
            epoch,
            wall_ms,
            prev_hash,
            nonce,
            body_len: (plaintext.len() + TAG_LEN) as u32,
        };
        let at = out.len();
        out.extend_from_slice(&header.encode());
        let start = out.len();
        out.extend_from_slice(plaintext);
        let (head, body) = out.split_at_mut(start);
        // Encryption only fails for messages beyond 256 GiB.
        let tag = self
            .cipher
            .encrypt_in_place_detached(XNonce::from_slice(&nonce), &head[at..], body)
            .unwrap_or_default();
        out.extend_from_slice(&tag);
    }

    /// Encrypt a decision: the header is bound as associated data.
    pub fn seal(&self, nonce: &[u8; 24], header: &[u8], plaintext: &[u8]) -> Vec<u8> {
        self.cipher
            .encrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: plaintext,
                    aad: header,
                },
            )
            // Encryption only fails for messages beyond 256 GiB.
            .unwrap_or_default()
    }

    /// Decrypt a decision body into `out` (cleared first), reusing its allocation; fails
    /// if header or body were modified or the key is wrong.
    pub fn open_into(
        &self,
        nonce: &[u8; 24],
        header: &[u8],
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), CryptoError> {
        out.clear();
        let Some(split) = body.len().checked_sub(TAG_LEN) else {
            return Err(CryptoError::Decrypt);
        };
        out.extend_from_slice(&body[..split]);
        self.cipher
            .decrypt_in_place_detached(XNonce::from_slice(nonce), header, out, body[split..].into())
            .map_err(|_| CryptoError::Decrypt)
    }

    /// Decrypt a decision body; fails if header or body were modified or the key is wrong.
    pub fn open(
        &self,
        nonce: &[u8; 24],
        header: &[u8],
        body: &[u8],
    ) -> Result<Vec<u8>, CryptoError> {
        self.cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: body,
                    aad: header,
                },
            )
            .map_err(|_| CryptoError::Decrypt)
    }
}

fn kdf(
    shared: &[u8; 32],
    ephemeral: &[u8; 32],
    recipient: &[u8; 32],
    ledger: LedgerId,
    epoch: u32,
) -> Zeroizing<[u8; 32]> {
    let mut material = Zeroizing::new([0u8; 32 + 32 + 32 + 16 + 4]);
    material[..32].copy_from_slice(shared);
    material[32..64].copy_from_slice(ephemeral);
    material[64..96].copy_from_slice(recipient);
    material[96..112].copy_from_slice(&ledger.0);
    material[112..].copy_from_slice(&epoch.to_be_bytes());
    Zeroizing::new(blake3::derive_key(CONTEXT_DATA_KEY, material.as_ref()))
}

/// The writer's side of an epoch's key agreement: a fresh ephemeral X25519 secret with the
/// auditor's public key. The ephemeral secret is consumed here; the writer keeps only the
/// derived data key for the epoch, so it cannot re-derive any other epoch's key.
pub fn agree_writer(
    recipient: &[u8; 32],
    ledger: LedgerId,
    epoch: u32,
) -> Result<([u8; 32], Zeroizing<[u8; 32]>), CryptoError> {
    let secret = EphemeralSecret::random_from_rng(OsRng);
    let ephemeral = PublicKey::from(&secret).to_bytes();
    let shared = secret.diffie_hellman(&PublicKey::from(*recipient));
    if !shared.was_contributory() {
        return Err(CryptoError::InvalidKey(
            "auditor public key is a low-order point",
        ));
    }
    Ok((
        ephemeral,
        kdf(shared.as_bytes(), &ephemeral, recipient, ledger, epoch),
    ))
}

/// The writer's side of the agreement from a given ephemeral secret, for test vectors and
/// benchmarks that need reproducible keys. The ledger itself always draws a fresh secret
/// ([`agree_writer`]).
pub fn agree_from_secret(
    secret: [u8; 32],
    recipient: &[u8; 32],
    ledger: LedgerId,
    epoch: u32,
) -> Result<([u8; 32], DataKey), CryptoError> {
    let secret = StaticSecret::from(secret);
    let ephemeral = PublicKey::from(&secret).to_bytes();
    let shared = secret.diffie_hellman(&PublicKey::from(*recipient));
    if !shared.was_contributory() {
        return Err(CryptoError::InvalidKey(
            "auditor public key is a low-order point",
        ));
    }
    let key = kdf(shared.as_bytes(), &ephemeral, recipient, ledger, epoch);
    Ok((ephemeral, DataKey::from_bytes(&key)))
}

/// A data key from raw bytes (the writer's key file).
pub fn data_key(bytes: &Zeroizing<[u8; 32]>) -> DataKey {
    DataKey::from_bytes(bytes)
}

/// The auditor's X25519 key pair.
pub struct AuditorKey {
    secret: StaticSecret,
}

impl AuditorKey {
    /// A new random key pair.
    pub fn generate() -> AuditorKey {
        AuditorKey {
            secret: StaticSecret::random_from_rng(OsRng),
        }
    }

    /// A key pair from a secret's 32 bytes (test vectors, key import).
    pub fn from_bytes(secret: [u8; 32]) -> AuditorKey {
        AuditorKey {
            secret: StaticSecret::from(secret),
        }
    }

    /// The public half, for `tally init --recipient`.
    pub fn public(&self) -> [u8; 32] {
        PublicKey::from(&self.secret).to_bytes()
    }

    /// The data key of an epoch, from the ephemeral key in its genesis or certificate.
    pub fn epoch_key(
        &self,
        ephemeral: &[u8; 32],
        ledger: LedgerId,
        epoch: u32,
    ) -> Result<DataKey, CryptoError> {
        let shared = self.secret.diffie_hellman(&PublicKey::from(*ephemeral));
        if !shared.was_contributory() {
            return Err(CryptoError::InvalidKey(
                "epoch ephemeral key is a low-order point",
            ));
        }
        let key = kdf(shared.as_bytes(), ephemeral, &self.public(), ledger, epoch);
        Ok(DataKey::from_bytes(&key))
    }

    /// Write `auditor.key` (0600) and its `.pub` beside it. Refuses to overwrite.
    pub fn write(&self, secret_path: &Path) -> Result<()> {
        let secret_hex = Zeroizing::new(hex::encode(self.secret.as_bytes()));
        let text = Zeroizing::new(format!("{AUDITOR_SECRET_HEADER}{}\n", secret_hex.as_str()));
        let pub_path = secret_path.with_extension("pub");
        if pub_path.symlink_metadata().is_ok() {
            return Err(Error::io(
                &pub_path,
                std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            ));
        }
        write_new_secret(secret_path, text.as_bytes())?;
        let public = write_new(
            &pub_path,
            format!("{AUDITOR_PUBLIC_HEADER}{}\n", hex::encode(self.public())).as_bytes(),
            0o644,
        );
        if public.is_err() {
            // Half a key pair is no use to anyone: leave nothing behind.
            let _ = fs::remove_file(secret_path);
        }
        public
    }

    /// Read an auditor secret key file; refuses files others can read.
    pub fn read(path: &Path) -> Result<AuditorKey> {
        let text = read_secret(path)?;
        let hexpart = strip_line(&text, AUDITOR_SECRET_HEADER, path, "auditor secret key")?;
        let bytes = Zeroizing::new(parse_hex::<32>(hexpart, "auditor secret key")?);
        Ok(AuditorKey {
            secret: StaticSecret::from(*bytes),
        })
    }
}

/// An approver's Ed25519 key pair: approvals are signed with it, and the policy lists
/// its public half (`[approvals.approvers]`).
pub struct ApproverKey {
    key: ed25519_dalek::SigningKey,
}

impl ApproverKey {
    /// A new random key pair.
    pub fn generate() -> ApproverKey {
        ApproverKey {
            key: ed25519_dalek::SigningKey::generate(&mut OsRng),
        }
    }

    /// The signing key.
    pub fn signing_key(&self) -> &ed25519_dalek::SigningKey {
        &self.key
    }

    /// The public key, 64 lowercase hex characters (what the policy lists).
    pub fn public_hex(&self) -> String {
        hex::encode(self.key.verifying_key().to_bytes())
    }

    /// Write the secret (0600) and its `.pub` (the public key's hex) beside it.
    /// Refuses to overwrite either.
    pub fn write(&self, secret_path: &Path) -> Result<()> {
        let pub_path = secret_path.with_extension("pub");
        if pub_path.symlink_metadata().is_ok() {
            return Err(Error::io(
                &pub_path,
                std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            ));
        }
        let seed = Zeroizing::new(hex::encode(self.key.to_bytes()));
        let text = Zeroizing::new(format!("{APPROVER_SECRET_HEADER}{}\n", seed.as_str()));
        write_new_secret(secret_path, text.as_bytes())?;
        let public = write_new(
            &pub_path,
            format!("{APPROVER_PUBLIC_HEADER}{}\n", self.public_hex()).as_bytes(),
            0o644,
        );
        if public.is_err() {
            let _ = fs::remove_file(secret_path);
        }
        public
    }

    /// Read an approver secret key file; refuses files others can read.
    pub fn read(path: &Path) -> Result<ApproverKey> {
        let text = read_secret(path)?;
        let hexpart = strip_line(&text, APPROVER_SECRET_HEADER, path, "approver secret key")?;
        let bytes = Zeroizing::new(parse_hex::<32>(hexpart, "approver secret key")?);
        Ok(ApproverKey {
            key: ed25519_dalek::SigningKey::from_bytes(&bytes),
        })
    }
}

/// Read an auditor public key file (`auditor.pub`).
pub fn read_auditor_public(path: &Path) -> Result<[u8; 32]> {
    let text = fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let hexpart = strip_line(&text, AUDITOR_PUBLIC_HEADER, path, "auditor public key")?;
    Ok(parse_hex::<32>(hexpart, "auditor public key")?)
}

/// The ledger's public verification key file (`ledger.pub`): ledger id, the genesis
/// (epoch 0) Ed25519 key, and (version 2) the log key's vkey. All later epoch keys are
/// certified from the epoch 0 key inside the chain; the log key signs the ledger's C2SP
/// checkpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerPublic {
    /// The ledger id.
    pub ledger_id: LedgerId,
    /// Epoch 0 verifying key.
    pub verifying_key: [u8; 32],
    /// The log key (`None` in a version 1 file, written before ledgers had one).
    pub log_key: Option<crate::tlog::note::Vkey>,
}

impl LedgerPublic {
    /// Text form: version 2 when it names a log key, else version 1.
    pub fn to_text(&self) -> String {
        match &self.log_key {
            Some(v) => format!(
                "{LEDGER_PUBLIC_HEADER_V2}ledger {}\nkey {}\nlog {}\n",
                self.ledger_id,
                hex::encode(self.verifying_key),
                v.to_text()
            ),
            None => format!(
                "{LEDGER_PUBLIC_HEADER}ledger {}\nkey {}\n",
                self.ledger_id,
                hex::encode(self.verifying_key)
            ),
        }
    }

    /// Parse the text form strictly (version 1 or 2). A version 2 log key must be the
    /// ledger's: named after its origin, of signature type 0x01.
    pub fn from_text(text: &str) -> Result<LedgerPublic, FormatError> {
        let bad = || {
            FormatError::invalid(
                "ledger public key",
                "expected `tally ledger public key v1` (or v2), `ledger <hex>`, `key <hex>` (and in v2 `log <vkey>`)",
            )
        };
        let (v2, rest) = match text.strip_prefix(LEDGER_PUBLIC_HEADER) {
            Some(r) => (false, r),
            None => (
                true,
                text.strip_prefix(LEDGER_PUBLIC_HEADER_V2).ok_or_else(bad)?,
            ),
        };
        let mut lines = rest.split('\n');
        let id = lines
            .next()
            .and_then(|l| l.strip_prefix("ledger "))
            .ok_or_else(bad)?;
        let key = lines
            .next()
            .and_then(|l| l.strip_prefix("key "))
            .ok_or_else(bad)?;
        let log = if v2 {
            Some(
                lines
                    .next()
                    .and_then(|l| l.strip_prefix("log "))
                    .ok_or_else(bad)?,
            )
        } else {
            None
        };
        if lines.next() != Some("") || lines.next().is_some() {
            return Err(bad());
        }
        let ledger_id = LedgerId(parse_hex::<16>(id, "ledger id")?);
        let log_key = match log {
            Some(l) => {
                let v = crate::tlog::note::Vkey::parse(l)
                    .map_err(|e| FormatError::invalid("ledger public key", e.to_string()))?;
                if v.name != crate::tlog::origin(ledger_id)
                    || v.sig_type != crate::tlog::note::TYPE_ED25519
                {
                    return Err(FormatError::invalid(
                        "ledger public key",
                        format!(
                            "the log key must be named {} with signature type 0x01",
                            crate::tlog::origin(ledger_id)
                        ),
                    ));
                }
                Some(v)
            }
            None => None,
        };
        Ok(LedgerPublic {
            ledger_id,
            verifying_key: parse_hex::<32>(key, "ledger key")?,
            log_key,
        })
    }

    /// Read `ledger.pub`.
    pub fn read(path: &Path) -> Result<LedgerPublic> {
        let text = fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Ok(LedgerPublic::from_text(&text)?)
    }
}

/// Verify an Ed25519 signature with a raw 32-byte key.
pub fn verify_signature(
    key: &[u8; 32],
    message: &[u8],
    signature: &[u8; 64],
    what: &'static str,
) -> Result<(), CryptoError> {
    let vk = VerifyingKey::from_bytes(key)
        .map_err(|_| CryptoError::InvalidKey("not an Ed25519 point"))?;
    vk.verify_strict(message, &Signature::from_bytes(signature))
        .map_err(|_| CryptoError::BadSignature { what })
}

/// Verify a checkpoint's key id and signature under the given epoch key.
pub fn verify_checkpoint(
    cp: &crate::format::Checkpoint,
    key: &[u8; 32],
) -> Result<(), CryptoError> {
    let expected = key_id(key);
    if cp.key_id != expected {
        return Err(CryptoError::WrongKey {
            what: "checkpoint",
            expected: hex::encode(expected),
            found: hex::encode(cp.key_id),
        });
    }
    verify_signature(key, cp.body().as_bytes(), &cp.signature, "checkpoint")
}
