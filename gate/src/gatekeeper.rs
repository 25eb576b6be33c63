//! The gate as one object over any backend ([`Gatekeeper`]), and its blocking forms for an
//! in-process caller.

use tally_policy::Recorded;
use tally_wire::ApprovalRequest;

use crate::backend::StateBackend;
use crate::{
    Approval, Caller, CheckAnswer, CheckRequest, Denial, Done, Gate, GateError, Logged,
    OutcomeRequest, SettleRequest, Standing, StartRequest, Started, StopRequest,
};

impl<B: StateBackend> Gate<B> {
    /// Blocking forms, for an in-process gate.
    pub fn start_blocking(&self, caller: Caller, req: StartRequest) -> Result<Started, GateError> {
        blocking(|done| self.start(caller, req, done))
    }

    /// Blocking [`Gate::check`].
    pub fn check_blocking(
        &self,
        caller: Caller,
        req: CheckRequest,
    ) -> Result<CheckAnswer, GateError> {
        blocking(|done| self.check(caller, req, done))
    }

    /// Blocking [`Gate::outcome`].
    pub fn outcome_blocking(
        &self,
        caller: Caller,
        req: OutcomeRequest,
    ) -> Result<Logged, GateError> {
        blocking(|done| self.outcome(caller, req, done))
    }

    /// Blocking [`Gate::settle`].
    pub fn settle_blocking(
        &self,
        caller: Caller,
        run: &str,
        req: SettleRequest,
    ) -> Result<Logged, GateError> {
        blocking(|done| self.settle(caller, run, req, done))
    }

    /// Blocking [`Gate::stop`].
    pub fn stop_blocking(
        &self,
        caller: Caller,
        run: &str,
        req: StopRequest,
    ) -> Result<Logged, GateError> {
        blocking(|done| self.stop(caller, run, req, done))
    }

    /// Blocking [`Gate::pause`].
    pub fn pause_blocking(
        &self,
        caller: Caller,
        run: &str,
        paused: bool,
    ) -> Result<Standing, GateError> {
        blocking(|done| self.pause(caller, run, paused, done))
    }

    /// Blocking [`Gate::approve`].
    pub fn approve_blocking(&self, caller: Caller, a: Approval) -> Result<Logged, GateError> {
        blocking(|done| self.approve(caller, a, done))
    }
}

fn blocking<T: Send + 'static>(f: impl FnOnce(Done<T>)) -> Result<T, GateError> {
    let (tx, rx) = std::sync::mpsc::channel();
    f(Box::new(move |r| {
        let _ = tx.send(r);
    }));
    rx.recv()
        .unwrap_or_else(|_| Err(GateError::Unavailable("the gate dropped a request".into())))
}

/// A gate over any backend, as one object: what the daemon holds, so that one binary
/// serves the embedded store or a networked one. Each method is [`Gate`]'s own. A
/// networked backend blocks its caller for a round trip, so the daemon calls every one
/// of them from its decision thread, never from an async worker.
pub trait Gatekeeper: Send + Sync {
    /// [`Gate::start`].
    fn start(&self, caller: Caller, req: StartRequest, done: Done<Started>);
    /// [`Gate::check`].
    fn check(&self, caller: Caller, req: CheckRequest, done: Done<CheckAnswer>);
    /// [`Gate::outcome`].
    fn outcome(&self, caller: Caller, req: OutcomeRequest, done: Done<Logged>);
    /// [`Gate::outcome_sequenced`].
    fn outcome_sequenced(
        &self,
        caller: Caller,
        req: OutcomeRequest,
        sequenced: Done<()>,
        durable: Done<Logged>,
    );
    /// [`Gate::settle`].
    fn settle(&self, caller: Caller, run: &str, req: SettleRequest, done: Done<Logged>);
    /// [`Gate::stop`].
    fn stop(&self, caller: Caller, run: &str, req: StopRequest, done: Done<Logged>);
    /// [`Gate::pause`].
    fn pause(&self, caller: Caller, run: &str, paused: bool, done: Done<Standing>);
    /// [`Gate::approve`].
    fn approve(&self, caller: Caller, a: Approval, done: Done<Logged>);
    /// [`Gate::deny`].
    fn deny(&self, caller: Caller, d: Denial, done: Done<Logged>);
    /// [`Gate::continue_run`].
    fn continue_run(&self, caller: Caller, a: Approval, done: Done<Started>);
    /// [`Gate::run`].
    fn run(&self, caller: Caller, run: &str) -> Result<Standing, GateError>;
    /// [`Gate::runs`].
    fn runs(&self, caller: Caller) -> Result<Vec<Standing>, GateError>;
    /// Every run named `prefix...`, open or stopped, none lost to memory's bound (for the
    /// operator and the proxy's keys).
    fn runs_named(&self, prefix: &str) -> Result<Vec<Standing>, GateError>;
    /// [`Gate::approval_requests`].
    fn approval_requests(&self) -> Result<Vec<ApprovalRequest>, GateError>;
    /// [`Gate::approval_request`].
    fn approval_request(&self, id: &str) -> Result<ApprovalRequest, GateError>;
    /// [`Gate::governs`].
    fn governs(&self, run: &str) -> Result<bool, GateError>;
    /// [`Gate::breakers`].
    fn breakers(&self) -> Result<Vec<(String, tally_policy::Breaker)>, GateError>;
    /// [`Gate::overview`]: the runs and breakers for the operator's views, read apart
    /// from the decisions where the backend can ([`Gatekeeper::overview_apart`]).
    #[allow(clippy::type_complexity)]
    fn overview(&self) -> Result<(Vec<Standing>, Vec<(String, tally_policy::Breaker)>), GateError>;
    /// Whether [`Gatekeeper::overview`] is read apart from the decisions (a networked
    /// backend's own connection): then call it from a thread of its own, never from the
    /// decision thread, so a slow read delays no decision.
    fn overview_apart(&self) -> bool;
    /// Round trips to a networked state backend so far (None for the embedded store).
    fn round_trips(&self) -> Option<u64>;
    /// [`Gate::failure`].
    fn failure(&self) -> Option<String>;
    /// [`Gate::policy`].
    fn policy(&self) -> &Recorded;
    /// Whether the backend blocks its caller on the network ([`StateBackend::networked`]).
    fn networked(&self) -> bool;
    /// The backend's lease events so far ([`StateBackend::lease_counts`]).
    fn lease_counts(&self) -> Option<Vec<(&'static str, u64)>> {
        None
    }
    /// The backend's outcomes not yet in the shared rows
    /// ([`StateBackend::breaker_outcomes_unflushed`]).
    fn breaker_outcomes_unflushed(&self) -> Option<u64> {
        None
    }
    /// Serving ends ([`StateBackend::close`]): call once no decision is in flight, from
    /// a thread that may block.
    fn close(&self) {}
}

impl<B: StateBackend + 'static> Gatekeeper for Gate<B> {
    fn start(&self, caller: Caller, req: StartRequest, done: Done<Started>) {
        Gate::start(self, caller, req, done)
    }
    fn check(&self, caller: Caller, req: CheckRequest, done: Done<CheckAnswer>) {
        Gate::check(self, caller, req, done)
    }
    fn outcome(&self, caller: Caller, req: OutcomeRequest, done: Done<Logged>) {
        Gate::outcome(self, caller, req, done)
    }
    fn outcome_sequenced(
        &self,
        caller: Caller,
        req: OutcomeRequest,
        sequenced: Done<()>,
        durable: Done<Logged>,
    ) {
        Gate::outcome_sequenced(self, caller, req, sequenced, durable)
    }
    fn settle(&self, caller: Caller, run: &str, req: SettleRequest, done: Done<Logged>) {
        Gate::settle(self, caller, run, req, done)
    }
    fn stop(&self, caller: Caller, run: &str, req: StopRequest, done: Done<Logged>) {
        Gate::stop(self, caller, run, req, done)
    }
    fn pause(&self, caller: Caller, run: &str, paused: bool, done: Done<Standing>) {
        Gate::pause(self, caller, run, paused, done)
    }
    fn approve(&self, caller: Caller, a: Approval, done: Done<Logged>) {
        Gate::approve(self, caller, a, done)
    }
    fn continue_run(&self, caller: Caller, a: Approval, done: Done<Started>) {
        Gate::continue_run(self, caller, a, done)
    }
    fn deny(&self, caller: Caller, d: Denial, done: Done<Logged>) {
        Gate::deny(self, caller, d, done)
    }
    fn run(&self, caller: Caller, run: &str) -> Result<Standing, GateError> {
        Gate::run(self, caller, run)
    }
    fn approval_requests(&self) -> Result<Vec<ApprovalRequest>, GateError> {
        Gate::approval_requests(self)
    }
    fn approval_request(&self, id: &str) -> Result<ApprovalRequest, GateError> {
        Gate::approval_request(self, id)
    }
    fn runs(&self, caller: Caller) -> Result<Vec<Standing>, GateError> {
        Gate::runs(self, caller)
    }
    fn runs_named(&self, prefix: &str) -> Result<Vec<Standing>, GateError> {
        Gate::runs_named(self, prefix)
    }
    fn governs(&self, run: &str) -> Result<bool, GateError> {
        Gate::governs(self, run)
    }
    fn breakers(&self) -> Result<Vec<(String, tally_policy::Breaker)>, GateError> {
        Gate::breakers(self)
    }
    fn overview(&self) -> Result<(Vec<Standing>, Vec<(String, tally_policy::Breaker)>), GateError> {
        Gate::overview(self)
    }
    fn overview_apart(&self) -> bool {
        self.backend.overview_apart()
    }
    fn round_trips(&self) -> Option<u64> {
        self.backend_round_trips()
    }
    fn failure(&self) -> Option<String> {
        Gate::failure(self)
    }
    fn policy(&self) -> &Recorded {
        Gate::policy(self)
    }
    fn networked(&self) -> bool {
        self.backend.networked()
    }
    fn lease_counts(&self) -> Option<Vec<(&'static str, u64)>> {
        self.backend.lease_counts()
    }
    fn breaker_outcomes_unflushed(&self) -> Option<u64> {
        self.backend.breaker_outcomes_unflushed()
    }
    fn close(&self) {
        self.backend.close()
    }
}
