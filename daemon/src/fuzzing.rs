//! Entry points for the fuzz targets in `fuzz/` (not part of the API; hidden from the
//! docs): the daemon's request-body parsers on arbitrary bytes, panicking when an
//! invariant breaks, so that a target is a thin wrapper.

use tally_gate::{CheckRequest, OutcomeRequest, StartRequest};
use tally_ledger::Decision;

use tally_wire::ErrorCode;

use crate::error::ApiError;
use crate::parse::{parse_body, Framing};

/// The codes a refused body may carry (docs/DAEMON.md).
const CODES: [ErrorCode; 9] = [
    ErrorCode::NotUtf8,
    ErrorCode::EmptyBody,
    ErrorCode::BatchTooLarge,
    ErrorCode::InvalidJson,
    ErrorCode::InvalidType,
    ErrorCode::InvalidValue,
    ErrorCode::UnknownField,
    ErrorCode::MissingField,
    ErrorCode::InvalidDecision,
];

fn refused_as_documented(e: &ApiError, lines: usize) {
    let code = e.detail.code.as_str();
    assert!(
        CODES.contains(&e.detail.code) || code.starts_with("invalid_"),
        "an undocumented code {code:?}: {}",
        e.detail.message
    );
    assert!(
        matches!(e.status.as_u16(), 400 | 413),
        "a body refused with {} ({code})",
        e.status
    );
    if let Some(line) = e.detail.line {
        assert!(
            line >= 1 && line <= lines,
            "line {line} of a {lines}-line body"
        );
    }
}

/// `POST /v1/decisions`'s parser (operator socket), both framings: never panics; a
/// refusal is a documented code on a line the body has; what is accepted is at most the
/// batch bound, each decision on its own line in order, and each valid one, stored as
/// the ledger stores it (arguments sealed, canonical JSON), reads back equal.
pub fn decisions(data: &[u8]) {
    let lines = data.split(|&b| b == b'\n').count();
    for framing in [Framing::Json, Framing::Ndjson] {
        match parse_body(data, framing, 8) {
            Err(e) => refused_as_documented(&e, lines),
            Ok(parsed) => {
                assert!(!parsed.decisions.is_empty() && parsed.decisions.len() <= 8);
                if let Some(at) = &parsed.lines {
                    assert_eq!(at.len(), parsed.decisions.len());
                    assert!(at.windows(2).all(|w| w[0] < w[1]), "{at:?}");
                    assert!(at.iter().all(|&l| l >= 1 && l <= lines), "{at:?}");
                }
                for d in &parsed.decisions {
                    // One the daemon would go on to append (it validates first), as the
                    // ledger stores it: arguments sealed to their digest, the record as
                    // canonical JSON, read back by the stored reader.
                    if d.validate().is_err() {
                        continue;
                    }
                    let mut sealed = d.clone();
                    sealed.seal_args();
                    let bytes = sealed.to_canonical_json();
                    let again = Decision::from_stored(&bytes).unwrap_or_else(|e| {
                        panic!(
                            "{} is refused read back: {e}",
                            String::from_utf8_lossy(&bytes)
                        )
                    });
                    assert_eq!(again, sealed, "{}", String::from_utf8_lossy(&bytes));
                }
            }
        }
    }
}

/// The gate routes' parser (agent socket: start, check, outcome): never panics; a refusal
/// is a documented code; what is accepted serializes to JSON the same parser accepts as
/// the same request.
pub fn gate_bodies(data: &[u8]) {
    fn one<T>(data: &[u8])
    where
        T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
    {
        match crate::gate_api::parse_body::<T>(data, false) {
            Err(e) => refused_as_documented(&e, usize::MAX),
            Ok(request) => {
                let json = serde_json::to_vec(&request).expect("a request serializes");
                let again = crate::gate_api::parse_body::<T>(&json, false).unwrap_or_else(|e| {
                    panic!(
                        "{} is refused read back: {}",
                        String::from_utf8_lossy(&json),
                        e.detail.message
                    )
                });
                assert_eq!(again, request);
            }
        }
    }
    one::<StartRequest>(data);
    one::<CheckRequest>(data);
    one::<OutcomeRequest>(data);
}

#[cfg(test)]
mod tests {
    /// The entry points hold on the bodies the daemon's tests send, and on the bodies
    /// that once slipped past or were misread (duplicate keys, arrays for structs, empty
    /// run names, form encoding, deep nesting, NDJSON with blank and CRLF lines).
    #[test]
    fn seeds_hold() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let seeds: Vec<Vec<u8>> = vec![
            br#"{"run":"r1","kind":"allow","tool":"http","operation":"export.create","args":{"q":3}}"#.to_vec(),
            b"{\"run\":\"r1\",\"kind\":\"start\",\"goal\":\"g\"}\r\n\n{\"run\":\"r1\",\"kind\":\"stop\",\"reason\":\"completed\"}\n".to_vec(),
            br#"{"run":"r1","run":"r2","kind":"start"}"#.to_vec(),
            br#"["r1","start"]"#.to_vec(),
            br#"{"run":"","tool":"t","effect":"read"}"#.to_vec(),
            br#"{"run":"r1","tool":"t","effect":"read","args":{"a":1}}"#.to_vec(),
            br#"{"run":"r1","attempt":1,"status":"ok","settled_cents":5}"#.to_vec(),
            br#"{"run":"r1","budget":{"attempts":"5"}}"#.to_vec(),
            br#"{"run":"r1","budget":[5]}"#.to_vec(),
            b"run=r1&kind=start".to_vec(),
            format!(r#"{{"run":"r1","tool":"t","effect":"read","args":{deep}}}"#).into_bytes(),
            vec![0xff, 0xfe, b'{'],
            Vec::new(),
            b"   \n  ".to_vec(),
        ];
        for s in &seeds {
            super::decisions(s);
            super::gate_bodies(s);
        }
    }
}
