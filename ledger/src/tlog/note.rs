//! C2SP signed notes (c2sp.org/signed-note), verifier keys (vkeys), Ed25519 note
//! signatures (type `0x01`) and Ed25519 checkpoint cosignatures (type `0x04`,
//! c2sp.org/tlog-cosignature, `cosignature/v1`), and the checkpoint body
//! (c2sp.org/tlog-checkpoint): origin, size, base64 root.
//!
//! Parsing is strict: valid UTF-8 without control characters but newline, canonical
//! padded base64, canonical decimals, a key name with no space and no `+`, no signature
//! line seen twice, a bounded number of signatures.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use super::merkle::TreeHash;
use crate::format::parse_decimal;

/// Signature type of an Ed25519 note signature (a log's key).
pub const TYPE_ED25519: u8 = 0x01;
/// Signature type of an Ed25519 checkpoint cosignature (a witness's key).
pub const TYPE_COSIGNATURE: u8 = 0x04;
/// Most signature lines a note may carry (the spec asks for at least 16).
pub const MAX_SIGNATURES: usize = 64;
/// Largest note accepted, in bytes.
pub const MAX_NOTE_LEN: usize = 64 * 1024;

const DASH: &str = "\u{2014} ";

/// A malformed note, key or checkpoint, or a signature that does not verify.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoteError {
    /// Not a note (or a key, or a checkpoint) this parser accepts; says why.
    #[error("{what}: {why}")]
    Malformed {
        /// What was being read.
        what: &'static str,
        /// Why it was refused.
        why: String,
    },
    /// A signature of a known key that does not verify.
    #[error("the signature of {name} does not verify")]
    BadSignature {
        /// The key's name.
        name: String,
    },
    /// No signature of the expected key.
    #[error("no signature of {name} (key id {key_id:08x})")]
    Unsigned {
        /// The key's name.
        name: String,
        /// Its key id.
        key_id: u32,
    },
}

fn malformed(what: &'static str, why: impl Into<String>) -> NoteError {
    NoteError::Malformed {
        what,
        why: why.into(),
    }
}

/// Whether `name` may be a key name: non-empty, no Unicode space, no `+`, no control.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name
            .chars()
            .any(|c| c.is_whitespace() || c == '+' || c.is_control())
}

/// `SHA-256(name ‖ 0x0A ‖ type ‖ public key)[:4]`, big-endian.
pub fn key_id(name: &str, sig_type: u8, public: &[u8]) -> u32 {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update(b"\n");
    h.update([sig_type]);
    h.update(public);
    let d = h.finalize();
    u32::from_be_bytes([d[0], d[1], d[2], d[3]])
}

/// Decode canonical padded standard base64.
pub fn b64_decode(s: &str, what: &'static str) -> Result<Vec<u8>, NoteError> {
    B64.decode(s)
        .map_err(|e| malformed(what, format!("not canonical base64: {e}")))
}

/// Encode as padded standard base64.
pub fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

/// One signature line: key name, key id, signature bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoteSig {
    /// The key's name.
    pub name: String,
    /// The key id (first 4 bytes of the decoded signature).
    pub key_id: u32,
    /// The signature proper (after the key id).
    pub sig: Vec<u8>,
}

impl NoteSig {
    /// The line `— name base64(key id ‖ sig)\n`.
    pub fn to_line(&self) -> String {
        let mut raw = self.key_id.to_be_bytes().to_vec();
        raw.extend_from_slice(&self.sig);
        format!("{DASH}{} {}\n", self.name, b64(&raw))
    }

    /// Parse one line, without its newline.
    pub fn from_line(line: &str) -> Result<NoteSig, NoteError> {
        let rest = line
            .strip_prefix(DASH)
            .ok_or_else(|| malformed("signature line", "must start with `— `"))?;
        let (name, sig) = rest
            .split_once(' ')
            .ok_or_else(|| malformed("signature line", "must be `— <name> <base64>`"))?;
        if !valid_name(name) {
            return Err(malformed(
                "signature line",
                format!("bad key name {name:?}"),
            ));
        }
        let raw = b64_decode(sig, "signature line")?;
        if raw.len() < 5 {
            return Err(malformed(
                "signature line",
                "signature shorter than 5 bytes",
            ));
        }
        Ok(NoteSig {
            name: name.to_owned(),
            key_id: u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]),
            sig: raw[4..].to_vec(),
        })
    }
}

/// A signed note: its text (ending in a newline) and its signature lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// The signed text, final newline included.
    pub text: String,
    /// The signatures, in order.
    pub sigs: Vec<NoteSig>,
}

impl Note {
    /// Parse a note strictly (at least one signature line).
    pub fn parse(bytes: &[u8]) -> Result<Note, NoteError> {
        Note::parse_with(bytes, false)
    }

    /// Parse a note; `allow_unsigned` accepts a text, a blank line and no signature.
    pub fn parse_with(bytes: &[u8], allow_unsigned: bool) -> Result<Note, NoteError> {
        if bytes.len() > MAX_NOTE_LEN {
            return Err(malformed(
                "note",
                format!("{} bytes, more than {MAX_NOTE_LEN}", bytes.len()),
            ));
        }
        let s = std::str::from_utf8(bytes).map_err(|_| malformed("note", "not UTF-8"))?;
        if s.chars().any(|c| c.is_control() && c != '\n') {
            return Err(malformed(
                "note",
                "holds a control character other than newline",
            ));
        }
        if !s.ends_with('\n') {
            return Err(malformed("note", "does not end with a newline"));
        }
        let split = s
            .rfind("\n\n")
            .ok_or_else(|| malformed("note", "no blank line before the signatures"))?;
        let text = &s[..split + 1];
        let sigs_text = &s[split + 2..];
        let mut sigs: Vec<NoteSig> = Vec::new();
        for line in sigs_text.split_terminator('\n') {
            let sig = NoteSig::from_line(line)?;
            if sigs
                .iter()
                .any(|o| o.name == sig.name && o.key_id == sig.key_id)
            {
                return Err(malformed(
                    "note",
                    format!("two signatures of {} with one key id", sig.name),
                ));
            }
            sigs.push(sig);
            if sigs.len() > MAX_SIGNATURES {
                return Err(malformed(
                    "note",
                    format!("more than {MAX_SIGNATURES} signatures"),
                ));
            }
        }
        if sigs.is_empty() && !allow_unsigned {
            return Err(malformed("note", "no signature line"));
        }
        Ok(Note {
            text: text.to_owned(),
            sigs,
        })
    }

    /// The note as text: the text, a blank line, the signature lines.
    pub fn to_text(&self) -> String {
        let mut out = self.text.clone();
        out.push('\n');
        for s in &self.sigs {
            out.push_str(&s.to_line());
        }
        out
    }

    /// The signatures of `key` (by name and key id).
    pub fn sig_of<'a>(&'a self, name: &str, key_id: u32) -> Option<&'a NoteSig> {
        self.sigs
            .iter()
            .find(|s| s.name == name && s.key_id == key_id)
    }
}

/// A verifier key: a name and an Ed25519 public key of one signature type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vkey {
    /// The key name.
    pub name: String,
    /// [`TYPE_ED25519`] or [`TYPE_COSIGNATURE`].
    pub sig_type: u8,
    /// The Ed25519 public key.
    pub public: [u8; 32],
}

impl Vkey {
    /// A vkey; `None` if the name is not a valid key name.
    pub fn new(name: &str, sig_type: u8, public: [u8; 32]) -> Option<Vkey> {
        valid_name(name).then(|| Vkey {
            name: name.to_owned(),
            sig_type,
            public,
        })
    }

    /// The key id.
    pub fn key_id(&self) -> u32 {
        key_id(&self.name, self.sig_type, &self.public)
    }

    /// `name+hex(key id)+base64(type ‖ key)`.
    pub fn to_text(&self) -> String {
        let mut raw = vec![self.sig_type];
        raw.extend_from_slice(&self.public);
        format!("{}+{:08x}+{}", self.name, self.key_id(), b64(&raw))
    }

    /// Parse a vkey strictly: the key id must be the one the name and key give.
    pub fn parse(s: &str) -> Result<Vkey, NoteError> {
        // The key's base64 may hold `+`; the name and the id never do.
        let mut parts = s.splitn(3, '+');
        let (Some(name), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(malformed("vkey", "expected `<name>+<key id>+<key>`"));
        };
        if !valid_name(name) {
            return Err(malformed("vkey", format!("bad key name {name:?}")));
        }
        if id.len() != 8 || !id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(malformed("vkey", "key id must be 8 lowercase hex digits"));
        }
        let raw = b64_decode(key, "vkey")?;
        if raw.len() != 33 || !matches!(raw[0], TYPE_ED25519 | TYPE_COSIGNATURE) {
            return Err(malformed(
                "vkey",
                "expected an Ed25519 key of type 0x01 (log) or 0x04 (cosigner)",
            ));
        }
        let mut public = [0u8; 32];
        public.copy_from_slice(&raw[1..]);
        let v = Vkey {
            name: name.to_owned(),
            sig_type: raw[0],
            public,
        };
        let expected = format!("{:08x}", v.key_id());
        if id != expected {
            return Err(malformed(
                "vkey",
                format!("key id {id} is not {expected}, the id of its name and key"),
            ));
        }
        Ok(v)
    }

    /// Verify `sig` (a [`TYPE_ED25519`] key's signature) over `text`.
    pub fn verify_note_sig(&self, text: &[u8], sig: &NoteSig) -> Result<(), NoteError> {
        let bad = || NoteError::BadSignature {
            name: self.name.clone(),
        };
        let s: [u8; 64] = sig.sig.as_slice().try_into().map_err(|_| bad())?;
        verify_ed25519(&self.public, text, &s).map_err(|()| bad())
    }

    /// Verify that `note` carries a valid signature of this key (type 0x01).
    pub fn verify(&self, note: &Note) -> Result<(), NoteError> {
        let sig = note
            .sig_of(&self.name, self.key_id())
            .ok_or_else(|| NoteError::Unsigned {
                name: self.name.clone(),
                key_id: self.key_id(),
            })?;
        self.verify_note_sig(note.text.as_bytes(), sig)
    }

    /// Verify a cosignature of this key (type 0x04) on the checkpoint text `text`;
    /// returns its timestamp.
    pub fn verify_cosignature(&self, text: &str, sig: &NoteSig) -> Result<u64, NoteError> {
        let bad = || NoteError::BadSignature {
            name: self.name.clone(),
        };
        if sig.sig.len() != 72 {
            return Err(bad());
        }
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&sig.sig[..8]);
        let time = u64::from_be_bytes(ts);
        if time > i64::MAX as u64 {
            return Err(bad());
        }
        let mut s = [0u8; 64];
        s.copy_from_slice(&sig.sig[8..]);
        verify_ed25519(&self.public, cosigned_message(time, text).as_bytes(), &s)
            .map_err(|()| bad())?;
        Ok(time)
    }
}

fn verify_ed25519(public: &[u8; 32], msg: &[u8], sig: &[u8; 64]) -> Result<(), ()> {
    let vk = VerifyingKey::from_bytes(public).map_err(|_| ())?;
    vk.verify_strict(msg, &Signature::from_bytes(sig))
        .map_err(|_| ())
}

/// The message a `cosignature/v1` signs: two header lines, then the checkpoint text.
pub fn cosigned_message(time: u64, text: &str) -> String {
    format!("cosignature/v1\ntime {time}\n{text}")
}

/// Sign `text` as a note signature (type 0x01) of the key named `name`.
pub fn sign_note(key: &SigningKey, name: &str, text: &str) -> NoteSig {
    NoteSig {
        name: name.to_owned(),
        key_id: key_id(name, TYPE_ED25519, key.verifying_key().as_bytes()),
        sig: key.sign(text.as_bytes()).to_bytes().to_vec(),
    }
}

/// Cosign the checkpoint text `text` at `time` (POSIX seconds) as the cosigner `name`.
pub fn cosign(key: &SigningKey, name: &str, time: u64, text: &str) -> NoteSig {
    let mut sig = time.to_be_bytes().to_vec();
    sig.extend_from_slice(&key.sign(cosigned_message(time, text).as_bytes()).to_bytes());
    NoteSig {
        name: name.to_owned(),
        key_id: key_id(name, TYPE_COSIGNATURE, key.verifying_key().as_bytes()),
        sig,
    }
}

/// A checkpoint's body (c2sp.org/tlog-checkpoint): origin, tree size, root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeHead {
    /// The log's origin line.
    pub origin: String,
    /// Leaves in the tree.
    pub size: u64,
    /// The RFC 6962 root.
    pub root: TreeHash,
    /// Extension lines, each ending in a newline (tally writes none).
    pub extension: String,
}

impl TreeHead {
    /// A tree head without extension lines.
    pub fn new(origin: &str, size: u64, root: TreeHash) -> TreeHead {
        TreeHead {
            origin: origin.to_owned(),
            size,
            root,
            extension: String::new(),
        }
    }

    /// The note text: origin, size and base64 root lines, then any extension lines.
    pub fn to_text(&self) -> String {
        format!(
            "{}\n{}\n{}\n{}",
            self.origin,
            self.size,
            b64(&self.root),
            self.extension
        )
    }

    /// Parse a checkpoint's note text strictly.
    pub fn parse(text: &str) -> Result<TreeHead, NoteError> {
        let mut lines = text.split_inclusive('\n');
        let mut line = |what: &'static str| {
            lines
                .next()
                .and_then(|l| l.strip_suffix('\n'))
                .ok_or_else(|| malformed("checkpoint", format!("missing the {what} line")))
        };
        let origin = line("origin")?;
        if origin.is_empty() {
            return Err(malformed("checkpoint", "empty origin"));
        }
        let size = parse_decimal(line("size")?, "checkpoint size")
            .map_err(|e| malformed("checkpoint", e.to_string()))?;
        let raw = b64_decode(line("root hash")?, "checkpoint root")?;
        let root: TreeHash = raw
            .as_slice()
            .try_into()
            .map_err(|_| malformed("checkpoint", "root hash is not 32 bytes"))?;
        let extension: String = lines.collect();
        if extension.split_inclusive('\n').any(|l| l == "\n") {
            return Err(malformed("checkpoint", "an empty extension line"));
        }
        Ok(TreeHead {
            origin: origin.to_owned(),
            size,
            root,
            extension,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of c2sp.org/signed-note, "Verifier keys".
    #[test]
    fn spec_example_verifies() {
        let vkey =
            Vkey::parse("example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k")
                .unwrap();
        let note = Note::parse(
            "This is an example message.\n\n\u{2014} example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n"
                .as_bytes(),
        )
        .unwrap();
        vkey.verify(&note).unwrap();
        let mut bad = note.clone();
        bad.text = "This is an example message!\n".into();
        assert!(vkey.verify(&bad).is_err());
    }

    #[test]
    fn strictness() {
        for bad in [
            "text\n\n\u{2014} a AAAAAA==\n",     // 5 bytes needed
            "text\n\u{2014} a AAAAAAA=\n",       // no blank line
            "text\n\n\u{2014} a b AAAAAAA=\n",   // space in name
            "text\n\n\u{2014} a+b AAAAAAA=\n",   // plus in name
            "te\x01xt\n\n\u{2014} a AAAAAAA=\n", // control
            "text\n\n\u{2014} a AAAAAAA=",       // no final newline
            "text\n\n\u{2014} a AAAAAAA=\n\u{2014} a AAAAAAA=\n", // twice
            "text\n\n\u{2014} a AAAAAAA\n",      // not padded
            "text\n\n\u{2014} a AAAAAAB=\n",     // non-canonical bits
        ] {
            assert!(Note::parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert!(Note::parse("text\n\n\u{2014} a AAAAAAA=\n".as_bytes()).is_ok());
    }
}
