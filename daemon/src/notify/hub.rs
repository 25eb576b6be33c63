//! [`Notify`]: what the gate's commit points and the watcher call, one function per
//! event ([`Notify::requested`], [`Notify::answered`], [`Notify::expired`]), each
//! putting the signed-later body on every receiver's queue without waiting.

use std::sync::Arc;

use bytes::Bytes;
use tally_ledger::clock::Clock;
use tally_record::url::UpstreamUrl;
use tally_wire::{ApprovalRequest, Notification, NotifyKind};

use super::queue::{Counters, Queue};
use super::secret::Secret;
use super::NotifyOptions;

/// One receiver: its URL and its queue.
pub(crate) struct Receiver {
    pub url: axum::http::Uri,
    pub queue: Queue,
}

pub(crate) struct Shared {
    pub receivers: Vec<Arc<Receiver>>,
    pub secret: Secret,
    pub client: tally_proxy::tls::HttpsClient,
    pub counters: Counters,
    pub clock: Arc<dyn Clock>,
    pub options: NotifyOptions,
    /// Woken at a commit point: the watcher looks at the requests now.
    pub nudge: tokio::sync::Notify,
}

/// The notifier; off (every call a no-op) without receivers. Cheap to clone.
#[derive(Clone, Default)]
pub struct Notify {
    pub(crate) shared: Option<Arc<Shared>>,
}

impl std::fmt::Debug for Notify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notify")
            .field("on", &self.shared.is_some())
            .finish()
    }
}

/// A receiver URL, checked: `http://` or `https://` with a host, read as every URL
/// tally sends to is, a query allowed ([`UpstreamUrl::parse_with_query`]: sent as
/// written). An error shows it
/// redacted: a webhook's URL carries its secret in its path.
fn receiver_url(url: &str) -> Result<axum::http::Uri, String> {
    let shown = tally_record::url::redacted(url);
    let read = UpstreamUrl::parse_with_query(url).map_err(|e| {
        format!("receiver `{shown}`: {e}; only http:// and https:// URLs with a host are sent to, as written")
    })?;
    read.as_str()
        .parse()
        .map_err(|e| format!("receiver `{shown}`: {e}"))
}

impl Notify {
    /// The notifier `options` ask for: off without receivers; else every receiver URL
    /// checked, the secret read (fail closed: no secret, no start) and the HTTPS client
    /// built with the Mozilla roots and `options.ca_file`.
    pub fn open(options: &NotifyOptions, clock: Arc<dyn Clock>) -> Result<Notify, String> {
        if options.receivers.is_empty() {
            return Ok(Notify::default());
        }
        let mut receivers = Vec::new();
        for url in &options.receivers {
            receivers.push(Arc::new(Receiver {
                url: receiver_url(url)?,
                queue: Queue::new(options.queue),
            }));
        }
        let file = options.secret_file.as_deref().ok_or_else(|| {
            "a receiver needs --notify-secret-file FILE: every notification is signed".to_owned()
        })?;
        let secret = Secret::read(file)?;
        let ca = options.ca_file.as_deref();
        let client = tally_proxy::tls::https_client(ca).map_err(|e| match ca {
            Some(f) => format!("--notify-ca {}: {e}", f.display()),
            None => e.to_string(),
        })?;
        Ok(Notify {
            shared: Some(Arc::new(Shared {
                receivers,
                secret,
                client,
                counters: Counters::default(),
                clock,
                options: options.clone(),
                nudge: tokio::sync::Notify::new(),
            })),
        })
    }

    /// The delivery counters, when on.
    pub(crate) fn counters(&self) -> Option<&Counters> {
        self.shared.as_ref().map(|s| &s.counters)
    }

    /// Commit point: a request was recorded or answered (a `require_approval` check;
    /// an approve or deny by id): the watcher looks now rather than at its next poll.
    pub(crate) fn changed(&self) {
        if let Some(s) = &self.shared {
            s.nudge.notify_one();
        }
    }

    /// A new approval request.
    pub fn requested(&self, r: &ApprovalRequest) {
        self.emit(NotifyKind::Requested, r)
    }

    /// A request approved or denied (its `state` says which).
    pub fn answered(&self, r: &ApprovalRequest) {
        self.emit(NotifyKind::Answered, r)
    }

    /// A request whose run's deadline passed unanswered.
    pub fn expired(&self, r: &ApprovalRequest) {
        self.emit(NotifyKind::Expired, r)
    }

    /// The event's body, on every receiver's queue.
    fn emit(&self, kind: NotifyKind, r: &ApprovalRequest) {
        let Some(s) = &self.shared else {
            return;
        };
        let event = Notification {
            event: kind,
            request: r.clone(),
            at_ms: s.clock.now_ms(),
            text: super::text::text(kind, r),
        };
        // A struct of strings and numbers always serializes.
        let Ok(body) = serde_json::to_vec(&event) else {
            return;
        };
        let body = Bytes::from(body);
        for receiver in &s.receivers {
            receiver.queue.push(body.clone(), &s.counters);
        }
    }
}
