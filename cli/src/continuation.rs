//! `tally approve --new-run`: an approver's continuation grant for a run, signed here and
//! recorded through the daemon, which starts the new run it names (docs/CLI.md).

use std::path::Path;

use anyhow::{bail, Context, Result};
use rand_core::RngCore;
use tally_api::{Approval, Started};

use crate::cli::ApproveArgs;
use crate::operator::{block_on, duration_ms, gate, grant_for, grant_of, refused, request, signer};
use crate::output::outln;
use crate::Exit;

/// A fresh name for the run continuing `old`: its name and eight random hex digits.
fn new_name(old: &str) -> String {
    format!("{old}.{:08x}", rand_core::OsRng.next_u32())
}

/// `tally approve --new-run`: sign the continuation grant (its scope the new run's
/// allocation), record it and start the new run; print the new run, its token and what
/// it was granted.
pub fn approve(args: &ApproveArgs) -> Result<Exit> {
    let socket: &Path = &args.operator_socket;
    // A request answered "a new run instead": its run is the one continued.
    let mut g = match &args.request {
        Some(id) => {
            let expires = args.expires.clone().unwrap_or_else(|| "10m".to_owned());
            grant_for(args, request(socket, id)?.run, expires)?
        }
        None => grant_of(args)?,
    };
    if g.scope.attempts.is_none() && g.scope.spend().is_none() {
        bail!("a continuation grant allocates the new run's budget: give --attempts, --usd or --cents");
    }
    let expires = duration_ms(&g.expires)?;
    let (key, approver) = signer(&g)?;
    let new_run = new_name(&g.run);
    g.scope.new_run = Some(new_run);
    block_on(async {
        let mut gate = gate(socket).await?;
        let at = gate.run(&g.run).await.map_err(refused)?.at_ms;
        let expires_ms = at.checked_add(expires).context("the expiry overflows")?;
        let digest = tally_policy::approval::digest(&g.run, &approver, &g.scope, expires_ms);
        let signature = tally_policy::approval::sign(key.signing_key(), &digest);
        let grant = Approval {
            run: g.run.clone(),
            approver,
            scope: g.scope.clone(),
            expires_ms,
            digest,
            signature,
            note: g.note.clone(),
            request: None,
        };
        let started = gate.continue_run(&grant).await.map_err(refused)?;
        outln!("{}", started_text(&g.run, &started));
        Ok(Exit::Success)
    })
}

/// The new run as the operator reads it: its name, what it continues, its budget and its
/// token (given once).
fn started_text(old: &str, s: &Started) -> String {
    use tally_verify::text::shown;
    let mut budget = Vec::new();
    if let Some(a) = s.budget.attempts {
        budget.push(format!("{a} attempts"));
    }
    if let Some(n) = s.budget.spend() {
        budget.push(format!("{n} spend"));
    }
    let mut out = format!(
        "continuation granted: run {} continues {} (which stays stopped) at seq {}, granted {}",
        shown(&s.run),
        shown(old),
        s.seq,
        budget.join(" and ")
    );
    match &s.token {
        Some(t) => out.push_str(&format!("\ntoken (shown once): {t}")),
        None => out.push_str("\nno token: the daemon runs without the model proxy"),
    }
    out
}
