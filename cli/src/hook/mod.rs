//! `tally hook claude-code`: Claude Code's `PreToolUse` and `PostToolUse` hooks, answered
//! by the gate.
//!
//! Claude Code runs the hook once per event with the event's JSON on stdin. Before a
//! tool runs, the hook asks the gate (`POST /v1/check`) and prints the hook's decision:
//! `allow`, `deny` (the model reads the reason) or `ask` (the human is prompted). The
//! allowed attempt's number is kept in a 0600 file named by the tool call's id, so the
//! `PostToolUse` (or `PostToolUseFailure`) event records its outcome. Anything the hook
//! cannot do (a malformed payload, the daemon down, a refusal it does not understand)
//! fails closed: exit 2, which blocks the tool call, with the reason on stderr.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::{json, Value};
use tally_daemon::client::{Client, Method};

use crate::output::{errln, outln};
use crate::Exit;

/// The largest payload read from stdin (a tool's input and response are bounded by the
/// model's context; anything larger is not a hook payload).
const MAX_PAYLOAD: u64 = 16 << 20;

/// How `tally hook claude-code` was asked to work.
#[derive(Clone, Debug)]
pub struct Hook {
    /// The daemon's agent socket.
    pub socket: PathBuf,
    /// The run; default `claude-code-SESSION`.
    pub run: Option<String>,
    /// Where allowed attempts wait for their outcome.
    pub state_dir: Option<PathBuf>,
    /// Effect classes by Claude Code tool name, over the built-in ones.
    pub effects: BTreeMap<String, String>,
    /// Print no decision for an allow: Claude Code's own permission rules and prompts
    /// then apply as if the hook were not there.
    pub defer: bool,
}

/// The fields of a hook payload the gate needs (Claude Code's hooks reference); others
/// are ignored, as Claude Code adds fields over time.
#[derive(Debug, Deserialize)]
struct Payload {
    hook_event_name: String,
    session_id: String,
    tool_name: String,
    #[serde(default)]
    tool_input: Option<Value>,
    tool_use_id: Option<String>,
    #[serde(default)]
    tool_response: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

/// What Claude Code's hook prints for a `PreToolUse` decision.
fn decision(choice: &str, reason: &str) -> Value {
    json!({
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": choice,
            "permissionDecisionReason": reason,
        }
    })
}

/// The effect class of a Claude Code tool: reads, edits (a second identical edit leaves
/// the file as the first did), and everything else (shell commands, MCP tools, agents)
/// as writes that are not safe to repeat.
fn effect_of(tool: &str, overrides: &BTreeMap<String, String>) -> String {
    if let Some(e) = overrides.get(tool) {
        return e.clone();
    }
    match tool {
        "Read" | "Grep" | "Glob" | "LS" | "WebFetch" | "WebSearch" | "TodoRead"
        | "NotebookRead" | "BashOutput" => "read",
        "Edit" | "MultiEdit" | "Write" | "NotebookEdit" | "TodoWrite" => "idempotent_write",
        _ => "non_idempotent_write",
    }
    .to_owned()
}

/// The gate's tool name: `claude-code/Bash`; an MCP tool `mcp__github__create_issue` is
/// `github/create_issue`, the name the MCP proxy gives it too.
fn gate_tool(tool: &str) -> String {
    if let Some(rest) = tool.strip_prefix("mcp__") {
        if let Some((server, name)) = rest.split_once("__") {
            return format!("{server}/{name}");
        }
    }
    format!("claude-code/{tool}")
}

/// Whether a `PostToolUse` response says the tool failed.
fn failed(response: &Value) -> bool {
    response.get("is_error").and_then(Value::as_bool) == Some(true)
        || response.get("isError").and_then(Value::as_bool) == Some(true)
        || response.get("success").and_then(Value::as_bool) == Some(false)
        || response.get("interrupted").and_then(Value::as_bool) == Some(true)
        || response.get("error").is_some_and(|e| !e.is_null())
}

/// Run the hook: read the payload from stdin, answer on stdout. The exit code is 0 when
/// the hook's answer is on stdout, 2 (block) when it failed closed.
pub fn claude_code(h: &Hook) -> Result<Exit> {
    let mut raw = Vec::new();
    std::io::stdin()
        .take(MAX_PAYLOAD + 1)
        .read_to_end(&mut raw)
        .context("reading the hook payload from stdin")?;
    match answer(h, &raw) {
        Ok(Some(out)) => {
            outln!("{out}");
            Ok(Exit::Success)
        }
        Ok(None) => Ok(Exit::Success),
        Err(e) => {
            // Exit 2 blocks the call; Claude Code shows stderr to the model.
            errln!("tally hook: the tool call is blocked: {e:#}");
            Ok(Exit::Error)
        }
    }
}

fn answer(h: &Hook, raw: &[u8]) -> Result<Option<Value>> {
    if raw.len() as u64 > MAX_PAYLOAD {
        bail!("the payload is larger than {MAX_PAYLOAD} bytes: not a Claude Code hook payload");
    }
    let p: Payload = serde_json::from_slice(raw).context(
        "the payload on stdin is not a Claude Code hook payload (JSON with hook_event_name, session_id, tool_name)",
    )?;
    let run = match &h.run {
        Some(r) => r.clone(),
        None => format!("claude-code-{}", p.session_id),
    };
    match p.hook_event_name.as_str() {
        "PreToolUse" => pre(h, &run, &p).map(Some),
        "PostToolUse" | "PostToolUseFailure" => post(h, &p).map(|()| None),
        other => bail!(
            "hook event `{}` is not one tally answers: install it for PreToolUse and PostToolUse",
            tally_verify::text::shown(other)
        ),
    }
}

fn pre(h: &Hook, run: &str, p: &Payload) -> Result<Value> {
    let effect = effect_of(&p.tool_name, &h.effects);
    let mut check = json!({
        "run": run,
        "tool": gate_tool(&p.tool_name),
        "effect": effect,
    });
    if let Some(args) = &p.tool_input {
        check["args"] = args.clone();
    }
    let (status, reply) = block_on(async {
        let (status, reply) = request(&h.socket, "/v1/check", &check).await?;
        if status == 404 && reply["error"]["code"] == "run_not_found" {
            // The session's first call: its run starts now, under the policy's ceiling.
            let start =
                json!({"run": run, "goal": format!("Claude Code session {}", p.session_id)});
            let (s, r) = request(&h.socket, "/v1/runs", &start).await?;
            if s != 201 && !(s == 409 && r["error"]["code"] == "run_exists") {
                return Ok((s, r));
            }
            return request(&h.socket, "/v1/check", &check).await;
        }
        Ok((status, reply))
    })?;
    if status != 200 {
        bail!(
            "the gate refused the request ({status} {}): {}",
            reply["error"]["code"].as_str().unwrap_or("error"),
            reply["error"]["message"].as_str().unwrap_or("no message")
        );
    }
    let reason = reply["reason"].as_str().unwrap_or("");
    let action = reply["action"].as_str().unwrap_or("");
    let after = reply["retry_after_ms"]
        .as_u64()
        .map(|ms| format!("; retry after {ms} ms"))
        .unwrap_or_default();
    match reply["decision"].as_str() {
        Some("allow") => {
            let attempt = reply["attempt"]
                .as_u64()
                .context("the gate allowed the call but gave no attempt number")?;
            if let Some(id) = &p.tool_use_id {
                remember(h, &p.session_id, id, run, attempt)?;
            }
            if h.defer {
                return Ok(json!({}));
            }
            Ok(decision(
                "allow",
                &format!("tally: allowed, attempt {attempt} of run {run}"),
            ))
        }
        Some("deny") => Ok(decision(
            "deny",
            &format!(
                "tally refused this call: {reason}: {} (action {action}{after}). {}",
                meaning(reason),
                advice(action)
            ),
        )),
        Some("require_approval") => {
            let cause = reply["cause"].as_str().unwrap_or(reason);
            Ok(decision(
                "ask",
                &format!(
                    "tally: this call needs a human's approval ({cause}); approve it here, or grant more with `tally approve --run {}`",
                    tally_verify::text::shown(run)
                ),
            ))
        }
        _ => bail!("the gate's answer has no decision: {reply}"),
    }
}

/// What a reason code means, for the model (the gate's codes; empty for an unknown one).
fn meaning(reason: &str) -> &'static str {
    tally_ledger::Reason::ALL
        .iter()
        .find(|r| r.as_str() == reason)
        .map_or("", |r| r.meaning())
}

/// What the model should do after a refusal, by its action (the gate's actions).
fn advice(action: &str) -> &'static str {
    match action {
        "retry" => "Wait as long as it says, then try again.",
        "ask" => "Ask the user: a human must grant more before this call can be made.",
        _ => "Do not try this call again; tell the user what happened.",
    }
}

fn post(h: &Hook, p: &Payload) -> Result<()> {
    let Some(id) = &p.tool_use_id else {
        bail!("the payload has no tool_use_id: its outcome cannot be matched to its check");
    };
    let Some((run_of, attempt)) = recall(h, &p.session_id, id)? else {
        // No allow was recorded for it (the PreToolUse hook is not installed, or it
        // refused): nothing to settle.
        errln!(
            "tally hook: no allowed attempt is waiting for tool call {}; install the hook for PreToolUse too",
            tally_verify::text::shown(id)
        );
        return Ok(());
    };
    let status = if p.hook_event_name == "PostToolUseFailure"
        || p.error.as_ref().is_some_and(|e| !e.is_null())
        || p.tool_response.as_ref().is_some_and(failed)
    {
        "error"
    } else {
        "ok"
    };
    let mut body = json!({"run": run_of, "attempt": attempt, "status": status});
    // A digest of what the tool returned (never the result itself): re-reading a file an
    // edit changed, or re-running a test after a fix, is progress, not a loop.
    if let Some(result) = p.tool_response.as_ref().or(p.error.as_ref()) {
        body["result_digest"] = json!(tally_ledger::decision::args_digest(result));
    }
    let (code, reply) = block_on(request(&h.socket, "/v1/outcome", &body))?;
    if code != 200 {
        bail!(
            "the gate did not record the outcome ({code} {}): {}",
            reply["error"]["code"].as_str().unwrap_or("error"),
            reply["error"]["message"].as_str().unwrap_or("no message")
        );
    }
    forget(h, &p.session_id, id)
}

/// Where allowed attempts wait: `--state-dir`, else `$XDG_RUNTIME_DIR/tally-hook`, else
/// `/tmp/tally-hook-UID`; created 0700, and refused if anyone else could write it.
fn state_dir(h: &Hook) -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let uid = rustix::process::getuid().as_raw();
    let dir = match (&h.state_dir, std::env::var_os("XDG_RUNTIME_DIR")) {
        (Some(d), _) => d.clone(),
        (None, Some(x)) => Path::new(&x).join("tally-hook"),
        (None, None) => std::env::temp_dir().join(format!("tally-hook-{uid}")),
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(&dir).with_context(|| format!("{}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
        bail!(
            "{} must be a directory of yours that only you can use (mode 0700): fix it or give --state-dir",
            dir.display()
        );
    }
    Ok(dir)
}

/// One waiting attempt's file: named by a digest of the session and tool call ids, so
/// neither reaches the file system as a path.
fn slot(h: &Hook, session: &str, id: &str) -> Result<PathBuf> {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"tally hook slot v1\n");
    hasher.update(&(session.len() as u64).to_le_bytes());
    hasher.update(session.as_bytes());
    hasher.update(id.as_bytes());
    Ok(state_dir(h)?.join(hasher.finalize().to_hex().as_str()))
}

fn remember(h: &Hook, session: &str, id: &str, run: &str, attempt: u64) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // The directory is the user's own, 0700 (checked): nobody else can plant a link.
    let path = slot(h, session, id)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("keeping the attempt in {}", path.display()))?;
    let body = json!({"run": run, "attempt": attempt}).to_string();
    f.write_all(body.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

fn recall(h: &Hook, session: &str, id: &str) -> Result<Option<(String, u64)>> {
    let path = slot(h, session, id)?;
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not an attempt the hook wrote", path.display()))?;
    match (v["run"].as_str(), v["attempt"].as_u64()) {
        (Some(run), Some(attempt)) => Ok(Some((run.to_owned(), attempt))),
        _ => bail!("{} is not an attempt the hook wrote", path.display()),
    }
}

fn forget(h: &Hook, session: &str, id: &str) -> Result<()> {
    let path = slot(h, session, id)?;
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

async fn request(socket: &Path, path: &str, body: &Value) -> Result<(u16, Value)> {
    let mut c = Client::unix(socket).await.with_context(|| {
        format!(
            "connecting to the gate at {} (is `tally serve` running?)",
            socket.display()
        )
    })?;
    let reply = c
        .request(
            Method::POST,
            path,
            Some("application/json"),
            body.to_string(),
        )
        .await
        .with_context(|| format!("{path}: the gate did not answer"))?;
    let value: Value = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
    Ok((reply.status.as_u16(), value))
}

fn block_on<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_and_effects() {
        let none = BTreeMap::new();
        assert_eq!(effect_of("Read", &none), "read");
        assert_eq!(effect_of("Edit", &none), "idempotent_write");
        assert_eq!(effect_of("Bash", &none), "non_idempotent_write");
        assert_eq!(effect_of("mcp__x__y", &none), "non_idempotent_write");
        let mut map = BTreeMap::new();
        map.insert("Bash".to_owned(), "read".to_owned());
        assert_eq!(effect_of("Bash", &map), "read");
        assert_eq!(gate_tool("Bash"), "claude-code/Bash");
        assert_eq!(
            gate_tool("mcp__github__create_issue"),
            "github/create_issue"
        );
        assert_eq!(gate_tool("mcp__odd"), "claude-code/mcp__odd");
    }

    #[test]
    fn failures_in_a_tool_response() {
        assert!(failed(&json!({"is_error": true})));
        assert!(failed(&json!({"success": false})));
        assert!(failed(&json!({"interrupted": true, "stdout": ""})));
        assert!(!failed(&json!({"stdout": "ok", "interrupted": false})));
        assert!(!failed(&json!({"success": true, "filePath": "/x"})));
    }
}
