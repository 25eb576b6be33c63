//! Remote servers over `https://` behind the gateway: the SDK's test server behind TLS
//! with a certificate from a test CA the policy's `ca_file` names is reached, gated and
//! recorded, and its credential arrives; one whose certificate a CA the gateway does not
//! trust issued is refused: unreachable, no call reaches it.

use tally_testkit::tls::TestPki;

use super::*;

impl Remote {
    /// The test server on Streamable HTTP over TLS (`https://127.0.0.1:PORT/mcp`) with
    /// the certificate and key of `pki`, its calls appended to `calls` and the value of
    /// each call's `X-Api-Key` header to `headers`.
    fn start_https(pki: &tally_testkit::tls::PkiFiles, calls: &str, headers: &str) -> Remote {
        let port = free_port();
        let child = Command::new("python3")
            .arg(server_py())
            .arg("--https")
            .arg(port.to_string())
            .arg(&pki.cert)
            .arg(&pki.key)
            .env("TALLY_MCP_TEST_CALLS", calls)
            .env("TALLY_MCP_TEST_ARGS", "1")
            .env("TALLY_MCP_TEST_HEADER", format!("X-Api-Key={headers}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 server.py --https");
        wait_port(port);
        Remote { child, port }
    }
}

/// The text of a call's answer (and whether it is an error result), or its JSON-RPC
/// error's message (`true`).
pub(super) fn text_of(a: &Answer, id: u64) -> (bool, String) {
    let m = a
        .answer_to(id)
        .unwrap_or_else(|| panic!("no answer to {id}: {} {}", a.status, a.body));
    if let Some(message) = m["error"]["message"].as_str() {
        return (true, message.to_owned());
    }
    (
        m["result"]["isError"] == json!(true),
        m["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

#[test]
fn an_https_server_is_reached_with_its_ca_file_and_one_of_an_unknown_ca_is_refused() {
    if !sdk_available() {
        return;
    }
    let certs = tempfile::tempdir().expect("tempdir");
    let path = |n: &str| p(certs.path(), n);
    let trusted = TestPki::new().write(certs.path(), "trusted");
    let unknown = TestPki::new().write(certs.path(), "unknown");
    let secure = Remote::start_https(
        &trusted,
        &path("secure-calls.txt"),
        &path("secure-headers.txt"),
    );
    let stranger = Remote::start_https(
        &unknown,
        &path("stranger-calls.txt"),
        &path("stranger-headers.txt"),
    );
    let credential = "secret-of-the-secure-server";
    std::fs::write(path("secure.key"), format!("{credential}\n")).expect("credential");
    std::fs::write(path("stranger.key"), "secret-of-the-stranger\n").expect("credential");
    // Both trust the test CA only (and the Mozilla roots): the stranger's certificate
    // was issued by another.
    let ca = trusted.ca.display();
    let gw = Gateway::start(&format!(
        "[mcp.secure]\nurl = \"https://127.0.0.1:{}/mcp\"\nca_file = \"{ca}\"\nheader = \"X-Api-Key\"\ncredential_file = \"{}\"\n\n\
         [mcp.stranger]\nurl = \"https://localhost:{}/mcp\"\nca_file = \"{ca}\"\nheader = \"X-Api-Key\"\ncredential_file = \"{}\"\n",
        secure.port,
        path("secure.key"),
        stranger.port,
        path("stranger.key"),
    ));
    let token = gw.run("tls");
    let s = RawSession::open(gw.addr, &token);
    let list = s.post(br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    let tools = list.answer_to(2).expect("the list").to_string();
    for t in [
        "secure__lookup",
        "secure__send",
        "local__lookup",
        "remote__lookup",
    ] {
        assert!(tools.contains(t), "{t} in {tools}");
    }
    assert!(!tools.contains("stranger__"), "{tools}");

    let a = s.post(call(3, "secure__lookup", json!({"key": "k"})).as_bytes());
    assert_eq!(text_of(&a, 3), (false, "value of k".to_owned()));
    let a = s.post(call(4, "secure__send", json!({"to": "bob"})).as_bytes());
    assert_eq!(text_of(&a, 4), (false, "sent to bob".to_owned()));
    // The server of an unknown CA: the TLS handshake fails, nothing is sent; the
    // gateway says why (BadSignature: both test CAs bear one name, so the trusted one is
    // tried and its signature does not match).
    let a = s.post(call(5, "stranger__lookup", json!({"key": "k"})).as_bytes());
    let (is_error, why) = text_of(&a, 5);
    assert!(
        is_error
            && why.contains("did not list its tools")
            && why.contains("invalid peer certificate"),
        "{why}"
    );
    assert!(
        gw.read("serve.log")
            .contains("server stranger did not list its tools"),
        "{}",
        gw.read("serve.log")
    );

    let read = |n: &str| std::fs::read_to_string(path(n)).unwrap_or_default();
    assert_eq!(read("secure-calls.txt"), "lookup\nsend bob\n");
    // The credential arrived with each call, whole.
    assert_eq!(
        read("secure-headers.txt"),
        format!("{credential}\n{credential}\n")
    );
    assert_eq!(read("stranger-calls.txt"), "");
    assert_eq!(read("stranger-headers.txt"), "");

    let ds = gw.gate.finish("tls");
    let effects = allowed_effects(&ds);
    assert_eq!(
        effects,
        vec![
            ("secure/lookup".into(), Effect::Read),
            ("secure/send".into(), Effect::NonIdempotentWrite),
        ]
    );
    let outcomes: Vec<Status> = ds
        .iter()
        .filter(|d| d.kind == Some(Kind::Outcome))
        .filter_map(|d| d.status)
        .collect();
    assert_eq!(outcomes, vec![Status::Ok, Status::Ok]);
}

/// A `ca_file` that holds no certificate stops `tally serve` at its start, naming the
/// server and the file.
#[test]
fn a_ca_file_without_a_certificate_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = p(dir.path(), "not-a-ca.pem");
    std::fs::write(&ca, "not a certificate\n").expect("write");
    tally().init(
        dir.path(),
        &format!("[mcp.secure]\nurl = \"https://127.0.0.1:1/mcp\"\nca_file = \"{ca}\"\n"),
    );
    let port = free_port();
    let out = output_within(
        {
            let mut c = tally().command();
            c.current_dir(dir.path())
                .args([
                    "serve",
                    "--ledger",
                    "ledger",
                    "--socket",
                    "agent.sock",
                    "--operator-socket",
                    "operator.sock",
                    "--policy",
                    "policy.toml",
                    "--mcp-listen",
                    &format!("127.0.0.1:{port}"),
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c
        },
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("[mcp.secure]") && err.contains(&ca) && err.contains("no PEM certificate"),
        "{err}"
    );
}
