//! Agent-supplied text in human output: run names, tools, goals may be crafted to move
//! the cursor or erase lines on a terminal. [`shown`] escapes every control character.

use std::borrow::Cow;

/// `s` with every control character (C0, DEL, C1) and bidi override escaped as `\u{..}`,
/// so that printing it can never drive a terminal.
pub fn shown(s: &str) -> Cow<'_, str> {
    escaped(s, |c| c.is_control() || is_bidi(c))
}

/// A whole report with every control character but its line breaks escaped: the last
/// guard before a terminal, for any agent-supplied text a renderer did not escape itself.
pub fn terminal_safe(report: &str) -> Cow<'_, str> {
    escaped(report, |c| (c.is_control() && c != '\n') || is_bidi(c))
}

pub use tally_record::words::{after_start, duration, is_bidi, plural, rfc3339, utc};

fn escaped(s: &str, bad: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(&bad) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if bad(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(shown("plain run"), "plain run");
        assert_eq!(
            shown("a\r\u{1b}[10A\u{1b}[Jb"),
            "a\\u{d}\\u{1b}[10A\\u{1b}[Jb"
        );
        assert_eq!(shown("x\u{202e}y"), "x\\u{202e}y");
        assert_eq!(shown("x\u{200f}y\u{2028}"), "x\\u{200f}y\\u{2028}");
        assert_eq!(shown("a\nb"), "a\\u{a}b");
    }

    #[test]
    fn a_whole_report_keeps_its_line_breaks() {
        assert_eq!(
            super::terminal_safe("ok\nrun \u{1b}[2J\r\n"),
            "ok\nrun \\u{1b}[2J\\u{d}\n"
        );
    }
}
