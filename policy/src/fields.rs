//! Reading a price table from the policy's text, exactly: its fields, their amounts read
//! from their literal text ([`tally_record::money::parse_usd`]), never through a float.

use std::collections::BTreeMap;

use serde::Serializer;
use tally_record::money::{parse_usd, Nanos};

use crate::error::PolicyError;

/// An amount as the policy writes it.
pub(crate) fn usd<S: Serializer>(n: &Nanos, s: S) -> Result<S::Ok, S::Error> {
    // `$0.15` -> `0.15`: the text parse_usd reads back.
    s.serialize_str(n.to_string().trim_start_matches('$'))
}

/// An optional amount (skipped when unset).
pub(crate) fn usd_or_unset<S: Serializer>(n: &Option<Nanos>, s: S) -> Result<S::Ok, S::Error> {
    match n {
        Some(n) => usd(n, s),
        // Skipped when unset: never reached.
        None => s.serialize_none(),
    }
}

/// A key as a policy writes it: bare if it can be, else quoted.
pub(crate) fn quoted(key: &str) -> String {
    if !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

/// One field of a price table: its amount (if it reads as one) and integer value.
pub(crate) struct Field {
    pub(crate) usd: Result<Nanos, PolicyError>,
    pub(crate) integer: Option<u64>,
    /// A string's value.
    pub(crate) text: Option<String>,
    /// An array of strings' values.
    pub(crate) strings: Option<Vec<String>>,
    pub(crate) span: Option<std::ops::Range<usize>>,
}

/// The fields of the table `item` at `key`, each one of `allowed`.
pub(crate) fn read_fields(
    text: &str,
    item: &toml_edit::Item,
    key: &str,
    allowed: &[&str],
) -> Result<BTreeMap<String, Field>, PolicyError> {
    let t = item.as_table_like().ok_or_else(|| {
        invalid(
            text,
            key.to_owned(),
            "must be a table of prices".into(),
            item.span(),
        )
    })?;
    let mut out = BTreeMap::new();
    for (name, value) in t.iter() {
        let at = format!("{key}.{name}");
        if !allowed.contains(&name) {
            let span = t.key(name).and_then(|k| k.span()).or(value.span());
            return Err(invalid(
                text,
                at,
                format!(
                    "is not a known key here (expected one of: {})",
                    allowed.join(", ")
                ),
                span,
            ));
        }
        out.insert(name.to_owned(), read_field(text, &at, value));
    }
    Ok(out)
}

/// The error of the key `key` in `text`, on the line of `span`.
fn invalid(
    text: &str,
    key: String,
    why: String,
    span: Option<std::ops::Range<usize>>,
) -> PolicyError {
    PolicyError::Invalid {
        key,
        why,
        line: span.map(|s| line_at(text, s.start)),
    }
}

/// One field, at `at`: its amount read from its literal text, and its value as an
/// integer, a string or an array of strings, whichever it is.
fn read_field(text: &str, at: &str, value: &toml_edit::Item) -> Field {
    let span = value.span();
    let v = value.as_value();
    // The literal text of a number, exactly as written in the file.
    let literal = match v {
        Some(toml_edit::Value::String(s)) => Some(s.value().to_owned()),
        Some(toml_edit::Value::Integer(_)) | Some(toml_edit::Value::Float(_)) => span
            .clone()
            .and_then(|s| text.get(s))
            .map(|t| t.trim().to_owned()),
        _ => None,
    };
    let integer = match v {
        Some(toml_edit::Value::Integer(i)) => u64::try_from(*i.value()).ok(),
        _ => None,
    };
    let usd = match literal {
        Some(l) => parse_usd(&l).map_err(|e| {
            invalid(
                text,
                at.to_owned(),
                format!("must be exact US dollars: {e}"),
                span.clone(),
            )
        }),
        None => Err(invalid(
            text,
            at.to_owned(),
            "must be an amount of US dollars, like 0.15 or \"0.15\"".into(),
            span.clone(),
        )),
    };
    let text = match v {
        Some(toml_edit::Value::String(s)) => Some(s.value().to_owned()),
        _ => None,
    };
    let strings = match v {
        Some(toml_edit::Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_owned))
            .collect::<Option<Vec<String>>>(),
        _ => None,
    };
    Field {
        usd,
        integer,
        text,
        strings,
        span,
    }
}

/// The amount `name`, which must be there.
pub(crate) fn required(
    fields: &BTreeMap<String, Field>,
    name: &str,
    key: &str,
    line: Option<usize>,
) -> Result<Nanos, PolicyError> {
    match fields.get(name) {
        Some(f) => f.usd.clone(),
        None => Err(PolicyError::Invalid {
            key: format!("{key}.{name}"),
            why: "is missing: give it (US dollars, like 0.15)".into(),
            line,
        }),
    }
}

/// The 1-based line of byte `at` in `text`.
pub(crate) fn line_at(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}
