//! What rmcp's Streamable HTTP service refuses of an `initialize` before it opens a
//! session, checked by the front before a key's run is started for it: the `Host`
//! header (a loopback name: rmcp's DNS-rebinding guard), the `Accept` header (both
//! `application/json` and `text/event-stream`), the `Content-Type` (`application/json`),
//! an `MCP-Protocol-Version` header (one the gateway speaks, and the one the params ask
//! for) and params rmcp reads as an `initialize`'s. A request these pass that rmcp still
//! refuses (a weight of 0 in `Accept`) opens no session: the front then gives back the
//! hold on the run it started (stopped if no other session is on it).
//!
//! Every POST body is read strictly first ([`read_body`]), and a request in a session
//! must name the session's negotiated version if it names one ([`session_version`]).

use hyper::header::{HeaderMap, ACCEPT, CONTENT_TYPE, HOST};
use hyper::StatusCode;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, ProtocolVersion};

/// MCP's protocol version header.
const PROTOCOL: &str = "mcp-protocol-version";

/// The hosts rmcp answers (its default `allowed_hosts`, any port): a DNS-rebinding
/// guard.
const HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Why an `initialize` is refused before anything starts: its status and what the
/// client reads.
pub(super) fn refusal(headers: &HeaderMap) -> Option<Refusal> {
    let host = headers
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| hyper::http::uri::Authority::try_from(v).ok())
        .map(|a| a.host().trim_matches(['[', ']']).to_ascii_lowercase());
    if !host.is_some_and(|h| HOSTS.contains(&h.as_str())) {
        return Some(Refusal {
            status: StatusCode::FORBIDDEN,
            code: -32600,
            why: format!("Forbidden: the Host header must name one of {HOSTS:?} (any port)"),
        });
    }
    let accepted = |wanted: &str| {
        headers
            .get_all(ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|entry| essence(entry).eq_ignore_ascii_case(wanted))
    };
    if !accepted("application/json") || !accepted("text/event-stream") {
        return Some(Refusal {
            status: StatusCode::NOT_ACCEPTABLE,
            code: -32600,
            why: "Not Acceptable: the client must accept both application/json and text/event-stream (Accept)".to_owned(),
        });
    }
    let json = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| essence(v).eq_ignore_ascii_case("application/json"));
    if !json {
        return Some(Refusal {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code: -32600,
            why: "Unsupported Media Type: Content-Type must be application/json".to_owned(),
        });
    }
    unsupported_version(headers)
}

/// An `MCP-Protocol-Version` header the gateway does not speak, refused (400) on every
/// request: one rmcp does not know, or one from which MCP has no `initialize` (rmcp
/// would answer it outside any session, past the session's bookkeeping).
pub(super) fn unsupported_version(headers: &HeaderMap) -> Option<Refusal> {
    let version = headers.get(PROTOCOL)?;
    let supported = || {
        ProtocolVersion::KNOWN_VERSIONS
            .iter()
            .filter(|k| k.has_initialize())
    };
    let known = version
        .to_str()
        .is_ok_and(|v| supported().any(|k| k.as_str() == v));
    (!known).then(|| {
        Refusal::bad(format!(
            "Bad Request: MCP-Protocol-Version is not one this gateway speaks ({})",
            supported()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}

/// The per-request protocol version of the revision without `initialize`.
const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";

/// A request refused before anything starts or reaches rmcp: its HTTP status, the
/// JSON-RPC error code, and what the client reads.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Refusal {
    pub(super) status: StatusCode,
    pub(super) code: i64,
    pub(super) why: String,
}

impl Refusal {
    /// A `400` with JSON-RPC's invalid-request code.
    fn bad(why: String) -> Refusal {
        Refusal {
            status: StatusCode::BAD_REQUEST,
            code: -32600,
            why,
        }
    }
}

/// Why a POST's body is not passed on, read before anything else.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Unread {
    /// Not one JSON value read strictly: the classifier's verdict is the answer (it
    /// refuses what the strict reader refuses, with the same reason as `tally mcp`).
    NotJson(crate::classify::Why),
    /// A message names its protocol version in `params._meta`.
    Versioned(Refusal),
}

/// A POST's body read strictly, as every conforming JSON parser reads it (member names
/// unescaped, no duplicate, nesting bounded): not passed on if it is not one JSON
/// value, or if any of its messages (each of a batch) names its protocol version in
/// `params._meta` (the revision without `initialize`: rmcp would serve it outside any
/// session; `400`). Read whatever the raw bytes hold: `\u002f` spells the same key.
pub(super) fn read_body(body: &[u8]) -> Result<serde_json::Value, Unread> {
    let value = crate::classify::strict_body(body).map_err(Unread::NotJson)?;
    let messages = match &value {
        serde_json::Value::Array(all) => all.iter().collect(),
        one => vec![one],
    };
    let versioned = messages.iter().any(|m| {
        m.get("params")
            .and_then(|p| p.get("_meta"))
            .and_then(|meta| meta.get(META_VERSION))
            .is_some()
    });
    if versioned {
        return Err(Unread::Versioned(Refusal::bad(format!("Bad Request: `{META_VERSION}` in params._meta names a protocol revision this gateway does not speak; open a session with initialize"))));
    }
    Ok(value)
}

/// An `initialize` the transport would still refuse once passed (after a key's run
/// started for it): params it cannot read, or an `MCP-Protocol-Version` header other
/// than the version its params ask for.
pub(super) fn initialize_refusal(headers: &HeaderMap, body: &serde_json::Value) -> Option<Refusal> {
    let unread = |e: String| Refusal {
        status: StatusCode::BAD_REQUEST,
        code: -32602,
        why: format!("Invalid params: the initialize cannot be read as MCP's ({e})"),
    };
    let asked = match serde_json::from_value::<ClientJsonRpcMessage>(body.clone()) {
        Ok(ClientJsonRpcMessage::Request(r)) => match r.request {
            ClientRequest::InitializeRequest(init) => init.params.protocol_version,
            _ => return Some(unread("its params are not an initialize's".to_owned())),
        },
        Ok(_) => return Some(unread("not a request".to_owned())),
        Err(e) => return Some(unread(e.to_string())),
    };
    let header = headers.get(PROTOCOL)?.to_str().unwrap_or_default();
    (header != asked.as_str()).then(|| {
        Refusal::bad(format!(
            "Bad Request: MCP-Protocol-Version ({header}) is not the version this initialize asks for ({asked})"
        ))
    })
}

/// A request in a session whose `MCP-Protocol-Version` header names a version other
/// than the one the session's `initialize` negotiated (none: MCP's default).
pub(super) fn session_version(headers: &HeaderMap, negotiated: Option<&str>) -> Option<Refusal> {
    let negotiated = negotiated?;
    let header = headers.get(PROTOCOL)?.to_str().unwrap_or_default();
    (header != negotiated).then(|| {
        Refusal::bad(format!(
            "Bad Request: MCP-Protocol-Version ({header}) is not the version this session negotiated ({negotiated})"
        ))
    })
}

/// A media type without its parameters.
fn essence(value: &str) -> &str {
    value.split(';').next().unwrap_or_default().trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().expect("a header value"));
        }
        h
    }

    #[test]
    fn what_rmcp_refuses_is_refused_first() {
        let ok = [
            ("host", "127.0.0.1:8080"),
            ("accept", "application/json, text/event-stream"),
            ("content-type", "application/json; charset=utf-8"),
        ];
        assert_eq!(refusal(&headers(&ok)), None);
        let only_json = [ok[0], ("accept", "application/json"), ok[2]];
        assert_eq!(
            refusal(&headers(&only_json)).map(|r| r.status),
            Some(StatusCode::NOT_ACCEPTABLE)
        );
        let text = [ok[0], ok[1], ("content-type", "text/plain")];
        assert_eq!(
            refusal(&headers(&text)).map(|r| r.status),
            Some(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        );
        let newer = [ok[0], ok[1], ok[2], ("mcp-protocol-version", "2099-01-01")];
        assert_eq!(
            refusal(&headers(&newer)).map(|r| r.status),
            Some(StatusCode::BAD_REQUEST)
        );
        let stateless = [ok[0], ok[1], ok[2], ("mcp-protocol-version", "2026-07-28")];
        assert_eq!(
            refusal(&headers(&stateless)).map(|r| r.status),
            Some(StatusCode::BAD_REQUEST),
            "a version without initialize would be served outside any session"
        );
        for host in ["evil.example", "127.0.0.1.evil.example:80"] {
            let elsewhere = [("host", host), ok[1], ok[2]];
            assert_eq!(
                refusal(&headers(&elsewhere)).map(|r| r.status),
                Some(StatusCode::FORBIDDEN)
            );
        }
        assert_eq!(
            refusal(&headers(&[("host", "[::1]:9"), ok[1], ok[2]])),
            None
        );
        let known = [ok[0], ok[1], ok[2], ("mcp-protocol-version", "2025-06-18")];
        assert_eq!(refusal(&headers(&known)), None);
    }

    #[test]
    fn a_protocol_version_in_meta_is_refused_however_its_key_is_spelled() {
        let refused = |body: &str| match read_body(body.as_bytes()) {
            Ok(_) => None,
            Err(Unread::Versioned(r)) => Some((r.status, r.code)),
            Err(Unread::NotJson(why)) => Some((StatusCode::BAD_REQUEST, why.rpc_code())),
        };
        let bad = Some((StatusCode::BAD_REQUEST, -32600));
        let call = |meta: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"a__b","_meta":{{{meta}:"2026-07-28"}}}}}}"#
            )
        };
        for key in [
            r#""io.modelcontextprotocol/protocolVersion""#,
            r#""io.modelcontextprotocol\u002fprotocolVersion""#,
            r#""io.modelcontextprotocol\/protocolVersion""#,
            r#""\u0069o.modelcontextprotocol/protocolVersion""#,
            r#""io.modelcontextprotocol\u002FprotocolVersion""#,
        ] {
            assert_eq!(refused(&call(key)), bad, "{key}");
        }
        let ping = r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;
        let escaped = call(r#""io.modelcontextprotocol\u002fprotocolVersion""#);
        assert_eq!(
            refused(&format!("[{ping},{escaped}]")),
            bad,
            "a batch's second"
        );
        assert_eq!(refused(ping), None);
        assert_eq!(
            refused(&format!("[{ping}]")),
            None,
            "a batch is the classifier's"
        );
        // Not JSON, not UTF-8, or a duplicate name (parsers disagree on which wins):
        // refused before anything reads it.
        let dup = r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"},"_meta":{}}}"#;
        for body in ["", "{", "not json", dup] {
            assert_eq!(
                refused(body).map(|r| r.0),
                Some(StatusCode::BAD_REQUEST),
                "{body:?}"
            );
        }
        assert!(matches!(
            read_body(b"{\"a\":\"\xff\"}"),
            Err(Unread::NotJson(crate::classify::Why::NotUtf8 { .. }))
        ));
    }

    #[test]
    fn an_initialize_whose_header_is_not_its_version_is_refused() {
        let init = |v: &str| -> serde_json::Value {
            serde_json::from_str(&format!(r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"{v}","capabilities":{{}},"clientInfo":{{"name":"t","version":"1"}}}}}}"#)).expect("json")
        };
        let h = headers(&[("mcp-protocol-version", "2025-06-18")]);
        assert_eq!(initialize_refusal(&h, &init("2025-06-18")), None);
        assert_eq!(
            initialize_refusal(&HeaderMap::new(), &init("2025-03-26")),
            None
        );
        let r = initialize_refusal(&h, &init("2025-03-26")).expect("refused");
        assert_eq!((r.status, r.code), (StatusCode::BAD_REQUEST, -32600));
        let unreadable: serde_json::Value =
            serde_json::from_str(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#)
                .expect("json");
        assert_eq!(
            initialize_refusal(&HeaderMap::new(), &unreadable).map(|r| r.code),
            Some(-32602)
        );
        assert_eq!(session_version(&h, Some("2025-06-18")), None);
        assert_eq!(session_version(&HeaderMap::new(), Some("2025-06-18")), None);
        assert_eq!(session_version(&h, None), None);
        assert!(session_version(&h, Some("2025-11-25")).is_some());
    }
}
