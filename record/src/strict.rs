//! Strict reading of decision JSON: what serde's derive would let through.
//!
//! * A `null` is never an absent field: every optional field reads through [`present`],
//!   which gives the value to the field's own type (so `null` is refused as it would be
//!   for a required field).
//! * `limits` keys are unique ([`limits`]); in `args`, [`crate::Args`] refuses duplicate
//!   keys at every depth; the derive itself refuses a field given twice.
//!
//! Those make the parse refuse; when it does, [`diagnose`] walks the text once more to
//! name what was wrong with a typed error (the duplicate key and the object holding it,
//! the null field, a non-JSON whitespace character), with its line and column. It only
//! names: it never decides what is accepted.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::error::DecisionError;
use crate::LimitKey;

/// An optional field that is present must hold a value of its type: `null` is refused.
pub(crate) fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// `limits`: an object of dimensions (each a `Limit`), each named once.
pub(crate) fn limits<'de, D, Limit>(d: D) -> Result<Option<BTreeMap<LimitKey, Limit>>, D::Error>
where
    D: Deserializer<'de>,
    Limit: Deserialize<'de>,
{
    struct V<Limit>(std::marker::PhantomData<Limit>);
    impl<'de, Limit: Deserialize<'de>> Visitor<'de> for V<Limit> {
        type Value = BTreeMap<LimitKey, Limit>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object of {used, limit} per dimension")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(key) = map.next_key::<LimitKey>()? {
                let value: Limit = map.next_value()?;
                if out.contains_key(&key) {
                    return Err(de::Error::custom(format_args!(
                        "duplicate key `{key}` in `limits`"
                    )));
                }
                out.insert(key, value);
            }
            Ok(out)
        }
    }
    d.deserialize_map(V(std::marker::PhantomData)).map(Some)
}

/// Whether a line of NDJSON holds no decision: only JSON whitespace (space, tab, CR,
/// LF). Any other character, Unicode whitespace such as U+00A0 included, makes it a line
/// to parse (and refuse), never one to skip.
pub fn is_blank_line(line: &str) -> bool {
    line.bytes()
        .all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
}

/// Name what made `text` fail to parse as a decision, if it is one of the strictness
/// rules above; `None` leaves the parser's own message to say it.
pub(crate) fn diagnose(text: &str, error: &serde_json::Error) -> Option<DecisionError> {
    use serde_json::error::Category;
    if matches!(error.classify(), Category::Syntax | Category::Eof) {
        if let Some(e) = not_json_whitespace(text) {
            return Some(e);
        }
    }
    let problem = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(text);
    let walked = Walk {
        path: String::new(),
        role: Role::Decision,
        null_ok: true,
        problem: &problem,
    }
    .deserialize(&mut de);
    let (line, column) = walked.err().map_or((0, 0), |e| (e.line(), e.column()));
    let Some(problem) = problem.into_inner() else {
        // Nothing of the walk's: maybe `args` that cannot be read exactly.
        let members = serde_json::from_str::<crate::args::Members>(text).ok()?;
        let (_, raw) = members.0.iter().find(|(k, _)| k == "args")?;
        return crate::Args::parse(raw.get()).err().map(DecisionError::Args);
    };
    Some(match problem {
        Problem::Duplicate { path, key } => DecisionError::DuplicateKey {
            path,
            key,
            line,
            column,
        },
        Problem::Null { field } => DecisionError::Null {
            field,
            line,
            column,
        },
    })
}

/// The first character outside strings that Unicode calls whitespace and JSON does not.
fn not_json_whitespace(text: &str) -> Option<DecisionError> {
    let (mut in_string, mut escaped) = (false, false);
    for (i, c) in text.char_indices() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
        } else if c.is_whitespace() && !matches!(c, ' ' | '\t' | '\n' | '\r') {
            let start = text[..i].rfind('\n').map_or(0, |n| n + 1);
            return Some(DecisionError::NotJsonWhitespace {
                found: c,
                line: 1 + text[..start].matches('\n').count(),
                column: i - start + 1,
            });
        }
    }
    None
}

enum Problem {
    Duplicate { path: String, key: String },
    Null { field: String },
}

/// Where a value stands: what its members may be.
#[derive(Clone, Copy, PartialEq)]
enum Role {
    /// The decision object: members never null; `budget`, `scope`, `limits` below.
    Decision,
    /// `budget`, `scope`, one entry of `limits`: members never null.
    Record,
    /// `limits`: entries are records.
    Limits,
    /// Anything else (inside `args`): any JSON, keys once per object.
    Any,
}

struct Walk<'p> {
    path: String,
    role: Role,
    null_ok: bool,
    problem: &'p RefCell<Option<Problem>>,
}

impl Walk<'_> {
    fn fail<E: de::Error>(&self, problem: Problem) -> E {
        *self.problem.borrow_mut() = Some(problem);
        E::custom("refused")
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        if self.null_ok {
            Ok(())
        } else {
            Err(self.fail(Problem::Null {
                field: self.path.clone(),
            }))
        }
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while seq
            .next_element_seed(Walk {
                path: format!("{}[{i}]", self.path),
                role: Role::Any,
                null_ok: true,
                problem: self.problem,
            })?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if seen.contains(&key) {
                return Err(self.fail(Problem::Duplicate {
                    path: self.path.clone(),
                    key,
                }));
            }
            let role = match (self.role, key.as_str()) {
                (Role::Decision, "budget" | "scope" | "slice") | (Role::Limits, _) => Role::Record,
                (Role::Decision, "limits") => Role::Limits,
                _ => Role::Any,
            };
            let path = if self.path.is_empty() {
                key.clone()
            } else if self.role == Role::Any {
                let mut p = self.path.clone();
                crate::args::push_key(&mut p, &key);
                p
            } else {
                format!("{}.{key}", self.path)
            };
            map.next_value_seed(Walk {
                path,
                role,
                null_ok: self.role == Role::Any,
                problem: self.problem,
            })?;
            seen.insert(key);
        }
        Ok(())
    }
}
