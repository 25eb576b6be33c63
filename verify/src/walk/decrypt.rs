//! Decrypting the decisions on the walk (with the auditor key): each epoch's data key,
//! the batch being filled, and the pipeline that opens batches on worker threads and
//! hands them back in order.

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use tally_ledger::format::{Header, HEADER_LEN};
use tally_ledger::keys::DataKey;
use tally_ledger::Decision;

/// Decisions per batch handed to the workers: small enough that the decisions in flight
/// (the workers' batches and the analysis's) stay in a cache between the worker that
/// reads them and the fold (see `BACKGROUND_BATCH` in `analysis`).
const BATCH: usize = 128;

/// A decision entry queued for decryption, with what the walk read of its header (the
/// workers do not decode it again).
pub(super) struct Pending {
    pub(super) seq: u64,
    pub(super) wall_ms: u64,
    pub(super) epoch: u32,
    nonce: [u8; 24],
    key: Arc<DataKey>,
    /// The whole entry, as decoded by the walk: header, then body.
    bytes: Vec<u8>,
}

/// Each pending decision opened: the decision, or why it could not be (`invalid: ` first
/// when it decrypted but is not a valid decision).
pub(super) type Opened = Vec<Result<Box<Decision>, String>>;

/// The decryption pipeline: batches go out to worker threads, results come back in any
/// order and are delivered in batch order. At most `2 * threads` batches are in flight.
pub(super) struct Pipeline {
    work: Option<SyncSender<(u64, Vec<Pending>)>>,
    done: Receiver<(u64, Vec<Pending>, Opened)>,
    sent: u64,
    delivered: u64,
    reorder: BTreeMap<u64, (Vec<Pending>, Opened)>,
}

impl Pipeline {
    /// `threads` decryption workers on `scope`, waiting for batches.
    pub(super) fn start<'scope>(
        scope: &'scope std::thread::Scope<'scope, '_>,
        threads: usize,
    ) -> Pipeline {
        let threads = threads.max(1);
        let (work_tx, work_rx) = mpsc::sync_channel::<(u64, Vec<Pending>)>(2 * threads);
        let (done_tx, done_rx) = mpsc::channel();
        let work_rx = Arc::new(Mutex::new(work_rx));
        for _ in 0..threads {
            let (work_rx, done_tx) = (Arc::clone(&work_rx), done_tx.clone());
            scope.spawn(move || {
                let mut plain = Vec::new();
                loop {
                    let job = work_rx.lock().map(|rx| rx.recv());
                    let Ok(Ok((id, batch))) = job else { break };
                    let opened: Opened = batch.iter().map(|p| open(p, &mut plain)).collect();
                    if done_tx.send((id, batch, opened)).is_err() {
                        break;
                    }
                }
            });
        }
        Pipeline {
            work: Some(work_tx),
            done: done_rx,
            sent: 0,
            delivered: 0,
            reorder: BTreeMap::new(),
        }
    }
}

/// The walk's decryption: on with the auditor key, until genesis names another auditor.
pub(super) struct Decrypt {
    /// Decisions are queued to decrypt.
    pub(super) on: bool,
    /// Genesis names another auditor than the key given: nothing is decrypted.
    pub(super) auditor_mismatch: bool,
    data_keys: HashMap<u32, Arc<DataKey>>,
    batch: Vec<Pending>,
    pipeline: Option<Pipeline>,
    /// Decisions that decrypted and were valid, as delivered.
    pub(super) decrypted: u64,
}

impl Decrypt {
    /// Decrypting through `pipeline` (none without the auditor key).
    pub(super) fn new(pipeline: Option<Pipeline>) -> Decrypt {
        Decrypt {
            on: pipeline.is_some(),
            auditor_mismatch: false,
            data_keys: HashMap::new(),
            batch: Vec::new(),
            pipeline,
            decrypted: 0,
        }
    }

    /// Genesis was sealed for another auditor: stop decrypting, and drop what is queued.
    pub(super) fn mismatch(&mut self) {
        self.auditor_mismatch = true;
        self.on = false;
        self.batch.clear();
    }

    /// Epoch `epoch`'s data key.
    pub(super) fn add_key(&mut self, epoch: u32, key: DataKey) {
        self.data_keys.insert(epoch, Arc::new(key));
    }

    /// Queue the decision entry `bytes` (its header `h`) under its epoch's data key;
    /// false when that epoch has none.
    pub(super) fn queue(&mut self, h: &Header, bytes: Vec<u8>) -> bool {
        let Some(key) = self.data_keys.get(&h.epoch) else {
            return false;
        };
        self.batch.push(Pending {
            seq: h.seq,
            wall_ms: h.wall_ms,
            epoch: h.epoch,
            nonce: h.nonce,
            key: Arc::clone(key),
            bytes,
        });
        true
    }

    /// Whether the batch being filled is full.
    pub(super) fn batch_full(&self) -> bool {
        self.batch.len() >= BATCH
    }

    /// Hand the current batch to the pipeline and collect whatever is back.
    pub(super) fn send(&mut self) {
        let Some(p) = &mut self.pipeline else { return };
        if !self.batch.is_empty() {
            let batch = std::mem::take(&mut self.batch);
            if let Some(work) = &p.work {
                // Blocks while 2 * threads batches are in flight: bounded memory.
                if work.send((p.sent, batch)).is_ok() {
                    p.sent += 1;
                }
            }
        }
        while let Ok((id, batch, opened)) = p.done.try_recv() {
            p.reorder.insert(id, (batch, opened));
        }
    }

    /// Wait for every batch in flight.
    pub(super) fn wait(&mut self) {
        let Some(p) = &mut self.pipeline else { return };
        p.work = None; // workers stop once the queue is empty
        while p.delivered + (p.reorder.len() as u64) < p.sent {
            match p.done.recv() {
                Ok((id, batch, opened)) => {
                    p.reorder.insert(id, (batch, opened));
                }
                Err(_) => break,
            }
        }
    }

    /// The next batch back, in batch order, if it is.
    pub(super) fn next_ready(&mut self) -> Option<(Vec<Pending>, Opened)> {
        let p = self.pipeline.as_mut()?;
        let (batch, opened) = p.reorder.remove(&p.delivered)?;
        p.delivered += 1;
        self.decrypted += opened.iter().filter(|r| r.is_ok()).count() as u64;
        Some((batch, opened))
    }
}

fn open(p: &Pending, plain: &mut Vec<u8>) -> Result<Box<Decision>, String> {
    // The walk decoded the entry (exactly one, header then body) before queueing it.
    let (header, body) = p.bytes.split_at(HEADER_LEN);
    p.key
        .open_into(&p.nonce, header, body, plain)
        .map_err(|e| e.to_string())?;
    Decision::from_stored_boxed(plain).map_err(|e| format!("invalid: {e}"))
}
