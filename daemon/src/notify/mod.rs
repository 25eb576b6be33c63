//! Notifications (`tally serve --notify URL`; docs/APPROVALS.md, "Notifications"): each
//! new approval request, each answer and each expiry POSTed as a signed
//! `tally_wire::Notification` to every receiver, off the gate's path.
//!
//! [`Notify`] is what the commit points call (observe/gated.rs); [`Running`] is its
//! tasks: the watcher ([`watch`]) and one delivery task per receiver ([`deliver`]).

mod deliver;
mod hub;
mod queue;
mod secret;
mod text;
mod watch;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch as signal;
use tokio::task::JoinSet;

pub use deliver::SIGNATURE_HEADER;
pub use hub::Notify;
pub(crate) use queue::Counters;
pub use secret::MIN_SECRET;
pub(crate) use watch::Lister;

/// The receivers `tally serve --notify` POSTs approval events to. No receiver: nothing
/// is sent and no secret is read.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NotifyOptions {
    /// The receivers' `http://` or `https://` URLs.
    pub receivers: Vec<String>,
    /// The file holding the signing secret (mode 0600 or stricter, at least
    /// [`MIN_SECRET`] bytes); required with a receiver.
    pub secret_file: Option<PathBuf>,
    /// A PEM file of CA certificates trusted beside the Mozilla roots for `https://`.
    pub ca_file: Option<PathBuf>,
    /// Events each receiver's queue holds; one more drops the oldest (counted).
    pub queue: usize,
    /// Attempts per event and receiver before it is given up (counted as dropped).
    pub attempts: u32,
    /// The first retry's wait; each next one doubles, up to `retry_cap`.
    pub retry_base: Duration,
    /// The longest wait between two attempts.
    pub retry_cap: Duration,
    /// How often pending requests are looked at for expiry.
    pub poll: Duration,
}

impl Default for NotifyOptions {
    fn default() -> NotifyOptions {
        NotifyOptions {
            receivers: Vec::new(),
            secret_file: None,
            ca_file: None,
            queue: 256,
            attempts: 8,
            retry_base: Duration::from_millis(500),
            retry_cap: Duration::from_secs(60),
            poll: Duration::from_secs(1),
        }
    }
}

/// The notifier's tasks.
pub(crate) struct Running {
    stop: signal::Sender<bool>,
    tasks: JoinSet<()>,
}

impl Running {
    /// The watcher over `list` and a delivery task per receiver (none when off).
    pub fn start(notify: &Notify, list: Lister) -> Running {
        let (stop, stop_rx) = signal::channel(false);
        let mut tasks = JoinSet::new();
        if let Some(shared) = &notify.shared {
            for r in &shared.receivers {
                let drain = deliver::drain(Arc::clone(shared), Arc::clone(r), stop_rx.clone());
                tasks.spawn(drain);
            }
            tasks.spawn(watch::watch(notify.clone(), list, stop_rx));
        }
        Running { stop, tasks }
    }

    /// Stop: events still queued or being retried are not sent.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        while self.tasks.join_next().await.is_some() {}
    }
}
