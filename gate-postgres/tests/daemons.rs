//! Three daemons (`tally serve` in-process, real Unix sockets, each with its own ledger)
//! over one PostgreSQL: one budget for the fleet.

mod common;

use common::{ledger, Cluster};
use tally_daemon::client::{Client, Method};
use tally_daemon::{PostgresOptions, ServeOptions};
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
            options.state = Some(PostgresOptions::new(&cluster.url()));
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
