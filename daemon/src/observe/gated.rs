//! The one seam every decision passes: the gate as the daemon's handlers and the proxy
//! reach it, each durable answer handed to the [`Observer`] (metrics, the JSON log, the
//! live view). Counting here, not in the HTTP handlers, is what makes a proxied call (the
//! proxy calls the gate directly) and a refusal the proxy makes before asking (recorded as
//! a check with `refused`) count like any other.

use std::sync::Arc;
use std::time::Instant;

use tally_gate::{
    Approval, ApprovalRequest, Caller, CheckAnswer, CheckRequest, Denial, GateError, Gatekeeper,
    Logged, OutcomeRequest, SettleRequest, Standing, StartRequest, Started, StopRequest,
};
use tally_policy::Recorded;

use super::{Observer, Seen};

type Done<T> = Box<dyn FnOnce(Result<T, GateError>) + Send>;

/// A gate whose every check and outcome is observed once it is durable.
pub(crate) struct Observed {
    inner: Arc<dyn Gatekeeper>,
    observer: Arc<Observer>,
}

impl Observed {
    pub fn new(inner: Arc<dyn Gatekeeper>, observer: Arc<Observer>) -> Observed {
        Observed { inner, observer }
    }
}

impl Observed {
    /// `done`, the outcome `req` observed first once it is durable.
    fn observing(&self, caller: Caller, req: &OutcomeRequest, done: Done<Logged>) -> Done<Logged> {
        // The gate refuses an outcome whose amount is bad input; a recorded one has its
        // settlement in nanodollars.
        let nanos = tally_ledger::decision::one_amount(
            "settled_cents",
            req.settled_cents,
            "settled_nanos",
            req.settled_nanos,
        )
        .ok()
        .flatten()
        .map(|n| n.0);
        let (run, attempt, status) = (req.run.clone(), req.attempt, req.status);
        // Only the proxy's own report carries a usage (the gate records it for no other).
        let usage = req.usage.filter(|_| caller.proxied);
        let observer = Arc::clone(&self.observer);
        Box::new(move |r| {
            if let Ok(l) = &r {
                observer.outcome(&run, attempt, status, nanos, usage.as_ref(), l);
            }
            done(r)
        })
    }
}

impl Gatekeeper for Observed {
    fn start(&self, caller: Caller, req: StartRequest, done: Done<Started>) {
        self.inner.start(caller, req, done)
    }

    fn check(&self, caller: Caller, req: CheckRequest, done: Done<CheckAnswer>) {
        let started = Instant::now();
        let seen = Seen::of(
            &req,
            caller.proxied.then(|| self.observer.metrics.call_of(&req)),
        );
        let observer = Arc::clone(&self.observer);
        self.inner.check(
            caller,
            req,
            Box::new(move |r| {
                match &r {
                    Ok(answer) => {
                        if answer.decision == tally_wire::Verdict::RequireApproval {
                            observer.notify.changed();
                        }
                        observer.checked(&seen, answer, started.elapsed())
                    }
                    // The run is over: a decision-shaped answer, counted like one.
                    Err(GateError::Stopped(answer)) => {
                        observer.checked(&seen, answer, started.elapsed())
                    }
                    Err(_) => {}
                }
                done(r)
            }),
        )
    }

    fn outcome(&self, caller: Caller, req: OutcomeRequest, done: Done<Logged>) {
        let observed = self.observing(caller, &req, done);
        self.inner.outcome(caller, req, observed)
    }

    fn outcome_sequenced(
        &self,
        caller: Caller,
        req: OutcomeRequest,
        sequenced: Done<()>,
        durable: Done<Logged>,
    ) {
        // Observed, like every outcome, once it is durable.
        let observed = self.observing(caller, &req, durable);
        self.inner
            .outcome_sequenced(caller, req, sequenced, observed)
    }

    fn settle(&self, caller: Caller, run: &str, req: SettleRequest, done: Done<Logged>) {
        let (name, attempt, nanos) = (run.to_owned(), req.attempt, req.settled_nanos);
        let observer = Arc::clone(&self.observer);
        self.inner.settle(
            caller,
            run,
            req,
            Box::new(move |r| {
                if let Ok(l) = &r {
                    // The operator's settlement is the attempt's outcome: `unknown`.
                    let status = tally_ledger::Status::Unknown;
                    observer.outcome(&name, attempt, status, Some(nanos), None, l);
                }
                done(r)
            }),
        )
    }

    fn stop(&self, caller: Caller, run: &str, req: StopRequest, done: Done<Logged>) {
        self.inner.stop(caller, run, req, done)
    }

    fn pause(&self, caller: Caller, run: &str, paused: bool, done: Done<Standing>) {
        self.inner.pause(caller, run, paused, done)
    }

    fn deny(&self, caller: Caller, d: Denial, done: Done<Logged>) {
        let observer = Arc::clone(&self.observer);
        self.inner.deny(
            caller,
            d,
            Box::new(move |r| {
                if r.is_ok() {
                    observer.notify.changed();
                    observer.bump();
                }
                done(r)
            }),
        )
    }

    fn approve(&self, caller: Caller, a: Approval, done: Done<Logged>) {
        let run = a.run.clone();
        let observer = Arc::clone(&self.observer);
        self.inner.approve(
            caller,
            a,
            Box::new(move |r| {
                if r.is_ok() {
                    observer.notify.changed();
                    observer.live.approved(&run);
                    observer.bump();
                }
                done(r)
            }),
        )
    }

    fn continue_run(&self, caller: Caller, a: Approval, done: Done<Started>) {
        let run = a.run.clone();
        let observer = Arc::clone(&self.observer);
        self.inner.continue_run(
            caller,
            a,
            Box::new(move |r| {
                if r.is_ok() {
                    observer.live.approved(&run);
                    observer.bump();
                }
                done(r)
            }),
        )
    }

    fn run(&self, caller: Caller, run: &str) -> Result<Standing, GateError> {
        self.inner.run(caller, run)
    }

    fn runs(&self, caller: Caller) -> Result<Vec<Standing>, GateError> {
        self.inner.runs(caller)
    }

    fn runs_named(&self, prefix: &str) -> Result<Vec<Standing>, GateError> {
        self.inner.runs_named(prefix)
    }

    fn approval_requests(&self) -> Result<Vec<ApprovalRequest>, GateError> {
        self.inner.approval_requests()
    }

    fn approval_request(&self, id: &str) -> Result<ApprovalRequest, GateError> {
        self.inner.approval_request(id)
    }

    fn governs(&self, run: &str) -> Result<bool, GateError> {
        self.inner.governs(run)
    }

    fn breakers(&self) -> Result<Vec<(String, tally_policy::Breaker)>, GateError> {
        self.inner.breakers()
    }

    #[allow(clippy::type_complexity)]
    fn overview(&self) -> Result<(Vec<Standing>, Vec<(String, tally_policy::Breaker)>), GateError> {
        self.inner.overview()
    }

    fn overview_apart(&self) -> bool {
        self.inner.overview_apart()
    }

    fn round_trips(&self) -> Option<u64> {
        self.inner.round_trips()
    }

    fn lease_counts(&self) -> Option<Vec<(&'static str, u64)>> {
        self.inner.lease_counts()
    }

    fn breaker_outcomes_unflushed(&self) -> Option<u64> {
        self.inner.breaker_outcomes_unflushed()
    }

    fn close(&self) {
        self.inner.close()
    }

    fn failure(&self) -> Option<String> {
        self.inner.failure()
    }

    fn policy(&self) -> &Recorded {
        self.inner.policy()
    }

    fn networked(&self) -> bool {
        self.inner.networked()
    }
}
