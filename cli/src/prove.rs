//! `tally checkpoint` (C2SP form, `--vkey`), `tally prove` and `tally verify-proof`.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::json;
use tally_ledger::format::{Entry, EntryType, HEADER_LEN};
use tally_ledger::keys::{AuditorKey, LedgerPublic};
use tally_ledger::tlog::merkle::{leaf_hash, verify_consistency, verify_inclusion};
use tally_ledger::tlog::note::{b64, Note, TreeHead, Vkey};
use tally_ledger::tlog::policy::Policy;
use tally_ledger::tlog::proof::{ConsistencyProof, TlogProof};
use tally_ledger::tlog::LogKey;
use tally_ledger::{Decision, LedgerId};
use tally_verify::tree::TreeAnchor;

use crate::cli::{ProveArgs, VerifyProofArgs};
use crate::output::{noteln, out, outln};
use crate::Exit;

fn public(dir: &Path) -> Result<LedgerPublic> {
    let path = dir.join("ledger.pub");
    LedgerPublic::read(&path).with_context(|| format!("reading {}", path.display()))
}

fn log_key(dir: &Path, public: &LedgerPublic) -> Result<LogKey> {
    if public.log_key.is_none() {
        bail!(
            "{} has no log key yet (a ledger made before log keys): open it once with this build (tally serve, tally append, tally rotate), which makes one",
            dir.display()
        );
    }
    LogKey::read(dir, public.ledger_id)
        .with_context(|| format!("reading the log key of {}", dir.display()))
}

/// The latest checkpoint note of the ledger in `dir` and its size: the cosigned one if it
/// is of the latest size (or `at_least` suffices and it covers it), else one signed now.
fn latest_note(dir: &Path, at_least: Option<u64>) -> Result<(Note, u64)> {
    let public = public(dir)?;
    let key = log_key(dir, &public)?;
    let (cp, root) = tally_ledger::prove::read_tree_head(dir)
        .with_context(|| format!("reading the log of {}", dir.display()))?;
    if let Some((size, note)) = tally_ledger::tlog::read_cosigned_at(dir, cp.size)? {
        let enough = match at_least {
            Some(n) => size > n,
            None => size == cp.size,
        };
        if enough {
            return Ok((note, size));
        }
    }
    Ok((key.sign(cp.size, root), cp.size))
}

/// `tally checkpoint --ledger DIR`: the latest C2SP checkpoint.
pub fn checkpoint(dir: &Path) -> Result<Exit> {
    let (note, _) = latest_note(dir, None)?;
    out!("{}", note.to_text());
    Ok(Exit::Success)
}

/// `tally checkpoint --ledger DIR --vkey`.
pub fn vkey(dir: &Path) -> Result<Exit> {
    let public = public(dir)?;
    let key = log_key(dir, &public)?;
    outln!("{}", key.vkey().to_text());
    Ok(Exit::Success)
}

/// A C2SP checkpoint anchor: the ledger it is of, and the anchor. `None` if `text` is not
/// a C2SP checkpoint of a tally ledger (then it is read as a chain checkpoint).
pub fn tree_anchor(text: &[u8], path: &Path) -> Option<(LedgerId, TreeAnchor)> {
    let note = Note::parse(text).ok()?;
    let head = TreeHead::parse(&note.text).ok()?;
    let id = head.origin.strip_prefix("tally/")?;
    let id = LedgerId(tally_ledger::format::parse_hex::<16>(id, "origin").ok()?);
    Some((
        id,
        TreeAnchor {
            source: format!("anchor {}", path.display()),
            note,
        },
    ))
}

/// `tally prove`.
pub fn prove(a: &ProveArgs) -> Result<Exit> {
    let dir = &a.ledger;
    let public = public(dir)?;
    let text = if let Some(from) = &a.from {
        let bytes = std::fs::read(from).with_context(|| format!("reading {}", from.display()))?;
        let old = Note::parse(&bytes)
            .with_context(|| format!("{}: not a C2SP checkpoint", from.display()))?;
        let head = TreeHead::parse(&old.text).with_context(|| format!("{}", from.display()))?;
        let origin = tally_ledger::tlog::origin(public.ledger_id);
        if head.origin != origin {
            bail!(
                "{} is a checkpoint of {}, not of {origin}",
                from.display(),
                head.origin
            );
        }
        let (note, size) = latest_note(dir, None)?;
        if head.size > size {
            bail!(
                "{} is of size {}, but the ledger has {size} entries: it was truncated or rolled back",
                from.display(),
                head.size
            );
        }
        let ours = tally_ledger::prove::root(dir, head.size)?;
        if ours != head.root {
            eprintln_fork(&head, &ours);
            return Ok(Exit::Findings);
        }
        tally_ledger::prove::consistency_file(dir, head.size, &note, size)?.to_text()
    } else {
        let seqs: BTreeSet<u64> = match (&a.seq, &a.run) {
            (Some(s), None) => [*s].into(),
            (None, Some(run)) => run_seqs(dir, &public, run, a.auditor_key.as_deref())?,
            _ => bail!("give one of --seq N, --run RUN (with --auditor-key) or --from CP"),
        };
        let last = *seqs.last().context("no entry to prove")?;
        let (note, size) = latest_note(dir, Some(last))?;
        if last >= size {
            bail!(
                "seq {last} is not sealed yet: the ledger's latest checkpoint has {size} entries"
            );
        }
        let proofs = tally_ledger::prove::tlog_proofs(dir, public.ledger_id, &seqs, &note, size)?;
        let witnesses = note.sigs.len().saturating_sub(1);
        noteln!(
            "proved {} entr{} against the checkpoint of size {size} ({witnesses} cosignature{})",
            proofs.len(),
            if proofs.len() == 1 { "y" } else { "ies" },
            if witnesses == 1 { "" } else { "s" }
        );
        proofs.iter().map(TlogProof::to_text).collect()
    };
    match &a.out {
        Some(p) => std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?,
        None => out!("{text}"),
    }
    Ok(Exit::Success)
}

fn eprintln_fork(head: &TreeHead, ours: &[u8; 32]) {
    crate::output::errln!(
        "tally: the ledger's Merkle root at size {} is {}, but the checkpoint says {}: the ledger is not the one it saw (a fork)",
        head.size,
        b64(ours),
        b64(&head.root)
    );
}

/// The seqs of the decisions of `run`, found by decrypting the (verified) ledger.
fn run_seqs(
    dir: &Path,
    public: &LedgerPublic,
    run: &str,
    key: Option<&Path>,
) -> Result<BTreeSet<u64>> {
    let key = key.context("--run needs --auditor-key to find the run's decisions")?;
    let mut opts = tally_verify::Options::new(public.clone());
    opts.auditor = Some(
        AuditorKey::read(key)
            .with_context(|| format!("reading the auditor key {}", key.display()))?,
    );
    let frames = tally_verify::walk::ledger_frames(dir)
        .with_context(|| format!("reading the log of {}", dir.display()))?;
    let mut seqs = BTreeSet::new();
    let report = tally_verify::verify(
        frames,
        &opts,
        |e| {
            if e.decision.run == run {
                seqs.insert(e.seq.seq);
            }
        },
        |_| {},
    );
    if !report.findings.is_empty() {
        bail!(
            "the ledger does not verify ({}): run `tally verify` first",
            report.to_text().lines().next().unwrap_or_default()
        );
    }
    if seqs.is_empty() {
        bail!("no decision of run {run:?} in {}", dir.display());
    }
    Ok(seqs)
}

/// What checking a proof came to.
struct Checked {
    lines: Vec<String>,
    doc: serde_json::Value,
    exit: Exit,
}

/// `tally verify-proof`.
pub fn verify_proof(a: &VerifyProofArgs) -> Result<Exit> {
    let text = if a.file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin().lock(), &mut s)
            .context("reading the proof from standard input")?;
        s
    } else {
        std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?
    };
    let public =
        LedgerPublic::read(&a.key).with_context(|| format!("reading {}", a.key.display()))?;
    let policy = match &a.witness_policy {
        Some(p) => Some(crate::witness::read_policy(p)?),
        None => None,
    };
    let origin = tally_ledger::tlog::origin(public.ledger_id);
    let log_key = public
        .log_key
        .clone()
        .or_else(|| policy.as_ref().and_then(|p| p.log(&origin)).map(|l| l.vkey.clone()))
        .with_context(|| {
            format!(
                "{} names no log key (version 1): give the ledger.pub the ledger writes now, or a --witness-policy with a `log` line for {origin}",
                a.key.display()
            )
        })?;
    let checked = if text.starts_with("old ") {
        consistency(a, &text, &origin, &log_key, policy.as_ref())?
    } else {
        inclusion(a, &text, &public, &origin, &log_key, policy.as_ref())?
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&checked.doc)?);
    } else {
        for l in &checked.lines {
            outln!("{}", tally_verify::text::terminal_safe(l));
        }
    }
    Ok(checked.exit)
}

/// The checkpoint: origin, log signature, and (with a policy) the quorum. Returns the
/// tree head, lines, the witnesses that cosigned, and whether the quorum is met.
fn check_checkpoint(
    note: &Note,
    origin: &str,
    log_key: &Vkey,
    policy: Option<&Policy>,
) -> Result<(TreeHead, Vec<String>, Vec<String>, bool)> {
    let head = TreeHead::parse(&note.text).context("the proof's checkpoint")?;
    if head.origin != origin {
        bail!(
            "the proof's checkpoint is of {}, not of {origin}",
            head.origin
        );
    }
    log_key
        .verify(note)
        .context("the proof's checkpoint is not signed by the ledger's log key")?;
    let mut lines = vec![format!(
        "checkpoint  {} size {} root {} (signed by the log key)",
        head.origin,
        head.size,
        b64(&head.root)
    )];
    let mut names = Vec::new();
    let mut quorum = true;
    if let Some(p) = policy {
        let mut who = BTreeSet::new();
        for (i, w) in p.witnesses.iter().enumerate() {
            if let Some(sig) = note.sig_of(&w.vkey.name, w.vkey.key_id()) {
                w.vkey
                    .verify_cosignature(&note.text, sig)
                    .with_context(|| format!("the cosignature of witness {}", w.name))?;
                who.insert(i);
                names.push(w.name.clone());
            }
        }
        quorum = p.quorum_met(&who);
        lines.push(format!(
            "witnessed   {} by {} ({})",
            if quorum {
                "quorum met"
            } else {
                "quorum NOT met"
            },
            if names.is_empty() {
                "no witness".to_string()
            } else {
                names.join(", ")
            },
            names.len()
        ));
    }
    Ok((head, lines, names, quorum))
}

fn consistency(
    a: &VerifyProofArgs,
    text: &str,
    origin: &str,
    log_key: &Vkey,
    policy: Option<&Policy>,
) -> Result<Checked> {
    let proof = ConsistencyProof::parse(text).context("the consistency proof")?;
    let from = a
        .from
        .as_ref()
        .context("a consistency proof is checked against the older checkpoint you hold: give it with --from CP")?;
    let old =
        Note::parse(&std::fs::read(from).with_context(|| format!("reading {}", from.display()))?)
            .with_context(|| format!("{}", from.display()))?;
    let (old_head, _, _, _) = check_checkpoint(&old, origin, log_key, None)
        .with_context(|| format!("{}", from.display()))?;
    let (head, mut lines, names, quorum) =
        check_checkpoint(&proof.checkpoint, origin, log_key, policy)?;
    if proof.old != old_head.size {
        bail!(
            "the proof starts at size {}, but {} is of size {}",
            proof.old,
            from.display(),
            old_head.size
        );
    }
    let ok = verify_consistency(
        old_head.size,
        head.size,
        &old_head.root,
        &head.root,
        &proof.proof,
    );
    let exit = match (&ok, quorum) {
        (Err(_), _) => Exit::Findings,
        (Ok(()), false) => Exit::Incomplete,
        (Ok(()), true) => Exit::Success,
    };
    lines.insert(
        0,
        match &ok {
            Ok(()) => format!(
                "CONSISTENT: the tree of size {} extends the one of size {} you hold",
                head.size, old_head.size
            ),
            Err(e) => format!("NOT CONSISTENT: {e} (a fork, or the ledger was rewritten)"),
        },
    );
    Ok(Checked {
        doc: json!({"kind": "consistency", "old": old_head.size, "size": head.size,
                    "consistent": ok.is_ok(), "witnesses": names, "quorum": quorum}),
        lines,
        exit,
    })
}

/// The entry a proof's `extra` holds first, and the entry after it (its epoch's opener).
fn split_extra(extra: &[u8]) -> Option<(&[u8], Option<&[u8]>)> {
    let header = tally_ledger::format::Header::decode(extra).ok()?;
    let n = HEADER_LEN + header.body_len as usize;
    let (entry, rest) = (extra.get(..n)?, extra.get(n..)?);
    Some((entry, (!rest.is_empty()).then_some(rest)))
}

fn inclusion(
    a: &VerifyProofArgs,
    text: &str,
    public: &LedgerPublic,
    origin: &str,
    log_key: &Vkey,
    policy: Option<&Policy>,
) -> Result<Checked> {
    let proofs = TlogProof::parse_bundle(text).context("the proof")?;
    let (head, mut lines, names, quorum) =
        check_checkpoint(&proofs[0].checkpoint, origin, log_key, policy)?;
    let auditor = match &a.auditor_key {
        Some(k) => Some(AuditorKey::read(k).with_context(|| format!("reading {}", k.display()))?),
        None => None,
    };
    let mut bad = Vec::new();
    let mut decisions: Vec<(u64, Decision)> = Vec::new();
    let mut entries = Vec::new();
    for p in &proofs {
        match proven_entry(p, &head, public, auditor.as_ref()) {
            Ok(d) => {
                entries.push(p.index);
                if let Some(d) = d {
                    decisions.push((p.index, d));
                }
            }
            Err(e) => bad.push(format!("seq {}: {e}", p.index)),
        }
    }
    // A run's decisions: each names its run's previous one, the first none.
    let runs: BTreeSet<&str> = decisions.iter().map(|(_, d)| d.run.as_str()).collect();
    // One proof is a proof of one decision, not of a run's history: no gap to judge.
    let missing = if runs.len() == 1 && auditor.is_some() && proofs.len() > 1 {
        run_gaps(&decisions)
    } else {
        Vec::new()
    };
    let exit = if !bad.is_empty() || !missing.is_empty() {
        Exit::Findings
    } else if !quorum {
        Exit::Incomplete
    } else {
        Exit::Success
    };
    lines.insert(0, inclusion_verdict(&bad, &missing, &entries, head.size));
    lines.extend(bad.iter().map(|b| format!("refused     {b}")));
    lines.extend(missing.iter().map(|m| format!("missing     {m}")));
    if let (1, Some((seq, d))) = (runs.len(), decisions.last()) {
        if proofs.len() > 1 {
            lines.push(format!(
                "run         {} complete from its first decision to seq {seq} ({}); later decisions, if any, are not shown",
                d.run,
                d.kind().as_str()
            ));
        }
    }
    for (seq, d) in &decisions {
        lines.push(format!(
            "decision    seq {seq} {}",
            String::from_utf8_lossy(&d.to_canonical_json())
        ));
    }
    Ok(Checked {
        doc: json!({
            "kind": "inclusion",
            "size": head.size,
            "root": b64(&head.root),
            "proven": entries,
            "refused": bad,
            "missing": missing,
            "witnesses": names,
            "quorum": quorum,
            "decisions": decisions.iter().map(|(s, d)| json!({"seq": s, "decision": serde_json::from_slice::<serde_json::Value>(&d.to_canonical_json()).unwrap_or_default()})).collect::<Vec<_>>(),
        }),
        lines,
        exit,
    })
}

/// One inclusion proof's entry, checked: of this ledger, at the proof's index, in the
/// checkpoint's tree; with the auditor key, a decision entry is decrypted and returned.
/// The error says why the entry is refused.
fn proven_entry(
    p: &TlogProof,
    head: &TreeHead,
    public: &LedgerPublic,
    auditor: Option<&AuditorKey>,
) -> std::result::Result<Option<Decision>, String> {
    let extra = p.extra.as_deref().ok_or("no entry in its `extra` line")?;
    let (bytes, opener) = split_extra(extra).ok_or("its `extra` is not a tally entry")?;
    let entry = Entry::decode(bytes).map_err(|e| e.to_string())?;
    if entry.header.ledger_id != public.ledger_id {
        return Err("an entry of another ledger".into());
    }
    if entry.header.seq != p.index {
        return Err(format!(
            "the entry is seq {}, the proof says index {}",
            entry.header.seq, p.index
        ));
    }
    verify_inclusion(p.index, head.size, &leaf_hash(bytes), &p.proof, &head.root)
        .map_err(|e| format!("not in the checkpoint's tree: {e}"))?;
    let (Some(auditor), EntryType::Decision) = (auditor, entry.header.entry_type) else {
        return Ok(None);
    };
    let opener = Entry::decode(opener.ok_or("no epoch entry to decrypt it with")?)
        .map_err(|e| e.to_string())?;
    open_decision(&entry, &opener, auditor, public).map(Some)
}

/// A decision entry decrypted with the auditor key and the epoch key its epoch entry
/// (`opener`: genesis or an epoch certificate) carries.
fn open_decision(
    entry: &Entry,
    opener: &Entry,
    auditor: &AuditorKey,
    public: &LedgerPublic,
) -> std::result::Result<Decision, String> {
    let ephemeral = match (opener.genesis(), opener.epoch_cert()) {
        (Some(g), _) => g.ephemeral,
        (_, Some(c)) => c.ephemeral,
        _ => return Err("its epoch entry is neither genesis nor an epoch certificate".into()),
    };
    if opener.header.epoch != entry.header.epoch {
        return Err("its epoch entry is of another epoch".into());
    }
    let key = auditor
        .epoch_key(&ephemeral, public.ledger_id, entry.header.epoch)
        .map_err(|e| e.to_string())?;
    let plain = key
        .open(&entry.header.nonce, entry.header_bytes(), entry.body())
        .map_err(|_| "does not decrypt with the auditor key".to_string())?;
    Decision::from_stored(&plain).map_err(|e| e.to_string())
}

/// The gaps in one run's proven decisions: each must name the one before it as its
/// previous decision, and the first none.
fn run_gaps(decisions: &[(u64, Decision)]) -> Vec<String> {
    let mut missing = Vec::new();
    let mut prev: Option<u64> = None;
    for (seq, d) in decisions {
        match (d.prev_seq, prev) {
            (Some(p), Some(q)) if p == q => {}
            (None, None) => {}
            (Some(p), _) => missing.push(format!("before seq {seq}: seq {p}, which it names as the run's previous decision, is not in the proof")),
            (None, Some(q)) => missing.push(format!("seq {seq} names no previous decision, though seq {q} of the run comes before it")),
        }
        prev = Some(*seq);
    }
    missing
}

/// The first line of an inclusion proof's check: proven, an incomplete run, or not.
fn inclusion_verdict(bad: &[String], missing: &[String], entries: &[u64], size: u64) -> String {
    if !bad.is_empty() {
        "NOT PROVEN".to_string()
    } else if !missing.is_empty() {
        format!(
            "INCOMPLETE RUN: {} entries proven, but the run's history has gaps",
            entries.len()
        )
    } else {
        format!(
            "PROVEN: {} entr{} (seq {}) in the tree of size {}",
            entries.len(),
            if entries.len() == 1 { "y" } else { "ies" },
            entries
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            size
        )
    }
}
