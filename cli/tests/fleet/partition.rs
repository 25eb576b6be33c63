//! A network partition between the daemons and PostgreSQL (a network namespace; needs root).

use super::*;

/// A network namespace joined to this one by a veth pair: `10.213.N.1` on this side,
/// `10.213.N.2` inside. Removed on drop.
struct NetNs {
    name: String,
    outside: String,
    subnet: u32,
}

impl NetNs {
    /// `None` (with a loud SKIP) where network namespaces are not permitted (not root, no
    /// `ip`, a container without CAP_NET_ADMIN).
    fn new() -> Option<NetNs> {
        let pid = std::process::id();
        let subnet = pid % 250 + 1;
        let ns = NetNs {
            name: format!("tally-test-{pid}"),
            outside: format!("tlo{pid}"),
            subnet,
        };
        let inside = format!("tli{pid}");
        let ip = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| e.to_string())
                .and_then(|o| {
                    if o.status.success() {
                        Ok(())
                    } else {
                        Err(String::from_utf8_lossy(&o.stderr).into_owned())
                    }
                })
        };
        if let Err(e) = ip(&["netns", "add", &ns.name]) {
            tally_testkit::skip(
                &format!("cannot create a network namespace here ({})", e.trim()),
                "run the suite as root with iproute2's `ip` (apt-get install iproute2), as CI does",
            );
            return None;
        }
        let (here, there) = (ns.address(1), ns.address(2));
        let (name, outside) = (ns.name.as_str(), ns.outside.as_str());
        let setup: [&[&str]; 7] = [
            &[
                "link", "add", outside, "type", "veth", "peer", "name", &inside,
            ],
            &["link", "set", &inside, "netns", name],
            &["addr", "add", &format!("{here}/30"), "dev", outside],
            &["link", "set", outside, "up"],
            &[
                "-n",
                name,
                "addr",
                "add",
                &format!("{there}/30"),
                "dev",
                &inside,
            ],
            &["-n", name, "link", "set", &inside, "up"],
            &["-n", name, "link", "set", "lo", "up"],
        ];
        for args in setup {
            if let Err(e) = ip(args) {
                tally_testkit::skip(
                    &format!(
                        "network namespace setup failed at `ip {}` ({})",
                        args.join(" "),
                        e.trim()
                    ),
                    "run the suite as root with iproute2's `ip`, as CI does",
                );
                return None;
            }
        }
        Some(ns)
    }

    fn address(&self, host: u32) -> String {
        format!("10.213.{}.{host}", self.subnet)
    }

    /// Take this side of the link down (`up = false`: a partition, packets dropped, no
    /// reset sent either way) or up again.
    fn link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        let out = Command::new("ip")
            .args(["link", "set", &self.outside, state])
            .output()
            .expect("ip link");
        assert!(out.status.success(), "{out:?}");
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.outside])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A network partition between the daemons and PostgreSQL (the daemons in their own
/// network namespace, PostgreSQL on TCP at the other end of a veth pair, the link taken
/// down mid-load: packets silently dropped, no connection refused or reset). Every check
/// asked during the partition is refused as `gate_unavailable`, none allowed, and each is
/// answered (the bound on every round trip); after the link comes back the same daemons
/// allow again, no acknowledged decision is lost and the state is within one decision per
/// daemon of the ledgers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_partition_from_postgres_refuses_then_recovers() {
    let Some(net) = NetNs::new() else {
        return;
    };
    let Some(cluster) = pg::Cluster::start_listening(&net.address(1)) else {
        return;
    };
    let mut fleet = Fleet::start_on(cluster.tcp_url(), Some(net.name.clone()));
    fleet.ready().await;
    let stop = Arc::new(AtomicBool::new(false));
    let (allows, tasks) = under_load(&fleet, &stop).await;
    net.link(false);
    let cut = Instant::now();
    let probes: Vec<_> = (0..DAEMONS)
        .map(|d| {
            let socket = fleet.socket(d);
            tokio::spawn(async move {
                let mut c = Client::unix(socket).await.expect("connect");
                let check =
                    json!({"run": "r", "tool": "api0", "operation": "probe", "effect": "read"});
                let sent = Instant::now();
                let answer = tokio::time::timeout(
                    Duration::from_secs(60),
                    post(&mut c, "/v1/check", &check),
                )
                .await
                .unwrap_or_else(|_| panic!("daemon {d} hangs on a partitioned database"));
                (sent.elapsed(), answer.expect("an answer"))
            })
        })
        .collect();
    for (d, p) in probes.into_iter().enumerate() {
        let (took, (status, a)) = p.await.expect("probe");
        assert_eq!(status, 503, "daemon {d}: {a}");
        assert_eq!(
            (a["reason"].as_str(), a["action"].as_str()),
            (Some("gate_unavailable"), Some("retry")),
            "daemon {d}: {a}"
        );
        assert!(
            took <= 3 * BOUND,
            "daemon {d}: a check was refused only after {took:?}, beyond 3 x the {BOUND:?} bound"
        );
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let healed = Instant::now();
    net.link(true);
    let recovered = allow_again(&allows, Duration::from_secs(60), "the partition healed").await;
    stop.store(true, Ordering::Relaxed);
    let seen = joined(tasks).await;
    for (d, seen) in seen.iter().enumerate() {
        let bad: Vec<&Seen> = seen
            .iter()
            .filter(|s| matches!(s.what, What::Lost(_) | What::Other(..) | What::Deny(_)))
            .collect();
        assert!(bad.is_empty(), "daemon {d}: {bad:?}");
        let during: Vec<&Seen> = seen
            .iter()
            .filter(|s| s.sent >= cut && s.got <= healed)
            .collect();
        for s in &during {
            assert!(
                matches!(s.what, What::Unavailable(_)),
                "daemon {d}: answered during the partition: {s:?}"
            );
            // Each refused within a bound of waiting for its turn plus a bound of its own.
            assert!(
                s.got - s.sent <= 3 * BOUND,
                "daemon {d}: refused only after {:?}, beyond 3 x the {BOUND:?} bound",
                s.got - s.sent
            );
        }
    }
    let standing = get(&fleet.socket(2), "/v1/runs/r").await;
    fleet.stop();
    let (_, given, issued) = none_lost_state_at_most_one_ahead(&fleet, "r", &seen, &standing);
    let refused: Vec<Duration> = seen
        .iter()
        .flatten()
        .filter(|s| matches!(s.what, What::Unavailable(_)))
        .map(|s| s.got - s.sent)
        .collect();
    eprintln!(
        "partition: {} refused as unavailable, the slowest after {:.1} s; 20 allows on each \
         daemon {:.1} s after the link came back; {given} allows in the ledgers, the state \
         issued {issued}",
        refused.len(),
        refused
            .iter()
            .max()
            .copied()
            .unwrap_or_default()
            .as_secs_f64(),
        recovered.as_secs_f64()
    );
}
