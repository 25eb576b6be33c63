//! `tally hook claude-code` against the real daemon (`tally serve` on a real socket), fed
//! payloads in the format of Claude Code's hooks reference.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const TALLY: &str = env!("CARGO_BIN_EXE_tally");

fn tally(args: &[&str]) -> std::process::Output {
    let out = Command::new(TALLY)
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

/// A daemon serving a fresh ledger under `policy`; killed on drop.
struct Served {
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Served {
    fn start(policy: &str) -> Served {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
        tally(&["keygen", "--out", &p("auditor.key")]);
        tally(&[
            "init",
            "--ledger",
            &p("ledger"),
            "--recipient",
            &p("auditor.pub"),
        ]);
        std::fs::write(dir.path().join("policy.toml"), policy).expect("policy");
        let child = Command::new(TALLY)
            .args([
                "serve",
                "--ledger",
                &p("ledger"),
                "--socket",
                &p("agent.sock"),
                "--operator-socket",
                &p("operator.sock"),
                "--policy",
                &p("policy.toml"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tally serve");
        let served = Served {
            dir,
            child: Some(child),
        };
        let started = Instant::now();
        while !served.socket().exists() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "tally serve did not open its socket"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        served
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Stop the daemon (SIGTERM, a clean shutdown).
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let started = Instant::now();
            while c.try_wait().expect("wait").is_none() {
                if started.elapsed() > Duration::from_secs(20) {
                    let _ = c.kill();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Run the hook with `payload` on stdin: its exit code, stdout parsed (or Null), stderr.
fn hook(s: &Served, payload: &str) -> (i32, Value, String) {
    let mut child = Command::new(TALLY)
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

    // Malformed payloads fail closed: exit 2 (Claude Code blocks the call), a message
    // that says what is wrong, nothing on stdout.
    for bad in [
        "not json",
        r#"{"hook_event_name":"PreToolUse"}"#,
        r#"{"hook_event_name":"Stop","session_id":"abc123","tool_name":"Read"}"#,
    ] {
        let (code, out, err) = hook(&s, bad);
        assert_eq!((code, &out), (2, &Value::Null), "{bad}");
        assert!(err.contains("blocked"), "{bad}: {err}");
    }

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
/// `make lint` still waits for its outcome.
fn assert_no_waiting(dir: &Path) {
    let left = std::fs::read_dir(dir).expect("state dir").count();
    assert_eq!(left, 1, "waiting attempts in {}", dir.display());
}

/// Issue 20 item 6: identical reads of a file an edit changed in between are progress,
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
