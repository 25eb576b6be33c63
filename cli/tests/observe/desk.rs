//! The human's desk: a pending approval request in `tally top` (tmux), answered there
//! with an approver's key, and on the live page (headless Chromium) with its countdown and
//! the commands that answer it.

use super::page::Browser;
use super::*;

/// The call the agent makes twice: its second attempt is past the run's one attempt.
fn send_mail() -> Value {
    // A bidi override in the preview: shown as `\u{202e}`, never applied.
    json!({"run": "desk-run", "tool": "email.send", "operation": "send:42",
           "effect": "non_idempotent_write", "target": "smtp", "worker": "w2",
           "args": {"to": "x@example.com"}, "args_preview": "to x@example.com \u{202e}moc.live"})
}

/// A ledger whose policy lists the approver `dana` (`dir/dana.key`), served with
/// `extra`; a run with one attempt and a ten-minute deadline, its attempt used, and
/// [`send_mail`] refused `require_approval`: the daemon and the request's id.
fn asked(dir: &Path, extra: &[&str]) -> (Daemon, String) {
    tally().init(dir, "");
    let approvers = ok(dir, &["keygen", "--approver", "--out", "dana.key"]);
    std::fs::write(dir.join("policy.toml"), approvers).expect("policy");
    let served = tally().serve(dir, extra);
    let (status, v) = served.agent(
        "POST",
        "/v1/runs",
        Some(json!({"run": "desk-run", "budget": {"attempts": 1, "deadline_ms": 600_000}})),
    );
    assert_eq!(status, 201, "{v}");
    served.call("desk-run", "search", json!({"q": 1}));
    let (status, a) = served.agent("POST", "/v1/check", Some(send_mail()));
    assert_eq!(
        (status, &a["decision"]),
        (200, &json!("require_approval")),
        "{a}"
    );
    let (status, list) = served.operator_text("/v1/approvals");
    assert_eq!(status, 200, "{list}");
    let list: Value = serde_json::from_str(&list).expect("json");
    assert_eq!(list[0]["state"], "pending", "{list}");
    let id = list[0]["id"].as_str().expect("id").to_owned();
    (served, id)
}

/// `tally top --approver-key` in tmux: the pending request with its countdown, `a`
/// approves it (signed as `tally approve` signs), and the agent's retry of the call is
/// then allowed. Without the key, `a` says what is missing and grants nothing.
#[test]
fn tally_top_approves_a_pending_request_with_a_key_press() {
    if !tally_testkit::have(
        "tmux",
        &["-V"],
        "apt-get install tmux (README, Development)",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let (served, id) = asked(dir, &[]);
    let tmux = super::tmux::Tmux::new(dir);
    let top = |session: &str, key: &str| {
        let command = format!(
            "cd {} && TERM=xterm-256color {} top --operator-socket operator.sock {key}",
            dir.display(),
            tally().path().display()
        );
        tmux.start(session, 220, &command);
    };
    let pane = |session: &str, want: &dyn Fn(&str) -> bool| tmux.pane(session, want);

    // Read only: `a` says what is missing, and the call is still refused.
    top("desk-ro", "");
    let text = pane("desk-ro", &|t| t.contains(&id));
    assert!(
        text.contains("min") && text.contains("left"),
        "no countdown:\n{text}"
    );
    assert!(
        text.contains("\\u{202e}"),
        "the bidi override is not escaped:\n{text}"
    );
    tmux.keys("desk-ro", &["a"]);
    pane("desk-ro", &|t| t.contains("without --approver-key"));
    let (_, again) = served.agent("POST", "/v1/check", Some(send_mail()));
    assert_eq!(again["decision"], "require_approval", "{again}");
    // The retry asked again: its request is the pending one, the first is moot.
    let (_, first) = served.operator_text(&format!("/v1/approvals/{id}"));
    let first: Value = serde_json::from_str(&first).expect("json");
    assert_eq!(first["state"], "moot", "{first}");
    let (_, list) = served.operator_text("/v1/approvals");
    let list: Value = serde_json::from_str(&list).expect("json");
    assert_eq!(list[0]["state"], "pending", "{list}");
    let id = list[0]["id"].as_str().expect("id").to_owned();

    // With the key: `a` on the selected (only pending) request. (Started before the
    // read-only one quits: the tmux server ends with its last session.)
    top("desk", "--approver-key dana.key");
    tmux.keys("desk-ro", &["q"]);
    pane("desk", &|t| t.contains(&id) && t.contains("> "));
    tmux.keys("desk", &["a"]);
    let text = pane("desk", &|t| t.contains(&format!("approved {id}")));
    assert!(!text.contains("not approved"), "{text}");
    let (status, retry) = served.agent("POST", "/v1/check", Some(send_mail()));
    assert_eq!(
        (status, &retry["decision"]),
        (200, &json!("allow")),
        "{retry}"
    );
    // The approval answers that request: the gate lists it approved.
    let (status, one) = served.operator_text(&format!("/v1/approvals/{id}"));
    assert_eq!(status, 200, "{one}");
    let one: Value = serde_json::from_str(&one).expect("json");
    assert_eq!(
        (&one["state"], &one["answered_by"]),
        (&json!("approved"), &json!("dana")),
        "{one}"
    );
    tmux.keys("desk", &["q"]);
    let _ = tmux.run(&["kill-server"]);
}

/// `tally deny REQUEST --note`: the agent's next try of that call is refused
/// `denied_by_approver` (stop) with the note; a different call still asks.
#[test]
fn tally_deny_makes_the_next_try_of_that_call_a_stop_with_the_note() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let (served, id) = asked(dir, &[]);
    let said = ok(
        dir,
        &[
            "deny",
            &id,
            "--operator-socket",
            "operator.sock",
            "--key",
            "dana.key",
            "--note",
            "wrong address",
        ],
    );
    assert!(
        said.contains(&format!("denied {id} recorded at seq")),
        "{said}"
    );
    let (_, retry) = served.agent("POST", "/v1/check", Some(send_mail()));
    assert_eq!(
        (&retry["reason"], &retry["action"], &retry["note"]),
        (
            &json!("denied_by_approver"),
            &json!("stop"),
            &json!("wrong address")
        ),
        "{retry}"
    );
    let mut other = send_mail();
    other["args"] = json!({"to": "y@example.com"});
    let (_, a) = served.agent("POST", "/v1/check", Some(other));
    assert_eq!(a["decision"], "require_approval", "{a}");
    // Answered: a second denial is refused, and nothing more is recorded.
    let again = tally().run(
        dir,
        &[
            "deny",
            &id,
            "--operator-socket",
            "operator.sock",
            "--key",
            "dana.key",
            "--note",
            "no",
        ],
        "",
    );
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        err.contains("approval_refused") && err.contains("denied"),
        "{err}"
    );
}

/// `tally top --approver-key` in tmux: `d` asks for a note on the status line, Enter
/// denies the selected request with it (signed as `tally deny` signs), and the agent's
/// retry of that call is then refused `denied_by_approver`, with the note.
#[test]
fn tally_top_denies_a_pending_request_with_a_note() {
    if !tally_testkit::have(
        "tmux",
        &["-V"],
        "apt-get install tmux (README, Development)",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let (served, id) = asked(dir, &[]);
    let tmux = super::tmux::Tmux::new(dir);
    let pane = |want: &dyn Fn(&str) -> bool| tmux.pane("deny", want);
    let command = format!(
        "cd {} && TERM=xterm-256color {} top --operator-socket operator.sock --approver-key dana.key",
        dir.display(),
        tally().path().display()
    );
    tmux.start("deny", 220, &command);
    pane(&|t| t.contains(&id) && t.contains("> "));
    // `q` typed into the note is part of it, not a quit; Esc would cancel.
    tmux.keys("deny", &["d"]);
    pane(&|t| t.contains(&format!("why deny {id}?")));
    tmux.keys("deny", &["-l", "not to x, quite"]);
    pane(&|t| t.contains("not to x, quite_"));
    tmux.keys("deny", &["Enter"]);
    let text = pane(&|t| t.contains(&format!("denied {id} recorded")));
    assert!(!text.contains("not denied"), "{text}");
    let (status, retry) = served.agent("POST", "/v1/check", Some(send_mail()));
    assert_eq!(status, 200, "{retry}");
    assert_eq!(
        (&retry["decision"], &retry["reason"], &retry["action"]),
        (&json!("deny"), &json!("denied_by_approver"), &json!("stop")),
        "{retry}"
    );
    assert_eq!(
        (&retry["denied_by"], &retry["note"]),
        (&json!("dana"), &json!("not to x, quite")),
        "{retry}"
    );
    let (status, one) = served.operator_text(&format!("/v1/approvals/{id}"));
    assert_eq!(status, 200, "{one}");
    let one: Value = serde_json::from_str(&one).expect("json");
    assert_eq!(
        (&one["state"], &one["answered_by"], &one["note"]),
        (&json!("denied"), &json!("dana"), &json!("not to x, quite")),
        "{one}"
    );
    tmux.keys("deny", &["q"]);
    let _ = tmux.run(&["kill-server"]);
}

/// The live page in headless Chromium shows the pending request (its id, countdown,
/// context, escaped, and the exact commands that answer it, with this daemon's operator
/// socket), and no longer once it is not pending. A screenshot is taken and checked.
#[test]
fn the_live_page_shows_the_desk() {
    let Some(mut browser) = Browser::start() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let (_served, id) = asked(dir, &["--metrics-listen", &addr]);
    browser.send(json!({"nav": format!("http://{addr}/live")}));
    let cell = |c: &str| {
        format!(
            "(() => {{ const e = document.querySelector('#requests tbody tr {c}'); return e ? e.textContent : null; }})()"
        )
    };
    browser.until(&cell("td.id"), Duration::from_secs(20), |v| {
        v == id.as_str()
    });
    let left = browser.eval(&cell("td.expires"));
    assert!(
        left.as_str()
            .is_some_and(|s| s.ends_with(" left") && s.contains("min")),
        "{left}"
    );
    let call = browser.eval(&cell("td.call"));
    let call = call.as_str().unwrap_or_default();
    assert!(call.starts_with("write email.send op send:42"), "{call}");
    assert!(
        call.contains("\\u{202e}") && !call.contains('\u{202e}'),
        "{call}"
    );
    assert_eq!(browser.eval(&cell("td.cost")), "1 attempt for email.send");
    let sock = dir.join("operator.sock");
    let approve = format!(
        "tally approve {id} --operator-socket {} --key APPROVER.key",
        sock.display()
    );
    assert_eq!(browser.eval(&cell("code.approve")), approve.as_str());
    let deny = browser.eval(&cell("code.deny"));
    assert!(
        deny.as_str()
            .is_some_and(|d| d.starts_with(&format!("tally deny {id} "))),
        "{deny}"
    );
    // Read only: nothing on the page submits anything.
    assert_eq!(
        browser.eval("document.querySelectorAll('form, input, button.answer').length"),
        0
    );
    let shot = dir.join("desk.png");
    browser.send(json!({"shot": shot}));
    let png = std::fs::read(&shot).expect("screenshot");
    assert_eq!(&png[1..4], b"PNG");
    assert!(png.len() > 10_000, "{} bytes", png.len());

    // `tally approve ID`, the command the page shows: the request is answered, no longer
    // pending, and the page drops it.
    ok(
        dir,
        &[
            "approve",
            &id,
            "--operator-socket",
            "operator.sock",
            "--key",
            "dana.key",
        ],
    );
    browser.until(
        "document.querySelectorAll('#requests tbody tr').length",
        Duration::from_secs(5),
        |v| v.as_u64() == Some(0),
    );
}
