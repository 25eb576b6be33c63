//! The chain walk: one streaming pass over a ledger's frames.
//!
//! Integrity needs only the ledger's public key: strict decoding, ledger id, seq
//! continuity, hash links, genesis, epoch certificates, checkpoints, anchors, tail.
//! With the auditor key each decision is also decrypted (in parallel batches) and checked
//! against docs/FORMAT.md. Memory is constant in the number of entries: one hash, the
//! epoch keys (one per epoch), a bounded batch, and at most `max_findings` findings.
//!
//! `source` yields the frames; this module drives the walk and delivers events; `entry`
//! checks each entry, `seal` each checkpoint (both add steps to the walk). The walk's
//! state is in parts, each in its own file: `chain` (what the entries established),
//! `sealed` (the checkpoints at the current position, and what is sealed), `decrypt`
//! (data keys, batches, the worker pipeline), `runs` (run links), `findings`.

mod chain;
mod decrypt;
mod entry;
mod findings;
mod runs;
mod seal;
mod sealed;
mod source;
mod treefeed;

use tally_ledger::export::ExportError;
use tally_ledger::format::Hash;
use tally_ledger::keys::{AuditorKey, LedgerPublic};
use tally_ledger::{Checkpoint, Frame};

use crate::event::Event;
use crate::finding::{Finding, FindingKind, Hashes};
use crate::report::{AnchorResult, AnchorStatus, Report, Tail, TornWrite};
use crate::tree::{TreeAnchor, TreeCheck, TreeFinding};
use chain::Chain;
use decrypt::{Decrypt, Pipeline};
use findings::Findings;
use runs::Runs;
use sealed::{Here, Sealed};
use tally_ledger::tlog::policy::Policy;
use treefeed::{TreeFeed, TreeOp, TreeRun};

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

/// The chain walk's state, each part in the file that moves it on: the chain
/// (`entry`; only `chain`'s own methods change it), the checkpoints here and what is
/// sealed (`seal`), decryption, run links, findings, and what the source says of itself
/// (here).
struct Walk<'a> {
    opts: &'a Options,
    /// The ordinal of the frame being read.
    ordinal: u64,
    chain: Chain,
    here: Here,
    sealed: Sealed,
    anchors: Vec<(Checkpoint, Option<AnchorStatus>)>,
    decrypt: Decrypt,
    runs: Runs,
    findings: Findings,
    told: Told,
    /// The Merkle tree of the entries read, and the checks made against it.
    tree: TreeFeed,
    tree_out: Vec<TreeFinding>,
}

/// What the source says of itself besides frames: how it ends, the torn writes it
/// skipped, and what an export's signed end is checked with.
struct Told {
    tail: Tail,
    torn_writes: Vec<TornWrite>,
    /// Whether the log key is known (an export's unsigned end is then incomplete).
    has_log_key: bool,
    /// Checkpoints read (for an export's signed end).
    checkpoints_read: u64,
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
        progress(w.chain.position());
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
            ordinal: 0,
            chain: Chain::new(opts.public.ledger_id),
            here: Here::default(),
            sealed: Sealed::default(),
            anchors,
            decrypt: Decrypt::new(pipeline),
            runs: Runs::default(),
            findings: Findings::new(opts.max_findings),
            told: Told {
                tail: Tail::Complete,
                torn_writes: Vec::new(),
                has_log_key,
                checkpoints_read: 0,
            },
            tree,
            tree_out,
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
                if self.decrypt.batch_full() {
                    self.flush(sink);
                }
                if self.chain.position().is_multiple_of(65_536) {
                    progress(self.chain.position());
                }
            }
            Ok(Frame::Checkpoint(text)) => {
                self.told.checkpoints_read += 1;
                self.checkpoint(&text)
            }
            Ok(Frame::Cosigned(bytes)) => {
                let at = self.chain.position();
                self.tree.push(self.ordinal, TreeOp::Cosigned { bytes, at });
            }
            Err(SourceError::SignedEnd(end)) => self.signed_end(end),
            Err(SourceError::TreeFrame { size, root }) => {
                let at = self.chain.position();
                self.tree
                    .push(self.ordinal, TreeOp::Frame { at, size, root });
            }
            Err(SourceError::Chain(rule)) if self.ordinal == 1 => self.chain.announce(rule),
            Err(SourceError::Chain(_)) => self.find(
                FindingKind::StoreError,
                self.chain.position(),
                "the source named its chain rule after its first frame",
            ),
            Err(SourceError::PlainEnd) => {
                if self.told.has_log_key {
                    self.told.tail = Tail::UnsignedEnd;
                }
            }
            Err(SourceError::Export(ExportError::CutClean { offset })) => {
                self.told.tail = Tail::CutClean { offset };
            }
            // A copy cut inside a frame is incomplete evidence, like one cut between
            // frames: what is there is judged, and nothing in it is contradicted.
            Err(SourceError::Export(ExportError::Torn { offset, missing })) => {
                self.told.tail = Tail::Torn { offset, missing };
            }
            Err(SourceError::FrameOverrunsEnd { offset, missing }) => self.find(
                FindingKind::ExportMalformed,
                self.chain.position(),
                format!(
                    "the frame at byte {offset} claims {missing} bytes more than the export holds, \
                     yet the export ends with its end marker: the frame's length was altered"
                ),
            ),
            Err(SourceError::Export(e)) => self.find(
                FindingKind::ExportMalformed,
                self.chain.position(),
                e.to_string(),
            ),
            Err(SourceError::Store(e)) => {
                self.find(FindingKind::StoreError, self.chain.position(), e)
            }
            Err(SourceError::TornWrite {
                segment,
                offset,
                len,
            }) => self.told.torn_writes.push(TornWrite {
                segment,
                offset,
                bytes: len,
                before_seq: self.chain.position(),
            }),
        }
    }

    fn find(&mut self, kind: FindingKind, seq: u64, detail: impl Into<String>) {
        self.findings.find(self.ordinal, kind, seq, detail.into());
    }

    /// Turn the tree checks' findings into the walk's.
    fn drain_tree(&mut self) {
        for (kind, seq, detail) in std::mem::take(&mut self.tree_out) {
            self.find(kind, seq, detail);
        }
    }

    /// Findings made so far, kept or counted.
    fn found(&self) -> u64 {
        self.findings.found()
    }

    /// Hand the current batch to the pipeline and deliver whatever is ready.
    fn flush(&mut self, sink: &mut impl FnMut(Event)) {
        self.decrypt.send();
        self.deliver(sink);
    }

    /// Wait for every batch in flight and deliver it.
    fn drain(&mut self, sink: &mut impl FnMut(Event)) {
        self.decrypt.wait();
        self.deliver(sink);
    }

    /// Deliver finished batches in order: events to the sink (each run link judged),
    /// failures as findings.
    fn deliver(&mut self, sink: &mut impl FnMut(Event)) {
        while let Some((batch, opened)) = self.decrypt.next_ready() {
            for (p, r) in batch.into_iter().zip(opened) {
                match r {
                    Ok(decision) => {
                        if let Some(why) = self.runs.link(p.seq, &decision) {
                            self.find(FindingKind::RunLinkBroken, p.seq, why);
                        }
                        sink(Event {
                            seq: crate::event::Seq::single(p.seq),
                            wall_ms: p.wall_ms,
                            epoch: p.epoch,
                            decision,
                        });
                    }
                    Err(why) => {
                        self.runs.unreadable(p.seq);
                        match why.strip_prefix("invalid: ") {
                            Some(why) => self.find(FindingKind::InvalidDecision, p.seq, why),
                            None => self.find(FindingKind::Undecryptable, p.seq, why),
                        }
                    }
                }
            }
        }
    }

    /// The export's signed end: the tree checks it against the entries read.
    fn signed_end(&mut self, end: tally_ledger::export::SignedEnd) {
        // An entry already named as changed (and kept) is in the tree: the root it
        // changes is that finding, not another.
        let altered = (self.findings.kept.iter())
            .enumerate()
            .filter(|(_, f)| f.kind == FindingKind::EntryAltered)
            .map(|(i, _)| (self.findings.ordinals[i], i))
            .collect();
        let op = TreeOp::SignedEnd {
            ledger: self.chain.ledger_id(),
            end: Box::new(end),
            checkpoints: self.told.checkpoints_read,
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
            self.findings.broken = true;
            self.sealed.settle(first, u64::MAX);
        }
        let chain: Vec<(u64, Finding)> = std::mem::take(&mut self.findings.ordinals)
            .into_iter()
            .zip(std::mem::take(&mut self.findings.kept))
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
        self.findings.omitted += run.omitted + cut;
        self.findings.ordinals = vec![self.ordinal; kept.len()];
        self.findings.kept = kept;
        run.check
    }

    fn finish(mut self, run: TreeRun) -> Report {
        // A disputed checkpoint after the last entry: its signature stands.
        self.settle(true);
        self.end_position();
        let mut tree_check = self.merge_tree(run);
        let tree_anchors = tree_check.finish(&mut self.tree_out);
        self.drain_tree();
        self.missing_anchors();
        let n = self.chain.position();
        if n == 0
            && self.findings.kept.is_empty()
            && !matches!(self.told.tail, Tail::CutClean { .. } | Tail::Torn { .. })
        {
            self.find(FindingKind::BadGenesis, 0, "the ledger holds no entries");
        }
        // By position; at one position the chain's own findings before what decrypting
        // found (which arrives from the workers in no fixed order relative to them).
        self.findings.kept.sort_by_key(|f| {
            let decrypted = matches!(
                f.kind,
                FindingKind::Undecryptable | FindingKind::InvalidDecision
            );
            (f.seq, decrypted)
        });
        let unsealed = n.saturating_sub(self.sealed.size);
        let tail = match self.told.tail {
            Tail::Complete if unsealed > 0 => Tail::Unsealed {
                from: self.sealed.size,
                count: unsealed,
            },
            t => t,
        };
        Report {
            ledger_id: self.chain.ledger_id().to_string(),
            entries: n,
            decisions: self.chain.decisions(),
            epochs: self.chain.epoch_keys().len() as u32,
            sealed: self.sealed.size,
            last_checkpoint: self.sealed.last.as_ref().map(Into::into),
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
            decrypted: self.opts.auditor.as_ref().map(|_| self.decrypt.decrypted),
            auditor_key_mismatch: self.decrypt.auditor_mismatch,
            key_mismatch: self.chain.key_mismatch().cloned(),
            findings: self.findings.kept,
            findings_omitted: self.findings.omitted,
            tail,
            torn_writes: self.told.torn_writes,
            tree_root: tally_ledger::tlog::note::b64(&tree_check.root()),
            tree_anchors,
            witnessed: tree_check.witnessed.take(),
        }
    }
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
