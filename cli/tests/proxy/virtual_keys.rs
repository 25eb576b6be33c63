//! Keys in place of run tokens (docs/KEYS.md), on the real daemon and the fake upstream:
//! a key's calls over ten tasks run in ten runs, each with its handoff, and its
//! principal's budget stops them all; a revoked key is refused at once, and after a
//! restart; the key is nowhere in the data directory; a run's token can be fetched again
//! on the operator socket.

use std::os::unix::fs::MetadataExt;

use tally_record::Reason;
use tally_wire::ErrorCode;

use super::*;

/// Every file under `dir`, its bytes.
fn every_file(dir: &Path, out: &mut Vec<(std::path::PathBuf, Vec<u8>)>) {
    for e in std::fs::read_dir(dir).expect("read dir") {
        let path = e.expect("entry").path();
        if path.is_dir() {
            every_file(&path, out);
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path, bytes));
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// One request without a body on the operator socket: the status and the JSON answer.
async fn operator(served: &Served, method: &str, path: &str) -> (u16, Value) {
    operator_with(served, method, path, None).await
}

/// [`operator`] with a JSON body.
async fn operator_with(
    served: &Served,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    super::on_socket(&served.daemon.operator_socket(), method, path, body).await
}

/// The proxy's refusal code (the OpenAI dialect's `error.code`).
fn code(a: &Answer) -> String {
    a.json()["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_calls_with_a_key_over_ten_tasks_stop_at_its_principals_budget() {
    // Runs of $10 each; the key's principal (this uid) has $1 a day across all of them:
    // a `fake-ok` call settles $0.051, so about nineteen calls fit.
    let (upstream, dir, uid, mut served) = keyed("spend_usd = \"1\"\n");
    let uid_arg = uid.to_string();
    let made: Value = serde_json::from_str(&tally().ok(
        dir.path(),
        &[
            "keys",
            "create",
            "--operator-socket",
            "operator.sock",
            "--principal",
            &uid_arg,
            "--label",
            "team \u{1b}[31mred\u{202e} ops",
            "--json",
        ],
        "",
    ))
    .expect("keys create --json");
    let key = made["key"].as_str().expect("the key").to_owned();
    let id = made["info"]["id"].as_str().expect("its id").to_owned();
    assert!(key.starts_with("tlk_"), "{key}");

    let (mut allowed, mut refused_at) = (0u64, None);
    let mut runs = std::collections::BTreeSet::new();
    for i in 0..200 {
        let task = format!("task-{}", i % 10);
        let a = call(
            served.proxy,
            "/openai/v1/chat/completions",
            &[("authorization", &bearer(&key)), ("x-tally-task", &task)],
            chat("fake-ok", json!({"max_tokens": 50})),
        )
        .await;
        let run = a
            .headers
            .get("x-tally-run")
            .map(|v| v.to_str().expect("ascii").to_owned());
        match a.status {
            200 => {
                assert!(refused_at.is_none(), "call {i} allowed after a refusal");
                allowed += 1;
                let run = run.expect("the run in x-tally-run");
                assert!(run.starts_with(&format!("key-{id}-")), "{run}");
                assert!(run.ends_with(&format!("-{task}")), "{run}");
                runs.insert(run);
            }
            _ => {
                assert_eq!(a.status, 403, "call {i}: {}", a.text());
                assert_eq!(
                    code(&a),
                    Reason::PrincipalBudgetExceeded.as_str(),
                    "{}",
                    a.text()
                );
                refused_at.get_or_insert(i);
            }
        }
    }
    assert!(
        (15..=19).contains(&allowed),
        "$1 of $0.051 calls, the last one's worst case reserved: {allowed}"
    );
    assert_eq!(runs.len(), 10, "each task its own run: {runs:?}");
    assert_eq!(
        upstream.seen().len() as u64,
        allowed,
        "no refused call went upstream"
    );

    // The listing: what the key's runs spent today, within the principal's budget.
    let listed: Value = serde_json::from_str(&tally().ok(
        dir.path(),
        &[
            "keys",
            "list",
            "--operator-socket",
            "operator.sock",
            "--json",
        ],
        "",
    ))
    .expect("keys list --json");
    let spent = listed[0]["spend_today_nanos"].as_u64().expect("spend");
    assert_eq!(spent, allowed * 51_000_000, "{listed}");
    assert!(spent <= 1_000_000_000);
    assert_eq!(listed[0]["revoked_ms"], Value::Null);
    // Its label, shown to a human, cannot drive the terminal.
    let text = tally().ok(
        dir.path(),
        &["keys", "list", "--operator-socket", "operator.sock"],
        "",
    );
    assert!(text.contains(&id), "{text}");
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{202e}'),
        "{text:?}"
    );

    // Revoked: refused at once, nothing sent upstream, and still after a restart.
    tally().ok(
        dir.path(),
        &["keys", "revoke", &id, "--operator-socket", "operator.sock"],
        "",
    );
    let seen = upstream.seen().len();
    for _ in 0..2 {
        let a = call(
            served.proxy,
            "/openai/v1/chat/completions",
            &[("authorization", &bearer(&key)), ("x-tally-task", "task-0")],
            chat("fake-ok", json!({"max_tokens": 50})),
        )
        .await;
        assert_eq!(a.status, 403, "{}", a.text());
        assert_eq!(code(&a), ErrorCode::KeyRevoked.as_str(), "{}", a.text());
        served.daemon.stop();
        served = Served::start(dir.path());
    }
    assert_eq!(upstream.seen().len(), seen);
    // A key spelt otherwise is no key (its last digit changed, whatever it was).
    let last = if key.ends_with('0') { '1' } else { '0' };
    let forged = format!("{}{last}", &key[..key.len() - 1]);
    assert_ne!(forged, key);
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&forged))],
        chat("fake-ok", json!({"max_tokens": 50})),
    )
    .await;
    assert_eq!(a.status, 401, "{}", a.text());
    assert_eq!(code(&a), ErrorCode::InvalidToken.as_str());

    // Every task has its run's handoff; the ledger verifies and equals the bill.
    served.verifies_the_bill(&upstream, &prices(), 0);
    let (out, handoffs) = tally().report(dir.path(), "handoff", &[]);
    assert!(out.status.success(), "{handoffs}");
    let handed: std::collections::BTreeSet<String> = handoffs["handoffs"]
        .as_array()
        .expect("handoffs")
        .iter()
        .filter_map(|h| h["run"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(handed, runs);

    // The key is nowhere in the data directory (ledger, state, keys file, logs).
    let secret = key.split_once('.').expect("dot").1;
    let mut files = Vec::new();
    every_file(dir.path(), &mut files);
    for (path, bytes) in &files {
        assert!(
            !contains(bytes, secret.as_bytes()),
            "the key's secret is in {}",
            path.display()
        );
    }
    let keys_file = dir.path().join("ledger").join(tally_proxy::keys::KEYS_FILE);
    let mode = std::fs::metadata(&keys_file).expect("keys file").mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_token_is_fetched_again_on_the_operator_socket_only() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("r1").await;
    let again = tally().ok(
        dir.path(),
        &["token", "--operator-socket", "operator.sock", "--run", "r1"],
        "",
    );
    assert_eq!(again.trim_end(), token);
    let (status, v) = operator(&served, "GET", "/v1/runs/r1/token").await;
    assert_eq!((status, v["token"].as_str()), (200, Some(token.as_str())));
    // Not on the agent socket; not for a run the gate does not know.
    let (status, v) = served.agent("GET", "/v1/runs/r1/token", None).await;
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["code"], ErrorCode::NotAuthorized.as_str());
    let (status, v) = operator(&served, "GET", "/v1/runs/nope/token").await;
    assert_eq!(status, 404, "{v}");
    let out = tally().run(
        dir.path(),
        &[
            "token",
            "--operator-socket",
            "operator.sock",
            "--run",
            "nope",
        ],
        "",
    );
    assert!(!out.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_the_operators_and_a_bad_request_makes_none() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let policy = format!(
        "{}\n[principals.uid.0]\nruns = 5\n",
        policy(&upstream, 1000)
    );
    let served = Served::new(dir.path(), &policy);
    for (method, path) in [("POST", "/v1/keys"), ("GET", "/v1/keys")] {
        let body = (method == "POST").then(|| json!({"principal": 0}));
        let (status, v) = served.agent(method, path, body).await;
        assert_eq!(status, 403, "{method} {path}: {v}");
        assert_eq!(v["error"]["code"], ErrorCode::NotAuthorized.as_str());
    }
    // The runs keys start are theirs: an agent cannot start one of those names (a key's
    // calls would be refused `not_owner`, and its spend shown as the key's).
    let (status, v) = served
        .agent(
            "POST",
            "/v1/runs",
            Some(json!({"run": "key-0011223344556677-20261207-w0"})),
        )
        .await;
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["code"], ErrorCode::NotAuthorized.as_str());
    let bad = [
        // A uid the policy gives no principal budget: its key would start runs unbounded.
        (json!({"principal": 4242}), ErrorCode::InvalidValue),
        (
            json!({"principal": 0, "label": "x".repeat(201)}),
            ErrorCode::FieldTooLong,
        ),
        (
            json!({"principal": 0, "run_window_ms": 0}),
            ErrorCode::InvalidValue,
        ),
        (
            json!({"principal": 0, "runs_per_day": 0}),
            ErrorCode::InvalidValue,
        ),
        (
            json!({"principal": 0, "budget_per_day_nanos": 0}),
            ErrorCode::InvalidValue,
        ),
        (json!({"principal": 0, "spend": 1}), ErrorCode::UnknownField),
        (json!({"principal": -1}), ErrorCode::InvalidValue),
    ];
    for (body, code) in bad {
        let (status, v) = operator_with(&served, "POST", "/v1/keys", Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["code"], code.as_str(), "{body}: {v}");
    }
    let (status, v) = operator(&served, "POST", "/v1/keys/0011223344556677/revoke").await;
    assert_eq!(status, 404, "{v}");
    let (status, v) = operator(&served, "GET", "/v1/keys").await;
    assert_eq!((status, v), (200, json!([])), "nothing was made");
}
/// A fake upstream, a directory, its owner's uid and `tally serve` on it, under the
/// proxy's policy with the uid's principal lines `principal` (`spend_usd = ...` and so on).
fn keyed(principal: &str) -> (FakeUpstream, tempfile::TempDir, u32, Served) {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let uid = std::fs::metadata(dir.path()).expect("meta").uid();
    let policy = format!(
        "{}\n[principals.uid.{uid}]\n{principal}",
        policy(&upstream, 1000)
    );
    let served = Served::new(dir.path(), &policy);
    (upstream, dir, uid, served)
}

/// A key for this uid with `extra` arguments (`--budget-per-day`...): the key and its id.
fn key_with(dir: &Path, uid: u32, extra: &[&str]) -> (String, String) {
    let uid_arg = uid.to_string();
    let mut args = vec![
        "keys",
        "create",
        "--operator-socket",
        "operator.sock",
        "--principal",
        &uid_arg,
        "--json",
    ];
    args.extend_from_slice(extra);
    let made: Value =
        serde_json::from_str(&tally().ok(dir, &args, "")).expect("keys create --json");
    let key = made["key"].as_str().expect("the key").to_owned();
    let id = made["info"]["id"].as_str().expect("its id").to_owned();
    (key, id)
}

/// A call with `key` in `task`.
async fn key_call(served: &Served, key: &str, task: &str) -> Answer {
    call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(key)), ("x-tally-task", task)],
        chat("fake-ok", json!({"max_tokens": 50})),
    )
    .await
}

/// What `keys list --json` says the key `id`'s runs spent today.
fn listed_spend(dir: &Path, id: &str) -> u64 {
    let listed: Value = serde_json::from_str(&tally().ok(
        dir,
        &[
            "keys",
            "list",
            "--operator-socket",
            "operator.sock",
            "--json",
        ],
        "",
    ))
    .expect("keys list --json");
    listed
        .as_array()
        .expect("keys")
        .iter()
        .find(|k| k["id"] == id)
        .and_then(|k| k["spend_today_nanos"].as_u64())
        .expect("the key's spend")
}

/// The refusal of a call past the key's budget per day: recorded as the run's
/// `request_refused` (its run and seq answered), action `stop`, the key and its amounts
/// in the body.
fn assert_key_refusal(a: &Answer, id: &str, budget: u64) -> Value {
    assert_eq!(a.status, 403, "{}", a.text());
    assert_eq!(code(a), Reason::RequestRefused.as_str(), "{}", a.text());
    let run = a
        .headers
        .get("x-tally-run")
        .expect("the run it is recorded in");
    assert!(run.to_str().expect("ascii").starts_with("key-"), "{run:?}");
    let seq = a
        .headers
        .get("x-tally-seq")
        .expect("the seq it is recorded at");
    assert!(
        seq.to_str().expect("ascii").parse::<u64>().is_ok(),
        "{seq:?}"
    );
    let body = a.json();
    assert_eq!(body["error"]["action"], "stop", "{body}");
    let k = body["error"]["key"].clone();
    assert_eq!(k["id"], id, "{body}");
    assert_eq!(k["budget_per_day_nanos"].as_u64(), Some(budget), "{body}");
    let (settled, held, needed) = (
        k["settled_today_nanos"].as_u64().expect("settled"),
        k["held_today_nanos"].as_u64().expect("held"),
        k["needed_nanos"].as_u64().expect("needed"),
    );
    assert!(settled + held + needed > budget, "{body}");
    k
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_call_holds_what_the_gate_reserves_its_tools_price_if_more() {
    // A call to `openai` reserves at least $0.50 (its worst case is far less): a key of
    // $0.40 a day has no room for one.
    let (upstream, dir, uid, mut served) =
        keyed("spend_usd = \"100\"\n\n[tool_prices]\nopenai = \"0.5\"\n");
    let (key, id) = key_with(dir.path(), uid, &["--budget-per-day", "0.4"]);
    let a = key_call(&served, &key, "priced").await;
    let k = assert_key_refusal(&a, &id, 400_000_000);
    assert_eq!(k["needed_nanos"].as_u64(), Some(500_000_000), "{k}");
    assert!(upstream.seen().is_empty(), "nothing went upstream");
    // A key with room for it: the call goes, and settles what it cost.
    let (key, id) = key_with(dir.path(), uid, &["--budget-per-day", "0.6"]);
    assert_eq!(key_call(&served, &key, "priced").await.status, 200);
    assert_eq!(listed_spend(dir.path(), &id), 51_000_000);
    served.verifies_the_bill(&upstream, &prices(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_budget_per_day_stops_its_calls_over_ten_tasks_and_a_restart_keeps_it() {
    // The principal may spend $100 a day: the key's own $1 a day is what stops it (a
    // `fake-ok` call settles $0.051).
    let (upstream, dir, uid, mut served) = keyed("spend_usd = \"100\"\n");
    let (key, id) = key_with(dir.path(), uid, &["--budget-per-day", "1"]);
    let budget = 1_000_000_000;
    let (mut allowed, mut refused, mut first_run) = (0u64, 0u64, None);
    for i in 0..200 {
        let a = key_call(&served, &key, &format!("task-{}", i % 10)).await;
        if a.status == 200 {
            assert_eq!(refused, 0, "call {i} allowed after a refusal");
            allowed += 1;
            first_run.get_or_insert_with(|| {
                let run = a.headers.get("x-tally-run").expect("x-tally-run");
                run.to_str().expect("ascii").to_owned()
            });
        } else {
            assert_key_refusal(&a, &id, budget);
            refused += 1;
        }
    }
    assert!(
        (15..=19).contains(&allowed),
        "$1 of $0.051 calls, the last one's worst case reserved: {allowed}"
    );
    assert_eq!(
        upstream.seen().len() as u64,
        allowed,
        "no refused call went upstream"
    );
    assert_eq!(listed_spend(dir.path(), &id), allowed * 51_000_000);

    // Counted on /metrics by reason, never by key.
    if tally_testkit::have(
        "python3",
        &["-c", "import prometheus_client"],
        "pip install prometheus-client==0.26.0 (README, Development)",
    ) {
        let text = super::observed::metrics_after(&served, allowed).await;
        let samples = super::observed::parse_metrics(&text);
        let by_reason: std::collections::BTreeMap<String, f64> = samples
            .iter()
            .filter(|(n, _, _)| n == "tally_key_refusals_total")
            .map(|(_, l, v)| {
                assert_eq!(l.keys().collect::<Vec<_>>(), ["reason"], "{l:?}");
                (l["reason"].clone(), *v)
            })
            .collect();
        assert_eq!(by_reason.get("budget_exceeded"), Some(&(refused as f64)));
        assert_eq!(
            by_reason.len(),
            6,
            "every reason, and only they: {by_reason:?}"
        );
        assert!(!text.contains(&id), "the key's id is no label");
    }

    // A restart reads the day's spend back from the runs: still refused, still listed,
    // a killed run too (the gate keeps no stopped run in memory after a restart).
    let killed = first_run.expect("a run");
    tally().ok(
        dir.path(),
        &[
            "kill",
            "--operator-socket",
            "operator.sock",
            "--run",
            &killed,
        ],
        "",
    );
    served.daemon.stop();
    served = Served::start(dir.path());
    assert_eq!(listed_spend(dir.path(), &id), allowed * 51_000_000);
    let a = key_call(&served, &key, "task-new").await;
    let k = assert_key_refusal(&a, &id, budget);
    assert_eq!(
        k["settled_today_nanos"].as_u64(),
        Some(allowed * 51_000_000)
    );
    assert_eq!(upstream.seen().len() as u64, allowed);
    served.verifies_the_bill(&upstream, &prices(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_racing_calls_on_a_keys_last_cents_never_pass_its_budget() {
    let (upstream, dir, uid, served) = keyed("spend_usd = \"100\"\nruns = 1000\n");
    // A call's worst case, as a key of one nanodollar a day is told it needs.
    let (tiny, tiny_id) = key_with(dir.path(), uid, &["--budget-per-day", "0.000000001"]);
    let a = key_call(&served, &tiny, "probe").await;
    let worst = assert_key_refusal(&a, &tiny_id, 1)["needed_nanos"]
        .as_u64()
        .expect("needed");
    // Room for three worst cases and a half: three reservations at once, never four.
    let budget = worst * 7 / 2;
    let usd = format!("{}.{:09}", budget / 1_000_000_000, budget % 1_000_000_000);
    let (key, id) = key_with(dir.path(), uid, &["--budget-per-day", &usd]);
    let mut racing = tokio::task::JoinSet::new();
    for i in 0..64 {
        let (addr, auth) = (served.proxy, bearer(&key));
        racing.spawn(async move {
            let task = format!("t{}", i % 8);
            call(
                addr,
                "/openai/v1/chat/completions",
                &[("authorization", &auth), ("x-tally-task", &task)],
                chat("fake-ok", json!({"max_tokens": 50})),
            )
            .await
        });
    }
    let mut allowed = 0u64;
    while let Some(a) = racing.join_next().await {
        let a = a.expect("a call");
        if a.status == 200 {
            allowed += 1;
        } else {
            assert_key_refusal(&a, &id, budget);
        }
    }
    assert!(allowed >= 3, "three worst cases fit: {allowed}");
    let spent = listed_spend(dir.path(), &id);
    assert_eq!(spent, allowed * 51_000_000);
    assert!(spent <= budget, "{spent} settled of a budget of {budget}");
    // The probe went nowhere either.
    assert_eq!(upstream.seen().len() as u64, allowed);

    // Its runs per day: two tasks start, a third is refused with the key's counts.
    let (key, id) = key_with(dir.path(), uid, &["--runs-per-day", "2"]);
    for task in ["a", "b", "a"] {
        assert_eq!(key_call(&served, &key, task).await.status, 200);
    }
    let a = key_call(&served, &key, "c").await;
    assert_eq!(a.status, 403, "{}", a.text());
    assert_eq!(code(&a), Reason::BudgetExceeded.as_str(), "{}", a.text());
    let k = &a.json()["error"]["key"];
    assert_eq!(k["id"], id.as_str());
    assert_eq!(
        (k["runs_per_day"].as_u64(), k["runs_today"].as_u64()),
        (Some(2), Some(2)),
        "{}",
        a.text()
    );
}
