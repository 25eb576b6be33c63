//! Every gate operation as a value: a [`Commit`] (the records to append, the scopes
//! whose state they wrote, the answer) that a step builds over its snapshot,
//! and [`Gate::transact`], the one path that makes any of them durable and answers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tally_ledger::{Decision, Receipt};

use crate::backend::{Batch, Observed, Scopes, StateBackend, StateTxn, Write};
use crate::tables::POLICY_KEY;
use crate::work::Work;
use crate::{encode, CheckAnswer, Done, Gate, GateError, Logged, Standing, Started, Touched};

/// What one operation leaves to make durable, decided and folded into its transaction:
/// the records to append (in order), the scopes whose state they changed, and the answer
/// the caller gets once the records are durable. The answer may be a refusal that still
/// records something (a start refused after the caller's expired runs were stopped).
pub(crate) struct Commit<T> {
    records: Vec<Decision>,
    writes: Vec<Touched>,
    /// The record whose receipt the answer carries.
    answering: usize,
    answer: Result<T, GateError>,
    /// What to do with the records' receipts once they are durable, before answering.
    durable: Option<AfterDurable>,
    /// The outcomes folded into a tool's breaker ([`Write::observed`]).
    observed: Vec<Observed>,
}

/// A step's follow-up on its records' receipts (in record order, the policy record's
/// left out).
pub(crate) type AfterDurable = Box<dyn FnOnce(&[Receipt]) + Send>;

impl<T> Commit<T> {
    /// `records` with the state of `writes`, answered with `answer` and the receipt of
    /// the last record.
    pub(crate) fn new(records: Vec<Decision>, writes: Vec<Touched>, answer: T) -> Commit<T> {
        let answering = records.len().saturating_sub(1);
        Commit {
            records,
            writes,
            answering,
            answer: Ok(answer),
            durable: None,
            observed: Vec::new(),
        }
    }

    /// `records` made durable, and the caller refused with `why` once they are.
    pub(crate) fn refused(records: Vec<Decision>, writes: Vec<Touched>, why: GateError) -> Self {
        Commit {
            answering: records.len().saturating_sub(1),
            records,
            writes,
            answer: Err(why),
            durable: None,
            observed: Vec::new(),
        }
    }

    /// The answer carries the receipt of `records[index]` instead of the last one's.
    pub(crate) fn answering(mut self, index: usize) -> Commit<T> {
        self.answering = index;
        self
    }

    /// The commit folded `observed` into its tool's breaker.
    pub(crate) fn observing(mut self, observed: Observed) -> Commit<T> {
        self.observed.push(observed);
        self
    }

    /// Once the records are durable, `then` gets their receipts (before the answer goes).
    pub(crate) fn then_durable(mut self, then: AfterDurable) -> Commit<T> {
        self.durable = Some(then);
        self
    }
}

/// An answer, given the receipt of the record it answers with.
pub(crate) trait Receipted {
    /// The answer with the receipt's place in the ledger.
    fn receipted(self, receipt: Receipt) -> Self;
}

impl Receipted for CheckAnswer {
    fn receipted(mut self, r: Receipt) -> CheckAnswer {
        self.seq = Some(r.seq);
        self.hash = Some(r.hash.to_string());
        self
    }
}

impl Receipted for Logged {
    fn receipted(mut self, r: Receipt) -> Logged {
        self.seq = r.seq;
        self.hash = r.hash.to_string();
        self
    }
}

impl Receipted for Started {
    fn receipted(mut self, r: Receipt) -> Started {
        self.seq = r.seq;
        self.hash = r.hash.to_string();
        self
    }
}

impl Receipted for Standing {
    fn receipted(self, _: Receipt) -> Standing {
        self
    }
}

/// Records handed to the ledger: whether it refused them before `commit` returned.
#[derive(Default)]
struct Handed {
    returned: AtomicBool,
    refused: AtomicBool,
}

/// The gate refuses everything from now on, for `why` (kept if one was already given).
fn fail(failure: &Mutex<Option<String>>, why: String) -> GateError {
    failure
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert(why.clone());
    GateError::Unavailable(why)
}

/// What a commit's answer needs of its receipts once the ledger has answered.
struct Receipts<T> {
    /// The commit's own records (the policy record may come before them).
    count: usize,
    /// The answering record, counted from the end.
    from_end: usize,
    answer: Result<T, GateError>,
    durable: Option<AfterDurable>,
}

impl<T: Receipted> Receipts<T> {
    /// The answer, given the ledger's `result`: receipted, after the step's follow-up;
    /// or the gate failed closed if the ledger could not record the records.
    fn answer(
        self,
        result: tally_ledger::Result<Vec<Receipt>>,
        failure: &Mutex<Option<String>>,
    ) -> Result<T, GateError> {
        let receipts = match result {
            Ok(r) => r,
            Err(e) => {
                return Err(fail(
                    failure,
                    format!("the ledger could not record a decision: {e}"),
                ))
            }
        };
        let Some(r) = receipts.iter().rev().nth(self.from_end) else {
            return Err(GateError::Unavailable(
                "the ledger returned no receipt".into(),
            ));
        };
        if let Some(then) = self.durable {
            let own = receipts.len().saturating_sub(self.count);
            then(&receipts[own..]);
        }
        self.answer.map(|a| a.receipted(*r))
    }
}

/// The ledger's answer to a commit, given to whoever still waits in `waiting`: the
/// receipted answer, or the gate failed closed. `handed` (a sequenced answer's) learns
/// whether the ledger refused the records before the commit returned.
fn when_durable<T: Receipted + Send + 'static>(
    receipted: Receipts<T>,
    failure: Arc<Mutex<Option<String>>>,
    handed: Option<Arc<Handed>>,
    waiting: Arc<Mutex<Option<Done<T>>>>,
) -> crate::backend::Committed {
    Box::new(move |result| {
        if let (Some(r), Err(_)) = (&handed, &result) {
            if !r.returned.load(Ordering::SeqCst) {
                r.refused.store(true, Ordering::SeqCst);
            }
        }
        let done = waiting.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(done) = done {
            done(receipted.answer(result, &failure));
        }
    })
}

/// The refusal of a decision whose state a group commit then failed to commit: to whoever
/// still waits for its answer (nothing was queued; the gate is not failed).
fn refuser<T: Send + 'static>(waiting: &Arc<Mutex<Option<Done<T>>>>) -> crate::backend::Refuse {
    let waiting = Arc::clone(waiting);
    Box::new(move |e| {
        let done = waiting.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(done) = done {
            done(Err(e));
        }
    })
}

/// Who an operation answers, and when: `done` once its records are durable; an operation
/// answered once *sequenced* ([`Answer::sequenced`]) also answers `sequenced` as soon as
/// its state change is applied and its records are queued in the ledger's commit order.
pub(crate) struct Answer<T> {
    sequenced: Option<Done<()>>,
    done: Done<T>,
}

impl<T> Answer<T> {
    /// Answered once the records are durable (every operation but a proxied outcome).
    pub(crate) fn durable(done: Done<T>) -> Answer<T> {
        Answer {
            sequenced: None,
            done,
        }
    }

    /// `sequenced` answered once the records are queued, `durable` once they are durable.
    /// An operation refused, or one that records nothing, answers `sequenced` alone.
    pub(crate) fn sequenced(sequenced: Done<()>, durable: Done<T>) -> Answer<T> {
        Answer {
            sequenced: Some(sequenced),
            done: durable,
        }
    }

    /// Answered now, nothing queued: to whoever waits first.
    fn now(self, answer: Result<T, GateError>) {
        match self.sequenced {
            Some(sequenced) => sequenced(answer.map(|_| ())),
            None => (self.done)(answer),
        }
    }
}

impl<B: StateBackend> Gate<B> {
    /// Run one operation: begin the state transaction, let `step` load the scopes it
    /// names and fold what it decides into their snapshot ([`Work`]), then hand the
    /// snapshot and its [`Commit`] to the backend's commit, one step (the state made
    /// durable first where the backend is networked, the records queued for the
    /// ledger's group commit while the transaction still holds its scopes), and answer
    /// `done` once the ledger says the records are durable. A step's error, or a commit
    /// of no records, answers at once and records nothing (the snapshot is let go).
    pub(crate) fn transact<T: Receipted + Send + 'static>(
        &self,
        done: Done<T>,
        step: impl FnOnce(&mut Work<B::Txn<'_>>) -> Result<Commit<T>, GateError>,
    ) {
        self.transact_answering(Answer::durable(done), step)
    }

    /// [`Gate::transact`], answering as `answer` says: a sequenced answer goes once the
    /// records are queued (after the transaction's state change is applied and while it
    /// still holds its scopes, so every later operation decides on that state and is
    /// durable only after these records, by log order), the durable one once they are
    /// durable.
    pub(crate) fn transact_answering<T: Receipted + Send + 'static>(
        &self,
        answer: Answer<T>,
        step: impl FnOnce(&mut Work<B::Txn<'_>>) -> Result<Commit<T>, GateError>,
    ) {
        let mut work = match self.begin() {
            Ok(w) => w,
            Err(e) => return answer.now(Err(e)),
        };
        let commit = match step(&mut work) {
            Ok(c) => c,
            Err(e) => return answer.now(Err(e)),
        };
        if commit.records.is_empty() {
            drop(work);
            return answer.now(commit.answer);
        }
        let Commit {
            records,
            writes,
            answering,
            answer: answered,
            durable,
            observed,
        } = commit;
        let (t, snapshot) = work.into_parts();
        let scopes: Vec<Scopes<'_>> = writes.iter().map(Touched::scopes).collect();
        let count = records.len();
        // Counted from the end: the policy record may come first.
        let from_end = records.len().saturating_sub(answering + 1);
        let failure = Arc::clone(&self.failure);
        let Answer { sequenced, done } = answer;
        let receipted = Receipts {
            count,
            from_end,
            answer: answered,
            durable,
        };
        // Whether the ledger refused the records as it was handed them (a writer already
        // failed: it answers at once, inside `commit`): then nothing was queued, and a
        // sequenced answer says so. A failure after queueing is the durable answer's.
        let refused = sequenced.as_ref().map(|_| Arc::new(Handed::default()));
        let refusing = refused.clone();
        // Taken by the ledger's answer, or here if the commit refused the records.
        let waiting = Arc::new(Mutex::new(Some(done)));
        let answering = Arc::clone(&waiting);
        let write = Write {
            snapshot,
            durable: &scopes,
            records: self.records(records),
            // Deferred if answered once sequenced: they ride the next decision's fsync.
            deferred: sequenced.is_some(),
            observed,
            refuse: refuser(&waiting),
        };
        // A networked backend's state is durable before the decision is queued; if it
        // cannot be, nothing was queued and the gate stays up (the caller retries).
        let committed = t.commit(write, when_durable(receipted, failure, refusing, answering));
        if let Err(e) = committed {
            let done = waiting.lock().unwrap_or_else(|p| p.into_inner()).take();
            return match (sequenced, done) {
                (Some(sequenced), _) => sequenced(Err(e)),
                (None, Some(done)) => done(Err(e)),
                (None, None) => {}
            };
        }
        if let Some(r) = &refused {
            r.returned.store(true, Ordering::SeqCst);
        }
        // Queued: the ledger's order is now the state's order.
        if let (Some(sequenced), Some(handed)) = (sequenced, refused) {
            if handed.refused.load(Ordering::SeqCst) {
                sequenced(Err(GateError::Unavailable(
                    "the ledger refused the outcome's record: nothing was queued".into(),
                )));
            } else {
                sequenced(Ok(()));
            }
        }
    }

    /// `records` made at the state version the backend takes for them (owned: a backend
    /// may make them on its own thread, once its group of decisions committed).
    fn records(&self, records: Vec<Decision>) -> crate::backend::Records {
        let stamp = self.stamp();
        Box::new(move |version| stamp.plaintexts(records, version))
    }

    /// What makes the records of a commit: the policy record and whether it was recorded,
    /// and where a failure goes (owned: a backend may make them on its own thread).
    fn stamp(&self) -> Stamp {
        Stamp {
            failure: Arc::clone(&self.failure),
            recorded: Arc::clone(&self.policy_recorded),
            record: Arc::clone(&self.policy_record),
            digest: self.policy.digest.clone(),
        }
    }
}

/// What makes a commit's records at their state version ([`Stamp::plaintexts`]).
struct Stamp {
    failure: Arc<Mutex<Option<String>>>,
    recorded: Arc<AtomicBool>,
    record: Arc<Vec<u8>>,
    digest: String,
}

impl Stamp {
    /// The stored bytes of `records` at state version `version`, after the policy record
    /// if this is the first commit under the policy, and the ledger's own state to write
    /// with them. Called once the state version is taken, before the records are queued
    /// and in the order they are: exactly one commit carries the policy.
    fn plaintexts(&self, mut records: Vec<Decision>, version: u64) -> Result<Batch, GateError> {
        let mut plaintexts = Vec::with_capacity(records.len() + 1);
        let mut ledger_state = Vec::new();
        // A placeholder for the policy record, taken out again if it is not needed.
        plaintexts.push(Vec::new());
        for r in &mut records {
            r.state_version = Some(version);
            // Checked with the largest version before the state changed (`encodable`):
            // a state ahead of its record must not go on.
            let bytes = encode(r).map_err(|e| {
                fail(
                    &self.failure,
                    format!("a checked decision no longer encodes: {e}"),
                )
            })?;
            plaintexts.push(bytes);
        }
        if self.recorded.swap(true, Ordering::SeqCst) {
            plaintexts.remove(0);
        } else {
            plaintexts[0] = self.record.as_ref().clone();
            ledger_state.push((POLICY_KEY.to_vec(), self.digest.as_bytes().to_vec()));
        }
        Ok(Batch {
            plaintexts,
            ledger_state,
        })
    }
}
