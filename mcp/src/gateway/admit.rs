//! What rmcp's Streamable HTTP service refuses of an `initialize` before it opens a
//! session, checked by the front before a key's run is started for it: the `Host`
//! header (a loopback name: rmcp's DNS-rebinding guard), the `Accept` header (both `application/json` and `text/event-stream`), the `Content-Type`
//! (`application/json`) and an `MCP-Protocol-Version` header (one the gateway speaks). A
//! request these pass that rmcp still refuses (a weight of 0 in `Accept`, a body over
//! its bound) opens no session: the front then stops a run it started.

use hyper::header::{HeaderMap, ACCEPT, CONTENT_TYPE, HOST};
use hyper::StatusCode;
use rmcp::model::ProtocolVersion;

/// MCP's protocol version header.
const PROTOCOL: &str = "mcp-protocol-version";

/// The hosts rmcp answers (its default `allowed_hosts`, any port): a DNS-rebinding
/// guard.
const HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Why an `initialize` is refused before anything starts: its status and what the
/// client reads.
pub(super) fn refusal(headers: &HeaderMap) -> Option<(StatusCode, String)> {
    let host = headers
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| hyper::http::uri::Authority::try_from(v).ok())
        .map(|a| a.host().trim_matches(['[', ']']).to_ascii_lowercase());
    if !host.is_some_and(|h| HOSTS.contains(&h.as_str())) {
        return Some((
            StatusCode::FORBIDDEN,
            format!("Forbidden: the Host header must name one of {HOSTS:?} (any port)"),
        ));
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
        return Some((
            StatusCode::NOT_ACCEPTABLE,
            "Not Acceptable: the client must accept both application/json and text/event-stream (Accept)".to_owned(),
        ));
    }
    let json = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| essence(v).eq_ignore_ascii_case("application/json"));
    if !json {
        return Some((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Unsupported Media Type: Content-Type must be application/json".to_owned(),
        ));
    }
    unsupported_version(headers)
}

/// An `MCP-Protocol-Version` header the gateway does not speak, refused (400) on every
/// request: one rmcp does not know, or one from which MCP has no `initialize` (rmcp
/// would answer it outside any session, past the session's bookkeeping).
pub(super) fn unsupported_version(headers: &HeaderMap) -> Option<(StatusCode, String)> {
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
        (
            StatusCode::BAD_REQUEST,
            format!(
                "Bad Request: MCP-Protocol-Version is not one this gateway speaks ({})",
                supported()
                    .map(|k| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })
}

/// The per-request protocol version of the revision without `initialize`.
const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";

/// A body whose request names its protocol version in `params._meta` (the revision
/// without `initialize`: rmcp would serve it outside any session), refused (400).
pub(super) fn versioned_body(body: &[u8]) -> Option<(StatusCode, String)> {
    let marker = META_VERSION.as_bytes();
    if !body.windows(marker.len()).any(|w| w == marker) {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let messages = match &value {
        serde_json::Value::Array(all) => all.iter().collect(),
        one => vec![one],
    };
    messages
        .iter()
        .any(|m| m["params"]["_meta"].get(META_VERSION).is_some())
        .then(|| {
            (
                StatusCode::BAD_REQUEST,
                format!("Bad Request: `{META_VERSION}` in params._meta names a protocol revision this gateway does not speak; open a session with initialize"),
            )
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
            refusal(&headers(&only_json)).map(|r| r.0),
            Some(StatusCode::NOT_ACCEPTABLE)
        );
        let text = [ok[0], ok[1], ("content-type", "text/plain")];
        assert_eq!(
            refusal(&headers(&text)).map(|r| r.0),
            Some(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        );
        let newer = [ok[0], ok[1], ok[2], ("mcp-protocol-version", "2099-01-01")];
        assert_eq!(
            refusal(&headers(&newer)).map(|r| r.0),
            Some(StatusCode::BAD_REQUEST)
        );
        let stateless = [ok[0], ok[1], ok[2], ("mcp-protocol-version", "2026-07-28")];
        assert_eq!(
            refusal(&headers(&stateless)).map(|r| r.0),
            Some(StatusCode::BAD_REQUEST),
            "a version without initialize would be served outside any session"
        );
        for host in ["evil.example", "127.0.0.1.evil.example:80"] {
            let elsewhere = [("host", host), ok[1], ok[2]];
            assert_eq!(
                refusal(&headers(&elsewhere)).map(|r| r.0),
                Some(StatusCode::FORBIDDEN)
            );
        }
        assert_eq!(
            refusal(&headers(&[("host", "[::1]:9"), ok[1], ok[2]])),
            None
        );
        let meta = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a__b","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        assert_eq!(
            versioned_body(meta).map(|r| r.0),
            Some(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            versioned_body(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            None
        );
        let known = [ok[0], ok[1], ok[2], ("mcp-protocol-version", "2025-06-18")];
        assert_eq!(refusal(&headers(&known)), None);
    }
}
