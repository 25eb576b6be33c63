//! The last short name a key function hashed on this thread, and its key: an outcome's
//! observed state and remote operation are nearly always the ones the outcome before it
//! named (`running`, the same job polled), and each costs a BLAKE3 hash per record
//! otherwise. A memo only: the key is the hash of the name, whether it was remembered
//! or not.

use std::cell::RefCell;
use std::thread::LocalKey;

/// Longest name remembered (longer ones are hashed every time).
const LONGEST: usize = 64;

/// One remembered name and its key.
pub(super) struct Memo {
    name: [u8; LONGEST],
    len: usize,
    key: Option<u64>,
}

impl Memo {
    pub(super) const fn new() -> Memo {
        Memo {
            name: [0; LONGEST],
            len: 0,
            key: None,
        }
    }
}

/// `name`'s key: remembered in `memo` if it was the last name hashed there, else
/// `hash(name)`, then remembered.
pub(super) fn keyed(
    memo: &'static LocalKey<RefCell<Memo>>,
    name: &str,
    hash: fn(&str) -> u64,
) -> u64 {
    let bytes = name.as_bytes();
    if bytes.len() > LONGEST {
        return hash(name);
    }
    memo.with(|m| {
        let mut m = m.borrow_mut();
        match m.key {
            Some(key) if m.name[..m.len] == *bytes => key,
            _ => {
                let key = hash(name);
                m.name[..bytes.len()].copy_from_slice(bytes);
                m.len = bytes.len();
                m.key = Some(key);
                key
            }
        }
    })
}
