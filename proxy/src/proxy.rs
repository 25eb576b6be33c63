//! The proxy as one value ([`Proxy`]): its upstreams with their clients and secrets, the
//! run token key, and the gate it asks; and how it serves a listener.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tally_gate::{GateError, Gatekeeper};
use tally_policy::{Policy, Upstream};
use tally_record::url::UpstreamUrl;
use zeroize::Zeroizing;

use crate::accept::Peer;
use crate::token::{KeyError, TokenKey};

/// How the proxy runs a gate call: on the daemon's decision thread. The job is called
/// with `true` when it waited past the backend's bound (it must then refuse as
/// unavailable, without calling the gate).
pub type Stage = Arc<dyn Fn(Box<dyn FnOnce(bool) + Send>) + Send + Sync>;

/// Why the proxy cannot start. Nothing is bound.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// An upstream's credential was not given.
    #[error("upstream `{upstream}` injects credential `{credential}`, which was not given: pass --credential {credential}=FILE")]
    MissingCredential {
        /// The upstream.
        upstream: String,
        /// The credential it names.
        credential: String,
    },
    /// A credential file cannot be used.
    #[error("credential file {path}: {why}")]
    Credential {
        /// The file.
        path: PathBuf,
        /// What is wrong and what to do.
        why: String,
    },
    /// An upstream's `ca_file` cannot be read.
    #[error("upstream `{upstream}`: ca_file {path}: {why}")]
    CaFile {
        /// The upstream.
        upstream: String,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// An upstream's URL is not one the client can reach, or not one a policy put in
    /// force may give (plain `http://` to a host that is not loopback).
    #[error("upstream `{upstream}`: url `{url}` cannot be used: {why}")]
    Url {
        /// The upstream.
        upstream: String,
        /// Its URL, redacted (`tally_record::url::redacted`: it may carry a secret).
        url: String,
        /// Why.
        why: String,
    },
    /// The TLS configuration cannot be built.
    #[error("TLS: {0}")]
    Tls(String),
    /// The run token key.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A `bedrock` upstream's credential is not an AWS credential.
    #[error("upstream `{upstream}`: credential `{credential}`: {why}")]
    AwsCredential {
        /// The upstream.
        upstream: String,
        /// The credential it names.
        credential: String,
        /// What is wrong.
        why: crate::bedrock::sign::AwsCredentialError,
    },
    /// The keys' file (docs/KEYS.md).
    #[error(transparent)]
    Keys(#[from] crate::keys::KeyRingError),
}

/// A secret read from a credential file (zeroized on drop, never logged).
pub type Secret = Zeroizing<String>;

/// Reads a credential's secret from `path`: mode 0600 (or stricter), one line (a single
/// trailing newline is dropped), not empty, visible ASCII.
pub fn read_credential(path: &Path) -> Result<Secret, ProxyError> {
    use std::os::unix::fs::PermissionsExt;
    let bad = |why: String| ProxyError::Credential {
        path: path.to_path_buf(),
        why,
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(bad(format!(
            "has mode {mode:04o}; a secret must be 0600 (chmod 600 {})",
            path.display()
        )));
    }
    let bytes = Zeroizing::new(std::fs::read(path).map_err(|e| bad(e.to_string()))?);
    let mut text: &[u8] = &bytes;
    if let Some(t) = text.strip_suffix(b"\n") {
        text = t;
    }
    if text.is_empty() || !text.iter().all(|b| b.is_ascii_graphic()) {
        return Err(bad(
            "must hold the secret alone on one line (visible ASCII, no spaces)".into(),
        ));
    }
    // Visible ASCII is UTF-8.
    Ok(Zeroizing::new(String::from_utf8_lossy(text).into_owned()))
}

/// A place for one more connection of a peer: held for the connection's life and given
/// back when dropped, or `None` when the peer holds all it may (the connection is then
/// answered `429 too_many_connections` and closed).
pub type Admit = Arc<dyn Fn(Peer) -> Option<Box<dyn Send>> + Send + Sync>;

/// What the proxy needs besides the policy and the gate.
#[non_exhaustive]
pub struct ProxyOptions {
    /// Secrets by credential name.
    pub credentials: BTreeMap<String, Secret>,
    /// The run token key.
    pub key: Arc<TokenKey>,
    /// The keys a call may present in place of a run token (docs/KEYS.md); none: only
    /// run tokens.
    pub keys: Option<Arc<crate::keys::KeyRing>>,
    /// Connections of one peer at once (the daemon counts them: [`Admit`]); `None`
    /// admits every connection.
    pub admit: Option<Admit>,
    /// The tracer for a span per call (`serve --otlp-endpoint`); none: no spans.
    pub tracer: Option<Arc<opentelemetry::global::BoxedTracer>>,
    /// A request's headers, and then its whole body, must each arrive within this time
    /// (default [`DEFAULT_READ_TIMEOUT`]); a body that does not is answered 408 and its
    /// connection closed, slow headers a closed connection.
    pub read_timeout: Duration,
    /// The URL of each upstream given by `url_file`, read from its file when `tally
    /// serve` starts (the daemon reads it, as it reads credentials), by upstream name.
    pub urls: BTreeMap<String, UpstreamUrl>,
}

/// The time a request's headers, and then its body, have to arrive by default.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);

impl ProxyOptions {
    /// Options with these secrets and key, admitting every connection.
    pub fn new(credentials: BTreeMap<String, Secret>, key: Arc<TokenKey>) -> ProxyOptions {
        ProxyOptions {
            credentials,
            key,
            keys: None,
            admit: None,
            tracer: None,
            read_timeout: DEFAULT_READ_TIMEOUT,
            urls: BTreeMap::new(),
        }
    }

    /// The same, with the URLs read from the `url_file`s of upstreams that have one.
    pub fn with_urls(mut self, urls: BTreeMap<String, UpstreamUrl>) -> ProxyOptions {
        self.urls = urls;
        self
    }

    /// The same, each request's headers and then its body read within `limit` (not 0).
    pub fn reading_within(mut self, limit: Duration) -> ProxyOptions {
        self.read_timeout = limit;
        self
    }

    /// The same, calls with a key of `keys` starting their runs (docs/KEYS.md).
    pub fn with_keys(mut self, keys: Arc<crate::keys::KeyRing>) -> ProxyOptions {
        self.keys = Some(keys);
        self
    }

    /// The same, each connection admitted by `admit` (a per-peer connection limit).
    pub fn admitting(mut self, admit: Admit) -> ProxyOptions {
        self.admit = Some(admit);
        self
    }

    /// A span per call, made by `tracer` (docs/PROXY.md).
    pub fn with_tracer(mut self, tracer: opentelemetry::global::BoxedTracer) -> ProxyOptions {
        self.tracer = Some(Arc::new(tracer));
        self
    }
}

pub(crate) type HttpClient = crate::tls::HttpsClient;

/// One upstream, ready.
pub(crate) struct Route {
    pub name: String,
    pub upstream: Upstream,
    /// `http` or `https`.
    pub scheme: String,
    /// `host[:port]`.
    pub authority: String,
    /// The host alone (the gate's target).
    pub host: String,
    /// The base path (`""` or `/base`).
    pub base: String,
    pub secret: Secret,
    /// A `bedrock` upstream's signer: its credential and region.
    pub aws: Option<crate::bedrock::sign::AwsSigner>,
    pub client: HttpClient,
    /// Its URL is given by `url_file` (a secret): no redirect from it is passed back,
    /// nor an error answer's body or headers (either may echo the URL).
    pub withheld: bool,
}

/// The proxy: cheap to share (`Arc`), one per daemon.
pub struct Proxy {
    pub(crate) routes: BTreeMap<String, Route>,
    pub(crate) policy: Policy,
    pub(crate) gate: Arc<dyn Gatekeeper>,
    pub(crate) stage: Stage,
    pub(crate) key: Arc<TokenKey>,
    pub(crate) keys: Option<Arc<crate::keys::KeyRing>>,
    pub(crate) admit: Option<Admit>,
    pub(crate) tracer: Option<Arc<opentelemetry::global::BoxedTracer>>,
    /// The headers, then the body, each within it ([`ProxyOptions::read_timeout`]).
    pub(crate) read_timeout: Duration,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("upstreams", &self.routes.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Where upstream `name` is: its `url`, or the URL read from its `url_file` (`urls`,
/// given by [`ProxyOptions::with_urls`]), either only if a policy put in force may give
/// it (a recorded policy's plain `http://` to another host is not forwarded to, nor is
/// a URL a caller of `with_urls` read without checking). An error shows the URL
/// redacted.
fn upstream_url(
    name: &str,
    u: &Upstream,
    urls: &BTreeMap<String, UpstreamUrl>,
) -> Result<UpstreamUrl, ProxyError> {
    let bad = |url: &str, why: String| ProxyError::Url {
        upstream: name.to_owned(),
        url: tally_record::url::redacted(url),
        why,
    };
    match (&u.url, &u.url_file) {
        (Some(url), None) => {
            tally_policy::upstreams::url_in_force(url).map_err(|why| bad(url, why))
        }
        (None, Some(_)) => {
            let url = urls
                .get(name)
                .ok_or_else(|| bad("", "its url_file was not read".into()))?
                .as_str();
            tally_policy::upstreams::url_in_force(&url).map_err(|why| bad(&url, why))
        }
        _ => Err(bad("", "give `url` or `url_file`, one of them".into())),
    }
}

fn client(name: &str, u: &Upstream) -> Result<HttpClient, ProxyError> {
    let ca_file = u.ca_file.as_deref().map(Path::new);
    crate::tls::https_client(ca_file).map_err(|e| match e {
        crate::tls::TlsError::CaFile { why } => ProxyError::CaFile {
            upstream: name.to_owned(),
            path: PathBuf::from(ca_file.unwrap_or(Path::new(""))),
            why,
        },
        other => ProxyError::Tls(other.to_string()),
    })
}

/// A `bedrock` upstream's signer, from its credential's secret and its region; `None`
/// for any other kind.
fn aws_signer(
    name: &str,
    u: &Upstream,
    secret: &Secret,
) -> Result<Option<crate::bedrock::sign::AwsSigner>, ProxyError> {
    if u.kind != tally_policy::UpstreamKind::Bedrock {
        return Ok(None);
    }
    let region = u.aws_region.as_deref().unwrap_or_default();
    crate::bedrock::sign::AwsSigner::new(secret, region)
        .map(Some)
        .map_err(|why| ProxyError::AwsCredential {
            upstream: name.to_owned(),
            credential: u.credential.clone(),
            why,
        })
}

impl Proxy {
    /// The proxy for the policy's upstreams. Every upstream's credential must be given;
    /// `ca_file`s are read now.
    pub fn new(
        policy: &Policy,
        options: ProxyOptions,
        gate: Arc<dyn Gatekeeper>,
        stage: Stage,
    ) -> Result<Proxy, ProxyError> {
        let mut routes = BTreeMap::new();
        for (name, u) in &policy.upstreams {
            let secret = options.credentials.get(&u.credential).ok_or_else(|| {
                ProxyError::MissingCredential {
                    upstream: name.clone(),
                    credential: u.credential.clone(),
                }
            })?;
            let url = upstream_url(name, u, &options.urls)?;
            let aws = aws_signer(name, u, secret)?;
            routes.insert(
                name.clone(),
                Route {
                    name: name.clone(),
                    upstream: u.clone(),
                    scheme: url.scheme().as_str().to_owned(),
                    authority: url.authority(),
                    host: url.host().to_owned(),
                    base: url.base().to_owned(),
                    secret: Zeroizing::new(secret.as_str().to_owned()),
                    aws,
                    client: client(name, u)?,
                    withheld: u.url.is_none(),
                },
            );
        }
        Ok(Proxy {
            routes,
            policy: policy.clone(),
            gate,
            stage,
            key: options.key,
            keys: options.keys,
            admit: options.admit,
            tracer: options.tracer,
            read_timeout: options.read_timeout,
        })
    }

    /// The token a run's agent uses as its API key.
    pub fn token(&self, run: &str) -> String {
        self.key.mint(run)
    }

    /// Serves connections from `listener` until `shutdown` resolves; connections in
    /// flight finish (a stream is bounded by its deadline).
    pub async fn serve_tcp(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        self.serve(listener, shutdown).await;
    }

    /// [`Proxy::serve_tcp`] on a Unix socket.
    pub async fn serve_unix(
        self: Arc<Self>,
        listener: tokio::net::UnixListener,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        self.serve(listener, shutdown).await;
    }

    async fn serve<L: crate::accept::Accept>(
        self: Arc<Self>,
        listener: L,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        crate::accept::until(&listener, shutdown, |stream, peer| {
            self.connection(&graceful, TokioIo::new(stream), peer);
        })
        .await;
        graceful.shutdown().await;
    }

    fn connection<I>(
        self: &Arc<Self>,
        graceful: &hyper_util::server::graceful::GracefulShutdown,
        io: I,
        peer: Peer,
    ) where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        // The peer's place, held until the connection ends; none: one answer, closed.
        let slot = match &self.admit {
            None => Some(None),
            Some(admit) => admit(peer).map(Some),
        };
        let me = Arc::clone(self);
        let service = hyper::service::service_fn(move |req| {
            let me = Arc::clone(&me);
            let over = slot.is_none();
            async move {
                if over {
                    return Ok(too_many_connections(&me, &req));
                }
                Ok::<_, std::convert::Infallible>(me.handle(req).await)
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(self.read_timeout)
            .serve_connection(io, service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }

    /// A gate call that answers at once (a read of the state): on this task for the
    /// embedded store (a lock and memory, as the daemon's own reads of that store), on
    /// the decision thread for a networked backend, which blocks for its round trips.
    pub(crate) async fn at_once<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Gatekeeper) -> Result<T, GateError> + Send + 'static,
    ) -> Result<T, GateError> {
        if self.gate.networked() {
            self.gate(move |gate, done| done(f(gate.as_ref()))).await
        } else {
            f(self.gate.as_ref())
        }
    }

    /// Runs a gate call on the stage and awaits its answer.
    pub(crate) async fn gate<T: Send + 'static>(
        &self,
        f: impl FnOnce(Arc<dyn Gatekeeper>, Box<dyn FnOnce(Result<T, GateError>) + Send>)
            + Send
            + 'static,
    ) -> Result<T, GateError> {
        call(&self.gate, &self.stage, f).await
    }
}

/// The answer to a request on a connection its peer had no place for: 429 in the
/// upstream's dialect, with `Retry-After`, and the connection closed after it.
fn too_many_connections<B>(proxy: &Proxy, req: &hyper::Request<B>) -> hyper::Response<crate::Body> {
    let name = req
        .uri()
        .path()
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default();
    let kind = proxy
        .routes
        .get(name)
        .map_or(tally_policy::UpstreamKind::Openai, |r| r.upstream.kind);
    let mut refusal = crate::dialect::Refusal::own(
        hyper::StatusCode::TOO_MANY_REQUESTS,
        tally_wire::ErrorCode::TooManyConnections,
        "this client holds as many connections to the proxy as one peer may (tally serve --proxy-max-connections-per-peer): reuse one, or close one",
    );
    refusal.action = tally_record::Action::Retry;
    refusal.retry_after_ms = Some(1000);
    refusal.close = true;
    refusal.response(kind)
}

/// Runs a gate call on `stage` and awaits its answer.
pub(crate) async fn call<T: Send + 'static>(
    gate: &Arc<dyn Gatekeeper>,
    stage: &Stage,
    f: impl FnOnce(Arc<dyn Gatekeeper>, Box<dyn FnOnce(Result<T, GateError>) + Send>) + Send + 'static,
) -> Result<T, GateError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let gate = Arc::clone(gate);
    stage(Box::new(move |late| {
        if late {
            let _ = tx.send(Err(GateError::Unavailable(
                "the gate's earlier decisions held its state store past its bound".into(),
            )));
            return;
        }
        f(
            gate,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )
    }));
    rx.await
        .unwrap_or_else(|_| Err(GateError::Unavailable("the gate dropped a request".into())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A URL given for a `url_file` upstream is held to the rules of a URL put in force
    /// as a policy's `url` is, whoever read it: plain `http://` beyond loopback is
    /// refused, shown redacted.
    #[test]
    fn a_url_given_for_a_url_file_is_held_to_the_rules_in_force() {
        let policy = tally_policy::Policy::from_toml(
            "[upstreams.gw]\nurl_file = \"/gw.url\"\nkind = \"openai\"\ncredential = \"gw\"\n",
        )
        .expect("policy");
        let u = &policy.upstreams["gw"];
        let given = |url: &str| {
            let read = UpstreamUrl::parse(url).expect("a URL");
            BTreeMap::from([("gw".to_owned(), read)])
        };
        let ok = upstream_url("gw", u, &given("https://gw.example/t/SECRET/v1")).expect("ok");
        assert_eq!(ok.as_str(), "https://gw.example/t/SECRET/v1");
        match upstream_url("gw", u, &given("http://10.0.0.7:8000/t/SECRET/v1")) {
            Err(e @ ProxyError::Url { .. }) => {
                let said = e.to_string();
                assert!(
                    said.contains("loopback") && !said.contains("SECRET"),
                    "{said}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(upstream_url("gw", u, &BTreeMap::new()).is_err());
    }
}
