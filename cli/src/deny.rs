//! `tally deny REQUEST --note WHY`: an approver's signed no to an approval request
//! (docs/APPROVALS.md). `tally top`'s `d` denies here too.

use std::path::Path;

use anyhow::{bail, Result};
use tally_api::{ApprovalRequest, Denial};
use tally_policy::approval::{denial_digest, sign, DeniedCall, MAX_DENIAL_NOTE};
use tally_verify::text::shown;

use crate::cli::DenyArgs;
use crate::operator::{block_on, gate, refused, request, signer_of};
use crate::output::outln;
use crate::Exit;

/// `tally deny`.
pub fn deny(args: &DenyArgs) -> Result<Exit> {
    note_fits(&args.note)?;
    let r = request(&args.operator_socket, &args.request)?;
    let text = denied(
        &args.operator_socket,
        &r,
        &args.key,
        args.approver.as_deref(),
        &args.note,
    )?;
    outln!("{text}");
    Ok(Exit::Success)
}

/// Refused unless `note` says something, in at most [`MAX_DENIAL_NOTE`] bytes.
fn note_fits(note: &str) -> Result<()> {
    if note.trim().is_empty() || note.len() > MAX_DENIAL_NOTE {
        bail!(
            "--note says why, in 1 to {MAX_DENIAL_NOTE} bytes (this one is {}): the agent is told it",
            note.len()
        );
    }
    Ok(())
}

/// Sign a denial of request `r` with the approver's key (`key`, named `approver` or by
/// the file) and record it through the daemon: what it did, as people read it.
pub(crate) fn denied(
    socket: &Path,
    r: &ApprovalRequest,
    key: &Path,
    approver: Option<&str>,
    note: &str,
) -> Result<String> {
    note_fits(note)?;
    let (key, approver) = signer_of(key, approver)?;
    let call = DeniedCall {
        tool: &r.tool,
        operation: r.operation.as_deref(),
        args_digest: r.args_digest.as_deref(),
    };
    let digest = denial_digest(&r.run, &approver, &r.id, call, note);
    let denial = Denial {
        run: r.run.clone(),
        request: r.id.clone(),
        approver,
        note: note.to_owned(),
        signature: sign(key.signing_key(), &digest),
        digest,
    };
    let reply = block_on(async { gate(socket).await?.deny(&denial).await.map_err(refused) })?;
    let op = r
        .operation
        .as_deref()
        .map(|o| format!(" {}", shown(o)))
        .unwrap_or_default();
    Ok(format!(
        "denied {} recorded at seq {} for run {}: its next check of {}{op} with the same arguments is refused denied_by_approver (stop), with the note",
        r.id,
        reply.seq,
        shown(&r.run),
        shown(&r.tool),
    ))
}
