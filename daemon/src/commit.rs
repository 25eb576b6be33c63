//! The committer: one thread that owns the append side of the ledger.
//!
//! Requests hand their prepared decisions to it over a bounded queue. It takes everything
//! queued (up to [`MAX_GROUP`] decisions), appends it with one `append_prepared` call (one
//! commit group: one checkpoint, one fsync), and answers each request with its own
//! receipts. While a group commits, the next one queues up, so the group size follows
//! the load with no timer and no thread per request waiting on the ledger's lock.
//!
//! Merging requests is safe: each was validated alone before it was queued, so a group
//! fails only as a whole (I/O), and then the ledger refuses everything after (poisoned).

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tally_ledger::{Checkpoint, Ledger, Receipt};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

/// Most decisions committed in one group, so one group's latency stays bounded.
pub(crate) const MAX_GROUP: usize = 16_384;

/// One request's decisions, waiting to be committed.
pub(crate) struct Job {
    pub plaintexts: Vec<Vec<u8>>,
    /// The run counters' changes, applied here once the decisions are committed, so a
    /// client that hangs up after sending cannot keep them out of the counters.
    pub deltas: Vec<crate::runs::Delta>,
    pub reply: oneshot::Sender<Result<Vec<Receipt>, String>>,
    /// The request's in-flight slot: released only once its decisions are committed (or
    /// refused), even if the client went away.
    pub permit: OwnedSemaphorePermit,
}

pub(crate) enum Message {
    Job(Job),
    /// Sent once every in-flight slot is held by the shutdown: nothing follows it.
    Stop,
}

/// What the committer tells the rest of the daemon.
pub(crate) struct LedgerState {
    /// The latest checkpoint, refreshed after each commit (so reads never wait on the
    /// ledger's lock).
    pub checkpoint: Mutex<Checkpoint>,
    /// Why the ledger stopped accepting writes, once it has.
    pub failure: Mutex<Option<String>>,
    /// Per-run counters of the decisions committed since the daemon started.
    pub runs: crate::runs::Runs,
}

impl LedgerState {
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn checkpoint(&self) -> Checkpoint {
        self.checkpoint
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Start the committer thread.
pub(crate) fn start(
    ledger: Arc<Ledger>,
    state: Arc<LedgerState>,
    queue: mpsc::Receiver<Message>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("tally-committer".into())
        .spawn(move || {
            let watch = Arc::clone(&state);
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run(ledger, state, queue)
            }));
            if ran.is_err() {
                // Health and every later append must say so (fail closed), not "ok".
                watch
                    .failure
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert_with(|| "the committer thread failed; appends are refused until the daemon is restarted".into());
            }
        })
}

fn run(ledger: Arc<Ledger>, state: Arc<LedgerState>, mut queue: mpsc::Receiver<Message>) {
    loop {
        let first = match queue.blocking_recv() {
            Some(Message::Job(job)) => job,
            Some(Message::Stop) | None => return,
        };
        let mut count = first.plaintexts.len();
        let mut jobs = vec![first];
        let mut stop = false;
        while count < MAX_GROUP {
            match queue.try_recv() {
                Ok(Message::Job(job)) => {
                    count += job.plaintexts.len();
                    jobs.push(job);
                }
                Ok(Message::Stop) => {
                    stop = true;
                    break;
                }
                Err(_) => break,
            }
        }
        commit(&ledger, &state, jobs, count);
        if stop {
            return;
        }
    }
}

fn commit(ledger: &Ledger, state: &LedgerState, mut jobs: Vec<Job>, count: usize) {
    let mut group = Vec::with_capacity(count);
    let mut sizes = Vec::with_capacity(jobs.len());
    for job in &mut jobs {
        sizes.push(job.plaintexts.len());
        group.append(&mut job.plaintexts);
    }
    match ledger.append_prepared(group) {
        Ok(mut receipts) if receipts.len() == count => {
            *state.checkpoint.lock().unwrap_or_else(|e| e.into_inner()) = ledger.checkpoint();
            // Split from the back so each request gets its own consecutive receipts.
            for (job, size) in jobs.into_iter().zip(sizes).rev() {
                let mine = receipts.split_off(receipts.len() - size);
                state.runs.apply(job.deltas, &mine);
                let _ = job.reply.send(Ok(mine));
                drop(job.permit);
            }
        }
        Ok(receipts) => fail(
            state,
            jobs,
            format!(
                "the ledger returned {} receipts for {count} decisions",
                receipts.len()
            ),
        ),
        Err(e) => fail(state, jobs, e.to_string()),
    }
}

fn fail(state: &LedgerState, jobs: Vec<Job>, detail: String) {
    // The detail names files of the store and keys: it goes to the operator's log, and
    // agents get a fixed message.
    eprintln!(
        "tally serve: the ledger failed a write and refuses appends until restarted: {detail}"
    );
    let why = "the ledger cannot write; appends are refused until the daemon is restarted (the daemon's log has the cause)".to_string();
    state
        .failure
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(|| why.clone());
    for job in jobs {
        let _ = job.reply.send(Err(why.clone()));
        drop(job.permit);
    }
}
