//! Key files: their headers, reading them strictly, and writing secrets new, 0600 and
//! synced.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

use rand_core::{OsRng, RngCore};
use zeroize::Zeroizing;

use crate::error::{Error, FormatError, Result};

pub(super) const APPROVER_SECRET_HEADER: &str = "tally approver secret key v1\n";
pub(super) const APPROVER_PUBLIC_HEADER: &str = "tally approver public key v1\n";
pub(super) const AUDITOR_SECRET_HEADER: &str = "tally auditor secret key v1\n";
pub(super) const AUDITOR_PUBLIC_HEADER: &str = "tally auditor public key v1\n";
pub(super) const LEDGER_PUBLIC_HEADER: &str = "tally ledger public key v1\n";
pub(super) const LEDGER_PUBLIC_HEADER_V2: &str = "tally ledger public key v2\n";
pub(super) const WRITER_HEADER: &str = "tally writer key v1\n";

pub(super) fn strip_line<'a>(
    text: &'a str,
    header: &str,
    _path: &Path,
    what: &'static str,
) -> Result<&'a str, FormatError> {
    text.strip_prefix(header)
        .and_then(|r| r.strip_suffix('\n'))
        .filter(|r| !r.contains('\n'))
        .ok_or_else(|| {
            FormatError::invalid(
                what,
                format!("file must be `{}` and one line of hex", header.trim_end()),
            )
        })
}

/// 16 random bytes (ledger ids, nonce prefixes).
pub fn random16() -> [u8; 16] {
    let mut b = [0u8; 16];
    OsRng.fill_bytes(&mut b);
    b
}

/// Read a secret key file, refusing one others can read (mode & 077 != 0).
pub fn read_secret_file(path: &Path) -> Result<Zeroizing<String>> {
    read_secret(path)
}

/// Write a new secret key file (0600, fsynced), refusing to replace one.
pub fn write_secret_file(path: &Path, bytes: &[u8]) -> Result<()> {
    write_new_secret(path, bytes)
}

pub(super) fn read_secret(path: &Path) -> Result<Zeroizing<String>> {
    // A public key given for a secret one (public files are 0644): say so, rather than
    // ask for a chmod that would not help. Only the first line is looked at.
    let mut head = [0u8; 64];
    let n = {
        use std::io::Read;
        let mut f = fs::File::open(path).map_err(|e| Error::io(path, e))?;
        f.read(&mut head).map_err(|e| Error::io(path, e))?
    };
    for header in [
        AUDITOR_PUBLIC_HEADER,
        APPROVER_PUBLIC_HEADER,
        LEDGER_PUBLIC_HEADER,
    ] {
        if head[..n].starts_with(header.as_bytes()) {
            return Err(Error::PublicKeyGiven {
                path: path.to_path_buf(),
                what: header.trim_end().to_owned(),
                secret: path.with_extension("key"),
            });
        }
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let meta = fs::metadata(path).map_err(|e| Error::io(path, e))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(Error::KeyPermissions {
                path: path.to_path_buf(),
                mode,
            });
        }
    }
    Ok(Zeroizing::new(
        fs::read_to_string(path).map_err(|e| Error::io(path, e))?,
    ))
}

pub(super) fn write_new_secret(path: &Path, bytes: &[u8]) -> Result<()> {
    write_new(path, bytes, 0o600)
}

pub(super) fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let mut opts = OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut f = opts.open(path).map_err(|e| Error::io(path, e))?;
    f.write_all(bytes).map_err(|e| Error::io(path, e))?;
    f.sync_all().map_err(|e| Error::io(path, e))?;
    Ok(())
}

/// fsync the directory holding `path`, so a create or rename in it is durable.
pub fn sync_parent(path: &Path) -> Result<()> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    File::open(parent)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(parent, e))
}
