//! The proxy's one connection to the gate. Requests go through one queue, in order: an
//! outcome reported after a call's answer is recorded before the next call is checked,
//! and the run's stop after every outcome.
//!
//! The run: `--run` is started (then this proxy owns it and stops it when the session
//! ends), or joined if it is open. If it has stopped `completed` (an earlier session of
//! the same configuration ended), the session continues it in a run of its own,
//! `RUN.2`, `RUN.3`, ..., each started with `continues` naming the one before, so that
//! what that run must not repeat carries over. A run stopped for any other reason (an
//! operator's kill, an outcome a human must check) is not continued: every call is
//! refused until a human starts `tally mcp` with a new `--run`.

use std::path::PathBuf;
use tally_api::ErrorCode;

use tally_api::{CheckAnswer, CheckRequest, GateClient, OutcomeRequest, RunState, StartRequest};
use tally_record::Reason;
use tokio::sync::{mpsc, oneshot};

/// A client's W3C trace context, parsed strictly (`tally_record::trace`).
pub type Trace = (tally_record::trace::Traceparent, Option<String>);

/// Why the gate could not answer a check: the call is then not made (fail closed).
pub use tally_api::GateError as GateFailure;

enum Job {
    Check(
        Box<CheckRequest>,
        Option<Trace>,
        oneshot::Sender<Result<CheckAnswer, GateFailure>>,
    ),
    Outcome(OutcomeRequest),
    Stop(Reason, oneshot::Sender<Option<Result<String, GateFailure>>>),
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
    /// The run checks and outcomes go to: `--run`, or this session's continuation of it.
    run: String,
    started: bool,
    /// Whether this proxy started the run (then it stops it at the end).
    owned: bool,
    /// Join the run only (the HTTP gateway's run token names an open run): never start
    /// or continue one.
    join_only: bool,
    gate: GateClient,
}

/// Where a run name stands with the gate.
enum Standing {
    Missing,
    Open,
    Stopped(Option<Reason>),
}

/// The `n`th run of a chain (`RUN`, `RUN.2`, `RUN.3`, ...).
fn chained(base: &str, n: u64) -> String {
    if n <= 1 {
        base.to_owned()
    } else {
        format!("{base}.{n}")
    }
}

impl Gate {
    /// Start the worker; it starts (or joins) the run before the first check.
    pub fn spawn(socket: PathBuf, start: StartRequest) -> Gate {
        Gate::spawn_worker(GateClient::new(&socket), start, false, false)
    }

    /// Start a worker over `gate` that only joins the run `start` names, if it is open:
    /// every check is refused (`run_stopped`, `run_not_found`) otherwise. It stops the
    /// run at [`Gate::stop`] only if `owned` (its caller started it).
    pub fn join(gate: GateClient, start: StartRequest, owned: bool) -> Gate {
        Gate::spawn_worker(gate, start, true, owned)
    }

    fn spawn_worker(gate: GateClient, start: StartRequest, join_only: bool, owned: bool) -> Gate {
        let (jobs, mut rx) = mpsc::unbounded_channel::<Job>();
        let mut worker = Worker {
            socket: gate.socket().to_path_buf(),
            gate,
            run: start.run.clone(),
            start,
            started: false,
            owned,
            join_only,
        };
        tokio::spawn(async move {
            // Start the run at once, so the ledger shows it even before any call.
            if let Err(e) = worker.ensure_started().await {
                crate::log(&format!("the run is not started yet: {e}"));
            }
            while let Some(job) = rx.recv().await {
                match job {
                    Job::Check(request, trace, reply) => {
                        let answer = worker.check(&request, trace.as_ref()).await;
                        let _ = reply.send(answer);
                    }
                    Job::Outcome(mut request) => {
                        request.run = worker.run.clone();
                        if let Err(e) = worker.gate.outcome(&request).await {
                            crate::log(&format!(
                                "the outcome of attempt {} ({:?}) was not recorded: {e}",
                                request.attempt, request.status
                            ));
                        }
                    }
                    Job::Stop(reason, done) => {
                        let _ = done.send(worker.stop(reason).await);
                    }
                    Job::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
        });
        Gate { jobs }
    }

    /// Ask the gate about one call, in the client's trace if it sent one (the check's
    /// span is then its child, and the decision records its trace id).
    pub async fn check(
        &self,
        request: CheckRequest,
        trace: Option<Trace>,
    ) -> Result<CheckAnswer, GateFailure> {
        let (tx, rx) = oneshot::channel();
        let gone = || GateFailure::Unreachable {
            socket: String::new(),
            why: "the proxy's gate worker stopped".into(),
        };
        self.jobs
            .send(Job::Check(Box::new(request), trace, tx))
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Report an allowed call's outcome (queued: it is sent before any later check).
    pub fn outcome(&self, request: OutcomeRequest) {
        let _ = self.jobs.send(Job::Outcome(request));
    }

    /// Stop the run, if this proxy started it (after everything queued before): the run
    /// stopped, or why not; `None` if the proxy did not start it.
    pub async fn stop(&self, reason: Reason) -> Option<Result<String, GateFailure>> {
        let (tx, rx) = oneshot::channel();
        self.jobs.send(Job::Stop(reason, tx)).ok()?;
        rx.await.ok().flatten()
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

    fn refused(&self, code: ErrorCode, message: String) -> GateFailure {
        GateFailure::Refused {
            status: 409,
            code,
            message,
            field: None,
            retry_after_ms: None,
        }
    }

    async fn ensure_started(&mut self) -> Result<(), GateFailure> {
        if self.started {
            return Ok(());
        }
        let base = self.start.run.clone();
        if self.join_only {
            return match self.standing(&base).await? {
                Standing::Open => {
                    self.started = true;
                    Ok(())
                }
                Standing::Missing => Err(self.refused(
                    ErrorCode::RunNotFound,
                    format!("run {base} is not known to the gate"),
                )),
                Standing::Stopped(reason) => Err(self.refused(
                    ErrorCode::RunStopped,
                    format!(
                        "run {base} has stopped ({}): a new task is a new run, with its own token",
                        reason.map_or("stopped", Reason::as_str)
                    ),
                )),
            };
        }
        if self.start_run(&base, None).await? {
            self.run = base;
            self.owned = true;
            self.started = true;
            return Ok(());
        }
        // A few tries: another session of the same run may take the next name first.
        for _ in 0..3 {
            let (last, next) = self.chain_end(&base).await?;
            let name = chained(&base, last);
            match self.standing(&name).await? {
                Standing::Open | Standing::Missing => {
                    // Started by someone else, or by an earlier session still going: join it.
                    self.run = name;
                    self.owned = false;
                    self.started = true;
                    return Ok(());
                }
                Standing::Stopped(Some(Reason::Completed)) => {
                    let new = chained(&base, next);
                    if self.start_run(&new, Some(&name)).await? {
                        crate::log(&format!(
                            "run {name} has stopped (completed): this session continues it as run {new}"
                        ));
                        self.run = new;
                        self.owned = true;
                        self.started = true;
                        return Ok(());
                    }
                }
                Standing::Stopped(reason) => {
                    let reason = reason.map_or("stopped", Reason::as_str);
                    return Err(GateFailure::Refused {
                        status: 409,
                        code: ErrorCode::RunStopped,
                        message: format!(
                            "run {name} has stopped ({reason}); tally mcp continues only a run that stopped completed, so a human must look at it (tally handoff) and start tally mcp with a new --run"
                        ),
                        field: None,
                        retry_after_ms: None,
                    });
                }
            }
        }
        Err(GateFailure::Refused {
            status: 409,
            code: ErrorCode::RunExists,
            message: format!(
                "could not start a run continuing {base}: other sessions keep taking the next name"
            ),
            field: None,
            retry_after_ms: None,
        })
    }

    /// Start a run of this name: true if started, false if the name is taken.
    async fn start_run(&mut self, run: &str, continues: Option<&str>) -> Result<bool, GateFailure> {
        let mut start = self.start.clone();
        start.run = run.to_owned();
        start.continues = continues.map(str::to_owned);
        match self.gate.start(&start).await {
            Ok(_) => Ok(true),
            Err(GateFailure::Refused {
                code: ErrorCode::RunExists,
                ..
            }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The last run of `base`'s chain that exists and the first number free after it:
    /// a galloping search (the chain's names are taken in order), so a thousand earlier
    /// sessions cost about twenty look-ups.
    async fn chain_end(&mut self, base: &str) -> Result<(u64, u64), GateFailure> {
        let mut last = 1;
        let mut free = 2;
        while !matches!(
            self.standing(&chained(base, free)).await?,
            Standing::Missing
        ) {
            last = free;
            free = free
                .checked_mul(2)
                .ok_or_else(|| self.unreachable("the run chain is too long"))?;
        }
        while free - last > 1 {
            let mid = last + (free - last) / 2;
            if matches!(self.standing(&chained(base, mid)).await?, Standing::Missing) {
                free = mid;
            } else {
                last = mid;
            }
        }
        Ok((last, free))
    }

    /// `GET /v1/runs/{run}`: whether the run is missing, open or stopped.
    async fn standing(&mut self, run: &str) -> Result<Standing, GateFailure> {
        match self.gate.run(run).await {
            Ok(v) if v.state == RunState::Stopped => Ok(Standing::Stopped(v.stop_reason)),
            Ok(_) => Ok(Standing::Open),
            Err(GateFailure::Refused {
                code: ErrorCode::RunNotFound,
                ..
            }) => Ok(Standing::Missing),
            // Someone else's: taken, and not one this session may join or continue.
            Err(GateFailure::Refused {
                code: ErrorCode::NotOwner,
                ..
            }) => Ok(Standing::Stopped(None)),
            Err(e) => Err(e),
        }
    }

    async fn check(
        &mut self,
        request: &CheckRequest,
        trace: Option<&Trace>,
    ) -> Result<CheckAnswer, GateFailure> {
        self.ensure_started().await?;
        let mut request = request.clone();
        request.run = self.run.clone();
        self.gate.check_traced(&request, trace).await
    }

    /// Stop the run if this proxy started it: the run's name once stopped.
    async fn stop(&mut self, reason: Reason) -> Option<Result<String, GateFailure>> {
        if !self.owned {
            return None;
        }
        Some(
            self.gate
                .stop(&self.run, reason, self.start.worker.as_deref())
                .await
                .map(|_| self.run.clone()),
        )
    }
}
