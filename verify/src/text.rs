//! Agent-supplied text in human output: run names, tools, goals may be crafted to move
//! the cursor or erase lines on a terminal. [`shown`] escapes every control character.

use std::borrow::Cow;

/// `s` with every control character (C0, DEL, C1) and bidi override escaped as `\u{..}`,
/// so that printing it can never drive a terminal.
pub fn shown(s: &str) -> Cow<'_, str> {
    let bad =
        |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !s.chars().any(bad) {
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
    }
}
