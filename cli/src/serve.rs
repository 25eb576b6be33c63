//! `tally serve`: its flags, checked and turned into the daemon's options.

use anyhow::{bail, Context, Result};

use crate::cli::ServeArgs as Serve;
use crate::commands::read_policy;
use crate::Exit;

/// Serve until SIGTERM or SIGINT (the daemon logs its start and stop to stderr).
pub fn serve(args: Serve) -> Result<Exit> {
    tally_daemon::run(options(args)?)?;
    Ok(Exit::Success)
}

/// The daemon's options, or an error naming the flag at fault.
fn options(args: Serve) -> Result<tally_daemon::ServeOptions> {
    // The CLI wires the backend: the daemon links no database.
    let state = crate::fleet::shared_state(&args)?;
    let mut options = tally_daemon::ServeOptions::new(args.ledger, args.socket);
    options.state = state;
    options.listen = args.listen;
    options.operator_socket = args.operator_socket;
    if let Some(path) = args.policy {
        options.policy = read_policy(&path)?;
    }
    options.socket_mode =
        tally_daemon::access::parse_socket_mode(&args.socket_mode).context("--socket-mode")?;
    if let Some(group) = &args.socket_group {
        options.socket_gid = Some(tally_daemon::access::group_id(group).context("--socket-group")?);
    }
    if args.max_body_bytes == 0 {
        bail!("--max-body-bytes: must be at least 1");
    }
    options.limits.max_body_bytes = args.max_body_bytes;
    if args.rate_per_sec == Some(0) {
        bail!("--rate-per-sec: must be at least 1 (leave it out for no limit)");
    }
    options.limits.rate_per_sec = args.rate_per_sec;
    if args.max_connections_per_peer == 0 {
        bail!("--max-connections-per-peer: must be at least 1");
    }
    options.limits.max_connections_per_peer = args.max_connections_per_peer;
    if let Some(path) = &args.witness_policy {
        options.witness.policy = Some(crate::witness::read_policy(path)?);
        options.witness.interval =
            std::time::Duration::from_millis(args.witness_interval_ms.max(100));
        options.witness.ca_files = crate::witness::ca_files(&args.witness_ca)?;
    }
    options.notify.receivers = args.notify.clone();
    options.notify.secret_file = args.notify_secret_file.clone();
    options.notify.ca_file = args.notify_ca.clone();
    if let Some(addr) = &args.metrics_listen {
        options.observe.metrics_listen = Some(metrics_addr(addr)?);
    }
    if args.metrics_max_connections == 0 {
        bail!("--metrics-max-connections: must be at least 1");
    }
    options.observe.metrics_max_connections = args.metrics_max_connections;
    if args.max_live_streams == 0 {
        bail!("--max-live-streams: must be at least 1");
    }
    options.observe.max_live_streams = args.max_live_streams;
    options.observe.log_format = match args.log_format.as_str() {
        "json" => tally_daemon::LogFormat::Json,
        _ => tally_daemon::LogFormat::Text,
    };
    options.observe.otlp_endpoint = args.otlp_endpoint;
    if let Some(ratio) = &args.otlp_sample {
        options.observe.otlp_sample = sample(ratio)?;
    }
    options.proxy = proxy(&args.proxy_listen, &args.proxy_socket, &args.credential)?;
    options.mcp_listen = args.mcp_listen.as_deref().map(mcp_listen).transpose()?;
    options.mcp_limits = mcp_limits(
        (args.mcp_max_sessions, args.mcp_max_sessions_per_credential),
        args.mcp_idle_secs,
        (args.mcp_max_body_bytes, args.mcp_max_connections),
    )?;
    proxy_limits(
        options.proxy.as_mut(),
        args.proxy_max_connections_per_peer,
        args.proxy_read_timeout_ms,
    )?;
    Ok(options)
}

/// `--proxy-max-connections-per-peer` and `--proxy-read-timeout-ms`: the proxy's only.
fn proxy_limits(
    proxy: Option<&mut tally_daemon::ProxyServe>,
    per_peer: Option<usize>,
    read_timeout_ms: Option<u64>,
) -> Result<()> {
    let mut proxy = proxy;
    match (&mut proxy, per_peer) {
        (_, Some(0)) => bail!("--proxy-max-connections-per-peer: must be at least 1"),
        (Some(p), Some(n)) => p.max_connections_per_peer = n,
        (None, Some(_)) => bail!("--proxy-max-connections-per-peer: only the proxy has it; give --proxy-listen ADDR or --proxy-socket PATH"),
        (_, None) => {}
    }
    match (&mut proxy, read_timeout_ms) {
        (_, Some(0)) => bail!("--proxy-read-timeout-ms: must be at least 1"),
        (Some(p), Some(ms)) => p.read_timeout = std::time::Duration::from_millis(ms),
        (None, Some(_)) => bail!("--proxy-read-timeout-ms: only the proxy has it; give --proxy-listen ADDR or --proxy-socket PATH"),
        (_, None) => {}
    }
    Ok(())
}

/// `--mcp-max-sessions`, `--mcp-max-sessions-per-credential`, `--mcp-idle-secs`,
/// `--mcp-max-body-bytes`, `--mcp-max-connections`: each at least 1.
fn mcp_limits(
    (sessions, per_credential): (Option<usize>, Option<usize>),
    idle_secs: Option<u64>,
    (body, connections): (Option<usize>, Option<usize>),
) -> Result<tally_mcp::gateway::GatewayLimits> {
    use tally_mcp::gateway as g;
    for (name, n) in [
        ("mcp-max-sessions", sessions.map(|n| n as u64)),
        (
            "mcp-max-sessions-per-credential",
            per_credential.map(|n| n as u64),
        ),
        ("mcp-idle-secs", idle_secs),
        ("mcp-max-body-bytes", body.map(|n| n as u64)),
        ("mcp-max-connections", connections.map(|n| n as u64)),
    ] {
        if n == Some(0) {
            bail!("--{name}: must be at least 1");
        }
    }
    Ok(g::GatewayLimits::new(
        sessions.unwrap_or(g::DEFAULT_MAX_SESSIONS),
        idle_secs.map_or(g::DEFAULT_IDLE, std::time::Duration::from_secs),
        body.unwrap_or(g::DEFAULT_MAX_BODY),
    )
    .with_sessions_per_credential(per_credential.unwrap_or(g::DEFAULT_MAX_SESSIONS_PER_CREDENTIAL))
    .with_max_connections(connections.unwrap_or(g::DEFAULT_MAX_CONNECTIONS)))
}

/// `--mcp-listen`: a loopback address.
fn mcp_listen(text: &str) -> Result<std::net::SocketAddr> {
    let addr: std::net::SocketAddr = text.parse().with_context(|| {
        format!("--mcp-listen: `{text}` is not ADDR:PORT (e.g. 127.0.0.1:7391)")
    })?;
    if !addr.ip().is_loopback() {
        bail!("--mcp-listen: {addr} is not loopback; the gateway acts for whoever holds a run token, so it listens on loopback only");
    }
    Ok(addr)
}

/// `--otlp-sample`: a ratio from 0 to 1, written as a decimal number.
fn sample(ratio: &str) -> Result<f64> {
    let bad = || {
        anyhow::anyhow!(
            "--otlp-sample: `{ratio}` is not a ratio from 0 to 1 (e.g. 0.1 exports a tenth of the traces tally starts; 1 exports them all)"
        )
    };
    // Digits and one dot only: no sign, exponent, `inf` or `NaN`.
    if ratio.is_empty()
        || !ratio.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        || ratio.bytes().filter(|&b| b == b'.').count() > 1
    {
        return Err(bad());
    }
    let r: f64 = ratio.parse().map_err(|_| bad())?;
    if !(0.0..=1.0).contains(&r) {
        return Err(bad());
    }
    Ok(r)
}

/// `--proxy-listen`, `--proxy-socket` and `--credential`: the proxy, if either of the
/// first two is given.
fn proxy(
    listen: &Option<String>,
    socket: &Option<std::path::PathBuf>,
    credentials: &[String],
) -> Result<Option<tally_daemon::ProxyServe>> {
    if listen.is_none() && socket.is_none() {
        if !credentials.is_empty() {
            bail!("--credential: only the proxy uses credentials; give --proxy-listen ADDR or --proxy-socket PATH");
        }
        return Ok(None);
    }
    let mut p = tally_daemon::ProxyServe::default();
    if let Some(text) = listen {
        let addr: std::net::SocketAddr = text.parse().with_context(|| {
            format!("--proxy-listen: `{text}` is not ADDR:PORT (e.g. 127.0.0.1:7390)")
        })?;
        if !addr.ip().is_loopback() {
            bail!("--proxy-listen: {addr} is not loopback; the proxy spends budgets for whoever holds a run token, so it listens on loopback only");
        }
        p.listen = Some(addr);
    }
    p.socket = socket.clone();
    for c in credentials {
        let Some((name, file)) = c
            .split_once('=')
            .filter(|(n, f)| !n.is_empty() && !f.is_empty())
        else {
            bail!("--credential: `{c}` is not NAME=FILE");
        };
        if p.credentials.contains_key(name) {
            bail!("--credential: `{name}` is given twice");
        }
        let secret = tally_proxy::read_credential(std::path::Path::new(file))
            .with_context(|| format!("--credential {name}"))?;
        p.credentials.insert(name.to_owned(), secret);
    }
    Ok(Some(p))
}

/// `--metrics-listen`: `ADDR:PORT` on loopback, or a port alone for 127.0.0.1.
fn metrics_addr(text: &str) -> Result<std::net::SocketAddr> {
    let addr = match text.parse::<u16>() {
        Ok(port) => std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Err(_) => text.parse().with_context(|| {
            format!("--metrics-listen: `{text}` is not ADDR:PORT (e.g. 127.0.0.1:9464) or a port")
        })?,
    };
    if !addr.ip().is_loopback() {
        bail!("--metrics-listen: {addr} is not loopback; the live page names every run, so it is served on loopback only (put a proxy with authentication in front to reach it from elsewhere)");
    }
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::{Cli, Command};

    /// Parse `tally serve --ledger L --socket S` plus `extra` into the daemon's options.
    fn parsed(extra: &[&str]) -> anyhow::Result<tally_daemon::ServeOptions> {
        let mut argv = vec!["tally", "serve", "--ledger", "L", "--socket", "S"];
        argv.extend_from_slice(extra);
        let Command::Serve(args) = Cli::try_parse_from(argv)?.command else {
            panic!("not serve");
        };
        super::options(*args)
    }

    #[test]
    fn the_lease_flags_are_checked() {
        let state = ["--state", "host=/run/postgresql dbname=tally"];
        let leased = parsed(&[state[0], state[1], "--leases"]).expect("leases");
        let label = leased.state.expect("shared state").label;
        assert!(label.contains("leased slices"), "{label}");
        let no_state = parsed(&["--leases"]).expect_err("no --state");
        assert!(no_state.to_string().contains("--state"), "{no_state}");
        let slow = parsed(&[state[0], state[1], "--leases", "--lease-refresh-ms", "6000"]);
        let why = slow.expect_err("a refresh past half the ttl").to_string();
        assert!(why.contains("--lease-refresh-ms"), "{why}");
        let bad = parsed(&[state[0], state[1], "--leases", "--lease-holder", "a b"]);
        let why = bad.expect_err("a holder with a space").to_string();
        assert!(why.contains("--lease-holder"), "{why}");
    }

    #[test]
    fn the_operators_view_flags() {
        let d = parsed(&[]).expect("defaults");
        assert!(d.observe.metrics_listen.is_none() && d.observe.otlp_endpoint.is_none());
        assert_eq!(d.observe.log_format, tally_daemon::LogFormat::Text);
        let o = parsed(&[
            "--metrics-listen",
            "9464",
            "--log-format",
            "json",
            "--otlp-endpoint",
            "http://127.0.0.1:4318",
        ])
        .expect("flags");
        assert_eq!(
            o.observe.metrics_listen,
            Some("127.0.0.1:9464".parse().unwrap())
        );
        assert_eq!(o.observe.log_format, tally_daemon::LogFormat::Json);
        assert_eq!(
            o.observe.otlp_endpoint.as_deref(),
            Some("http://127.0.0.1:4318")
        );
        let v6 = parsed(&["--metrics-listen", "[::1]:9464"]).expect("v6");
        assert_eq!(
            v6.observe.metrics_listen,
            Some("[::1]:9464".parse().unwrap())
        );
        for bad in ["0.0.0.0:9464", "192.168.1.2:9464", "localhost:9464", "x"] {
            let e = parsed(&["--metrics-listen", bad]).expect_err(bad);
            assert!(e.to_string().contains("--metrics-listen"), "{e}");
        }
        assert!(parsed(&["--log-format", "yaml"]).is_err());
    }

    #[test]
    fn the_sample_ratio() {
        let otlp = |r: &str| {
            parsed(&[
                "--otlp-endpoint",
                "http://127.0.0.1:4318",
                "--otlp-sample",
                r,
            ])
        };
        assert_eq!(
            parsed(&[]).expect("default").observe.otlp_sample,
            tally_daemon::DEFAULT_OTLP_SAMPLE
        );
        for (r, v) in [
            ("0", 0.0),
            ("1", 1.0),
            ("0.25", 0.25),
            ("1.0", 1.0),
            (".5", 0.5),
        ] {
            assert_eq!(otlp(r).expect(r).observe.otlp_sample, v, "{r}");
        }
        for bad in [
            "", "1.01", "2", "NaN", "inf", "1e-1", "+0.5", "0.5.1", "0,5", " 0.5", ".",
        ] {
            let e = otlp(bad).expect_err(bad);
            assert!(e.to_string().contains("--otlp-sample"), "{bad}: {e}");
        }
        // A sign is clap's to refuse (it reads `-0.1` as a flag).
        assert!(otlp("-0.1").is_err());
        // Sampling without an endpoint is a usage error.
        assert!(parsed(&["--otlp-sample", "0.5"]).is_err());
    }

    #[test]
    fn serve_flags_and_their_defaults() {
        let d = parsed(&[]).expect("defaults");
        assert_eq!(
            (
                d.socket_mode,
                d.socket_gid,
                d.limits.max_body_bytes,
                d.limits.rate_per_sec,
                d.limits.max_connections_per_peer
            ),
            (0o660, None, 1024 * 1024, None, 128)
        );
        assert!(d.state.is_none(), "the ledger's own store by default");
        let pg = parsed(&["--state", "host=/run/postgresql dbname=tally"]).expect("state");
        // Wired to PostgreSQL, with its bound (the connection string stays out of it).
        let state = pg.state.expect("shared state");
        assert_eq!(state.label, "gate state in PostgreSQL, shared");
        assert_eq!(
            state.timeout,
            tally_gate_postgres::Options::new("x").timeout
        );
        assert!(!format!("{state:?}").contains("dbname"), "{state:?}");
        let o = parsed(&[
            "--socket-mode",
            "0640",
            "--socket-group",
            "4321",
            "--max-body-bytes",
            "4096",
            "--rate-per-sec",
            "50",
            "--max-connections-per-peer",
            "8",
        ])
        .expect("flags");
        assert_eq!(
            (
                o.socket_mode,
                o.socket_gid,
                o.limits.max_body_bytes,
                o.limits.rate_per_sec,
                o.limits.max_connections_per_peer
            ),
            (0o640, Some(4321), 4096, Some(50), 8)
        );
    }

    #[test]
    fn the_proxys_read_timeout_is_its_flag_or_the_default() {
        let proxy = |extra: &[&str]| {
            let mut argv = vec!["--proxy-listen", "127.0.0.1:7390"];
            argv.extend_from_slice(extra);
            parsed(&argv).expect("flags").proxy.expect("a proxy")
        };
        // Zero is the daemon's default (tally_proxy::DEFAULT_READ_TIMEOUT).
        assert_eq!(proxy(&[]).read_timeout, std::time::Duration::ZERO);
        assert_eq!(
            proxy(&["--proxy-read-timeout-ms", "1500"]).read_timeout,
            std::time::Duration::from_millis(1500)
        );
    }

    #[test]
    fn bad_serve_flags_name_the_flag_and_the_fix() {
        let cases: &[(&[&str], &str)] = &[
            (&["--socket-mode", "0968"], "--socket-mode: socket mode \"0968\": write it in octal, like 0660"),
            (&["--socket-mode", "0440"], "--socket-mode: socket mode \"0440\": the owner (the daemon's user) needs read and write, 06xx"),
            (&["--socket-group", "no-such-group-here"], "--socket-group: no group named \"no-such-group-here\" in /etc/group; create it (`groupadd no-such-group-here`) or give its numeric gid"),
            (&["--rate-per-sec", "0"], "--rate-per-sec: must be at least 1 (leave it out for no limit)"),
            (&["--max-connections-per-peer", "0"], "--max-connections-per-peer: must be at least 1"),
            (&["--max-body-bytes", "0"], "--max-body-bytes: must be at least 1"),
            (&["--proxy-read-timeout-ms", "500"], "--proxy-read-timeout-ms: only the proxy has it; give --proxy-listen ADDR or --proxy-socket PATH"),
            (&["--proxy-listen", "127.0.0.1:7390", "--proxy-read-timeout-ms", "0"], "--proxy-read-timeout-ms: must be at least 1"),
        ];
        for (args, message) in cases {
            let e = parsed(args).expect_err("refused");
            assert_eq!(format!("{e:#}"), *message, "{args:?}");
        }
    }
}
