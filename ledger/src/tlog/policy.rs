//! C2SP tlog-policy (c2sp.org/tlog-policy): the logs and witnesses a verifier knows, and
//! the quorum of witnesses whose cosignatures make a checkpoint count.
//!
//! ```text
//! log tally/7f3a...+1c2d3e4f+AQ...            # the ledger's log key (tally checkpoint --vkey)
//! witness w1 example.org/w1+5a6b7c8d+BA... http://127.0.0.1:7001
//! witness w2 example.net/w2+01020304+BA... http://127.0.0.1:7002
//! group both all w1 w2
//! quorum both
//! ```
//!
//! Parsed strictly: known keywords only, names defined before they are used, no member
//! twice in a group, `1 <= k <= n`, no key listed twice, exactly one quorum line, and
//! only tab, newline and printable bytes.

use std::collections::{BTreeMap, BTreeSet};

use super::note::{Vkey, TYPE_COSIGNATURE, TYPE_ED25519};
use crate::format::parse_decimal;

/// A policy that does not parse: the line and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("witness policy line {line}: {why}")]
pub struct PolicyError {
    /// The 1-based line number (0: the whole file).
    pub line: usize,
    /// What is wrong.
    pub why: String,
}

/// A witness of the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Witness {
    /// Its name in the policy.
    pub name: String,
    /// Its cosigning key.
    pub vkey: Vkey,
    /// Its submission (and monitoring) prefix, if given.
    pub url: Option<String>,
}

/// A log of the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Log {
    /// Its key (the key name is its origin).
    pub vkey: Vkey,
    /// Its URL, if given.
    pub url: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Member {
    Witness(usize),
    Group(usize),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Group {
    k: usize,
    members: Vec<Member>,
}

/// A parsed policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The logs, in file order.
    pub logs: Vec<Log>,
    /// The witnesses, in file order.
    pub witnesses: Vec<Witness>,
    groups: Vec<Group>,
    /// `None` for `quorum none`.
    quorum: Option<Member>,
}

/// Most logs, witnesses and groups a policy may name (the spec asks for at least 32).
pub const MAX_ITEMS: usize = 256;

impl Policy {
    /// Parse a policy file.
    pub fn parse(bytes: &[u8]) -> Result<Policy, PolicyError> {
        if let Some(i) = bytes
            .iter()
            .position(|&b| b != b'\t' && b != b'\n' && (b < 0x20 || b == 0x7f))
        {
            let line = bytes[..i].iter().filter(|&&b| b == b'\n').count() + 1;
            return Err(err(line, format!("control byte {:#04x}", bytes[i])));
        }
        // Names are opaque bytes; vkeys and URLs must be UTF-8 (they are ASCII in practice).
        let text = String::from_utf8_lossy(bytes);
        let mut parser = Parser::default();
        for (i, raw) in text.split('\n').enumerate() {
            let words: Vec<&str> = raw.split([' ', '\t']).filter(|w| !w.is_empty()).collect();
            parser.line(i + 1, &words)?;
        }
        if !parser.quorum_seen {
            return Err(err(0, "no quorum line".into()));
        }
        Ok(parser.policy)
    }

    /// Whether the witnesses at the indexes `cosigned` (into [`Policy::witnesses`]) make
    /// the quorum.
    pub fn quorum_met(&self, cosigned: &BTreeSet<usize>) -> bool {
        match &self.quorum {
            None => true,
            Some(m) => self.met(m, cosigned, 0),
        }
    }

    /// Whether the policy asks for no cosignature at all (`quorum none`).
    pub fn quorum_none(&self) -> bool {
        self.quorum.is_none()
    }

    fn met(&self, m: &Member, cosigned: &BTreeSet<usize>, depth: usize) -> bool {
        match m {
            Member::Witness(i) => cosigned.contains(i),
            // Groups only name earlier groups, so recursion ends; depth is a backstop.
            Member::Group(g) if depth < MAX_ITEMS => {
                let g = &self.groups[*g];
                g.members
                    .iter()
                    .filter(|m| self.met(m, cosigned, depth + 1))
                    .count()
                    >= g.k
            }
            Member::Group(_) => false,
        }
    }

    /// The log whose key name is `origin`.
    pub fn log(&self, origin: &str) -> Option<&Log> {
        self.logs.iter().find(|l| l.vkey.name == origin)
    }
}

/// An error on line `line` (1-based; 0 for the file as a whole).
fn err(line: usize, why: String) -> PolicyError {
    PolicyError { line, why }
}

/// A policy read line by line: what the lines above defined.
struct Parser {
    policy: Policy,
    names: BTreeMap<String, Member>,
    keys: BTreeSet<[u8; 32]>,
    quorum_seen: bool,
}

impl Default for Parser {
    fn default() -> Parser {
        Parser {
            policy: Policy {
                logs: Vec::new(),
                witnesses: Vec::new(),
                groups: Vec::new(),
                quorum: None,
            },
            names: BTreeMap::new(),
            keys: BTreeSet::new(),
            quorum_seen: false,
        }
    }
}

impl Parser {
    /// One line, its words split on spaces and tabs.
    fn line(&mut self, n: usize, words: &[&str]) -> Result<(), PolicyError> {
        let Some(&first) = words.first() else {
            return Ok(());
        };
        if first.starts_with('#') {
            return Ok(());
        }
        let p = &self.policy;
        if p.logs.len() + p.witnesses.len() + p.groups.len() > MAX_ITEMS {
            return Err(err(
                n,
                format!("more than {MAX_ITEMS} logs, witnesses and groups"),
            ));
        }
        match first {
            "log" => self.log(n, words),
            "witness" => self.witness(n, words),
            "group" => self.group(n, words),
            "quorum" => self.quorum(n, words),
            other => Err(err(n, format!("unknown keyword {other:?}"))),
        }
    }

    /// `log <vkey> [<url>]`.
    fn log(&mut self, n: usize, words: &[&str]) -> Result<(), PolicyError> {
        if !(2..=3).contains(&words.len()) {
            return Err(err(n, "expected `log <vkey> [<url>]`".into()));
        }
        let v = self.fresh_key(n, words[1], TYPE_ED25519, "log")?;
        self.policy.logs.push(Log {
            vkey: v,
            url: words.get(2).map(|s| s.to_string()),
        });
        Ok(())
    }

    /// `witness <name> <vkey> [<url>]`.
    fn witness(&mut self, n: usize, words: &[&str]) -> Result<(), PolicyError> {
        if !(3..=4).contains(&words.len()) {
            return Err(err(n, "expected `witness <name> <vkey> [<url>]`".into()));
        }
        let name = self.new_name(n, words[1])?;
        let v = self.fresh_key(n, words[2], TYPE_COSIGNATURE, "witness")?;
        let at = self.policy.witnesses.len();
        self.names.insert(name.into(), Member::Witness(at));
        self.policy.witnesses.push(Witness {
            name: name.into(),
            vkey: v,
            url: words.get(3).map(|s| s.to_string()),
        });
        Ok(())
    }

    /// `group <name> all|any|<k> <name>...`, of names defined above.
    fn group(&mut self, n: usize, words: &[&str]) -> Result<(), PolicyError> {
        if words.len() < 4 {
            return Err(err(
                n,
                "expected `group <name> all|any|<k> <name>...`".into(),
            ));
        }
        let name = self.new_name(n, words[1])?;
        let mut members = Vec::new();
        let mut seen = BTreeSet::new();
        for m in &words[3..] {
            let member = self
                .names
                .get(*m)
                .ok_or_else(|| err(n, format!("{m:?} is not defined above")))?;
            if !seen.insert(*m) {
                return Err(err(n, format!("{m:?} is listed twice")));
            }
            members.push(member.clone());
        }
        let total = members.len();
        let k = match words[2] {
            "all" => total,
            "any" => 1,
            k => parse_decimal(k, "group threshold")
                .ok()
                .and_then(|k| usize::try_from(k).ok())
                .filter(|k| (1..=total).contains(k))
                .ok_or_else(|| err(n, format!("threshold {k:?} is not all, any or 1..={total}")))?,
        };
        let at = self.policy.groups.len();
        self.names.insert(name.into(), Member::Group(at));
        self.policy.groups.push(Group { k, members });
        Ok(())
    }

    /// `quorum <name>` or `quorum none`, once.
    fn quorum(&mut self, n: usize, words: &[&str]) -> Result<(), PolicyError> {
        if words.len() != 2 {
            return Err(err(n, "expected `quorum <name>`".into()));
        }
        if self.quorum_seen {
            return Err(err(n, "a second quorum line".into()));
        }
        self.quorum_seen = true;
        self.policy.quorum = if words[1] == "none" {
            None
        } else {
            Some(
                self.names
                    .get(words[1])
                    .cloned()
                    .ok_or_else(|| err(n, format!("{:?} is not defined above", words[1])))?,
            )
        };
        Ok(())
    }

    /// A name not yet defined, and not `none`.
    fn new_name<'w>(&self, n: usize, name: &'w str) -> Result<&'w str, PolicyError> {
        if name == "none" || self.names.contains_key(name) {
            return Err(err(
                n,
                format!("name {name:?} is reserved or defined twice"),
            ));
        }
        Ok(name)
    }

    /// A vkey of signature type `t`, whose public key no line above listed.
    fn fresh_key(&mut self, n: usize, s: &str, t: u8, what: &str) -> Result<Vkey, PolicyError> {
        let v = Vkey::parse(s).map_err(|e| err(n, e.to_string()))?;
        if v.sig_type != t {
            return Err(err(
                n,
                format!(
                    "a {what} key must be of signature type {t:#04x}, not {:#04x}",
                    v.sig_type
                ),
            ));
        }
        if !self.keys.insert(v.public) {
            return Err(err(n, "this public key is listed twice".into()));
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wkey(name: &str, b: u8) -> String {
        Vkey::new(name, TYPE_COSIGNATURE, [b; 32])
            .unwrap()
            .to_text()
    }

    #[test]
    fn groups_and_quorum() {
        let text = format!(
            "# two of three, and any of one\nwitness X1 {}\nwitness X2 {}\nwitness X3 {}\ngroup X 2 X1 X2 X3\n\twitness Y1 {} http://y\ngroup Y any Y1\ngroup XY all X Y\nquorum XY\n",
            wkey("x1", 1),
            wkey("x2", 2),
            wkey("x3", 3),
            wkey("y1", 4)
        );
        let p = Policy::parse(text.as_bytes()).unwrap();
        let set = |v: &[usize]| v.iter().copied().collect::<BTreeSet<_>>();
        assert!(!p.quorum_met(&set(&[0, 1])));
        assert!(p.quorum_met(&set(&[0, 1, 3])));
        assert!(!p.quorum_met(&set(&[0, 3])));
        assert_eq!(p.witnesses[3].url.as_deref(), Some("http://y"));
    }

    #[test]
    fn refusals() {
        let w = wkey("x1", 1);
        for bad in [
            format!("witness a {w}\n"),                          // no quorum
            format!("witness a {w}\nquorum b\n"),                // undefined
            format!("witness a {w}\nwitness b {w}\nquorum a\n"), // same key twice
            format!("witness a {w}\ngroup g 2 a\nquorum g\n"),   // k > n
            format!("witness a {w}\ngroup g 1 a a\nquorum g\n"), // member twice
            format!("witness a {w}\nquorum a\nquorum a\n"),      // two quorums
            format!("witnes a {w}\nquorum a\n"),                 // unknown keyword
            format!("witness none {w}\nquorum none\n"),          // reserved
            format!("witness a {w}\x0b\nquorum a\n"),            // control byte
            format!("log {w}\nquorum none\n"),                   // cosigner key as log key
        ] {
            assert!(Policy::parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert!(Policy::parse(b"quorum none\n").unwrap().quorum_none());
    }
}
