//! The chain walk: one streaming pass over a ledger's frames.
//!
//! Integrity needs only the ledger's public key: strict decoding, ledger id, seq
//! continuity, hash links, genesis, epoch certificates, checkpoints, anchors, tail.
//! With the auditor key each decision is also decrypted (in parallel batches) and checked
//! against docs/FORMAT.md. Memory is constant in the number of entries: one hash, the
//! epoch keys (one per epoch), a bounded batch, and at most `max_findings` findings.
//!
//! `source` yields the frames; this module drives the walk and delivers events; `entry`
//! checks each entry, `seal` each checkpoint (both add steps to the walk).

mod entry;
mod seal;
mod source;
mod treefeed;

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use tally_ledger::export::ExportError;
use tally_ledger::format::{ChainRule, Hash, HEADER_LEN};
use tally_ledger::keys::{AuditorKey, DataKey, LedgerPublic};
use tally_ledger::{Checkpoint, Decision, Frame, LedgerId};

use crate::event::Event;
use crate::finding::{Finding, FindingKind, Hashes};
use crate::report::{AnchorResult, AnchorStatus, KeyMismatch, Report, Tail, TornWrite};
use crate::tree::{TreeAnchor, TreeCheck, TreeFinding};
use tally_ledger::tlog::policy::Policy;
use treefeed::{TreeFeed, TreeOp, TreeRun, Unconfirmed};

pub use source::{export_frames, ledger_frames, SourceError};

/// What the verifier checks against.
pub struct Options {
    /// The ledger's public verification key (`ledger.pub`).
    pub public: LedgerPublic,
    /// The auditor's decryption key, to decrypt and check every decision.
    pub auditor: Option<AuditorKey>,
    /// Checkpoints held elsewhere that the ledger must contain.
    pub anchors: Vec<Checkpoint>,
    /// Fail (exit 3) unless at least one anchor is given and matched.
    pub require_anchor: bool,
    /// Findings kept in the report; more are counted, not kept.
    pub max_findings: usize,
    /// Threads for decryption.
    pub threads: usize,
    /// C2SP checkpoints the ledger must contain (anchors, witnesses' views): matched by
    /// Merkle root at their size.
    pub tree_anchors: Vec<TreeAnchor>,
    /// The witnesses and quorum whose cosignatures the ledger's cosigned checkpoints are
    /// judged by (`--witness-policy`): without a quorum on one of them, incomplete.
    pub witness_policy: Option<Policy>,
    /// Run the Merkle-tree checks (SHA-256 of every entry) on a thread of their own,
    /// beside the chain walk (BLAKE3): the same report, sooner on a second core.
    pub tree_thread: bool,
}

impl Options {
    /// Options with defaults: no auditor key, no anchors, 1000 findings, 2 threads.
    pub fn new(public: LedgerPublic) -> Options {
        Options {
            public,
            auditor: None,
            anchors: Vec::new(),
            require_anchor: false,
            max_findings: 1000,
            threads: 2,
            tree_anchors: Vec::new(),
            witness_policy: None,
            tree_thread: true,
        }
    }
}

const BATCH: usize = 512;

/// A decision entry queued for decryption, with what the walk read of its header (the
/// workers do not decode it again).
struct Pending {
    seq: u64,
    wall_ms: u64,
    epoch: u32,
    nonce: [u8; 24],
    key: Arc<DataKey>,
    /// The whole entry, as decoded by the walk: header, then body.
    bytes: Vec<u8>,
}

type Opened = Vec<Result<Box<Decision>, String>>;

/// The decryption pipeline: batches go out to worker threads, results come back in any
/// order and are delivered in batch order. At most `2 * threads` batches are in flight.
struct Pipeline {
    work: Option<SyncSender<(u64, Vec<Pending>)>>,
    done: Receiver<(u64, Vec<Pending>, Opened)>,
    sent: u64,
    delivered: u64,
    reorder: BTreeMap<u64, (Vec<Pending>, Opened)>,
}

impl Pipeline {
    /// `threads` decryption workers on `scope`, waiting for batches.
    fn start<'scope>(scope: &'scope std::thread::Scope<'scope, '_>, threads: usize) -> Pipeline {
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

struct Walk<'a> {
    opts: &'a Options,
    ledger_id: LedgerId,
    /// Entries read so far: where the next entry stands, and the seq findings name.
    position: u64,
    /// The seq the chain expects next (follows the entries' claims after a break, so one
    /// duplicate or gap is one finding, not one per later entry).
    next_seq: u64,
    head: Hash,
    /// How entries are chained: the current rule unless the source announced another.
    chain: ChainRule,
    head_epoch: u32,
    head_wall: u64,
    epoch_keys: Vec<[u8; 32]>,
    data_keys: HashMap<u32, Arc<DataKey>>,
    decrypt: bool,
    batch: Vec<Pending>,
    pipeline: Option<Pipeline>,
    decisions: u64,
    decrypted: u64,
    /// The walk's own findings, each with the ordinal of the frame it was made at (the
    /// tree's are merged in at the end: `treefeed`).
    findings: Vec<Finding>,
    ordinals: Vec<u64>,
    omitted: u64,
    broken: bool,
    /// The ordinal of the frame being read.
    ordinal: u64,
    /// Checkpoints sealed that the tree has not yet caught up with.
    unconfirmed: Unconfirmed,
    sealed: u64,
    last_checkpoint: Option<Checkpoint>,
    anchors: Vec<(Checkpoint, Option<AnchorStatus>)>,
    auditor_mismatch: bool,
    /// Genesis belongs to another ledger than `ledger.pub` (reported once).
    foreign: bool,
    key_mismatch: Option<KeyMismatch>,
    /// The full hashes of the mismatch about to be reported (taken by the next finding).
    hashes: Option<Hashes>,
    /// Stored checkpoints at the current position (one is honest: the store keeps one
    /// per size), and the first head seen there (a checkpoint's or an anchor's).
    checkpoints_here: u64,
    head_here: Option<Hash>,
    /// The text of the last checkpoint read here, and copies of one found here (with the
    /// index of their finding).
    text_here: Option<Vec<u8>>,
    duplicates_here: u64,
    duplicate: Option<usize>,
    tail: Tail,
    torn_writes: Vec<TornWrite>,
    /// The Merkle tree of the entries read, and the checks made against it.
    tree: TreeFeed,
    tree_out: Vec<TreeFinding>,
    /// Whether the log key is known (an export's unsigned end is then incomplete).
    has_log_key: bool,
    /// Checkpoints read (for an export's signed end).
    checkpoints_read: u64,
    /// Each run's last decision seq, and whether it carried a run link.
    links: crate::hash::Map<String, (u64, bool)>,
    /// Decisions that did not decrypt or were invalid (a link to one is not a finding).
    unreadable: crate::hash::Set<u64>,
    /// Whether the entry read last had no finding of its own (its header, seq and link
    /// all as the chain expects): then a checkpoint right after it that signs another
    /// head means its bytes were changed.
    last_clean: bool,
    /// The last broken link, while no valid checkpoint has yet vouched for the entries
    /// from it on. Once one does, that entry's previous-hash is what was written, so the
    /// entry before it is the one whose bytes were changed.
    suspect: Option<Suspect>,
    /// A validly signed checkpoint here whose head is not the hash of the clean entry
    /// right before it, until the walk leaves this position.
    disputed: Option<Disputed>,
}

/// A validly signed checkpoint of size `n` that signs another head than the entry right
/// before it hashes to, while that entry's own header and link were as the chain
/// expects: either the entry's bytes were changed after they were sealed, or whoever
/// holds the epoch's key signed a head that was never the chain's. A second valid
/// checkpoint of this size that agrees with the chain says the latter (a fork); without
/// one, the signature stands and the entry was changed.
struct Disputed {
    /// The checkpoint's size, and the position of the entry before it.
    n: u64,
    entry: u64,
    /// The entry's hash as stored, and the head the checkpoint signs.
    stored: Hash,
    signed: Hash,
    /// The checkpoint's finding, should the checkpoint turn out to be the odd one.
    mismatch: String,
}

/// A broken link at `link_at`: either that entry's previous-hash or the bytes of the
/// entry before it were changed, and only a valid checkpoint after it can tell which.
struct Suspect {
    /// The position of the entry whose link broke.
    link_at: u64,
    /// The index of its `broken_link` finding (None if it was past `max_findings`).
    finding: Option<usize>,
    /// Whether the entry before it had no finding of its own.
    before_clean: bool,
    /// The hash of the entry before it as stored, and the hash the link records.
    stored: Hash,
    linked: Hash,
}

/// Verify a ledger from its frames. `sink` receives every decrypted, valid decision in
/// seq order (only with an auditor key); `progress` is called with the entry count now
/// and then.
pub fn verify(
    frames: impl Iterator<Item = Result<Frame, SourceError>>,
    opts: &Options,
    mut sink: impl FnMut(Event),
    mut progress: impl FnMut(u64),
) -> Report {
    let mut anchors: Vec<(Checkpoint, Option<AnchorStatus>)> =
        opts.anchors.iter().cloned().map(|a| (a, None)).collect();
    anchors.sort_by_key(|(a, _)| a.size);
    let mut tree_out = Vec::new();
    let tree = TreeCheck::new(
        opts.public.ledger_id,
        opts.public.log_key.clone(),
        opts.witness_policy.clone(),
        &opts.tree_anchors,
        &mut tree_out,
    );
    let has_log_key = tree.has_log_key();
    let (tree, tree_body) = TreeFeed::new(tree, opts.max_findings, opts.tree_thread);
    std::thread::scope(|scope| {
        let tree_thread = tree_body.map(|body| scope.spawn(body));
        let pipeline = opts
            .auditor
            .as_ref()
            .map(|_| Pipeline::start(scope, opts.threads));
        let mut w = Walk::new(opts, anchors, (tree, tree_out), has_log_key, pipeline);
        w.drain_tree();
        for frame in frames {
            w.frame(frame, &mut sink, &mut progress);
        }
        w.flush(&mut sink);
        w.ordinal += 1;
        w.drain(&mut sink);
        progress(w.position);
        let run = match (w.tree.close(), tree_thread) {
            (Some(run), _) => run,
            (None, Some(t)) => t
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            (None, None) => unreachable!("the tree runs inline or on its thread"),
        };
        w.finish(run)
    })
}

impl<'a> Walk<'a> {
    /// A walk before its first frame.
    fn new(
        opts: &'a Options,
        anchors: Vec<(Checkpoint, Option<AnchorStatus>)>,
        (tree, tree_out): (TreeFeed, Vec<TreeFinding>),
        has_log_key: bool,
        pipeline: Option<Pipeline>,
    ) -> Walk<'a> {
        Walk {
            opts,
            ledger_id: opts.public.ledger_id,
            position: 0,
            next_seq: 0,
            head: Hash::default(),
            chain: ChainRule::LeafHash,
            head_epoch: 0,
            head_wall: 0,
            epoch_keys: Vec::new(),
            data_keys: HashMap::new(),
            decrypt: opts.auditor.is_some(),
            batch: Vec::new(),
            pipeline,
            decisions: 0,
            decrypted: 0,
            findings: Vec::new(),
            ordinals: Vec::new(),
            omitted: 0,
            broken: false,
            ordinal: 0,
            unconfirmed: Unconfirmed::default(),
            sealed: 0,
            last_checkpoint: None,
            anchors,
            auditor_mismatch: false,
            foreign: false,
            key_mismatch: None,
            hashes: None,
            checkpoints_here: 0,
            head_here: None,
            text_here: None,
            duplicates_here: 0,
            duplicate: None,
            tail: Tail::Complete,
            torn_writes: Vec::new(),
            tree,
            tree_out,
            has_log_key,
            checkpoints_read: 0,
            links: crate::hash::Map::default(),
            unreadable: crate::hash::Set::default(),
            last_clean: false,
            suspect: None,
            disputed: None,
        }
    }

    /// Read one frame: an entry checked (and queued to decrypt), a checkpoint sealed, or
    /// what the source says of itself.
    fn frame(
        &mut self,
        frame: Result<Frame, SourceError>,
        sink: &mut impl FnMut(Event),
        progress: &mut impl FnMut(u64),
    ) {
        self.ordinal += 1;
        match frame {
            Ok(Frame::Entry(bytes)) => {
                self.entry(bytes);
                if self.batch.len() >= BATCH {
                    self.flush(sink);
                }
                if self.position.is_multiple_of(65_536) {
                    progress(self.position);
                }
            }
            Ok(Frame::Checkpoint(text)) => {
                self.checkpoints_read += 1;
                self.checkpoint(&text)
            }
            Ok(Frame::Cosigned(bytes)) => {
                let at = self.position;
                self.tree.push(self.ordinal, TreeOp::Cosigned { bytes, at });
            }
            Err(SourceError::SignedEnd(end)) => self.signed_end(end),
            Err(SourceError::TreeFrame { size, root }) => {
                let at = self.position;
                self.tree
                    .push(self.ordinal, TreeOp::Frame { at, size, root });
            }
            Err(SourceError::Chain(rule)) if self.ordinal == 1 => self.chain = rule,
            Err(SourceError::Chain(_)) => self.find(
                FindingKind::StoreError,
                self.position,
                "the source named its chain rule after its first frame",
            ),
            Err(SourceError::PlainEnd) => {
                if self.has_log_key {
                    self.tail = Tail::UnsignedEnd;
                }
            }
            Err(SourceError::Export(ExportError::CutClean { offset })) => {
                self.tail = Tail::CutClean { offset };
            }
            // A copy cut inside a frame is incomplete evidence, like one cut between
            // frames: what is there is judged, and nothing in it is contradicted.
            Err(SourceError::Export(ExportError::Torn { offset, missing })) => {
                self.tail = Tail::Torn { offset, missing };
            }
            Err(SourceError::FrameOverrunsEnd { offset, missing }) => self.find(
                FindingKind::ExportMalformed,
                self.position,
                format!(
                    "the frame at byte {offset} claims {missing} bytes more than the export holds, \
                     yet the export ends with its end marker: the frame's length was altered"
                ),
            ),
            Err(SourceError::Export(e)) => {
                self.find(FindingKind::ExportMalformed, self.position, e.to_string())
            }
            Err(SourceError::Store(e)) => self.find(FindingKind::StoreError, self.position, e),
            Err(SourceError::TornWrite {
                segment,
                offset,
                len,
            }) => self.torn_writes.push(TornWrite {
                segment,
                offset,
                bytes: len,
                before_seq: self.position,
            }),
        }
    }

    fn find(&mut self, kind: FindingKind, seq: u64, detail: impl Into<String>) {
        self.broken = true;
        if self.findings.len() < self.opts.max_findings {
            self.findings.push(Finding {
                kind,
                seq,
                detail: detail.into(),
                hashes: self.hashes.take(),
            });
            self.ordinals.push(self.ordinal);
        } else {
            self.omitted += 1;
        }
        self.hashes = None;
    }

    /// Turn the tree checks' findings into the walk's.
    fn drain_tree(&mut self) {
        for (kind, seq, detail) in std::mem::take(&mut self.tree_out) {
            self.find(kind, seq, detail);
        }
    }

    /// A decrypted decision's run link: `prev_seq` must be its run's previous decision.
    fn link(&mut self, seq: u64, d: &Decision) {
        if d.run.is_empty() {
            return;
        }
        // One look-up of the run's name: its entry is read and updated in place; the
        // name is copied once, at the run's first decision.
        let last = (seq, d.prev_seq.is_some());
        let before = match self.links.get_mut(d.run.as_str()) {
            Some(l) => Some(std::mem::replace(l, last)),
            None => {
                self.links.insert(d.run.clone(), last);
                None
            }
        };
        let broken = match (d.prev_seq, before) {
            // A link to a decision that could not be read: that one is the finding.
            (Some(p), _) if !self.unreadable.is_empty() && self.unreadable.contains(&p) => None,
            (Some(p), Some((last, _))) if p != last => Some(format!(
                "names seq {p} as its run's previous decision, but that is seq {last}"
            )),
            (Some(p), None) => Some(format!(
                "names seq {p} as its run's previous decision, but it is the run's first here"
            )),
            (None, Some((last, true))) => Some(format!(
                "carries no link to its run's previous decision (seq {last})"
            )),
            _ => None,
        };
        if let Some(why) = broken {
            self.find(FindingKind::RunLinkBroken, seq, why);
        }
    }

    /// Findings made so far, kept or counted.
    fn found(&self) -> u64 {
        self.findings.len() as u64 + self.omitted
    }

    /// Hand the current batch to the pipeline and deliver whatever is ready.
    fn flush(&mut self, sink: &mut impl FnMut(Event)) {
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
        self.deliver(sink);
    }

    /// Wait for every batch in flight and deliver it.
    fn drain(&mut self, sink: &mut impl FnMut(Event)) {
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
        self.deliver(sink);
    }

    /// Deliver finished batches in order: events to the sink, failures as findings.
    fn deliver(&mut self, sink: &mut impl FnMut(Event)) {
        loop {
            let Some(p) = &mut self.pipeline else { return };
            let Some((batch, opened)) = p.reorder.remove(&p.delivered) else {
                return;
            };
            p.delivered += 1;
            for (p, r) in batch.into_iter().zip(opened) {
                match r {
                    Ok(decision) => {
                        self.decrypted += 1;
                        self.link(p.seq, &decision);
                        sink(Event {
                            seq: crate::event::Seq::single(p.seq),
                            wall_ms: p.wall_ms,
                            epoch: p.epoch,
                            decision,
                        });
                    }
                    Err(why) => {
                        self.unreadable.insert(p.seq);
                        match why.strip_prefix("invalid: ") {
                            Some(why) => self.find(FindingKind::InvalidDecision, p.seq, why),
                            None => self.find(FindingKind::Undecryptable, p.seq, why),
                        }
                    }
                }
            }
        }
    }

    /// Whether the tree has found something: nothing read after its first finding is
    /// sealed (what was sealed since is taken back). Call before sealing a checkpoint.
    pub(super) fn tree_broken(&mut self) {
        let (first, done) = self.tree.progress();
        if let Some((size, cp)) = self.unconfirmed.settle(first, done) {
            self.sealed = size;
            self.last_checkpoint = cp;
        }
        if first != u64::MAX {
            self.broken = true;
        }
    }

    /// Seal the checkpoint `cp` (read at this ordinal), keeping what was sealed before
    /// until the tree has checked the frames before it.
    pub(super) fn seal(&mut self, cp: Checkpoint) {
        let before = (self.sealed, self.last_checkpoint.take());
        self.unconfirmed.sealed(self.ordinal, before);
        self.sealed = cp.size;
        self.last_checkpoint = Some(cp);
    }

    /// The export's signed end: the tree checks it against the entries read.
    fn signed_end(&mut self, end: tally_ledger::export::SignedEnd) {
        // An entry already named as changed (and kept) is in the tree: the root it
        // changes is that finding, not another.
        let altered = self
            .findings
            .iter()
            .enumerate()
            .filter(|(_, f)| f.kind == FindingKind::EntryAltered)
            .map(|(i, _)| (self.ordinals[i], i))
            .collect();
        let op = TreeOp::SignedEnd {
            ledger: self.ledger_id,
            end: Box::new(end),
            checkpoints: self.checkpoints_read,
            altered,
            max_findings: self.opts.max_findings,
        };
        self.tree.push(self.ordinal, op);
    }

    /// The tree has checked everything: take back what its first finding unseals, and
    /// merge its findings with the walk's. Gives the tree's checks, to finish.
    fn merge_tree(&mut self, mut run: TreeRun) -> TreeCheck {
        // The tree has checked everything: take back what its first finding unseals,
        // and merge its findings with the walk's.
        let first = run.first();
        if first != u64::MAX {
            // (Its findings may all be past `max_findings`: it still found them.)
            self.broken = true;
            if let Some((size, cp)) = self.unconfirmed.settle(first, u64::MAX) {
                self.sealed = size;
                self.last_checkpoint = cp;
            }
        }
        let chain: Vec<(u64, Finding)> = std::mem::take(&mut self.ordinals)
            .into_iter()
            .zip(std::mem::take(&mut self.findings))
            .collect();
        let tree: Vec<(u64, Finding)> = std::mem::take(&mut run.found)
            .into_iter()
            .map(|(o, (kind, seq, detail))| {
                (
                    o,
                    Finding {
                        kind,
                        seq,
                        detail,
                        hashes: None,
                    },
                )
            })
            .collect();
        let (kept, cut) = treefeed::merge(chain, tree, self.opts.max_findings);
        self.omitted += run.omitted + cut;
        self.ordinals = vec![self.ordinal; kept.len()];
        self.findings = kept;
        run.check
    }

    /// Anchors the walk never met: each a finding.
    fn missing_anchors(&mut self) {
        let n = self.position;
        for i in 0..self.anchors.len() {
            if self.anchors[i].1.is_none() {
                let a = self.anchors[i].0.clone();
                let why = if a.ledger_id != self.ledger_id {
                    format!(
                        "anchor belongs to ledger {}, not {}",
                        a.ledger_id, self.ledger_id
                    )
                } else {
                    format!(
                        "anchor seals {} entries but the ledger has {n}: it was truncated or rolled back",
                        a.size
                    )
                };
                let kind = if a.ledger_id != self.ledger_id {
                    FindingKind::AnchorInvalid
                } else {
                    FindingKind::AnchorMissing
                };
                self.find(kind, n.min(a.size), why);
                self.anchors[i].1 = Some(AnchorStatus::Missing);
            }
        }
    }

    fn finish(mut self, run: TreeRun) -> Report {
        // A disputed checkpoint after the last entry: its signature stands.
        self.settle(true);
        self.end_position();
        let mut tree_check = self.merge_tree(run);
        let tree_anchors = tree_check.finish(&mut self.tree_out);
        self.drain_tree();
        self.missing_anchors();
        let n = self.position;
        if n == 0
            && self.findings.is_empty()
            && !matches!(self.tail, Tail::CutClean { .. } | Tail::Torn { .. })
        {
            self.find(FindingKind::BadGenesis, 0, "the ledger holds no entries");
        }
        // By position; at one position the chain's own findings before what decrypting
        // found (which arrives from the workers in no fixed order relative to them).
        self.findings.sort_by_key(|f| {
            let decrypted = matches!(
                f.kind,
                FindingKind::Undecryptable | FindingKind::InvalidDecision
            );
            (f.seq, decrypted)
        });
        let unsealed = n.saturating_sub(self.sealed);
        let tail = match self.tail {
            Tail::Complete if unsealed > 0 => Tail::Unsealed {
                from: self.sealed,
                count: unsealed,
            },
            t => t,
        };
        Report {
            ledger_id: self.ledger_id.to_string(),
            entries: n,
            decisions: self.decisions,
            epochs: self.epoch_keys.len() as u32,
            sealed: self.sealed,
            last_checkpoint: self.last_checkpoint.as_ref().map(Into::into),
            anchors: self
                .anchors
                .iter()
                .map(|(a, s)| AnchorResult {
                    size: a.size,
                    head: a.head.to_string(),
                    status: s.unwrap_or(AnchorStatus::Missing),
                })
                .collect(),
            require_anchor: self.opts.require_anchor,
            decrypted: self.opts.auditor.as_ref().map(|_| self.decrypted),
            auditor_key_mismatch: self.auditor_mismatch,
            key_mismatch: self.key_mismatch,
            findings: self.findings,
            findings_omitted: self.omitted,
            tail,
            torn_writes: self.torn_writes,
            tree_root: tally_ledger::tlog::note::b64(&tree_check.root()),
            tree_anchors,
            witnessed: tree_check.witnessed.take(),
        }
    }
}

fn open(p: &Pending, plain: &mut Vec<u8>) -> Result<Box<Decision>, String> {
    // The walk decoded the entry (exactly one, header then body) before queueing it.
    let (header, body) = p.bytes.split_at(HEADER_LEN);
    p.key
        .open_into(&p.nonce, header, body, plain)
        .map_err(|e| e.to_string())?;
    Decision::from_stored(plain)
        .map(Box::new)
        .map_err(|e| format!("invalid: {e}"))
}

/// Both hashes in full, for the finding's JSON.
fn full(found: &Hash, expected: &Hash) -> Hashes {
    Hashes {
        found: found.to_string(),
        expected: expected.to_string(),
    }
}

/// Two hashes shown as short as possible but never alike: 16 hex digits, or up to the
/// first digit where they differ (and two more), so a message always shows what differs.
fn differing(a: &Hash, b: &Hash) -> (String, String) {
    let (a, b) = (a.to_string(), b.to_string());
    let first = a.bytes().zip(b.bytes()).position(|(x, y)| x != y);
    let len = first.map_or(a.len(), |i| (i + 3).max(16)).min(a.len());
    let cut = |h: &str| {
        if len < h.len() {
            format!("{}…", &h[..len])
        } else {
            h.to_owned()
        }
    };
    (cut(&a), cut(&b))
}
