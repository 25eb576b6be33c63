//! The proxy's one connection to the gate. Requests go through one queue, in order: an
//! outcome reported after a call's answer is recorded before the next call is checked.

use std::path::PathBuf;

use tally_daemon::client::{Client, ClientError, Method};
use tally_daemon::wire::ErrorReply;
use tally_gate::{CheckAnswer, CheckRequest, OutcomeRequest, StartRequest};
use tokio::sync::{mpsc, oneshot};

/// Why the gate could not answer a check: the call is then not made (fail closed).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum GateFailure {
    /// No daemon answers on the socket, or the connection broke.
    #[error("cannot reach the gate at {socket}: {why}")]
    Unreachable {
        /// The agent socket.
        socket: String,
        /// What failed.
        why: String,
    },
    /// The gate refused the request with a typed error.
    #[error("the gate refused the request ({status} {code}): {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The error code (`run_not_found`, `not_owner`, `gate_unavailable`, ...).
        code: String,
        /// The gate's message.
        message: String,
    },
}

enum Job {
    Check(
        Box<CheckRequest>,
        oneshot::Sender<Result<CheckAnswer, GateFailure>>,
    ),
    Outcome(OutcomeRequest),
    Flush(oneshot::Sender<()>),
}

/// A handle on the gate worker.
#[derive(Clone)]
pub struct Gate {
    jobs: mpsc::UnboundedSender<Job>,
}

struct Worker {
    socket: PathBuf,
    start: StartRequest,
    started: bool,
    client: Option<Client>,
}

impl Gate {
    /// Start the worker; it starts (or joins) the run before the first check.
    pub fn spawn(socket: PathBuf, start: StartRequest) -> Gate {
        let (jobs, mut rx) = mpsc::unbounded_channel::<Job>();
        let mut worker = Worker {
            socket,
            start,
            started: false,
            client: None,
        };
        tokio::spawn(async move {
            // Start the run at once, so the ledger shows it even before any call.
            if let Err(e) = worker.ensure_started().await {
                crate::log(&format!("the run is not started yet: {e}"));
            }
            while let Some(job) = rx.recv().await {
                match job {
                    Job::Check(request, reply) => {
                        let answer = worker.check(&request).await;
                        let _ = reply.send(answer);
                    }
                    Job::Outcome(request) => {
                        if let Err(e) = worker
                            .post::<serde_json::Value>("/v1/outcome", &request)
                            .await
                        {
                            crate::log(&format!(
                                "the outcome of attempt {} ({:?}) was not recorded: {e}",
                                request.attempt, request.status
                            ));
                        }
                    }
                    Job::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
        });
        Gate { jobs }
    }

    /// Ask the gate about one call.
    pub async fn check(&self, request: CheckRequest) -> Result<CheckAnswer, GateFailure> {
        let (tx, rx) = oneshot::channel();
        let gone = || GateFailure::Unreachable {
            socket: String::new(),
            why: "the proxy's gate worker stopped".into(),
        };
        self.jobs
            .send(Job::Check(Box::new(request), tx))
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Report an allowed call's outcome (queued: it is sent before any later check).
    pub fn outcome(&self, request: OutcomeRequest) {
        let _ = self.jobs.send(Job::Outcome(request));
    }

    /// Wait until everything queued so far has been sent.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.jobs.send(Job::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

impl Worker {
    fn unreachable(&self, why: impl ToString) -> GateFailure {
        GateFailure::Unreachable {
            socket: self.socket.display().to_string(),
            why: why.to_string(),
        }
    }

    async fn ensure_started(&mut self) -> Result<(), GateFailure> {
        if self.started {
            return Ok(());
        }
        let start = self.start.clone();
        match self.post::<serde_json::Value>("/v1/runs", &start).await {
            Ok(_) => {}
            // Started before (this proxy restarted, or another worker of the run): join it.
            Err(GateFailure::Refused { code, .. }) if code == "run_exists" => {}
            Err(e) => return Err(e),
        }
        self.started = true;
        Ok(())
    }

    async fn check(&mut self, request: &CheckRequest) -> Result<CheckAnswer, GateFailure> {
        self.ensure_started().await?;
        self.post("/v1/check", request).await
    }

    /// POST a JSON body and read a JSON answer, or the gate's typed error.
    async fn post<T: serde::de::DeserializeOwned>(
        &mut self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<T, GateFailure> {
        let body = serde_json::to_vec(body).map_err(|e| self.unreachable(e))?;
        if self.client.is_none() {
            let client = Client::unix(&self.socket)
                .await
                .map_err(|e| self.unreachable(e))?;
            self.client = Some(client);
        }
        let client = self.client.as_mut().expect("connected above");
        let reply = match client
            .request(Method::POST, path, Some("application/json"), body)
            .await
        {
            Ok(reply) => reply,
            Err(e) => {
                // A broken connection: the next request reconnects. This one fails
                // closed: it is not retried, since the gate may have recorded it.
                self.client = None;
                return Err(self.unreachable(match e {
                    ClientError::Http(e) => format!("the connection failed: {e}"),
                    e => e.to_string(),
                }));
            }
        };
        let status = reply.status.as_u16();
        if reply.status.is_success() {
            return serde_json::from_slice(&reply.body).map_err(|e| GateFailure::Refused {
                status,
                code: "unexpected_reply".into(),
                message: format!("the gate's answer is not what its API promises: {e}"),
            });
        }
        Err(match serde_json::from_slice::<ErrorReply>(&reply.body) {
            Ok(r) => GateFailure::Refused {
                status,
                code: r.error.code,
                message: r.error.message,
            },
            Err(_) => GateFailure::Refused {
                status,
                code: "unexpected_reply".into(),
                message: String::from_utf8_lossy(&reply.body).into_owned(),
            },
        })
    }
}
