//! The settle phase: the call's outcome recorded with the gate (its `outcome_sequenced`:
//! in place on the embedded store, on the decision thread for a networked one), then its
//! span ended with it. It returns once the outcome is sequenced, before it is durable
//! (docs/PROXY.md, "The outcome off the answer's path").
//!
//! It runs once for every call the check allowed, whatever ends it: the check arms a
//! [`Settling`], forward and pump tell it what happened ([`Settling::ended`]), and it
//! settles what it holds when it is finished ([`Settling::settle`]) or, first, dropped
//! (an early return, the agent gone before the upstream answered, a panic). Until told
//! otherwise it holds `unknown`, nothing settled: nothing is known of what the upstream
//! did, so the reservation stays held for the operator to settle.

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use futures::FutureExt;
use tally_gate::{Caller, GateError, Gatekeeper, OutcomeRequest};
use tally_policy::{ModelPrice, UpstreamKind};
use tally_record::money::Nanos;
use tally_record::{Effect, Status, UsageRefused};

use crate::key_spend::KeyHold;
use crate::proxy::Proxy;
use crate::trace::CallSpan;

/// What settling an attempt needs.
pub(crate) struct Settle {
    pub run: String,
    pub attempt: u64,
    pub seq: Option<u64>,
    pub caller: Caller,
    pub effect: Effect,
    pub kind: UpstreamKind,
    pub endpoint: crate::request::Endpoint,
    pub price: Option<ModelPrice>,
    pub route_price: Option<Nanos>,
    /// The billing tiers the call can land on.
    pub lands: crate::tier::Lands,
    pub cost_header: Option<String>,
    /// What the gate reserved for the call: the worst case it can cost.
    pub reserved: Nanos,
    /// The answers (choices, candidates) the reservation was made for: the output
    /// bound of a plausible usage is per answer.
    pub choices: u64,
    /// For a call with a key: its reservation held against the key's day, taken over
    /// by the outcome (else given back when dropped).
    pub key: Option<KeyHold>,
}

/// How a call ended: its outcome as recorded, and what its span says of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ended {
    pub status: Status,
    pub nanos: Option<u64>,
    pub retry_after_ms: Option<u64>,
    pub digest: Option<String>,
    pub observed: Option<String>,
    pub usage_refused: Option<UsageRefused>,
    /// What the upstream reported, as recorded on the outcome.
    pub usage: Option<tally_record::Usage>,
    /// The upstream's HTTP status, if it answered (for the span).
    pub http: Option<u16>,
    /// The tokens it reported (for the span).
    pub used: Option<crate::usage::Usage>,
}

impl Ended {
    /// An end with no answer body (a timeout, an unreachable upstream, a refused
    /// redirect, nothing known): `status` as a call with `effect` records it, nothing
    /// settled unless it is a rejection (settled 0).
    pub fn without_answer(status: Status, effect: Effect, observed: Option<String>) -> Ended {
        let status = tally_policy::recorded_status(status, effect);
        Ended {
            status,
            nanos: tally_policy::is_rejection(status).then_some(0),
            retry_after_ms: None,
            digest: None,
            observed,
            usage_refused: None,
            usage: None,
            http: None,
            used: None,
        }
    }
}

/// Where an outcome is recorded: the gate, here for the embedded store, on its decision
/// thread for a networked one. The future resolves once the outcome is *sequenced* (its
/// state change applied, its record queued in the ledger's commit order), not once it is
/// durable.
pub(crate) type Record =
    Arc<dyn Fn(Caller, OutcomeRequest) -> BoxFuture<'static, Result<(), GateError>> + Send + Sync>;

/// A gate call that answers through its callback.
type GateCall = Box<dyn FnOnce(Arc<dyn Gatekeeper>, Sequenced) + Send>;

/// Where the gate says the outcome is sequenced.
type Sequenced = Box<dyn FnOnce(Result<(), GateError>) + Send>;

impl Proxy {
    /// The gate's `outcome_sequenced`, for a task that outlives the request: resolves
    /// once the outcome is sequenced; if the ledger then cannot make it durable (the
    /// gate fails closed), that is said on stderr. On the embedded store it is sequenced
    /// on this thread (a state lock held for the outcome's decision, and the ledger's
    /// queue), as the daemon reads that store: no round trip to the decision thread at
    /// the end of every answer. A networked backend blocks for its round trips, so there
    /// it goes through the decision thread.
    pub(crate) fn recorder(&self) -> Record {
        let (gate, stage) = (Arc::clone(&self.gate), Arc::clone(&self.stage));
        Arc::new(move |caller, req| {
            let (gate, stage) = (Arc::clone(&gate), Arc::clone(&stage));
            let sequence: GateCall = Box::new(move |gate, sequenced| {
                let (run, attempt) = (req.run.clone(), req.attempt);
                let durable = Box::new(move |r: Result<tally_gate::Logged, GateError>| {
                    if let Err(e) = r {
                        unrecorded(&run, attempt, &e);
                    }
                });
                gate.outcome_sequenced(caller, req, sequenced, durable)
            });
            async move {
                if gate.networked() {
                    crate::proxy::call(&gate, &stage, sequence).await
                } else {
                    in_place(gate, sequence).await
                }
            }
            .boxed()
        })
    }
}

/// `sequence` run on this thread; its answer.
async fn in_place(gate: Arc<dyn Gatekeeper>, sequence: GateCall) -> Result<(), GateError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    sequence(
        gate,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    rx.await
        .unwrap_or_else(|_| Err(GateError::Unavailable("the gate dropped a request".into())))
}

/// Said on stderr when the outcome of `run`'s `attempt` could not be recorded.
fn unrecorded(run: &str, attempt: u64, e: &GateError) {
    eprintln!(
        "tally serve: proxy: the outcome of run {run} attempt {attempt} could not be recorded (its reservation stays held): {e}"
    );
}

/// An allowed call, to be settled once: its deadline, what settling it needs, its span
/// and the outcome it holds so far.
pub(crate) struct Settling {
    /// When the call's time is up (the run's deadline or the upstream's timeout).
    pub deadline: Instant,
    pending: Option<Pending>,
}

struct Pending {
    record: Record,
    settle: Settle,
    span: Option<CallSpan>,
    ended: Ended,
}

impl Settling {
    /// Armed by the check: settles `unknown` unless told otherwise.
    pub fn arm(
        record: Record,
        settle: Settle,
        deadline: Instant,
        span: Option<CallSpan>,
    ) -> Settling {
        let ended = Ended::without_answer(Status::Unknown, settle.effect, None);
        Settling {
            deadline,
            pending: Some(Pending {
                record,
                settle,
                span,
                ended,
            }),
        }
    }

    /// What settling needs.
    pub fn facts(&self) -> &Settle {
        &self
            .pending
            .as_ref()
            .expect("settled once, by value")
            .settle
    }

    /// The trace context to send upstream: the call's span's, if it has one.
    pub fn outgoing(&self) -> Option<crate::trace::Trace> {
        self.pending.as_ref()?.span.as_ref().map(CallSpan::outgoing)
    }

    /// How the call ended, as far as is known now.
    pub fn ended(&mut self, ended: Ended) {
        if let Some(p) = &mut self.pending {
            p.ended = ended;
        }
    }

    /// Settles the outcome it holds, and waits for the gate to sequence it.
    pub async fn settle(mut self) {
        if let Some(p) = self.pending.take() {
            settle(p.record, p.settle, p.ended, p.span).await;
        }
    }
}

impl Drop for Settling {
    /// Not settled by its phase: settled now, with what it holds, on a task of its own.
    fn drop(&mut self) {
        let Some(mut p) = self.pending.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(settle(p.record, p.settle, p.ended, p.span))),
            // Nothing recorded: the run keeps its reservation, the key its hold.
            Err(_) => {
                if let Some(k) = p.settle.key.take() {
                    k.settle(None);
                }
            }
        }
    }
}

/// The settle phase: `ended` recorded as the outcome of `s`'s attempt (returns once it
/// is sequenced: any later decision sees it), then the span ended with it. An outcome the
/// gate cannot record is said on stderr (its reservation stays held).
pub(crate) async fn settle(record: Record, mut s: Settle, ended: Ended, span: Option<CallSpan>) {
    let status = ended.status;
    // The key's day settles what the run settles (an unknown outcome keeps it held).
    if let Some(k) = s.key.take() {
        k.settle(ended.nanos);
    }
    let req = OutcomeRequest {
        run: s.run.clone(),
        attempt: s.attempt,
        status,
        settled_cents: None,
        settled_nanos: ended.nanos,
        remote_ref: None,
        observed: ended.observed,
        retry_after_ms: ended.retry_after_ms,
        result_digest: ended.digest,
        worker: None,
        usage_refused: ended.usage_refused,
        usage: ended.usage,
    };
    if let Err(e) = record(s.caller, req).await {
        unrecorded(&s.run, s.attempt, &e);
    }
    if let Some(span) = span {
        span.end(status.as_str(), ended.http, ended.used);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    /// A record that keeps what it is given.
    fn kept() -> (Record, Arc<Mutex<Vec<OutcomeRequest>>>) {
        let all = Arc::new(Mutex::new(Vec::new()));
        let into = Arc::clone(&all);
        let record: Record = Arc::new(move |_, req| {
            into.lock().expect("not poisoned").push(req);
            async { Ok(()) }.boxed()
        });
        (record, all)
    }

    pub(crate) fn facts(effect: Effect) -> Settle {
        Settle {
            run: "r1".into(),
            attempt: 3,
            seq: Some(7),
            caller: Caller {
                uid: Some(1000),
                operator: false,
                proxied: true,
            },
            effect,
            kind: UpstreamKind::Openai,
            endpoint: crate::request::Endpoint::ChatCompletions,
            price: None,
            route_price: None,
            lands: crate::tier::Lands::Default,
            cost_header: None,
            reserved: Nanos(500),
            choices: 1,
            key: None,
        }
    }

    fn statuses(all: &Mutex<Vec<OutcomeRequest>>) -> Vec<(String, u64, Status, Option<u64>)> {
        let all = all.lock().expect("not poisoned");
        all.iter()
            .map(|r| (r.run.clone(), r.attempt, r.status, r.settled_nanos))
            .collect()
    }

    #[tokio::test]
    async fn a_settling_settles_what_it_was_told_once() {
        let (record, all) = kept();
        let mut s = Settling::arm(record, facts(Effect::Read), Instant::now(), None);
        s.ended(Ended::without_answer(
            Status::Rejected,
            Effect::Read,
            Some("why".into()),
        ));
        s.settle().await;
        assert_eq!(
            statuses(&all),
            [("r1".into(), 3, Status::Rejected, Some(0))]
        );
        assert_eq!(
            all.lock().expect("not poisoned")[0].observed.as_deref(),
            Some("why")
        );
    }

    #[tokio::test]
    async fn a_settling_dropped_unsettled_settles_unknown_and_holds() {
        let (record, all) = kept();
        let s = Settling::arm(
            record,
            facts(Effect::NonIdempotentWrite),
            Instant::now(),
            None,
        );
        drop(s);
        // The drop's settle runs on a task of its own.
        for _ in 0..100 {
            if !all.lock().expect("not poisoned").is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(statuses(&all), [("r1".into(), 3, Status::Unknown, None)]);
    }

    #[tokio::test]
    async fn a_task_that_panics_with_its_settling_still_settles() {
        let (record, all) = kept();
        let s = Settling::arm(record, facts(Effect::Read), Instant::now(), None);
        let task = tokio::spawn(async move {
            let _held = s;
            panic!("the pump panics");
        });
        assert!(task.await.is_err(), "the task panicked");
        for _ in 0..100 {
            if !all.lock().expect("not poisoned").is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(statuses(&all), [("r1".into(), 3, Status::Unknown, None)]);
    }

    #[test]
    fn an_end_without_answer_settles_a_rejection_at_zero_and_holds_the_rest() {
        let e = Ended::without_answer(Status::Timeout, Effect::NonIdempotentWrite, None);
        assert_eq!((e.status, e.nanos), (Status::Unknown, None));
        let e = Ended::without_answer(Status::Timeout, Effect::Read, None);
        assert_eq!(e.nanos, None);
        let e = Ended::without_answer(Status::Rejected, Effect::Read, None);
        assert_eq!((e.status, e.nanos), (Status::Rejected, Some(0)));
    }
}
