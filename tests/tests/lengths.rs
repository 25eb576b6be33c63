//! A function is one step: none in a crate's sources runs over [`BOUND`] lines unless a
//! `// Long:` comment above it says why, or it is one of the known long ones
//! ([`KNOWN_LONG`]), which may only shrink (CONTRIBUTING.md, style).

use std::path::{Path, PathBuf};

/// The most lines a function may span, from its `fn` line to its closing brace.
const BOUND: usize = 80;

/// Functions over the bound, not yet split, as (file under the workspace, name). The
/// list may only shrink: a new long function without a reason fails
/// [`every_long_function_says_why`], and so does a listed one that was split or is gone
/// (take it off).
const KNOWN_LONG: &[(&str, &str)] = &[];

/// A long function's reason: a comment line above it (among its docs and attributes)
/// that starts with this and says why the steps stay together.
const REASON: &str = "// Long: ";

/// One function over the bound.
#[derive(Debug, PartialEq)]
struct Long {
    file: String,
    name: String,
    line: usize,
    lines: usize,
    reason: bool,
}

/// The `.rs` files under `dir`, but not a `tests` directory inside it.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("a source dir") {
        let path = e.expect("an entry").path();
        if path.is_dir() {
            if !path.ends_with("tests") {
                sources(&path, out);
            }
        } else if path.extension().is_some_and(|x| x == "rs") && !path.ends_with("tests.rs") {
            out.push(path);
        }
    }
}

/// The name a line declares a function by (`pub(crate) async fn name(`), if it does.
fn declares(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    for word in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(word).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(&rest[..end])
}

/// Whether the comment and attribute lines just above line `at` hold a reason.
fn says_why(lines: &[&str], at: usize) -> bool {
    lines[..at]
        .iter()
        .rev()
        .map(|l| l.trim_start())
        .take_while(|l| l.starts_with("//") || l.starts_with("#["))
        .any(|l| l.starts_with(REASON) && l.len() > REASON.len() + 20)
}

/// The functions of one file, up to its test module, that span more than [`BOUND`]
/// lines. The body ends at the first `}` at the `fn` line's indentation (rustfmt's
/// layout); a declaration without a body (`;`) is skipped.
fn long_functions(file: &str, text: &str) -> Vec<Long> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        // An inline test module ends the code; `mod oracle;` only declares a file.
        let test_module = line.trim() == "#[cfg(test)]"
            && lines
                .get(i + 1)
                .is_some_and(|l| l.trim_start().starts_with("mod ") && l.trim_end().ends_with('{'));
        if test_module {
            break;
        }
        let Some(name) = declares(line) else { continue };
        let indent = line.len() - line.trim_start().len();
        let close = " ".repeat(indent) + "}";
        let Some(open) = (i..lines.len()).find(|&j| {
            let l = lines[j].trim_end();
            l.ends_with('{') || l.ends_with(';')
        }) else {
            continue;
        };
        if lines[open].trim_end().ends_with(';') {
            continue;
        }
        let Some(end) = (open + 1..lines.len()).find(|&j| lines[j].starts_with(&close)) else {
            continue;
        };
        let span = end - i + 1;
        if span > BOUND {
            found.push(Long {
                file: file.to_owned(),
                name: name.to_owned(),
                line: i + 1,
                lines: span,
                reason: says_why(&lines, i),
            });
        }
    }
    found
}

/// The files `path` declares as test modules (`#[cfg(test)]` then `mod name;`): an
/// oracle or a fixture kept beside the code it tests.
fn test_modules_of(path: &Path, text: &str) -> Vec<PathBuf> {
    let dir = match path.file_name().and_then(|n| n.to_str()) {
        Some("lib.rs" | "main.rs" | "mod.rs") => path.parent().expect("a dir").to_path_buf(),
        _ => path.with_extension(""),
    };
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[0].trim() == "#[cfg(test)]")
        .filter_map(|w| w[1].trim().strip_prefix("mod ")?.strip_suffix(';'))
        .flat_map(|name| {
            [
                dir.join(format!("{name}.rs")),
                dir.join(name).join("mod.rs"),
            ]
        })
        .collect()
}

/// Every long function in the workspace's crates (their `src/`, fuzz targets aside).
fn workspace_long_functions() -> Vec<Long> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for e in std::fs::read_dir(&root).expect("the workspace") {
        let dir = e.expect("an entry").path();
        let src = dir.join("src");
        if dir.join("Cargo.toml").exists() && src.is_dir() && !dir.ends_with("fuzz") {
            sources(&src, &mut files);
        }
    }
    files.sort();
    let texts: Vec<(PathBuf, String)> = files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("a source file");
            (p, text)
        })
        .collect();
    let tests: Vec<PathBuf> = texts
        .iter()
        .flat_map(|(p, t)| test_modules_of(p, t))
        .collect();
    let mut found = Vec::new();
    for (path, text) in texts {
        if tests.contains(&path) {
            continue;
        }
        let rel = path.strip_prefix(&root).expect("under the workspace");
        found.extend(long_functions(&rel.to_string_lossy(), &text));
    }
    found
}

/// No function runs over the bound without a reason, beyond the known ones; and every
/// known one is still long (a split one comes off the list).
#[test]
fn every_long_function_says_why() {
    let found = workspace_long_functions();
    let unexplained: Vec<&Long> = found
        .iter()
        .filter(|l| !l.reason && !KNOWN_LONG.contains(&(l.file.as_str(), l.name.as_str())))
        .collect();
    let gone: Vec<&(&str, &str)> = KNOWN_LONG
        .iter()
        .filter(|(f, n)| {
            !found
                .iter()
                .any(|l| !l.reason && l.file == *f && l.name == *n)
        })
        .collect();
    let listed: Vec<String> = unexplained
        .iter()
        .map(|l| format!("{}:{}: fn {} ({} lines)", l.file, l.line, l.name, l.lines))
        .collect();
    assert!(
        unexplained.is_empty() && gone.is_empty(),
        "functions over {BOUND} lines with no `{REASON}` comment (split them by step, or say why):\n{}\nlisted in KNOWN_LONG but no longer long (take them off): {gone:?}",
        listed.join("\n")
    );
}

/// The reader finds a long function, its reason, and skips declarations and test code.
#[test]
fn the_length_check_reads_functions_as_rustfmt_lays_them_out() {
    let body = "    let x = 1;\n".repeat(BOUND);
    let text = format!(
        "pub trait T {{\n    fn declared(&self);\n}}\n\
         pub(crate) fn long(a: u8) -> u8 {{\n{body}    a\n}}\n\
         // Long: one table of every field's check, read top to bottom.\n\
         fn explained() {{\n{body}}}\n\
         fn short() {{\n    if true {{\n    }}\n}}\n\
         #[cfg(test)]\nmod tests {{\n    fn in_tests() {{\n{body}    }}\n}}\n"
    );
    let found = long_functions("x.rs", &text);
    let names: Vec<(&str, bool)> = found.iter().map(|l| (l.name.as_str(), l.reason)).collect();
    assert_eq!(names, vec![("long", false), ("explained", true)]);
    assert_eq!(found[0].lines, BOUND + 3);
}
