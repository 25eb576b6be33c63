//! `tally top` in tmux and on a pipe.

use super::*;

/// `tally top` in tmux: the table, nearest to a limit first, redrawn as checks come in;
/// `q` quits. On a pipe and under TERM=dumb: one plain table, then exit.
#[test]
fn tally_top_in_tmux_and_on_a_pipe() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    let served = tally().serve(dir, &[]);
    served.start_run("far-from-it", 10);
    served.check("far-from-it", "search", json!({"i": 0}));
    served.start_run("close-to-it", 10);
    for i in 0..8 {
        served.check("close-to-it", "search", json!({"i": i}));
    }
    // A run that spent and was stopped for a long reason: its state and spend are the
    // widest cells, and at 160 columns they are shown whole.
    let (status, v) = served.agent(
        "POST",
        "/v1/runs",
        Some(json!({"run": "paid-invoice", "budget": {"attempts": 10, "spend_cents": 200}})),
    );
    assert_eq!(status, 201, "{v}");
    let (status, a) = served.agent(
        "POST",
        "/v1/check",
        Some(
            json!({"run": "paid-invoice", "tool": "search", "effect": "read",
                    "args": {"invoice": 4411}, "reserve_cents": 120}),
        ),
    );
    assert_eq!((status, &a["decision"]), (200, &json!("allow")), "{a}");
    let (status, v) = served.agent(
        "POST",
        "/v1/outcome",
        Some(json!({"run": "paid-invoice", "attempt": a["attempt"], "status": "ok", "settled_cents": 115})),
    );
    assert_eq!(status, 200, "{v}");
    let (status, v) = served.agent(
        "POST",
        "/v1/runs/paid-invoice/stop",
        Some(json!({"reason": "outcome_unknown_non_idempotent"})),
    );
    assert_eq!(status, 200, "{v}");
    let bin = tally().path().to_path_buf();
    let sock = dir.join("operator.sock");

    // A pipe, and TERM=dumb even on a pipe: one table. Its header line, whole, names
    // the columns the terminal must show whole too.
    let mut headers: Vec<String> = Vec::new();
    for term in ["xterm-256color", "dumb"] {
        let out = Command::new(&bin)
            .args(["top", "--operator-socket"])
            .arg(&sock)
            .env("TERM", term)
            .stdin(Stdio::null())
            .output()
            .expect("tally top");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let head = text.lines().nth(1).unwrap_or_default();
        headers = head
            .split("  ")
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(String::from)
            .collect();
        assert_eq!(headers.first().map(String::as_str), Some("RUN"), "{text}");
        assert!(
            !text.contains('\x1b'),
            "escape sequences on a pipe: {text:?}"
        );
        let close = text.find("close-to-it").expect("close-to-it");
        let far = text.find("far-from-it").expect("far-from-it");
        assert!(close < far, "nearest first:\n{text}");
        assert!(text.contains("attempts 80%"), "{text}");
        // A limit is named as people say it: `spend`, not `spend_nanos`.
        assert!(text.contains("spend 57%"), "{text}");
        assert!(!text.contains("spend_nanos"), "{text}");
    }
    // `tally runs`: the same order, with the last refusal.
    let runs = ok(dir, &["runs", "--operator-socket", "operator.sock"]);
    assert!(
        runs.find("close-to-it") < runs.find("far-from-it"),
        "{runs}"
    );

    if !tally_testkit::have(
        "tmux",
        &["-V"],
        "apt-get install tmux (README, Development)",
    ) {
        return;
    }
    let session = format!("tally-top-{}", std::process::id());
    let tmux = super::tmux::Tmux::new(dir);
    let command = format!(
        "TERM=xterm-256color {} top --operator-socket {}",
        bin.display(),
        sock.display()
    );
    tmux.start(&session, 160, &command);
    let pane = |want: &dyn Fn(&str) -> bool| tmux.pane(&session, want);
    let text = pane(&|t| t.contains("close-to-it") && t.contains("far-from-it"));
    assert!(
        text.find("close-to-it") < text.find("far-from-it"),
        "{text}"
    );
    assert!(text.contains("runs, nearest to a limit first"), "{text}");
    // Every cell whole at 160 columns: the long state, the spend, when it started.
    let paid = text
        .lines()
        .find(|l| l.contains("paid-invoice"))
        .unwrap_or_else(|| panic!("no paid-invoice row:\n{text}"));
    for cell in [
        "stopped (outcome_unknown_non_idempotent)",
        "$1.15/$2.00",
        " ago",
    ] {
        assert!(paid.contains(cell), "{cell:?} cut:\n{text}");
    }
    assert!(headers.len() >= 9, "{headers:?}");
    for header in &headers {
        assert!(text.contains(header.as_str()), "{header} cut:\n{text}");
    }
    // A refusal while it runs: redrawn with it.
    for _ in 0..4 {
        served.call("far-from-it", "search", json!({"q": "same"}));
    }
    pane(&|t| t.contains("loop_repeated_call"));
    tmux.keys(&session, &["q"]);
    let started = Instant::now();
    while tmux.run(&["has-session", "-t", &session]).status.success() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "q did not quit"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = tmux.run(&["kill-server"]);
}

/// What `tally top` reads, `GET /v1/live`, is tally-wire's `LiveSnapshot` field for field:
/// a page with a running run, a refused one (a call waiting for approval) and a stopped
/// one reads as the type and is
/// written back byte for byte (a field the daemon adds, renames or reorders fails here).
#[test]
fn the_live_page_is_the_wires_live_snapshot_byte_for_byte() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    let served = tally().serve(dir, &[]);
    served.start_run("running", 10);
    served.call("running", "search", json!({"i": 0}));
    served.start_run("refused", 1);
    served.call("refused", "search", json!({"i": 0}));
    let refused = served.check("refused", "search", json!({"i": 1}));
    assert_eq!(refused["decision"], "require_approval", "{refused}");
    served.start_run("stopped", 10);
    let (status, v) = served.agent(
        "POST",
        "/v1/runs/stopped/stop",
        Some(json!({"reason": "completed"})),
    );
    assert_eq!(status, 200, "{v}");
    let (status, page) = served.operator_text("/v1/live?page=0");
    assert_eq!(status, 200, "{page}");
    let live: tally_wire::LiveSnapshot = serde_json::from_str(&page).expect("a LiveSnapshot");
    assert_eq!(live.runs.len(), 3, "{page}");
    assert!(live.runs.iter().any(|r| r.last_refusal.is_some()), "{page}");
    assert_eq!(live.pending.len(), 1, "{page}");
    assert_eq!(serde_json::to_string(&live).expect("JSON"), page.trim_end());
}
