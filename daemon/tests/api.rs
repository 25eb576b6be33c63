//! Endpoints, typed errors for bad requests, limits.

use std::time::Duration;

use axum::http::{Method, StatusCode};
use bytes::Bytes;
use tally_api::client::{receipts, ClientError};
use tally_api::wire::{ErrorReply, Health};
use tally_ledger::export::ExportReader;
use tally_ledger::format::Frame;
use tally_ledger::Checkpoint;

use crate::common::{allow, checkpoint_text, get, raw, read_until_closed, walk, Daemon};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checkpoint_and_ungoverned_runs() {
    let mut daemon = Daemon::start(|_| {}).await;
    let mut c = daemon.client().await;
    let health: Health =
        serde_json::from_slice(&get(&mut c, "/v1/health").await.body).expect("health json");
    assert_eq!(
        (health.status.as_str(), health.size, health.epoch),
        ("ok", 1, 0)
    );

    let start = c
        .append(r#"{"run":"r1","kind":"start","goal":"export","budget":{"attempts":3,"spend_cents":100}}"#)
        .await
        .expect("start");
    assert_eq!(start[0].seq, 1);
    let batch = [
        r#"{"run":"r1","kind":"allow","tool":"t","attempt":1,"reserve_cents":30}"#,
        r#"{"run":"r1","kind":"outcome","attempt":1,"status":"error","settled_cents":5}"#,
        r#"{"run":"r1","kind":"allow","tool":"t","attempt":2,"reserve_cents":30}"#,
        r#"{"run":"r1","kind":"refund","of":2,"cents":30}"#,
        r#"{"run":"other","kind":"start"}"#,
        r#"{"run":"r1","kind":"stop","reason":"attempts_exhausted","at_ms":77}"#,
    ]
    .join("\n");
    let got = c.append_ndjson(batch).await.expect("batch");
    assert_eq!(
        got.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![2, 3, 4, 5, 6, 7]
    );

    // Raw decisions make no gate state: the gate governs only runs it started.
    let raw_run = get(&mut c, "/v1/runs/r1").await;
    assert_eq!(raw_run.status, StatusCode::NOT_FOUND);
    let missing = get(&mut c, "/v1/runs/nobody-ran-this").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let e: ErrorReply = serde_json::from_slice(&missing.body).expect("typed error");
    assert_eq!(e.error.code, "run_not_found");
    // A run name that is not UTF-8 once percent-decoded: the typed error form too.
    let bad = get(&mut c, "/v1/runs/r%FF").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let e: ErrorReply = serde_json::from_slice(&bad.body).expect("typed error");
    assert_eq!(e.error.code, "invalid_run");

    let reply = get(&mut c, "/v1/checkpoint").await;
    assert!(reply
        .content_type
        .as_deref()
        .is_some_and(|t| t.starts_with("text/plain")));
    let cp = Checkpoint::from_text(&reply.body).expect("checkpoint text");
    assert_eq!((cp.size, cp.head), (8, got[5].hash));
    let health: Health =
        serde_json::from_slice(&get(&mut c, "/v1/health").await.body).expect("health json");
    assert_eq!(health.size, 8);

    drop(c);
    daemon.shutdown().await.expect("clean shutdown");
    let chain = walk(&daemon.ledger_dir, &daemon.auditor);
    chain.assert_holds(&start);
    chain.assert_holds(&got);
    assert_eq!(chain.checkpoint, cp);
}

struct Case {
    name: &'static str,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
    field: Option<&'static str>,
    line: Option<usize>,
}

fn case(
    name: &'static str,
    body: &str,
    status: u16,
    code: &'static str,
    field: Option<&'static str>,
) -> Case {
    Case {
        name,
        content_type: Some("application/json"),
        body: body.as_bytes().to_vec(),
        status,
        code,
        field,
        line: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_typed_errors_and_change_nothing() {
    let mut daemon = Daemon::start(|o| {
        o.limits.max_body_bytes = 8 * 1024;
        o.limits.max_batch = 5;
    })
    .await;
    let mut c = daemon.client().await;
    let before = checkpoint_text(&mut c).await;
    let long_run = "r".repeat(2000);
    let too_long = format!(r#"{{"run":"{long_run}","kind":"start"}}"#);
    let oversized = format!(
        r#"{{"run":"r","kind":"start","goal":"{}"}}"#,
        "g".repeat(9000)
    );
    let ndjson_bad_third = [
        allow("a", "w", 1),
        allow("a", "w", 2),
        r#"{"run":"a","kind":"deny","tool":"t"}"#.to_string(),
        allow("a", "w", 3),
    ]
    .join("\n");
    let mut cases = vec![
        case(
            "malformed JSON",
            r#"{"run": "r", "kind": "#,
            400,
            "invalid_json",
            None,
        ),
        case("not an object", r#"[1,2]"#, 400, "invalid_type", None),
        case(
            "unknown field",
            r#"{"run":"r","kind":"start","colour":"red"}"#,
            400,
            "unknown_field",
            Some("colour"),
        ),
        case(
            "unknown nested field",
            r#"{"run":"r","kind":"start","budget":{"atempts":3}}"#,
            400,
            "unknown_field",
            Some("budget.atempts"),
        ),
        case(
            "wrong type",
            r#"{"run":"r","kind":"allow","at_ms":"soon"}"#,
            400,
            "invalid_type",
            Some("at_ms"),
        ),
        case(
            "wrong nested type",
            r#"{"run":"r","kind":"start","budget":{"attempts":-1}}"#,
            400,
            "invalid_value",
            Some("budget.attempts"),
        ),
        case(
            "unknown kind",
            r#"{"run":"r","kind":"rewind"}"#,
            400,
            "invalid_value",
            Some("kind"),
        ),
        case(
            "unknown reason",
            r#"{"run":"r","kind":"deny","reason":"because"}"#,
            400,
            "invalid_value",
            Some("reason"),
        ),
        case(
            "missing run",
            r#"{"kind":"start"}"#,
            400,
            "missing_field",
            Some("run"),
        ),
        case(
            "deny without reason",
            r#"{"run":"r","kind":"deny","tool":"t"}"#,
            400,
            "missing_field",
            Some("reason"),
        ),
        case(
            "a state version from the writer (the gate's alone: it orders a fleet's ledgers)",
            r#"{"run":"r","kind":"allow","tool":"t","state_version":7}"#,
            400,
            "field_not_allowed",
            Some("state_version"),
        ),
        case(
            "field on the wrong kind",
            r#"{"run":"r","kind":"allow","goal":"g"}"#,
            400,
            "field_not_allowed",
            Some("goal"),
        ),
        case(
            "text over its bound",
            &too_long,
            400,
            "field_too_long",
            Some("run"),
        ),
        case(
            "bad digest",
            r#"{"run":"r","kind":"allow","args_digest":"XYZ"}"#,
            400,
            "invalid_field",
            Some("args_digest"),
        ),
        case(
            "trailing garbage",
            r#"{"run":"r","kind":"start"} }"#,
            400,
            "invalid_json",
            None,
        ),
        case("empty body", "", 400, "empty_body", None),
        case("oversized body", &oversized, 413, "body_too_large", None),
        Case {
            name: "bad third line of a batch",
            content_type: Some("application/x-ndjson"),
            body: ndjson_bad_third.into_bytes(),
            status: 400,
            code: "missing_field",
            field: Some("reason"),
            line: Some(3),
        },
        Case {
            name: "unparsable line of a batch",
            content_type: Some("application/x-ndjson"),
            body: format!(
                "{}\n{{\"run\":\"a\",\"kind\":\"allow\",\"oops\":1}}\n",
                allow("a", "w", 1)
            )
            .into_bytes(),
            status: 400,
            code: "unknown_field",
            field: Some("oops"),
            line: Some(2),
        },
        Case {
            name: "batch over max_batch",
            content_type: Some("application/x-ndjson"),
            body: (0..6)
                .map(|i| allow("a", "w", i))
                .collect::<Vec<_>>()
                .join("\n")
                .into_bytes(),
            status: 413,
            code: "batch_too_large",
            field: None,
            line: Some(6),
        },
        Case {
            name: "not UTF-8",
            content_type: Some("application/json"),
            body: b"{\"run\":\"\xff\xfe\",\"kind\":\"start\"}".to_vec(),
            status: 400,
            code: "not_utf8",
            field: None,
            line: Some(1),
        },
        Case {
            name: "form content type",
            content_type: Some("application/x-www-form-urlencoded"),
            body: br#"{"run":"r","kind":"start"}"#.to_vec(),
            status: 415,
            code: "unsupported_media_type",
            field: None,
            line: None,
        },
    ];
    for case in cases.drain(..) {
        // Errors that leave a body unread close the connection: use a fresh one each time.
        let mut c = daemon.client().await;
        let reply = c
            .request(
                Method::POST,
                "/v1/decisions",
                case.content_type,
                Bytes::from(case.body),
            )
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(
            reply.status.as_u16(),
            case.status,
            "{}: {:?}",
            case.name,
            reply.body
        );
        match receipts(reply) {
            Err(ClientError::Refused { error, .. }) => {
                assert_eq!(error.code, case.code, "{}: {}", case.name, error.message);
                assert_eq!(
                    error.field.as_deref(),
                    case.field,
                    "{}: {}",
                    case.name,
                    error.message
                );
                if case.line.is_some() {
                    assert_eq!(error.line, case.line, "{}: {}", case.name, error.message);
                }
            }
            other => panic!("{}: expected a typed refusal, got {other:?}", case.name),
        }
        let mut fresh = daemon.client().await;
        assert_eq!(
            checkpoint_text(&mut fresh).await,
            before,
            "{} changed the ledger",
            case.name
        );
    }

    // A body over the limit sent without Content-Length is cut off while streaming.
    let chunk = format!("{:x}\r\n{}\r\n", 9000, "x".repeat(9000));
    let request = format!("POST /v1/decisions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{chunk}0\r\n\r\n");
    let (reply, _) = raw(&daemon.socket, request.as_bytes(), Duration::from_secs(5)).await;
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(reply.contains("\"body_too_large\""), "{reply}");

    // Routes that would change history do not exist.
    for (method, path, status, code) in [
        (Method::DELETE, "/v1/decisions", 405, "method_not_allowed"),
        (Method::PUT, "/v1/decisions", 405, "method_not_allowed"),
        (Method::GET, "/v1/decisions", 405, "method_not_allowed"),
        (Method::POST, "/v1/checkpoint", 405, "method_not_allowed"),
        (Method::DELETE, "/v1/runs/r", 405, "method_not_allowed"),
        (Method::POST, "/v1/rewind", 404, "not_found"),
    ] {
        let mut c = daemon.client().await;
        let reply = c
            .request(method.clone(), path, None, Bytes::new())
            .await
            .expect("request");
        assert_eq!(reply.status.as_u16(), status, "{method} {path}");
        let e: ErrorReply = serde_json::from_slice(&reply.body).expect("typed error");
        assert_eq!(e.error.code, code, "{method} {path}");
    }

    let mut c = daemon.client().await;
    assert_eq!(
        checkpoint_text(&mut c).await,
        before,
        "refusals changed the ledger"
    );
    // No gap: the next good decision is seq 1.
    let ok = c.append(&allow("r", "w", 1)).await.expect("good append");
    assert_eq!(ok[0].seq, 1);
    drop(c);
    daemon.shutdown().await.expect("clean shutdown");
    let chain = walk(&daemon.ledger_dir, &daemon.auditor);
    assert_eq!(chain.entries.len(), 2);
    chain.assert_holds(&ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_time_out_without_starving_others() {
    let mut daemon = Daemon::start(|o| o.limits.read_timeout = Duration::from_millis(300)).await;
    let mut c = daemon.client().await;
    let before = checkpoint_text(&mut c).await;

    // Slow body: headers promise 100 bytes, 10 arrive.
    let mut slow_body = tokio::net::UnixStream::connect(&daemon.socket)
        .await
        .expect("connect");
    tokio::io::AsyncWriteExt::write_all(
        &mut slow_body,
        b"POST /v1/decisions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"run\":\"r\"",
    )
    .await
    .expect("write");
    // Slow headers: the request line and half the headers, then nothing.
    let mut slow_head = tokio::net::UnixStream::connect(&daemon.socket)
        .await
        .expect("connect");
    tokio::io::AsyncWriteExt::write_all(
        &mut slow_head,
        b"POST /v1/decisions HTTP/1.1\r\nHost: x\r\n",
    )
    .await
    .expect("write");

    // Others are served meanwhile.
    let ok = c
        .append(&allow("fast", "w", 1))
        .await
        .expect("append while slow clients hang");
    assert_eq!(ok[0].seq, 1);

    let (reply, closed) = read_until_closed(&mut slow_body, Duration::from_secs(3)).await;
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("\"request_timeout\""), "{reply}");
    assert!(closed, "slow body connection is closed");
    let (reply, closed) = read_until_closed(&mut slow_head, Duration::from_secs(3)).await;
    assert!(
        closed,
        "slow header connection is closed within the timeout"
    );
    assert!(!reply.contains("200 OK"), "{reply}");

    // `c` sat idle longer than the read timeout, so the daemon closed it: reconnect.
    let mut c = daemon.client().await;
    let after = checkpoint_text(&mut c).await;
    assert_ne!(after, before);
    assert_eq!(
        Checkpoint::from_text(after.as_bytes())
            .expect("checkpoint")
            .size,
        2,
        "only the fast append landed"
    );
    drop(c);
    daemon.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_refuses_with_retry_after_and_writes_nothing() {
    let clock = std::sync::Arc::new(tally_ledger::clock::ManualClock::new(1_700_000_000_000));
    let moved = std::sync::Arc::clone(&clock) as std::sync::Arc<dyn tally_ledger::clock::Clock>;
    let mut daemon = Daemon::start(|o| {
        o.limits.rate_per_sec = Some(5);
        o.clock = moved;
    })
    .await;
    let mut accepted = Vec::new();
    let mut refused = None;
    for i in 0..20 {
        let mut c = daemon.client().await;
        let reply = c
            .request(
                Method::POST,
                "/v1/decisions",
                Some("application/json"),
                allow("r", "w", i),
            )
            .await
            .expect("request");
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(reply);
            break;
        }
        accepted.extend(receipts(reply).expect("accepted"));
    }
    let refused = refused.expect("the limit refuses within 20 quick requests");
    assert!(
        (5..=7).contains(&accepted.len()),
        "{} accepted before refusal",
        accepted.len()
    );
    let e: ErrorReply = serde_json::from_slice(&refused.body).expect("typed error");
    assert_eq!(e.error.code, "rate_limited");
    let mut c = daemon.client().await;
    let cp = Checkpoint::from_text(checkpoint_text(&mut c).await.as_bytes()).expect("checkpoint");
    assert_eq!(
        cp.size,
        1 + accepted.len() as u64,
        "the refused request wrote nothing"
    );
    // The refusal names when to come back, and then the client is let in.
    let reply = c
        .request(Method::GET, "/v1/health", None, Bytes::new())
        .await
        .expect("health");
    assert_eq!(reply.status, StatusCode::OK, "reads are not rate limited");
    clock.advance(1000);
    let mut c = daemon.client().await;
    let later = c
        .append(&allow("r", "w", 99))
        .await
        .expect("allowed after waiting");
    assert_eq!(later[0].seq, cp.size);
    drop(c);
    daemon.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_streams_a_consistent_snapshot_while_appends_go_on() {
    let mut daemon = Daemon::start(|_| {}).await;
    let mut c = daemon.client().await;
    let batch: Vec<String> = (0..200)
        .map(|i| allow(&format!("run-{}", i % 7), "w", i))
        .collect();
    c.append_ndjson(batch.join("\n")).await.expect("batch");
    let socket = daemon.socket.clone();
    let writer = tokio::spawn(async move {
        let mut c = tally_api::client::Client::unix(&socket)
            .await
            .expect("connect");
        for i in 0..50 {
            c.append(&allow("during-export", "w", i))
                .await
                .expect("append during export");
        }
    });
    let reply = get(&mut c, "/v1/export").await;
    assert_eq!(reply.status, StatusCode::OK);
    writer.await.expect("writer");
    let mut entries = 0u64;
    let mut last_cp = None;
    for frame in ExportReader::new(&reply.body[..]).expect("export magic") {
        match frame.expect("complete export, end marker present") {
            Frame::Entry(_) => entries += 1,
            Frame::Checkpoint(t) => last_cp = Some(Checkpoint::from_text(&t).expect("checkpoint")),
            Frame::Cosigned(_) => {}
        }
    }
    let cp = last_cp.expect("export holds a checkpoint");
    assert!(
        entries >= 201,
        "the export holds at least what was acknowledged before it"
    );
    assert_eq!(
        cp.size, entries,
        "the export ends at a checkpoint that seals all of it"
    );
    drop(c);
    daemon.shutdown().await.expect("clean shutdown");
    let chain = walk(&daemon.ledger_dir, &daemon.auditor);
    assert_eq!(chain.entries.len(), 251);
}
