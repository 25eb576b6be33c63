//! `tally keys create|list|revoke` and `tally token`: the operator socket's keys and run
//! tokens (docs/KEYS.md). Labels are the operator's but shown escaped and bounded, as
//! anything read back from a socket is.

use anyhow::Result;
use tally_api::client::Method;
use tally_verify::text::shown;
use tally_wire::{KeyCreate, KeyCreated, KeyInfo, RunToken};

use crate::cli::{KeyCreateArgs, KeyListArgs, KeyRevokeArgs, KeysCommand, RunArgs};
use crate::operator::{block_on, duration_ms, gate, refused};
use crate::output::outln;
use crate::Exit;

/// A label's characters shown in a listing.
const SHOWN_LABEL_CHARS: usize = 40;

/// `tally keys ...`.
pub fn keys(command: &KeysCommand) -> Result<Exit> {
    match command {
        KeysCommand::Create(args) => create(args),
        KeysCommand::List(args) => list(args),
        KeysCommand::Revoke(args) => revoke(args),
    }
}

fn create(args: &KeyCreateArgs) -> Result<Exit> {
    let asked = KeyCreate {
        principal: args.principal,
        label: args.label.clone(),
        run_window_ms: args.run_window.as_deref().map(duration_ms).transpose()?,
        budget_per_day_nanos: args
            .budget_per_day
            .as_deref()
            .map(|usd| {
                tally_record::money::parse_usd(usd)
                    .map(|n| n.0)
                    .map_err(|e| anyhow::anyhow!("--budget-per-day: {e}"))
            })
            .transpose()?,
        runs_per_day: args.runs_per_day,
    };
    block_on(async {
        let made: KeyCreated = gate(&args.operator_socket)
            .await?
            .post("/v1/keys", &asked)
            .await
            .map_err(refused)?;
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&made)?);
        } else {
            outln!("{}", made.key);
            outln!(
                "key {} for uid {}: shown this once; tally keeps only its MAC (revoke: tally keys revoke {})",
                made.info.id,
                made.info.principal,
                made.info.id
            );
        }
        Ok(Exit::Success)
    })
}

fn list(args: &KeyListArgs) -> Result<Exit> {
    block_on(async {
        let keys: Vec<KeyInfo> = gate(&args.operator_socket)
            .await?
            .request(Method::GET, "/v1/keys", None)
            .await
            .map_err(refused)?;
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&keys)?);
            return Ok(Exit::Success);
        }
        outln!("ID                PRINCIPAL  CREATED               REVOKED               SPEND TODAY  LABEL");
        for k in &keys {
            outln!("{}", row(k));
        }
        Ok(Exit::Success)
    })
}

/// One key's line: its label escaped and cut to [`SHOWN_LABEL_CHARS`].
fn row(k: &KeyInfo) -> String {
    let label = k.label.as_deref().unwrap_or("-");
    let mut cut: String = label.chars().take(SHOWN_LABEL_CHARS).collect();
    if cut.len() < label.len() {
        cut.push_str("...");
    }
    let when = |ms: u64| {
        tally_record::words::utc(ms)
            .trim_end_matches(" UTC")
            .to_owned()
    };
    format!(
        "{:<17} {:<10} {:<21} {:<21} {:>12}  {}",
        shown(&k.id),
        k.principal,
        when(k.created_ms),
        k.revoked_ms.map_or_else(|| "-".to_owned(), when),
        format!("${}", tally_record::money::Nanos(k.spend_today_nanos)),
        shown(&cut)
    )
}

fn revoke(args: &KeyRevokeArgs) -> Result<Exit> {
    block_on(async {
        let path = format!("/v1/keys/{}/revoke", percent(&args.id));
        let k: KeyInfo = gate(&args.operator_socket)
            .await?
            .request(Method::POST, &path, None)
            .await
            .map_err(refused)?;
        outln!(
            "key {}: revoked, every call with it is refused",
            shown(&k.id)
        );
        Ok(Exit::Success)
    })
}

/// `tally token --run RUN`: the run's token again.
pub fn token(args: &RunArgs) -> Result<Exit> {
    block_on(async {
        let path = format!("{}/token", tally_api::run_path(&args.run));
        let t: RunToken = gate(&args.operator_socket)
            .await?
            .request(Method::GET, &path, None)
            .await
            .map_err(refused)?;
        outln!("{}", t.token);
        Ok(Exit::Success)
    })
}

/// A key id as a path segment: an id is hex, anything else is escaped.
fn percent(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
