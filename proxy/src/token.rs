//! Run tokens: what an agent holds in place of an upstream's key.
//!
//! `tly_` + base64url(run name, no padding) + `.` + hex(BLAKE3 keyed hash of the run
//! name under a 32-byte key). Stateless: the proxy reads the run from the token and
//! checks the MAC in constant time (`blake3::Hash`'s equality); whether the run may
//! still spend is the gate's state (a stopped or expired run's token is refused).
//!
//! The key is `proxy-token.key` in the ledger's directory: 32 random bytes, mode 0600,
//! created on first use, held zeroized. Daemons of a PostgreSQL fleet share runs, so
//! they must share the key: copy the one file (0600, the daemon's user) into each
//! daemon's ledger directory before it starts; a token minted by one daemon is then
//! accepted by all.

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use zeroize::Zeroizing;

/// The key file's name in the ledger's directory.
pub const KEY_FILE: &str = "proxy-token.key";
/// Run tokens start with this.
pub const PREFIX: &str = "tly_";

/// Why the token key cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Reading or creating it failed.
    #[error("run token key {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Readable by others than its owner.
    #[error("run token key {path} has mode {mode:04o}; it must be 0600 (chmod 600 {path})")]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// Not 32 bytes.
    #[error("run token key {path} is {len} bytes, not 32: remove it to make a new one (tokens already handed out stop working)")]
    Length {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
}

/// The key that mints and checks run tokens (zeroized on drop).
pub struct TokenKey(Zeroizing<[u8; 32]>);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl TokenKey {
    /// A key from its bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> TokenKey {
        TokenKey(Zeroizing::new(bytes))
    }

    /// The key in `dir` (the ledger's directory), made (0600) if there is none.
    pub fn open_or_create(dir: &Path) -> Result<TokenKey, KeyError> {
        let path = dir.join(KEY_FILE);
        let io = |source| KeyError::Io {
            path: path.clone(),
            source,
        };
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(mut f) => {
                let mut key = Zeroizing::new([0u8; 32]);
                rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut key[..]);
                f.write_all(&key[..]).map_err(io)?;
                f.sync_all().map_err(io)?;
                return Ok(TokenKey(key));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(e)),
        }
        let mut f = std::fs::File::open(&path).map_err(io)?;
        let mode = f.metadata().map_err(io)?.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Permissions { path, mode });
        }
        let mut bytes = Zeroizing::new(Vec::with_capacity(33));
        Read::by_ref(&mut f)
            .take(33)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        let key: [u8; 32] = bytes.as_slice().try_into().map_err(|_| KeyError::Length {
            path: path.clone(),
            len: bytes.len(),
        })?;
        Ok(TokenKey::from_bytes(key))
    }

    /// A key for another use, derived from this one under `context` (BLAKE3's key
    /// derivation: a different context is an unrelated key).
    pub(crate) fn derive(&self, context: &str) -> [u8; 32] {
        blake3::derive_key(context, &self.0[..])
    }

    /// The token of `run`.
    pub fn mint(&self, run: &str) -> String {
        let mac = blake3::keyed_hash(&self.0, run.as_bytes());
        format!(
            "{PREFIX}{}.{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(run.as_bytes()),
            mac.to_hex()
        )
    }

    /// The run a token names, if it is spelt exactly as [`TokenKey::mint`] spells it
    /// and its MAC is this key's (compared in constant time). One token, one spelling:
    /// the prefix as it is, the run's name in canonical base64url (no padding, no stray
    /// bits), a dot, and the MAC in 64 lowercase hex digits; nothing before or after.
    pub fn run_of(&self, token: &str) -> Option<String> {
        let rest = token.strip_prefix(PREFIX)?;
        let (name, mac) = rest.split_once('.')?;
        if name.len() > 4096 || !lower_hex(mac, blake3::OUT_LEN) {
            return None;
        }
        let given = blake3::Hash::from_hex(mac).ok()?;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let bytes = b64.decode(name).ok()?;
        // The engine refuses padding and stray bits; this keeps it so.
        if b64.encode(&bytes) != name {
            return None;
        }
        let run = String::from_utf8(bytes).ok()?;
        // `Hash`'s equality is constant-time.
        (blake3::keyed_hash(&self.0, run.as_bytes()) == given).then_some(run)
    }
}

/// Whether `text` is exactly `bytes` bytes in lowercase hex, as [`TokenKey::mint`]
/// writes a MAC (`blake3::Hash::from_hex` alone takes uppercase too).
fn lower_hex(text: &str, bytes: usize) -> bool {
    text.len() == 2 * bytes && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The credentials of an `Authorization` field value: `Bearer` (any case, RFC 9110
/// 11.1), one or more spaces, then the token as it was sent; any other scheme: `None`.
/// The token of an `Authorization: Bearer TOKEN` value (the scheme in any case).
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_start_matches(' '))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_run_and_nothing_else() {
        let k = TokenKey::from_bytes([7; 32]);
        let t = k.mint("run-1");
        assert!(t.starts_with("tly_"));
        assert_eq!(k.run_of(&t).as_deref(), Some("run-1"));
        let other = TokenKey::from_bytes([8; 32]);
        assert_eq!(other.run_of(&t), None);
        // Another run's name with this run's MAC.
        let (_, mac) = t.split_once('.').expect("dot");
        let forged = format!(
            "tly_{}.{mac}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("run-2")
        );
        assert_eq!(k.run_of(&forged), None);
        assert_eq!(k.run_of("sk-real"), None);
    }

    #[test]
    fn a_token_has_one_spelling_the_one_minted() {
        let k = TokenKey::from_bytes([7; 32]);
        // `run-1` is `cnVuLTE` in base64url: its last symbol carries two spare bits.
        let t = k.mint("run-1");
        let (head, mac) = t.split_once('.').expect("dot");
        assert_eq!(head, "tly_cnVuLTE");
        assert!(
            mac.bytes().any(|b| b.is_ascii_alphabetic()),
            "the MAC has letters to change the case of: {mac}"
        );
        let mixed: String = mac
            .chars()
            .enumerate()
            .map(|(i, c)| {
                if i % 2 == 0 {
                    c.to_ascii_uppercase()
                } else {
                    c
                }
            })
            .collect();
        let cases = [
            (
                "the MAC in uppercase",
                format!("{head}.{}", mac.to_uppercase()),
            ),
            ("the MAC in mixed case", format!("{head}.{mixed}")),
            ("the prefix in uppercase", format!("TLY_{}", &t[4..])),
            ("the prefix in mixed case", format!("Tly_{}", &t[4..])),
            ("a space before", format!(" {t}")),
            ("a space after", format!("{t} ")),
            ("a tab after", format!("{t}\t")),
            ("a newline after", format!("{t}\n")),
            ("a space after the dot", format!("{head}. {mac}")),
            ("a byte after", format!("{t}0")),
            ("a NUL after", format!("{t}\0")),
            ("a second MAC", format!("{t}.{mac}")),
            ("the MAC one digit short", format!("{head}.{}", &mac[..63])),
            ("the MAC as 0x hex", format!("{head}.0x{}", &mac[..62])),
            ("the name padded", format!("{head}=.{mac}")),
            ("the name's spare bits set", format!("tly_cnVuLTF.{mac}")),
            ("no prefix", t[4..].to_owned()),
        ];
        for (what, spelt) in &cases {
            assert_ne!(spelt, &t, "{what}");
            assert_eq!(k.run_of(spelt), None, "{what}: {spelt:?}");
        }
        assert_eq!(k.run_of(&t).as_deref(), Some("run-1"));
    }

    #[test]
    fn the_bearer_scheme_is_any_case_and_the_token_is_as_sent() {
        for (value, token) in [
            ("Bearer tly_a.b", Some("tly_a.b")),
            ("bearer tly_a.b", Some("tly_a.b")),
            ("BEARER tly_a.b", Some("tly_a.b")),
            ("Bearer   tly_a.b", Some("tly_a.b")),
            // What follows the spaces is the token's to be right or wrong.
            ("Bearer tly_a.b ", Some("tly_a.b ")),
            ("Bearer\ttly_a.b", None),
            ("Bearertly_a.b", None),
            ("Basic tly_a.b", None),
            ("tly_a.b", None),
        ] {
            assert_eq!(bearer(value), token, "{value:?}");
        }
    }

    #[test]
    fn the_key_file_is_made_0600_and_refused_when_open_to_others() {
        let dir = tempfile::tempdir().expect("dir");
        let a = TokenKey::open_or_create(dir.path()).expect("made");
        let b = TokenKey::open_or_create(dir.path()).expect("read");
        assert_eq!(a.mint("r"), b.mint("r"));
        let path = dir.path().join(KEY_FILE);
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(matches!(
            TokenKey::open_or_create(dir.path()),
            Err(KeyError::Permissions { .. })
        ));
    }
}
