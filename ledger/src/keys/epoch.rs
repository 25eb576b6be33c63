//! The writer's secrets for one key epoch: its signing key, its data key and the
//! agreement that made it, in the writer key file.

use std::fs;
use std::path::Path;

use ed25519_dalek::{Signer, SigningKey};
use rand_core::OsRng;
use zeroize::Zeroizing;

use crate::error::{CryptoError, Error, FormatError, Result};
use crate::format::{
    key_id, parse_decimal, parse_hex, Checkpoint, EntryType, Hash, Header, LedgerId, DOMAIN_EPOCH,
    DOMAIN_GENESIS, EPOCH_BODY_LEN, GENESIS_BODY_LEN,
};

use super::agree_writer;
use crate::files::{read_secret, sync_parent, write_new_secret, WRITER_HEADER};

/// The writer's secrets for its current epoch: signing key and data key.
pub struct EpochSecrets {
    /// The epoch.
    pub epoch: u32,
    /// Ed25519 signing key (zeroized on drop).
    pub signing: SigningKey,
    /// Raw data key (zeroized on drop).
    pub data: Zeroizing<[u8; 32]>,
    /// Seq of the entry that began this epoch (genesis or its certificate).
    pub from_seq: u64,
    /// Wall time the epoch began, ms since the Unix epoch.
    pub since_ms: u64,
}

impl EpochSecrets {
    /// A fresh epoch: new signing key, new data key agreed with the auditor.
    /// Returns the secrets and the ephemeral public key to publish.
    pub fn generate(
        epoch: u32,
        recipient: &[u8; 32],
        ledger: LedgerId,
    ) -> Result<(EpochSecrets, [u8; 32]), CryptoError> {
        let (ephemeral, data) = agree_writer(recipient, ledger, epoch)?;
        let signing = SigningKey::generate(&mut OsRng);
        let secrets = EpochSecrets {
            epoch,
            signing,
            data,
            from_seq: 0,
            since_ms: 0,
        };
        Ok((secrets, ephemeral))
    }

    /// Secrets from raw bytes (test vectors, and attack simulations in tests).
    pub fn from_bytes(epoch: u32, signing: [u8; 32], data: [u8; 32]) -> EpochSecrets {
        EpochSecrets {
            epoch,
            signing: SigningKey::from_bytes(&signing),
            data: Zeroizing::new(data),
            from_seq: 0,
            since_ms: 0,
        }
    }

    /// The verifying key.
    pub fn verifying_key(&self) -> [u8; 32] {
        self.signing.verifying_key().to_bytes()
    }

    /// Sign a message.
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.signing.sign(message).to_bytes()
    }

    /// Seal the first `size` entries, whose last has hash `head`, with this epoch's key.
    pub fn sign_checkpoint(
        &self,
        ledger_id: LedgerId,
        size: u64,
        head: Hash,
        wall_ms: u64,
    ) -> Checkpoint {
        let body = Checkpoint::body_text(ledger_id, size, head, self.epoch, wall_ms);
        Checkpoint {
            ledger_id,
            size,
            head,
            epoch: self.epoch,
            wall_ms,
            key_id: key_id(&self.verifying_key()),
            signature: self.sign(body.as_bytes()),
        }
    }

    /// The genesis entry (seq 0) of a ledger whose epoch 0 key is this one.
    pub fn genesis_entry(
        &self,
        ledger_id: LedgerId,
        wall_ms: u64,
        recipient: &[u8; 32],
        ephemeral: &[u8; 32],
    ) -> Vec<u8> {
        let header = Header {
            entry_type: EntryType::Genesis,
            ledger_id,
            seq: 0,
            epoch: 0,
            wall_ms,
            prev_hash: Hash::default(),
            nonce: [0; 24],
            body_len: GENESIS_BODY_LEN as u32,
        };
        let mut bytes = header.encode().to_vec();
        bytes.extend_from_slice(&self.verifying_key());
        bytes.extend_from_slice(recipient);
        bytes.extend_from_slice(ephemeral);
        let sig = self.sign(&[DOMAIN_GENESIS, &bytes[..]].concat());
        bytes.extend_from_slice(&sig);
        bytes
    }

    /// The epoch certificate entry at `seq` for `next` (the following epoch), signed with
    /// this epoch's key.
    pub fn certify_epoch(
        &self,
        next: &EpochSecrets,
        ephemeral: &[u8; 32],
        ledger_id: LedgerId,
        seq: u64,
        wall_ms: u64,
        prev_hash: Hash,
    ) -> Vec<u8> {
        let header = Header {
            entry_type: EntryType::Epoch,
            ledger_id,
            seq,
            epoch: next.epoch,
            wall_ms,
            prev_hash,
            nonce: [0; 24],
            body_len: EPOCH_BODY_LEN as u32,
        };
        let mut bytes = header.encode().to_vec();
        bytes.extend_from_slice(&next.verifying_key());
        bytes.extend_from_slice(ephemeral);
        let sig = self.sign(&[DOMAIN_EPOCH, &bytes[..]].concat());
        bytes.extend_from_slice(&sig);
        bytes
    }

    fn to_text(&self, ledger: LedgerId) -> Zeroizing<String> {
        let sign = Zeroizing::new(hex::encode(self.signing.to_bytes()));
        let data = Zeroizing::new(hex::encode(self.data.as_ref()));
        Zeroizing::new(format!(
            "{WRITER_HEADER}ledger {ledger}\nepoch {}\nfrom {}\nsince {}\nsign {}\ndata {}\n",
            self.epoch,
            self.from_seq,
            self.since_ms,
            sign.as_str(),
            data.as_str()
        ))
    }

    /// Write the secrets to `path` (0600) durably, replacing any file there atomically.
    pub fn write(&self, path: &Path, ledger: LedgerId) -> Result<()> {
        let tmp = path.with_extension("tmp");
        let _ = fs::remove_file(&tmp);
        // Errors name the key file, not the temporary one beside it.
        write_new_secret(&tmp, self.to_text(ledger).as_bytes()).map_err(|e| match e {
            Error::Io { source, .. } => Error::io(path, source),
            other => other,
        })?;
        fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
        sync_parent(path)
    }

    /// Read a writer key file.
    pub fn read(path: &Path, ledger: LedgerId) -> Result<EpochSecrets> {
        let text = read_secret(path)?;
        let bad = || FormatError::invalid("writer key", "malformed writer key file");
        let rest = text.strip_prefix(WRITER_HEADER).ok_or_else(bad)?;
        let mut lines = rest.split('\n');
        let mut field = |name: &str| {
            lines
                .next()
                .and_then(|l| l.strip_prefix(name))
                .ok_or_else(bad)
        };
        let id = LedgerId(parse_hex::<16>(field("ledger ")?, "writer key ledger")?);
        let epoch = u32::try_from(parse_decimal(field("epoch ")?, "writer key epoch")?)
            .map_err(|_| bad())?;
        let from_seq = parse_decimal(field("from ")?, "writer key from")?;
        let since_ms = parse_decimal(field("since ")?, "writer key since")?;
        let sign = Zeroizing::new(parse_hex::<32>(field("sign ")?, "writer signing key")?);
        let data = Zeroizing::new(parse_hex::<32>(field("data ")?, "writer data key")?);
        if lines.next() != Some("") || lines.next().is_some() {
            return Err(bad().into());
        }
        if id != ledger {
            return Err(FormatError::invalid(
                "writer key",
                format!("belongs to ledger {id}, not {ledger}"),
            )
            .into());
        }
        Ok(EpochSecrets {
            epoch,
            signing: SigningKey::from_bytes(&sign),
            data,
            from_seq,
            since_ms,
        })
    }
}
