//! A request's body as the proxy reads and writes it: its members looked up in the
//! canonical text, and rendered back with the proxy's settings put in.

use std::collections::BTreeMap;
use std::ops::Range;

use super::ModelRequest;

impl ModelRequest {
    pub(super) fn members(&self) -> Members<'_> {
        Members {
            text: self.args.canonical(),
            members: &self.members,
        }
    }

    /// The body as one JSON object: its members, with those in `set` (canonical JSON
    /// text) put in or over them, keys in byte order.
    pub(super) fn render(&self, set: &BTreeMap<&str, String>) -> String {
        let mut out = String::with_capacity(self.rendered_len(set));
        out.push('{');
        for (i, (key, value)) in self.merged(set).enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_key(&mut out, key);
            out.push(':');
            out.push_str(value);
        }
        out.push('}');
        out
    }

    /// The length in bytes of [`ModelRequest::render`]'s text, counted without writing
    /// it (the input bound is measured before the body is written).
    pub(super) fn rendered_len(&self, set: &BTreeMap<&str, String>) -> usize {
        let mut len = 2;
        for (i, (key, value)) in self.merged(set).enumerate() {
            len += usize::from(i > 0) + key_len(key) + 1 + value.len();
        }
        len
    }

    /// Its members and those of `set` (which replace its own of the same key), keys in
    /// byte order: each key and its value's canonical text.
    fn merged<'a>(
        &'a self,
        set: &'a BTreeMap<&'a str, String>,
    ) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        let text = self.args.canonical();
        let mut own = self.members.iter().peekable();
        let mut set = set.iter().peekable();
        std::iter::from_fn(move || {
            Some(match (own.peek(), set.peek()) {
                (None, None) => return None,
                (Some((k, _)), Some((s, _))) if k.as_str() == **s => {
                    own.next();
                    let (s, v) = set.next()?;
                    (*s, v.as_str())
                }
                (Some((k, r)), Some((s, _))) if k.as_str() < **s => {
                    own.next();
                    (k.as_str(), &text[r.clone()])
                }
                (Some((k, r)), None) => {
                    own.next();
                    (k.as_str(), &text[r.clone()])
                }
                (_, Some(_)) => {
                    let (s, v) = set.next()?;
                    (*s, v.as_str())
                }
            })
        })
    }
}

/// A key as a JSON string, written to `out`.
fn push_key(out: &mut String, key: &str) {
    if plain(key) {
        out.push('"');
        out.push_str(key);
        out.push('"');
    } else {
        // A string's JSON form cannot fail.
        out.push_str(&serde_json::to_string(key).unwrap_or_default());
    }
}

/// The length of a key as a JSON string.
fn key_len(key: &str) -> usize {
    if plain(key) {
        key.len() + 2
    } else {
        serde_json::to_string(key).map_or(0, |s| s.len())
    }
}

/// Whether a key is its own JSON string between quotes (nothing to escape).
fn plain(key: &str) -> bool {
    key.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\')
}

/// A request's members, looked up by key in its canonical text.
#[derive(Clone, Copy)]
pub(super) struct Members<'a> {
    pub(super) text: &'a str,
    pub(super) members: &'a [(String, Range<usize>)],
}

impl<'a> Members<'a> {
    /// The canonical JSON text of member `key`.
    pub(super) fn get(self, key: &str) -> Option<&'a str> {
        let i = self
            .members
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()?;
        Some(&self.text[self.members[i].1.clone()])
    }
}
