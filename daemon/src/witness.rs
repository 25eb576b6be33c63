//! C2SP tlog-witness over HTTPS: `tally witness serve` (the witness), the daemon's pusher
//! (the log's side: it sends each new checkpoint, with a consistency proof from the size
//! each witness holds, to the witnesses a tlog-policy names and keeps the latest one a
//! quorum cosigned), and the client both use.
//!
//! TLS is rustls (the `ring` provider, as the proxy's). The client trusts the Mozilla
//! roots compiled in ([`webpki_roots`]) plus, per witness, an optional CA file (PEM);
//! plain `http://` it speaks only to a loopback host. The witness serves HTTPS with a
//! PEM certificate and key, or plain HTTP on loopback (or, explicitly, behind a
//! TLS-terminating proxy). TLS keeps the exchange private and the witness's address
//! authentic; what makes a cosignature count is its Ed25519 signature, checked against
//! the witness's vkey whatever the transport.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioIo, TokioTimer};
use tally_ledger::tlog::note::{Note, NoteSig};
use tally_ledger::tlog::policy::Policy;
use tally_ledger::tlog::proof::ConsistencyProof;
use tally_ledger::tlog::witness::{parse_cosignatures, Refusal, Witness};
use tally_ledger::Ledger;
use tally_record::url::{Scheme, UpstreamUrl};
use tokio::net::TcpListener;

/// Largest add-checkpoint body a witness reads.
pub const MAX_BODY: usize = 64 * 1024;
/// How long one request to a witness may take (TLS handshake included).
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

fn rustls_provider() -> Arc<rustls::crypto::CryptoProvider> {
    tally_proxy::tls::provider()
}

/// `url` read as a witness's URL the client sends to: the one reading of a URL tally
/// sends to (what is sent is the URL as written), plain `http://` to a loopback host
/// only. The error does not quote the URL.
pub fn url_sent_to(url: &str) -> Result<UpstreamUrl, String> {
    let read = UpstreamUrl::parse(url).map_err(|e| e.to_string())?;
    if read.scheme() == Scheme::Http && !read.is_loopback() {
        return Err("plain http:// only to a loopback host; use https://".into());
    }
    Ok(read)
}

/// A witness of a witness policy whose URL the pusher would not send to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("witness {witness}: its URL `{shown}` {why}")]
#[non_exhaustive]
pub struct WitnessUrlError {
    /// The witness's name in the policy.
    pub witness: String,
    /// Its URL, redacted.
    pub shown: String,
    /// What is wrong with it.
    pub why: String,
}

/// Whether the pusher would send to the URL of each witness of `policy` that gives one
/// ([`url_sent_to`]): `tally serve` asks before it says it started, so that a URL it
/// would refuse stops it rather than fails each push.
pub fn check_urls(policy: &Policy) -> Result<(), WitnessUrlError> {
    for w in &policy.witnesses {
        if let Some(url) = &w.url {
            url_sent_to(url).map_err(|why| WitnessUrlError {
                witness: w.name.clone(),
                shown: tally_record::url::redacted(url),
                why,
            })?;
        }
    }
    Ok(())
}

/// The client a log (or an auditor) talks to witnesses with: HTTPS with the Mozilla
/// roots and an optional extra CA, plain HTTP to loopback hosts only. Cheap to clone.
#[derive(Clone)]
pub struct WitnessClient {
    client: tally_proxy::tls::HttpsClient,
}

impl std::fmt::Debug for WitnessClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WitnessClient").finish_non_exhaustive()
    }
}

impl WitnessClient {
    /// A client trusting the Mozilla roots and, if given, the certificates of the PEM
    /// file `ca_file` (for a witness whose certificate a private CA issued).
    pub fn new(ca_file: Option<&Path>) -> Result<WitnessClient, String> {
        let client = tally_proxy::tls::https_client(ca_file).map_err(|e| match (e, ca_file) {
            (tally_proxy::tls::TlsError::CaFile { why }, Some(file)) => {
                format!("ca_file {}: {why}", file.display())
            }
            (e, _) => e.to_string(),
        })?;
        Ok(WitnessClient { client })
    }

    /// One HTTP/1.1 request to an `https://` URL, or an `http://` URL of a loopback host.
    pub async fn request(
        &self,
        method: &str,
        url: &str,
        body: Vec<u8>,
    ) -> Result<HttpReply, String> {
        // Shown redacted: the URL may carry a secret.
        let shown = tally_record::url::redacted(url);
        let read = url_sent_to(url).map_err(|e| format!("{shown}: {e}"))?;
        let uri: axum::http::Uri = read.as_str().parse().map_err(|e| format!("{shown}: {e}"))?;
        let method: axum::http::Method = method
            .parse()
            .map_err(|_| format!("{method}: not a method"))?;
        let req = axum::http::Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("{shown}: {e}"))?;
        let work = async {
            let res = self.client.request(req).await.map_err(|e| {
                // The connector's error (TLS, refused) is in the chain: say it.
                let mut why = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    why = format!("{why}: {s}");
                    src = s.source();
                }
                format!("{shown}: {why}")
            })?;
            let status = res.status().as_u16();
            let content_type = res
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = http_body_util::Limited::new(res.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| format!("{shown}: {e}"))?
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
            .map_err(|_| format!("{shown}: no answer in {} s", REQUEST_TIMEOUT.as_secs()))?
    }
}

/// One request with a client trusting the Mozilla roots only
/// ([`WitnessClient::request`]).
pub async fn http(method: &str, url: &str, body: Vec<u8>) -> Result<HttpReply, String> {
    WitnessClient::new(None)?.request(method, url, body).await
}

/// The TLS acceptor of a witness serving HTTPS: the certificate chain of the PEM file
/// `cert` (leaf first) and the private key of the PEM file `key` (mode 0600, as every
/// secret key file; never logged).
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "--tls-cert {}: holds no PEM certificate",
            cert.display()
        ));
    }
    let pem = tally_ledger::keys::read_secret_file(key)
        .map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
    let private = PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| format!("--tls-key {}: no PEM private key ({e})", key.display()))?;
    let config = rustls::ServerConfig::builder_with_provider(rustls_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, private)
        .map_err(|e| {
            format!(
                "--tls-cert {} and --tls-key {}: {e}",
                cert.display(),
                key.display()
            )
        })?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
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

/// Serve `witness` on `listener` until `shutdown` resolves: over TLS with `tls`, else
/// plain HTTP (the caller decides where that is allowed).
pub async fn serve_witness(
    witness: Arc<Witness>,
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = witness_router(witness);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tally_proxy::accept::until(&listener, shutdown, |tcp, _| {
        let (tls, router, watcher) = (tls.clone(), router.clone(), graceful.watcher());
        tokio::spawn(async move {
            let service = hyper_util::service::TowerToHyperService::new(router);
            let http = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(REQUEST_TIMEOUT)
                .clone();
            match tls {
                // A handshake that does not finish in time is dropped.
                Some(tls) => {
                    let Ok(Ok(stream)) =
                        tokio::time::timeout(REQUEST_TIMEOUT, tls.accept(tcp)).await
                    else {
                        return;
                    };
                    let conn = http.serve_connection(TokioIo::new(stream), service);
                    let _ = watcher.watch(conn).await;
                }
                None => {
                    let conn = http.serve_connection(TokioIo::new(tcp), service);
                    let _ = watcher.watch(conn).await;
                }
            }
        });
    })
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
    Ok(())
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
    /// The client for each of the policy's witnesses (by index).
    clients: Vec<WitnessClient>,
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
    /// A pusher for `ledger` (in `dir`) to the witnesses of `policy` that have a URL;
    /// `ca_files` names, by witness name, a PEM file of CA certificates to trust for it
    /// beside the Mozilla roots. An unknown name or an unreadable file is an error.
    pub fn new(
        ledger: Arc<Ledger>,
        dir: PathBuf,
        policy: Policy,
        ca_files: &BTreeMap<String, PathBuf>,
    ) -> Result<Pusher, String> {
        if let Some(name) = ca_files
            .keys()
            .find(|n| !policy.witnesses.iter().any(|w| &w.name == *n))
        {
            return Err(format!(
                "a CA file is given for `{name}`, which is not a witness of the witness policy"
            ));
        }
        let clients = policy
            .witnesses
            .iter()
            .map(|w| {
                WitnessClient::new(ca_files.get(&w.name).map(PathBuf::as_path))
                    .map_err(|e| format!("witness {}: {e}", w.name))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cosigned = tally_ledger::tlog::read_cosigned(&dir)
            .ok()
            .flatten()
            .and_then(|n| tally_ledger::tlog::note::TreeHead::parse(&n.text).ok())
            .map_or(0, |h| h.size);
        Ok(Pusher {
            ledger,
            dir,
            policy,
            held: BTreeMap::new(),
            cosigned,
            clients,
        })
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
            let reply = self.clients[i]
                .request("POST", &endpoint, body.into_bytes())
                .await?;
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

/// The URL a witness listens on, for its log line.
pub fn describe(addr: SocketAddr, tls: bool) -> String {
    format!("{}://{addr}", if tls { "https" } else { "http" })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A witness policy whose witness gives a URL the pusher would not send to (plain
    /// http beyond loopback, what the client would rewrite, user info) is refused as a
    /// whole, naming the witness, the URL redacted; one it would send to passes.
    #[test]
    fn a_witness_url_the_pusher_would_refuse_is_named() {
        use tally_ledger::tlog::note::{Vkey, TYPE_COSIGNATURE};
        let vkey = Vkey::new("example.org/w1", TYPE_COSIGNATURE, [7; 32])
            .expect("vkey")
            .to_text();
        let policy = |url: &str| {
            Policy::parse(format!("witness w1 {vkey} {url}\nquorum w1\n").as_bytes())
                .expect("a witness policy")
        };
        for url in [
            "https://w.example/t/SECRET",
            "http://127.0.0.1:8080/t/SECRET",
            "http://[::1]/w",
        ] {
            assert_eq!(check_urls(&policy(url)), Ok(()), "{url}");
        }
        for url in [
            "http://10.0.0.7:8080/t/SECRET",
            "https://w.example/t/%53ECRET",
            "https://127.1/t/SECRET",
            "https://u:SECRET@w.example/w",
            "https://w.example/t/SECRET?k=1",
        ] {
            let e = check_urls(&policy(url)).expect_err(url);
            assert_eq!(e.witness, "w1", "{url}");
            let said = e.to_string();
            assert!(said.starts_with("witness w1: its URL `"), "{said}");
            assert!(!said.contains("SECRET"), "{url}: {said}");
        }
    }

    #[tokio::test]
    async fn the_client_refuses_plain_http_beyond_loopback_and_other_schemes() {
        let c = WitnessClient::new(None).expect("client");
        for url in [
            "http://example.org/add-checkpoint",
            "http://10.1.2.3:80/add-checkpoint",
            "ftp://127.0.0.1/x",
        ] {
            let e = c.request("POST", url, Vec::new()).await.unwrap_err();
            assert!(e.contains("https://"), "{url}: {e}");
        }
        assert!(c
            .request("POST", "127.0.0.1:80/x", Vec::new())
            .await
            .is_err());
    }

    /// A witness URL may carry a secret (user info, a token in its path): an error shows
    /// it redacted, whatever failed (the scheme, a refused connection).
    #[tokio::test]
    async fn an_error_shows_the_url_redacted() {
        let c = WitnessClient::new(None).expect("client");
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a port")
            .port();
        for url in [
            "http://u:SECRET@10.1.2.3/t/SECRET/add-checkpoint".to_owned(),
            format!("http://127.0.0.1:{closed}/t/SECRET/add-checkpoint"),
            "ftp://h/SECRET".to_owned(),
            "SECRET".to_owned(),
        ] {
            let e = c.request("POST", &url, Vec::new()).await.unwrap_err();
            assert!(!e.contains("SECRET"), "{url}: {e}");
        }
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let empty = dir.path().join("ca.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let e = WitnessClient::new(Some(&empty)).unwrap_err();
        assert!(e.contains("no PEM certificate"), "{e}");
        let e = WitnessClient::new(Some(&dir.path().join("missing.pem"))).unwrap_err();
        assert!(e.contains("missing.pem"), "{e}");
    }
}
