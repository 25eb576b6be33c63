//! The canonicalizer as it was before the one-pass reader: every nesting level's text read
//! again by serde_json. Kept for the tests only, as the oracle the reader must equal on
//! every byte and every error (`differential.rs`).

use serde_json::value::RawValue;

use super::{canonical_number, push_key, write_string, Members, MAX_ARGS_DEPTH, MAX_EXPONENT};
use crate::error::ArgsError;

/// What `Args::parse` returned before the one-pass reader: the canonical text.
pub(super) fn parse(text: &str) -> Result<String, ArgsError> {
    let raw: &RawValue = serde_json::from_str(text).map_err(|e| ArgsError::Json {
        path: "args".into(),
        message: e.to_string(),
    })?;
    let text = raw.get();
    if text == "null" {
        return Err(ArgsError::Null);
    }
    let mut out = Vec::with_capacity(text.len());
    let mut path = String::from("args");
    canonical(text, &mut path, 0, &mut out)?;
    String::from_utf8(out).map_err(|_| ArgsError::Json {
        path: "args".into(),
        message: "not UTF-8".into(),
    })
}

/// Append the canonical form of the JSON value `raw` (valid JSON, no surrounding
/// whitespace) at `path`.
fn canonical(
    raw: &str,
    path: &mut String,
    depth: usize,
    out: &mut Vec<u8>,
) -> Result<(), ArgsError> {
    let json = |path: &str, e: serde_json::Error| ArgsError::Json {
        path: path.to_string(),
        message: e.to_string(),
    };
    match raw.as_bytes().first() {
        Some(b'{') | Some(b'[') if depth >= MAX_ARGS_DEPTH => Err(ArgsError::TooDeep {
            path: path.clone(),
            max: MAX_ARGS_DEPTH,
        }),
        Some(b'{') => {
            let mut members = serde_json::from_str::<Members>(raw)
                .map_err(|e| json(path, e))?
                .0;
            members.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            if let Some(w) = members.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(ArgsError::DuplicateKey {
                    path: path.clone(),
                    key: w[0].0.to_string(),
                });
            }
            out.push(b'{');
            let len = path.len();
            for (i, (key, value)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(key, out);
                out.push(b':');
                push_key(path, key);
                canonical(value.get(), path, depth + 1, out)?;
                path.truncate(len);
            }
            out.push(b'}');
            Ok(())
        }
        Some(b'[') => {
            let items = serde_json::from_str::<Vec<&RawValue>>(raw).map_err(|e| json(path, e))?;
            out.push(b'[');
            let len = path.len();
            for (i, value) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                path.push_str(&format!("[{i}]"));
                canonical(value.get(), path, depth + 1, out)?;
                path.truncate(len);
            }
            out.push(b']');
            Ok(())
        }
        Some(b'"') => {
            if raw.contains('\\') {
                let s: String = serde_json::from_str(raw).map_err(|e| json(path, e))?;
                write_string(&s, out);
            } else {
                out.extend_from_slice(raw.as_bytes());
            }
            Ok(())
        }
        Some(b't' | b'f' | b'n') => {
            out.extend_from_slice(raw.as_bytes());
            Ok(())
        }
        Some(_) => canonical_number(raw, out).ok_or_else(|| ArgsError::ExponentOutOfRange {
            path: path.clone(),
            max: MAX_EXPONENT,
        }),
        None => Err(ArgsError::Json {
            path: path.clone(),
            message: "empty value".into(),
        }),
    }
}
