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
        let text = self.args.canonical();
        let mut out = String::with_capacity(text.len() + 64);
        out.push('{');
        let mut own = self.members.iter().peekable();
        let mut set = set.iter().peekable();
        loop {
            let (key, value) = match (own.peek(), set.peek()) {
                (None, None) => break,
                (Some((k, _)), Some((s, _))) if k.as_str() == **s => {
                    own.next();
                    let (s, v) = set.next().expect("peeked");
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
                    let (s, v) = set.next().expect("peeked");
                    (*s, v.as_str())
                }
            };
            if out.len() > 1 {
                out.push(',');
            }
            // A string's JSON form cannot fail.
            out.push_str(&serde_json::to_string(key).unwrap_or_default());
            out.push(':');
            out.push_str(value);
        }
        out.push('}');
        out
    }
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
