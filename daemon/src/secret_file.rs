//! The one reader of the small files a policy or `tally serve` names that each hold a
//! secret: an MCP server's `url_file` and `credential_file`, a proxy upstream's
//! `url_file`. Each is read the same way ([`read_file`]).

use zeroize::Zeroizing;

/// The longest `url_file` or `credential_file`: a URL or a header's value.
pub const MAX_FILE_BYTES: usize = 4096;

/// The content of a file an MCP server's or upstream's entry names (`url_file`,
/// `credential_file`: each holds a secret), its trailing line end removed: a regular file (a symbolic link is
/// followed, as a Kubernetes secret volume's keys are links; what is opened is checked,
/// and opened without blocking, so a FIFO or device is refused, never waited on), of at
/// most [`MAX_FILE_BYTES`], UTF-8.
pub(crate) fn read_file(file: &str) -> Result<Zeroizing<String>, String> {
    use rustix::fs::{Mode, OFlags};
    use std::io::Read;
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = rustix::fs::open(file, flags, Mode::empty())
        .map_err(|e| std::io::Error::from(e).to_string())?;
    let f = std::fs::File::from(fd);
    if !f.metadata().map_err(|e| e.to_string())?.is_file() {
        return Err("is not a regular file".into());
    }
    let mut bytes = Zeroizing::new(Vec::new());
    f.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() > MAX_FILE_BYTES {
        return Err(format!("is longer than {MAX_FILE_BYTES} bytes"));
    }
    let text = std::str::from_utf8(&bytes).map_err(|_| "is not UTF-8".to_owned())?;
    Ok(Zeroizing::new(
        text.trim_end_matches(['\r', '\n']).to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `url_file` or `credential_file` is read only as a regular file of at most
    /// [`MAX_FILE_BYTES`], never a FIFO (whose open would wait for a writer) or a
    /// directory, through a symbolic link or not.
    #[test]
    fn a_servers_file_is_a_small_regular_file_not_a_fifo() {
        let dir = tempfile::tempdir().expect("tempdir");
        let at = |name: &str| dir.path().join(name).display().to_string();
        std::fs::write(at("url"), "https://h/mcp\r\n").expect("write");
        assert_eq!(
            read_file(&at("url")).as_deref().map(|s| s.as_str()),
            Ok("https://h/mcp")
        );
        let fifo = std::process::Command::new("mkfifo")
            .arg(at("fifo"))
            .status()
            .expect("mkfifo");
        assert!(fifo.success());
        std::os::unix::fs::symlink(at("fifo"), at("to-fifo")).expect("symlink");
        std::os::unix::fs::symlink(dir.path(), at("to-dir")).expect("symlink");
        for refused in [at("fifo"), at("to-fifo"), at("to-dir"), at("")] {
            assert_eq!(
                read_file(&refused).map(|_| ()),
                Err("is not a regular file".to_owned()),
                "{refused}"
            );
        }
        std::fs::write(at("big"), "x".repeat(MAX_FILE_BYTES + 1)).expect("write");
        assert!(read_file(&at("big")).is_err_and(|e| e.contains("longer than 4096")));
        std::fs::write(at("max"), "x".repeat(MAX_FILE_BYTES)).expect("write");
        assert!(read_file(&at("max")).is_ok());
    }
}
