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
