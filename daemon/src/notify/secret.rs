//! The notification signing secret: read from a file only its owner can read, held
//! zeroized, and the `Tally-Signature` it makes over a body.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use hmac::{Hmac, KeyInit, Mac};
use sha2_next::Sha256;
use zeroize::Zeroizing;

/// The shortest secret accepted, in bytes (after trailing whitespace is cut).
pub const MIN_SECRET: usize = 32;

/// The secret, zeroized when dropped.
pub(crate) struct Secret(Zeroizing<Vec<u8>>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// The secret in `path`: its bytes without trailing whitespace. Refused when the file
    /// is missing, grants its group or others any access, or is shorter than
    /// [`MIN_SECRET`].
    pub fn read(path: &Path) -> Result<Secret, String> {
        let shown = path.display();
        let make = format!(
            "make one with `head -c 32 /dev/urandom | base64 > {shown} && chmod 600 {shown}`"
        );
        let meta = std::fs::metadata(path)
            .map_err(|e| format!("--notify-secret-file {shown}: {e}; {make}"))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "--notify-secret-file {shown} is mode {mode:o}: others may read it; \
                 `chmod 600 {shown}`"
            ));
        }
        let mut bytes = Zeroizing::new(
            std::fs::read(path).map_err(|e| format!("--notify-secret-file {shown}: {e}"))?,
        );
        let kept = bytes.trim_ascii_end().len();
        bytes.truncate(kept);
        if bytes.len() < MIN_SECRET {
            return Err(format!(
                "--notify-secret-file {shown} holds {} bytes: at least {MIN_SECRET} are \
                 needed; {make}",
                bytes.len()
            ));
        }
        Ok(Secret(bytes))
    }

    /// The `Tally-Signature` value for `body` sent at `t` (Unix seconds):
    /// `t=<t>,v1=<hex HMAC-SHA256 of "<t>." followed by the body>`.
    pub fn sign(&self, t: u64, body: &[u8]) -> String {
        // Any key length is valid for HMAC.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) else {
            return String::new();
        };
        mac.update(t.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        let tag = mac.finalize().into_bytes();
        let mut hex = String::with_capacity(tag.len() * 2);
        for b in tag.iter() {
            hex.push_str(&format!("{b:02x}"));
        }
        format!("t={t},v1={hex}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(mode: u32, text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("secret");
        std::fs::write(&path, text).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("mode");
        (dir, path)
    }

    #[test]
    fn a_readable_short_or_missing_secret_is_refused_with_what_to_do() {
        let long = "s".repeat(40);
        let (_d, p) = file(0o644, &long);
        let e = Secret::read(&p).unwrap_err();
        assert!(e.contains("mode 644") && e.contains("chmod 600"), "{e}");
        let (_d, p) = file(0o600, "short\n");
        let e = Secret::read(&p).unwrap_err();
        assert!(e.contains("holds 5 bytes"), "{e}");
        let e = Secret::read(Path::new("/nonexistent/secret")).unwrap_err();
        assert!(e.contains("head -c 32"), "{e}");
        let (_d, p) = file(0o600, &format!("{long}\n"));
        let s = Secret::read(&p).expect("a good secret");
        let signed = s.sign(7, b"{}");
        assert!(signed.starts_with("t=7,v1=") && signed.len() == "t=7,v1=".len() + 64);
    }
}
