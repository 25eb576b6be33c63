//! [`GateClient`]: the one typed client of the gate, used by everything in this
//! repository that talks to a daemon (the Claude Code hook, the MCP proxy, the operator
//! commands, the demo).
//!
//! * Requests and answers are the gate's own types ([`CheckRequest`], [`CheckAnswer`],
//!   ...), serialized once here.
//! * A refusal is a typed [`GateError::Refused`] carrying the daemon's code, message,
//!   field and `Retry-After`; a daemon that cannot be reached is
//!   [`GateError::Unreachable`]; an answer that is not what the API promises is
//!   [`GateError::Unexpected`]. Nothing is passed through untyped.
//! * `429` and `503` refusals that say `Retry-After` recorded nothing (docs/DAEMON.md):
//!   they are sent again after that wait, within the client's [`Retry`] allowance, and
//!   then returned as refused. Nothing else is ever sent twice, except a request the
//!   daemon never read (it closed an idle keep-alive connection first).
//! * [`GateClient::check_or_start`] starts the run when the gate does not know it
//!   (`run_not_found`), then asks again.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper::Method;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tally_record::trace::Traceparent;
use tally_wire::{
    ApprovalRequest, CheckAnswer, CheckRequest, ErrorCode, ListedRun, Logged, OutcomeRequest,
    Reason, SettleRequest, Standing, StartRequest, Started, StopRequest,
};

use crate::client::{Client, ClientError, Reply};

/// Why the gate gave no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GateError {
    /// No daemon answers on the socket, or the connection broke mid-request (the
    /// request may or may not have been recorded: never retried).
    #[error("cannot reach the gate at {socket}: {why}")]
    Unreachable {
        /// The socket asked.
        socket: String,
        /// What failed.
        why: String,
    },
    /// The gate refused the request with a typed error (docs/DAEMON.md lists the codes).
    #[error("the gate refused the request ({status} {code}): {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The error code: `run_not_found`, `not_owner`, `gate_unavailable`, ...
        code: ErrorCode,
        /// The gate's message.
        message: String,
        /// The field at fault, for a request the gate could not read.
        field: Option<String>,
        /// How long the gate asked the caller to wait (its `Retry-After`), in ms.
        retry_after_ms: Option<u64>,
    },
    /// The answer is not what the gate's API promises.
    #[error("the gate's answer ({status}) is not what its API promises: {why}")]
    Unexpected {
        /// The HTTP status.
        status: u16,
        /// What was wrong with it.
        why: String,
    },
}

impl GateError {
    /// The refusal's code, if the gate refused.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            GateError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// How long a client waits, all told, on refusals that say `Retry-After` before it
/// gives up and returns the refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    /// Tries in all, the first included (1: never sent again).
    pub tries: u32,
    /// The longest total wait.
    pub max_wait: Duration,
}

impl Retry {
    /// Never send a request twice.
    pub const NEVER: Retry = Retry {
        tries: 1,
        max_wait: Duration::ZERO,
    };
}

impl Default for Retry {
    /// Three tries, at most five seconds of waiting in all.
    fn default() -> Retry {
        Retry {
            tries: 3,
            max_wait: Duration::from_secs(5),
        }
    }
}

/// What an operator does to a run (`POST /v1/runs/{run}/{what}`, operator socket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunAction {
    /// Refuse the run's checks until it is resumed (its children too).
    Pause,
    /// Undo a pause.
    Resume,
    /// Stop the run (`killed_by_operator`) and its children.
    Kill,
}

impl RunAction {
    /// The route's last segment.
    pub fn as_str(self) -> &'static str {
        match self {
            RunAction::Pause => "pause",
            RunAction::Resume => "resume",
            RunAction::Kill => "kill",
        }
    }
}

/// The answer to [`GateClient::act`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acted {
    /// Paused or resumed: where the run stands now.
    Standing(Box<Standing>),
    /// Killed: the stop's receipt.
    Stopped(Logged),
}

/// The answer to [`GateClient::check_or_start`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Checked {
    /// The gate's answer to the check.
    pub answer: CheckAnswer,
    /// Whether this client started the run to ask it (then it is this client's to stop).
    pub started: bool,
}

/// A run name as one URL path segment.
pub fn run_path(run: &str) -> String {
    format!("/v1/runs/{}", utf8_percent_encode(run, NON_ALPHANUMERIC))
}

/// One keep-alive connection to a daemon's socket (agent or operator), opened on first
/// use and again after it breaks. Requests run one at a time; open one per worker.
pub struct GateClient {
    socket: PathBuf,
    client: Option<Client>,
    retry: Retry,
    dialer: Option<Dialer>,
}

/// Opens an in-process connection to the daemon, which serves the other end itself:
/// what a client inside the daemon (its MCP gateway) asks through in place of a socket.
pub type Dialer = std::sync::Arc<
    dyn Fn() -> std::pin::Pin<
            Box<dyn std::future::Future<Output = std::io::Result<tokio::io::DuplexStream>> + Send>,
        > + Send
        + Sync,
>;

impl GateClient {
    /// A client of the daemon on `socket`; nothing is connected yet.
    pub fn new(socket: impl AsRef<Path>) -> GateClient {
        GateClient {
            socket: socket.as_ref().to_path_buf(),
            client: None,
            retry: Retry::default(),
            dialer: None,
        }
    }

    /// A client that connects through `dialer`; `name` stands for the socket in errors.
    pub fn dialed(name: impl AsRef<Path>, dialer: Dialer) -> GateClient {
        GateClient {
            dialer: Some(dialer),
            ..GateClient::new(name)
        }
    }

    /// The same, with another retry allowance.
    pub fn with_retry(mut self, retry: Retry) -> GateClient {
        self.retry = retry;
        self
    }

    /// The socket this client asks.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Connect now (else the first request does): a daemon that is not there is
    /// [`GateError::Unreachable`] here.
    pub async fn connect(&mut self) -> Result<(), GateError> {
        if self.client.is_none() {
            self.client = Some(self.dial().await?);
        }
        Ok(())
    }

    fn unreachable(&self, why: impl ToString) -> GateError {
        GateError::Unreachable {
            socket: self.socket.display().to_string(),
            why: why.to_string(),
        }
    }

    async fn dial(&self) -> Result<Client, GateError> {
        if let Some(dialer) = &self.dialer {
            let io = dialer().await.map_err(|e| self.unreachable(e))?;
            return Client::over(io).await.map_err(|e| self.unreachable(e));
        }
        Client::unix(&self.socket)
            .await
            .map_err(|e| self.unreachable(e))
    }

    /// `POST /v1/runs`: start a run.
    pub async fn start(&mut self, start: &StartRequest) -> Result<Started, GateError> {
        self.post("/v1/runs", start).await
    }

    /// `POST /v1/check`: ask about one call.
    pub async fn check(&mut self, check: &CheckRequest) -> Result<CheckAnswer, GateError> {
        self.post("/v1/check", check).await
    }

    /// `POST /v1/check` in the caller's trace: `traceparent` (and `tracestate`) headers
    /// naming it, so the check's span is its child and the decision records its trace
    /// id. Only a context already parsed strictly ([`tally_record::trace::incoming`]) is
    /// sent; a `tracestate` that is not a valid header value is left out.
    pub async fn check_traced(
        &mut self,
        check: &CheckRequest,
        trace: Option<&(Traceparent, Option<String>)>,
    ) -> Result<CheckAnswer, GateError> {
        let mut headers = Vec::new();
        if let Some((parent, state)) = trace {
            headers.push(("traceparent", parent.header()));
            if let Some(s) = state.as_deref().and_then(tally_record::trace::tracestate) {
                headers.push(("tracestate", s.to_owned()));
            }
        }
        let body = to_body(check)?;
        self.exchange(Method::POST, "/v1/check", Some(body), &headers)
            .await
    }

    /// Ask about one call; if the gate does not know the run (`run_not_found`), start
    /// it with `start` (its `run` set to the check's) and ask again. A run someone else
    /// started in between is joined. The answer, and whether this call started the run.
    pub async fn check_or_start(
        &mut self,
        check: &CheckRequest,
        start: &StartRequest,
    ) -> Result<Checked, GateError> {
        match self.check(check).await {
            Err(e) if e.code() == Some(ErrorCode::RunNotFound) => {
                let mut start = start.clone();
                start.run = check.run.clone();
                let started = match self.start(&start).await {
                    Ok(_) => true,
                    Err(e) if e.code() == Some(ErrorCode::RunExists) => false,
                    Err(e) => return Err(e),
                };
                let answer = self.check(check).await?;
                Ok(Checked { answer, started })
            }
            Ok(answer) => Ok(Checked {
                answer,
                started: false,
            }),
            Err(e) => Err(e),
        }
    }

    /// `POST /v1/outcome`: report an allowed call's outcome; its receipt.
    pub async fn outcome(&mut self, outcome: &OutcomeRequest) -> Result<Logged, GateError> {
        self.post("/v1/outcome", outcome).await
    }

    /// `POST /v1/runs/{run}/stop`: stop a run with `reason` (from `worker`, if named);
    /// the stop's receipt.
    pub async fn stop(
        &mut self,
        run: &str,
        reason: Reason,
        worker: Option<&str>,
    ) -> Result<Logged, GateError> {
        let path = format!("{}/stop", run_path(run));
        let body = StopRequest {
            reason: Some(reason),
            worker: worker.map(str::to_owned),
        };
        self.post(&path, &body).await
    }

    /// `GET /v1/runs/{run}`: where a run stands.
    pub async fn run(&mut self, run: &str) -> Result<Standing, GateError> {
        self.request(Method::GET, &run_path(run), None).await
    }

    /// `GET /v1/runs`: every run the caller may see, open runs first, then the nearest
    /// to a limit, then by name.
    pub async fn runs(&mut self) -> Result<Vec<ListedRun>, GateError> {
        self.request(Method::GET, "/v1/runs", None).await
    }

    /// `POST /v1/runs/{run}/pause|resume|kill` (operator socket): where the run stands
    /// after a pause or a resume, the stop's receipt after a kill.
    pub async fn act(&mut self, run: &str, action: RunAction) -> Result<Acted, GateError> {
        let path = format!("{}/{}", run_path(run), action.as_str());
        Ok(match action {
            RunAction::Pause | RunAction::Resume => {
                Acted::Standing(Box::new(self.request(Method::POST, &path, None).await?))
            }
            RunAction::Kill => Acted::Stopped(self.request(Method::POST, &path, None).await?),
        })
    }

    /// `POST /v1/runs/{run}/settle` (operator socket): settle what an attempt holds, from
    /// the upstream's own figure (0 releases it).
    pub async fn settle(&mut self, run: &str, req: &SettleRequest) -> Result<Logged, GateError> {
        let path = format!("{}/settle", run_path(run));
        self.post(&path, req).await
    }

    /// `POST /v1/approvals` (operator socket): record a signed approval (an
    /// [`tally_wire::Approval`], or its JSON); its receipt.
    pub async fn approve(&mut self, approval: &impl Serialize) -> Result<Logged, GateError> {
        self.post("/v1/approvals", approval).await
    }

    /// `POST /v1/approvals/denials` (operator socket): record a signed denial of an
    /// approval request (a [`tally_wire::Denial`], or its JSON); its receipt.
    pub async fn deny(&mut self, denial: &impl Serialize) -> Result<Logged, GateError> {
        self.post("/v1/approvals/denials", denial).await
    }

    /// `GET /v1/approvals` (operator socket): every approval request the gate holds,
    /// pending first, nearest deadline first (docs/APPROVALS.md).
    pub async fn approval_requests(&mut self) -> Result<Vec<ApprovalRequest>, GateError> {
        self.request(Method::GET, "/v1/approvals", None).await
    }

    /// `GET /v1/approvals/{id}` (operator socket): one approval request.
    pub async fn approval_request(&mut self, id: &str) -> Result<ApprovalRequest, GateError> {
        let path = format!(
            "/v1/approvals/{}",
            utf8_percent_encode(id, NON_ALPHANUMERIC)
        );
        self.request(Method::GET, &path, None).await
    }

    /// `POST /v1/approvals/continuations` (operator socket): record a signed continuation
    /// grant and start the new run it names; the new run, its budget and (with the proxy
    /// on) its token, given once.
    pub async fn continue_run(
        &mut self,
        grant: &impl Serialize,
    ) -> Result<tally_wire::Started, GateError> {
        self.post("/v1/approvals/continuations", grant).await
    }

    /// POST a JSON body; a JSON answer, or the gate's typed error.
    pub async fn post<T: DeserializeOwned>(
        &mut self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, GateError> {
        let body = to_body(body)?;
        self.request(Method::POST, path, Some(body)).await
    }

    /// One request (a JSON body, or none): a JSON answer, or the gate's typed error.
    pub async fn request<T: DeserializeOwned>(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, GateError> {
        self.exchange(method, path, body, &[]).await
    }

    /// [`GateClient::request`] with extra headers.
    async fn exchange<T: DeserializeOwned>(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&'static str, String)],
    ) -> Result<T, GateError> {
        let mut waited = Duration::ZERO;
        let mut tries = 1;
        loop {
            let reply = self
                .send(method.clone(), path, body.clone(), headers)
                .await?;
            match answer(reply) {
                Err(GateError::Refused {
                    status: 429 | 503,
                    retry_after_ms: Some(ms),
                    ..
                }) if tries < self.retry.tries
                    && waited + Duration::from_millis(ms) <= self.retry.max_wait =>
                {
                    // The gate recorded nothing and said when to ask again.
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    waited += Duration::from_millis(ms);
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    /// Send once (and once more on a fresh connection if the daemon had closed the idle
    /// one before reading the request).
    async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&'static str, String)],
    ) -> Result<Reply, GateError> {
        self.connect().await?;
        let (kind, body) = match body {
            Some(b) => (Some("application/json"), b),
            None => (None, Vec::new()),
        };
        let mut redialled = false;
        loop {
            let client = match self.client.as_mut() {
                Some(c) => c,
                None => return Err(self.unreachable("not connected")),
            };
            match client
                .request_with(method.clone(), path, kind, headers, body.clone())
                .await
            {
                Ok(reply) => return Ok(reply),
                // The daemon closed the connection while it was idle (it does after its
                // read timeout): the request was never sent, so one more try on a new
                // connection cannot record anything twice.
                Err(ClientError::Http(e)) if e.is_closed() && !redialled => {
                    redialled = true;
                    self.client = Some(self.dial().await?);
                }
                Err(e) => {
                    // Broken mid-request: the next request reconnects; this one fails
                    // closed, since the gate may have recorded it.
                    self.client = None;
                    return Err(self.unreachable(match e {
                        ClientError::Http(e) => format!("the connection failed: {e}"),
                        e => e.to_string(),
                    }));
                }
            }
        }
    }
}

/// A reply as a JSON answer, or the gate's typed error.
fn answer<T: DeserializeOwned>(reply: Reply) -> Result<T, GateError> {
    crate::client::json_of(&reply).map_err(|e| match e {
        ClientError::Refused { status, error } => GateError::Refused {
            status,
            code: error.code,
            message: error.message,
            field: error.field,
            retry_after_ms: reply.retry_after_secs.map(|s| s.saturating_mul(1000)),
        },
        ClientError::Unexpected { status, why } => GateError::Unexpected { status, why },
        e => GateError::Unexpected {
            status: reply.status.as_u16(),
            why: e.to_string(),
        },
    })
}

/// A request's JSON body.
fn to_body(body: &impl Serialize) -> Result<Vec<u8>, GateError> {
    serde_json::to_vec(body).map_err(|e| GateError::Unexpected {
        status: 0,
        why: format!("the request does not serialize: {e}"),
    })
}
