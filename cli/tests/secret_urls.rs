//! A URL's secret stays where the operator put it. An MCP server's and a proxy
//! upstream's URL may carry a secret in their path (a hosted MCP server's token) or
//! user info: the real `tally serve`, made to fail every way it can reach them (a
//! refused connection, a bad status echoing the path, a TLS handshake that fails) and
//! `tally policy check` and `tally serve` refusing policies that hold them, never repeat
//! the secret: not on standard error or output, not to the agent, not in the metrics,
//! not in any record of the ledger but the policy's own text (the file the operator
//! wrote, recorded as it is: docs/MCP.md and docs/PROXY.md say so). And a ledger recorded
//! under an earlier policy whose upstream is plain `http://` elsewhere still verifies.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use tally_testkit::Tally;

#[path = "common/ledger.rs"]
#[allow(dead_code)]
mod ledger;

fn tally() -> Tally {
    Tally::new(env!("CARGO_BIN_EXE_tally"))
}

/// The secret in the URLs' paths.
const PATH_SECRET: &str = "tok-path-5c81d0e7";
/// The secret in the URLs' user info.
const USER_SECRET: &str = "pw-user-93ab42f1";
/// The secret in the path of a URL given in a `url_file`: not in the policy, so in no
/// record at all.
const FILE_SECRET: &str = "tok-file-0d6e2a94";

/// `N` distinct loopback ports nothing listens on: all held bound until each is read, so
/// the system cannot give the same one twice (a port for a server that must stay closed,
/// one for the daemon's listener, ...).
fn free_ports<const N: usize>() -> [u16; N] {
    let held: [TcpListener; N] =
        std::array::from_fn(|_| TcpListener::bind("127.0.0.1:0").expect("bind"));
    held.map(|l| l.local_addr().expect("addr").port())
}

/// A plain HTTP server answering every request `status` (and any header lines after
/// it) with `body(request line)`, serving until the test ends.
fn answering(status: &'static str, body: fn(&str) -> String) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in l.incoming().flatten() {
            std::thread::spawn(move || answer(stream, status, body));
        }
    });
    port
}

fn answer(mut s: TcpStream, status: &str, body: fn(&str) -> String) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).map(|n| n == 1).unwrap_or(false) {
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    let line = text.lines().next().unwrap_or_default();
    let body = body(line);
    let _ = write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// One HTTP/1.0 request to `addr`: the status and the whole answer (head and body).
fn send(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut head = format!(
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).expect("write");
    s.write_all(body.as_bytes()).expect("write");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// Neither secret in `text` (what `what` is).
fn holds_no_secret(what: &str, text: &str) {
    for secret in [PATH_SECRET, USER_SECRET, FILE_SECRET] {
        assert!(!text.contains(secret), "{what} shows {secret}:\n{text}");
    }
}

/// The ports of the servers a test's MCP servers and upstreams are at.
struct Ports {
    /// Nothing listens.
    closed: u16,
    /// A 404 whose body repeats the request line.
    echo: u16,
    /// A 404 whose body is the request path's secret segment alone.
    segment: u16,
    /// A 404 whose body is the request line JSON-escaped (`\/t\/SECRET\/mcp`).
    escaped: u16,
    /// A 500.
    failing: u16,
}

/// The servers and upstreams, each reached where it fails: `refused` (nothing
/// listens), `missing` (a 404 whose body repeats the request's path), `segment` and
/// `escaped` (a 404 whose body says the path's secret alone, or JSON-escaped), `tls`
/// (`https://` to a server that speaks plain HTTP), and `hidden` at the URL in
/// `url_file` (nothing listens; a port of its own, so its refusal is told by it); the
/// upstream `filed` at the URL in `upstream_file` (`missing`'s server, echoing its path).
fn policy(ports: &Ports, url_file: &Path, upstream_files: [&Path; 2]) -> String {
    let Ports {
        closed,
        echo,
        segment,
        escaped,
        failing,
    } = *ports;
    let mut text = format!(
        "[ceiling]\nspend_cents = 100\n\n\
         [mcp.hidden]\nurl_file = {:?}\n\n\
         [mcp.refused]\nurl = \"http://127.0.0.1:{closed}/t/{PATH_SECRET}/mcp\"\n\n\
         [mcp.missing]\nurl = \"http://127.0.0.1:{echo}/t/{PATH_SECRET}/mcp\"\n\n\
         [mcp.segment]\nurl = \"http://127.0.0.1:{segment}/t/{PATH_SECRET}/mcp\"\n\n\
         [mcp.escaped]\nurl = \"http://127.0.0.1:{escaped}/t/{PATH_SECRET}/mcp\"\n\n\
         [mcp.tls]\nurl = \"https://127.0.0.1:{echo}/t/{PATH_SECRET}/mcp\"\n\n",
        url_file.display().to_string()
    );
    for (name, url) in [
        (
            "refused",
            format!("http://127.0.0.1:{closed}/t/{PATH_SECRET}"),
        ),
        (
            "failing",
            format!("http://127.0.0.1:{failing}/t/{PATH_SECRET}"),
        ),
        ("tls", format!("https://127.0.0.1:{echo}/t/{PATH_SECRET}")),
        ("filed", String::new()),
        ("moved", String::new()),
    ] {
        let url = match name {
            "filed" => format!("url_file = {:?}", upstream_files[0].display().to_string()),
            "moved" => format!("url_file = {:?}", upstream_files[1].display().to_string()),
            _ => format!("url = \"{url}\""),
        };
        text.push_str(&format!(
            "[upstreams.{name}]\n{url}\nkind = \"openai\"\ncredential = \"key\"\npaths = [\"/v1/chat/completions\"]\n\n\
             [prices.{name}.\"m\"]\ninput_per_mtok = 1\noutput_per_mtok = 1\nmax_output_tokens = 100\n\n"
        ));
    }
    text
}

/// The gateway's answers to one session's calls of each failing server's tool, and its
/// listing.
fn mcp_calls(gateway: SocketAddr, token: &str) -> Vec<(u16, String)> {
    let bearer = format!("Bearer {token}");
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let (status, opened) = send(gateway, "/mcp", &[("Authorization", &bearer)], init);
    assert_eq!(status, 200, "{opened}");
    let session = opened
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("mcp-session-id:")
                .then(|| l["mcp-session-id:".len()..].trim().to_owned())
        })
        .expect("a session");
    let headers = [
        ("Authorization", bearer.as_str()),
        ("Mcp-Session-Id", session.as_str()),
    ];
    let mut answers = vec![(status, opened)];
    answers.push(send(
        gateway,
        "/mcp",
        &headers,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    ));
    answers.push(send(
        gateway,
        "/mcp",
        &headers,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    ));
    for (id, server) in [
        (3, "refused"),
        (4, "missing"),
        (5, "tls"),
        (6, "hidden"),
        (7, "segment"),
        (8, "escaped"),
    ] {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": format!("{server}__lookup"), "arguments": {"q": "x"}}});
        answers.push(send(gateway, "/mcp", &headers, &call.to_string()));
    }
    answers
}

/// The proxy's answers to one call through each failing upstream.
fn proxy_calls(proxy: SocketAddr, token: &str) -> Vec<(u16, String)> {
    let bearer = format!("Bearer {token}");
    let body = r#"{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;
    ["refused", "failing", "tls", "filed", "moved"]
        .into_iter()
        .map(|up| {
            send(
                proxy,
                &format!("/{up}/v1/chat/completions"),
                &[("Authorization", &bearer)],
                body,
            )
        })
        .collect()
}

#[test]
fn a_secret_in_a_servers_or_upstreams_url_is_shown_nowhere() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Nothing at `closed` and `hidden`; the daemon's gateway and proxy listen on the others.
    let [closed, hidden, gateway, proxy] = free_ports();
    let ports = Ports {
        closed,
        echo: answering("404 Not Found", |line| format!("no route for {line}")),
        segment: answering("404 Not Found", |line| {
            let segment = line.split('/').nth(2).unwrap_or_default();
            format!("no such token: {segment}")
        }),
        escaped: answering("404 Not Found", |line| {
            format!(
                "{{\"error\":\"no route\",\"request\":{:?}}}",
                line.replace('/', "\\/")
            )
        }),
        failing: answering("500 Internal Server Error", |_| "upstream failed".into()),
    };
    let url_file = dir.path().join("hidden.url");
    std::fs::write(
        &url_file,
        format!("http://127.0.0.1:{hidden}/t/{FILE_SECRET}/mcp\n"),
    )
    .expect("url_file");
    // The upstream `filed`'s URL, its secret in the path, is in a file too.
    let upstream_file = dir.path().join("filed.url");
    std::fs::write(
        &upstream_file,
        format!("http://127.0.0.1:{}/t/{FILE_SECRET}\n", ports.echo),
    )
    .expect("upstream url_file");
    // The upstream `moved`'s too, at a server redirecting on its own host, the
    // `Location` echoing the secret path.
    let moved = answering(
        "302 Found\r\nLocation: /t/tok-file-0d6e2a94/v2/chat/completions",
        |_| "moved".into(),
    );
    let moved_file = dir.path().join("moved.url");
    std::fs::write(
        &moved_file,
        format!("http://127.0.0.1:{moved}/t/{FILE_SECRET}\n"),
    )
    .expect("upstream url_file");
    tally().init(
        dir.path(),
        &policy(&ports, &url_file, [&upstream_file, &moved_file]),
    );
    let key = dir.path().join("key.secret");
    std::fs::write(&key, "sk-upstream\n").expect("key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let (gateway, proxy) = (loopback(gateway), loopback(proxy));
    let (gw, px) = (gateway.to_string(), proxy.to_string());
    let mut serve = tally().serve(
        dir.path(),
        &[
            "--mcp-listen",
            &gw,
            "--proxy-listen",
            &px,
            "--proxy-socket",
            "proxy.sock",
            "--credential",
            "key=key.secret",
        ],
    );
    serve.wait_for_socket("proxy.sock");
    let (status, v) = serve.agent("POST", "/v1/runs", Some(json!({"run": "r"})));
    assert_eq!(status, 201, "{v}");
    let token = v["token"].as_str().expect("a token").to_owned();

    let mcp = mcp_calls(gateway, &token);
    let proxied = proxy_calls(proxy, &token);
    // `filed`'s upstream (its URL in a url_file) answered a 404 whose body repeats the
    // path it was sent: the agent gets the upstream's status in the dialect's own error,
    // not its body or headers; `moved`'s redirect on its own host, its `Location`
    // echoing the path, is refused as one off the host is.
    let (_, filed) = &proxied[3];
    let (_, body) = filed.split_once("\r\n\r\n").expect("a head");
    let body: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(body["error"]["code"], "upstream_error", "{body}");
    assert!(!filed.contains("no route for"), "{filed}");
    let (_, moved) = &proxied[4];
    assert!(
        moved.contains("scope_violation") && !moved.to_ascii_lowercase().contains("location:"),
        "{moved}"
    );
    for (status, answer) in mcp.iter().chain(&proxied) {
        holds_no_secret(&format!("an answer to the agent ({status})"), answer);
    }
    // Each failure happened, and where the clients' errors quote the URL it is shown
    // redacted.
    let said: String = mcp.iter().map(|(_, a)| a.as_str()).collect();
    assert!(
        said.contains(&format!("127.0.0.1:{closed}/…"))
            && said.contains(&format!("127.0.0.1:{hidden}/…")),
        "the refused servers' errors are not told: {said}"
    );
    assert!(said.contains("HTTP 404"), "the 404 is not told: {said}");
    // A server's error body is not passed on (it may say the token in any spelling).
    assert!(!said.contains("no such token"), "{said}");
    let statuses: Vec<u16> = proxied.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [502, 500, 502, 404, 403], "{proxied:?}");

    let (status, metrics) =
        tally_testkit::daemon::request(&serve.operator_socket(), "GET", "/metrics", None);
    assert_eq!(status, 200);
    let metrics = String::from_utf8_lossy(&metrics).into_owned();
    assert!(metrics.contains("tally_"), "{metrics}");
    holds_no_secret("the metrics", &metrics);

    let exited = serve.stop().expect("tally serve running");
    assert!(exited.success(), "{exited}: {}", serve.log());
    holds_no_secret("tally serve's standard error", &serve.log());
    holds_no_secret("tally serve's standard output", &serve.out());

    // Every record decrypted (the ledger verifies intact): the policy's own text holds
    // the URLs as written (not the one in `url_file`); nothing else does.
    let mut texts = 0;
    let (mut tools, mut ended) = (std::collections::BTreeMap::new(), vec![]);
    for mut d in ledger::decisions(dir.path()) {
        if let Some(text) = d.as_object_mut().and_then(|o| o.remove("policy_text")) {
            let text = text.as_str().unwrap_or_default();
            assert!(text.contains(PATH_SECRET) && !text.contains(FILE_SECRET));
            texts += 1;
        }
        holds_no_secret("a record of the ledger", &d.to_string());
        match (d["run"].as_str(), d["kind"].as_str()) {
            (Some("r"), Some("allow")) => {
                tools.insert(d["attempt"].as_u64(), d["tool"].to_string());
            }
            (Some("r"), Some("outcome")) => ended.push(d),
            _ => {}
        }
    }
    assert_eq!(texts, 1, "the policy is recorded once");
    // What was withheld from the agent is recorded as any answer is: `filed`'s 404 a
    // rejection, `moved`'s redirect refused as one off its host.
    let outcome_of = |tool: &str| {
        let of: Vec<&Value> = ended
            .iter()
            .filter(|d| tools.get(&d["attempt"].as_u64()) == Some(&format!("{tool:?}")))
            .collect();
        assert_eq!(of.len(), 1, "{tool}: {ended:?}");
        (of[0]["status"].clone(), of[0]["observed"].clone())
    };
    assert_eq!(outcome_of("filed"), (json!("rejected"), Value::Null));
    assert_eq!(
        outcome_of("moved"),
        (json!("rejected"), json!("redirect_refused:scope_violation"))
    );
    tally().verifies(dir.path());
}

/// Policies that cannot be put in force because of a URL (user info, plain `http://`
/// to a host that is not loopback, a query, no URL at all) are refused by `tally policy
/// check` and `tally serve` naming the key and its line, the URL shown redacted.
#[test]
fn a_policy_refused_for_its_url_does_not_repeat_its_secret() {
    let dir = tempfile::tempdir().expect("tempdir");
    tally().ledger(dir.path());
    let upstream = |url: &str| {
        format!("# upstreams\n\n[upstreams.gw]\nurl = \"{url}\"\nkind = \"openai\"\ncredential = \"key\"\n")
    };
    let server = |url: &str| format!("# servers\n\n[mcp.web]\nurl = \"{url}\"\n");
    for (policy, key) in [
        (
            upstream(&format!("https://admin:{USER_SECRET}@gw.example.com/v1")),
            "upstreams.gw.url",
        ),
        (
            upstream(&format!("https://{USER_SECRET}@gw.example.com")),
            "upstreams.gw.url",
        ),
        (
            upstream(&format!("http://10.0.0.7:8000/t/{PATH_SECRET}")),
            "upstreams.gw.url",
        ),
        (
            upstream(&format!("https://gw.example.com/t/{PATH_SECRET}?k=1")),
            "upstreams.gw.url",
        ),
        (
            upstream(&format!("gw.example.com/t/{PATH_SECRET}")),
            "upstreams.gw.url",
        ),
        (
            server(&format!("https://admin:{USER_SECRET}@mcp.example.com/mcp")),
            "mcp.web.url",
        ),
        (
            server(&format!("http://mcp.example.com/t/{PATH_SECRET}/mcp")),
            "mcp.web.url",
        ),
        (
            server(&format!("https://mcp.example.com/mcp?token={PATH_SECRET}")),
            "mcp.web.url",
        ),
        (
            server(&format!("ftp://mcp.example.com/t/{PATH_SECRET}")),
            "mcp.web.url",
        ),
    ] {
        std::fs::write(dir.path().join("policy.toml"), &policy).expect("policy");
        let checked = tally().run(dir.path(), &["policy", "check", "policy.toml"], "");
        let served = tally().run(
            dir.path(),
            &[
                "serve",
                "--ledger",
                "ledger",
                "--socket",
                "agent.sock",
                "--policy",
                "policy.toml",
            ],
            "",
        );
        for (what, out) in [("tally policy check", &checked), ("tally serve", &served)] {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{what} {policy}: {stderr}");
            assert!(
                stderr.contains(&format!("line 4: `{key}`")),
                "{what} {policy}: {stderr}"
            );
            holds_no_secret(&format!("{what}'s standard error"), &stderr);
            holds_no_secret(
                &format!("{what}'s standard output"),
                &String::from_utf8_lossy(&out.stdout),
            );
        }
    }
}

/// `tally policy check` prints a valid policy with each URL redacted.
#[test]
fn policy_check_prints_urls_redacted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = format!(
        "[upstreams.gw]\nurl = \"https://gw.example.com/t/{PATH_SECRET}\"\nkind = \"http\"\ncredential = \"key\"\n\n\
         [mcp.web]\nurl = \"https://mcp.example.com/t/{PATH_SECRET}/mcp\"\n"
    );
    std::fs::write(dir.path().join("policy.toml"), &policy).expect("policy");
    let out = tally().ok(dir.path(), &["policy", "check", "policy.toml"], "");
    assert!(out.contains("url = \"https://gw.example.com/…\""), "{out}");
    assert!(out.contains("url = \"https://mcp.example.com/…\""), "{out}");
    holds_no_secret("tally policy check's output", &out);
}

/// The records of a ledger holding `text` as its policy, and a run started under it.
fn recorded(text: &str) -> String {
    let digest = tally_record::decision::policy_digest(text);
    [
        json!({"kind": "policy", "policy": digest, "policy_text": text}),
        json!({"run": "r", "kind": "start", "at_ms": 0, "policy": digest, "budget": {
            "attempts": 10, "deadline_ms": 60000, "spend_nanos": 1_000_000_000_u64,
            "side_effects": 1, "polls": 1, "depth": 1}}),
    ]
    .iter()
    .map(|d| format!("{d}\n"))
    .collect()
}

/// A policy put in force whose MCP server's, or upstream's, URL has an `@` in its path
/// (a team's handle) is recorded as written, and its ledger verifies and replays clean.
#[test]
fn a_ledger_under_a_url_with_an_at_sign_in_its_path_verifies() {
    let text = "[mcp.x]\nurl = \"https://mcp.example/u/@me/mcp\"\n\n\
                [upstreams.gw]\nurl = \"https://gw.example/t/@team/v1\"\nkind = \"openai\"\ncredential = \"key\"\n\n\
                [prices.gw.\"m\"]\ninput_per_mtok = 1\noutput_per_mtok = 1\n";
    tally_policy::Policy::from_toml(text).expect("a policy put in force");
    let dir = tempfile::tempdir().expect("tempdir");
    tally().ledger(dir.path());
    tally().ok(
        dir.path(),
        &["append", "--ledger", "ledger"],
        &recorded(text),
    );
    let report: Value = tally().verifies(dir.path());
    assert_eq!(report["replay"]["findings"], json!([]), "{report}");
}

/// A ledger an earlier build wrote under a policy whose upstream is plain `http://` to
/// another host (such a policy is refused in force now) still verifies, and replays
/// clean; a policy record no build accepted is a finding, its URL shown redacted.
#[test]
fn a_ledger_recorded_under_a_plain_http_upstream_still_verifies() {
    let dir = tempfile::tempdir().expect("tempdir");
    tally().ledger(dir.path());
    let old = "[upstreams.gw]\nurl = \"http://10.0.0.7:8000/v1\"\nkind = \"openai\"\ncredential = \"key\"\n\n\
               [prices.gw.\"m\"]\ninput_per_mtok = 1\noutput_per_mtok = 1\n";
    assert!(tally_policy::Policy::from_toml(old).is_err());
    tally().ok(
        dir.path(),
        &["append", "--ledger", "ledger"],
        &recorded(old),
    );
    let report: Value = tally().verifies(dir.path());
    assert_eq!(report["replay"]["findings"], json!([]), "{report}");

    let broken = format!(
        "[upstreams.gw]\nurl = \"https://admin:{USER_SECRET}@gw.example.com\"\nkind = \"openai\"\ncredential = \"key\"\n"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    tally().ledger(dir.path());
    tally().ok(
        dir.path(),
        &["append", "--ledger", "ledger"],
        &recorded(&broken),
    );
    let (_, report) = tally().report(dir.path(), "verify", &[]);
    let findings = report["replay"]["findings"].to_string();
    assert!(findings.contains("upstreams.gw.url"), "{report}");
    holds_no_secret("tally verify's report", &report.to_string());
}

/// A server's `url_file`, and a proxy upstream's, is read by `tally serve` before it
/// says it started, as it will be read for the gateway or the proxy: a URL the gateway would refuse, a FIFO, a file that is not
/// there are each refused, naming the entry and the file, the URL redacted. `tally
/// policy check` refuses the URL too; a file it cannot read (a policy checked in CI,
/// away from its secrets) is a warning. A symbolic link (a Kubernetes secret volume's
/// key) is followed.
#[test]
fn a_url_file_is_checked_by_policy_check_and_before_serve_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    tally().ledger(dir.path());
    let key = dir.path().join("key.secret");
    std::fs::write(&key, "sk-upstream\n").expect("key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    // An MCP server's `url_file`, and a proxy upstream's, each read the same way.
    let entries: [(&str, &str, &[&str]); 2] = [
        (
            "[mcp.web]\nurl_file = \"web.url\"\n",
            "[mcp.web] url_file web.url",
            &["--mcp-listen", "127.0.0.1:0"],
        ),
        (
            "[upstreams.gw]\nurl_file = \"web.url\"\nkind = \"openai\"\ncredential = \"key\"\n",
            "[upstreams.gw] url_file web.url",
            &[
                "--proxy-listen",
                "127.0.0.1:0",
                "--credential",
                "key=key.secret",
            ],
        ),
    ];
    for (policy, named, flags) in entries {
        url_file_cases(dir.path(), policy, named, flags);
    }
    std::os::unix::fs::symlink(dir.path().join("good.url"), dir.path().join("web.url"))
        .expect("link");
    let out = tally().ok(dir.path(), &["policy", "check", "policy.toml"], "");
    holds_no_secret("tally policy check's output", &out);
}

/// Each way `web.url` may be wrong, under `policy` (whose entry's refusal says `named`),
/// `tally serve` run with `flags`.
fn url_file_cases(dir: &Path, policy: &str, named: &str, flags: &[&str]) {
    std::fs::write(dir.join("policy.toml"), policy).expect("policy");
    let _ = std::fs::remove_file(dir.join("fifo"));
    std::fs::write(
        dir.join("good.url"),
        format!("http://127.0.0.1:9/t/{FILE_SECRET}/mcp\n"),
    )
    .expect("good");
    /// How a case leaves `web.url` in the directory.
    type Setup = fn(&Path);
    // Each case: what it is, its setup, whether `tally policy check` refuses it.
    let setups: [(&str, Setup, bool); 3] = [
        (
            "plain http elsewhere",
            |d| {
                let url = format!("http://10.0.0.7/t/{FILE_SECRET}/mcp\n");
                std::fs::write(d.join("web.url"), url).expect("url")
            },
            true,
        ),
        (
            "a link to a FIFO",
            |d| {
                let fifo = std::process::Command::new("mkfifo")
                    .arg(d.join("fifo"))
                    .status()
                    .expect("mkfifo");
                assert!(fifo.success());
                std::os::unix::fs::symlink(d.join("fifo"), d.join("web.url")).expect("link")
            },
            false,
        ),
        ("no file", |_| {}, false),
    ];
    for (what, setup, check_refuses) in setups {
        let _ = std::fs::remove_file(dir.join("web.url"));
        let _ = std::fs::remove_file(dir.join("fifo"));
        setup(dir);
        let checked = tally().run(dir, &["policy", "check", "policy.toml"], "");
        // Port 0: the refusal comes before anything is served.
        let mut args = vec![
            "serve",
            "--ledger",
            "ledger",
            "--socket",
            "agent.sock",
            "--policy",
            "policy.toml",
        ];
        args.extend_from_slice(flags);
        let served = tally().run(dir, &args, "");
        for (cmd, out, refuses) in [
            ("tally policy check", &checked, check_refuses),
            ("tally serve", &served, true),
        ] {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(!out.status.success(), refuses, "{cmd}, {what}: {stderr}");
            assert!(stderr.contains(named), "{cmd}, {what}: {stderr}");
            if !refuses {
                assert!(stderr.contains("warning: "), "{cmd}, {what}: {stderr}");
            }
            assert!(!stderr.contains("listening on"), "{cmd}, {what}: {stderr}");
            holds_no_secret(&format!("{cmd}'s standard error"), &stderr);
        }
    }
}
