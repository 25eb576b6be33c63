//! The canonical form of arguments in one pass over their text.
//!
//! The text is read once into a tree that borrows what is already canonical (`true`,
//! `false`, `null`, a string with no escape but the ones serde_json writes) and holds the
//! rest (a number, a string with a `\u` or `\/` escape) canonical in one side buffer;
//! objects are sorted there, and the tree is then written out once. Reading each nesting
//! level's text again, as a reader of raw members would, costs the body's size times its
//! depth.
//!
//! What it refuses, and how it names it, is what docs/FORMAT.md and [`super::Args::parse`]
//! promise, to the byte:
//!
//! * text that is not one JSON value (serde_json's grammar) is refused with serde_json's
//!   own message, asked of serde_json only then;
//! * then, in the order of a walk of the value with each object's keys sorted, the first
//!   of: an object or array at depth [`MAX_ARGS_DEPTH`]; an object's key that does not
//!   decode (serde_json's message for that object's text); a duplicate key in an object
//!   (before anything inside it); a string that does not decode (serde_json's message for
//!   that string's text); an exponent beyond [`super::MAX_EXPONENT`].
//!
//! A problem found inside a value is kept until its object is complete, since a key given
//! twice there, or a member sorted before it, is named first.

use std::borrow::Cow;
use std::ops::Range;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{canonical_number, push_key, write_string, Members, MAX_ARGS_DEPTH};
use crate::error::ArgsError;

/// Canonical JSON text, and where the top-level object's members' values are in it.
pub(crate) struct Canonical {
    /// The canonical text.
    pub(crate) text: String,
    /// Each member of a top-level object, in key order: its key and its value's bytes.
    pub(crate) members: Vec<(String, Range<usize>)>,
    /// If asked for, the value serde_json reads from the canonical text, if it reads one.
    pub(crate) value: Option<Value>,
}

/// Containers serde_json reads nested in one another, at most (its recursion limit).
const SERDE_DEPTH: usize = 127;

/// The canonical form of `text` (one JSON value, whitespace around it allowed), and with
/// `value`, what serde_json would read from it.
pub(crate) fn canonical(text: &str, value: bool) -> Result<Canonical, ArgsError> {
    let mut reader = Reader {
        text,
        bytes: text.as_bytes(),
        at: 0,
        side: Vec::new(),
    };
    let root = match reader.value(0).and_then(|v| reader.end().map(|()| v)) {
        Ok(root) => root,
        Err(Grammar) => return Err(grammar_error(text)),
    };
    let mut out = Vec::with_capacity(text.len());
    let mut members = Vec::new();
    match root {
        Node::Verbatim("null") => return Err(ArgsError::Null),
        Node::Bad(problem) => return Err(problem.error()),
        Node::Object(ref list) => {
            out.push(b'{');
            for (i, (key, value)) in list.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_key(key, &mut out);
                out.push(b':');
                let start = out.len();
                reader.write(value, &mut out);
                members.push((key.key.to_string(), start..out.len()));
            }
            out.push(b'}');
        }
        ref other => reader.write(other, &mut out),
    }
    // Every byte written came from the text (UTF-8) or is ASCII.
    let text = String::from_utf8(out).map_err(|_| ArgsError::Json {
        path: "args".into(),
        message: "not UTF-8".into(),
    })?;
    let value = if value {
        reader.to_value(root, 0)
    } else {
        None
    };
    Ok(Canonical {
        text,
        members,
        value,
    })
}

/// serde_json's message for text it refuses; the reader refuses exactly what it does.
fn grammar_error(text: &str) -> ArgsError {
    let message = match serde_json::from_str::<&RawValue>(text) {
        Err(e) => e.to_string(),
        Ok(_) => "not JSON tally can read".into(),
    };
    ArgsError::Json {
        path: "args".into(),
        message,
    }
}

/// The text is not one JSON value: serde_json names where.
struct Grammar;

/// A value as read: canonical pieces, or the first problem inside it.
enum Node<'a> {
    /// Text that is already canonical.
    Verbatim(&'a str),
    /// A number: its canonical text in the side buffer.
    Number(Range<usize>),
    /// A string whose escapes are all ones serde_json writes (`\" \\ \b \f \n \r \t`):
    /// its text is canonical.
    Short(&'a str),
    /// A string with another escape: decoded, and its canonical text in the side buffer.
    Escaped(String, Range<usize>),
    Array(Vec<Node<'a>>),
    /// Members sorted by key, each key once.
    Object(Vec<(Key<'a>, Node<'a>)>),
    Bad(Problem),
}

/// The escapes in a string's text, from none to ones serde_json does not write.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Escapes {
    None,
    /// Only `\" \\ \b \f \n \r \t`, which serde_json writes as they are.
    Short,
    /// `\/` or `\u`.
    Other,
}

/// A string's text with only short escapes, decoded.
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        out.push(match rest.as_bytes().get(i + 1) {
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'"') => '"',
            _ => '\\',
        });
        rest = rest.get(i + 2..).unwrap_or_default();
    }
    out.push_str(rest);
    out
}

/// An object's key: decoded, and whether its text had an escape.
struct Key<'a> {
    key: Cow<'a, str>,
    escaped: bool,
}

/// A problem inside a value, with the way to it from that value (innermost first).
struct Problem {
    back: Vec<Step>,
    what: What,
}

enum Step {
    Key(String),
    Index(usize),
}

enum What {
    TooDeep,
    Duplicate(String),
    Exponent,
    Json(String),
}

impl Problem {
    fn here(what: What) -> Problem {
        Problem {
            back: Vec::new(),
            what,
        }
    }

    fn error(self) -> ArgsError {
        let mut path = String::from("args");
        for step in self.back.iter().rev() {
            match step {
                Step::Key(k) => push_key(&mut path, k),
                Step::Index(i) => path.push_str(&format!("[{i}]")),
            }
        }
        match self.what {
            What::TooDeep => ArgsError::TooDeep {
                path,
                max: MAX_ARGS_DEPTH,
            },
            What::Duplicate(key) => ArgsError::DuplicateKey { path, key },
            What::Exponent => ArgsError::ExponentOutOfRange {
                path,
                max: super::MAX_EXPONENT,
            },
            What::Json(message) => ArgsError::Json { path, message },
        }
    }
}

struct Reader<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
    /// Canonical numbers and decoded strings, written once.
    side: Vec<u8>,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn space(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), Grammar> {
        self.space();
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(Grammar)
        }
    }

    /// Only whitespace after the value.
    fn end(&mut self) -> Result<(), Grammar> {
        self.space();
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(Grammar)
        }
    }

    /// The value at the cursor (after whitespace), `depth` arrays and objects in.
    fn value(&mut self, depth: usize) -> Result<Node<'a>, Grammar> {
        self.space();
        let start = self.at;
        match self.peek().ok_or(Grammar)? {
            b'{' | b'[' if depth >= MAX_ARGS_DEPTH => {
                self.skip_value()?;
                Ok(Node::Bad(Problem::here(What::TooDeep)))
            }
            b'{' => self.object(depth),
            b'[' => self.array(depth),
            b'"' => {
                let escapes = self.string()?;
                let raw = &self.text[start..self.at];
                match escapes {
                    // No quote, backslash or control inside but as serde_json writes them.
                    Escapes::None => return Ok(Node::Verbatim(raw)),
                    Escapes::Short => return Ok(Node::Short(raw)),
                    Escapes::Other => {}
                }
                match serde_json::from_str::<String>(raw) {
                    Ok(s) => {
                        let from = self.side.len();
                        write_string(&s, &mut self.side);
                        Ok(Node::Escaped(s, from..self.side.len()))
                    }
                    Err(e) => Ok(Node::Bad(Problem::here(What::Json(e.to_string())))),
                }
            }
            b't' => self.literal("true"),
            b'f' => self.literal("false"),
            b'n' => self.literal("null"),
            b'-' | b'0'..=b'9' => {
                self.number()?;
                let raw = &self.text[start..self.at];
                let from = self.side.len();
                match canonical_number(raw, &mut self.side) {
                    Some(()) => Ok(Node::Number(from..self.side.len())),
                    None => Ok(Node::Bad(Problem::here(What::Exponent))),
                }
            }
            _ => Err(Grammar),
        }
    }

    fn literal(&mut self, word: &'static str) -> Result<Node<'a>, Grammar> {
        if self.bytes[self.at..].starts_with(word.as_bytes()) {
            self.at += word.len();
            Ok(Node::Verbatim(word))
        } else {
            Err(Grammar)
        }
    }

    fn array(&mut self, depth: usize) -> Result<Node<'a>, Grammar> {
        self.at += 1;
        let mut items = Vec::new();
        self.space();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(Node::Array(items));
        }
        loop {
            items.push(self.value(depth + 1)?);
            self.space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    break;
                }
                _ => return Err(Grammar),
            }
        }
        if let Some(i) = items.iter().position(|n| matches!(n, Node::Bad(_))) {
            if let Node::Bad(mut p) = items.swap_remove(i) {
                p.back.push(Step::Index(i));
                return Ok(Node::Bad(p));
            }
        }
        Ok(Node::Array(items))
    }

    fn object(&mut self, depth: usize) -> Result<Node<'a>, Grammar> {
        let start = self.at;
        self.at += 1;
        let mut members: Vec<(Key<'a>, Node<'a>)> = Vec::new();
        let mut undecodable = false;
        self.space();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(Node::Object(members));
        }
        loop {
            self.space();
            let from = self.at;
            if self.peek() != Some(b'"') {
                return Err(Grammar);
            }
            let escaped = self.string()? != Escapes::None;
            let raw = &self.text[from..self.at];
            let key = if escaped {
                match serde_json::from_str::<String>(raw) {
                    Ok(s) => Cow::Owned(s),
                    Err(_) => {
                        undecodable = true;
                        Cow::Borrowed("")
                    }
                }
            } else {
                Cow::Borrowed(&raw[1..raw.len() - 1])
            };
            self.expect(b':')?;
            let value = self.value(depth + 1)?;
            members.push((Key { key, escaped }, value));
            self.space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    break;
                }
                _ => return Err(Grammar),
            }
        }
        if undecodable {
            // serde_json names the key that does not decode, in the object's own text.
            let message = match serde_json::from_str::<Members>(&self.text[start..self.at]) {
                Err(e) => e.to_string(),
                Ok(_) => "a key that does not decode".into(),
            };
            return Ok(Node::Bad(Problem::here(What::Json(message))));
        }
        members.sort_by(|a, b| a.0.key.as_bytes().cmp(b.0.key.as_bytes()));
        if let Some(w) = members.windows(2).find(|w| w[0].0.key == w[1].0.key) {
            return Ok(Node::Bad(Problem::here(What::Duplicate(
                w[0].0.key.to_string(),
            ))));
        }
        if let Some(i) = members.iter().position(|m| matches!(m.1, Node::Bad(_))) {
            if let (key, Node::Bad(mut p)) = members.swap_remove(i) {
                p.back.push(Step::Key(key.key.into_owned()));
                return Ok(Node::Bad(p));
            }
        }
        Ok(Node::Object(members))
    }

    /// A string at the cursor (its opening quote), checked as serde_json checks it; the
    /// cursor ends after its closing quote. Which escapes it has.
    fn string(&mut self) -> Result<Escapes, Grammar> {
        self.at += 1;
        let mut escapes = Escapes::None;
        loop {
            self.at = plain_run(self.bytes, self.at);
            match self.peek().ok_or(Grammar)? {
                b'"' => {
                    self.at += 1;
                    return Ok(escapes);
                }
                b'\\' => {
                    escapes = escapes.max(Escapes::Short);
                    match self.bytes.get(self.at + 1).ok_or(Grammar)? {
                        b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't' => self.at += 2,
                        b'/' => {
                            escapes = Escapes::Other;
                            self.at += 2;
                        }
                        b'u' => {
                            escapes = Escapes::Other;
                            let hex = self.bytes.get(self.at + 2..self.at + 6).ok_or(Grammar)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return Err(Grammar);
                            }
                            self.at += 6;
                        }
                        _ => return Err(Grammar),
                    }
                }
                _ => return Err(Grammar),
            }
        }
    }

    /// A number at the cursor, by RFC 8259's grammar.
    fn number(&mut self) -> Result<(), Grammar> {
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.at += 1;
                if self.peek().is_some_and(|b| b.is_ascii_digit()) {
                    return Err(Grammar);
                }
            }
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(Grammar),
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if !self.peek().is_some_and(|b| b.is_ascii_digit()) {
                return Err(Grammar);
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if !self.peek().is_some_and(|b| b.is_ascii_digit()) {
                return Err(Grammar);
            }
            self.digits();
        }
        Ok(())
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
    }

    /// Check a value too deep to read, without a stack frame per level.
    fn skip_value(&mut self) -> Result<(), Grammar> {
        let mut open: Vec<u8> = Vec::new();
        loop {
            self.space();
            match self.peek().ok_or(Grammar)? {
                b'[' => {
                    self.at += 1;
                    self.space();
                    if self.peek() == Some(b']') {
                        self.at += 1;
                    } else {
                        open.push(b']');
                        continue;
                    }
                }
                b'{' => {
                    self.at += 1;
                    self.space();
                    if self.peek() == Some(b'}') {
                        self.at += 1;
                    } else {
                        self.member_key()?;
                        open.push(b'}');
                        continue;
                    }
                }
                b'"' => {
                    self.string()?;
                }
                b't' => {
                    self.literal("true")?;
                }
                b'f' => {
                    self.literal("false")?;
                }
                b'n' => {
                    self.literal("null")?;
                }
                b'-' | b'0'..=b'9' => self.number()?,
                _ => return Err(Grammar),
            }
            // A value ended: close what it ends, or go on to the next one.
            loop {
                let Some(&close) = open.last() else {
                    return Ok(());
                };
                self.space();
                match self.peek() {
                    Some(b',') => {
                        self.at += 1;
                        if close == b'}' {
                            self.member_key()?;
                        }
                        break;
                    }
                    Some(b) if b == close => {
                        self.at += 1;
                        open.pop();
                    }
                    _ => return Err(Grammar),
                }
            }
        }
    }

    /// `"key":` at the cursor (after whitespace).
    fn member_key(&mut self) -> Result<(), Grammar> {
        self.space();
        if self.peek() != Some(b'"') {
            return Err(Grammar);
        }
        self.string()?;
        self.expect(b':')
    }

    /// What serde_json reads from `node`'s canonical text, `depth` containers in: `None`
    /// where it reads nothing (nesting past its limit, a number beyond an `f64`).
    fn to_value(&self, node: Node<'a>, depth: usize) -> Option<Value> {
        Some(match node {
            Node::Verbatim("true") => Value::Bool(true),
            Node::Verbatim("false") => Value::Bool(false),
            Node::Verbatim("null") => Value::Null,
            Node::Verbatim(t) => Value::String(t[1..t.len() - 1].to_owned()),
            Node::Escaped(s, _) => Value::String(s),
            Node::Short(t) => Value::String(unescape(&t[1..t.len() - 1])),
            Node::Number(r) => number_value(std::str::from_utf8(&self.side[r]).ok()?)?,
            Node::Array(items) if depth < SERDE_DEPTH => Value::Array(
                items
                    .into_iter()
                    .map(|item| self.to_value(item, depth + 1))
                    .collect::<Option<Vec<_>>>()?,
            ),
            Node::Object(members) if depth < SERDE_DEPTH => {
                let mut map = Map::new();
                for (key, value) in members {
                    map.insert(key.key.into_owned(), self.to_value(value, depth + 1)?);
                }
                Value::Object(map)
            }
            Node::Array(_) | Node::Object(_) | Node::Bad(_) => return None,
        })
    }

    fn write(&self, node: &Node<'a>, out: &mut Vec<u8>) {
        match node {
            Node::Verbatim(t) | Node::Short(t) => out.extend_from_slice(t.as_bytes()),
            Node::Number(r) | Node::Escaped(_, r) => out.extend_from_slice(&self.side[r.clone()]),
            Node::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    self.write(item, out);
                }
                out.push(b']');
            }
            Node::Object(members) => {
                out.push(b'{');
                for (i, (key, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_key(key, out);
                    out.push(b':');
                    self.write(value, out);
                }
                out.push(b'}');
            }
            // A tree with a problem is never written.
            Node::Bad(_) => {}
        }
    }
}

/// A canonical number as serde_json reads it: a `u64`, an `i64`, else an `f64` (none past
/// its range).
fn number_value(text: &str) -> Option<Value> {
    if !text.contains(['.', 'e']) {
        if let Ok(n) = text.parse::<u64>() {
            return Some(Value::from(n));
        }
        if let Ok(n) = text.parse::<i64>() {
            return Some(Value::from(n));
        }
    }
    serde_json::from_str(text).ok()
}

fn write_key(key: &Key<'_>, out: &mut Vec<u8>) {
    if key.escaped {
        write_string(&key.key, out);
    } else {
        // No escape in its text: nothing in it to escape.
        out.push(b'"');
        out.extend_from_slice(key.key.as_bytes());
        out.push(b'"');
    }
}

/// The end of the run of bytes from `at` that a string holds as they are (not a quote, a
/// backslash or a control character), eight at a time.
fn plain_run(bytes: &[u8], mut at: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = ONES << 7;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let c = u64::from_le_bytes(word);
        let control = c.wrapping_sub(ONES * 0x20) & !c;
        let q = c ^ (ONES * u64::from(b'"'));
        let quote = q.wrapping_sub(ONES) & !q;
        let b = c ^ (ONES * u64::from(b'\\'));
        let backslash = b.wrapping_sub(ONES) & !b;
        let hit = (control | quote | backslash) & HIGH;
        if hit != 0 {
            return at + (hit.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    while let Some(&c) = bytes.get(at) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            break;
        }
        at += 1;
    }
    at
}
