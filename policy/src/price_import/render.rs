//! The policy text an import writes: one `[prices.UPSTREAM."MODEL"]` table per price,
//! exact amounts as quoted decimals, checked by the policy's own price reader.

use std::collections::BTreeMap;
use std::fmt::Write;

use tally_record::money::Nanos;

use super::{ImportError, ImportOptions, ImportedPrice};

/// The tables of `prices` ((upstream, id) -> (the table's key, price)), after a
/// comment saying where they came from and `summary`.
pub(super) fn toml(
    prices: &BTreeMap<(String, String), (String, ImportedPrice)>,
    aliases: &BTreeMap<(String, String), Vec<String>>,
    opts: &ImportOptions,
    summary: &str,
) -> String {
    let mut out = String::new();
    let source = escaped(&opts.source);
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "# Model prices imported by `tally prices import` from \"{source}\", as of {}.\n# {summary}.",
        opts.as_of
    );
    for (at, (_, p)) in prices {
        let (upstream, id) = at;
        let _ = writeln!(out, "\n[prices.{upstream}.\"{}\"]", escaped(id));
        let mut amount = |name: &str, n: Option<Nanos>| {
            if let Some(n) = n {
                let _ = writeln!(
                    out,
                    "{name} = \"{}\"",
                    n.to_string().trim_start_matches('$')
                );
            }
        };
        amount("input_per_mtok", Some(p.input));
        amount("output_per_mtok", Some(p.output));
        amount("cached_input_per_mtok", p.cached_input);
        amount("cache_write_per_mtok", p.cache_write);
        amount("cache_write_1h_per_mtok", p.cache_write_1h);
        if let Some(n) = p.max_output_tokens {
            let _ = writeln!(out, "max_output_tokens = {n}");
        }
        if let Some(n) = p.context_tokens {
            let _ = writeln!(out, "context_tokens = {n}");
        }
        if let Some(ids) = aliases.get(at) {
            let ids: Vec<String> = ids.iter().map(|i| format!("\"{}\"", escaped(i))).collect();
            let _ = writeln!(out, "aliases = [{}]", ids.join(", "));
        }
        let _ = writeln!(out, "source = \"{source}\"\nas_of = \"{}\"", opts.as_of);
    }
    out
}

/// The policy's price reader accepts `text` (a fault here is tally's, not the table's:
/// said as such, and nothing is written).
pub(super) fn check(text: &str) -> Result<(), ImportError> {
    let refused = |e: String| {
        ImportError::NotATable(format!(
            "tally wrote prices its policy refuses ({e}); please report this"
        ))
    };
    toml::from_str::<toml::Table>(text).map_err(|e| refused(e.to_string()))?;
    crate::upstreams::Prices::read(text).map_err(|e| refused(e.to_string()))?;
    Ok(())
}

/// A TOML basic string's content for `s` (its `\` and `"` escaped; the text has no
/// control characters, [`valid_source`] and [`valid_id`] refuse them).
fn escaped(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A source the policy accepts: 1 to 256 bytes, no control or bidi characters.
pub(super) fn valid_source(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && !s
            .chars()
            .any(|c| c.is_control() || tally_record::words::is_bidi(c))
}

/// A model id written: 1 to 256 visible ASCII characters, no `"` or `\`.
pub(super) fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 256
        && id
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
}

/// A name shown as it is: letters, digits, `_`, `-`, `.`.
pub(super) fn bare(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}
