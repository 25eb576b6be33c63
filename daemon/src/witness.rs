//! C2SP tlog-witness over HTTP: `tally witness serve` (the witness), the daemon's pusher
//! (the log's side: it sends each new checkpoint to the witnesses a tlog-policy names
//! and keeps the latest one a quorum cosigned), and the plain HTTP/1.1 client both use.
//!
//! Plain `http://` only (loopback, or behind a TLS-terminating bastion): no TLS stack is
//! linked into tally.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tally_ledger::tlog::note::{Note, NoteSig};
use tally_ledger::tlog::policy::Policy;
use tally_ledger::tlog::proof::ConsistencyProof;
use tally_ledger::tlog::witness::{parse_cosignatures, Refusal, Witness};
use tally_ledger::Ledger;
use tokio::net::{TcpListener, TcpStream};

/// Largest add-checkpoint body a witness reads.
pub const MAX_BODY: usize = 64 * 1024;
/// How long one request to a witness may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A witness's (or any) reply: status, content type, body.
#[derive(Clone, Debug)]
pub struct HttpReply {
    /// Status code.
    pub status: u16,
    /// `Content-Type`, if any.
    pub content_type: Option<String>,
    /// The body.
    pub body: Vec<u8>,
}

/// One HTTP/1.1 request to an `http://host:port/path` URL (a new connection each time).
pub async fn http(method: &str, url: &str, body: Vec<u8>) -> Result<HttpReply, String> {
    let uri: axum::http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!("{url}: only http:// URLs are supported"));
    }
    let host = uri
        .host()
        .ok_or_else(|| format!("{url}: no host"))?
        .to_owned();
    let port = uri.port_u16().unwrap_or(80);
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let work = async move {
        let stream = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, format!("{host}:{port}"))
            .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("{url}: {e}"))?;
        let res = send
            .send_request(req)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let status = res.status().as_u16();
        let content_type = res
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = http_body_util::Limited::new(res.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| format!("{url}: {e}"))?
            .to_bytes()
            .to_vec();
        Ok(HttpReply {
            status,
            content_type,
            body,
        })
    };
    tokio::time::timeout(REQUEST_TIMEOUT, work)
        .await
        .map_err(|_| format!("{url}: no answer in {} s", REQUEST_TIMEOUT.as_secs()))?
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The witness's HTTP routes: `POST /add-checkpoint`, `GET /<origin hash>/checkpoint`.
pub fn witness_router(witness: Arc<Witness>) -> Router {
    Router::new()
        .route("/add-checkpoint", post(add_checkpoint))
        .route("/{hash}/checkpoint", get(held_checkpoint))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(witness)
}

async fn add_checkpoint(State(w): State<Arc<Witness>>, body: Bytes) -> Response {
    // The state file's write and fsync run off the async threads.
    let result = tokio::task::spawn_blocking(move || w.add_checkpoint(&body, now_secs())).await;
    match result {
        Ok(Ok(lines)) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            lines,
        )
            .into_response(),
        Ok(Err(Refusal::Conflict(size))) => (
            StatusCode::CONFLICT,
            [(header::CONTENT_TYPE, "text/x.tlog.size")],
            format!("{size}\n"),
        )
            .into_response(),
        Ok(Err(r)) => (
            StatusCode::from_u16(r.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("{r}\n"),
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn held_checkpoint(
    State(w): State<Arc<Witness>>,
    UrlPath(hash): UrlPath<String>,
) -> Response {
    match w.held_by_hash(&hash) {
        Ok(Some(h)) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            h.note.to_text(),
        )
            .into_response(),
        Ok(None) => StatusCode::NOT_FOUND.into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// Serve `witness` on `listener` until `shutdown` resolves.
pub async fn serve_witness(
    witness: Arc<Witness>,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, witness_router(witness))
        .with_graceful_shutdown(shutdown)
        .await
}

/// The log's side: push checkpoints to the policy's witnesses.
pub struct Pusher {
    ledger: Arc<Ledger>,
    dir: PathBuf,
    policy: Policy,
    /// The size each witness is known to hold (by index into the policy's witnesses).
    held: BTreeMap<usize, u64>,
    /// The size last cosigned by a quorum.
    cosigned: u64,
}

/// What one push round did, for the log line and the tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pushed {
    /// The size pushed.
    pub size: u64,
    /// Witnesses that cosigned it.
    pub cosigned_by: Vec<String>,
    /// Witnesses that refused it, and why.
    pub refused: Vec<(String, String)>,
    /// Whether the quorum cosigned it (and it was kept beside the ledger).
    pub quorum: bool,
}

impl Pusher {
    /// A pusher for `ledger` (in `dir`) to the witnesses of `policy` that have a URL.
    pub fn new(ledger: Arc<Ledger>, dir: PathBuf, policy: Policy) -> Pusher {
        let cosigned = tally_ledger::tlog::read_cosigned(&dir)
            .ok()
            .flatten()
            .and_then(|n| tally_ledger::tlog::note::TreeHead::parse(&n.text).ok())
            .map_or(0, |h| h.size);
        Pusher {
            ledger,
            dir,
            policy,
            held: BTreeMap::new(),
            cosigned,
        }
    }

    /// Push the latest durable checkpoint (if newer than the last cosigned one).
    pub async fn push_once(&mut self) -> Option<Pushed> {
        let note = self.ledger.signed_tree_head();
        let size = self.ledger.tree_head().0.size;
        if size <= self.cosigned {
            return None;
        }
        let mut out = Pushed {
            size,
            ..Pushed::default()
        };
        let mut sigs: Vec<NoteSig> = Vec::new();
        let mut who = BTreeSet::new();
        for (i, w) in self.policy.witnesses.clone().iter().enumerate() {
            let Some(url) = &w.url else { continue };
            match self.push_to(i, url, &note, size).await {
                Ok(lines) => {
                    let valid = lines.into_iter().find(|s| {
                        s.name == w.vkey.name
                            && s.key_id == w.vkey.key_id()
                            && w.vkey.verify_cosignature(&note.text, s).is_ok()
                    });
                    match valid {
                        Some(s) => {
                            self.held.insert(i, size);
                            who.insert(i);
                            sigs.push(s);
                            out.cosigned_by.push(w.name.clone());
                        }
                        None => out.refused.push((
                            w.name.clone(),
                            "no valid cosignature of its key in its answer".into(),
                        )),
                    }
                }
                Err(why) => out.refused.push((w.name.clone(), why)),
            }
        }
        if self.policy.quorum_met(&who) && !self.policy.quorum_none() {
            let mut cosigned = note.clone();
            cosigned.sigs.extend(sigs);
            let dir = self.dir.clone();
            let written = tokio::task::spawn_blocking(move || {
                tally_ledger::tlog::write_cosigned(&dir, &cosigned)
            })
            .await;
            if matches!(written, Ok(Ok(()))) {
                self.cosigned = size;
                out.quorum = true;
            }
        }
        Some(out)
    }

    /// Send `note` (of `size`) to witness `i`: learn what it holds on a 409 and try again
    /// once with a proof from there.
    async fn push_to(
        &mut self,
        i: usize,
        url: &str,
        note: &Note,
        size: u64,
    ) -> Result<Vec<NoteSig>, String> {
        let endpoint = format!("{}/add-checkpoint", url.trim_end_matches('/'));
        for _ in 0..2 {
            let old = self.held.get(&i).copied().unwrap_or(0);
            if old > size {
                return Err(format!(
                    "it holds size {old}, more than this log's {size}: the log was truncated or rolled back"
                ));
            }
            let dir = self.dir.clone();
            let proof = tokio::task::spawn_blocking(move || {
                if old == 0 {
                    Ok(Vec::new())
                } else {
                    tally_ledger::prove::consistency(&dir, old, size)
                }
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
            let body = ConsistencyProof {
                old,
                proof,
                checkpoint: note.clone(),
            }
            .to_text();
            let reply = http("POST", &endpoint, body.into_bytes()).await?;
            match reply.status {
                200 => {
                    let text = String::from_utf8(reply.body)
                        .map_err(|_| "an answer that is not UTF-8".to_string())?;
                    return parse_cosignatures(&text).map_err(|e| e.to_string());
                }
                409 => {
                    let held = std::str::from_utf8(&reply.body)
                        .ok()
                        .and_then(|t| t.strip_suffix('\n'))
                        .and_then(|t| tally_ledger::format::parse_decimal(t, "size").ok())
                        .ok_or("409 without a size".to_string())?;
                    self.held.insert(i, held);
                    continue;
                }
                s => {
                    return Err(format!(
                        "{s}: {}",
                        String::from_utf8_lossy(&reply.body).trim_end()
                    ))
                }
            }
        }
        Err("it answered 409 twice".into())
    }

    /// Push every `interval` until `stop` is set, then once more (the last checkpoint).
    pub async fn run(mut self, interval: Duration, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut last_refusal: BTreeMap<String, String> = BTreeMap::new();
        loop {
            let stopping = tokio::select! {
                _ = tokio::time::sleep(interval) => false,
                _ = stop.changed() => true,
            };
            if let Some(p) = self.push_once().await {
                for (w, why) in &p.refused {
                    // One line per witness and reason, not one per round.
                    if last_refusal.get(w) != Some(why) {
                        log(&format!(
                            "tally serve: witness {w} did not cosign size {}: {why}",
                            p.size
                        ));
                        last_refusal.insert(w.clone(), why.clone());
                    }
                }
                for w in &p.cosigned_by {
                    last_refusal.remove(w);
                }
            }
            if stopping || *stop.borrow() {
                return;
            }
        }
    }
}

fn log(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The address a witness listens on, for its log line.
pub fn describe(addr: SocketAddr) -> String {
    format!("http://{addr}")
}
