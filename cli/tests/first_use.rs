//! What a new user and an attacker meet first, on the real binary and daemon: verify
//! naming the entry whose bytes were changed, without the auditor key; errors that say
//! what, where and what to do; numbers as a person reads them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// The binary under test: this build's, or `TALLY_UNDER_TEST` (to show a test fails
/// against an older build).
fn tally() -> Command {
    Command::new(
        std::env::var_os("TALLY_UNDER_TEST")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tally"))),
    )
}

fn run(dir: &Path, args: &[&str], stdin: &str) -> Output {
    let mut child = tally()
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tally");
    // A command that does not read its input may have exited already.
    let _ = child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes());
    child.wait_with_output().expect("tally runs")
}

fn ok(dir: &Path, args: &[&str], stdin: &str) -> String {
    let out = run(dir, args, stdin);
    assert!(out.status.success(), "tally {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `n` decisions of run `run` (a start, then allows), as NDJSON.
fn decisions(run: &str, n: usize) -> String {
    let mut s = format!("{{\"run\":\"{run}\",\"kind\":\"start\"}}\n");
    for i in 1..n {
        s += &format!(
            "{{\"run\":\"{run}\",\"kind\":\"allow\",\"tool\":\"http\",\"effect\":\"read\",\"args\":{{\"page\":{i}}},\"attempt\":{i}}}\n"
        );
    }
    s
}

/// A ledger in `dir/ledger` whose commit groups end at the given seqs (each `append` is
/// one group, sealed by one checkpoint), exported to `dir/ledger.tally`.
fn ledger_with_groups(dir: &Path, ends: &[u64]) {
    ok(dir, &["keygen", "--out", "auditor.key"], "");
    ok(
        dir,
        &["init", "--ledger", "ledger", "--recipient", "auditor.pub"],
        "",
    );
    let mut last = 0;
    for (i, &end) in ends.iter().enumerate() {
        let input = decisions(&format!("r{i}"), (end - last) as usize);
        ok(dir, &["append", "--ledger", "ledger"], &input);
        last = end;
    }
    ok(
        dir,
        &["export", "--ledger", "ledger", "--out", "ledger.tally"],
        "",
    );
}

/// The byte offsets of each entry frame's payload in an export, in seq order.
fn entry_offsets(export: &[u8]) -> Vec<usize> {
    let mut at = 16; // "tally export v1\n"
    let mut entries = Vec::new();
    while at + 5 <= export.len() {
        let tag = export[at];
        let len = u32::from_be_bytes(export[at + 1..at + 5].try_into().unwrap()) as usize;
        if tag == 1 {
            entries.push(at + 5);
        }
        if tag == 0xff {
            break;
        }
        at += 5 + len;
    }
    entries
}

/// `dir/ledger.tally` with one byte of entry `seq` flipped at `offset` into the entry
/// (the header is 98 bytes; a decision's ciphertext follows), as `dir/NAME`.
fn flipped(dir: &Path, name: &str, seq: usize, offset: usize) {
    let mut bytes = std::fs::read(dir.join("ledger.tally")).unwrap();
    let at = entry_offsets(&bytes)[seq] + offset;
    bytes[at] ^= 0x20;
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// The first line of `tally verify FILE` and its JSON findings' (seq, kind), with and
/// without the auditor key.
fn verdicts(dir: &Path, file: &str) -> Vec<(String, Vec<(u64, String)>)> {
    let keyless = ["verify", file, "--key", "ledger/ledger.pub"];
    let keyed = [&keyless[..], &["--auditor-key", "auditor.key"]].concat();
    [&keyless[..], &keyed[..]]
        .iter()
        .map(|args| {
            let out = run(dir, args, "");
            assert_eq!(out.status.code(), Some(1), "{}", text(&out));
            let first = String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .unwrap_or_default()
                .to_string();
            let json = run(dir, &[&args[..], &["--json"]].concat(), "");
            let report: Value = serde_json::from_slice(&json.stdout).expect("JSON");
            let findings = report["findings"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    (
                        f["seq"].as_u64().unwrap(),
                        f["kind"].as_str().unwrap().to_string(),
                    )
                })
                .collect();
            (first, findings)
        })
        .collect()
}

/// One byte of entry 71's ciphertext flipped, entry 71 the last of its commit group: the
/// checkpoint after it signs a head its bytes no longer hash to. Verify names seq 71, with
/// the auditor key and without it (it said `first bad seq 72 ... checkpoint_head_mismatch`
/// without the key).
#[test]
fn keyless_verify_names_the_entry_whose_bytes_were_changed_before_a_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ledger_with_groups(d, &[71, 80]);
    flipped(d, "t.tally", 71, 98 + 10);
    for (first, findings) in verdicts(d, "t.tally") {
        assert!(
            first.starts_with("TAMPERED: first bad seq 71: "),
            "{first}\n{findings:?}"
        );
        assert!(
            findings.iter().all(|(seq, _)| *seq == 71),
            "one altered entry, findings elsewhere: {findings:?}"
        );
        assert_eq!(findings[0].1, "entry_altered", "{findings:?}");
    }
}

/// Entry 70's ciphertext flipped inside a group: the next entry still links to its old
/// hash, and the checkpoint after that next entry vouches for it. Verify names seq 70.
#[test]
fn keyless_verify_names_the_entry_whose_bytes_were_changed_inside_a_group() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ledger_with_groups(d, &[71, 80]);
    flipped(d, "t.tally", 70, 98 + 10);
    for (first, findings) in verdicts(d, "t.tally") {
        assert!(
            first.starts_with("TAMPERED: first bad seq 70: "),
            "{first}\n{findings:?}"
        );
        assert!(
            findings.iter().all(|(seq, _)| *seq == 70),
            "one altered entry, findings elsewhere: {findings:?}"
        );
    }
}

/// The other way round: entry 72's previous-hash changed (its own header). Entry 71 is
/// intact and sealed; verify names 72, never 71.
#[test]
fn a_changed_link_is_named_where_it_is_not_on_the_entry_before() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ledger_with_groups(d, &[71, 80]);
    // prev_hash is at bytes 38..70 of the header (docs/FORMAT.md).
    flipped(d, "t.tally", 72, 38 + 3);
    let (first, findings) = &verdicts(d, "t.tally")[0];
    assert!(
        first.starts_with("TAMPERED: first bad seq 72: "),
        "{first}\n{findings:?}"
    );
    assert_eq!(findings[0], (72, "broken_link".to_string()), "{findings:?}");
}

/// `tally serve` on an agent and an operator socket in `dir` (a new ledger), stopped
/// (SIGTERM) when dropped.
struct Serve {
    child: std::process::Child,
    agent: PathBuf,
    operator: PathBuf,
}

impl Serve {
    fn start(dir: &Path, policy: &str) -> Serve {
        ok(dir, &["keygen", "--out", "auditor.key"], "");
        ok(
            dir,
            &["init", "--ledger", "ledger", "--recipient", "auditor.pub"],
            "",
        );
        std::fs::write(dir.join("policy.toml"), policy).unwrap();
        let agent = dir.join("agent.sock");
        let operator = dir.join("operator.sock");
        let child = tally()
            .args([
                "serve",
                "--ledger",
                "ledger",
                "--policy",
                "policy.toml",
                "--socket",
            ])
            .arg(&agent)
            .arg("--operator-socket")
            .arg(&operator)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn tally serve");
        let serve = Serve {
            child,
            agent,
            operator,
        };
        let started = std::time::Instant::now();
        while !(serve.agent.exists() && serve.operator.exists()) {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(30),
                "tally serve did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        serve
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request on a Unix socket: the status and the body as JSON (`Null` if
/// it is not JSON).
fn http(
    socket: &Path,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> (u16, Value) {
    use std::io::Read;
    let mut s = std::os::unix::net::UnixStream::connect(socket).expect("connect");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: tally\r\nConnection: close\r\n");
    if let Some(t) = content_type {
        head += &format!("Content-Type: {t}\r\n");
    }
    head += &format!("Content-Length: {}\r\n\r\n{body}", body.len());
    // A refusal before the body (415) may close the connection before it is all read.
    let _ = s.write_all(head.as_bytes());
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let status = reply[9..12].parse().expect("a status line");
    let body = reply.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn post(socket: &Path, path: &str, body: &str) -> (u16, Value) {
    http(socket, "POST", path, Some("application/json"), body)
}

/// `(status, code, field)` of an error reply.
fn error(reply: (u16, Value)) -> (u16, String, String) {
    let (status, body) = reply;
    let e = &body["error"];
    (
        status,
        e["code"].as_str().unwrap_or("-").to_string(),
        e["field"].as_str().unwrap_or("-").to_string(),
    )
}

fn triple(status: u16, code: &str, field: &str) -> (u16, String, String) {
    (status, code.to_string(), field.to_string())
}

/// The gate's endpoints answer the codes DAEMON.md promises, with the field at fault: a
/// wrong type, an unknown field, a bad name and a missing field are not `invalid_json`.
#[test]
fn gate_bodies_are_refused_with_the_documented_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(tmp.path(), "");
    let s = &serve.agent;
    assert_eq!(post(s, "/v1/runs", r#"{"run":"r1"}"#).0, 201);
    let cases: &[(&str, &str, (u16, &str, &str))] = &[
        (
            "/v1/runs",
            r#"{"run":"r2","budget":{"attempts":"5"}}"#,
            (400, "invalid_type", "budget.attempts"),
        ),
        (
            "/v1/runs",
            r#"{"run":"r2","colour":"red"}"#,
            (400, "unknown_field", "colour"),
        ),
        (
            "/v1/runs",
            r#"{"goal":"no name"}"#,
            (400, "missing_field", "run"),
        ),
        ("/v1/runs", r#"{"run":""}"#, (400, "invalid_value", "run")),
        (
            "/v1/runs",
            r#"{"run":"r2","budget":[5]}"#,
            (400, "invalid_type", "budget"),
        ),
        ("/v1/runs", r#"["r2"]"#, (400, "invalid_type", "-")),
        ("/v1/runs", r#"{"run":"r2"} {}"#, (400, "invalid_json", "-")),
        (
            "/v1/check",
            r#"{"run":"r1","tool":"t","effect":"sideways"}"#,
            (400, "invalid_value", "effect"),
        ),
        (
            "/v1/check",
            r#"{"run":"r1","tool":5,"effect":"read"}"#,
            (400, "invalid_type", "tool"),
        ),
        (
            "/v1/check",
            r#"{"run":"r1","tool":"t","effect":"read","attempt":1}"#,
            (400, "unknown_field", "attempt"),
        ),
        (
            "/v1/check",
            r#"{"run":"r1","effect":"read"}"#,
            (400, "missing_field", "tool"),
        ),
        (
            "/v1/check",
            r#"{"run":"","tool":"t","effect":"read"}"#,
            (400, "invalid_value", "run"),
        ),
        (
            "/v1/outcome",
            r#"{"run":"r1","attempt":1,"status":"meh"}"#,
            (400, "invalid_value", "status"),
        ),
        (
            "/v1/outcome",
            r#"{"run":"r1","attempt":"1","status":"ok"}"#,
            (400, "invalid_type", "attempt"),
        ),
        (
            "/v1/runs/r1/stop",
            r#"{"reason":"bored"}"#,
            (400, "invalid_value", "reason"),
        ),
    ];
    let mut wrong = Vec::new();
    for (path, body, (status, code, field)) in cases {
        let got = error(post(s, path, body));
        if got != triple(*status, code, field) {
            wrong.push(format!("{path} {body}: {got:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The message says what: not "missing" for a name that is there but empty.
    let (_, body) = post(s, "/v1/runs", r#"{"run":""}"#);
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        !message.contains("missing") && message.contains("empty"),
        "{message}"
    );
}

/// A gate body that is not JSON by its content type (`curl -d` sends a form) is `415`,
/// as DAEMON.md says, and changes nothing.
#[test]
fn a_form_encoded_gate_body_is_415() {
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(tmp.path(), "");
    let s = &serve.agent;
    for (path, body) in [
        ("/v1/runs", r#"{"run":"r3"}"#),
        ("/v1/check", r#"{"run":"r3","tool":"t","effect":"read"}"#),
        ("/v1/outcome", r#"{"run":"r3","attempt":1,"status":"ok"}"#),
        ("/v1/runs/r3/stop", r#"{}"#),
    ] {
        let got = error(http(
            s,
            "POST",
            path,
            Some("application/x-www-form-urlencoded"),
            body,
        ));
        assert_eq!(got, triple(415, "unsupported_media_type", "-"), "{path}");
    }
    // Nothing was started.
    assert_eq!(
        error(http(s, "GET", "/v1/runs/r3", None, "")).1,
        "run_not_found"
    );
    // No content type at all is JSON, as for raw decisions.
    assert_eq!(http(s, "POST", "/v1/runs", None, r#"{"run":"r3"}"#).0, 201);
}

/// The operator's routes on the agent socket say whose they are and where they are, not
/// "no route"; and the agents' routes on the operator socket likewise.
#[test]
fn routes_on_the_wrong_socket_say_which_socket_serves_them() {
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(tmp.path(), "");
    assert_eq!(post(&serve.agent, "/v1/runs", r#"{"run":"r1"}"#).0, 201);
    for (method, path) in [
        ("POST", "/v1/runs/r1/pause"),
        ("POST", "/v1/runs/r1/resume"),
        ("POST", "/v1/runs/r1/kill"),
        ("POST", "/v1/approvals"),
        ("GET", "/v1/export"),
    ] {
        let (status, body) = http(&serve.agent, method, path, Some("application/json"), "{}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (403, Some("not_authorized")),
            "{method} {path}: {body}"
        );
        assert!(
            message.contains("operator socket") && !message.contains("no route"),
            "{method} {path}: {message}"
        );
    }
    for (method, path) in [
        ("POST", "/v1/check"),
        ("POST", "/v1/outcome"),
        ("POST", "/v1/runs/r1/stop"),
    ] {
        let (status, body) = http(
            &serve.operator,
            method,
            path,
            Some("application/json"),
            "{}",
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(status, 404, "{method} {path}: {body}");
        assert!(
            message.contains("agent socket") && !message.contains("no route"),
            "{method} {path}: {message}"
        );
    }
    // The run was not paused or killed.
    let (_, standing) = http(&serve.agent, "GET", "/v1/runs/r1", None, "");
    assert_eq!(standing["state"], "running", "{standing}");
}

/// `tally policy check FILE` on `policy`: its exit code and standard error.
fn policy_check(policy: &str) -> (Option<i32>, String) {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("policy.toml"), policy).unwrap();
    let out = run(tmp.path(), &["policy", "check", "policy.toml"], "");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A policy error names the key and its line, and says what to write instead.
#[test]
fn a_policy_error_names_the_key_and_the_line() {
    let (code, err) = policy_check("# budgets\n\n[ceiling]\nattempts = \"5\"\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("line 4")
            && err.contains("ceiling.attempts")
            && err.contains("without quotes"),
        "{err}"
    );
    let (code, err) = policy_check("[loops]\nidentical_consecutive = 3\nidentical_calls = 2\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("line 3") && err.contains("loops.identical_calls"),
        "{err}"
    );
    let (code, err) = policy_check("[retries]\nread = 0\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("line 2") && err.contains("retries.read"),
        "{err}"
    );
}

/// Zero where it makes every run useless is refused, naming the key and its line: a
/// ceiling of 0 attempts (no call could ever be made) or a deadline of 0 ms, no open
/// runs at all, a per-tool bar of 0 calls, approvals valid for 0 ms. Zero where it means
/// "none" (no side effects, no polls, no children, no spend) or "off" (a rate) is a
/// policy like any other.
#[test]
fn zero_values_that_make_runs_useless_are_refused() {
    for (policy, key, line) in [
        ("[ceiling]\nattempts = 0\n", "ceiling.attempts", 2),
        ("[ceiling]\ndeadline_ms = 0\n", "ceiling.deadline_ms", 2),
        (
            "[credentials.ci.ceiling]\nattempts = 0\n",
            "credentials.ci.ceiling.attempts",
            2,
        ),
        ("max_open_runs_per_uid = 0\n", "max_open_runs_per_uid", 1),
        ("[loops]\ntool_calls = 0\n", "loops.tool_calls", 2),
        ("[loops]\ntool_window_ms = 0\n", "loops.tool_window_ms", 2),
        (
            "[approvals]\nmax_expiry_ms = 0\n",
            "approvals.max_expiry_ms",
            2,
        ),
    ] {
        let (code, err) = policy_check(policy);
        assert_eq!(code, Some(2), "{policy}: {err}");
        assert!(
            err.contains(key) && err.contains(&format!("line {line}")),
            "{policy}: {err}"
        );
    }
    for policy in [
        "[ceiling]\nside_effects = 0\npolls = 0\ndepth = 0\nspend_cents = 0\n",
        "[rate]\nrun_per_sec = 0\ntool_per_sec = 0\n",
    ] {
        let (code, err) = policy_check(policy);
        assert_eq!(code, Some(0), "{policy}: {err}");
    }
}

/// `--auditor-key` given the public half says so, not "chmod 600".
#[test]
fn an_auditor_key_that_is_the_public_half_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ledger_with_groups(d, &[3]);
    for args in [
        &[
            "verify",
            "ledger",
            "--key",
            "ledger/ledger.pub",
            "--auditor-key",
            "auditor.pub",
        ][..],
        &[
            "handoff",
            "ledger",
            "--key",
            "ledger/ledger.pub",
            "--auditor-key",
            "auditor.pub",
        ][..],
    ] {
        let out = run(d, args, "");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("public") && err.contains("auditor.key") && !err.contains("chmod"),
            "{err}"
        );
    }
}

/// `tally serve --ledger` naming no ledger says what to do: create one with `tally init`.
#[test]
fn serve_on_a_missing_ledger_says_how_to_make_one() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let out = run(d, &["serve", "--ledger", "nodir", "--socket", "s.sock"], "");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("nodir") && err.contains("tally init --ledger nodir"),
        "{err}"
    );
    assert!(!d.join("nodir").exists(), "it made the directory");
}
