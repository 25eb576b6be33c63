//! The operator's commands: `tally approve`, `tally runs`, `tally pause|resume|kill`,
//! talking to the daemon's operator socket.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::cli::{ApproveArgs, RunArgs, RunsArgs, SettleArgs};
use crate::output::outln;
use crate::Exit;
use tally_api::{Approval, GateClient, GateError, LimitKey, Logged, RunAction, Standing};
use tally_ledger::decision::Scope;

/// What `tally approve` grants.
pub struct Grant {
    pub run: String,
    /// The approval request it answers.
    pub request: Option<String>,
    pub key: PathBuf,
    pub approver: Option<String>,
    pub expires: String,
    pub scope: Scope,
    pub note: Option<String>,
}

/// `30s`, `10m`, `2h`, `1d`, `500ms` in ms.
pub fn duration_ms(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().with_context(|| {
        format!("`{text}` is not a duration: give a number and a unit, e.g. 10m")
    })?;
    let scale = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => bail!("`{text}`: the unit must be ms, s, m, h or d"),
    };
    n.checked_mul(scale)
        .filter(|&ms| ms > 0)
        .with_context(|| format!("`{text}` is not a duration greater than zero that fits"))
}

/// The operator socket's client, connected: a daemon that is not there says how to
/// start one.
pub(crate) async fn gate(socket: &Path) -> Result<GateClient> {
    crate::gate::connect(socket, |s| {
        format!(
            "the operator socket {} (is `tally serve --operator-socket` running, as your user?)",
            s.display()
        )
    })
    .await
}

/// A refusal as the operator reads it.
pub(crate) fn refused(e: GateError) -> anyhow::Error {
    match e {
        GateError::Refused {
            status,
            code,
            message,
            ..
        } => anyhow::anyhow!("refused ({status} {code}): {message}"),
        e => anyhow::anyhow!("{e}"),
    }
}

pub(crate) fn block_on<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

/// `tally approve`.
pub fn approve(args: &ApproveArgs) -> Result<Exit> {
    if let Some(id) = &args.request {
        return approve_request(args, id);
    }
    record(&args.operator_socket, grant_of(args)?)
}

/// What `tally approve`'s arguments ask the approver to sign (a grant without a request).
pub(crate) fn grant_of(args: &ApproveArgs) -> Result<Grant> {
    let run = args.run.clone().context("name the run with --run")?;
    let expires = (args.expires.clone()).context("say how long it is valid with --expires")?;
    grant_for(args, run, expires)
}

/// The grant `tally approve`'s arguments give for `run`, valid for `expires`: the scope
/// its `--attempts`, `--usd`/`--cents`, `--tool` and `--operation` say.
pub(crate) fn grant_for(args: &ApproveArgs, run: String, expires: String) -> Result<Grant> {
    Ok(Grant {
        run,
        request: None,
        key: args.key.clone(),
        approver: args.approver.clone(),
        expires,
        scope: tally_ledger::decision::Scope {
            attempts: args.attempts,
            cents: args.cents,
            nanos: args
                .usd
                .as_deref()
                .map(|u| tally_ledger::money::parse_usd(u).map(|n| n.0))
                .transpose()
                .map_err(|e| anyhow::anyhow!("--usd: {e}"))?,
            tool: args.tool.clone(),
            operation: args.operation.clone(),
            new_run: None,
        },
        note: args.note.clone(),
    })
}

/// The approval request `id`, read from the operator socket.
pub(crate) fn request(socket: &Path, id: &str) -> Result<tally_wire::ApprovalRequest> {
    block_on(async {
        let mut gate = gate(socket).await?;
        gate.approval_request(id).await.map_err(refused)
    })
}

/// `tally approve REQUEST`: the request's run and cost, signed with the request's id.
fn approve_request(args: &ApproveArgs, id: &str) -> Result<Exit> {
    if args.attempts.is_some() || args.usd.is_some() || args.cents.is_some() {
        bail!("an approval of a request grants exactly its cost: give --attempts, --usd or --cents only with --new-run (a new run instead)");
    }
    let request = request(&args.operator_socket, id)?;
    let grant = Grant {
        run: request.run.clone(),
        request: Some(request.id.clone()),
        key: args.key.clone(),
        approver: args.approver.clone(),
        expires: args.expires.clone().unwrap_or_else(|| "10m".to_owned()),
        scope: request.cost.clone(),
        note: args.note.clone(),
    };
    record(&args.operator_socket, grant)
}

/// Sign an approval with the approver's key and record it through the daemon.
fn record(socket: &Path, g: Grant) -> Result<Exit> {
    outln!("{}", signed(socket, g)?);
    Ok(Exit::Success)
}

/// The approver's key and name (default: the key file's name).
pub(crate) fn signer(g: &Grant) -> Result<(tally_ledger::keys::ApproverKey, String)> {
    signer_of(&g.key, g.approver.as_deref())
}

/// The approver's key read from `path`, and their name: `approver`, or the key file's
/// name. `tally approve` and `tally deny` sign with it.
pub(crate) fn signer_of(
    path: &Path,
    approver: Option<&str>,
) -> Result<(tally_ledger::keys::ApproverKey, String)> {
    let key = tally_ledger::keys::ApproverKey::read(path)
        .with_context(|| format!("reading the approver key {}", path.display()))?;
    let approver = match approver {
        Some(a) => a.to_owned(),
        None => path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .context("name the approver with --approver")?,
    };
    Ok((key, approver))
}

/// Sign an approval with the approver's key and record it through the daemon: what it
/// grants, as people read it. `tally approve` and `tally top`'s `a` both sign here.
pub(crate) fn signed(socket: &Path, g: Grant) -> Result<String> {
    let expires = duration_ms(&g.expires)?;
    let (key, approver) = signer(&g)?;
    if g.scope == Scope::default() {
        bail!("an approval must grant something: give --attempts, --usd (or --cents), --tool or --operation");
    }
    block_on(async {
        let mut gate = gate(socket).await?;
        let run = gate.run(&g.run).await.map_err(refused)?;
        let at = run.at_ms;
        let expires_ms = at.checked_add(expires).context("the expiry overflows")?;
        let digest = tally_policy::approval::answer_digest(
            &g.run,
            &approver,
            &g.scope,
            expires_ms,
            g.request.as_deref(),
        );
        let signature = tally_policy::approval::sign(key.signing_key(), &digest);
        let approval = Approval {
            run: g.run.clone(),
            approver: approver.clone(),
            scope: g.scope.clone(),
            expires_ms,
            digest: digest.clone(),
            signature,
            note: g.note.clone(),
            request: g.request.clone(),
        };
        // Sent as a JSON object (its members in name order), as it always was.
        let body = serde_json::to_value(&approval)?;
        let reply = gate.approve(&body).await.map_err(refused)?;
        Ok(granted_text(
            &g.run, &g.scope, &run, &digest, &reply, expires, expires_ms,
        ))
    })
}

/// What an approval grants, said as the gate will apply it: a grant is put in force by
/// the first call that needs it (and matches its tool or operation), once; what it adds to
/// the run's limits then counts for the rest of the run.
fn granted_text(
    run: &str,
    scope: &Scope,
    standing: &Standing,
    digest: &str,
    reply: &Logged,
    valid_ms: u64,
    expires_ms: u64,
) -> String {
    use tally_verify::text::{duration, shown};
    let limit = |d: LimitKey| standing.limits.get(&d).map(|l| l.limit);
    let mut gives = Vec::new();
    if let Some(a) = scope.attempts.filter(|&a| a > 0) {
        let plural = if a == 1 { "attempt" } else { "attempts" };
        gives.push(match limit(LimitKey::Attempts) {
            Some(l) => format!(
                "{a} more {plural} (its limit {l} -> {})",
                l.saturating_add(a)
            ),
            None => format!("{a} more {plural}"),
        });
    }
    if let Some(c) = scope.spend().filter(|c| c.0 > 0) {
        use tally_ledger::money::Nanos;
        gives.push(match limit(LimitKey::SpendNanos) {
            Some(l) => format!(
                "{c} more (its spend limit {} -> {})",
                Nanos(l),
                Nanos(l.saturating_add(c.0))
            ),
            None => format!("{c} more"),
        });
    }
    let mut only = Vec::new();
    if let Some(t) = &scope.tool {
        gives.push(format!("the tool {} if it is blocked", shown(t)));
        only.push(format!("tool {}", shown(t)));
    }
    if let Some(o) = &scope.operation {
        only.push(format!("operation {}", shown(o)));
    }
    let by = if only.is_empty() {
        "the first call that needs it".to_owned()
    } else {
        format!("the first call of {} that needs it", only.join(" and "))
    };
    format!(
        "approval {} recorded at seq {} for run {}: {}; put in force by {by} (one use: the grant is then spent, what it added stays); valid for {} (until {})",
        digest.get(..16).unwrap_or(digest),
        reply.seq,
        shown(run),
        gives.join(", "),
        duration(valid_ms),
        tally_verify::text::after_start(expires_ms)
    )
}

/// `tally runs --json`: every run the gate holds, as `GET /v1/runs` answers, in the
/// daemon's order (open runs first, then the nearest to a limit, then by name: the live
/// page's order), each with its closeness and last refusal. The text form is
/// `top::runs_text`.
pub fn runs(args: &RunsArgs) -> Result<Exit> {
    let socket = args.operator_socket.as_path();
    block_on(async {
        let runs = gate(socket).await?.runs().await.map_err(refused)?;
        // As a JSON value, so its keys are in the order they always were (by name).
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::to_value(&runs)?)?
        );
        Ok(Exit::Success)
    })
}

/// Pause, resume or kill a run.
pub fn lifecycle(args: &RunArgs, action: RunAction) -> Result<Exit> {
    let (socket, run) = (args.operator_socket.as_path(), args.run.as_str());
    block_on(async {
        gate(socket)
            .await?
            .act(run, action)
            .await
            .map_err(refused)?;
        outln!(
            "run {}: {} done",
            tally_verify::text::shown(run),
            action.as_str()
        );
        Ok(Exit::Success)
    })
}

/// Settle what an attempt holds (`tally settle`), from the upstream's own figure.
pub fn settle(args: &SettleArgs) -> Result<Exit> {
    let nanos = match (&args.usd, args.release) {
        (Some(usd), false) => {
            tally_ledger::money::parse_usd(usd.trim())
                .map_err(|e| {
                    anyhow::anyhow!("--usd {usd}: {e} (give exact US dollars, like 0.0137)")
                })?
                .0
        }
        _ => 0,
    };
    let (socket, run) = (args.operator_socket.as_path(), args.run.as_str());
    block_on(async {
        let req = tally_api::SettleRequest {
            attempt: args.attempt,
            settled_nanos: nanos,
        };
        let logged = gate(socket)
            .await?
            .settle(run, &req)
            .await
            .map_err(refused)?;
        outln!(
            "run {} attempt {}: settled {} (seq {})",
            tally_verify::text::shown(run),
            args.attempt,
            tally_ledger::money::Nanos(nanos),
            logged.seq
        );
        Ok(Exit::Success)
    })
}

#[cfg(test)]
mod tests {
    use super::duration_ms;

    #[test]
    fn durations() {
        assert_eq!(duration_ms("10m").unwrap(), 600_000);
        assert_eq!(duration_ms("500ms").unwrap(), 500);
        assert_eq!(duration_ms("2h").unwrap(), 7_200_000);
        assert!(duration_ms("10").is_err());
        assert!(duration_ms("0s").is_err());
        assert!(duration_ms("x").is_err());
        assert!(duration_ms("99999999999999999999d").is_err());
    }
}
