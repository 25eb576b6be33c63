//! What the hook keeps between Claude Code's events, per session: the attempts waiting
//! for their outcome (and the calls the gate asked a human about), the gate's last
//! refusal, and the run the session started; and the session's end, which stops that run.
//!
//! `STATE_DIR/SESSION/` (SESSION: a digest of the session id, so no id reaches the file
//! system as a path), 0700 like the state directory: one file per tool call (a digest of
//! its id), `last` (the gate's last answer that refused) and `started` (the run this
//! session's hook started).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::Hook;

/// What waits under a tool call's id.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Slot {
    /// The run the call counts against.
    pub run: String,
    /// The attempt the gate allowed it as (none if it asked a human).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u64>,
    /// Its effect class (for an allowed call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
    /// The limit the gate asked a human about, when it answered `ask`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<String>,
}

/// The gate's last refusal in a session: its reason and action.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Refusal {
    pub reason: String,
    pub action: String,
}

/// Where allowed attempts wait: `--state-dir`, else `$XDG_RUNTIME_DIR/tally-hook`, else
/// `/tmp/tally-hook-UID`; created 0700, and refused if anyone else could write it.
fn state_dir(h: &Hook) -> Result<PathBuf> {
    let uid = rustix::process::getuid().as_raw();
    let dir = match (&h.state_dir, std::env::var_os("XDG_RUNTIME_DIR")) {
        (Some(d), _) => d.clone(),
        (None, Some(x)) => Path::new(&x).join("tally-hook"),
        (None, None) => std::env::temp_dir().join(format!("tally-hook-{uid}")),
    };
    private_dir(&dir, uid)?;
    Ok(dir)
}

/// `dir`, created 0700 if missing; refused unless it is a directory of `uid`'s that
/// nobody else can use.
fn private_dir(dir: &Path, uid: u32) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(dir).with_context(|| format!("{}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
        bail!(
            "{} must be a directory of yours that only you can use (mode 0700): fix it or give --state-dir",
            dir.display()
        );
    }
    Ok(())
}

fn digest(domain: &str, text: &str) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(domain.as_bytes());
    hasher.update(&(text.len() as u64).to_le_bytes());
    hasher.update(text.as_bytes());
    hasher.finalize().to_hex().to_string()
}

/// The session's directory, created.
fn session_dir(h: &Hook, session: &str) -> Result<PathBuf> {
    let dir = state_dir(h)?.join(digest("tally hook session v1\n", session));
    private_dir(&dir, rustix::process::getuid().as_raw())?;
    Ok(dir)
}

fn slot_path(h: &Hook, session: &str, id: &str) -> Result<PathBuf> {
    Ok(session_dir(h, session)?.join(digest("tally hook slot v1\n", id)))
}

/// Write `value` as JSON to `path`, 0600 (the directory is the user's own, 0700, checked:
/// nobody else can plant a link there).
fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(serde_json::to_string(value)?.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    serde_json::from_str(&text)
        .map(Some)
        .with_context(|| format!("{} is not a file the hook wrote", path.display()))
}

fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

/// Keep what the gate answered for tool call `id`, until its outcome event.
pub(super) fn remember(h: &Hook, session: &str, id: &str, slot: &Slot) -> Result<()> {
    write_json(&slot_path(h, session, id)?, slot)
}

/// What waits for tool call `id`, if anything.
pub(super) fn recall(h: &Hook, session: &str, id: &str) -> Result<Option<Slot>> {
    read_json(&slot_path(h, session, id)?)
}

/// Tool call `id` has its outcome.
pub(super) fn forget(h: &Hook, session: &str, id: &str) -> Result<()> {
    remove(&slot_path(h, session, id)?)
}

/// The gate's answer to the session's latest check: a refusal is kept (its reason and
/// action), an allow clears it.
pub(super) fn answered(h: &Hook, session: &str, refusal: Option<Refusal>) -> Result<()> {
    let path = session_dir(h, session)?.join("last");
    match refusal {
        Some(r) => write_json(&path, &r),
        None => remove(&path),
    }
}

/// The session's `started` file: the run its hook started.
#[derive(Serialize, Deserialize)]
struct Started {
    run: String,
}

/// This session's hook started `run`: the session's end stops it.
pub(super) fn started(h: &Hook, session: &str, run: &str) -> Result<()> {
    write_json(
        &session_dir(h, session)?.join("started"),
        &Started {
            run: run.to_owned(),
        },
    )
}

/// What the session's end finds: the calls that will never report (allowed, no outcome),
/// the calls a human was asked about, the last refusal, and the run it started.
pub(super) struct Left {
    pub waiting: Vec<Slot>,
    pub last: Option<Refusal>,
    pub started: Option<String>,
    dir: PathBuf,
}

impl Left {
    /// Read what the session left.
    pub fn read(h: &Hook, session: &str) -> Result<Left> {
        let dir = session_dir(h, session)?;
        let mut waiting = Vec::new();
        for e in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = e
                .with_context(|| format!("reading {}", dir.display()))?
                .path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
                waiting.extend(read_json::<Slot>(&path)?);
            }
        }
        waiting.sort_by(|a, b| (&a.run, a.attempt).cmp(&(&b.run, b.attempt)));
        let last = read_json(&dir.join("last"))?;
        let started = read_json::<Started>(&dir.join("started"))?.map(|s| s.run);
        Ok(Left {
            waiting,
            last,
            started,
            dir,
        })
    }

    /// The session is over: forget all of it.
    pub fn clear(self) -> Result<()> {
        std::fs::remove_dir_all(&self.dir)
            .with_context(|| format!("removing {}", self.dir.display()))
    }
}
