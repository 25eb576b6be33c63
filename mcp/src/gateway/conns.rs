//! The bound on the gateway's open connections (`tally serve --mcp-max-connections`).
//! A connection takes a place when it is accepted and holds it until it is closed; one
//! over the bound is answered `503` with `Retry-After: 1` at once, its request never
//! read, and closed. The refusal is written in a task of its own, within
//! [`REFUSE_BOUND`], so a flood never slows the accept loop. Each refusal is told to
//! the gateway's owner (the daemon's `tally_mcp_refused_connections_total`), and they
//! are logged at most once a second.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a refused connection is kept: its answer written, then what its client
/// already sent read and dropped (closing with unread bytes would reset the connection,
/// and the client could lose the answer), then it is closed.
const REFUSE_BOUND: Duration = Duration::from_secs(1);
/// The most bytes of a refused connection's request read (and dropped) before it is
/// closed.
const DRAIN_BYTES: usize = 64 * 1024;
/// The most refusals being written at once: past them, a connection over the bound is
/// closed at once, unanswered, so a flood cannot hold the daemon's descriptors for
/// [`REFUSE_BOUND`] each.
const REFUSING: usize = 64;
/// Refusals are logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// The places of the open connections.
pub(super) struct Connections {
    places: Arc<Semaphore>,
    max: usize,
    /// The places of the refusals being written.
    refusing: Arc<Semaphore>,
    /// Refusals not yet logged.
    refused: AtomicU64,
    /// When refusals were last logged.
    logged: Mutex<Option<Instant>>,
    /// Told of each refusal.
    on_refused: Arc<dyn Fn() + Send + Sync>,
}

/// The answer to a connection over the bound.
fn refusal(max: usize) -> Vec<u8> {
    let body = serde_json::json!({
        "error": format!(
            "tally's MCP gateway: {max} connections are open, as many as it serves at once (tally serve --mcp-max-connections): retry later"
        )
    })
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

impl Connections {
    /// At most `max` connections open at once (at least 1), `on_refused` told of each
    /// one refused.
    pub(super) fn new(max: usize, on_refused: Arc<dyn Fn() + Send + Sync>) -> Connections {
        let max = max.max(1);
        Connections {
            places: Arc::new(Semaphore::new(max)),
            max,
            refusing: Arc::new(Semaphore::new(REFUSING)),
            refused: AtomicU64::new(0),
            logged: Mutex::new(None),
            on_refused,
        }
    }

    /// A place for a connection just accepted, held until it is dropped; `None` when
    /// every place is taken.
    pub(super) fn place(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.places).try_acquire_owned().ok()
    }

    /// Answer `stream` (over the bound) `503` and close it, in a task of its own; closed
    /// at once, unanswered, while [`REFUSING`] refusals are being written.
    pub(super) fn refuse(&self, stream: TcpStream) {
        self.count();
        let Ok(writing) = Arc::clone(&self.refusing).try_acquire_owned() else {
            return;
        };
        let answer = refusal(self.max);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(REFUSE_BOUND, answer_and_close(stream, &answer)).await;
            drop(writing);
        });
    }

    /// One more refusal; a log line if none was written in the last [`LOG_EVERY`].
    fn count(&self) {
        (self.on_refused)();
        self.refused.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let Ok(mut logged) = self.logged.lock() else {
            return;
        };
        if logged.is_some_and(|at| now.duration_since(at) < LOG_EVERY) {
            return;
        }
        *logged = Some(now);
        let n = self.refused.swap(0, Ordering::Relaxed);
        crate::log(&format!(
            "gateway: {n} connection(s) refused (503): {} are open, the bound (--mcp-max-connections)",
            self.max
        ));
    }
}

/// `answer` written, the stream's writing side shut, what the client sent read and
/// dropped (at most [`DRAIN_BYTES`]) until it closes.
async fn answer_and_close(mut stream: TcpStream, answer: &[u8]) {
    if stream.write_all(answer).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let mut read = 0;
    while read < DRAIN_BYTES {
        match stream.read(&mut sink).await {
            Ok(0) | Err(_) => return,
            Ok(n) => read += n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_is_a_whole_503_naming_the_flag() {
        let text = String::from_utf8(refusal(4)).expect("utf-8");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head");
        assert!(head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(head.contains("\r\nRetry-After: 1"));
        assert!(head.contains("\r\nConnection: close"));
        assert!(head.contains(&format!("\r\nContent-Length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).expect("json");
        assert!(v["error"]
            .as_str()
            .is_some_and(|e| e.contains("--mcp-max-connections") && e.contains("4 connections")));
    }

    #[tokio::test]
    async fn a_place_given_back_is_taken_again() {
        let c = Connections::new(2, Arc::new(|| ()));
        let a = c.place().expect("a first place");
        let _b = c.place().expect("a second place");
        assert!(c.place().is_none());
        drop(a);
        assert!(c.place().is_some());
    }
}
