//! A fast reader for the one canonical form a stored decision may take.
//!
//! The stored plaintext of a decision is exactly `serde_json::to_vec` of the sealed
//! decision: fields in declaration order, absent options omitted, no whitespace, strings
//! escaped as serde_json escapes them, integers in plain decimal, `limits` keys in byte
//! order. [`parse`] reads that form and nothing else; it is an accelerator only. When it
//! returns `None` (any deviation at all, including ones that are still valid JSON), the
//! caller falls back to the general strict parse, which either accepts the bytes or names
//! precisely what is wrong. So the reader may refuse too much, never too little: whatever
//! it accepts, the general parse accepts too, with an equal decision (the differential
//! tests in `tests/decisions.rs` hold it to that).

use std::collections::BTreeMap;

use crate::decision::{
    Budget, Channel, Decision, Effect, Kind, Limit, Reason, Scope, Status, Usage, UsageRefused,
};
use crate::LimitKey;

/// Read a canonical stored decision, or `None` if the bytes are not exactly in canonical
/// form. Does not validate the decision against docs/FORMAT.md.
pub(crate) fn parse(bytes: &[u8]) -> Option<Decision> {
    let mut d = Decision::default();
    parse_into(bytes, &mut d)?;
    Some(d)
}

/// [`parse`] into `d`, which must be `Decision::default()`: a decision is about a
/// kilobyte, and one read where it will stay (in a box) is not moved there. On `None`,
/// `d` holds whatever was read before the deviation. Gives the length in bytes of the
/// longest string read (a member's value, a `limits` name), so the caller knows which
/// bounds on texts cannot be exceeded.
pub(crate) fn parse_into(bytes: &[u8], d: &mut Decision) -> Option<usize> {
    // Strings are copied out as they are; the whole text must be UTF-8.
    let text = std::str::from_utf8(bytes).ok()?;
    let mut r = Reader {
        text,
        at: 0,
        next: None,
        longest: 0,
    };
    r.decision(d)?;
    (r.at == bytes.len()).then_some(r.longest)
}

struct Reader<'a> {
    text: &'a str,
    at: usize,
    /// The member name read at `at`, if `at` has been looked at: `key` is asked for each
    /// field in turn at one position, and the name there is read once, not per field.
    next: Option<(usize, Option<Member>)>,
    /// The longest string read so far, in bytes (as decoded).
    longest: usize,
}

/// A member's start as the reader saw it: `[,]"name":`.
#[derive(Clone, Copy)]
struct Member {
    /// Whether a comma leads it.
    comma: bool,
    /// Where its name starts and ends.
    name: (usize, usize),
}

/// Read a decision's optional members into `$d`, each at most once and in declaration
/// order, each with its `$value` reader: each member's name is read once and matched to
/// its field (one jump, not a comparison with every field in turn). A member out of
/// order, repeated or unknown returns `None` from the enclosing function.
macro_rules! members {
    ($reader:ident, $d:ident, $($field:ident => $value:expr,)*) => {
        /// The optional fields, in declaration order.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, PartialEq, PartialOrd)]
        enum Field {
            $($field,)*
        }
        let mut last: Option<Field> = None;
        while let Some(m) = $reader.member().filter(|m| m.comma) {
            let field = match &$reader.text[m.name.0..m.name.1] {
                $(stringify!($field) => Field::$field,)*
                _ => return None,
            };
            if last.is_some_and(|l| l >= field) {
                return None;
            }
            last = Some(field);
            $reader.at = m.name.1 + 2;
            match field {
                $(Field::$field => $d.$field = Some($value),)*
            }
        }
    };
}

impl<'a> Reader<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn eat(&mut self, lit: &[u8]) -> bool {
        if self.bytes()[self.at..].starts_with(lit) {
            self.at += lit.len();
            true
        } else {
            false
        }
    }

    /// `"name":`, preceded by a comma unless it is the object's first member.
    fn key(&mut self, first: &mut bool, name: &str) -> bool {
        let member = match self.next {
            Some((at, member)) if at == self.at => member,
            _ => {
                let member = self.member();
                self.next = Some((self.at, member));
                member
            }
        };
        // A name is letters, digits and underscores: the member's name ends at the first
        // quote after it, so comparing names is comparing `"name":` at this position.
        match member {
            Some(m) if m.comma != *first && &self.text[m.name.0..m.name.1] == name => {
                self.at = m.name.1 + 2;
                *first = false;
                true
            }
            _ => false,
        }
    }

    /// The member that starts here: an optional comma, a quote, a name up to the next
    /// quote, and `":` right after it.
    fn member(&self) -> Option<Member> {
        let bytes = self.bytes();
        let comma = bytes.get(self.at) == Some(&b',');
        let open = self.at + usize::from(comma);
        if bytes.get(open) != Some(&b'"') {
            return None;
        }
        let start = open + 1;
        let end = start + bytes.get(start..)?.iter().position(|&b| b == b'"')?;
        (bytes.get(end + 1) == Some(&b':')).then_some(Member {
            comma,
            name: (start, end),
        })
    }

    /// A JSON string exactly as serde_json writes it: `"` and `\` escaped, control
    /// characters as `\b \t \n \f \r` or else `\u00xx` (lowercase hex), nothing else.
    fn string(&mut self) -> Option<String> {
        if !self.eat(b"\"") {
            return None;
        }
        let bytes = self.bytes();
        // Most strings hold no escape: up to the closing quote, copied in one allocation
        // of their exact length. A backslash or a control character takes the loop below.
        let plain = bytes[self.at..]
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
        if bytes[self.at + plain] == b'"' {
            let out = self.text[self.at..self.at + plain].to_owned();
            self.at += plain + 1;
            self.longest = self.longest.max(out.len());
            return Some(out);
        }
        let mut out = String::with_capacity(plain);
        let mut run = self.at;
        loop {
            let b = *bytes.get(self.at)?;
            match b {
                b'"' => {
                    out.push_str(&self.text[run..self.at]);
                    self.at += 1;
                    self.longest = self.longest.max(out.len());
                    return Some(out);
                }
                b'\\' => {
                    out.push_str(&self.text[run..self.at]);
                    let c = match *bytes.get(self.at + 1)? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'b' => '\u{8}',
                        b't' => '\t',
                        b'n' => '\n',
                        b'f' => '\u{c}',
                        b'r' => '\r',
                        b'u' => {
                            let hex = bytes.get(self.at + 2..self.at + 6)?;
                            if &hex[..2] != b"00" {
                                return None;
                            }
                            let v = lower_hex(hex[2])? << 4 | lower_hex(hex[3])?;
                            // Below 0x20, and not one of the five with a short escape.
                            if v >= 0x20 || matches!(v, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d) {
                                return None;
                            }
                            self.at += 4;
                            char::from(v)
                        }
                        _ => return None,
                    };
                    out.push(c);
                    self.at += 2;
                    run = self.at;
                }
                0..=0x1f => return None,
                _ => self.at += 1,
            }
        }
    }

    /// A u64 in plain decimal: no sign, no leading zero, no fraction or exponent.
    fn u64(&mut self) -> Option<u64> {
        let bytes = self.bytes();
        let start = self.at;
        let mut v: u64 = 0;
        while let Some(d) = bytes.get(self.at).filter(|b| b.is_ascii_digit()) {
            v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
            self.at += 1;
        }
        let len = self.at - start;
        if len == 0 || (len > 1 && bytes[start] == b'0') {
            return None;
        }
        Some(v)
    }

    /// `true` or `false`.
    fn boolean(&mut self) -> Option<bool> {
        if self.eat(b"true") {
            Some(true)
        } else if self.eat(b"false") {
            Some(false)
        } else {
            None
        }
    }

    /// An enum's name: a string of lowercase letters and underscores.
    fn word(&mut self) -> Option<&'a str> {
        if !self.eat(b"\"") {
            return None;
        }
        let start = self.at;
        while self
            .bytes()
            .get(self.at)
            .is_some_and(|b| b.is_ascii_lowercase() || *b == b'_')
        {
            self.at += 1;
        }
        let word = &self.text[start..self.at];
        self.eat(b"\"").then_some(word)
    }

    fn decision(&mut self, d: &mut Decision) -> Option<()> {
        if !self.eat(b"{") {
            return None;
        }
        let mut first = true;
        // `run` and `kind` are always written; the rest only when present.
        if !self.key(&mut first, "run") {
            return None;
        }
        d.run = self.string()?;
        if !self.key(&mut first, "kind") {
            return None;
        }
        d.kind = Some(kind(self.word()?)?);
        // The other members, each at most once and in declaration order.
        members! {
            self, d,
            worker => self.string()?,
            at_ms => self.u64()?,
            goal => self.string()?,
            budget => Box::new(self.budget()?),
            tool => self.string()?,
            operation => self.string()?,
            args_digest => self.string()?,
            args_preview => self.string()?,
            effect => effect(self.word()?)?,
            idempotency_key => self.string()?,
            target => self.string()?,
            channel => channel(self.word()?)?,
            depth => self.u64()?,
            parent => self.string()?,
            reason => reason(self.word()?)?,
            attempt => self.u64()?,
            reserve_cents => self.u64()?,
            reserve_nanos => self.u64()?,
            status => status(self.word()?)?,
            settled_cents => self.u64()?,
            settled_nanos => self.u64()?,
            remote_ref => self.string()?,
            observed => self.string()?,
            retry_after_ms => self.u64()?,
            of => self.u64()?,
            slots => self.u64()?,
            cents => self.u64()?,
            nanos => self.u64()?,
            approver => self.string()?,
            scope => Box::new(self.scope()?),
            digest => self.string()?,
            expires_ms => self.u64()?,
            note => self.string()?,
            limits => self.limits()?,
            policy => self.string()?,
            policy_text => self.string()?,
            uid => u32::try_from(self.u64()?).ok()?,
            credential => self.string()?,
            timeout_ms => self.u64()?,
            grant => self.string()?,
            signature => self.string()?,
            continues => self.string()?,
            state_version => self.u64()?,
            result_digest => self.string()?,
            proxied => self.boolean()?,
            overrun_nanos => self.u64()?,
            usage_refused => usage_refused(self.word()?)?,
            usage => Box::new(self.usage()?),
            operator => self.boolean()?,
            trace_id => self.string()?,
            prev_seq => self.u64()?,
        }
        self.eat(b"}").then_some(())
    }

    fn budget(&mut self) -> Option<Budget> {
        if !self.eat(b"{") {
            return None;
        }
        let mut first = true;
        let mut b = Budget::default();
        macro_rules! opt {
            ($field:ident) => {
                if self.key(&mut first, stringify!($field)) {
                    b.$field = Some(self.u64()?);
                }
            };
        }
        opt!(attempts);
        opt!(deadline_ms);
        opt!(spend_cents);
        opt!(spend_nanos);
        opt!(side_effects);
        opt!(polls);
        opt!(depth);
        self.eat(b"}").then_some(b)
    }

    fn usage(&mut self) -> Option<Usage> {
        if !self.eat(b"{") {
            return None;
        }
        let mut first = true;
        let mut u = Usage::default();
        macro_rules! opt {
            ($field:ident) => {
                if self.key(&mut first, stringify!($field)) {
                    u.$field = Some(self.u64()?);
                }
            };
        }
        opt!(input_tokens);
        opt!(cached_tokens);
        opt!(cache_write_tokens);
        opt!(cache_write_1h_tokens);
        opt!(output_tokens);
        opt!(web_searches);
        self.eat(b"}").then_some(u)
    }

    fn scope(&mut self) -> Option<Scope> {
        if !self.eat(b"{") {
            return None;
        }
        let mut first = true;
        let mut s = Scope::default();
        if self.key(&mut first, "attempts") {
            s.attempts = Some(self.u64()?);
        }
        if self.key(&mut first, "cents") {
            s.cents = Some(self.u64()?);
        }
        if self.key(&mut first, "nanos") {
            s.nanos = Some(self.u64()?);
        }
        if self.key(&mut first, "tool") {
            s.tool = Some(self.string()?);
        }
        if self.key(&mut first, "operation") {
            s.operation = Some(self.string()?);
        }
        if self.key(&mut first, "new_run") {
            s.new_run = Some(self.string()?);
        }
        self.eat(b"}").then_some(s)
    }

    /// `{"name":{"used":n,"limit":n},...}` with names in strictly increasing byte order.
    fn limits(&mut self) -> Option<BTreeMap<LimitKey, Limit>> {
        if !self.eat(b"{") {
            return None;
        }
        let mut limits = BTreeMap::new();
        let mut last: Option<LimitKey> = None;
        if self.eat(b"}") {
            return Some(limits);
        }
        loop {
            let name = LimitKey::from_name(&self.string()?);
            if last.as_ref().is_some_and(|l| *l >= name) {
                return None;
            }
            if !self.eat(b":{\"used\":") {
                return None;
            }
            let used = self.u64()?;
            if !self.eat(b",\"limit\":") {
                return None;
            }
            let limit = self.u64()?;
            if !self.eat(b"}") {
                return None;
            }
            limits.insert(name.clone(), Limit { used, limit });
            last = Some(name);
            if self.eat(b"}") {
                return Some(limits);
            }
            if !self.eat(b",") {
                return None;
            }
        }
    }
}

fn lower_hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

fn kind(w: &str) -> Option<Kind> {
    Kind::ALL.iter().copied().find(|k| k.as_str() == w)
}

fn reason(w: &str) -> Option<Reason> {
    Reason::ALL.iter().copied().find(|r| r.as_str() == w)
}

fn effect(w: &str) -> Option<Effect> {
    Some(match w {
        "read" => Effect::Read,
        "idempotent_write" => Effect::IdempotentWrite,
        "non_idempotent_write" => Effect::NonIdempotentWrite,
        _ => return None,
    })
}

fn status(w: &str) -> Option<Status> {
    Some(match w {
        "ok" => Status::Ok,
        "error" => Status::Error,
        "rejected" => Status::Rejected,
        "timeout" => Status::Timeout,
        "running" => Status::Running,
        "unknown" => Status::Unknown,
        _ => return None,
    })
}

fn usage_refused(w: &str) -> Option<UsageRefused> {
    Some(match w {
        "implausible" => UsageRefused::Implausible,
        "unpriced" => UsageRefused::Unpriced,
        _ => return None,
    })
}

fn channel(w: &str) -> Option<Channel> {
    Some(match w {
        "http" => Channel::Http,
        "ssh" => Channel::Ssh,
        "tool" => Channel::Tool,
        "model" => Channel::Model,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
