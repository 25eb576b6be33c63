//! The chain walk: one streaming pass over a ledger's frames.
//!
//! Integrity needs only the ledger's public key: strict decoding, ledger id, seq
//! continuity, hash links, genesis, epoch certificates, checkpoints, anchors, tail.
//! With the auditor key each decision is also decrypted (in parallel batches) and checked
//! against docs/FORMAT.md. Memory is constant in the number of entries: one hash, the
//! epoch keys (one per epoch), a bounded batch, and at most `max_findings` findings.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use tally_ledger::export::{ExportError, ExportReader};
use tally_ledger::format::{entry_hash, Entry, EntryType, Hash};
use tally_ledger::keys::{verify_checkpoint, verify_signature, AuditorKey, DataKey, LedgerPublic};
use tally_ledger::{Checkpoint, Decision, Frame, LedgerId};

use crate::event::Event;
use crate::finding::{Finding, FindingKind, Hashes};
use crate::report::{AnchorResult, AnchorStatus, KeyMismatch, Report, Tail, TornWrite};
use crate::tree::{TreeAnchor, TreeCheck, TreeFinding};
use tally_ledger::export::SignedEnd;
use tally_ledger::tlog::policy::Policy;

/// Where frames come from failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The export file is malformed or cut.
    #[error(transparent)]
    Export(#[from] ExportError),
    /// The store could not be read.
    #[error("store: {0}")]
    Store(String),
    /// A log segment's bytes after its last complete checkpoint: a write that a crash
    /// tore (never sealed, so never acknowledged). Not an error of the chain: the log
    /// resumes in the next segment, and the walk goes on.
    #[error("torn write in segment {segment} at byte {offset} ({len} bytes)")]
    TornWrite {
        /// The segment's number.
        segment: u64,
        /// Where the unsealed bytes start.
        offset: u64,
        /// How many there are.
        len: u64,
    },
    /// A frame claims more bytes than the export holds, yet the export ends with its end
    /// marker: the frame's length was altered (a cut copy never keeps its end marker).
    #[error("frame at byte {offset} claims {missing} bytes past the export's end marker")]
    FrameOverrunsEnd {
        /// Offset of the frame's first byte.
        offset: u64,
        /// Bytes it claims beyond the end of the file.
        missing: u64,
    },
    /// Not an error: the export ended with its signed end marker (read to it whole).
    #[error("the export's signed end")]
    SignedEnd(SignedEnd),
    /// Not an error: the export ended with an end marker the log key did not sign.
    #[error("the export's end marker is not signed")]
    PlainEnd,
    /// Not an error: a log's tree frame, the Merkle tree's size and root its writer
    /// recorded after a group (checked against the entries read).
    #[error("tree frame of size {size}")]
    TreeFrame {
        /// The tree's size.
        size: u64,
        /// Its root.
        root: [u8; 32],
    },
}

/// The frames of an export file, read strictly by [`ExportReader`]. A file that ends
/// inside a frame is a cut copy ([`ExportError::Torn`], incomplete evidence) unless it
/// still ends with a valid end marker: then a frame's length contradicts the file, and
/// the frame is reported as [`SourceError::FrameOverrunsEnd`] (tampering).
pub fn export_frames<R: Read>(
    input: R,
) -> Result<impl Iterator<Item = Result<Frame, SourceError>>, ExportError> {
    let tail = Arc::new(Mutex::new(Vec::with_capacity(2 * SIGNED_END_FRAME_LEN)));
    let reader = ExportReader::new(TailTap {
        input,
        tail: Arc::clone(&tail),
    })?;
    Ok(ExportFrames {
        reader,
        tail,
        failed: false,
        ended: false,
    })
}

/// The frames of an export, then how it ended (signed or not).
struct ExportFrames<R: Read> {
    reader: ExportReader<TailTap<R>>,
    tail: Arc<Mutex<Vec<u8>>>,
    failed: bool,
    ended: bool,
}

impl<R: Read> Iterator for ExportFrames<R> {
    type Item = Result<Frame, SourceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ended {
            return None;
        }
        match self.reader.next() {
            Some(Err(ExportError::Torn { offset, missing }))
                if ends_with_end_marker(&self.tail) =>
            {
                self.failed = true;
                Some(Err(SourceError::FrameOverrunsEnd { offset, missing }))
            }
            Some(Err(e)) => {
                self.failed = true;
                Some(Err(SourceError::from(e)))
            }
            Some(Ok(f)) => Some(Ok(f)),
            None => {
                self.ended = true;
                if self.failed {
                    return None;
                }
                Some(Err(match self.reader.signed_end() {
                    Some(e) => SourceError::SignedEnd(e.clone()),
                    None => SourceError::PlainEnd,
                }))
            }
        }
    }
}

/// The frames of the ledger directory `dir`, read from its log segments in place: no
/// lock taken, no byte written, while a writer may keep appending (each segment is read
/// up to its last complete checkpoint). Torn writes come as [`SourceError::TornWrite`];
/// a segment that does not read as one comes as [`SourceError::Store`]. Fails up front
/// when `dir` holds no log (or one in the old layout, [`tally_ledger::Error::OldLayout`]).
pub fn ledger_frames(
    dir: &std::path::Path,
) -> Result<impl Iterator<Item = Result<Frame, SourceError>>, tally_ledger::Error> {
    use tally_ledger::segment::{Item, LogReader};
    let reader = LogReader::open(dir)?;
    // The latest cosigned checkpoint kept beside the log, read where its size is sealed.
    let cosigned = tally_ledger::tlog::read_cosigned(dir)?.and_then(|n| {
        let size = tally_ledger::tlog::note::TreeHead::parse(&n.text)
            .ok()?
            .size;
        Some((size, n.to_text().into_bytes()))
    });
    let mut pending: Option<Result<Frame, SourceError>> = None;
    let mut items = reader.filter_map(|item| match item {
        Ok(Item::Frame(f)) => Some(Ok(f)),
        Ok(Item::State { .. }) => None,
        Ok(Item::Tree { size, root }) => Some(Err(SourceError::TreeFrame { size, root })),
        Ok(Item::Torn(t)) => Some(Err(SourceError::TornWrite {
            segment: t.segment,
            offset: t.offset,
            len: t.len,
        })),
        Err(e) => Some(Err(SourceError::Store(e.to_string()))),
    });
    let mut cosigned = cosigned;
    Ok(std::iter::from_fn(move || {
        if let Some(p) = pending.take() {
            return Some(p);
        }
        let item = items.next()?;
        if let (Ok(Frame::Checkpoint(t)), Some((size, _))) = (&item, &cosigned) {
            if Checkpoint::from_text(t).map(|c| c.size) == Ok(*size) {
                pending = cosigned.take().map(|(_, b)| Ok(Frame::Cosigned(b)));
            }
        }
        Some(item)
    }))
}

/// An export's end frame: tag, length (16), entry and checkpoint counts.
const END_FRAME_LEN: usize = 1 + 4 + 16;
/// An export's signed end frame: tag, length (112), counts, root, signature.
const SIGNED_END_FRAME_LEN: usize = 1 + 4 + 16 + 32 + 64;

/// A reader that remembers the last [`SIGNED_END_FRAME_LEN`] bytes it read.
struct TailTap<R> {
    input: R,
    tail: Arc<Mutex<Vec<u8>>>,
}

impl<R: Read> Read for TailTap<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.input.read(buf)?;
        if n > 0 {
            if let Ok(mut tail) = self.tail.lock() {
                tail.extend_from_slice(&buf[n.saturating_sub(SIGNED_END_FRAME_LEN)..n]);
                let extra = tail.len().saturating_sub(SIGNED_END_FRAME_LEN);
                tail.drain(..extra);
            }
        }
        Ok(n)
    }
}

/// Whether the bytes read last are a well-formed end frame (plain or signed), judged by
/// the export reader itself (a lone end frame after the magic: it reads as the end, or
/// as counts that do not match an empty export).
fn ends_with_end_marker(tail: &Mutex<Vec<u8>>) -> bool {
    let Ok(tail) = tail.lock() else { return false };
    [END_FRAME_LEN, SIGNED_END_FRAME_LEN].iter().any(|&len| {
        if tail.len() < len {
            return false;
        }
        let mut lone = tally_ledger::format::EXPORT_MAGIC.to_vec();
        lone.extend_from_slice(&tail[tail.len() - len..]);
        let Ok(mut reader) = ExportReader::new(&lone[..]) else {
            return false;
        };
        matches!(
            reader.next(),
            None | Some(Err(ExportError::CountMismatch { .. }))
        )
    })
}

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
        }
    }
}

const BATCH: usize = 512;

struct Pending {
    seq: u64,
    wall_ms: u64,
    epoch: u32,
    key: Arc<DataKey>,
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

struct Walk<'a> {
    opts: &'a Options,
    ledger_id: LedgerId,
    /// Entries read so far: where the next entry stands, and the seq findings name.
    position: u64,
    /// The seq the chain expects next (follows the entries' claims after a break, so one
    /// duplicate or gap is one finding, not one per later entry).
    next_seq: u64,
    head: Hash,
    head_epoch: u32,
    head_wall: u64,
    epoch_keys: Vec<[u8; 32]>,
    data_keys: HashMap<u32, Arc<DataKey>>,
    decrypt: bool,
    batch: Vec<Pending>,
    pipeline: Option<Pipeline>,
    decisions: u64,
    decrypted: u64,
    findings: Vec<Finding>,
    omitted: u64,
    broken: bool,
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
    tree: TreeCheck,
    tree_out: Vec<TreeFinding>,
    /// Checkpoints read (for an export's signed end).
    checkpoints_read: u64,
    /// Each run's last decision seq, and whether it carried a run link.
    links: HashMap<String, (u64, bool)>,
    /// Decisions that did not decrypt or were invalid (a link to one is not a finding).
    unreadable: std::collections::HashSet<u64>,
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
    std::thread::scope(|scope| {
        let pipeline = opts.auditor.as_ref().map(|_| {
            let threads = opts.threads.max(1);
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
        });
        let mut w = Walk {
            opts,
            ledger_id: opts.public.ledger_id,
            position: 0,
            next_seq: 0,
            head: Hash::default(),
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
            omitted: 0,
            broken: false,
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
            checkpoints_read: 0,
            links: HashMap::new(),
            unreadable: std::collections::HashSet::new(),
            last_clean: false,
            suspect: None,
            disputed: None,
        };
        w.drain_tree();
        for frame in frames {
            match frame {
                Ok(Frame::Entry(bytes)) => {
                    w.entry(bytes);
                    if w.batch.len() >= BATCH {
                        w.flush(&mut sink);
                    }
                    if w.position.is_multiple_of(65_536) {
                        progress(w.position);
                    }
                }
                Ok(Frame::Checkpoint(text)) => {
                    w.checkpoints_read += 1;
                    w.checkpoint(&text)
                }
                Ok(Frame::Cosigned(bytes)) => {
                    let at = w.position;
                    w.tree.cosigned(&bytes, at, &mut w.tree_out);
                    w.drain_tree();
                }
                Err(SourceError::SignedEnd(end)) => {
                    let (id, n) = (w.ledger_id, w.checkpoints_read);
                    // An entry already named as changed is in the tree: the root it
                    // changes is that finding, not another.
                    let altered = w
                        .findings
                        .iter()
                        .any(|f| f.kind == FindingKind::EntryAltered);
                    w.tree.signed_end(id, &end, n, altered, &mut w.tree_out);
                    w.drain_tree();
                }
                Err(SourceError::TreeFrame { size, root }) => {
                    let at = w.position;
                    if size != at || root != w.tree.root() {
                        w.find(
                            FindingKind::StoreError,
                            at,
                            format!(
                                "a tree frame records size {size} root {}, but the {at} entries read have root {}",
                                tally_ledger::tlog::note::b64(&root),
                                tally_ledger::tlog::note::b64(&w.tree.root())
                            ),
                        );
                    }
                }
                Err(SourceError::PlainEnd) => {
                    if w.tree.has_log_key() {
                        w.tail = Tail::UnsignedEnd;
                    }
                }
                Err(SourceError::Export(ExportError::CutClean { offset })) => {
                    w.tail = Tail::CutClean { offset };
                }
                // A copy cut inside a frame is incomplete evidence, like one cut between
                // frames: what is there is judged, and nothing in it is contradicted.
                Err(SourceError::Export(ExportError::Torn { offset, missing })) => {
                    w.tail = Tail::Torn { offset, missing };
                }
                Err(SourceError::FrameOverrunsEnd { offset, missing }) => w.find(
                    FindingKind::ExportMalformed,
                    w.position,
                    format!(
                        "the frame at byte {offset} claims {missing} bytes more than the export holds, \
                         yet the export ends with its end marker: the frame's length was altered"
                    ),
                ),
                Err(SourceError::Export(e)) => {
                    w.find(FindingKind::ExportMalformed, w.position, e.to_string())
                }
                Err(SourceError::Store(e)) => w.find(FindingKind::StoreError, w.position, e),
                Err(SourceError::TornWrite {
                    segment,
                    offset,
                    len,
                }) => w.torn_writes.push(TornWrite {
                    segment,
                    offset,
                    bytes: len,
                    before_seq: w.position,
                }),
            }
        }
        w.flush(&mut sink);
        w.drain(&mut sink);
        progress(w.position);
        w.finish()
    })
}

impl Walk<'_> {
    fn find(&mut self, kind: FindingKind, seq: u64, detail: impl Into<String>) {
        self.broken = true;
        if self.findings.len() < self.opts.max_findings {
            self.findings.push(Finding {
                kind,
                seq,
                detail: detail.into(),
                hashes: self.hashes.take(),
            });
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
        let before = self.links.get(&d.run).copied();
        let broken = match (d.prev_seq, before) {
            // A link to a decision that could not be read: that one is the finding.
            (Some(p), _) if self.unreadable.contains(&p) => None,
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
        self.links
            .insert(d.run.clone(), (seq, d.prev_seq.is_some()));
    }

    /// Findings made so far, kept or counted.
    fn found(&self) -> u64 {
        self.findings.len() as u64 + self.omitted
    }

    fn entry(&mut self, bytes: Vec<u8>) {
        let at = self.position;
        self.position += 1;
        self.tree.push(&bytes, &mut self.tree_out);
        if !self.tree_out.is_empty() {
            self.drain_tree();
        }
        let expected = self.next_seq;
        let before_clean = std::mem::replace(&mut self.last_clean, false);
        let entry = match Entry::decode(&bytes) {
            Ok(e) => e,
            Err(e) => {
                self.settle(true);
                self.find(
                    FindingKind::Malformed,
                    at,
                    format!("entry does not decode: {e}"),
                );
                // Resynchronise on the stored bytes so one bad entry is one finding.
                self.head = entry_hash(&bytes);
                self.next_seq = expected.saturating_add(1);
                return;
            }
        };
        let h = entry.header;
        // No second checkpoint at the disputed one's size says otherwise: its signature
        // stands, and the entry before it was changed. This entry's link is then judged
        // against the head it signs (an attacker without the key who rewrote this link
        // too, re-chaining, is named here as well).
        self.settle(true);
        // This entry's own findings from here on.
        let found_before = self.found();
        if at == 0 && h.entry_type == EntryType::Genesis && h.ledger_id != self.ledger_id {
            // The ids are compared before any signature (as minisign compares key ids):
            // this is another ledger's key, a user's mistake, not tampering. The rest is
            // judged against its own genesis, so the report still says what it holds.
            self.key_mismatch = Some(KeyMismatch {
                key_ledger_id: self.ledger_id.to_string(),
                ledger_id: h.ledger_id.to_string(),
            });
            self.ledger_id = h.ledger_id;
            self.foreign = true;
        } else if h.ledger_id != self.ledger_id {
            self.find(
                FindingKind::WrongLedger,
                at,
                format!(
                    "entry belongs to ledger {}, not {} (spliced from another ledger)",
                    h.ledger_id, self.ledger_id
                ),
            );
        }
        if h.seq != expected {
            let what = if h.seq < expected {
                "duplicated or reordered"
            } else {
                "entries missing"
            };
            self.find(
                FindingKind::SeqBreak,
                at,
                format!("expected seq {expected}, found seq {} ({what})", h.seq),
            );
        }
        if h.prev_hash != self.head {
            // Whose bytes changed, this entry's link or the entry before, a valid
            // checkpoint after this entry tells (see `Suspect`); until then it is the link.
            let from_here = self.found() == found_before && h.seq == expected && at > 0;
            let (found, want) = differing(&h.prev_hash, &self.head);
            self.hashes = Some(full(&h.prev_hash, &self.head));
            let index = self.findings.len();
            self.find(
                FindingKind::BrokenLink,
                at,
                format!("previous-hash {found} is not the hash {want} of the entry before"),
            );
            self.suspect = from_here.then(|| Suspect {
                link_at: at,
                finding: (self.findings.len() > index).then_some(index),
                before_clean,
                stored: self.head,
                linked: h.prev_hash,
            });
        }
        if h.wall_ms < self.head_wall {
            self.find(
                FindingKind::TimeRegression,
                at,
                format!(
                    "wall time {} ms is before the previous entry's {} ms",
                    h.wall_ms, self.head_wall
                ),
            );
        }
        match h.entry_type {
            EntryType::Genesis => self.genesis(&entry, at),
            EntryType::Epoch => self.epoch_cert(&entry, at),
            EntryType::Decision => {
                self.decisions += 1;
                if self.epoch_keys.is_empty() {
                    self.find(FindingKind::BadGenesis, at, "decision before any genesis");
                } else if h.epoch != self.head_epoch {
                    self.find(
                        FindingKind::EpochBreak,
                        at,
                        format!(
                            "decision claims epoch {} but epoch {} is in force",
                            h.epoch, self.head_epoch
                        ),
                    );
                }
            }
            _ => self.find(FindingKind::Malformed, at, "unknown entry type"),
        }
        self.head = entry.hash();
        self.head_wall = h.wall_ms;
        self.next_seq = h.seq.saturating_add(1);
        self.last_clean = self.found() == found_before && h.seq == expected;
        if self.decrypt && h.entry_type == EntryType::Decision {
            match self.data_keys.get(&h.epoch) {
                Some(key) => self.batch.push(Pending {
                    seq: h.seq,
                    wall_ms: h.wall_ms,
                    epoch: h.epoch,
                    key: Arc::clone(key),
                    bytes,
                }),
                None => self.find(
                    FindingKind::Undecryptable,
                    at,
                    format!(
                        "no data key for epoch {}: its certificate is missing or invalid",
                        h.epoch
                    ),
                ),
            }
        }
        self.check_anchors();
    }

    fn genesis(&mut self, entry: &Entry<'_>, seq: u64) {
        let Some(g) = entry.genesis() else { return };
        if !self.epoch_keys.is_empty() {
            self.find(FindingKind::BadGenesis, seq, "a second genesis entry");
            return;
        }
        if self.foreign {
            // Already reported: ledger.pub belongs to another ledger.
        } else if g.verifying_key != self.opts.public.verifying_key {
            self.find(
                FindingKind::BadGenesis,
                seq,
                format!(
                    "genesis key {} is not the key in ledger.pub {} (wrong verification key, or another ledger)",
                    hex::encode(tally_ledger::format::key_id(&g.verifying_key)),
                    hex::encode(tally_ledger::format::key_id(&self.opts.public.verifying_key))
                ),
            );
        } else if verify_signature(
            &g.verifying_key,
            &entry.signed_message(),
            &g.signature,
            "genesis",
        )
        .is_err()
        {
            self.find(
                FindingKind::BadGenesis,
                seq,
                "genesis signature does not verify",
            );
        }
        self.epoch_keys.push(g.verifying_key);
        if let Some(auditor) = &self.opts.auditor {
            if auditor.public() != g.recipient {
                self.auditor_mismatch = true;
                self.decrypt = false;
                self.batch.clear();
            } else {
                self.add_data_key(0, &g.ephemeral, seq);
            }
        }
    }

    fn epoch_cert(&mut self, entry: &Entry<'_>, at: u64) {
        let h = entry.header;
        let Some(c) = entry.epoch_cert() else { return };
        let current = self.head_epoch;
        if self.epoch_keys.is_empty() {
            self.find(
                FindingKind::BadGenesis,
                at,
                "epoch certificate before any genesis",
            );
            return;
        }
        if current.checked_add(1) != Some(h.epoch) {
            // Not adopted: a claimed epoch never sizes anything (one flipped bit must not
            // make the verifier reserve a key per epoch up to 2^32).
            self.find(
                FindingKind::EpochBreak,
                at,
                format!("certificate for epoch {} follows epoch {current}", h.epoch),
            );
            return;
        }
        let signer = self.epoch_keys[self.epoch_keys.len() - 1];
        if verify_signature(
            &signer,
            &entry.signed_message(),
            &c.signature,
            "epoch certificate",
        )
        .is_err()
        {
            self.find(
                FindingKind::BadEpochCertificate,
                at,
                format!(
                    "epoch {} key is not certified by epoch {current}'s key",
                    h.epoch
                ),
            );
        }
        // Walk on with the new key (already reported if uncertified), so later entries
        // are judged on their own.
        self.epoch_keys.push(c.verifying_key);
        self.head_epoch = h.epoch;
        if self.decrypt {
            self.add_data_key(h.epoch, &c.ephemeral, at);
        }
    }

    fn add_data_key(&mut self, epoch: u32, ephemeral: &[u8; 32], seq: u64) {
        let Some(auditor) = &self.opts.auditor else {
            return;
        };
        match auditor.epoch_key(ephemeral, self.ledger_id, epoch) {
            Ok(k) => {
                self.data_keys.insert(epoch, Arc::new(k));
            }
            Err(e) => self.find(
                FindingKind::Undecryptable,
                seq,
                format!("epoch {epoch} data key: {e}"),
            ),
        }
    }

    /// Leave the current position: say how many copies of a checkpoint stood there.
    fn end_position(&mut self) {
        if let (Some(i), n) = (self.duplicate.take(), self.duplicates_here) {
            if n > 1 {
                if let Some(f) = self.findings.get_mut(i) {
                    f.detail = format!(
                        "{n} more checkpoints of size {} after the first (the ledger keeps one per size: copies were added)",
                        f.seq
                    );
                }
            }
        }
        self.duplicates_here = 0;
        self.checkpoints_here = 0;
        self.head_here = None;
        self.text_here = None;
    }

    /// A second stored checkpoint at this position: the store keeps one per size, so it
    /// was added. One finding per position, however many copies.
    fn duplicate_checkpoint(&mut self, n: u64) {
        self.duplicates_here += 1;
        if self.duplicates_here == 1 {
            if self.findings.len() < self.opts.max_findings {
                self.duplicate = Some(self.findings.len());
            }
            self.find(
                FindingKind::CheckpointDuplicate,
                n,
                format!(
                    "a second checkpoint of size {n} (the ledger keeps one per size: copies were added)"
                ),
            );
        }
    }

    fn checkpoint(&mut self, text: &[u8]) {
        let n = self.next_seq;
        if self.text_here.as_deref() == Some(text) {
            // An exact copy of the checkpoint just read: no need to check it again.
            self.duplicate_checkpoint(n);
            return;
        }
        let cp = match Checkpoint::from_text(text) {
            Ok(cp) => cp,
            Err(e) => {
                self.find(
                    FindingKind::CheckpointMalformed,
                    n,
                    format!("checkpoint after seq {}: {e}", n.saturating_sub(1)),
                );
                return;
            }
        };
        match self.check_seal(&cp, "checkpoint") {
            Ok(()) => self.vouched(n),
            Err((FindingKind::CheckpointHeadMismatch, why))
                if self.last_clean && self.checkpoints_here == 0 && n > 0 =>
            {
                // Validly signed, over another head than the clean entry before it: what
                // follows says which of the two was changed (`Disputed`).
                self.hashes = None;
                self.disputed = Some(Disputed {
                    n,
                    entry: self.position - 1,
                    stored: self.head,
                    signed: cp.head,
                    mismatch: why,
                });
                self.suspect = None;
                self.text_here = Some(text.to_vec());
                self.checkpoints_here += 1;
                return;
            }
            Err((FindingKind::CheckpointHeadMismatch, _))
                if self.disputed.as_ref().is_some_and(|d| d.signed == cp.head) =>
            {
                // Another valid checkpoint signing the disputed head: a copy (the ledger
                // keeps one per size), and one more witness against the entry.
                self.hashes = None;
                self.checkpoints_here += 1;
                self.duplicate_checkpoint(n);
                return;
            }
            Err((kind, why)) => {
                if kind == FindingKind::Fork {
                    // A second valid checkpoint here that disagrees with a disputed one:
                    // the disputed one is the odd one (a fork), not the entry.
                    self.settle(false);
                }
                if kind == FindingKind::CheckpointHeadMismatch {
                    // The entries since the last broken link do not hash to what was
                    // signed: nothing tells which side of that link was changed.
                    self.suspect = None;
                }
                self.find(kind, cp.size.min(n), why);
                return;
            }
        }
        // Only valid checkpoints count as copies: an invalid one is its own finding.
        self.text_here = Some(text.to_vec());
        self.checkpoints_here += 1;
        if self.checkpoints_here > 1 {
            self.duplicate_checkpoint(n);
            return;
        }
        if !self.broken && self.key_mismatch.is_none() {
            // Nothing is sealed under another ledger's key.
            self.sealed = cp.size;
            self.last_checkpoint = Some(cp);
        }
    }

    /// A valid checkpoint of size `n` signs the chain as read: every entry since the last
    /// broken link is as written, that link included, so the entry before the link is the
    /// one whose bytes were changed (unless it has a finding of its own already).
    fn vouched(&mut self, n: u64) {
        let Some(s) = self.suspect.take() else { return };
        let (Some(i), true) = (s.finding, s.before_clean) else {
            return;
        };
        let entry = s.link_at - 1;
        let (found, want) = differing(&s.stored, &s.linked);
        self.findings[i] = Finding {
            kind: FindingKind::EntryAltered,
            seq: entry,
            detail: format!(
                "entry {entry} was changed after it was written: its bytes hash to {found}, \
                 but entry {} (sealed by the checkpoint of size {n}) records {want}",
                s.link_at
            ),
            hashes: Some(full(&s.stored, &s.linked)),
        };
    }

    /// Settle a disputed checkpoint: `changed`, the entry before it was changed after it
    /// was sealed (and the walk goes on from the head the checkpoint signs, so the next
    /// entry's link is judged against what was sealed: one changed entry, one finding);
    /// else the checkpoint's head is the odd one.
    fn settle(&mut self, changed: bool) {
        let Some(d) = self.disputed.take() else {
            return;
        };
        if changed {
            let (found, want) = differing(&d.stored, &d.signed);
            self.hashes = Some(full(&d.stored, &d.signed));
            self.find(
                FindingKind::EntryAltered,
                d.entry,
                format!(
                    "entry {} was changed after it was sealed: its bytes hash to {found}, \
                     but the checkpoint of size {} signs {want}",
                    d.entry, d.n
                ),
            );
            self.head = d.signed;
        } else {
            self.hashes = Some(full(&d.signed, &d.stored));
            self.find(FindingKind::CheckpointHeadMismatch, d.n, d.mismatch);
        }
    }

    /// Check a checkpoint or anchor against the chain at the current position.
    fn check_seal(&mut self, cp: &Checkpoint, what: &str) -> Result<(), (FindingKind, String)> {
        let n = self.next_seq;
        if cp.ledger_id != self.ledger_id {
            return Err((
                FindingKind::CheckpointWrongLedger,
                format!(
                    "{what} belongs to ledger {}, not {}",
                    cp.ledger_id, self.ledger_id
                ),
            ));
        }
        if cp.size != n {
            return Err((
                FindingKind::CheckpointMisplaced,
                if cp.size > n {
                    format!("{what} seals {} entries but only {n} precede it (entries were removed: truncated)", cp.size)
                } else {
                    format!(
                        "{what} seals {} entries but stands after entry {}",
                        cp.size,
                        n - 1
                    )
                },
            ));
        }
        let key = self.epoch_keys.get(cp.epoch as usize).copied();
        if cp.epoch != self.head_epoch {
            let signed = match key {
                Some(k) if verify_checkpoint(cp, &k).is_ok() => "validly signed",
                _ => "claiming to be signed",
            };
            return Err((
                FindingKind::CheckpointWrongEpoch,
                format!(
                    "{what} is {signed} by epoch {}'s key, but entry {} is in epoch {} (re-sealed with another epoch's key)",
                    cp.epoch,
                    n - 1,
                    self.head_epoch
                ),
            ));
        }
        let Some(key) = key else {
            return Err((
                FindingKind::CheckpointBadSignature,
                format!(
                    "{what} claims epoch {} but the ledger has no key for it here",
                    cp.epoch
                ),
            ));
        };
        if let Err(e) = verify_checkpoint(cp, &key) {
            return Err((
                FindingKind::CheckpointBadSignature,
                format!("{what} of epoch {}: {e}", cp.epoch),
            ));
        }
        // The first head seen at this size (a checkpoint's or an anchor's) is the one
        // others must match: a constant-time check, however many checkpoints follow.
        match self.head_here {
            Some(h) if h != cp.head => {
                return Err((
                    FindingKind::Fork,
                    format!("two validly signed checkpoints of size {n} with different heads"),
                ));
            }
            Some(_) => {}
            None => self.head_here = Some(cp.head),
        }
        if cp.head != self.head {
            let (found, want) = differing(&cp.head, &self.head);
            // Taken by the finding the caller makes of this error.
            self.hashes = Some(full(&cp.head, &self.head));
            return Err((
                FindingKind::CheckpointHeadMismatch,
                format!("{what} head {found} is not the chain's hash {want} at size {n}"),
            ));
        }
        if cp.wall_ms < self.head_wall {
            return Err((
                FindingKind::CheckpointTime,
                format!(
                    "{what} time {} ms is before the entry it seals ({} ms)",
                    cp.wall_ms, self.head_wall
                ),
            ));
        }
        Ok(())
    }

    fn check_anchors(&mut self) {
        self.end_position();
        let n = self.next_seq;
        let mut i = 0;
        while i < self.anchors.len() {
            if self.anchors[i].0.size == n && self.anchors[i].1.is_none() {
                let anchor = self.anchors[i].0.clone();
                let status = match self.check_seal(&anchor, "anchor") {
                    Ok(()) => AnchorStatus::Matched,
                    Err((kind, why)) => {
                        let kind = match kind {
                            FindingKind::CheckpointHeadMismatch | FindingKind::Fork => {
                                FindingKind::Fork
                            }
                            _ => FindingKind::AnchorInvalid,
                        };
                        self.find(kind, n, why);
                        AnchorStatus::Mismatch
                    }
                };
                self.anchors[i].1 = Some(status);
                // The anchor's head stays in `head_here` so a stored checkpoint of the
                // same size with another head is reported as a fork.
            }
            i += 1;
        }
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

    fn finish(mut self) -> Report {
        // A disputed checkpoint after the last entry: its signature stands.
        self.settle(true);
        self.end_position();
        let tree_anchors = self.tree.finish(&mut self.tree_out);
        self.drain_tree();
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
            tree_root: tally_ledger::tlog::note::b64(&self.tree.root()),
            tree_anchors,
            witnessed: self.tree.witnessed.take(),
        }
    }
}

fn open(p: &Pending, plain: &mut Vec<u8>) -> Result<Box<Decision>, String> {
    let entry = Entry::decode(&p.bytes).map_err(|e| e.to_string())?;
    p.key
        .open_into(
            &entry.header.nonce,
            entry.header_bytes(),
            entry.body(),
            plain,
        )
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
