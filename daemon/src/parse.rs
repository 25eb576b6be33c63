//! Request bodies to decisions: one JSON object, or NDJSON (one object per line).
//!
//! Parsing is exactly [`Decision::from_json`] (unknown fields, trailing data and structs
//! written as arrays refused). Only when it refuses does the text go through
//! `serde_path_to_error`, to name the field path at fault.

use axum::http::StatusCode;
use tally_ledger::Decision;
use tally_wire::ErrorCode;

use crate::error::ApiError;

/// How the client framed the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    /// `application/json` or no content type: one object, or several lines of NDJSON.
    Json,
    /// `application/x-ndjson`: one object per line.
    Ndjson,
}

/// Decisions parsed from one body, each with its 1-based body line.
pub(crate) struct Parsed {
    pub decisions: Vec<Decision>,
    /// `Some` for NDJSON: the body line of each decision.
    pub lines: Option<Vec<usize>>,
}

/// Parse a request body. `max_batch` bounds the decisions of one request.
pub(crate) fn parse_body(
    body: &[u8],
    framing: Framing,
    max_batch: usize,
) -> Result<Parsed, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        let line = body[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1;
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::NotUtf8,
            "request body is not UTF-8",
        )
        .line(Some(line))
    })?;
    if text.trim().is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::EmptyBody,
            "request body holds no decision",
        ));
    }
    if framing == Framing::Json {
        match parse_one(text) {
            Ok(d) => {
                return Ok(Parsed {
                    decisions: vec![d],
                    lines: None,
                })
            }
            // Several objects: NDJSON sent as application/json.
            Err(e) if e.trailing => {}
            Err(e) => return Err(e.error),
        }
    }
    let mut decisions = Vec::new();
    let mut lines = Vec::new();
    for (i, line) in text.split('\n').enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if tally_ledger::decision::is_blank_line(line) {
            continue;
        }
        if decisions.len() == max_batch {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::BatchTooLarge,
                format!("a request holds at most {max_batch} decisions; split the batch"),
            )
            .line(Some(i + 1)));
        }
        let d = parse_one(line).map_err(|e| {
            let mut error = e.error.line(Some(i + 1));
            error.detail.message = format!("line {}: {}", i + 1, error.detail.message);
            error
        })?;
        decisions.push(d);
        lines.push(i + 1);
    }
    Ok(Parsed {
        decisions,
        lines: Some(lines),
    })
}

struct OneError {
    error: ApiError,
    /// The text held a valid value followed by more: maybe NDJSON.
    trailing: bool,
}

fn parse_one(text: &str) -> Result<Decision, OneError> {
    // serde's derived structs also accept a JSON array of field values; a decision has
    // one encoding on the wire, an object.
    let first = text.trim_start().chars().next();
    if first == Some('[') {
        return Err(OneError {
            error: ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidType,
                "a decision is a JSON object, not an array",
            ),
            trailing: false,
        });
    }
    let refused = match Decision::from_json(text) {
        Ok(decision) => return Ok(decision),
        Err(e) => e,
    };
    // Refused: parse again, tracking the path, to say where.
    let mut de = serde_json::Deserializer::from_str(text);
    let _: Decision = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        json_error(e.into_inner(), &path)
    })?;
    de.end().map_err(|e| json_error(e, "."))?;
    // Only `from_json`'s own checks (a struct written as an array) are left.
    Err(OneError {
        error: ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidType,
            refused.to_string(),
        ),
        trailing: false,
    })
}

/// A serde error while reading a JSON body at field `path` (`.` for the top), as the typed
/// error DAEMON.md lists: `unknown_field`, `missing_field`, `invalid_type`,
/// `invalid_value` (each naming the field), else `invalid_json` (syntax, trailing data).
pub(crate) fn body_error(e: serde_json::Error, path: &str) -> ApiError {
    json_error(e, path).error
}

fn json_error(e: serde_json::Error, path: &str) -> OneError {
    let full = e.to_string();
    // serde_json appends " at line L column C"; the position goes in its own fields.
    let message = match full.rfind(" at line ") {
        Some(i) if e.line() > 0 => full[..i].to_string(),
        _ => full.clone(),
    };
    let (line, column) = if e.line() > 0 {
        (Some(e.line()), Some(e.column()))
    } else {
        (None, None)
    };
    let bad = StatusCode::BAD_REQUEST;
    let trailing = message == "trailing characters";
    let field = (path != ".").then(|| path.to_string());
    let error = match e.classify() {
        serde_json::error::Category::Data => {
            if let Some(name) = quoted(&message, "unknown field `") {
                ApiError::new(bad, ErrorCode::UnknownField, message.clone())
                    .field(join(field.as_deref(), name))
            } else if let Some(name) = quoted(&message, "missing field `") {
                ApiError::new(bad, ErrorCode::MissingField, message.clone())
                    .field(join(field.as_deref(), name))
            } else {
                let code = if message.starts_with("invalid type") {
                    ErrorCode::InvalidType
                } else {
                    ErrorCode::InvalidValue
                };
                let error = ApiError::new(bad, code, message.clone());
                match field {
                    Some(f) => error.field(f),
                    None => error,
                }
            }
        }
        _ => ApiError::new(bad, ErrorCode::InvalidJson, message.clone()),
    };
    OneError {
        error: error.line(line).column(column),
        trailing,
    }
}

/// `path.name`, unless the path already ends at `name` (serde_path_to_error includes an
/// unknown key in the path, but not a missing one).
fn join(path: Option<&str>, name: &str) -> String {
    match path {
        None => name.to_string(),
        Some(p) if p == name || p.ends_with(&format!(".{name}")) => p.to_string(),
        Some(p) => format!("{p}.{name}"),
    }
}

/// The name in `prefix NAME` + "`".
fn quoted<'a>(message: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = message.strip_prefix(prefix)?;
    rest.split('`').next()
}

#[cfg(test)]
mod unit {
    use super::*;

    fn err(body: &str, framing: Framing) -> ApiError {
        match parse_body(body.as_bytes(), framing, 100) {
            Ok(_) => panic!("{body:?} parsed"),
            Err(e) => e,
        }
    }

    #[test]
    fn field_paths_name_the_field_at_fault() {
        let e = err(r#"{"run":"r","kind":"start","bogus":1}"#, Framing::Json);
        assert_eq!(
            (e.detail.code.as_str(), e.detail.field.as_deref()),
            ("unknown_field", Some("bogus"))
        );
        let e = err(
            r#"{"run":"r","kind":"start","budget":{"attempts":"x"}}"#,
            Framing::Json,
        );
        assert_eq!(
            (e.detail.code.as_str(), e.detail.field.as_deref()),
            ("invalid_type", Some("budget.attempts"))
        );
        let e = err(
            r#"{"run":"r","kind":"start","budget":{"nope":1}}"#,
            Framing::Json,
        );
        assert_eq!(
            (e.detail.code.as_str(), e.detail.field.as_deref()),
            ("unknown_field", Some("budget.nope"))
        );
        let e = err(r#"{"run":"r","kind":"sideways"}"#, Framing::Json);
        assert_eq!(
            (e.detail.code.as_str(), e.detail.field.as_deref()),
            ("invalid_value", Some("kind"))
        );
        let e = err(
            r#"{"run":"r","kind":"allow","limits":{"attempts":{"used":1}}}"#,
            Framing::Json,
        );
        assert_eq!(
            (e.detail.code.as_str(), e.detail.field.as_deref()),
            ("missing_field", Some("limits.attempts.limit"))
        );
        let e = err("{\"run\":\"r\",\n\"kind\":", Framing::Json);
        assert_eq!(
            (e.detail.code.as_str(), e.detail.line),
            ("invalid_json", Some(2))
        );
    }

    #[test]
    fn ndjson_errors_carry_the_body_line() {
        let body =
            "{\"run\":\"a\",\"kind\":\"start\"}\n\n{\"run\":\"b\",\"kind\":\"start\",\"x\":1}\n";
        for framing in [Framing::Json, Framing::Ndjson] {
            let e = err(body, framing);
            assert_eq!(e.detail.code, "unknown_field");
            assert_eq!(e.detail.line, Some(3));
            assert_eq!(e.detail.field.as_deref(), Some("x"));
        }
        let ok = parse_body(
            b"{\"run\":\"a\",\"kind\":\"start\"}\r\n\n{\"run\":\"b\",\"kind\":\"start\"}",
            Framing::Json,
            10,
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(ok.lines, Some(vec![1, 3]));
    }

    #[test]
    fn a_pretty_printed_object_is_one_decision() {
        let ok = parse_body(
            b"{\n  \"run\": \"a\",\n  \"kind\": \"start\"\n}\n",
            Framing::Json,
            10,
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(ok.decisions.len(), 1);
        assert!(ok.lines.is_none());
    }

    #[test]
    fn strictness_matches_the_ledger_parser() {
        for text in [
            r#"{"run":"r","kind":"start"}"#,
            r#"{"run":"r","kind":"start"} x"#,
            r#"{"run":"r","kind":"start","goal":7}"#,
            r#"{"run":"r","kind":"start","zzz":null}"#,
            r#"{"run":"r","kind":"allow","at_ms":-1}"#,
        ] {
            assert_eq!(
                parse_one(text).is_ok(),
                Decision::from_json(text).is_ok(),
                "{text}"
            );
        }
        // Stricter than serde's derive: the array form of a struct is refused, at the
        // top and nested.
        assert!(parse_one(r#"["r","start"]"#).is_err());
        let nested = r#"{"run":"r","kind":"start","budget":[1,2]}"#;
        assert!(Decision::from_json(nested).is_err());
        match parse_one(nested) {
            Err(e) => {
                assert_eq!(e.error.detail.code, "invalid_type");
                assert!(
                    e.error.detail.message.contains("budget"),
                    "{}",
                    e.error.detail.message
                );
            }
            Ok(_) => panic!("a budget written as an array parsed"),
        }
    }

    #[test]
    fn batches_are_bounded() {
        let body = "{\"run\":\"a\",\"kind\":\"start\"}\n".repeat(4);
        let e = match parse_body(body.as_bytes(), Framing::Ndjson, 3) {
            Ok(_) => panic!("parsed"),
            Err(e) => e,
        };
        assert_eq!(
            (e.status, e.detail.code.as_str(), e.detail.line),
            (StatusCode::PAYLOAD_TOO_LARGE, "batch_too_large", Some(4))
        );
    }
}
