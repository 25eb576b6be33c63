//! Three daemons (`tally serve` in-process, real Unix sockets, each with its own ledger)
//! over one PostgreSQL: one budget for the fleet.

mod common;

use common::{ledger, Cluster};
use tally_api::client::{Client, Method};
use tally_daemon::ServeOptions;
use tally_gate_postgres::Options as PostgresOptions;
use tally_policy::Recorded;

async fn post(
    socket: &std::path::Path,
    path: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let mut c = Client::unix(socket).await.expect("connect");
    let reply = c
        .request(
            Method::POST,
            path,
            Some("application/json"),
            body.to_string(),
        )
        .await
        .expect("answer");
    let value = serde_json::from_slice(&reply.body).unwrap_or(serde_json::Value::Null);
    (reply.status.as_u16(), value)
}

#[test]
fn three_daemons_on_one_database_share_one_budget() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let policy =
        Recorded::new("[ceiling]\nattempts = 5\n[approvals]\nask_on = []\n").expect("policy");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut sockets = Vec::new();
        let mut stops = Vec::new();
        let mut served = Vec::new();
        for i in 0..3 {
            let host = dir.path().join(format!("host{i}"));
            std::fs::create_dir_all(&host).expect("host dir");
            let ledger = ledger(&host);
            let socket = host.join("agent.sock");
            let mut options = ServeOptions::new(host.join("ledger"), &socket);
            options.policy = policy.clone();
            options.state = Some(shared(PostgresOptions::new(&cluster.url())));
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            served.push(tokio::spawn(tally_daemon::serve(
                ledger,
                options,
                async move {
                    let _ = stopped.await;
                },
            )));
            for _ in 0..400 {
                if socket.exists() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            }
            sockets.push(socket);
            stops.push(stop);
        }
        let (status, started) = post(
            &sockets[0],
            "/v1/runs",
            serde_json::json!({"run": "fleet", "goal": "one budget"}),
        )
        .await;
        assert_eq!(status, 201, "{started}");
        // 8 workers on each daemon race for the run's 5 attempts.
        let mut tasks = Vec::new();
        for (d, socket) in sockets.iter().enumerate() {
            for w in 0..8 {
                let socket = socket.clone();
                tasks.push(tokio::spawn(async move {
                    let body = serde_json::json!({
                        "run": "fleet", "worker": format!("d{d}w{w}"), "tool": "api",
                        "operation": format!("op{d}-{w}"), "effect": "read"
                    });
                    post(&socket, "/v1/check", body).await
                }));
            }
        }
        let mut allows = 0;
        for t in tasks {
            let (status, answer) = t.await.expect("task");
            assert_eq!(status, 200, "{answer}");
            if answer["decision"] == "allow" {
                allows += 1;
            } else {
                assert_eq!(answer["reason"], "attempts_exhausted", "{answer}");
            }
        }
        assert_eq!(allows, 5, "24 checks on 3 daemons against attempts = 5");
        // The run stopped through one daemon is stopped on the others.
        let (status, _) = post(&sockets[1], "/v1/runs/fleet/stop", serde_json::json!({})).await;
        assert_eq!(status, 200);
        let (status, after) = post(
            &sockets[2],
            "/v1/check",
            serde_json::json!({"run": "fleet", "tool": "api", "effect": "read"}),
        )
        .await;
        assert_eq!(
            (status, after["reason"].as_str()),
            (200, Some("completed")),
            "{after}"
        );
        for stop in stops {
            let _ = stop.send(());
        }
        for s in served {
            s.await.expect("join").expect("a daemon failed");
        }
    });
}

/// Checks queued on one daemon behind a run's row that another gate holds are each
/// refused within three bounds, not one bound after another: the daemon makes its gate
/// calls one at a time on its decision thread, and refuses, without making it, a call
/// that waited past the bound for its turn. Once the row is free the same daemon allows.
#[test]
fn checks_queued_on_a_daemon_behind_a_held_row_are_each_refused_within_the_bound() {
    use std::time::{Duration, Instant};
    use tally_gate::backend::{Keys, StateBackend, StateTxn};
    const BOUND: Duration = Duration::from_secs(1);
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let host = dir.path().join("host");
        std::fs::create_dir_all(&host).expect("host dir");
        let ledger = ledger(&host);
        let socket = host.join("agent.sock");
        let mut options = ServeOptions::new(host.join("ledger"), &socket);
        options.policy = Recorded::new("[approvals]\nask_on = []\n").expect("policy");
        options.state = Some(shared(PostgresOptions {
            url: cluster.url(),
            timeout: BOUND,
        }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(tally_daemon::serve(ledger, options, async move {
            let _ = stopped.await;
        }));
        while Client::unix(&socket).await.is_err() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (status, started) = post(&socket, "/v1/runs", serde_json::json!({"run": "r"})).await;
        assert_eq!(status, 201, "{started}");
        let check = |op: String| {
            let socket = socket.clone();
            async move {
                let body =
                    serde_json::json!({"run": "r", "tool": "t", "operation": op, "effect": "read"});
                let began = Instant::now();
                let (status, answer) = post(&socket, "/v1/check", body).await;
                (began.elapsed(), status, answer)
            }
        };

        // Another gate's transaction holds the run's row (a stalled decision elsewhere),
        // on a thread of its own (the backend blocks on its own runtime).
        let (locked_tx, locked) = std::sync::mpsc::channel::<()>();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let url = cluster.url();
        let holder = std::thread::spawn(move || {
            let other_dir = tempfile::tempdir().expect("dir");
            let other = tally_gate_postgres::Postgres::open(
                common::ledger(other_dir.path()),
                &PostgresOptions {
                    url,
                    timeout: Duration::from_secs(30),
                },
            )
            .expect("second backend");
            let mut held = other.begin().expect("begin");
            held.load(&Keys::run("r")).expect("lock the run's row");
            locked_tx.send(()).expect("signal");
            let _ = released.recv();
            drop(held);
        });
        tokio::task::block_in_place(|| locked.recv()).expect("the row is held");
        let queued: Vec<_> = (0..8)
            .map(|i| tokio::spawn(check(format!("queued{i}"))))
            .collect();
        for q in queued {
            let (took, status, answer) = q.await.expect("check");
            assert_eq!(
                (status, answer["reason"].as_str()),
                (503, Some("gate_unavailable")),
                "{answer}"
            );
            assert!(
                took <= 3 * BOUND,
                "a queued check was refused only after {took:?} (bound {BOUND:?})"
            );
        }
        release.send(()).expect("release");
        tokio::task::block_in_place(|| holder.join()).expect("holder");
        let (_, status, answer) = check("after".into()).await;
        assert_eq!(
            (status, answer["decision"].as_str()),
            (200, Some("allow")),
            "{answer}"
        );
        let _ = stop.send(());
        served.await.expect("join").expect("the daemon failed");
    });
}

/// The daemon's shared gate state in the database `pg` names, wired as `tally serve
/// --state` wires it.
fn shared(pg: PostgresOptions) -> tally_daemon::SharedState {
    tally_daemon::SharedState {
        timeout: pg.timeout,
        label: "gate state in PostgreSQL, shared".into(),
        open: std::sync::Arc::new(move |ledger, policy, clock| {
            tally_gate_postgres::gatekeeper(ledger, &pg, policy, clock)
        }),
    }
}

/// The daemon's shared gate state in the database `pg` names, leased as `tally serve
/// --state --leases` wires it, under the holder name `holder`.
/// The lease thread ticks every 100 ms.
fn leased(pg: PostgresOptions, holder: &str) -> tally_daemon::SharedState {
    let mut setup = tally_gate_postgres::LeaseSetup::new(holder);
    setup.refresh = std::time::Duration::from_millis(100);
    tally_daemon::SharedState {
        timeout: pg.timeout,
        label: "gate state in PostgreSQL, shared; runs decided inside leased slices".into(),
        open: std::sync::Arc::new(move |ledger, policy, clock| {
            tally_gate_postgres::leased_gatekeeper(ledger, &pg, &setup, policy, clock)
                .map(|(gate, _)| gate)
        }),
    }
}

/// A leased run whose scope has no room left (its row still shows room: the room was
/// lost, as a slice reclaimed after a kill is counted whole) is refused `503` for twice
/// the group commit's drain bound and one database bound of lease ticks (the row may be
/// behind the scope for a moment), then with the budget's typed reason and its action
/// (`ask`), every time: not a `503 gate_unavailable` inviting retries forever. Nothing
/// is counted for it.
#[test]
fn a_leased_run_whose_scope_has_no_room_is_refused_typed_not_unavailable() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = Recorded::new("[approvals]\nask_on = []\n").expect("policy");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let ledger = ledger(dir.path());
        let socket = dir.path().join("agent.sock");
        let mut options = ServeOptions::new(dir.path().join("ledger"), &socket);
        options.policy = policy;
        // A 1 s bound: the daemon refuses it as unavailable for 5 s of lease ticks.
        let mut pg = PostgresOptions::new(&cluster.url());
        pg.timeout = std::time::Duration::from_secs(1);
        options.state = Some(leased(pg, "host-a"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(tally_daemon::serve(ledger, options, async move {
            let _ = stopped.await;
        }));
        for _ in 0..400 {
            if socket.exists() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        let start = serde_json::json!({"run": "r", "goal": "g", "budget": {"attempts": 3}});
        let (status, started) = post(&socket, "/v1/runs", start).await;
        assert_eq!(status, 201, "{started}");
        // The run's scope has no room left, though its row shows 3 attempts.
        cluster.psql(
            "UPDATE tally_lease_scopes SET settled_attempts = cap_attempts WHERE kind = 'run' AND key = 'r'",
        );
        let check = || async {
            let body = serde_json::json!({"run": "r", "tool": "api", "operation": "op", "effect": "read"});
            post(&socket, "/v1/check", body).await
        };
        // Until the grace passed since the daemon first found it so (the row may be
        // behind the scope for a moment): unavailable, retry.
        // A stall between checks no longer starts the window again (a scope is
        // forgotten only after 10 s with no use refused); 60 s leaves a loaded machine
        // margin over the 5 s.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut unavailable = 0;
        loop {
            let (status, answer) = check().await;
            if status == 403 {
                break;
            }
            assert_eq!((status, &answer["error"]["code"]), (503, &serde_json::json!("gate_unavailable")), "{answer}");
            unavailable += 1;
            assert!(std::time::Instant::now() < deadline, "still 503 after {unavailable} checks");
        }
        assert!(unavailable > 0, "refused typed at once");
        for _ in 0..3 {
            let (status, answer) = check().await;
            assert_eq!(status, 403, "{answer}");
            let error = &answer["error"];
            assert_eq!(
                (&error["code"], &error["cause"]),
                (&serde_json::json!("refused"), &serde_json::json!("budget_exceeded")),
                "{answer}"
            );
            let said = error["message"].as_str().unwrap_or_default();
            assert!(said.contains("action ask"), "{answer}");
        }
        let used = cluster.psql("SELECT settled_attempts, leased_attempts FROM tally_lease_scopes WHERE key = 'r'");
        assert_eq!(used.trim(), "3|0", "nothing more counted");
        let _ = stop.send(());
        served.await.expect("join").expect("the daemon failed");
    });
}

/// A principal's lease scope with no room left (its uid's budget across its runs, as
/// settled in `tally_lease_scopes`) refuses a check through a central daemon with
/// `principal_budget_exceeded` (action ask), every time; while the room is in slices out
/// elsewhere, or in a slice reclaimed whose holder may still give it back, it is `503
/// gate_unavailable` (retry: they come back); a reclaimed slice of a restarted (or
/// fenced) holder never comes back. Nothing is settled.
#[test]
fn a_principal_scope_with_no_room_is_refused_with_the_principals_reason() {
    use std::os::unix::fs::MetadataExt;
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let uid = std::fs::metadata(dir.path()).expect("dir").uid();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let ledger = ledger(dir.path());
        let socket = dir.path().join("agent.sock");
        let mut options = ServeOptions::new(dir.path().join("ledger"), &socket);
        options.policy = Recorded::new("[approvals]\nask_on = []\n").expect("policy");
        options.state = Some(shared(PostgresOptions::new(&cluster.url())));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(tally_daemon::serve(ledger, options, async move {
            let _ = stopped.await;
        }));
        for _ in 0..400 {
            if socket.exists() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        let (status, started) = post(&socket, "/v1/runs", serde_json::json!({"run": "p", "goal": "g"})).await;
        assert_eq!(status, 201, "{started}");
        // The uid's scope: 3 attempts, 1 settled, 2 in a slice out elsewhere.
        cluster.psql(&format!(
            "INSERT INTO tally_lease_scopes (kind, key, cap_attempts, settled_attempts, leased_attempts) VALUES ('principal', '{uid}', 3, 1, 2)"
        ));
        let check = || async {
            let body = serde_json::json!({"run": "p", "tool": "api", "operation": "op", "effect": "read"});
            post(&socket, "/v1/check", body).await
        };
        let (status, answer) = check().await;
        assert_eq!((status, &answer["error"]["code"]), (503, &serde_json::json!("gate_unavailable")), "{answer}");
        // The slice reclaimed (settled whole) while its holder still has the slice's
        // epoch: it may give it back, unused: still retry.
        cluster.psql(&format!(
            "INSERT INTO tally_lease_holders (holder, epoch) VALUES ('host-x', 1); \
             INSERT INTO tally_leases (kind, key, holder, epoch, attempts, nanos, effects, polls, state, granted_at, expires_at, ended_at) \
             VALUES ('principal', '{uid}', 'host-x', 1, 2, 0, 0, 0, 'reclaimed', now(), now(), now()); \
             UPDATE tally_lease_scopes SET settled_attempts = 3, leased_attempts = 0 WHERE kind = 'principal' AND key = '{uid}'"
        ));
        let (status, answer) = check().await;
        assert_eq!((status, &answer["error"]["code"]), (503, &serde_json::json!("gate_unavailable")), "{answer}");
        // Its holder restarted (a later epoch): its release of the slice is refused, the
        // slice settled whole for good: no room left at all.
        cluster.psql("UPDATE tally_lease_holders SET epoch = 2 WHERE holder = 'host-x'");
        for _ in 0..3 {
            let (status, answer) = check().await;
            assert_eq!(status, 403, "{answer}");
            assert_eq!(answer["error"]["code"], "principal_budget_exceeded", "{answer}");
            let said = answer["error"]["message"].as_str().unwrap_or_default();
            assert!(said.contains("action ask"), "{answer}");
        }
        let settled = cluster.psql(&format!("SELECT settled_attempts FROM tally_lease_scopes WHERE key = '{uid}'"));
        assert_eq!(settled.trim(), "3", "nothing more settled");
        let _ = stop.send(());
        served.await.expect("join").expect("the daemon failed");
    });
}
