//! Act 2's gate story: agents ask the gate on its agent socket (a retry storm, a payment
//! whose outcome is unknown, a reservation over budget that a human approves).

use std::path::Path;

use tally_api::GateClient;

use crate::error::{Context, DemoError, Result};
use crate::output::outln;
use crate::standing::standing;

/// POST a JSON body to the gate; the JSON answer.
async fn ask(
    gate: &mut GateClient,
    path: &str,
    body: serde_json::Value,
) -> Result<serde_json::Value> {
    gate.post(path, &body)
        .await
        .with_context(|| format!("the gate's answer to {path}"))
}

fn said(a: &serde_json::Value) -> String {
    match a["decision"].as_str() {
        Some("allow") => format!("allow (attempt {})", a["attempt"]),
        Some(d) => format!(
            "{d}: {} (action {})",
            a["reason"].as_str().unwrap_or("?"),
            a["action"].as_str().unwrap_or("?")
        ),
        None => format!("error: {a}"),
    }
}

/// The gate's part of the story. Returns whether every decision was the one it must be.
pub(crate) async fn gate_story(
    socket: &Path,
    operator_socket: &Path,
    dana: &tally_ledger::keys::ApproverKey,
) -> Result<bool> {
    let mut c = GateClient::new(socket);
    let mut ok = retry_storm(&mut c, socket, operator_socket).await?;
    ok &= lost_post(&mut c, operator_socket).await?;
    ok &= approved_reservation(&mut c, operator_socket, dana).await?;
    if !ok {
        outln!("  the gate did not decide as it must (see above)");
    }
    Ok(ok)
}

/// Run `export-q3`: 8 workers retry a failing export; the shared cap allows 3.
async fn retry_storm(c: &mut GateClient, socket: &Path, operator_socket: &Path) -> Result<bool> {
    use serde_json::json;
    outln!("A retry storm: 8 workers of run `export-q3` retry a failing report export.");
    ask(
        c,
        "/v1/runs",
        json!({"run": "export-q3", "goal": "export the Q3 report", "budget": {"attempts": 20}}),
    )
    .await?;
    let (mut allowed, mut refused) = (0, 0);
    let mut last_refusal = String::new();
    let mut stop_reason = String::new();
    for _round in 0..3 {
        let mut tasks = Vec::new();
        for w in 0..8 {
            let socket = socket.to_path_buf();
            tasks.push(tokio::spawn(async move {
                let mut c = GateClient::new(&socket);
                let check = json!({"run": "export-q3", "worker": format!("worker-{w}"), "tool": "reports.export",
                    "operation": "export.create", "effect": "read", "args": {"quarter": 3}});
                let a = ask(&mut c, "/v1/check", check).await?;
                if a["decision"] == "allow" {
                    let out = json!({"run": "export-q3", "attempt": a["attempt"], "status": "error", "worker": format!("worker-{w}")});
                    ask(&mut c, "/v1/outcome", out).await?;
                }
                Ok::<_, DemoError>(a)
            }));
        }
        for t in tasks {
            let a = t.await??;
            if a["decision"] == "allow" {
                allowed += 1;
            } else {
                refused += 1;
                last_refusal = said(&a);
                stop_reason = a["reason"].as_str().unwrap_or_default().to_owned();
            }
        }
    }
    outln!("  24 asks: {allowed} allowed, {refused} refused ({last_refusal}). The cap is shared: no worker can reset it.");
    let ok = allowed == 3;
    // The workers stop the run with the gate's reason: the handoff then says why.
    ask(c, "/v1/runs/export-q3/stop", json!({"reason": stop_reason})).await?;
    outln!("  {}", standing(operator_socket, "export-q3").await?);

    Ok(ok)
}

/// Run `lost-post`: a payment whose outcome is unknown is not paid twice.
async fn lost_post(c: &mut GateClient, operator_socket: &Path) -> Result<bool> {
    use serde_json::json;
    outln!("A payment whose outcome is unknown: run `lost-post` must not pay twice.");
    ask(
        c,
        "/v1/runs",
        json!({"run": "lost-post", "goal": "pay invoice 4411", "budget": {"spend_nanos": 5_000_000_000u64}}),
    )
    .await?;
    let pay = json!({"run": "lost-post", "tool": "payments", "operation": "payments.create", "effect": "non_idempotent_write",
        "args": {"invoice": 4411, "cents": 12000}, "reserve_nanos": 1_200_000_000u64});
    let first = ask(c, "/v1/check", pay.clone()).await?;
    outln!("  pay:   {}", said(&first));
    ask(
        c,
        "/v1/outcome",
        json!({"run": "lost-post", "attempt": first["attempt"], "status": "timeout"}),
    )
    .await?;
    outln!("  the payment timed out: nobody knows whether it went through");
    let again = ask(c, "/v1/check", pay).await?;
    outln!("  retry: {}", said(&again));
    let ok = first["decision"] == "allow" && again["cause"] == "outcome_unknown_non_idempotent";
    outln!(
        "  it stays open until a human checks the payment: {}",
        standing(operator_socket, "lost-post").await?
    );

    Ok(ok)
}

/// Run `summarize`: a reservation over budget asks a human; dana's signed approval lets
/// the next ask through.
async fn approved_reservation(
    c: &mut GateClient,
    operator_socket: &Path,
    dana: &tally_ledger::keys::ApproverKey,
) -> Result<bool> {
    use serde_json::json;
    outln!("A reservation over budget: run `summarize` asks a human.");
    ask(
        c,
        "/v1/runs",
        json!({"run": "summarize", "goal": "summarize the inbox", "budget": {"spend_nanos": 500_000_000}}),
    )
    .await?;
    let big = json!({"run": "summarize", "tool": "llm", "operation": "summarize", "effect": "read", "reserve_nanos": 400_000_000});
    let one = ask(c, "/v1/check", big.clone()).await?;
    ask(
        c,
        "/v1/outcome",
        json!({"run": "summarize", "attempt": one["attempt"], "status": "ok", "settled_nanos": 350_000_000}),
    )
    .await?;
    let two = ask(c, "/v1/check", json!({"run": "summarize", "tool": "llm", "operation": "summarize.more", "effect": "read", "reserve_nanos": 400_000_000})).await?;
    outln!("  first $0.40: {}; settled $0.35", said(&one));
    outln!("  next $0.40:  {}", said(&two));
    let mut ok = two["decision"] == "require_approval";
    // A human looks, and grants $0.30 more for that one operation, for ten minutes.
    let mut op = GateClient::new(operator_socket);
    let at = op.run("summarize").await?.at_ms;
    let scope = tally_ledger::decision::Scope {
        nanos: Some(300_000_000),
        operation: Some("summarize.more".into()),
        ..Default::default()
    };
    let expires_ms = at + 600_000;
    let digest = tally_policy::approval::digest("summarize", "dana", &scope, expires_ms);
    let signature = tally_policy::approval::sign(dana.signing_key(), &digest);
    let approved = ask(
        &mut op,
        "/v1/approvals",
        json!({"run": "summarize", "approver": "dana", "scope": scope, "expires_ms": expires_ms,
               "digest": digest, "signature": signature, "note": "the inbox is long this week"}),
    )
    .await?;
    outln!(
        "  dana approves $0.30 more for summarize.more (signed, one use, 10 min): seq {}",
        approved["seq"]
    );
    let three = ask(c, "/v1/check", json!({"run": "summarize", "tool": "llm", "operation": "summarize.more", "effect": "read", "reserve_nanos": 400_000_000})).await?;
    outln!("  asked again: {}", said(&three));
    ok &= three["decision"] == "allow";
    ask(
        c,
        "/v1/outcome",
        json!({"run": "summarize", "attempt": three["attempt"], "status": "ok", "settled_nanos": 380_000_000}),
    )
    .await?;
    outln!("  settled $0.38: the inbox is summarized");
    ask(c, "/v1/runs/summarize/stop", json!({"reason": "completed"})).await?;
    outln!("  {}", standing(operator_socket, "summarize").await?);
    Ok(ok)
}
