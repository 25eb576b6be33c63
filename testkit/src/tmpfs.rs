//! A small tmpfs mounted for one test: a file system that really fills up, so a write
//! really fails with ENOSPC (`No space left on device`), as on a full disk.
//!
//! Mounting needs root (CI runs as root); where `mount` is refused, [`Tmpfs::mount`]
//! [`skip`](crate::skip)s the test (a failure under CI).

use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted tmpfs, unmounted when dropped.
pub struct Tmpfs {
    dir: PathBuf,
    /// The temporary directory it is mounted on, if [`Tmpfs::mount`] made it (removed
    /// after the unmount).
    _made: Option<tempfile::TempDir>,
}

/// The file [`Tmpfs::fill`] writes.
const FILLER: &str = "filler";

impl Tmpfs {
    /// Mount a tmpfs of `bytes` on a new temporary directory. `None` (the test skipped)
    /// where this process may not mount.
    pub fn mount(bytes: u64) -> Option<Tmpfs> {
        let made = tempfile::tempdir().expect("a directory to mount on");
        let mut fs = Tmpfs::mount_on(made.path(), bytes)?;
        fs._made = Some(made);
        Some(fs)
    }

    /// Mount a tmpfs of `bytes` on `dir` (created if missing). `None` (the test skipped)
    /// where this process may not mount.
    pub fn mount_on(dir: &Path, bytes: u64) -> Option<Tmpfs> {
        fs::create_dir_all(dir).expect("a directory to mount on");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={bytes}"))
            .arg("tmpfs")
            .arg(dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs {
                dir: dir.to_path_buf(),
                _made: None,
            }),
            Ok(o) => {
                crate::skip(
                    &format!(
                        "mount -t tmpfs refused ({})",
                        String::from_utf8_lossy(&o.stderr).trim()
                    ),
                    "run the tests as root (CI does: .ci/run), so a test can mount a small file system and fill it",
                );
                None
            }
            Err(e) => {
                crate::skip(
                    &format!("`mount` cannot be run ({e})"),
                    "install util-linux and run the tests as root",
                );
                None
            }
        }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Fill the file system until a write fails with ENOSPC, then give back `leave`
    /// bytes (rounded to pages by tmpfs). Returns the filler file's path.
    pub fn fill(&self, leave: u64) -> PathBuf {
        let path = self.path().join(FILLER);
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("open the filler");
        let chunk = vec![0x5au8; 64 * 1024];
        let mut small = false;
        loop {
            let wrote = if small {
                f.write(&chunk[..512])
            } else {
                f.write(&chunk)
            };
            match wrote {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::StorageFull && !small => small = true,
                Err(e) if e.kind() == ErrorKind::StorageFull => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        let len = f.metadata().expect("filler's length").len();
        f.set_len(len.saturating_sub(leave))
            .expect("give back space");
        path
    }

    /// Remove what [`Tmpfs::fill`] wrote: space is back.
    pub fn free(&self) {
        let path = self.path().join(FILLER);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => panic!("removing {}: {e}", path.display()),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a file a failed test left open must not keep the mount (and its memory).
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}
