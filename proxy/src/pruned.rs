//! An answer's JSON read once into only the members the usage readers look at
//! ([`Prune`]): every other member is read and checked as it would be for a
//! [`Value`] (the same reader, its syntax, UTF-8, numbers and depth), and dropped without
//! being kept. A member dropped inside a kept one stays as `null` where the readers
//! count it (a chat chunk's `choices`), and a member that is not the object or array its
//! shape expects is `null`: the readers only ever `get` from it by name, which finds
//! nothing in either.
//!
//! (Not serde's `IgnoredAny`, which skips a number or a string without checking it as
//! a `Value`'s reader does: a number out of range, a string's UTF-8.)
//!
//! The members kept are declared next to the readers that read them (the usage's
//! dialects, [`crate::tier`]): this file only reads by them.
//!
//! This is the only reader of answers and of stream events. A key serde_json reads as
//! its own private marker (`$serde_json::private::RawValue`, which a `Value`'s reader
//! refuses when it comes first in an object) is an ordinary key in the parts not kept:
//! a model's tool input may carry one, and it must not make the answer's usage
//! unreadable. Inside a kept member read whole (the usage object) it is read as a
//! `Value` reads it, as before.

use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// What of a JSON value is kept.
#[derive(Debug)]
pub(crate) enum Prune {
    /// All of it.
    Whole,
    /// An object's named members, each pruned by its shape; anything else is `null`.
    Fields(&'static [(&'static str, Prune)]),
    /// An array's items, each pruned by the shape; anything else is `null`.
    Items(&'static Prune),
    /// Nothing: `null`.
    Skip,
}

/// `json` read as `shape` keeps it; an error for anything that is not one JSON value.
pub(crate) fn read(shape: &'static Prune, json: &[u8]) -> serde_json::Result<Value> {
    read_from(shape, serde_json::Deserializer::from_slice(json))
}

/// [`read`], of text (a stream's event: its UTF-8 checked once, where it was decoded).
pub(crate) fn read_str(shape: &'static Prune, json: &str) -> serde_json::Result<Value> {
    read_from(shape, serde_json::Deserializer::from_str(json))
}

fn read_from<'de, R: serde_json::de::Read<'de>>(
    shape: &'static Prune,
    mut de: serde_json::Deserializer<R>,
) -> serde_json::Result<Value> {
    let v = shape.deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

impl<'de> DeserializeSeed<'de> for &'static Prune {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        match self {
            Prune::Whole => de::Deserialize::deserialize(d),
            _ => d.deserialize_any(Pruning(self)),
        }
    }
}

/// The visitor of a value pruned by its shape (not [`Prune::Whole`]).
struct Pruning(&'static Prune);

impl<'de> Visitor<'de> for Pruning {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_str<E>(self, _: &str) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        match self.0 {
            Prune::Items(item) => {
                let mut items = Vec::new();
                while let Some(v) = seq.next_element_seed(*item)? {
                    items.push(v);
                }
                Ok(Value::Array(items))
            }
            _ => {
                while seq.next_element_seed(&Prune::Skip)?.is_some() {}
                Ok(Value::Null)
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let fields = match self.0 {
            Prune::Fields(fields) => *fields,
            _ => &[],
        };
        let mut kept = Map::new();
        while let Some(at) = map.next_key_seed(Key(fields))? {
            match at {
                Some(i) => {
                    let (name, shape) = &fields[i];
                    let v = map.next_value_seed(shape)?;
                    // A member given twice: the last one, as a `Value`'s map keeps it.
                    kept.insert((*name).to_owned(), v);
                }
                None => {
                    map.next_value_seed(&Prune::Skip)?;
                }
            }
        }
        Ok(match self.0 {
            Prune::Fields(_) => Value::Object(kept),
            _ => Value::Null,
        })
    }
}

/// A member's key: which of `fields` it names, if any (any other key, serde_json's
/// private markers among them, is one more member not kept).
struct Key(&'static [(&'static str, Prune)]);

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Option<usize>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a member's name")
    }

    fn visit_str<E: de::Error>(self, k: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|(name, _)| *name == k))
    }
}
