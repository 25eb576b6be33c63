//! The servers behind the gateway: one rmcp client each, shared by every session,
//! connected on first use and again after its transport failed; the effect class of
//! each tool, learned from its `tools/list` (as `tally mcp` learns it).
//!
//! A stdio server's process is the gateway's own child, started in a process group of
//! its own: the group is killed (the processes the server started too) and the child
//! reaped (never left a zombie, never left running) when it does not finish
//! initializing or listing in time, when a call to it times out (a server that does not
//! answer may hang for good: the next call starts a new one), and when the gateway
//! stops. Each start is a generation: a call that timed out kills the generation it was
//! made on, never one started since.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, Tool};
use rmcp::service::{RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Map, Value};
use tally_record::Effect;

use super::{Server, Target, SEPARATOR};

/// How long connecting to a server (its initialize exchange) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a server's `tools/list` may take, connecting included: a server that does
/// not answer in time is left out of that list.
pub(super) const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// A tool a server did not list is looked up again at most this often.
const RELIST_INTERVAL: Duration = Duration::from_secs(30);

type Client = RunningService<RoleClient, ()>;

/// A stdio server's process, shared by whoever may have to kill it.
type Process = Arc<tokio::sync::Mutex<Group>>;

/// A stdio server's process, the leader of its own process group.
struct Group {
    child: tokio::process::Child,
    /// The group (the child's pid), until it is killed.
    id: Option<rustix::process::Pid>,
}

impl Group {
    fn new(child: tokio::process::Child) -> Group {
        let id = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .and_then(rustix::process::Pid::from_raw);
        Group { child, id }
    }

    /// `SIGKILL` to every process of the group, once.
    fn signal(&mut self) {
        if let Some(id) = self.id.take() {
            let _ = rustix::process::kill_process_group(id, rustix::process::Signal::KILL);
        }
    }

    /// Kill the group and reap the child.
    async fn kill(&mut self) -> std::io::Result<()> {
        self.signal();
        self.child.kill().await
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal();
    }
}

/// One server and its client.
pub(super) struct Backend {
    pub(super) name: String,
    target: Target,
    /// The connected client, and the generation it was connected in.
    client: tokio::sync::Mutex<Option<(u64, Arc<Client>)>>,
    /// A stdio server's current process (started, initializing or serving), and its
    /// generation.
    process: Mutex<Option<(u64, Process)>>,
    /// The last generation started.
    generation: AtomicU64,
    /// Effects learned from its `tools/list`, by its own tool name.
    effects: Mutex<HashMap<String, Effect>>,
    /// When a lookup of an unlisted tool last listed the server's tools again.
    relisted: Mutex<Option<tokio::time::Instant>>,
    /// Environment variables a stdio server is started without (the credentials).
    hidden_env: Arc<[String]>,
    /// Set by the gateway's stop: the server is not started or reached again.
    stopped: std::sync::atomic::AtomicBool,
}

/// How a call to a server ended, when it was made.
pub(super) enum Called {
    /// It answered with a result (`isError` or not).
    Result(CallToolResult),
    /// It answered with a JSON-RPC error.
    Error(rmcp::ErrorData),
    /// No answer in time.
    Timeout,
    /// The transport failed: whether the server acted is unknown.
    Lost(String),
    /// The server could not be reached: the call was never sent.
    NotSent(String),
}

/// Why a tool's call is not made.
pub(super) enum Unlisted {
    /// The server's listing does not have it.
    Unknown,
    /// The server did not list its tools.
    NoListing(String),
}

impl Backend {
    pub(super) fn new(server: Server, hidden_env: Arc<[String]>) -> Backend {
        Backend {
            name: server.name,
            target: server.target,
            client: tokio::sync::Mutex::new(None),
            process: Mutex::new(None),
            generation: AtomicU64::new(0),
            effects: Mutex::new(HashMap::new()),
            relisted: Mutex::new(None),
            hidden_env,
            stopped: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The connected client and its generation, connecting if there is none.
    async fn client(&self) -> Result<(u64, Arc<Client>), String> {
        let mut slot = self.client.lock().await;
        // Read under the client's lock, which the stop takes after setting it: nothing
        // is started after the stop.
        if self.stopped.load(Ordering::SeqCst) {
            return Err("the gateway is stopping: the server is not started again".to_owned());
        }
        if let Some((generation, c)) = slot.as_ref().filter(|(_, c)| !c.is_closed()) {
            return Ok((*generation, Arc::clone(c)));
        }
        // A process whose client closed is not left behind.
        self.kill(None).await;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let connected = match &self.target {
            Target::Command(command) => self.start(command, generation).await,
            Target::Url {
                url,
                credential,
                client,
            } => tokio::time::timeout(
                CONNECT_TIMEOUT,
                connect_url(url, credential.as_ref(), client),
            )
            .await
            .map_err(|_| "it did not finish initializing in time".to_owned())?,
        };
        let client = Arc::new(connected.map_err(|why| self.said(why))?);
        *slot = Some((generation, Arc::clone(&client)));
        Ok((generation, client))
    }

    /// `why` (what the server's client said) with a remote server's URL scrubbed from it
    /// (`tally_record::url::scrubbed`): the URL may carry a secret, and `why` goes to
    /// the agent, the log and the ledger.
    fn said(&self, why: String) -> String {
        match &self.target {
            Target::Url { url, .. } => tally_record::url::scrubbed(status_only(&why), url),
            Target::Command(_) => why,
        }
    }

    /// Start a stdio server and run MCP's initialize exchange with it; a server that
    /// does not finish it within [`CONNECT_TIMEOUT`] is killed.
    async fn start(&self, command: &[String], generation: u64) -> Result<Client, String> {
        let (program, args) = command.split_first().ok_or("no command")?;
        let mut c = command_of(program, args, &self.hidden_env);
        // The server's stderr is the daemon's (a pipe no one reads would fill). Its own
        // process group: what it starts is killed with it.
        c.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = c
            .spawn()
            .map_err(|e| format!("cannot start `{program}`: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(format!("`{program}` was started without its pipes"));
        };
        *self.process.lock().unwrap_or_else(|p| p.into_inner()) = Some((
            generation,
            Arc::new(tokio::sync::Mutex::new(Group::new(child))),
        ));
        match tokio::time::timeout(CONNECT_TIMEOUT, ().serve((stdout, stdin))).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => {
                self.kill(Some(generation)).await;
                Err(e.to_string())
            }
            Err(_) => {
                self.kill(Some(generation)).await;
                Err("it did not finish initializing in time".to_owned())
            }
        }
    }

    /// Kill the stdio server's process group, if it has one (of generation `only`, if
    /// given), and reap its process.
    async fn kill(&self, only: Option<u64>) {
        let process = {
            let mut current = self.process.lock().unwrap_or_else(|p| p.into_inner());
            match (&*current, only) {
                (Some((generation, _)), Some(only)) if *generation != only => None,
                _ => current.take(),
            }
        };
        if let Some((_, p)) = process {
            let mut child = p.lock().await;
            if let Err(e) = child.kill().await {
                crate::log(&format!(
                    "gateway: server {}: cannot kill it: {e}",
                    self.name
                ));
            }
        }
    }

    /// The gateway stops: the server let go ([`Backend::stop`]) and never started or
    /// reached again (a call in flight that reaches for it then is not sent).
    pub(super) async fn shut(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.stop().await;
    }

    /// Let the server go: its client dropped and a stdio server's process killed and
    /// reaped. The next use starts or reaches it again (unless the gateway stopped).
    pub(super) async fn stop(&self) {
        // The process first: an initialize in progress (holding the client's lock) then
        // fails at once instead of at its time bound.
        self.kill(None).await;
        let client = self.client.lock().await.take();
        drop(client);
    }

    /// [`Backend::stop`] for generation `generation` only: a later one is left serving.
    async fn stop_generation(&self, generation: u64) {
        self.kill(Some(generation)).await;
        let mut slot = self.client.lock().await;
        if slot.as_ref().is_some_and(|(g, _)| *g == generation) {
            *slot = None;
        }
    }

    /// Forget the client of `generation` after its transport failed: the next use
    /// connects again (a client connected since is kept).
    async fn drop_client(&self, generation: u64) {
        let mut slot = self.client.lock().await;
        if slot.as_ref().is_some_and(|(g, _)| *g == generation) {
            *slot = None;
        }
    }

    /// Its tools, each renamed `NAME__tool`; their effects learned on the way. A server
    /// that does not answer within [`LIST_TIMEOUT`] is an error.
    pub(super) async fn tools(&self) -> Result<Vec<Tool>, String> {
        let on = std::sync::OnceLock::new();
        match tokio::time::timeout(LIST_TIMEOUT, self.list(&on)).await {
            Ok(listed) => listed,
            Err(_) => {
                // Hung (or still initializing): a stdio server is killed, not left; the
                // generation it listed on only (or, not connected yet, the one being
                // started), never one started since.
                let generation = match on.get() {
                    Some(g) => *g,
                    None => self.generation.load(Ordering::Relaxed),
                };
                self.stop_generation(generation).await;
                Err(format!(
                    "it did not list its tools within {}",
                    tally_record::words::duration(LIST_TIMEOUT.as_millis() as u64)
                ))
            }
        }
    }

    /// The listing, the generation it is made on put in `on`.
    async fn list(&self, on: &std::sync::OnceLock<u64>) -> Result<Vec<Tool>, String> {
        let (generation, client) = self.client().await?;
        let _ = on.set(generation);
        let tools = match client.peer().list_all_tools().await {
            Ok(t) => t,
            Err(e) => {
                self.drop_client(generation).await;
                return Err(self.said(e.to_string()));
            }
        };
        let mut effects = self.effects.lock().unwrap_or_else(|p| p.into_inner());
        effects.clear();
        Ok(tools
            .into_iter()
            .map(|mut tool| {
                effects.insert(
                    tool.name.to_string(),
                    crate::map::effect_of(tool.annotations.as_ref()),
                );
                tool.name = format!("{}{SEPARATOR}{}", self.name, tool.name).into();
                tool
            })
            .collect())
    }

    /// The effect a call of `tool` is checked under (its annotations), or why it is not
    /// called: a tool the server's listing does not have. An unknown name lists the
    /// server's tools again at most once per [`RELIST_INTERVAL`].
    pub(super) async fn effect(&self, tool: &str) -> Result<Effect, Unlisted> {
        if let Some(e) = self.known(tool) {
            return Ok(e);
        }
        let due = {
            let mut at = self.relisted.lock().unwrap_or_else(|p| p.into_inner());
            let now = tokio::time::Instant::now();
            let due = at.is_none_or(|t| now.duration_since(t) >= RELIST_INTERVAL);
            if due {
                *at = Some(now);
            }
            due
        };
        if due {
            if let Err(e) = self.tools().await {
                return Err(Unlisted::NoListing(e));
            }
        }
        self.known(tool).ok_or(Unlisted::Unknown)
    }

    fn known(&self, tool: &str) -> Option<Effect> {
        self.effects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(tool)
            .copied()
    }

    /// Call `tool` with `arguments`, waiting at most `timeout`.
    pub(super) async fn call(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
        timeout: Duration,
    ) -> Called {
        let (generation, client) = match self.client().await {
            Ok(c) => c,
            Err(e) => return Called::NotSent(e),
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        match tokio::time::timeout(timeout, client.peer().call_tool(params)).await {
            Err(_) => {
                // A server that did not answer in time may never answer: a stdio one is
                // killed (its other calls in flight end as lost), the next call starts it.
                if matches!(self.target, Target::Command(_)) {
                    drop(client);
                    self.stop_generation(generation).await;
                }
                Called::Timeout
            }
            Ok(Ok(result)) => Called::Result(result),
            Ok(Err(ServiceError::McpError(e))) => Called::Error(e),
            Ok(Err(e)) => {
                self.drop_client(generation).await;
                Called::Lost(self.said(e.to_string()))
            }
        }
    }
}

/// Reach a remote server and run MCP's initialize exchange with it.
async fn connect_url(
    url: &str,
    credential: Option<&(String, super::Secret)>,
    client: &RemoteClient,
) -> Result<Client, String> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    if let Some((name, secret)) = credential {
        let name = hyper::header::HeaderName::try_from(name.as_str())
            .map_err(|e| format!("header {name}: {e}"))?;
        let mut value = hyper::header::HeaderValue::try_from(secret.0.as_str())
            .map_err(|_| format!("the credential for header {name} is not a header value"))?;
        value.set_sensitive(true);
        config.custom_headers.insert(name, value);
    }
    let transport =
        StreamableHttpClientTransport::with_client(super::keeps::Keeps(client.0.clone()), config);
    ().serve(transport).await.map_err(|e| unreached(&e))
}

/// Why a remote server could not be reached. rmcp's words chain no cause past the HTTP
/// client's error, so a refused certificate would read as "error sending request": that
/// error (reqwest's) is said with its causes instead (`invalid peer certificate:
/// UnknownIssuer`).
fn unreached(e: &rmcp::service::ClientInitializeError) -> String {
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    if let rmcp::service::ClientInitializeError::TransportError { error, .. } = e {
        if let Some(StreamableHttpError::Client(client)) = error
            .error
            .downcast_ref::<StreamableHttpError<reqwest::Error>>()
        {
            return describe(client);
        }
    }
    e.to_string()
}

/// What a remote server's client said, up to the status of an HTTP error it quotes
/// (rmcp says `HTTP 404 Not Found: BODY`, the reason the canonical one of the code): the
/// body is the server's, which may echo its URL's token in any spelling, and goes no
/// further than the client.
fn status_only(why: &str) -> &str {
    let mut from = 0;
    while let Some(at) = why[from..].find("HTTP ").map(|i| from + i) {
        let status = &why[at + 5..];
        let reason = status.get(3..).unwrap_or_default();
        let reason_len = reason
            .find(|c: char| !(c.is_ascii_alphabetic() || matches!(c, ' ' | '-' | '\'')))
            .unwrap_or(reason.len());
        if status
            .as_bytes()
            .iter()
            .take(3)
            .filter(|b| b.is_ascii_digit())
            .count()
            == 3
            && reason[reason_len..].starts_with(": ")
        {
            return &why[..at + 8 + reason_len];
        }
        from = at + 5;
    }
    why
}

/// The HTTP client of a remote server, built once when the gateway starts (a
/// configuration the HTTP client refuses stops the start, not a first call) and cloned
/// for each connection.
#[derive(Clone, Debug)]
pub struct RemoteClient(reqwest::Client);

impl RemoteClient {
    /// The client of a remote server reached with `tls`: the TLS configuration every
    /// HTTPS client of tally uses (tally-proxy's `tls::client_config`: the Mozilla roots
    /// and the server's `ca_file`).
    pub fn new(tls: rustls::ClientConfig) -> Result<RemoteClient, super::NoClient> {
        http_client(tls)
            .map(RemoteClient)
            .map_err(|e| super::NoClient::Build { why: describe(&e) })
    }
}

/// Where `localhost` is ([`tally_record::url::LOCALHOST`], each tried): the policy
/// takes plain `http://` to it as loopback by its name, so it is never asked of the
/// resolver (the port is the URL's).
fn localhost() -> [std::net::SocketAddr; 2] {
    tally_record::url::LOCALHOST.map(|ip| std::net::SocketAddr::new(ip, 0))
}

/// The HTTP client of a remote server: reqwest over `tls` (an `https://` URL's only
/// trust), speaking to the URL's host only (no system proxy: the credential goes to the
/// server directly; `localhost` is [`localhost`]), its connections kept idle for the
/// next call (reqwest sets `TCP_NODELAY`, so a reused one does not wait on a delayed
/// ACK; [`super::keeps::Keeps`] reads each answer to its end so it can be reused), and,
/// as rmcp's own client does, only a same-origin 307 or 308 followed (a redirect
/// elsewhere would carry the credential and the session there; 301 to 303 would turn a
/// POST into a GET).
fn http_client(tls: rustls::ClientConfig) -> Result<reqwest::Client, reqwest::Error> {
    const MAX_REDIRECTS: usize = 10;
    let redirects = reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
        );
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if !keeps_body || !same_origin {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    });
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .no_proxy()
        .resolve_to_addrs("localhost", &localhost())
        .redirect(redirects)
        .build()
}

/// An error and its sources, one after the other (a TLS refusal is a source's).
fn describe(e: &dyn std::error::Error) -> String {
    let mut why = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !why.contains(&next) {
            why = format!("{why}: {next}");
        }
        source = s.source();
    }
    why
}

/// The command of a stdio server: `tally serve`'s environment without `hidden_env`.
fn command_of(program: &str, args: &[String], hidden_env: &[String]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(program);
    c.args(args);
    for name in hidden_env {
        c.env_remove(name);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_servers_error_body_is_dropped_its_status_kept() {
        assert_eq!(
            super::status_only("unexpected server response: HTTP 404: no token tok-1 here"),
            "unexpected server response: HTTP 404"
        );
        assert_eq!(
            super::status_only("HTTP 403: {\"path\":\"\\/t\\/tok\"}"),
            "HTTP 403"
        );
        assert_eq!(super::status_only("HTTP 503"), "HTTP 503");
        assert_eq!(
            super::status_only("response: HTTP 404 Not Found: no such token: tok-1, when sent"),
            "response: HTTP 404 Not Found"
        );
        assert_eq!(
            super::status_only("HTTP 418 I'm a teapot: tok-1"),
            "HTTP 418 I'm a teapot"
        );
        assert_eq!(
            super::status_only("connection refused (HTTP server down)"),
            "connection refused (HTTP server down)"
        );
    }

    #[test]
    fn a_stdio_server_is_started_without_the_credentials() {
        let hidden = ["TALLY_TEST_SECRET_A".to_owned(), "PATH".to_owned()];
        let c = command_of("true", &[], &hidden);
        let envs: Vec<_> = c.as_std().get_envs().collect();
        for name in &hidden {
            assert!(
                envs.contains(&(std::ffi::OsStr::new(name), None)),
                "{name} is not removed: {envs:?}"
            );
        }
    }

    /// A server that never answers (`sleep` speaks no MCP): its listing ends at the time
    /// bound, its process killed and reaped, its tools are not called, and a second
    /// unknown name does not list again.
    #[tokio::test]
    async fn a_hung_server_costs_one_bounded_listing_and_its_tools_are_not_called() {
        let dir = std::env::temp_dir().join(format!("tally-hung-{}", std::process::id()));
        let script = format!("echo $$ > {}; exec sleep 30", dir.display());
        let server = Server {
            name: "hung".to_owned(),
            target: Target::Command(vec!["sh".to_owned(), "-c".to_owned(), script]),
        };
        let backend = Backend::new(server, Arc::from(Vec::new()));
        let start = std::time::Instant::now();
        assert!(matches!(
            backend.effect("any").await,
            Err(Unlisted::NoListing(_))
        ));
        let first = start.elapsed();
        assert!(
            first >= LIST_TIMEOUT && first < LIST_TIMEOUT * 2,
            "{first:?}"
        );
        let pid = std::fs::read_to_string(&dir).expect("the server wrote its pid");
        let _ = std::fs::remove_file(&dir);
        assert!(
            !std::path::Path::new(&format!("/proc/{}", pid.trim())).exists(),
            "the hung server {pid} was not killed and reaped"
        );
        let again = std::time::Instant::now();
        assert!(matches!(
            backend.effect("other").await,
            Err(Unlisted::Unknown)
        ));
        assert!(again.elapsed() < Duration::from_secs(1), "it listed again");
    }

    fn pid_of(backend: &Backend) -> u32 {
        let current = backend.process.lock().expect("lock");
        let (_, p) = current.as_ref().expect("a process");
        let pid = p
            .try_lock()
            .expect("not locked")
            .child
            .id()
            .expect("running");
        pid
    }

    /// The test suite's Python MCP server, as a stdio backend.
    fn python_server() -> Backend {
        let server = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/server.py");
        Backend::new(
            Server {
                name: "py".to_owned(),
                target: Target::Command(vec!["python3".to_owned(), server.to_owned()]),
            },
            Arc::from(Vec::new()),
        )
    }

    /// A late timeout of generation 1 (its server already killed, a new one started for
    /// the next call) leaves generation 2 serving.
    #[tokio::test]
    async fn a_timeout_kills_its_own_generation_only() {
        let backend = python_server();
        let (first, _) = backend.client().await.expect("generation 1");
        let one = pid_of(&backend);
        backend.stop_generation(first).await;
        assert!(!std::path::Path::new(&format!("/proc/{one}")).exists());
        let (second, _) = backend.client().await.expect("generation 2");
        assert_ne!(first, second);
        let two = pid_of(&backend);
        backend.stop_generation(first).await;
        assert!(
            std::path::Path::new(&format!("/proc/{two}")).exists(),
            "generation 2 killed"
        );
        assert_eq!(backend.client().await.expect("still").0, second);
        backend.stop().await;
        assert!(!std::path::Path::new(&format!("/proc/{two}")).exists());
    }

    /// After the gateway's stop a server is not started again: a handler still running
    /// (in its gate check, say) cannot leave a process behind.
    #[tokio::test]
    async fn a_server_is_not_started_again_after_the_gateways_stop() {
        let backend = python_server();
        backend.client().await.expect("started");
        let pid = pid_of(&backend);
        backend.shut().await;
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
        let Err(again) = backend.client().await else {
            panic!("a server started after the gateway's stop");
        };
        assert!(again.contains("stopping"), "{again}");
        assert!(
            backend.process.lock().expect("lock").is_none(),
            "a process started"
        );
        // A stop that is not the gateway's (a timeout's) lets the next use start it.
        let other = python_server();
        other.stop().await;
        other.client().await.expect("started after a stop");
        other.shut().await;
    }
}
