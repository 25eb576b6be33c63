//! The daemon's answers to bad bodies and wrong routes: the documented codes and fields,
//! 415 for a form, and which socket serves a route.

use super::*;

/// `tally serve` on an agent and an operator socket in `dir` (a new ledger under `policy`).
fn serve(dir: &Path, policy: &str) -> Daemon {
    tally().init(dir, policy);
    tally().serve(dir, &[])
}

/// One HTTP/1.1 request on a Unix socket: the status and the body as JSON (`Null` if
/// it is not JSON).
fn http(
    socket: &Path,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> (u16, Value) {
    use std::io::Read;
    let mut s = std::os::unix::net::UnixStream::connect(socket).expect("connect");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: tally\r\nConnection: close\r\n");
    if let Some(t) = content_type {
        head += &format!("Content-Type: {t}\r\n");
    }
    head += &format!("Content-Length: {}\r\n\r\n{body}", body.len());
    // A refusal before the body (415) may close the connection before it is all read.
    let _ = s.write_all(head.as_bytes());
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let status = reply[9..12].parse().expect("a status line");
    let body = reply.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn post(socket: &Path, path: &str, body: &str) -> (u16, Value) {
    http(socket, "POST", path, Some("application/json"), body)
}

/// `(status, code, field)` of an error reply.
fn error(reply: (u16, Value)) -> (u16, String, String) {
    let (status, body) = reply;
    let e = &body["error"];
    (
        status,
        e["code"].as_str().unwrap_or("-").to_string(),
        e["field"].as_str().unwrap_or("-").to_string(),
    )
}

fn triple(status: u16, code: &str, field: &str) -> (u16, String, String) {
    (status, code.to_string(), field.to_string())
}

/// The gate's endpoints answer the codes DAEMON.md promises, with the field at fault: a
/// wrong type, an unknown field, a bad name and a missing field are not `invalid_json`.
#[test]
fn gate_bodies_are_refused_with_the_documented_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let serve = serve(tmp.path(), "");
    let s = &serve.agent_socket();
    assert_eq!(post(s, "/v1/runs", r#"{"run":"r1"}"#).0, 201);
    let cases: &[(&str, &str, (u16, &str, &str))] = &[
        (
            "/v1/runs",
            r#"{"run":"r2","budget":{"attempts":"5"}}"#,
            (400, "invalid_type", "budget.attempts"),
        ),
        (
            "/v1/runs",
            r#"{"run":"r2","colour":"red"}"#,
            (400, "unknown_field", "colour"),
        ),
        (
            "/v1/runs",
            r#"{"goal":"no name"}"#,
            (400, "missing_field", "run"),
        ),
        ("/v1/runs", r#"{"run":""}"#, (400, "invalid_value", "run")),
        (
            "/v1/runs",
            r#"{"run":"r2","budget":[5]}"#,
            (400, "invalid_type", "budget"),
        ),
        ("/v1/runs", r#"["r2"]"#, (400, "invalid_type", "-")),
        ("/v1/runs", r#"{"run":"r2"} {}"#, (400, "invalid_json", "-")),
        (
            "/v1/check",
            r#"{"run":"r1","tool":"t","effect":"sideways"}"#,
            (400, "invalid_value", "effect"),
        ),
        (
            "/v1/check",
            r#"{"run":"r1","tool":5,"effect":"read"}"#,
            (400, "invalid_type", "tool"),
        ),
        (
            "/v1/check",
            r#"{"run":"r1","tool":"t","effect":"read","attempt":1}"#,
            (400, "unknown_field", "attempt"),
        ),
        (
            "/v1/check",
            r#"{"run":"r1","effect":"read"}"#,
            (400, "missing_field", "tool"),
        ),
        (
            "/v1/check",
            r#"{"run":"","tool":"t","effect":"read"}"#,
            (400, "invalid_value", "run"),
        ),
        (
            "/v1/outcome",
            r#"{"run":"r1","attempt":1,"status":"meh"}"#,
            (400, "invalid_value", "status"),
        ),
        (
            "/v1/outcome",
            r#"{"run":"r1","attempt":"1","status":"ok"}"#,
            (400, "invalid_type", "attempt"),
        ),
        (
            "/v1/runs/r1/stop",
            r#"{"reason":"bored"}"#,
            (400, "invalid_value", "reason"),
        ),
    ];
    let mut wrong = Vec::new();
    for (path, body, (status, code, field)) in cases {
        let got = error(post(s, path, body));
        if got != triple(*status, code, field) {
            wrong.push(format!("{path} {body}: {got:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The message says what: not "missing" for a name that is there but empty.
    let (_, body) = post(s, "/v1/runs", r#"{"run":""}"#);
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        !message.contains("missing") && message.contains("empty"),
        "{message}"
    );
}

/// A gate body that is not JSON by its content type (`curl -d` sends a form) is `415`,
/// as DAEMON.md says, and changes nothing.
#[test]
fn a_form_encoded_gate_body_is_415() {
    let tmp = tempfile::tempdir().unwrap();
    let serve = serve(tmp.path(), "");
    let s = &serve.agent_socket();
    for (path, body) in [
        ("/v1/runs", r#"{"run":"r3"}"#),
        ("/v1/check", r#"{"run":"r3","tool":"t","effect":"read"}"#),
        ("/v1/outcome", r#"{"run":"r3","attempt":1,"status":"ok"}"#),
        ("/v1/runs/r3/stop", r#"{}"#),
    ] {
        let got = error(http(
            s,
            "POST",
            path,
            Some("application/x-www-form-urlencoded"),
            body,
        ));
        assert_eq!(got, triple(415, "unsupported_media_type", "-"), "{path}");
    }
    // Nothing was started.
    assert_eq!(
        error(http(s, "GET", "/v1/runs/r3", None, "")).1,
        "run_not_found"
    );
    // No content type at all is JSON, as for raw decisions.
    assert_eq!(http(s, "POST", "/v1/runs", None, r#"{"run":"r3"}"#).0, 201);
}

/// The operator's routes on the agent socket say whose they are and where they are, not
/// "no route"; and the agents' routes on the operator socket likewise.
#[test]
fn routes_on_the_wrong_socket_say_which_socket_serves_them() {
    let tmp = tempfile::tempdir().unwrap();
    let serve = serve(tmp.path(), "");
    assert_eq!(
        post(&serve.agent_socket(), "/v1/runs", r#"{"run":"r1"}"#).0,
        201
    );
    for (method, path) in [
        ("POST", "/v1/runs/r1/pause"),
        ("POST", "/v1/runs/r1/resume"),
        ("POST", "/v1/runs/r1/kill"),
        ("POST", "/v1/approvals"),
        ("GET", "/v1/export"),
    ] {
        let (status, body) = http(
            &serve.agent_socket(),
            method,
            path,
            Some("application/json"),
            "{}",
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (403, Some("not_authorized")),
            "{method} {path}: {body}"
        );
        assert!(
            message.contains("operator socket") && !message.contains("no route"),
            "{method} {path}: {message}"
        );
    }
    for (method, path) in [
        ("POST", "/v1/check"),
        ("POST", "/v1/outcome"),
        ("POST", "/v1/runs/r1/stop"),
    ] {
        let (status, body) = http(
            &serve.operator_socket(),
            method,
            path,
            Some("application/json"),
            "{}",
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(status, 404, "{method} {path}: {body}");
        assert!(
            message.contains("agent socket") && !message.contains("no route"),
            "{method} {path}: {message}"
        );
    }
    // The run was not paused or killed.
    let (_, standing) = http(&serve.agent_socket(), "GET", "/v1/runs/r1", None, "");
    assert_eq!(standing["state"], "running", "{standing}");
}
