//! The byte format: entries, their hashes, checkpoints and the export framing.
//!
//! `docs/FORMAT.md` specifies every byte; the test vectors there are checked by the test
//! suite. Decoding is strict: fixed-width big-endian integers (no overlong encodings),
//! known versions and types only, exact lengths, no trailing bytes, zero where a field is
//! unused. Hashes and signatures cover the exact stored bytes.

use std::fmt;
use std::sync::OnceLock;

use crate::error::FormatError;

/// Entry format version.
pub const VERSION: u8 = 1;
/// Length of an entry header in bytes.
pub const HEADER_LEN: usize = 98;
/// Largest entry body in bytes (an encrypted decision is far smaller).
pub const MAX_BODY_LEN: usize = 64 * 1024;
/// Length of a genesis body.
pub const GENESIS_BODY_LEN: usize = 32 + 32 + 32 + 64;
/// Length of an epoch-certificate body.
pub const EPOCH_BODY_LEN: usize = 32 + 32 + 64;
/// AEAD tag length (Poly1305).
pub const TAG_LEN: usize = 16;

/// BLAKE3 derive-key context for entry hashes.
pub const CONTEXT_ENTRY_HASH: &str = "tally v2 entry hash";
/// BLAKE3 derive-key context for the chain hashes of `tally export v1` files (ledgers
/// written in layout 2 or before), which this build verifies but never writes.
pub const CONTEXT_ENTRY_HASH_V1: &str = "tally v1 entry hash";
/// BLAKE3 derive-key context for key ids.
pub const CONTEXT_KEY_ID: &str = "tally v1 key id";
/// BLAKE3 derive-key context for an epoch's data key.
pub const CONTEXT_DATA_KEY: &str = "tally v1 epoch data key";
/// Signature domain for the genesis entry.
pub const DOMAIN_GENESIS: &[u8] = b"tally v1 genesis\0";
/// Signature domain for epoch certificates.
pub const DOMAIN_EPOCH: &[u8] = b"tally v1 epoch certificate\0";

/// A 16-byte ledger id, random at `init`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LedgerId(pub [u8; 16]);

impl fmt::Display for LedgerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}
impl fmt::Debug for LedgerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LedgerId({self})")
    }
}

pub use tally_record::Hash;

fn entry_hash_key() -> &'static [u8; 32] {
    static KEY: OnceLock<[u8; 32]> = OnceLock::new();
    KEY.get_or_init(|| blake3::derive_key(CONTEXT_ENTRY_HASH, b""))
}

/// The chain hash of an entry: BLAKE3 keyed with `derive_key("tally v2 entry hash", "")`
/// over the entry's Merkle leaf hash, `SHA-256(0x00 ‖ entry)` of its exact stored bytes
/// ([`crate::merkle::leaf_hash`]). Needs no secret. The entry's bytes are hashed
/// once, for the tree and the chain both.
pub fn entry_hash(entry: &[u8]) -> Hash {
    chain_hash(&crate::merkle::leaf_hash(entry))
}

/// The chain hash of the entry whose Merkle leaf hash is `leaf` (see [`entry_hash`]).
pub fn chain_hash(leaf: &[u8; 32]) -> Hash {
    Hash(*blake3::keyed_hash(entry_hash_key(), leaf).as_bytes())
}

/// How a ledger's entries are chained: fixed for the ledger when it is created, and named
/// by the magic of its segments and its exports (docs/FORMAT.md, "Entry").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ChainRule {
    /// [`entry_hash`]: keyed BLAKE3 over the entry's Merkle leaf hash. Layout 3 segments
    /// and `tally export v2`, the only form this build writes.
    LeafHash,
    /// Keyed BLAKE3 (`derive_key("tally v1 entry hash", "")`) over the entry's stored
    /// bytes: `tally export v1`, from ledgers written in layout 2 or before. Verified,
    /// never written.
    EntryBytes,
}

impl ChainRule {
    /// The chain hash of the entry `entry` under this rule.
    pub fn hash(self, entry: &[u8]) -> Hash {
        match self {
            ChainRule::LeafHash => entry_hash(entry),
            ChainRule::EntryBytes => {
                static KEY: OnceLock<[u8; 32]> = OnceLock::new();
                let key = KEY.get_or_init(|| blake3::derive_key(CONTEXT_ENTRY_HASH_V1, b""));
                Hash(*blake3::keyed_hash(key, entry).as_bytes())
            }
        }
    }

    /// [`ChainRule::hash`] of `entry`, given its Merkle leaf hash `leaf` (which the
    /// leaf-hash rule then does not compute again).
    pub fn hash_with_leaf(self, entry: &[u8], leaf: &[u8; 32]) -> Hash {
        match self {
            ChainRule::LeafHash => chain_hash(leaf),
            rule => rule.hash(entry),
        }
    }
}

/// The 4-byte id of an Ed25519 verifying key: the first bytes of
/// `derive_key("tally v1 key id", key)`.
pub fn key_id(verifying_key: &[u8; 32]) -> [u8; 4] {
    let d = blake3::derive_key(CONTEXT_KEY_ID, verifying_key);
    [d[0], d[1], d[2], d[3]]
}

/// What an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EntryType {
    /// Seq 0: the ledger's identity, first epoch key and auditor recipient.
    Genesis = 0,
    /// An encrypted decision.
    Decision = 1,
    /// A new epoch's keys, certified by the previous epoch's signing key.
    Epoch = 2,
}

impl EntryType {
    fn from_u8(b: u8) -> Result<EntryType, FormatError> {
        match b {
            0 => Ok(EntryType::Genesis),
            1 => Ok(EntryType::Decision),
            2 => Ok(EntryType::Epoch),
            other => Err(FormatError::UnknownEntryType(other)),
        }
    }
}

/// The clear header of every entry. Bound into the AEAD as associated data and into
/// every signature, so no field can change without detection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the entry is.
    pub entry_type: EntryType,
    /// The ledger it belongs to.
    pub ledger_id: LedgerId,
    /// Position in the chain, from 0, gap-free.
    pub seq: u64,
    /// Key epoch in force for this entry (for an epoch certificate: the new epoch).
    pub epoch: u32,
    /// The ledger's wall time when it wrote the entry, ms since the Unix epoch.
    pub wall_ms: u64,
    /// Hash of the previous entry; all zero for genesis.
    pub prev_hash: Hash,
    /// XChaCha20 nonce for a decision; all zero otherwise.
    pub nonce: [u8; 24],
    /// Length of the body that follows.
    pub body_len: u32,
}

impl Header {
    /// Encode to the fixed 98-byte form.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = VERSION;
        b[1] = self.entry_type as u8;
        b[2..18].copy_from_slice(&self.ledger_id.0);
        b[18..26].copy_from_slice(&self.seq.to_be_bytes());
        b[26..30].copy_from_slice(&self.epoch.to_be_bytes());
        b[30..38].copy_from_slice(&self.wall_ms.to_be_bytes());
        b[38..70].copy_from_slice(&self.prev_hash.0);
        b[70..94].copy_from_slice(&self.nonce);
        b[94..98].copy_from_slice(&self.body_len.to_be_bytes());
        b
    }

    /// Decode and check a header (strict: version, type, bounds, unused fields zero).
    pub fn decode(b: &[u8]) -> Result<Header, FormatError> {
        if b.len() < HEADER_LEN {
            return Err(FormatError::Truncated {
                what: "entry header",
                need: HEADER_LEN,
                have: b.len(),
            });
        }
        if b[0] != VERSION {
            return Err(FormatError::UnknownVersion {
                what: "entry",
                version: b[0].into(),
            });
        }
        let entry_type = EntryType::from_u8(b[1])?;
        let h = Header {
            entry_type,
            ledger_id: LedgerId(arr(&b[2..18])),
            seq: u64::from_be_bytes(arr(&b[18..26])),
            epoch: u32::from_be_bytes(arr(&b[26..30])),
            wall_ms: u64::from_be_bytes(arr(&b[30..38])),
            prev_hash: Hash(arr(&b[38..70])),
            nonce: arr(&b[70..94]),
            body_len: u32::from_be_bytes(arr(&b[94..98])),
        };
        let body_len = h.body_len as usize;
        let expected = match entry_type {
            EntryType::Genesis => Some(GENESIS_BODY_LEN),
            EntryType::Epoch => Some(EPOCH_BODY_LEN),
            EntryType::Decision => None,
        };
        if let Some(n) = expected {
            if body_len != n {
                return Err(FormatError::invalid(
                    "entry body",
                    format!("{entry_type:?} body must be {n} bytes, header says {body_len}"),
                ));
            }
            if h.nonce != [0; 24] {
                return Err(FormatError::invalid(
                    "entry nonce",
                    "must be zero on unencrypted entries",
                ));
            }
        } else if !(TAG_LEN..=MAX_BODY_LEN).contains(&body_len) {
            return Err(FormatError::invalid(
                "entry body",
                format!("decision body of {body_len} bytes is outside {TAG_LEN}..={MAX_BODY_LEN}"),
            ));
        }
        match entry_type {
            EntryType::Genesis if h.seq != 0 || h.epoch != 0 || h.prev_hash != Hash::default() => {
                return Err(FormatError::invalid(
                    "genesis",
                    "must have seq 0, epoch 0 and a zero previous hash",
                ))
            }
            EntryType::Decision | EntryType::Epoch if h.seq == 0 => {
                return Err(FormatError::invalid("entry", "only genesis has seq 0"))
            }
            EntryType::Epoch if h.epoch == 0 => {
                return Err(FormatError::invalid(
                    "epoch certificate",
                    "certifies epoch 0",
                ))
            }
            _ => {}
        }
        Ok(h)
    }
}

fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(b);
    a
}

/// A decoded entry: its header and a view of its body, over the exact stored bytes.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    /// The header.
    pub header: Header,
    /// The whole stored entry (header and body): what is hashed.
    pub bytes: &'a [u8],
}

impl<'a> Entry<'a> {
    /// Decode an entry strictly: the buffer must hold exactly one entry.
    pub fn decode(bytes: &'a [u8]) -> Result<Entry<'a>, FormatError> {
        let header = Header::decode(bytes)?;
        let total = HEADER_LEN + header.body_len as usize;
        if bytes.len() < total {
            return Err(FormatError::Truncated {
                what: "entry body",
                need: total,
                have: bytes.len(),
            });
        }
        if bytes.len() > total {
            return Err(FormatError::TrailingBytes {
                what: "entry",
                count: bytes.len() - total,
            });
        }
        Ok(Entry { header, bytes })
    }

    /// The header bytes (AEAD associated data, and signed).
    pub fn header_bytes(&self) -> &'a [u8] {
        &self.bytes[..HEADER_LEN]
    }

    /// The body bytes.
    pub fn body(&self) -> &'a [u8] {
        &self.bytes[HEADER_LEN..]
    }

    /// This entry's chain hash.
    pub fn hash(&self) -> Hash {
        entry_hash(self.bytes)
    }

    /// The genesis body, if this is genesis.
    pub fn genesis(&self) -> Option<GenesisBody> {
        (self.header.entry_type == EntryType::Genesis).then(|| {
            let b = self.body();
            GenesisBody {
                verifying_key: arr(&b[0..32]),
                recipient: arr(&b[32..64]),
                ephemeral: arr(&b[64..96]),
                signature: arr(&b[96..160]),
            }
        })
    }

    /// The epoch-certificate body, if this is one.
    pub fn epoch_cert(&self) -> Option<EpochBody> {
        (self.header.entry_type == EntryType::Epoch).then(|| {
            let b = self.body();
            EpochBody {
                verifying_key: arr(&b[0..32]),
                ephemeral: arr(&b[32..64]),
                signature: arr(&b[64..128]),
            }
        })
    }

    /// The message the genesis or epoch signature covers: domain, header, body without
    /// the trailing signature.
    pub fn signed_message(&self) -> Vec<u8> {
        let domain = match self.header.entry_type {
            EntryType::Genesis => DOMAIN_GENESIS,
            _ => DOMAIN_EPOCH,
        };
        let body = self.body();
        let unsigned = &body[..body.len().saturating_sub(64)];
        [domain, self.header_bytes(), unsigned].concat()
    }
}

/// Body of the genesis entry (all in the clear).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenesisBody {
    /// Epoch 0 Ed25519 verifying key; `ledger.pub` names it.
    pub verifying_key: [u8; 32],
    /// The auditor's X25519 public key: every epoch's data key is agreed with it.
    pub recipient: [u8; 32],
    /// Epoch 0's ephemeral X25519 public key.
    pub ephemeral: [u8; 32],
    /// Ed25519 signature by `verifying_key` over [`Entry::signed_message`].
    pub signature: [u8; 64],
}

/// Body of an epoch certificate (all in the clear).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochBody {
    /// The new epoch's Ed25519 verifying key.
    pub verifying_key: [u8; 32],
    /// The new epoch's ephemeral X25519 public key.
    pub ephemeral: [u8; 32],
    /// Ed25519 signature by the previous epoch's key over [`Entry::signed_message`].
    pub signature: [u8; 64],
}

/// A signed checkpoint: the ledger's state at `size` entries, sealed by the key of
/// `epoch` (the epoch of entry `size - 1`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// The ledger.
    pub ledger_id: LedgerId,
    /// Number of entries sealed (`seq` of the last one plus one).
    pub size: u64,
    /// Hash of entry `size - 1`.
    pub head: Hash,
    /// Epoch whose key signed.
    pub epoch: u32,
    /// The ledger's wall time at sealing, ms since the Unix epoch.
    pub wall_ms: u64,
    /// Key id of the signing key.
    pub key_id: [u8; 4],
    /// Ed25519 signature over [`Checkpoint::body`].
    pub signature: [u8; 64],
}

const CP_FIRST: &str = "tally checkpoint v1\n";
const CP_SIG_PREFIX: &str = "\u{2014} ";

impl Checkpoint {
    /// The signed text: six lines, each ending in `\n`.
    pub fn body_text(
        ledger_id: LedgerId,
        size: u64,
        head: Hash,
        epoch: u32,
        wall_ms: u64,
    ) -> String {
        format!("{CP_FIRST}ledger {ledger_id}\nsize {size}\nhead {head}\nepoch {epoch}\ntime {wall_ms}\n")
    }

    /// The signed text of this checkpoint.
    pub fn body(&self) -> String {
        Checkpoint::body_text(
            self.ledger_id,
            self.size,
            self.head,
            self.epoch,
            self.wall_ms,
        )
    }

    /// The portable text form (stored, exported and printed as is): the body, a blank
    /// line, and one signature line `— <key id> <signature>` in lowercase hex.
    pub fn to_text(&self) -> String {
        format!(
            "{}\n{CP_SIG_PREFIX}{} {}\n",
            self.body(),
            hex::encode(self.key_id),
            hex::encode(self.signature)
        )
    }

    /// Parse the text form strictly: exact lines, canonical decimals, lowercase hex,
    /// nothing after the signature line.
    pub fn from_text(text: &[u8]) -> Result<Checkpoint, FormatError> {
        let text = std::str::from_utf8(text)
            .map_err(|_| FormatError::invalid("checkpoint", "not UTF-8"))?;
        let rest = text.strip_prefix(CP_FIRST).ok_or_else(|| {
            FormatError::invalid("checkpoint", "does not start with `tally checkpoint v1`")
        })?;
        let mut lines = rest.split_inclusive('\n');
        let mut field = |name: &'static str| -> Result<&str, FormatError> {
            let line = lines.next().ok_or_else(|| {
                FormatError::invalid("checkpoint", format!("missing `{name}` line"))
            })?;
            line.strip_suffix('\n')
                .and_then(|l| l.strip_prefix(name))
                .and_then(|l| l.strip_prefix(' '))
                .ok_or_else(|| {
                    FormatError::invalid("checkpoint", format!("expected `{name} ...` line"))
                })
        };
        let ledger_id = LedgerId(parse_hex::<16>(field("ledger")?, "checkpoint ledger")?);
        let size = parse_decimal(field("size")?, "checkpoint size")?;
        let head = Hash(parse_hex::<32>(field("head")?, "checkpoint head")?);
        let epoch = u32::try_from(parse_decimal(field("epoch")?, "checkpoint epoch")?)
            .map_err(|_| FormatError::invalid("checkpoint epoch", "out of range"))?;
        let wall_ms = parse_decimal(field("time")?, "checkpoint time")?;
        if lines.next() != Some("\n") {
            return Err(FormatError::invalid(
                "checkpoint",
                "expected a blank line before the signature",
            ));
        }
        let sig_line = lines
            .next()
            .ok_or_else(|| FormatError::invalid("checkpoint", "missing signature line"))?;
        let sig = sig_line
            .strip_suffix('\n')
            .and_then(|l| l.strip_prefix(CP_SIG_PREFIX))
            .ok_or_else(|| {
                FormatError::invalid(
                    "checkpoint",
                    "signature line must be `— <key id> <signature>`",
                )
            })?;
        let (kid, signature) = sig.split_once(' ').ok_or_else(|| {
            FormatError::invalid(
                "checkpoint",
                "signature line must be `— <key id> <signature>`",
            )
        })?;
        let key_id = parse_hex::<4>(kid, "checkpoint key id")?;
        let signature = parse_hex::<64>(signature, "checkpoint signature")?;
        if let Some(extra) = lines.next() {
            return Err(FormatError::TrailingBytes {
                what: "checkpoint",
                count: extra.len() + lines.map(str::len).sum::<usize>(),
            });
        }
        if size == 0 {
            return Err(FormatError::invalid(
                "checkpoint size",
                "a checkpoint seals at least genesis",
            ));
        }
        Ok(Checkpoint {
            ledger_id,
            size,
            head,
            epoch,
            wall_ms,
            key_id,
            signature,
        })
    }
}

/// Parse lowercase hex of exactly `N` bytes.
pub fn parse_hex<const N: usize>(s: &str, what: &'static str) -> Result<[u8; N], FormatError> {
    if s.len() != 2 * N || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(FormatError::invalid(
            what,
            format!("expected {} lowercase hex characters", 2 * N),
        ));
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).map_err(|e| FormatError::invalid(what, e.to_string()))?;
    Ok(out)
}

/// Parse a canonical decimal u64: digits only, no sign, no leading zero (except "0").
pub fn parse_decimal(s: &str, what: &'static str) -> Result<u64, FormatError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0'))
    {
        return Err(FormatError::invalid(
            what,
            "expected a canonical decimal number",
        ));
    }
    s.parse()
        .map_err(|_| FormatError::invalid(what, "number out of range"))
}

/// One item of a ledger's content, in order: entries by seq, each checkpoint right after
/// the entry it seals (the entry with `seq == size - 1`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// An entry's stored bytes.
    Entry(Vec<u8>),
    /// A checkpoint's text form.
    Checkpoint(Vec<u8>),
    /// The C2SP checkpoint of the size just sealed with the witnesses' cosignatures (a
    /// signed note), right after the checkpoint of that size: in an export, or beside a
    /// ledger directory (`checkpoint.cosigned`). Self-authenticating, never chained.
    Cosigned(Vec<u8>),
}

/// Export file magic: 16 bytes.
pub const EXPORT_MAGIC: &[u8; 16] = b"tally export v2\n";
/// The magic of exports chained by [`ChainRule::EntryBytes`] (written by builds before
/// layout 3), which [`crate::export::ExportReader`] still reads.
pub const EXPORT_MAGIC_V1: &[u8; 16] = b"tally export v1\n";
/// Frame tag of an entry.
pub const FRAME_ENTRY: u8 = 1;
/// Frame tag of a checkpoint.
pub const FRAME_CHECKPOINT: u8 = 2;
/// Frame tag of a cosigned C2SP checkpoint.
pub const FRAME_COSIGNED: u8 = 3;
/// Frame tag of the end marker.
pub const FRAME_END: u8 = 0xff;
/// Frame tag of the signed end marker: counts, the Merkle root of the entries, the log
/// key's signature over them (docs/FORMAT.md, "Export file").
pub const FRAME_SIGNED_END: u8 = 0xfe;
/// Signature domain of the signed end of an export (its NUL keeps it from ever being a
/// signed note's text).
pub const DOMAIN_EXPORT_END: &[u8] = b"tally v1 export end\0";
/// Largest frame payload.
pub const MAX_FRAME_LEN: usize = HEADER_LEN + MAX_BODY_LEN;
