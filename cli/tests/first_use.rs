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

/// The acts of a demo's output (`== N. Title` headings), each with its lines.
fn acts(text: &str) -> Vec<(String, usize)> {
    let mut acts: Vec<(String, usize)> = vec![("(before act 1)".into(), 0)];
    for line in text.lines() {
        if line.starts_with("== ") {
            acts.push((line.to_string(), 0));
        } else if let Some(last) = acts.last_mut() {
            last.1 += 1;
        }
    }
    acts
}

/// Durations as `603701 ms`, run clocks as `t+44 ms`: what a person should never have to
/// read.
fn unreadable_numbers(text: &str) -> Vec<String> {
    let mut bad = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for w in words.windows(2) {
            let digits = w[0].trim_start_matches(['(', 't', '+']);
            let ms = w[1].trim_end_matches([',', ')', '.', ';', ':']) == "ms"
                || digits.ends_with("ms") && digits.trim_end_matches("ms").parse::<u64>().is_ok();
            if (ms
                && digits
                    .trim_end_matches("ms")
                    .parse::<u64>()
                    .is_ok_and(|n| n >= 1000))
                || w[0].contains("t+")
            {
                bad.push(line.to_string());
            }
        }
        if line.contains("t+") || line.contains("ms all told") {
            bad.push(line.to_string());
        }
    }
    bad
}

/// `tally demo` tells its story in about a screen per act (`--verbose` prints every
/// loop, finding and handoff), with numbers a person reads and no jargon, says where
/// its files are (removed at the end unless `--dir` keeps them), names its export
/// `.tally`, and its handoffs agree with what it narrated.
#[test]
fn the_demo_reads_as_a_story() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let out = run(d, &["demo"], "");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{}", self::text(&out));
    for (act, lines) in acts(&text) {
        assert!(lines <= 45, "{act} takes {lines} lines:\n{text}");
    }
    let bad = unreadable_numbers(&text);
    assert!(
        bad.is_empty(),
        "numbers a person should not have to read:\n{}",
        bad.join("\n")
    );
    // The model act: the agent loops on the model through the proxy until the budget
    // refuses a call before it reaches the model; the model API saw the operator's key
    // on every call and the token on none; the stopped run's token is dead.
    let model_act = text
        .split("\n== ")
        .find(|a| a.starts_with("3."))
        .unwrap_or_else(|| panic!("no act 3:\n{text}"));
    assert!(model_act.contains("  call 1: "), "{model_act}");
    assert!(
        model_act.contains("refused before it reached the model: HTTP 403"),
        "{model_act}"
    );
    assert!(
        model_act.contains("the agent's token on none"),
        "{model_act}"
    );
    assert!(model_act.contains("refused now (HTTP 401)"), "{model_act}");
    for jargon in [
        "taken as recorded",
        "accepted as recorded",
        "group commit",
        "fsynced",
    ] {
        assert!(!text.contains(jargon), "jargon `{jargon}`:\n{text}");
    }
    assert!(
        text.contains("removed") && text.contains("tally demo --dir"),
        "it does not say its files go away, or how to keep them:\n{text}"
    );
    // The export has the one extension used everywhere.
    assert!(text.contains("ledger.tally holds"), "{text}");
    assert!(!text.contains(".tex"), "{text}");

    // Everything, and the files kept.
    let kept = d.join("kept");
    let out = run(d, &["demo", "--verbose", "--dir", "kept"], "");
    let verbose = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{}", self::text(&out));
    assert!(
        verbose.lines().count() > text.lines().count() + 100,
        "{verbose}"
    );
    assert!(
        verbose.contains("Run normal: \"Fix the flaky login test\""),
        "{verbose}"
    );
    let bad = unreadable_numbers(&verbose);
    assert!(
        bad.is_empty(),
        "numbers a person should not have to read:\n{}",
        bad.join("\n")
    );
    let export = kept.join("ledger.tally");
    assert!(export.is_file(), "no {}", export.display());
    assert!(verbose.contains(&export.display().to_string()), "{verbose}");

    // What the demo narrated about each run it sent through the gate (acts 2 and 3, from
    // the gate's own view of the run) is what the exported ledger's handoff says (act 6, and
    // `tally handoff` on the kept files), line for line.
    let act = |text: &str, n: &str| -> Vec<String> {
        text.split("\n== ")
            .find(|a| a.starts_with(n))
            .unwrap_or_else(|| panic!("no act {n}:\n{text}"))
            .lines()
            .map(str::to_owned)
            .collect()
    };
    for (run, told) in [
        ("export-q3", "2."),
        ("lost-post", "2."),
        ("summarize", "2."),
        ("mcp-reports", "2."),
        ("model-agent", "3."),
    ] {
        let said = |lines: Vec<String>| -> String {
            let tag = format!("run {run}: ");
            let line = lines
                .iter()
                .find_map(|l| l.find(&tag).map(|at| l[at..].to_owned()))
                .unwrap_or_else(|| panic!("no line says where {run} stands:\n{text}"));
            line
        };
        let narrated = said(act(&text, told));
        assert_eq!(narrated, said(act(&text, "6.")), "{text}");
        let handoff = ok(
            d,
            &[
                "handoff",
                "kept/ledger.tally",
                "--key",
                "kept/ledger/ledger.pub",
                "--auditor-key",
                "kept/auditor.key",
                "--run",
                run,
                "--json",
            ],
            "",
        );
        let handoff: Value = serde_json::from_str(&handoff).unwrap();
        let h = &handoff["handoffs"][0];
        let state = match h["stop"]["reason"].as_str() {
            Some(reason) => format!("stopped ({reason})"),
            None => "running".to_owned(),
        };
        let from_ledger = format!(
            "run {run}: {state}; {} of {} attempts used; {}¢ settled",
            h["attempts"]["used"], h["attempts"]["limit"], h["spend"]["settled_cents"]
        );
        assert_eq!(
            narrated, from_ledger,
            "the demo and its handoff disagree: {h}"
        );
        // And the kept demo narrated the same as the default one.
        assert_eq!(said(act(&verbose, told)), from_ledger, "{verbose}");
    }
}

/// The export's extension is one name everywhere a user meets it: the docs, the
/// README, the CLI's help and test cases, the demo and the daemon's `GET /v1/export`
/// file name. Every file named as the output of an export, or as what `verify`,
/// `loops`, `handoff` or `stats` read, ends `.tally` (it was `.tex` in some places and
/// `.tally-export` in others).
#[test]
fn the_export_extension_is_one_name_everywhere() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files: Vec<PathBuf> = vec![root.join("README.md"), root.join("SECURITY.md")];
    for dir in [
        "docs",
        "cli/tests/cmd",
        "cli/src",
        "daemon/src",
        "clients/python",
        "clients/node",
    ] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension()
                .is_some_and(|x| ["md", "toml", "rs", "yaml"].iter().any(|y| x == *y))
            {
                files.push(p);
            }
        }
    }
    let mut named = 0;
    let mut wrong = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for line in text.lines() {
            let words: Vec<&str> = line
                .split(|c: char| c.is_whitespace() || "`'\"(),;=".contains(c))
                .filter(|w| !w.is_empty())
                .collect();
            for w in words.windows(2) {
                let reads = ["verify", "loops", "handoff", "stats"].contains(&w[0])
                    && !w[1].starts_with('-')
                    && w[1].contains('.');
                let export = ["--out", "-o", "filename"].contains(&w[0]) && line.contains("export");
                let name = w[1].trim_matches(|c: char| c == '\\' || c == '"');
                // A file name: a stem, one dot, an extension; not `...`, not a sentence's
                // full stop, not a key, an anchor or a policy.
                let file = name.rsplit_once('.').is_some_and(|(stem, ext)| {
                    !stem.is_empty()
                        && !stem.ends_with('.')
                        && stem.chars().last().is_some_and(|c| c.is_alphanumeric())
                        && !ext.is_empty()
                        && ext.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                });
                let other = ["key", "pub", "cp", "txt", "md", "ndjson", "sock", "proof"]
                    .iter()
                    .any(|e| name.ends_with(&format!(".{e}")));
                if !(reads || export) || !file || other {
                    continue;
                }
                named += 1;
                if !name.ends_with(".tally") {
                    wrong.push(format!("{}: {line}", f.display()));
                }
            }
            for ext in [".tex ", ".tex\"", ".tex`", ".tally-export"] {
                if line.contains(ext) {
                    wrong.push(format!("{}: {line}", f.display()));
                }
            }
        }
    }
    assert!(
        named > 10,
        "the scan found only {named} export names: it reads nothing"
    );
    assert!(
        wrong.is_empty(),
        "export files not named NAME.tally:\n{}",
        wrong.join("\n")
    );
    // The daemon names its download so, and `tally export --help` says so.
    let api = std::fs::read_to_string(root.join("daemon/src/api.rs")).unwrap();
    assert!(
        api.contains("filename=\\\"ledger.tally\\\""),
        "GET /v1/export's file name"
    );
    let tmp = tempfile::tempdir().unwrap();
    assert!(ok(tmp.path(), &["export", "--help"], "").contains("NAME.tally"));
}

/// docs/CLI.md names every flag of every command (`tally CMD --help`, subcommands of
/// `witness`, `policy` and `hook` too), so a user reading it finds each one.
#[test]
fn cli_md_covers_every_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/CLI.md"))
        .unwrap();
    let commands = |args: &[&str]| -> Vec<String> {
        let help = ok(d, &[args, &["--help"]].concat(), "");
        help.lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| !l.is_empty())
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .filter(|c| c != "help")
            .collect()
    };
    let mut missing = Vec::new();
    let mut seen = 0;
    for sub in commands(&[]) {
        let mut leaves = vec![vec![sub.clone()]];
        if ["witness", "policy", "hook"].contains(&sub.as_str()) {
            leaves = commands(&[&sub])
                .into_iter()
                .map(|s| vec![sub.clone(), s])
                .collect();
        }
        for leaf in leaves {
            let args: Vec<&str> = leaf.iter().map(String::as_str).collect();
            for line in ok(d, &[&args[..], &["--help"]].concat(), "").lines() {
                let Some(flag) = line
                    .split_whitespace()
                    .map(|w| w.trim_end_matches(','))
                    .find(|w| w.starts_with("--"))
                else {
                    continue;
                };
                if !line.trim_start().starts_with('-')
                    || ["--help", "--quiet", "--version"].contains(&flag)
                {
                    continue;
                }
                seen += 1;
                if !doc.contains(flag) {
                    missing.push(format!("tally {} {flag}", leaf.join(" ")));
                }
            }
        }
    }
    assert!(seen > 50, "only {seen} flags found: the help was not read");
    assert!(
        missing.is_empty(),
        "docs/CLI.md does not name:\n{}",
        missing.join("\n")
    );
}
