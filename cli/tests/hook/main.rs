//! `tally hook claude-code` against the real daemon (`tally serve` on a real socket), fed
//! payloads in the format of Claude Code's hooks reference.

mod session;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use tally_testkit::{Daemon, Tally};

/// The binary under test: this build's, or `TALLY_UNDER_TEST` (to show a regression test
/// fails against an older build).
fn bin() -> PathBuf {
    Tally::new(env!("CARGO_BIN_EXE_tally")).path().to_path_buf()
}

fn tally(args: &[&str]) -> std::process::Output {
    let out = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run tally");
    assert!(
        out.status.success(),
        "tally {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A daemon serving a fresh ledger under `policy` in a temporary directory; killed on
/// drop.
struct Served {
    daemon: Daemon,
    dir: tempfile::TempDir,
}

impl Served {
    fn start(policy: &str) -> Served {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = Tally::new(bin());
        t.init(dir.path(), policy);
        Served {
            daemon: t.serve(dir.path(), &[]),
            dir,
        }
    }

    fn socket(&self) -> PathBuf {
        self.daemon.agent_socket()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Stop the daemon (SIGTERM, a clean shutdown).
    fn stop(&mut self) {
        self.daemon.stop();
    }
}

/// Run the hook with `payload` on stdin: its exit code, stdout parsed (or Null), stderr.
fn hook(s: &Served, payload: &str) -> (i32, Value, String) {
    let mut child = Command::new(bin())
        .args(["hook", "claude-code", "--socket"])
        .arg(s.socket())
        .arg("--state-dir")
        .arg(s.path("hook-state"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tally hook");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(payload.as_bytes())
        .expect("payload");
    let out = child.wait_with_output().expect("hook output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let value = if stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
    };
    (
        out.status.code().unwrap_or(-1),
        value,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A payload as Claude Code sends it (hooks reference: common fields plus the event's).
fn payload(event: &str, tool: &str, input: Value, id: &str, extra: Value) -> String {
    let mut p = json!({
        "session_id": "abc123",
        "transcript_path": "/home/u/.claude/projects/x/abc123.jsonl",
        "cwd": "/home/u/project",
        "permission_mode": "default",
        "hook_event_name": event,
        "tool_name": tool,
        "tool_input": input,
        "tool_use_id": id,
    });
    if let (Value::Object(p), Value::Object(e)) = (&mut p, extra) {
        p.extend(e);
    }
    p.to_string()
}

fn decision(v: &Value) -> (&str, &str) {
    let o = &v["hookSpecificOutput"];
    assert_eq!(o["hookEventName"], "PreToolUse", "{v}");
    (
        o["permissionDecision"].as_str().unwrap_or("?"),
        o["permissionDecisionReason"].as_str().unwrap_or(""),
    )
}

#[test]
fn claude_code_hooks_allow_deny_and_ask_through_the_gate() {
    let mut s = Served::start("[ceiling]\nside_effects = 2\n");
    let read = json!({"file_path": "/home/u/project/src/lib.rs"});
    let ok = json!({"tool_response": {"type": "text", "file": {"filePath": "/home/u/project/src/lib.rs"}}});

    // The session's first call starts its run; three identical reads are allowed.
    for i in 0..3 {
        let id = format!("toolu_read{i}");
        let (code, out, err) = hook(
            &s,
            &payload("PreToolUse", "Read", read.clone(), &id, json!({})),
        );
        assert_eq!(code, 0, "{err}");
        let (choice, reason) = decision(&out);
        assert_eq!(choice, "allow", "{reason}");
        assert!(reason.contains("attempt"), "{reason}");
        let (code, out, err) = hook(
            &s,
            &payload("PostToolUse", "Read", read.clone(), &id, ok.clone()),
        );
        assert_eq!((code, &out), (0, &Value::Null), "{err}");
    }
    // The fourth is a loop: denied, and the model is told not to try again.
    let (code, out, _) = hook(
        &s,
        &payload("PreToolUse", "Read", read.clone(), "toolu_read3", json!({})),
    );
    assert_eq!(code, 0);
    let (choice, reason) = decision(&out);
    assert_eq!(choice, "deny");
    assert!(
        reason.contains("loop_repeated_call") && reason.contains("action stop"),
        "{reason}"
    );
    // A failed command records an error outcome.
    let (_, out, _) = hook(
        &s,
        &payload(
            "PreToolUse",
            "Bash",
            json!({"command": "make test"}),
            "toolu_b1",
            json!({}),
        ),
    );
    assert_eq!(decision(&out).0, "allow");
    let failure =
        json!({"error": "Command exited with non-zero status code 2", "is_interrupt": false});
    let (code, out, err) = hook(
        &s,
        &payload(
            "PostToolUseFailure",
            "Bash",
            json!({"command": "make test"}),
            "toolu_b1",
            failure,
        ),
    );
    assert_eq!((code, &out), (0, &Value::Null), "{err}");
    let (_, out, _) = hook(
        &s,
        &payload(
            "PreToolUse",
            "Bash",
            json!({"command": "make lint"}),
            "toolu_b2",
            json!({}),
        ),
    );
    assert_eq!(decision(&out).0, "allow");
    // The third side effect is over the ceiling: a human is asked.
    let (code, out, _) = hook(
        &s,
        &payload(
            "PreToolUse",
            "Bash",
            json!({"command": "git push"}),
            "toolu_b3",
            json!({}),
        ),
    );
    assert_eq!(code, 0);
    let (choice, reason) = decision(&out);
    assert_eq!(choice, "ask", "{reason}");
    assert!(reason.contains("side_effect_limit_exceeded"), "{reason}");

    // Malformed payloads, and tool events tally does not answer, fail closed: exit 2
    // (Claude Code blocks the call), a message that says what is wrong, nothing on stdout.
    for bad in [
        "not json",
        r#"{"hook_event_name":"PreToolUse"}"#,
        r#"{"hook_event_name":"PreToolUse","session_id":"abc123"}"#,
        r#"{"hook_event_name":"PermissionRequest","session_id":"abc123","tool_name":"Read"}"#,
    ] {
        let (code, out, err) = hook(&s, bad);
        assert_eq!((code, &out), (2, &Value::Null), "{bad}");
        assert!(err.contains("blocked"), "{bad}: {err}");
    }
    // The end of a turn is not the end of the session: answered with nothing (exit 2
    // would keep Claude from stopping), the run goes on.
    let (code, out, err) = hook(&s, &stop("abc123"));
    assert_eq!((code, &out, err.as_str()), (0, &Value::Null, ""));

    // The daemon down: fail closed too.
    s.stop();
    let (code, out, err) = hook(
        &s,
        &payload(
            "PreToolUse",
            "Read",
            json!({"file_path": "/x"}),
            "toolu_x",
            json!({}),
        ),
    );
    assert_eq!((code, &out), (2, &Value::Null));
    assert!(err.contains("is `tally serve` running?"), "{err}");

    // The ledger holds exactly what the hook was told, and verifies with the replay.
    let ledger = s.path("ledger");
    let export = s.path("x.tally");
    tally(&[
        "export",
        "--ledger",
        &ledger.to_string_lossy(),
        "--out",
        &export.to_string_lossy(),
    ]);
    let out = tally(&[
        "verify",
        &export.to_string_lossy(),
        "--key",
        &ledger.join("ledger.pub").to_string_lossy(),
        "--auditor-key",
        &s.path("auditor.key").to_string_lossy(),
        "--json",
    ]);
    let report: Value = serde_json::from_slice(&out.stdout).expect("verify --json");
    let replay = &report["replay"];
    assert_eq!(replay["findings"], json!([]), "{replay}");
    // start, 3 x (allow, ok), deny, allow + error, allow, require_approval (a deny).
    assert!(replay["replayed"].as_u64().unwrap_or(0) >= 7, "{replay}");
    assert_no_waiting(&s.path("hook-state"));
}

/// Every allowed attempt whose outcome was reported was forgotten; the one allowed
/// `make lint` and the `git push` a human was asked about still wait.
fn assert_no_waiting(dir: &Path) {
    assert_eq!(waiting(dir), 2, "waiting attempts in {}", dir.display());
}

/// The calls waiting in the hook's state directory (files named by a digest).
fn waiting(dir: &Path) -> usize {
    let mut n = 0;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("state dir") {
            let e = e.expect("entry");
            let name = e.file_name().to_string_lossy().into_owned();
            if e.file_type().expect("type").is_dir() {
                todo.push(e.path());
            } else if name.len() == 64 {
                n += 1;
            }
        }
    }
    n
}

/// Claude Code's `Stop` (a turn ended) for `session`.
fn stop(session: &str) -> String {
    json!({"session_id": session, "transcript_path": "/home/u/.claude/projects/x/t.jsonl",
           "cwd": "/home/u/project", "permission_mode": "default",
           "hook_event_name": "Stop", "stop_hook_active": false})
    .to_string()
}

/// Claude Code's `SessionEnd` for `session` (hooks reference: no tool fields).
fn session_end(session: &str) -> String {
    json!({"session_id": session, "transcript_path": "/home/u/.claude/projects/x/t.jsonl",
           "cwd": "/home/u/project", "permission_mode": "default",
           "hook_event_name": "SessionEnd", "reason": "prompt_input_exit"})
    .to_string()
}

/// A tool event of `session`.
fn event(session: &str, event: &str, tool: &str, input: Value, id: &str, extra: Value) -> String {
    let mut p: Value = serde_json::from_str(&payload(event, tool, input, id, extra)).expect("json");
    p["session_id"] = json!(session);
    p.to_string()
}

/// Where `run` stands, asked on the operator socket.
fn standing(s: &Served, run: &str) -> Value {
    let (status, v) = s.daemon.operator("GET", &format!("/v1/runs/{run}"), None);
    assert!(!v.is_null(), "GET /v1/runs/{run}: {status}, not JSON");
    v
}

/// Claude Code's SessionEnd ends the session's run, so sessions do not
/// pile up toward `max_open_runs_per_uid` (before, every tool call of the third session
/// was refused `too_many_runs`). The stop says why the session ended as it did: calls
/// that never reported are recorded `unknown` (a non-idempotent one stops the run
/// `outcome_unknown_non_idempotent`), a last refusal that stopped the agent is the
/// reason, and after an `ask` the run stays open for the human. `Stop` (a turn) ends
/// nothing.
#[test]
fn regression_issue_21_session_end_stops_the_run() {
    let s = Served::start("max_open_runs_per_uid = 2\n[ceiling]\nside_effects = 1\n");
    let read = |n: u64| json!({"file_path": format!("/home/u/project/{n}.rs")});
    let ok = json!({"tool_response": {"type": "text"}});
    for (n, session) in ["s1", "s2", "s3", "s4"].into_iter().enumerate() {
        let id = format!("toolu_{session}");
        let (code, out, err) = hook(
            &s,
            &event(
                session,
                "PreToolUse",
                "Read",
                read(n as u64),
                &id,
                json!({}),
            ),
        );
        assert_eq!(code, 0, "{session}: {err}");
        assert_eq!(decision(&out).0, "allow", "{session}: sessions piled up");
        let (code, _, err) = hook(
            &s,
            &event(
                session,
                "PostToolUse",
                "Read",
                read(n as u64),
                &id,
                ok.clone(),
            ),
        );
        assert_eq!(code, 0, "{err}");
        // A turn ends; the session goes on under its run.
        assert_eq!(hook(&s, &stop(session)).0, 0);
        let (code, out, err) = hook(
            &s,
            &event(
                session,
                "PreToolUse",
                "Read",
                read(10 + n as u64),
                &format!("{id}b"),
                json!({}),
            ),
        );
        assert_eq!((code, decision(&out).0), (0, "allow"), "{err}");
        let (code, out, err) = hook(&s, &session_end(session));
        assert_eq!((code, &out), (0, &Value::Null), "{err}");
        assert!(
            err.contains(&format!("run claude-code-{session} stopped (completed)")),
            "{err}"
        );
        let v = standing(&s, &format!("claude-code-{session}"));
        assert_eq!(
            (&v["state"], &v["stop_reason"]),
            (&json!("stopped"), &json!("completed")),
            "{v}"
        );
    }
    // A Bash call allowed and never reported: recorded unknown, and the run stopped so.
    let (_, out, _) = hook(
        &s,
        &event(
            "s5",
            "PreToolUse",
            "Bash",
            json!({"command": "git push"}),
            "toolu_p",
            json!({}),
        ),
    );
    assert_eq!(decision(&out).0, "allow");
    let (code, _, err) = hook(&s, &session_end("s5"));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("stopped (outcome_unknown_non_idempotent)"),
        "{err}"
    );
    // A session whose last answer asked a human (the side effect over the ceiling):
    // left open for the approval.
    let bash = |c: &str| json!({"command": c});
    for (id, c) in [("toolu_a", "make"), ("toolu_b", "make install")] {
        let (_, out, _) = hook(
            &s,
            &event("s6", "PreToolUse", "Bash", bash(c), id, json!({})),
        );
        if id == "toolu_a" {
            assert_eq!(decision(&out).0, "allow");
            hook(
                &s,
                &event("s6", "PostToolUse", "Bash", bash(c), id, ok.clone()),
            );
        } else {
            assert_eq!(decision(&out).0, "ask");
        }
    }
    let (code, _, err) = hook(&s, &session_end("s6"));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("left open"), "{err}");
    assert_eq!(standing(&s, "claude-code-s6")["state"], "running");
    // A session that ended before any call: nothing to stop.
    let (code, _, err) = hook(&s, &session_end("s7"));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("no run to stop"), "{err}");
    assert_eq!(
        waiting(&s.path("hook-state")),
        0,
        "the ended sessions left nothing"
    );
}

/// After a tool ran, the hook never says it is blocked; and a call the
/// gate asked a human about, then run at Claude Code's prompt, is said to have run
/// outside the budget (not "install the hook for PreToolUse").
#[test]
fn regression_issue_21_post_tool_use_says_what_happened() {
    let mut s = Served::start("[ceiling]\nside_effects = 0\n");
    let push = json!({"command": "git push"});
    let (_, out, _) = hook(
        &s,
        &payload("PreToolUse", "Bash", push.clone(), "toolu_ask", json!({})),
    );
    assert_eq!(decision(&out).0, "ask");
    // The human approved it in Claude Code's prompt: it ran.
    let (code, out, err) = hook(
        &s,
        &payload(
            "PostToolUse",
            "Bash",
            push.clone(),
            "toolu_ask",
            json!({"tool_response": {"stdout": ""}}),
        ),
    );
    assert_eq!((code, &out), (0, &Value::Null), "{err}");
    assert!(
        err.contains("ran without the gate's allow: the gate asked for a human's approval (side_effect_limit_exceeded)")
            && err.contains("tally approve --run claude-code-abc123")
            && !err.contains("install the hook"),
        "{err}"
    );
    // An outcome with nothing waiting for it says so, and what to check.
    let (code, _, err) = hook(
        &s,
        &payload("PostToolUse", "Read", json!({}), "toolu_none", json!({})),
    );
    assert_eq!(code, 0);
    assert!(
        err.contains("no check of it waiting here") && err.contains("--state-dir"),
        "{err}"
    );
    // A read allowed, then the daemon gone before its outcome: the tool ran, so the
    // message says what was not recorded, never that the call is blocked.
    let read = json!({"file_path": "/x"});
    let (_, out, _) = hook(
        &s,
        &payload("PreToolUse", "Read", read.clone(), "toolu_r", json!({})),
    );
    assert_eq!(decision(&out).0, "allow");
    s.stop();
    let (code, out, err) = hook(
        &s,
        &payload(
            "PostToolUse",
            "Read",
            read,
            "toolu_r",
            json!({"tool_response": {}}),
        ),
    );
    assert_eq!((code, &out), (2, &Value::Null));
    assert!(
        err.contains("tool call toolu_r ran, but its outcome was not recorded")
            && err.contains("is `tally serve` running?")
            && !err.contains("blocked"),
        "{err}"
    );
}

/// Identical reads of a file an edit changed in between are progress,
/// not a loop: the hook records a digest of each result (never the result), and the
/// gate's loop rule counts identical calls only while their results stay the same.
#[test]
fn regression_issue_20_reading_a_file_an_edit_changed_is_no_loop() {
    let s = Served::start("");
    let read = json!({"file_path": "/home/u/project/src/lib.rs"});
    for i in 0..6 {
        let id = format!("toolu_reread{i}");
        let (code, out, err) = hook(
            &s,
            &payload("PreToolUse", "Read", read.clone(), &id, json!({})),
        );
        assert_eq!(code, 0, "{err}");
        let (choice, reason) = decision(&out);
        assert_eq!(choice, "allow", "read {i}: {reason}");
        // The file's content after edit number i.
        let changed = json!({"tool_response": {"type": "text",
            "file": {"filePath": "/home/u/project/src/lib.rs", "content": format!("fn v{i}() {{}}")}}});
        let (code, _, err) = hook(
            &s,
            &payload("PostToolUse", "Read", read.clone(), &id, changed),
        );
        assert_eq!(code, 0, "{err}");
    }
}

/// The policy tally ships for Claude Code sessions, as `tally policy example
/// claude-code` prints it (dist/claude-code.toml), and checked by `tally policy check` as
/// an operator would before serving it.
fn claude_code_policy() -> String {
    let out = tally(&["policy", "example", "claude-code"]);
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("claude-code.toml");
    std::fs::write(&file, &text).expect("write the policy");
    let checked = tally(&["policy", "check", &file.to_string_lossy()]);
    let checked = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.contains(": valid; digest"), "{checked}");
    text
}

/// Claude Code's `Edit`, as its hooks send it (`tool_input` and `tool_response`).
fn edit(i: usize) -> (Value, Value) {
    let input = json!({"file_path": "/home/u/project/src/login.js",
        "old_string": format!("return v{i};"), "new_string": format!("return v{};", i + 1), "replace_all": false});
    let response = json!({"tool_response": {"filePath": "/home/u/project/src/login.js",
        "oldString": format!("return v{i};"), "newString": format!("return v{};", i + 1),
        "originalFile": format!("function f() {{ return v{i}; }}\n"),
        "structuredPatch": [{"oldStart": 1, "oldLines": 1, "newStart": 1, "newLines": 1,
            "lines": [format!("-function f() {{ return v{i}; }}"), format!("+function f() {{ return v{}; }}", i + 1)]}],
        "userModified": false, "replaceAll": false}});
    (input, response)
}

/// `Bash npm test`, and its failure as Claude Code reports it (the test's output in it).
fn npm_test() -> Value {
    json!({"command": "npm test", "description": "Run the test suite"})
}

fn failing(output: &str) -> Value {
    json!({"error": format!("Exit code 1\n> login@1.0.0 test\n> node --test\n\n{output}"), "is_interrupt": false})
}

/// One tool call through both hooks: the PreToolUse decision and its reason; the
/// outcome is reported only for an allowed call.
fn through(
    s: &Served,
    tool: &str,
    input: &Value,
    id: &str,
    post: &str,
    result: Value,
) -> (String, String) {
    let (code, out, err) = hook(
        s,
        &payload("PreToolUse", tool, input.clone(), id, json!({})),
    );
    assert_eq!(code, 0, "{err}");
    let (choice, reason) = decision(&out);
    let (choice, reason) = (choice.to_owned(), reason.to_owned());
    if choice == "allow" {
        let (code, out, err) = hook(s, &payload(post, tool, input.clone(), id, result));
        assert_eq!((code, &out), (0, &Value::Null), "{err}");
    }
    (choice, reason)
}

/// A coding agent's fix cycle with Claude Code's real payloads: run the tests, they
/// fail, edit, run them again; twenty times, then they pass. Every call is allowed:
/// each re-run follows an edit that completed (progress), not a retry of the last.
#[test]
fn edit_then_test_twenty_times_is_allowed() {
    let s = Served::start(&claude_code_policy());
    for i in 0..20 {
        let failure = failing(&format!(
            "# tests 12\n# pass {}\n# fail {}",
            i % 12,
            12 - i % 12
        ));
        let (choice, reason) = through(
            &s,
            "Bash",
            &npm_test(),
            &format!("toolu_t{i}"),
            "PostToolUseFailure",
            failure,
        );
        assert_eq!(choice, "allow", "test run {i}: {reason}");
        let (input, response) = edit(i);
        let (choice, reason) = through(
            &s,
            "Edit",
            &input,
            &format!("toolu_e{i}"),
            "PostToolUse",
            response,
        );
        assert_eq!(choice, "allow", "edit {i}: {reason}");
    }
    let passed = json!({"tool_response": {"stdout": "# tests 12\n# pass 12\n# fail 0", "stderr": "", "interrupted": false, "isImage": false}});
    let (choice, reason) = through(&s, "Bash", &npm_test(), "toolu_pass", "PostToolUse", passed);
    assert_eq!(choice, "allow", "{reason}");
    let v = standing(&s, "claude-code-abc123");
    assert_eq!(v["limits"]["attempts"]["used"], 41, "{v}");
}

/// The seed's failing loop: the same failing command again and again with nothing in
/// between. It is stopped within the loop bound (the policy's `identical_consecutive`,
/// 3 by default): here at its second run, as a non-idempotent write retried with
/// nothing changed (`retries_exhausted`, action stop); an edit that failed changes
/// nothing either.
#[test]
fn the_same_failing_command_is_stopped_within_the_loop_bound() {
    let s = Served::start(&claude_code_policy());
    let bound = 3;
    let mut stopped = None;
    for i in 0..=bound {
        if i == 1 {
            let (input, _) = edit(0);
            let failed =
                json!({"error": "String to replace not found in file.", "is_interrupt": false});
            through(&s, "Edit", &input, "toolu_e0", "PostToolUseFailure", failed);
        }
        let (choice, reason) = through(
            &s,
            "Bash",
            &npm_test(),
            &format!("toolu_t{i}"),
            "PostToolUseFailure",
            failing("# fail 3"),
        );
        if choice == "deny" {
            assert!(
                reason.contains("retries_exhausted") && reason.contains("action stop"),
                "{reason}"
            );
            stopped = Some(i);
            break;
        }
        assert_eq!(choice, "allow", "{reason}");
    }
    let at = stopped.expect("the failing loop is stopped within the bound");
    assert!(at <= bound, "stopped at run {at}");
}
