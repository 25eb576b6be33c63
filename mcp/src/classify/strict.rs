//! The strict JSON reader under the classifier: serde_json's parser (RFC 8259, valid
//! UTF-8, no lone surrogate, no trailing bytes), with every object's member names checked
//! for duplicates and the nesting bounded, so that what it reads is what every
//! conforming JSON parser reads.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{Why, MAX_DEPTH};

/// The top level of a line: an object's members (every one, duplicates too) or an array's
/// elements, each as its raw text; or something else.
pub(super) enum Top<'a> {
    Object(Vec<(String, &'a RawValue)>),
    Array(Vec<&'a RawValue>),
    Other,
}

impl<'de> de::Deserialize<'de> for Top<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Top<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                    out.push(entry);
                }
                Ok(Top::Object(out))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Top<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some(e) = seq.next_element::<&'de RawValue>()? {
                    out.push(e);
                }
                Ok(Top::Array(out))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Top<'de>, E> {
                Ok(Top::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Top<'de>, E> {
                Ok(Top::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Top<'de>, E> {
                Ok(Top::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Top<'de>, E> {
                Ok(Top::Other)
            }
            fn visit_str<E>(self, _: &str) -> Result<Top<'de>, E> {
                Ok(Top::Other)
            }
            fn visit_unit<E>(self) -> Result<Top<'de>, E> {
                Ok(Top::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// Where a strict parse stopped: the reason, and the path to it (innermost first).
#[derive(Default)]
struct Trail {
    why: Option<Why>,
    path: Vec<String>,
}

/// Parse one envelope member's value strictly: no duplicate names, at most
/// [`MAX_DEPTH`] levels counting the envelope.
pub(super) fn strict(text: &str, member: &str) -> Result<Value, Why> {
    parse(text, 1, &format!(".{member}"))
}

/// Parse a whole message (or a batch) strictly: the envelope is level 1.
pub(super) fn strict_top(text: &str) -> Result<Value, Why> {
    parse(text, 0, "")
}

/// A strict parse of `text`, a value inside a container at `depth`, found at `prefix`.
fn parse(text: &str, depth: usize, prefix: &str) -> Result<Value, Why> {
    let mut trail = Trail::default();
    let mut d = serde_json::Deserializer::from_str(text);
    let parsed = Strict {
        trail: &mut trail,
        depth,
    }
    .deserialize(&mut d)
    .and_then(|v| d.end().map(|()| v));
    match parsed {
        Ok(v) => Ok(v),
        Err(e) => {
            trail.path.push(prefix.to_owned());
            trail.path.reverse();
            let at = at(&trail.path);
            Err(match trail.why {
                Some(Why::DuplicateKey { key, .. }) => Why::DuplicateKey { key, at },
                Some(Why::TooDeep { .. }) => Why::TooDeep { at },
                Some(other) => other,
                None => Why::NotJson(e.to_string()),
            })
        }
    }
}

/// A path for a message: its first segments, then an ellipsis.
fn at(path: &[String]) -> String {
    const SHOWN: usize = 8;
    let mut out: String = path.iter().take(SHOWN).map(String::as_str).collect();
    if path.len() > SHOWN {
        out.push('…');
    }
    out
}

/// The strict reader: a serde_json value, refusing duplicate names and deep nesting.
struct Strict<'t> {
    trail: &'t mut Trail,
    /// The depth of the value being read's container.
    depth: usize,
}

impl Strict<'_> {
    fn enter<E: de::Error>(&mut self) -> Result<usize, E> {
        let depth = self.depth + 1;
        if depth > MAX_DEPTH {
            self.trail.why = Some(Why::TooDeep { at: String::new() });
            return Err(E::custom("nested too deep"));
        }
        Ok(depth)
    }
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(n)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number that is not finite"))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Value, A::Error> {
        let depth = self.enter()?;
        let mut out = Vec::new();
        loop {
            let inner = Strict {
                trail: &mut *self.trail,
                depth,
            };
            match seq.next_element_seed(inner) {
                Ok(Some(v)) => out.push(v),
                Ok(None) => return Ok(Value::Array(out)),
                Err(e) => {
                    self.trail.path.push(format!("[{}]", out.len()));
                    return Err(e);
                }
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Value, A::Error> {
        let depth = self.enter()?;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                self.trail.why = Some(Why::DuplicateKey {
                    key: key.clone(),
                    at: String::new(),
                });
                return Err(de::Error::custom("duplicate member name"));
            }
            let inner = Strict {
                trail: &mut *self.trail,
                depth,
            };
            match map.next_value_seed(inner) {
                Ok(v) => {
                    out.insert(key, v);
                }
                Err(e) => {
                    self.trail.path.push(format!(".{key}"));
                    return Err(e);
                }
            }
        }
        Ok(Value::Object(out))
    }
}
