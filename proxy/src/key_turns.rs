//! The turns of the key runs being started, by name: the starts of one run go one after
//! another ([`crate::key_run`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// The key runs being started, by name: their turns.
#[derive(Default)]
pub(crate) struct KeyStarts(Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>);

impl std::fmt::Debug for KeyStarts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyStarts").finish_non_exhaustive()
    }
}

impl KeyStarts {
    /// `run`'s turn: held until it is read again and, if new, started.
    pub(crate) async fn turn(&self, run: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
            map.retain(|_, w| w.strong_count() > 0);
            match map.get(run).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    let lock = Arc::new(tokio::sync::Mutex::new(()));
                    map.insert(run.to_owned(), Arc::downgrade(&lock));
                    lock
                }
            }
        };
        lock.lock_owned().await
    }
}
