//! Entry points for the fuzz targets in `fuzz/` (not part of the API; hidden from the
//! docs). Each one runs the code under test on arbitrary bytes and panics when an
//! invariant breaks, so that a target is a thin wrapper.

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::classify::{classify as classify_line, Message};

/// The classifier on one line: never panics, and whatever a lenient reader could take
/// for a `tools/call` is classified as that call or refused.
///
/// The lenient readings: serde_json's `Value` (the last of duplicate members wins), every
/// top-level member (so also the first of duplicates), member names and methods compared
/// ignoring ASCII case and surrounding whitespace and NULs, the line split at every
/// character some line reader breaks lines at, a byte order mark dropped, invalid UTF-8
/// replaced. Besides, what passes is forwarded as bytes that read as the same value as
/// the input, hold no line break of any reader, and classify again as the same message;
/// and a call's id, name and arguments are what serde_json reads from the line.
pub fn classify(data: &[u8]) {
    let result = classify_line(data);
    let lossy = String::from_utf8_lossy(data);
    let text = lossy.strip_suffix('\r').unwrap_or(&lossy);

    let mut pieces: Vec<&str> = vec![text, text.trim_start_matches('\u{feff}')];
    pieces.extend(text.split(['\r', '\u{85}', '\u{2028}', '\u{2029}', '\u{b}', '\u{c}']));
    let readable_as_call = pieces.iter().any(|p| could_be_call(p));

    match &result {
        Err(_) => {}
        Ok(c) => {
            assert!(
                !c.line
                    .contains(['\n', '\r', '\u{85}', '\u{2028}', '\u{2029}']),
                "a forwarded line holds a line break: {:?}",
                c.line
            );
            let original: Value = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("a classified line is not JSON to serde_json: {e}"));
            let forwarded: Value =
                serde_json::from_str(&c.line).expect("the forwarded line is JSON");
            assert_eq!(original, forwarded, "escaping changed the message");
            let again = classify_line(c.line.as_bytes()).expect("the forwarded line classifies");
            assert_eq!(again, *c, "the forwarded line classifies differently");

            let method = original.get("method").and_then(Value::as_str);
            match &c.message {
                Message::Call { id, call } => {
                    assert_eq!(method, Some("tools/call"));
                    assert_eq!(original.get("id"), Some(&id.to_value()));
                    let params = &original["params"];
                    assert_eq!(params["name"].as_str(), Some(call.name.as_str()));
                    let args = match params.get("arguments") {
                        None | Some(Value::Null) => serde_json::Map::new(),
                        Some(a) => a.as_object().expect("an object").clone(),
                    };
                    assert_eq!(args, call.arguments);
                }
                other => {
                    assert!(
                        !readable_as_call,
                        "a line a lenient reader takes for tools/call is classified as {other:?}"
                    );
                    match other {
                        Message::Request { id, method: m } => {
                            assert_eq!(method, Some(*m));
                            assert_eq!(original.get("id"), Some(&id.to_value()));
                        }
                        Message::Notification { method: m, .. } => {
                            assert_eq!(method, Some(*m));
                            assert!(original.get("id").is_none());
                        }
                        Message::Response { id } => {
                            assert!(method.is_none());
                            assert_eq!(original.get("id"), Some(&id.to_value()));
                        }
                        Message::Call { .. } => unreachable!(),
                    }
                }
            }
        }
    }
}

/// Whether a lenient reader could take `text` for a `tools/call` (or a batch holding
/// one): any top-level member named like `method` (any ASCII case, padded) whose value
/// reads like `tools/call`.
fn could_be_call(text: &str) -> bool {
    let Ok(top) = serde_json::from_str::<AllMembers>(text) else {
        return false;
    };
    match top {
        AllMembers::Object(members) => members.iter().any(|(k, v)| {
            loose(k) == "method" && v.as_str().is_some_and(|m| loose(m) == "tools/call")
        }),
        AllMembers::Array(items) => items.iter().any(|i| could_be_call(&i.to_string())),
        AllMembers::Other => false,
    }
}

fn loose(s: &str) -> String {
    s.trim_matches(|c: char| c.is_whitespace() || c == '\0')
        .to_ascii_lowercase()
}

/// Every member of a top-level object, duplicates kept, values read by serde_json.
enum AllMembers {
    Object(Vec<(String, Value)>),
    Array(Vec<Value>),
    Other,
}

impl<'de> de::Deserialize<'de> for AllMembers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AllMembers;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AllMembers, A::Error> {
                let mut out = Vec::new();
                while let Some(e) = map.next_entry::<String, Value>()? {
                    out.push(e);
                }
                Ok(AllMembers::Object(out))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<AllMembers, A::Error> {
                let mut out = Vec::new();
                while let Some(e) = seq.next_element::<Value>()? {
                    out.push(e);
                }
                Ok(AllMembers::Array(out))
            }
            fn visit_bool<E>(self, _: bool) -> Result<AllMembers, E> {
                Ok(AllMembers::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<AllMembers, E> {
                Ok(AllMembers::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<AllMembers, E> {
                Ok(AllMembers::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<AllMembers, E> {
                Ok(AllMembers::Other)
            }
            fn visit_str<E>(self, _: &str) -> Result<AllMembers, E> {
                Ok(AllMembers::Other)
            }
            fn visit_unit<E>(self) -> Result<AllMembers, E> {
                Ok(AllMembers::Other)
            }
        }
        d.deserialize_any(V)
    }
}
