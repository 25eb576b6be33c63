//! Redirects from a remote server behind the gateway: one elsewhere (another port, or
//! plain `http://` from an `https://` server) is not followed, so the credential (here in
//! `X-Api-Key`, a header reqwest itself would carry across origins) never reaches the
//! other listener, and the call fails; a same-origin 308 is followed, the credential with
//! it.

use std::io::ErrorKind;

use tally_testkit::tls::{PkiFiles, TestPki};

use super::https::text_of;
use super::*;

impl Remote {
    /// The test server, on `https` with `pki`'s certificate or else plain HTTP, every
    /// request to /mcp answered 307 to `redirect` if given, the `X-Api-Key` of each call
    /// appended to `headers`.
    fn start_redirecting(pki: Option<&PkiFiles>, redirect: Option<&str>, headers: &str) -> Remote {
        let port = free_port();
        let mut c = Command::new("python3");
        c.arg(server_py());
        match pki {
            Some(pki) => c
                .arg("--https")
                .arg(port.to_string())
                .arg(&pki.cert)
                .arg(&pki.key),
            None => c.arg("--http").arg(port.to_string()),
        };
        if let Some(to) = redirect {
            c.env("TALLY_MCP_TEST_REDIRECT", to);
        }
        let child = c
            .env("TALLY_MCP_TEST_HEADER", format!("X-Api-Key={headers}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 server.py");
        wait_port(port);
        Remote { child, port }
    }
}

/// A listener nothing should reach: what arrived on it, if anything.
fn arrived(sink: &TcpListener) -> Option<String> {
    match sink.accept() {
        Ok((mut stream, _)) => {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = [0u8; 4096];
            let n = stream.read(&mut buf).unwrap_or(0);
            Some(String::from_utf8_lossy(&buf[..n]).into_owned())
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock => None,
        Err(e) => panic!("accept: {e}"),
    }
}

fn sink() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.set_nonblocking(true).expect("nonblocking");
    let port = l.local_addr().expect("addr").port();
    (l, port)
}

#[test]
fn a_redirect_elsewhere_is_not_followed_and_a_same_origin_308_is() {
    if !sdk_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |n: &str| p(dir.path(), n);
    let pki = TestPki::new().write(dir.path(), "down");
    let (port_sink, port_sink_port) = sink();
    let (plain_sink, plain_sink_port) = sink();
    // (a) to another port of the same host; (b) from https to plain http.
    let away = Remote::start_redirecting(
        None,
        Some(&format!("http://127.0.0.1:{port_sink_port}/mcp")),
        &path("away-headers.txt"),
    );
    let down = Remote::start_redirecting(
        Some(&pki),
        Some(&format!("http://127.0.0.1:{plain_sink_port}/mcp")),
        &path("down-headers.txt"),
    );
    let moved = Remote::start_redirecting(None, None, &path("moved-headers.txt"));
    let credential = "secret-kept-at-its-origin";
    std::fs::write(path("key"), format!("{credential}\n")).expect("credential");
    let key = path("key");
    let gw = Gateway::start(&format!(
        "[mcp.away]\nurl = \"http://127.0.0.1:{}/mcp\"\nheader = \"X-Api-Key\"\ncredential_file = \"{key}\"\n\n\
         [mcp.down]\nurl = \"https://127.0.0.1:{}/mcp\"\nca_file = \"{}\"\nheader = \"X-Api-Key\"\ncredential_file = \"{key}\"\n\n\
         [mcp.moved]\nurl = \"http://127.0.0.1:{}/moved\"\nheader = \"X-Api-Key\"\ncredential_file = \"{key}\"\n",
        away.port,
        down.port,
        pki.ca.display(),
        moved.port,
    ));
    let token = gw.run("redirects");
    let s = RawSession::open(gw.addr, &token);
    let list = s.post(br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    let tools = list.answer_to(2).expect("the list").to_string();
    assert!(tools.contains("moved__lookup"), "{tools}");
    assert!(
        !tools.contains("away__") && !tools.contains("down__"),
        "{tools}"
    );
    for (id, tool) in [(3, "away__lookup"), (4, "down__lookup")] {
        let a = s.post(call(id, tool, json!({"key": "k"})).as_bytes());
        let (is_error, why) = text_of(&a, id);
        assert!(
            is_error && why.contains("did not list its tools"),
            "{tool}: {why}"
        );
    }
    let a = s.post(call(5, "moved__lookup", json!({"key": "k"})).as_bytes());
    assert_eq!(text_of(&a, 5), (false, "value of k".to_owned()));

    // Nothing reached either other listener; the credential went with the followed 308.
    assert_eq!(arrived(&port_sink), None, "another port");
    assert_eq!(arrived(&plain_sink), None, "plain http");
    let read = |n: &str| std::fs::read_to_string(path(n)).unwrap_or_default();
    assert_eq!(read("moved-headers.txt"), format!("{credential}\n"));
    assert_eq!(read("away-headers.txt"), "");
    assert_eq!(read("down-headers.txt"), "");
}
