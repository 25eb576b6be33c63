//! Keys: long-lived credentials an operator hands an agent in place of a run token
//! (docs/KEYS.md). A proxied call with a key starts, or continues, a run of the key's
//! principal (a uid), one per task, so every task still has its own run and handoff.
//!
//! A key is `tlk_` + its id (16 lowercase hex digits) + `.` + a 32-byte secret in 64
//! lowercase hex digits, shown once when it is made. tally keeps only a MAC of the
//! secret (BLAKE3 keyed by a key derived from the run token key), in `proxy-keys.log`
//! in the ledger's directory: mode 0600, one JSON line per event (`create`, `revoke`),
//! each synced before it is answered; the keys are read back from it at start.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tally_policy::key_day::{day_of, DAY_MS};
use tally_policy::KeyDayUse;
use tally_record::clock::Clock;
use tally_wire::{KeyInfo, KEY_RUN_PREFIX};
use zeroize::Zeroizing;

use crate::key_spend::KeySpend;
use crate::token::TokenKey;

/// The keys' file in the ledger's directory.
pub const KEYS_FILE: &str = "proxy-keys.log";
/// Keys start with this (run tokens with `tly_`).
pub const KEY_PREFIX: &str = "tlk_";
/// A label's bound, bytes.
pub const MAX_LABEL_BYTES: usize = 200;
/// A task name's bound, bytes (`x-tally-task`).
pub const MAX_TASK_BYTES: usize = 64;
/// The run window when the key names none: a day.
pub const DEFAULT_RUN_WINDOW_MS: u64 = 86_400_000;

/// The BLAKE3 context the MAC key is derived under (from the run token key).
const MAC_CONTEXT: &str = "tally 2026-12 proxy keys: MAC of a key's secret";

/// Why a key cannot be made, revoked, or the keys read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyRingError {
    /// Reading or writing the keys' file failed.
    #[error("keys file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Readable by others than its owner.
    #[error("keys file {path} has mode {mode:04o}; it must be 0600 (chmod 600 {path})")]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// A line that is not an event tally writes.
    #[error(
        "keys file {path}, line {line}: {why}; it is tally's own file: restore it from a backup"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// No key has this id.
    #[error("no key `{0}`: `tally keys list` shows the keys")]
    Unknown(String),
    /// A label too long.
    #[error("a label is at most {MAX_LABEL_BYTES} bytes; this one is {0}")]
    Label(usize),
    /// A run window of zero.
    #[error("a run window must be longer than 0 ms")]
    Window,
    /// A limit per day of zero (`runs_per_day` or `budget_per_day_nanos`, the field): a
    /// key that could never start a run or make a call.
    #[error(
        "{0} must be more than 0 (a key that may do nothing is revoked, not limited to nothing)"
    )]
    DayLimitZero(&'static str),
}

/// What a presented key is, if it is not a live key of this tally.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyRefused {
    /// Not spelt as a key, no such id, or the wrong secret.
    Invalid,
    /// A real key, revoked.
    Revoked {
        /// The key's id.
        id: String,
    },
}

/// One event of the keys' file.
#[derive(Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
enum Event {
    Create {
        id: String,
        principal: u32,
        label: Option<String>,
        created_ms: u64,
        run_window_ms: u64,
        mac: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        budget_per_day_nanos: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        runs_per_day: Option<u64>,
    },
    Revoke {
        id: String,
        at_ms: u64,
    },
}

/// What a new key is for.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NewKey {
    /// The uid whose runs it starts.
    pub principal: u32,
    /// The operator's label (at most [`MAX_LABEL_BYTES`]).
    pub label: Option<String>,
    /// How long a call without `x-tally-task` continues the key's current run.
    pub run_window_ms: u64,
    /// What its runs may spend together per UTC day, nanodollars (`None`: no limit of
    /// its own).
    pub budget_per_day_nanos: Option<u64>,
    /// How many runs it may start per UTC day (`None`: no limit of its own).
    pub runs_per_day: Option<u64>,
}

impl NewKey {
    /// A key for `principal`, with no label, the default window and no budget of its own.
    pub fn new(principal: u32) -> NewKey {
        NewKey {
            principal,
            label: None,
            run_window_ms: DEFAULT_RUN_WINDOW_MS,
            budget_per_day_nanos: None,
            runs_per_day: None,
        }
    }
}

/// A key's own limits per UTC day, for the policy core's rule.
pub fn day_limits(info: &KeyInfo) -> tally_policy::KeyDayLimits {
    tally_policy::KeyDayLimits {
        spend_nanos: info.budget_per_day_nanos,
        runs: info.runs_per_day,
    }
}

struct Entry {
    info: KeyInfo,
    mac: blake3::Hash,
}

struct Ring {
    file: std::fs::File,
    keys: BTreeMap<String, Entry>,
}

/// The keys, as their file holds them: made, listed, revoked and checked here.
pub struct KeyRing {
    path: PathBuf,
    mac_key: Zeroizing<[u8; 32]>,
    clock: Arc<dyn Clock>,
    ring: Mutex<Ring>,
    /// The bytes of a last line cut short that opening dropped, if any.
    torn: Option<u64>,
    /// What each key's runs used this UTC day, and the key calls refused.
    spend: Arc<KeySpend>,
    /// The key runs being started: their turns.
    starts: crate::key_turns::KeyStarts,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRing")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl KeyRing {
    /// The keys in `dir` (the ledger's directory), the file made (0600) if there is none;
    /// MACs keyed from `token`, times from `clock`.
    pub fn open(
        dir: &Path,
        token: &TokenKey,
        clock: Arc<dyn Clock>,
    ) -> Result<KeyRing, KeyRingError> {
        let path = dir.join(KEYS_FILE);
        let io = |source| KeyRingError::Io {
            path: path.clone(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        let mode = file.metadata().map_err(io)?.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyRingError::Permissions { path, mode });
        }
        let (keys, torn) = read_events(&path, &file)?;
        Ok(KeyRing {
            mac_key: Zeroizing::new(token.derive(MAC_CONTEXT)),
            torn,
            path,
            clock,
            ring: Mutex::new(Ring { file, keys }),
            spend: Arc::default(),
            starts: crate::key_turns::KeyStarts::default(),
        })
    }

    /// What opening found torn, for the operator: a last line cut short (a create or a
    /// revoke whose write never finished, so never acknowledged) that was dropped.
    pub fn torn_note(&self) -> Option<String> {
        self.torn.map(|bytes| {
            format!(
                "{}: dropped a last line cut short ({bytes} bytes): a key created or revoked \
                 then was never acknowledged; list the keys (`tally keys list`) and repeat it",
                self.path.display()
            )
        })
    }

    /// What each key's runs used this UTC day, and the key calls refused.
    pub fn spend(&self) -> &Arc<KeySpend> {
        &self.spend
    }

    /// The key runs being started, their turns.
    pub(crate) fn starts(&self) -> &crate::key_turns::KeyStarts {
        &self.starts
    }

    /// The time now on the ring's clock, ms since the epoch.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mac(&self, secret: &[u8]) -> blake3::Hash {
        blake3::keyed_hash(&self.mac_key, secret)
    }

    /// Make a key: its listing, and the key itself (to be shown once, never stored).
    pub fn create(&self, new: NewKey) -> Result<(KeyInfo, Zeroizing<String>), KeyRingError> {
        if let Some(l) = &new.label {
            if l.len() > MAX_LABEL_BYTES {
                return Err(KeyRingError::Label(l.len()));
            }
        }
        if new.run_window_ms == 0 {
            return Err(KeyRingError::Window);
        }
        if new.runs_per_day == Some(0) {
            return Err(KeyRingError::DayLimitZero("runs_per_day"));
        }
        if new.budget_per_day_nanos == Some(0) {
            return Err(KeyRingError::DayLimitZero("budget_per_day_nanos"));
        }
        let mut id = [0u8; 8];
        let mut secret = Zeroizing::new([0u8; 32]);
        rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut id);
        rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut secret[..]);
        let id = hex::encode(id);
        let secret_hex = Zeroizing::new(hex::encode(&secret[..]));
        let mac = self.mac(secret_hex.as_bytes());
        let info = KeyInfo {
            id: id.clone(),
            principal: new.principal,
            label: new.label,
            created_ms: self.clock.now_ms(),
            run_window_ms: new.run_window_ms,
            revoked_ms: None,
            spend_today_nanos: 0,
            budget_per_day_nanos: new.budget_per_day_nanos,
            runs_per_day: new.runs_per_day,
        };
        let mut ring = self.lock();
        if ring.keys.contains_key(&id) {
            // 64 random bits met an earlier id: make another.
            drop(ring);
            return self.create(NewKey {
                principal: info.principal,
                label: info.label,
                run_window_ms: info.run_window_ms,
                budget_per_day_nanos: info.budget_per_day_nanos,
                runs_per_day: info.runs_per_day,
            });
        }
        let event = Event::Create {
            id: id.clone(),
            principal: info.principal,
            label: info.label.clone(),
            created_ms: info.created_ms,
            run_window_ms: info.run_window_ms,
            mac: mac.to_hex().to_string(),
            budget_per_day_nanos: info.budget_per_day_nanos,
            runs_per_day: info.runs_per_day,
        };
        self.append(&mut ring.file, &event)?;
        ring.keys.insert(
            id.clone(),
            Entry {
                info: info.clone(),
                mac,
            },
        );
        let key = Zeroizing::new(format!("{KEY_PREFIX}{id}.{}", secret_hex.as_str()));
        Ok((info, key))
    }

    /// Revoke the key `id`: every call with it is refused from now on. Revoking a revoked
    /// key changes nothing.
    pub fn revoke(&self, id: &str) -> Result<KeyInfo, KeyRingError> {
        let mut ring = self.lock();
        let Some(entry) = ring.keys.get(id) else {
            return Err(KeyRingError::Unknown(id.to_owned()));
        };
        if entry.info.revoked_ms.is_some() {
            return Ok(entry.info.clone());
        }
        let at_ms = self.clock.now_ms();
        let event = Event::Revoke {
            id: id.to_owned(),
            at_ms,
        };
        self.append(&mut ring.file, &event)?;
        let entry = ring
            .keys
            .get_mut(id)
            .ok_or_else(|| KeyRingError::Unknown(id.to_owned()))?;
        entry.info.revoked_ms = Some(at_ms);
        Ok(entry.info.clone())
    }

    /// Every key, by id.
    pub fn list(&self) -> Vec<KeyInfo> {
        self.lock().keys.values().map(|e| e.info.clone()).collect()
    }

    /// The live key `presented` is (spelt exactly as [`KeyRing::create`] spells it, its
    /// secret's MAC compared in constant time), or why it is not one.
    pub fn check(&self, presented: &str) -> Result<KeyInfo, KeyRefused> {
        let (id, secret) = split(presented).ok_or(KeyRefused::Invalid)?;
        let given = self.mac(secret.as_bytes());
        let ring = self.lock();
        let entry = ring.keys.get(id).ok_or(KeyRefused::Invalid)?;
        // `Hash`'s equality is constant-time.
        if entry.mac != given {
            return Err(KeyRefused::Invalid);
        }
        match entry.info.revoked_ms {
            Some(_) => Err(KeyRefused::Revoked { id: id.to_owned() }),
            None => Ok(entry.info.clone()),
        }
    }

    fn append(&self, file: &mut std::fs::File, event: &Event) -> Result<(), KeyRingError> {
        let io = |source| KeyRingError::Io {
            path: self.path.clone(),
            source,
        };
        let mut line = serde_json::to_vec(event).map_err(|e| io(e.into()))?;
        line.push(b'\n');
        let before = file.metadata().map_err(io)?.len();
        let written = file.write_all(&line).and_then(|()| file.sync_data());
        if let Err(e) = written {
            // A line written in part would run into the next one: cut it back, so the
            // file holds whole answered events only (the event was not answered).
            let _ = file.set_len(before).and_then(|()| file.sync_data());
            return Err(io(e));
        }
        Ok(())
    }
}

/// A key's id and secret, if `key` is spelt as one: the prefix, 16 lowercase hex
/// digits, a dot, 64 lowercase hex digits, nothing else.
fn split(key: &str) -> Option<(&str, &str)> {
    let (id, secret) = key.strip_prefix(KEY_PREFIX)?.split_once('.')?;
    (lower_hex(id, 16) && lower_hex(secret, 64)).then_some((id, secret))
}

fn lower_hex(text: &str, len: usize) -> bool {
    text.len() == len && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `token` is spelt as a key (not whether it is one): the proxy reads it as a
/// key, never as a run token.
pub fn looks_like_key(token: &str) -> bool {
    token.starts_with(KEY_PREFIX)
}

/// The keys the events of `file` make. A last line cut short (a write the machine did
/// not finish) is dropped, and the file cut back to the line before it: its length is
/// returned with the keys, for the operator to be told.
fn read_events(
    path: &Path,
    file: &std::fs::File,
) -> Result<(BTreeMap<String, Entry>, Option<u64>), KeyRingError> {
    let io = |source| KeyRingError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut keys = BTreeMap::new();
    let mut reader = std::io::BufReader::new(file);
    let (mut line, mut whole, mut n) = (Vec::new(), 0u64, 0usize);
    loop {
        line.clear();
        let read = reader.read_until(b'\n', &mut line).map_err(io)?;
        if read == 0 {
            break;
        }
        if line.last() != Some(&b'\n') {
            file.set_len(whole).map_err(io)?;
            return Ok((keys, Some(read as u64)));
        }
        n += 1;
        whole += read as u64;
        let corrupt = |why: String| KeyRingError::Corrupt {
            path: path.to_path_buf(),
            line: n,
            why,
        };
        let event: Event = serde_json::from_slice(&line).map_err(|e| corrupt(e.to_string()))?;
        apply(&mut keys, event).map_err(corrupt)?;
    }
    Ok((keys, None))
}

/// One event folded into the keys.
fn apply(keys: &mut BTreeMap<String, Entry>, event: Event) -> Result<(), String> {
    match event {
        Event::Create {
            id,
            principal,
            label,
            created_ms,
            run_window_ms,
            mac,
            budget_per_day_nanos,
            runs_per_day,
        } => {
            let mac = blake3::Hash::from_hex(&mac).map_err(|e| format!("mac: {e}"))?;
            if keys.contains_key(&id) {
                return Err(format!("key `{id}` made twice"));
            }
            let info = KeyInfo {
                id: id.clone(),
                principal,
                label,
                created_ms,
                run_window_ms,
                revoked_ms: None,
                spend_today_nanos: 0,
                budget_per_day_nanos,
                runs_per_day,
            };
            keys.insert(id, Entry { info, mac });
        }
        Event::Revoke { id, at_ms } => {
            let e = keys
                .get_mut(&id)
                .ok_or_else(|| format!("revokes key `{id}`, never made"))?;
            e.info.revoked_ms.get_or_insert(at_ms);
        }
    }
    Ok(())
}

/// The run a call with `key` is in: `key-ID-YYYYMMDD-TASK` for the task it names, else
/// `key-ID-YYYYMMDD-wN`, the key's current run (N counts its run windows from the UTC
/// day's start). A new UTC day, or a new window, is a new run.
pub fn run_of(key: &KeyInfo, task: Option<&str>, now_ms: u64) -> String {
    let date = utc_date(day_of(now_ms));
    match task {
        Some(t) => format!("{KEY_RUN_PREFIX}{}-{date}-{t}", key.id),
        None => {
            let window = (now_ms % DAY_MS) / key.run_window_ms.max(1);
            format!("{KEY_RUN_PREFIX}{}-{date}-w{window}", key.id)
        }
    }
}

/// The prefix of every run a key starts on the UTC day of `now_ms`.
pub fn runs_today(id: &str, now_ms: u64) -> String {
    format!("{KEY_RUN_PREFIX}{id}-{}-", utc_date(day_of(now_ms)))
}

/// What the key's `runs` of the UTC day of `now_ms` (those named
/// [`runs_today`], read by [`tally_gate::Gatekeeper::runs_named`]) used: what they settled,
/// what they hold, and how many there are, counting only the runs its `principal` owns
/// (a run of a key's name another uid started is never the key's).
pub fn day_use(runs: &[tally_wire::Standing], principal: u32, now_ms: u64) -> KeyDayUse {
    let mut used = KeyDayUse::default().at(now_ms);
    for r in runs.iter().filter(|r| r.owner_uid == Some(principal)) {
        used.settled_nanos = used.settled_nanos.saturating_add(r.settled_nanos);
        used.held_nanos = used.held_nanos.saturating_add(r.held_nanos);
        used.runs = used.runs.saturating_add(1);
    }
    used
}

/// A task name as `x-tally-task` may give it: 1 to [`MAX_TASK_BYTES`] of letters,
/// digits, `.`, `_` and `-`; `None` if it is not one.
pub fn task_name(text: &str) -> Option<&str> {
    // `w` and digits name the key's window runs: a task of that name would be one.
    let window =
        text.len() > 1 && text.starts_with('w') && text[1..].bytes().all(|b| b.is_ascii_digit());
    let ok = !window
        && !text.is_empty()
        && text.len() <= MAX_TASK_BYTES
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    ok.then_some(text)
}

/// `YYYYMMDD` of the UTC day `days` after 1970-01-01 (Howard Hinnant's civil_from_days).
fn utc_date(days: u64) -> String {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_record::clock::ManualClock;

    fn ring(dir: &Path, clock: &Arc<ManualClock>) -> KeyRing {
        let token = TokenKey::from_bytes([7; 32]);
        KeyRing::open(dir, &token, Arc::clone(clock) as Arc<dyn Clock>).expect("ring")
    }

    #[test]
    fn a_key_is_checked_revoked_and_read_back_and_only_its_mac_is_kept() {
        let dir = tempfile::tempdir().expect("dir");
        let clock = Arc::new(ManualClock::new(1_000));
        let r = ring(dir.path(), &clock);
        let (info, key) = r.create(NewKey::new(1000)).expect("made");
        assert!(key.starts_with("tlk_"), "{}", key.as_str());
        assert_eq!(r.check(&key).expect("live").id, info.id);
        // Another secret for the same id, or the key spelt otherwise.
        let forged = format!(
            "{}{}",
            &key[..key.len() - 1],
            if key.ends_with('0') { '1' } else { '0' }
        );
        assert_eq!(r.check(&forged), Err(KeyRefused::Invalid));
        assert_eq!(r.check(&key.to_uppercase()), Err(KeyRefused::Invalid));
        assert_eq!(
            r.check(&format!("{} ", key.as_str())),
            Err(KeyRefused::Invalid)
        );
        let text = std::fs::read_to_string(dir.path().join(KEYS_FILE)).expect("file");
        let secret = key.split_once('.').expect("dot").1;
        assert!(!text.contains(secret), "the secret is in the file: {text}");
        let mode = std::fs::metadata(dir.path().join(KEYS_FILE))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        clock.set(2_000);
        assert_eq!(r.revoke(&info.id).expect("revoked").revoked_ms, Some(2_000));
        assert_eq!(
            r.check(&key),
            Err(KeyRefused::Revoked {
                id: info.id.clone()
            })
        );
        drop(r);
        // Read back: revoked still.
        let r = ring(dir.path(), &clock);
        assert_eq!(r.list().len(), 1);
        assert_eq!(r.check(&key), Err(KeyRefused::Revoked { id: info.id }));
        assert!(matches!(
            r.revoke("0000000000000000"),
            Err(KeyRingError::Unknown(_))
        ));
    }

    #[test]
    fn a_keys_limits_per_day_are_kept_and_read_back_and_a_line_without_them_has_none() {
        let dir = tempfile::tempdir().expect("dir");
        let clock = Arc::new(ManualClock::new(1_000));
        let r = ring(dir.path(), &clock);
        let mut new = NewKey::new(7);
        new.budget_per_day_nanos = Some(5_000_000_000);
        new.runs_per_day = Some(3);
        let (info, _) = r.create(new.clone()).expect("made");
        let (plain, _) = r.create(NewKey::new(7)).expect("made");
        new.runs_per_day = Some(0);
        assert!(matches!(
            r.create(new.clone()),
            Err(KeyRingError::DayLimitZero("runs_per_day"))
        ));
        new.runs_per_day = Some(3);
        new.budget_per_day_nanos = Some(0);
        assert!(matches!(
            r.create(new),
            Err(KeyRingError::DayLimitZero("budget_per_day_nanos"))
        ));
        drop(r);
        let text = std::fs::read_to_string(dir.path().join(KEYS_FILE)).expect("file");
        // A key without limits is written as an earlier tally wrote it.
        let line = text.lines().find(|l| l.contains(&plain.id)).expect("line");
        assert!(!line.contains("per_day"), "{line}");
        let listed = ring(dir.path(), &clock).list();
        let back = listed.iter().find(|k| k.id == info.id).expect("read back");
        assert_eq!(
            day_limits(back),
            tally_policy::KeyDayLimits {
                spend_nanos: Some(5_000_000_000),
                runs: Some(3)
            }
        );
        let back = listed.iter().find(|k| k.id == plain.id).expect("read back");
        assert_eq!(day_limits(back), tally_policy::KeyDayLimits::default());
    }

    #[test]
    fn a_torn_last_line_is_reported_and_dropped_and_a_corrupt_one_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let clock = Arc::new(ManualClock::new(1_000));
        let (_, key) = ring(dir.path(), &clock)
            .create(NewKey::new(7))
            .expect("made");
        let path = dir.path().join(KEYS_FILE);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        f.write_all(b"{\"event\":\"revo").expect("torn");
        drop(f);
        let r = ring(dir.path(), &clock);
        assert!(r.check(&key).is_ok(), "the torn revoke was never answered");
        let note = r.torn_note().expect("the torn line is reported");
        assert!(note.contains("(14 bytes)"), "{note}");
        drop(r);
        assert_eq!(ring(dir.path(), &clock).torn_note(), None, "cut back once");
        std::fs::write(&path, b"{\"event\":\"revoke\",\"id\":\"x\",\"at_ms\":1}\n").expect("write");
        assert!(matches!(
            KeyRing::open(dir.path(), &TokenKey::from_bytes([7; 32]), clock),
            Err(KeyRingError::Corrupt { line: 1, .. })
        ));
    }

    #[test]
    fn runs_are_named_by_utc_day_task_and_window() {
        let mut k = KeyInfo {
            id: "00112233aabbccdd".into(),
            principal: 1,
            label: None,
            created_ms: 0,
            run_window_ms: 3_600_000,
            revoked_ms: None,
            spend_today_nanos: 0,
            budget_per_day_nanos: None,
            runs_per_day: None,
        };
        // 2026-12-07 23:59:59.999 UTC, then the next day's first ms.
        let before = 1_796_687_999_999;
        assert_eq!(
            run_of(&k, Some("t1"), before),
            "key-00112233aabbccdd-20261207-t1"
        );
        assert_eq!(
            run_of(&k, None, before),
            "key-00112233aabbccdd-20261207-w23"
        );
        assert_eq!(
            run_of(&k, None, before + 1),
            "key-00112233aabbccdd-20261208-w0"
        );
        assert_eq!(
            runs_today(&k.id, before + 1),
            "key-00112233aabbccdd-20261208-"
        );
        k.run_window_ms = DEFAULT_RUN_WINDOW_MS;
        assert_eq!(run_of(&k, None, before), "key-00112233aabbccdd-20261207-w0");
        assert_eq!(utc_date(0), "19700101");
        assert_eq!(utc_date(11_016), "20000229");
        // `w0`, `w17`: the window runs' names, never a task's (it would join that run).
        for bad in ["", "a b", "a/b", "\u{202e}x", &"x".repeat(65), "w0", "w17"] {
            assert_eq!(task_name(bad), None, "{bad:?}");
        }
        for good in ["task-1.a_b", "w", "w1x", "W1", "ww1"] {
            assert_eq!(task_name(good), Some(good));
        }
    }
}
