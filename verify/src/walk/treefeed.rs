//! The Merkle-tree checks fed from the walk, on a thread of their own.
//!
//! The chain walk hashes every entry with BLAKE3; the tree hashes it again with SHA-256
//! (leaf) and folds it in (nodes). Both are single-threaded by nature, but they are
//! independent of each other, so the tree's share runs on a second thread: the walk hands
//! it the entries and tree-related frames in order, in bounded batches, and goes on.
//!
//! The report is the one the walk would make with the tree checks inline. Every frame the
//! walk reads gets an ordinal; each finding carries the ordinal of the frame it was made
//! at (a tree finding before the chain's findings of the same frame, as inline), and at
//! the end the two lists are merged by it and cut at `max_findings`, keeping exactly the
//! findings an inline walk keeps. The one thing the walk decides from a tree finding as
//! it goes, that nothing after it is sealed, is taken back when the tree's first finding
//! arrives: the checkpoints sealed since then are kept, bounded by how far the tree lags,
//! until the tree has passed them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;

use tally_ledger::export::SignedEnd;
use tally_ledger::tlog::merkle::TreeHash;
use tally_ledger::tlog::note::b64;
use tally_ledger::{Checkpoint, LedgerId};

use crate::finding::{Finding, FindingKind};
use crate::tree::{TreeCheck, TreeFinding};

/// Frames per batch handed to the tree thread.
const BATCH: usize = 512;
/// Batches in flight to the tree thread: with [`BATCH`], at most this many frames' steps
/// (a leaf's is its 32-byte hash) are held beyond the walk's own.
const IN_FLIGHT: usize = 8;

/// One step of the tree checks, in walk order.
pub(super) enum TreeOp {
    /// The next entry's Merkle leaf hash (the walk hashed the entry's bytes).
    Leaf(TreeHash),
    /// A tree frame of the log, read after `at` entries.
    Frame { at: u64, size: u64, root: TreeHash },
    /// A cosigned checkpoint, read after `at` entries.
    Cosigned { bytes: Vec<u8>, at: u64 },
    /// The export's signed end. `altered` lists the chain's `entry_altered` findings so
    /// far by (ordinal, index in the chain's list): whether one of them is among the
    /// findings kept depends on the tree's findings before it.
    SignedEnd {
        ledger: LedgerId,
        end: Box<SignedEnd>,
        checkpoints: u64,
        altered: Vec<(u64, usize)>,
        max_findings: usize,
    },
}

/// How far the tree thread has come: every op before `done` is checked, and `first` is
/// the ordinal of its first finding (`u64::MAX`: none yet).
struct Progress {
    done: AtomicU64,
    first: AtomicU64,
}

/// The tree checks and what they found, each finding with its frame's ordinal.
pub(crate) struct TreeRun {
    pub(super) check: TreeCheck,
    pub(super) found: Vec<(u64, TreeFinding)>,
    pub(super) omitted: u64,
    max: usize,
    out: Vec<TreeFinding>,
    progress: Arc<Progress>,
}

/// Steps in walk order (a batch's buffer goes back to the walk to be filled again: no
/// allocation per entry).
#[derive(Default)]
pub(super) struct Batch {
    ops: Vec<(u64, TreeOp)>,
}

impl TreeRun {
    fn apply_batch(&mut self, batch: &mut Batch) {
        for (ord, op) in batch.ops.drain(..) {
            self.apply(ord, op);
        }
    }

    /// The ordinal of the frame of its first finding (`u64::MAX`: none).
    pub(super) fn first(&self) -> u64 {
        self.progress.first.load(Ordering::Acquire)
    }

    fn apply(&mut self, ord: u64, op: TreeOp) {
        match op {
            TreeOp::Leaf(leaf) => self.check.push(leaf, &mut self.out),
            TreeOp::Frame { at, size, root } => {
                let have = self.check.root();
                if size != at || root != have {
                    self.out.push((
                        FindingKind::StoreError,
                        at,
                        format!(
                            "a tree frame records size {size} root {}, but the {at} entries read have root {}",
                            b64(&root),
                            b64(&have)
                        ),
                    ));
                }
            }
            TreeOp::Cosigned { bytes, at } => self.check.cosigned(&bytes, at, &mut self.out),
            TreeOp::SignedEnd {
                ledger,
                end,
                checkpoints,
                altered,
                max_findings,
            } => {
                // Kept, as inline, when fewer than `max_findings` findings stand before
                // it: its index among the chain's, and the tree's made no later than it.
                let altered = altered.iter().any(|&(o, i)| {
                    i + self.found.iter().filter(|(t, _)| *t <= o).count() < max_findings
                });
                self.check
                    .signed_end(ledger, &end, checkpoints, altered, &mut self.out);
            }
        }
        self.found_at(ord);
    }

    /// Keep what the step at `ord` found.
    fn found_at(&mut self, ord: u64) {
        if self.out.is_empty() {
            return;
        }
        let _ = self.progress.first.compare_exchange(
            u64::MAX,
            ord,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        for f in self.out.drain(..) {
            if self.found.len() < self.max {
                self.found.push((ord, f));
            } else {
                self.omitted += 1;
            }
        }
    }
}

/// Where the walk sends its tree steps: applied at once, or batched to the tree thread.
pub(super) struct TreeFeed {
    inline: Option<TreeRun>,
    tx: Option<SyncSender<Batch>>,
    /// Batches the tree thread is done with.
    spent: Option<Receiver<Batch>>,
    batch: Batch,
    progress: Arc<Progress>,
}

/// The tree thread's body: apply every batch in order, then hand the run back.
pub(super) type TreeThread = Box<dyn FnOnce() -> TreeRun + Send>;

impl TreeFeed {
    /// Feed `check`: on a thread of its own (`threaded`: run the returned body on it) or
    /// inline.
    pub(super) fn new(
        check: TreeCheck,
        max_findings: usize,
        threaded: bool,
    ) -> (TreeFeed, Option<TreeThread>) {
        let progress = Arc::new(Progress {
            done: AtomicU64::new(0),
            first: AtomicU64::new(u64::MAX),
        });
        let run = TreeRun {
            check,
            found: Vec::new(),
            omitted: 0,
            max: max_findings,
            out: Vec::new(),
            progress: Arc::clone(&progress),
        };
        if !threaded {
            let feed = TreeFeed {
                inline: Some(run),
                tx: None,
                spent: None,
                batch: Batch::default(),
                progress,
            };
            return (feed, None);
        }
        let (tx, rx) = mpsc::sync_channel(IN_FLIGHT);
        let (spent_tx, spent) = mpsc::channel();
        let body: TreeThread = Box::new(move || work(run, rx, spent_tx));
        let feed = TreeFeed {
            inline: None,
            tx: Some(tx),
            spent: Some(spent),
            batch: Batch::default(),
            progress,
        };
        (feed, Some(body))
    }

    /// The next entry's leaf hash, read at the frame with ordinal `ord`.
    pub(super) fn leaf(&mut self, ord: u64, leaf: TreeHash) {
        self.push(ord, TreeOp::Leaf(leaf));
    }

    /// The next step, made at the frame with ordinal `ord`.
    pub(super) fn push(&mut self, ord: u64, op: TreeOp) {
        if let Some(run) = &mut self.inline {
            run.apply(ord, op);
            self.progress.done.store(ord + 1, Ordering::Release);
            return;
        }
        self.batch.ops.push((ord, op));
        if self.batch.ops.len() >= BATCH {
            self.send();
        }
    }

    fn send(&mut self) {
        if self.batch.ops.is_empty() {
            return;
        }
        // A spent batch's buffer if one is back, else a new one: at most
        // IN_FLIGHT + 2 batches ever exist.
        let fresh = self
            .spent
            .as_ref()
            .and_then(|s| s.try_recv().ok())
            .unwrap_or_else(|| Batch {
                ops: Vec::with_capacity(BATCH),
            });
        let batch = std::mem::replace(&mut self.batch, fresh);
        if let Some(tx) = &self.tx {
            // Blocks while IN_FLIGHT batches wait: bounded memory. A tree thread that
            // panicked is seen at the end (its join).
            let _ = tx.send(batch);
        }
    }

    /// The ordinal of the tree's first finding so far, and the ordinal before which it
    /// has checked everything.
    pub(super) fn progress(&self) -> (u64, u64) {
        // `done` first: the tree thread sets `first` before it moves `done` past it, so
        // a finding before the `done` read here is seen by the `first` read after it.
        let done = self.progress.done.load(Ordering::Acquire);
        (self.progress.first.load(Ordering::Acquire), done)
    }

    /// Send what is left and stop feeding; the inline run, if that is where it ran.
    pub(super) fn close(&mut self) -> Option<TreeRun> {
        self.send();
        self.tx = None;
        self.inline.take()
    }
}

fn work(mut run: TreeRun, rx: Receiver<Batch>, spent: mpsc::Sender<Batch>) -> TreeRun {
    for mut batch in rx {
        let last = batch.ops.last().map(|(ord, _)| *ord);
        run.apply_batch(&mut batch);
        if let Some(ord) = last {
            run.progress.done.store(ord + 1, Ordering::Release);
        }
        // The walk may have stopped taking them back (it is closing).
        let _ = spent.send(batch);
    }
    run
}

/// The checkpoints the walk sealed while the tree had not yet checked the frames before
/// them, with what was sealed before each (to be restored should the tree find something
/// before it).
#[derive(Default)]
pub(super) struct Unconfirmed {
    sealed: VecDeque<(u64, u64, Option<Checkpoint>)>,
}

impl Unconfirmed {
    /// The checkpoint read at ordinal `ord` was sealed; `before` is what was.
    pub(super) fn sealed(&mut self, ord: u64, before: (u64, Option<Checkpoint>)) {
        self.sealed.push_back((ord, before.0, before.1));
    }

    /// The tree has checked every frame before `done`, and made its first finding at
    /// `first`. Returns what was sealed before the first checkpoint read after `first`,
    /// to be restored (nothing after a finding is sealed), if one was.
    pub(super) fn settle(&mut self, first: u64, done: u64) -> Option<(u64, Option<Checkpoint>)> {
        if first != u64::MAX {
            return self
                .sealed
                .drain(..)
                .find(|(o, _, _)| *o > first)
                .map(|(_, size, cp)| (size, cp));
        }
        while self.sealed.front().is_some_and(|(o, _, _)| *o < done) {
            self.sealed.pop_front();
        }
        None
    }
}

/// The walk's findings and the tree's, in the order an inline walk made them (the tree's
/// first at one ordinal), cut at `max`: the findings kept, and how many were not.
pub(super) fn merge(
    chain: Vec<(u64, Finding)>,
    tree: Vec<(u64, Finding)>,
    max: usize,
) -> (Vec<Finding>, u64) {
    let mut all: Vec<(u64, u8, Finding)> = Vec::with_capacity(chain.len() + tree.len());
    all.extend(tree.into_iter().map(|(o, f)| (o, 0, f)));
    all.extend(chain.into_iter().map(|(o, f)| (o, 1, f)));
    // Stable: each list keeps its own order at one ordinal.
    all.sort_by_key(|(o, class, _)| (*o, *class));
    let cut = all.len().saturating_sub(max) as u64;
    (all.into_iter().take(max).map(|(_, _, f)| f).collect(), cut)
}
