//! One judge (the policy core decides, folds and judges; the gate and every report only
//! call it), on the real binary where a user meets it: `tally loops`, `verify`,
//! `handoff`, `stats`, `approve`, and the daemon's agent socket. Each test is one of the
//! ways an honest ledger verified INCONSISTENT, or a real overspend verified clean, while
//! the reports kept second copies of the gate's rules.

use std::path::Path;
use std::process::Output;

use serde_json::{json, Value};
use tally_testkit::tally::text;
use tally_testkit::{Daemon, Tally};

fn tally() -> Tally {
    Tally::new(env!("CARGO_BIN_EXE_tally"))
}

fn run(dir: &Path, args: &[&str], stdin: &str) -> Output {
    tally().run(dir, args, stdin)
}

fn ok(dir: &Path, args: &[&str], stdin: &str) -> String {
    tally().ok(dir, args, stdin)
}

/// A fresh ledger in `dir/ledger`, encrypted to `dir/auditor.pub`.
fn ledger(dir: &Path) {
    tally().ledger(dir);
}

/// `tally CMD ledger --key ... --auditor-key ...` (the ledger not held by a writer).
fn audit(dir: &Path, cmd: &str, extra: &[&str]) -> Output {
    tally().audit(dir, cmd, extra)
}

/// NDJSON of `records`.
fn ndjson(records: &[Value]) -> String {
    records.iter().map(|r| format!("{r}\n")).collect()
}

/// A run that creates a job answered `running` with Retry-After `hint` ms, then polls
/// it `polls` times, each `early` ms before the hint elapsed, the last one finding it
/// done; the observed state moves on every poll.
fn polling(run_name: &str, hint: u64, early: u64, polls: u64, budget: Value) -> Vec<Value> {
    let mut r = vec![
        json!({"run": run_name, "kind": "start", "at_ms": 0, "goal": "export", "budget": budget}),
        json!({"run": run_name, "kind": "allow", "at_ms": 0, "tool": "export.create",
               "operation": "export.create", "args": {"t": run_name}, "effect": "idempotent_write",
               "attempt": 1}),
        json!({"run": run_name, "kind": "outcome", "at_ms": 100, "attempt": 1, "status": "running",
               "remote_ref": "j1", "observed": "queued", "retry_after_ms": hint}),
    ];
    let mut last = 100;
    for i in 0..polls {
        let at = last + hint - early;
        let attempt = i + 2;
        let done = i + 1 == polls;
        r.push(
            json!({"run": run_name, "kind": "allow", "at_ms": at, "tool": "export.status",
                      "operation": "export.status:j1", "args": {"id": "j1"}, "effect": "read",
                      "attempt": attempt}),
        );
        let mut o = json!({"run": run_name, "kind": "outcome", "at_ms": at + 100,
                           "attempt": attempt, "status": if done { "ok" } else { "running" },
                           "remote_ref": "j1",
                           "observed": if done { "done".to_owned() } else { format!("{}%", i * 2) }});
        if !done {
            o["retry_after_ms"] = json!(hint);
        }
        r.push(o);
        last = at + 100;
    }
    r.push(json!({"run": run_name, "kind": "stop", "at_ms": last + 10, "reason": "completed"}));
    r
}

/// Polling inside the scheduling tolerance (max(1 s, 10 %) of the hint)
/// is what the gate allows, so it is no loop, and the handoff of a run that completed
/// says nothing about polling. Polling past the tolerance is one.
#[test]
fn regression_issue_20_polling_inside_the_tolerance_is_no_loop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    ledger(d);
    let mut records = polling("every-30s", 30_000, 200, 15, json!({"polls": 30}));
    // 24 minutes of polls up to 5 % early, finishing `done`.
    records.extend(polling(
        "five-percent",
        30_000,
        1_500,
        48,
        json!({"polls": 60}),
    ));
    ok(d, &["append", "--ledger", "ledger"], &ndjson(&records));

    let loops = audit(d, "loops", &[]);
    assert_eq!(loops.status.code(), Some(0), "{}", text(&loops));
    assert!(
        text(&loops).starts_with("No loops found."),
        "{}",
        text(&loops)
    );
    let handoff = audit(d, "handoff", &[]);
    assert_eq!(handoff.status.code(), Some(0), "{}", text(&handoff));
    let h = text(&handoff);
    assert!(!h.contains("poll") || !h.contains("looped"), "{h}");
    assert!(
        h.contains("nothing to resume: the run completed its task"),
        "{h}"
    );
    assert_eq!(audit(d, "verify", &[]).status.code(), Some(0));

    // Four seconds early on a 30 s hint is past the 3 s tolerance: the gate would say
    // `upstream_backoff`, and the report says polling.
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    ledger(d);
    let early = polling("too-early", 30_000, 4_000, 5, json!({"polls": 30}));
    ok(d, &["append", "--ledger", "ledger"], &ndjson(&early));
    let loops = text(&audit(d, "loops", &[]));
    assert!(loops.contains("1. polling in run too-early"), "{loops}");
    assert!(
        loops.contains("before the upstream's Retry-After"),
        "{loops}"
    );
}

/// A parent that spends what it carved out for a child is over its
/// limit in force: 10 attempts and 100¢, 6 and 60 handed to the child, so 4 and 40 left.
#[test]
fn regression_issue_20_a_parent_spending_what_its_child_took_is_found() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    ledger(d);
    let mut records = vec![
        json!({"run": "p", "kind": "start", "at_ms": 0, "goal": "parent",
               "budget": {"attempts": 10, "spend_cents": 100}}),
        json!({"run": "c", "kind": "start", "at_ms": 0, "goal": "child", "parent": "p",
               "budget": {"attempts": 6, "spend_cents": 60}}),
    ];
    for (name, base) in [("c", 100), ("p", 1000)] {
        for i in 1..=6u64 {
            records.push(json!({"run": name, "kind": "allow", "at_ms": base + i * 10,
                                "tool": "api", "args": {"n": i}, "effect": "read",
                                "attempt": i, "reserve_cents": 10}));
            records.push(
                json!({"run": name, "kind": "outcome", "at_ms": base + i * 10 + 5,
                                "attempt": i, "status": "ok", "settled_cents": 10}),
            );
        }
    }
    ok(d, &["append", "--ledger", "ledger"], &ndjson(&records));

    let verify = audit(d, "verify", &[]);
    let v = text(&verify);
    assert_eq!(verify.status.code(), Some(1), "{v}");
    assert!(v.contains("INCONSISTENT"), "{v}");
    // The parent's fifth allow is the first beyond its limit in force.
    assert!(
        v.contains("run p  allow_beyond_limit: allowed beyond its attempts limit in force (5 of 4"),
        "{v}"
    );
    assert!(v.contains("($0.50 of $0.40"), "{v}");
    let stats = text(&audit(d, "stats", &[]));
    let parent = stats
        .lines()
        .find(|l| l.starts_with("p "))
        .unwrap_or_else(|| panic!("no line for p in\n{stats}"));
    assert!(parent.contains("6 of 4"), "{stats}");
    assert!(parent.contains("over the cap by 2"), "{stats}");
}

/// A daemon over a fresh ledger under `policy`, with an approver `dana`; killed on drop.
struct Served {
    daemon: Daemon,
    dir: tempfile::TempDir,
}

impl Served {
    fn start(policy: &str) -> Served {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        ledger(d);
        let key = ok(d, &["keygen", "--approver", "--out", "dana.key"], "");
        let approvers = key
            .lines()
            .skip_while(|l| !l.starts_with("[approvals.approvers]"))
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(d.join("policy.toml"), format!("{policy}\n{approvers}\n")).expect("policy");
        Served {
            daemon: tally().serve(d, &[]),
            dir,
        }
    }

    /// One request on the agent socket: status and JSON body.
    fn agent(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.daemon.agent(method, path, body)
    }

    fn started(&self, run: &str, budget: Value) {
        let (status, v) = self.agent(
            "POST",
            "/v1/runs",
            Some(json!({"run": run, "goal": "test", "budget": budget})),
        );
        assert_eq!(status, 201, "{v}");
    }

    fn check(&self, body: Value) -> Value {
        let (status, v) = self.agent("POST", "/v1/check", Some(body));
        assert_eq!(status, 200, "{v}");
        v
    }

    fn outcome(&self, body: Value) -> (u16, Value) {
        self.agent("POST", "/v1/outcome", Some(body))
    }

    /// Stop the daemon (the ledger is then free to read) and audit it with `cmd`.
    fn audit(&mut self, cmd: &str) -> Output {
        self.daemon.stop();
        audit(self.dir.path(), cmd, &[])
    }
}

fn call(run: &str, n: u64) -> Value {
    json!({"run": run, "tool": "http", "operation": format!("op{n}"), "effect": "read",
           "args": {"n": n}})
}

/// A real approval keeps an honest ledger consistent. `tally approve
/// --attempts 3` (with or without `--tool`) lets exactly 3 more calls through, as the CLI
/// says; `--cents 30` lets $0.30 more be reserved, `--usd` exact dollars; and `verify --auditor-key` finds nothing.
#[test]
fn regression_issue_20_a_real_approval_verifies_consistent() {
    let mut s = Served::start("");
    let approve = |run: &str, extra: &[&str]| {
        let mut args = vec![
            "approve",
            "--operator-socket",
            "operator.sock",
            "--run",
            run,
            "--key",
            "dana.key",
            "--expires",
            "10m",
        ];
        args.extend_from_slice(extra);
        ok(s.dir.path(), &args, "")
    };
    for (run, scope) in [("plain", &[][..]), ("tool", &["--tool", "http"][..])] {
        s.started(run, json!({"attempts": 1}));
        assert_eq!(s.check(call(run, 1))["decision"], "allow");
        let asked = s.check(call(run, 2));
        assert_eq!(
            (&asked["decision"], &asked["cause"]),
            (&json!("require_approval"), &json!("attempts_exhausted"))
        );
        let mut args = vec!["--attempts", "3"];
        args.extend_from_slice(scope);
        let said = approve(run, &args);
        assert!(
            said.contains("3 more attempts (its limit 1 -> 4)"),
            "{said}"
        );
        assert!(said.contains("valid for 10 min 00 s"), "{said}");
        for n in 2..=4 {
            let a = s.check(call(run, n));
            assert_eq!(a["decision"], "allow", "call {n} of run {run}: {a}");
        }
        assert_eq!(s.check(call(run, 5))["decision"], "require_approval");
    }
    // Cents: 20 of 20 reserved, 20 more asked for, 30 granted.
    s.started("cents", json!({"spend_cents": 20}));
    let reserve = |n: u64| {
        let mut c = call("cents", n);
        c["reserve_cents"] = json!(20);
        c
    };
    assert_eq!(s.check(reserve(1))["decision"], "allow");
    assert_eq!(s.check(reserve(2))["cause"], "reservation_insufficient");
    let said = approve("cents", &["--cents", "30"]);
    assert!(
        said.contains("$0.30 more (its spend limit $0.20 -> $0.50)"),
        "{said}"
    );
    assert_eq!(s.check(reserve(2))["decision"], "allow");
    assert_eq!(s.check(reserve(3))["cause"], "reservation_insufficient");
    // Exact dollars: $0.200000001 more lets the third 20-cent call through, with one
    // nanodollar to spare; a fraction finer than a nanodollar is refused.
    let said = approve("cents", &["--usd", "0.200000001"]);
    assert!(
        said.contains("$0.200000001 more (its spend limit $0.50 -> $0.700000001)"),
        "{said}"
    );
    assert_eq!(s.check(reserve(3))["decision"], "allow");
    let refused = run(
        s.dir.path(),
        &[
            "approve",
            "--operator-socket",
            "operator.sock",
            "--run",
            "cents",
            "--key",
            "dana.key",
            "--expires",
            "10m",
            "--usd",
            "0.0000000001",
        ],
        "",
    );
    assert_ne!(refused.status.code(), Some(0));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("more than 9 digits"), "{said}");

    let verify = s.audit("verify");
    let v = text(&verify);
    assert_eq!(verify.status.code(), Some(0), "{v}");
    assert!(v.contains("No inconsistencies"), "{v}");
    assert!(v.contains("every one is what that policy decides"), "{v}");
}

/// An agent alone cannot make a ledger verify inconsistent. What
/// the core would call inconsistent the gate refuses (409 or 404, never recorded); what it
/// records verifies. An overrun is recorded as a fact; a late `ok` after a timeout is a
/// completed call with its remote id and cost.
#[test]
fn regression_issue_20_an_agent_alone_cannot_make_the_ledger_inconsistent() {
    let mut s = Served::start("");
    let allowed = |run: &str, reserve: u64| -> u64 {
        let mut c = call(run, 1);
        c["reserve_cents"] = json!(reserve);
        let a = s.check(c);
        assert_eq!(a["decision"], "allow", "{a}");
        a["attempt"].as_u64().expect("attempt")
    };
    // Settling 50¢ on a 5¢ reservation: the upstream billed more. Recorded (an overrun);
    // no further call is allowed until a human grants cents.
    s.started("over", json!({"spend_cents": 100}));
    let a = allowed("over", 5);
    let (status, v) =
        s.outcome(json!({"run": "over", "attempt": a, "status": "ok", "settled_cents": 50}));
    assert_eq!(status, 200, "{v}");
    let next = s.check(call("over", 2));
    assert_eq!(next["cause"], "budget_exceeded", "{next}");

    // timeout, then unknown settling 0, then ok without cents: each is news of one call.
    // A second settlement, or anything after the final outcome, is refused.
    s.started("news", json!({}));
    let a = allowed("news", 5);
    for (body, want) in [
        (json!({"status": "timeout"}), 200),
        (json!({"status": "unknown", "settled_cents": 0}), 200),
        (json!({"status": "ok", "settled_cents": 3}), 409),
        (json!({"status": "ok"}), 200),
        (json!({"status": "ok"}), 409),
        (json!({"status": "error"}), 409),
    ] {
        let mut b = body.clone();
        b["run"] = json!("news");
        b["attempt"] = json!(a);
        let (status, v) = s.outcome(b);
        assert_eq!(status, want, "{body}: {v}");
        if want == 409 {
            assert_eq!(v["error"]["code"], "attempt_settled", "{v}");
        }
    }
    let (status, v) = s.outcome(json!({"run": "news", "attempt": 7, "status": "ok"}));
    assert_eq!(
        (status, &v["error"]["code"]),
        (404, &json!("no_such_attempt")),
        "{v}"
    );

    // An outcome after the run's own stop, for a call still in flight, is a fact to
    // record (it may have cost money).
    s.started("after-stop", json!({}));
    let a = allowed("after-stop", 5);
    let (status, v) = s.agent("POST", "/v1/runs/after-stop/stop", Some(json!({})));
    assert_eq!(status, 200, "{v}");
    let (status, v) =
        s.outcome(json!({"run": "after-stop", "attempt": a, "status": "ok", "settled_cents": 5}));
    assert_eq!(status, 200, "{v}");

    // A call that timed out, then settled ok with remote id gen-5 for 20¢.
    s.started("late", json!({}));
    let mut c = call("late", 1);
    c["tool"] = json!("model");
    c["operation"] = json!("generate");
    c["reserve_cents"] = json!(20);
    let a = s.check(c)["attempt"].as_u64().expect("attempt");
    assert_eq!(
        s.outcome(json!({"run": "late", "attempt": a, "status": "timeout"}))
            .0,
        200
    );
    let (status, v) = s.outcome(json!({"run": "late", "attempt": a, "status": "ok",
                                       "settled_cents": 20, "remote_ref": "gen-5"}));
    assert_eq!(status, 200, "{v}");

    let verify = s.audit("verify");
    let v = text(&verify);
    assert_eq!(verify.status.code(), Some(0), "{v}");
    assert!(v.contains("No inconsistencies"), "{v}");
    let h = text(&audit(s.dir.path(), "handoff", &["--run", "late"]));
    assert!(h.contains("model (generate) -> gen-5"), "{h}");
    assert!(h.contains(", $0.20,"), "{h}");
    assert!(!h.contains("Completed: nothing"), "{h}");
    let over = text(&audit(s.dir.path(), "handoff", &["--run", "over"]));
    assert!(
        over.contains("Overrun: $0.45 settled above what calls reserved"),
        "{over}"
    );
}

/// Identical calls whose result changed are progress, not a
/// loop (with the same result they stay one); and a retried operation past its class is
/// `retries_exhausted`, not the run's `attempts_exhausted`.
#[test]
fn regression_issue_20_progress_and_the_retry_cap_have_their_own_rules() {
    let mut s = Served::start("");
    let read = |run: &str| json!({"run": run, "tool": "Read", "effect": "read", "args": {"file_path": "src/a.rs"}});
    for (run, changes) in [("edited", true), ("same", false)] {
        s.started(run, json!({}));
        for i in 0..4u64 {
            let a = s.check(read(run));
            if !changes && i == 3 {
                assert_eq!(
                    (&a["decision"], &a["reason"]),
                    (&json!("deny"), &json!("loop_repeated_call")),
                    "{a}"
                );
                break;
            }
            assert_eq!(a["decision"], "allow", "run {run}, read {i}: {a}");
            let digest = if changes {
                blake3::hash(format!("content {i}").as_bytes())
                    .to_hex()
                    .to_string()
            } else {
                blake3::hash(b"content").to_hex().to_string()
            };
            let (status, v) = s.outcome(json!({"run": run, "attempt": a["attempt"],
                                              "status": "ok", "result_digest": digest}));
            assert_eq!(status, 200, "{v}");
        }
    }
    s.started("retried", json!({}));
    let fetch = json!({"run": "retried", "tool": "http", "operation": "fetch:x",
                       "effect": "read", "args": {"u": "x"}});
    for _ in 0..3 {
        let a = s.check(fetch.clone());
        assert_eq!(a["decision"], "allow", "{a}");
        s.outcome(json!({"run": "retried", "attempt": a["attempt"], "status": "error"}));
    }
    let a = s.check(fetch);
    assert_eq!(
        (&a["reason"], &a["action"]),
        (&json!("retries_exhausted"), &json!("stop")),
        "{a}"
    );
    assert_eq!(
        a["limits"]["attempts"],
        json!({"used": 3, "limit": 50}),
        "{a}"
    );
    assert_eq!(s.audit("verify").status.code(), Some(0));
}

/// Call the same tool, to the same result, until the loop rule refuses it, then stop the
/// run with the refusal's reason, as an agent does.
fn loop_and_stop(s: &Served, run: &str) {
    let same = json!({"run": run, "tool": "make", "effect": "read", "args": {"t": "all"}});
    let mut reason = Value::Null;
    for _ in 0..6 {
        let a = s.check(same.clone());
        if a["decision"] != "allow" {
            reason = a["reason"].clone();
            break;
        }
        let done = json!({"run": run, "attempt": a["attempt"], "status": "ok",
            "result_digest": "0".repeat(64)});
        assert_eq!(s.outcome(done).0, 200);
    }
    assert_eq!(reason, "loop_repeated_call");
    let (status, v) = s.agent(
        "POST",
        &format!("/v1/runs/{run}/stop"),
        Some(json!({ "reason": reason })),
    );
    assert_eq!(status, 200, "{v}");
}

/// Start `run` continuing `continues` on the agent socket: status and reply.
fn continuing(s: &Served, run: &str, continues: &str) -> (u16, Value) {
    s.agent(
        "POST",
        "/v1/runs",
        Some(
            json!({"run": run, "goal": "fix the build", "budget": {"attempts": 20},
                    "continues": continues}),
        ),
    )
}

/// A continuation grant for `run` (`new_run` in its scope, if any), signed with the key
/// at `key` as `approver`, valid for a minute of the run's clock.
fn grant(s: &Served, run: &str, new_run: Option<&str>, approver: &str, key: &str) -> Value {
    grant_of(s, run, new_run, approver, key, 5)
}

/// [`grant`] of `attempts`.
fn grant_of(
    s: &Served,
    run: &str,
    new_run: Option<&str>,
    approver: &str,
    key: &str,
    attempts: u64,
) -> Value {
    let (_, standing) = s.daemon.operator("GET", &format!("/v1/runs/{run}"), None);
    let expires_ms = standing["at_ms"].as_u64().expect("at_ms") + 60_000;
    let scope = tally_ledger::decision::Scope {
        attempts: Some(attempts),
        new_run: new_run.map(str::to_owned),
        ..Default::default()
    };
    let key = tally_ledger::keys::ApproverKey::read(&s.dir.path().join(key)).expect("key");
    let digest = tally_policy::approval::digest(run, approver, &scope, expires_ms);
    let signature = tally_policy::approval::sign(key.signing_key(), &digest);
    json!({"run": run, "approver": approver, "scope": scope, "expires_ms": expires_ms,
           "digest": digest, "signature": signature})
}

/// A human says yes to a new run after a refill chain: `tally approve --new-run` records
/// the continuation grant on the stopped run and starts the new run with the granted
/// allocation; the old run stays stopped, the count of unapproved continuations starts
/// again at the new run, and every forged, tampered, misplaced or replayed grant is
/// refused with nothing written. `verify --auditor-key` finds nothing, no refill either.
#[test]
fn a_continuation_grant_starts_the_new_run_and_the_count_starts_again() {
    let mut s = Served::start("");
    s.started("r1", json!({"attempts": 20}));
    loop_and_stop(&s, "r1");
    assert_eq!(continuing(&s, "r2", "r1").0, 201);
    loop_and_stop(&s, "r2");
    let (status, v) = continuing(&s, "r3", "r2");
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["cause"], "refill_without_approval", "{v}");

    // Refused, each with its typed error, and nothing recorded: no new run.
    ok(
        s.dir.path(),
        &["keygen", "--approver", "--out", "eve.key"],
        "",
    );
    let continuations = "/v1/approvals/continuations";
    let mut for_r1 = grant(&s, "r1", Some("n1"), "dana", "dana.key");
    for_r1["run"] = json!("r2");
    let mut tampered = grant(&s, "r2", Some("n1"), "dana", "dana.key");
    tampered["scope"]["attempts"] = json!(500);
    let ordinary = grant(&s, "r2", None, "dana", "dana.key");
    let unknown = grant(&s, "r2", Some("n1"), "eve", "eve.key");
    // Signed, but for more than the policy's ceiling of 50 attempts: refused, not cut.
    let above = grant_of(&s, "r2", Some("n1"), "dana", "dana.key", 51);
    for (why, body) in [
        ("signed for another run", for_r1),
        ("tampered", tampered),
        ("ordinary, as a continuation", ordinary),
        ("unknown approver", unknown),
        ("above the ceiling", above),
    ] {
        let (status, v) = s.daemon.operator("POST", continuations, Some(body));
        assert_eq!(status, 403, "{why}: {v}");
        assert_eq!(v["error"]["code"], "approval_refused", "{why}: {v}");
        if why == "above the ceiling" {
            let message = v["error"]["message"].as_str().unwrap_or("");
            assert!(
                message.contains("ceiling for a run (50 attempts, $10.00)"),
                "{v}"
            );
        }
        assert_eq!(
            s.daemon.operator("GET", "/v1/runs/n1", None).0,
            404,
            "{why}"
        );
    }
    let (status, v) = s.daemon.operator(
        "POST",
        "/v1/approvals",
        Some(grant(&s, "r2", Some("n1"), "dana", "dana.key")),
    );
    assert_eq!(status, 403, "a continuation as an ordinary approval: {v}");
    assert_eq!(v["error"]["code"], "approval_refused", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("--new-run"),
        "{v}"
    );

    // The human's yes.
    let said = ok(
        s.dir.path(),
        &[
            "approve",
            "--new-run",
            "--run",
            "r2",
            "--attempts",
            "7",
            "--key",
            "dana.key",
            "--expires",
            "10m",
            "--operator-socket",
            "operator.sock",
        ],
        "",
    );
    assert!(
        said.contains("continues r2 (which stays stopped)"),
        "{said}"
    );
    assert!(said.contains("granted 7 attempts"), "{said}");
    let new_run = said
        .split("run ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .expect("the new run named")
        .to_owned();
    let (status, standing) = s
        .daemon
        .operator("GET", &format!("/v1/runs/{new_run}"), None);
    assert_eq!(status, 200, "{standing}");
    assert_eq!(standing["limits"]["attempts"]["limit"], 7, "{standing}");
    let (_, old) = s.daemon.operator("GET", "/v1/runs/r2", None);
    assert_eq!(old["state"], "stopped", "{old}");
    assert_eq!(old["stop_reason"], "loop_repeated_call", "{old}");
    // The next unapproved continuation, of the new run, is within the allowance again.
    loop_and_stop(&s, &new_run);
    let (status, v) = continuing(&s, "r4", &new_run);
    assert_eq!(status, 201, "{v}");

    // A grant is used once: the same one again is refused, nothing recorded.
    let once = grant(&s, "r1", Some("n2"), "dana", "dana.key");
    let (status, v) = s.daemon.operator("POST", continuations, Some(once.clone()));
    assert_eq!(status, 201, "{v}");
    let (status, v) = s.daemon.operator("POST", continuations, Some(once));
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "run_exists", "{v}");

    let verify = s.audit("verify");
    let v = text(&verify);
    assert_eq!(verify.status.code(), Some(0), "{v}");
    assert!(v.contains("No inconsistencies"), "{v}");
    assert!(!v.contains("refill"), "{v}");
}

/// A request answered "a new run instead": `tally approve REQUEST --new-run --attempts 4`
/// starts a run continuing the request's run with that budget, the old run stopped (it
/// is not revived, and its request is no longer pending); without `--new-run`, a request
/// is granted exactly its cost, so `--attempts` is refused. `verify --auditor-key` finds
/// nothing.
#[test]
fn a_request_answered_with_a_new_run_starts_it_and_stops_the_old_one() {
    let mut s = Served::start("");
    s.started("q1", json!({"attempts": 1}));
    assert_eq!(s.check(call("q1", 1))["decision"], "allow");
    let asked = s.check(call("q1", 2));
    assert_eq!(asked["decision"], "require_approval", "{asked}");
    let (status, list) = s.daemon.operator("GET", "/v1/approvals", None);
    assert_eq!(status, 200, "{list}");
    let id = list[0]["id"].as_str().expect("a request").to_owned();
    let socket = ["--key", "dana.key", "--operator-socket", "operator.sock"];

    let mut wider = vec!["approve", id.as_str(), "--attempts", "4"];
    wider.extend(socket);
    let out = run(s.dir.path(), &wider, "");
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("only with --new-run"),
        "{out:?}"
    );

    let mut instead = vec!["approve", id.as_str(), "--new-run", "--attempts", "4"];
    instead.extend(socket);
    let said = ok(s.dir.path(), &instead, "");
    assert!(
        said.contains("continues q1 (which stays stopped)"),
        "{said}"
    );
    let new_run = said
        .split("run ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .expect("the new run named")
        .to_owned();
    let (_, standing) = s
        .daemon
        .operator("GET", &format!("/v1/runs/{new_run}"), None);
    assert_eq!(standing["limits"]["attempts"]["limit"], 4, "{standing}");
    let (_, old) = s.daemon.operator("GET", "/v1/runs/q1", None);
    assert_eq!(old["state"], "stopped", "{old}");
    let (_, one) = s
        .daemon
        .operator("GET", &format!("/v1/approvals/{id}"), None);
    assert_ne!(one["state"], "pending", "{one}");

    let verify = s.audit("verify");
    let v = text(&verify);
    assert_eq!(verify.status.code(), Some(0), "{v}");
    assert!(v.contains("No inconsistencies"), "{v}");
    assert!(!v.contains("refill_without_approval"), "{v}");
}
