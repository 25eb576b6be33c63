//! A Claude Code session of a few hundred tool calls, through both hooks with Claude
//! Code's payloads, under the policy tally ships for it (`tally policy example
//! claude-code`): it passes, its band is measured against the policy's ceilings, and the
//! seed's failing loop is still stopped at the end of it.

use serde_json::{json, Value};

use super::{
    claude_code_policy, failing, hook, npm_test, session_end, standing, tally, through, Served,
};

/// Failing test runs in a row (each but the first after an edit) of each task's fix
/// cycle, the run after the last edit passing: eight tasks, 48 failing runs of 64. The
/// longest streak (10) is twice what opens `[breaker]`'s default breaker.
const CYCLES: [usize; 8] = [4, 10, 3, 8, 6, 9, 2, 6];

/// The measured band of the session below: tool calls, attempts and side effects used.
/// dist/claude-code.toml and docs/PROXY.md give the same numbers.
const BAND_CALLS: u64 = 313;
const BAND_SIDE_EFFECTS: u64 = 136;

/// The session, one tool call at a time: each must be allowed.
struct Session<'a> {
    served: &'a Served,
    calls: u64,
    side_effects: u64,
    reads: u64,
}

impl Session<'_> {
    fn call(&mut self, tool: &str, input: Value, post: &str, result: Value) {
        let id = format!("toolu_{:04}", self.calls);
        let (choice, reason) = through(self.served, tool, &input, &id, post, result);
        assert_eq!(
            choice, "allow",
            "tool call {} ({tool} {input}) of a normal session: {reason}",
            self.calls
        );
        self.calls += 1;
        if matches!(tool, "Bash" | "Edit" | "Write") {
            self.side_effects += 1;
        }
        if tool == "Read" {
            self.reads += 1;
        }
    }

    fn todo(&mut self, task: usize, done: bool) {
        let status = if done { "completed" } else { "in_progress" };
        let todos = json!([
            {"content": format!("Fix failing test {task}"), "status": status, "activeForm": format!("Fixing failing test {task}")},
            {"content": format!("Add a regression test for {task}"), "status": if done { "completed" } else { "pending" }, "activeForm": "Adding a regression test"},
        ]);
        self.call(
            "TodoWrite",
            json!({"todos": todos}),
            "PostToolUse",
            json!({"tool_response": {"oldTodos": [], "newTodos": todos}}),
        );
    }

    fn read(&mut self, path: &str, content: &str) {
        let lines = content.lines().count();
        self.call(
            "Read",
            json!({"file_path": path}),
            "PostToolUse",
            json!({"tool_response": {"type": "text", "file": {"filePath": path, "content": content,
                "numLines": lines, "startLine": 1, "totalLines": lines}}}),
        );
    }

    fn grep(&mut self, pattern: &str, files: &[String]) {
        self.call(
            "Grep",
            json!({"pattern": pattern, "path": "/home/u/project", "output_mode": "files_with_matches"}),
            "PostToolUse",
            json!({"tool_response": {"mode": "files_with_matches", "filenames": files, "numFiles": files.len()}}),
        );
    }

    fn glob(&mut self, pattern: &str, files: &[String]) {
        self.call(
            "Glob",
            json!({"pattern": pattern}),
            "PostToolUse",
            json!({"tool_response": {"filenames": files, "durationMs": 12, "numFiles": files.len(), "truncated": false}}),
        );
    }

    fn edit(&mut self, path: &str, old: &str, new: &str) {
        self.call(
            "Edit",
            json!({"file_path": path, "old_string": old, "new_string": new, "replace_all": false}),
            "PostToolUse",
            json!({"tool_response": {"filePath": path, "oldString": old, "newString": new,
                "originalFile": format!("{old}\n"), "userModified": false, "replaceAll": false,
                "structuredPatch": [{"oldStart": 1, "oldLines": 1, "newStart": 1, "newLines": 1,
                    "lines": [format!("-{old}"), format!("+{new}")]}]}}),
        );
    }

    fn write(&mut self, path: &str, content: &str) {
        self.call(
            "Write",
            json!({"file_path": path, "content": content}),
            "PostToolUse",
            json!({"tool_response": {"type": "create", "filePath": path, "content": content, "structuredPatch": []}}),
        );
    }

    /// `npm test`: node's runner reports each run's duration, so no two outputs are alike.
    fn test_run(&mut self, passes: bool, failing_tests: usize) {
        let run = self.calls;
        let (post, result) = if passes {
            let out = format!(
                "# tests 24\n# pass 24\n# fail 0\n# duration_ms {}.4",
                900 + run
            );
            (
                "PostToolUse",
                json!({"tool_response": {"stdout": out, "stderr": "", "interrupted": false, "isImage": false}}),
            )
        } else {
            (
                "PostToolUseFailure",
                failing(&format!(
                    "# tests 24\n# pass {}\n# fail {failing_tests}\n# duration_ms {}.7",
                    24 - failing_tests,
                    900 + run
                )),
            )
        };
        self.call("Bash", npm_test(), post, result);
    }

    fn shell(&mut self, command: &str, stdout: &str) {
        self.call(
            "Bash",
            json!({"command": command, "description": command}),
            "PostToolUse",
            json!({"tool_response": {"stdout": stdout, "stderr": "", "interrupted": false, "isImage": false}}),
        );
    }

    /// One task: plan, explore, run the tests (they fail), then fix: read, edit, run
    /// them again, until they pass; add a regression test, commit.
    fn task(&mut self, t: usize, fails: usize) {
        let src = format!("/home/u/project/src/mod{t}.js");
        let test = format!("/home/u/project/test/mod{t}.test.js");
        let files: Vec<String> = (0..6)
            .map(|f| format!("/home/u/project/src/mod{t}/part{f}.js"))
            .collect();
        self.todo(t, false);
        self.glob(&format!("src/mod{t}/**/*.js"), &files);
        for (g, pattern) in ["export function", "require\\(", "throw new"]
            .iter()
            .enumerate()
        {
            self.grep(&format!("{pattern} mod{t}"), &files[g..]);
        }
        for f in &files {
            self.read(f, &format!("// {f}\nmodule.exports = {{}};\n"));
        }
        self.read(&test, &format!("test('mod{t}', () => {{}});\n"));
        self.test_run(false, fails);
        for i in 0..fails {
            self.read(&src, &format!("function f{t}() {{ return v{i}; }}\n"));
            if i % 2 == 0 {
                self.grep(&format!("v{i}\\b mod{t}"), &files[..2]);
            }
            self.edit(
                &src,
                &format!("function f{t}() {{ return v{i}; }}"),
                &format!("function f{t}() {{ return v{}; }}", i + 1),
            );
            self.test_run(i + 1 == fails, fails - i);
        }
        self.write(
            &format!("/home/u/project/test/mod{t}.regression.test.js"),
            &format!("test('mod{t} regression', () => {{ assert.ok(f{t}()); }});\n"),
        );
        self.test_run(true, 0);
        self.shell("git diff --stat", &format!(" src/mod{t}.js | 2 +-\n"));
        self.shell(
            &format!("git add -A && git commit -m 'Fix mod{t}'"),
            &format!("[main {t:07x}] Fix mod{t}\n"),
        );
        self.todo(t, true);
    }
}

/// A normal Claude Code session under the shipped policy: eight tasks, each explored
/// (TodoWrite, Glob, Grep, Read), then fixed in a cycle of edits and failing `npm test`
/// runs until they pass (ten failing runs in a row in the longest), a regression test
/// written, committed: 313 tool calls, 136 of them side effects, every one allowed. The
/// ceilings (1000 attempts, 300 side effects) sit about twice above that band (attempts:
/// with the session's model calls in its run too), not orders of magnitude above it. At the session's end the seed's loop (the same failing command
/// again, nothing changed) is still stopped within three runs, and the session's end
/// stops the run with that refusal's reason.
#[test]
fn a_claude_code_session_passes_under_the_shipped_profile() {
    let mut s = Served::start(&claude_code_policy());
    let mut session = Session {
        served: &s,
        calls: 0,
        side_effects: 0,
        reads: 0,
    };
    for (t, fails) in CYCLES.into_iter().enumerate() {
        session.task(t, fails);
    }
    assert!(session.calls >= 300, "{} tool calls", session.calls);
    let v = standing(&s, "claude-code-abc123");
    let limits = &v["limits"];
    let used = |d: &str| limits[d]["used"].as_u64().expect("used");
    let limit = |d: &str| limits[d]["limit"].as_u64().expect("limit");
    // The band: one attempt per tool call, one side effect per Bash, Edit or Write.
    assert_eq!(
        (session.calls, used("attempts"), used("side_effects")),
        (BAND_CALLS, BAND_CALLS, BAND_SIDE_EFFECTS),
        "{v}"
    );
    assert_eq!(session.side_effects, BAND_SIDE_EFFECTS);
    // 104 reads, in seconds here (the test's session runs fast): above the built-in
    // per-tool bar (60 a minute), within the profile's 300.
    assert_eq!(session.reads, 104);
    // Above the band, and not orders of magnitude above it (within three times): side
    // effects about twice the band; attempts 1.6 times the band of the session whose
    // model calls share its run (`--run`: an attempt each, about one per tool call).
    for (d, band) in [
        ("side_effects", BAND_SIDE_EFFECTS),
        ("attempts", 2 * BAND_CALLS),
    ] {
        assert!(
            band < limit(d) && limit(d) <= 3 * band,
            "{d}: the ceiling {} is not just above the band {band}",
            limit(d)
        );
    }

    // The seed's loop, late in the session: the same failing command again and again,
    // nothing changed in between. Its first failure follows the cycle's passing run (a
    // changed result: progress), so the run after it is allowed once more; the third is
    // refused, within the loop bound of three.
    let mut runs = Vec::new();
    for i in 0..3 {
        let (choice, reason) = through(
            &s,
            "Bash",
            &npm_test(),
            &format!("toolu_seed{i}"),
            "PostToolUseFailure",
            failing("# fail 3"),
        );
        runs.push(choice.clone());
        if choice == "deny" {
            assert!(
                reason.contains("retries_exhausted") && reason.contains("action stop"),
                "{reason}"
            );
            break;
        }
    }
    assert_eq!(runs, ["allow", "allow", "deny"], "the seed's loop");
    let (code, _, err) = hook(&s, &session_end("abc123"));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("stopped (retries_exhausted)"),
        "the session's last answer stopped it: {err}"
    );

    // The replay decides every call again under the recorded profile and finds what the
    // gate did; the failing test runs, which no breaker follows, are no retry storm
    // across runs (a tool's breaker's, on the wall clock).
    s.stop();
    let ledger = s.path("ledger");
    let export = s.path("session.tally");
    let (ledger, export) = (ledger.to_string_lossy(), export.to_string_lossy());
    tally(&["export", "--ledger", &ledger, "--out", &export]);
    let key = s.path("ledger").join("ledger.pub");
    let auditor = s.path("auditor.key");
    let (key, auditor) = (key.to_string_lossy(), auditor.to_string_lossy());
    let args = ["--key", &key, "--auditor-key", &auditor, "--json"];
    let out = tally(&[&["verify", &export][..], &args[..]].concat());
    let report: Value = serde_json::from_slice(&out.stdout).expect("verify --json");
    assert_eq!(
        report["replay"]["findings"],
        json!([]),
        "{}",
        report["replay"]
    );
    let out = tally(&[&["loops", &export][..], &args[..]].concat());
    let report: Value = serde_json::from_slice(&out.stdout).expect("loops --json");
    let across_runs: Vec<&Value> = report["loops"]
        .as_array()
        .expect("loops")
        .iter()
        .filter(|l| l["clock"] == "wall")
        .collect();
    assert!(across_runs.is_empty(), "{across_runs:?}");
}
