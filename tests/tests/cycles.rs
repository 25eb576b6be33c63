//! Module cycles inside each crate: none (ARCHITECTURE.md, the crate graph).

use std::collections::BTreeMap;
use std::path::Path;

/// A crate's top-level modules and the others each names (`crate::m`, `crate::{m, ..}`,
/// or an item the crate root re-exports from `m`), test modules left out: a module's
/// edges are those of every file under it.
fn module_edges(src: &Path) -> BTreeMap<String, Vec<String>> {
    fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).expect("a source dir") {
            let path = e.expect("an entry").path();
            if path.is_dir() {
                files(&path, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    let mut all = Vec::new();
    files(src, &mut all);
    let reexported = root_reexports(src);
    let mut edges: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for path in all {
        let rel = path.strip_prefix(src).expect("under src");
        let first = rel.components().next().expect("a component");
        let module = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a source file");
        let code = code_of(before_test_module(&text));
        let to = edges.entry(module.clone()).or_default();
        for name in crate_paths(&code) {
            // A module's own name first: a re-exported item may share it.
            let is_module = src.join(format!("{name}.rs")).exists() || src.join(&name).is_dir();
            let m = match reexported.get(&name) {
                Some(m) if !is_module => m.clone(),
                _ => name,
            };
            if m != module && !to.contains(&m) {
                to.push(m);
            }
        }
    }
    edges
}

/// The first name of every path from the crate root in `code`: `a` of `crate::a::b`, and
/// `a`, `b` of `crate::{a::x, b}`.
fn crate_paths(code: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            names.push(ident(rest));
            continue;
        };
        // The group's items at depth 0, each up to its comma.
        let (mut depth, mut item) = (0usize, String::new());
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    names.push(ident(&item));
                    item.clear();
                    continue;
                }
                _ => {}
            }
            if depth == 0 {
                item.push(c);
            }
        }
        names.push(ident(&item));
    }
    names.retain(|n| !n.is_empty() && n != "self");
    names
}

/// The names the crate root (`lib.rs`, `main.rs`) re-exports from a module of its own
/// (`pub use m::{A, B as C};`), each mapped to that module.
fn root_reexports(src: &Path) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for root in ["lib.rs", "main.rs"] {
        let Ok(text) = std::fs::read_to_string(src.join(root)) else {
            continue;
        };
        let code = code_of(&text);
        for statement in code.split(';') {
            let s = statement.trim();
            let Some(at) = s.find("use ").filter(|_| s.starts_with("pub")) else {
                continue;
            };
            let path = s[at + 4..].trim_start();
            let Some((module, rest)) = path.split_once("::") else {
                continue;
            };
            for name in rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if !name.is_empty() && name != "as" && name != "self" {
                    map.insert(name.to_owned(), module.to_owned());
                }
            }
        }
    }
    map
}

/// A file's text up to its inline test module (`#[cfg(test)]` then `mod tests {`); a
/// declared one (`mod oracle;`) is a file of its own, and the text goes on past it.
fn before_test_module(text: &str) -> &str {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let rest = &text[at + line.len()..];
        let next = rest.lines().next().unwrap_or_default().trim();
        if line.trim() == "#[cfg(test)]" && next.starts_with("mod ") && next.ends_with('{') {
            return &text[..at];
        }
        at += line.len();
    }
    text
}

/// A file's code without its comment lines: a doc link (`[`crate::m`]`) names a module
/// for the reader and does not make this one depend on it.
fn code_of(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module cycles of a graph: each strongly connected set of more than one module,
/// its names sorted.
fn module_cycles(edges: &BTreeMap<String, Vec<String>>) -> Vec<Vec<String>> {
    // Two modules are in one cycle when each reaches the other.
    let reach = |from: &str| {
        let mut seen = vec![from.to_owned()];
        let mut todo = vec![from.to_owned()];
        while let Some(m) = todo.pop() {
            for n in edges.get(&m).into_iter().flatten() {
                if edges.contains_key(n) && !seen.contains(n) {
                    seen.push(n.clone());
                    todo.push(n.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, Vec<String>> = edges.keys().map(|m| (m, reach(m))).collect();
    let mut cycles: Vec<Vec<String>> = Vec::new();
    for (m, from_m) in &reached {
        let mut set: Vec<String> = from_m
            .iter()
            .filter(|n| reached[n].contains(m))
            .cloned()
            .collect();
        set.sort();
        if set.len() > 1 && !cycles.contains(&set) {
            cycles.push(set);
        }
    }
    cycles
}

/// No crate's modules form a cycle (the last twelve, in seven crates, were untangled
/// by moving what two modules both needed below them).
#[test]
fn no_crate_has_a_module_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found: Vec<(String, Vec<String>)> = Vec::new();
    for e in std::fs::read_dir(&root).expect("the workspace") {
        let dir = e.expect("an entry").path();
        let src = dir.join("src");
        if !dir.join("Cargo.toml").exists() || !src.is_dir() || dir.ends_with("fuzz") {
            continue;
        }
        let name = dir
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        for c in module_cycles(&module_edges(&src)) {
            found.push((name.clone(), c));
        }
    }
    found.sort();
    assert!(
        found.is_empty(),
        "module cycles (untangle them: move what both modules need below them): {found:?}"
    );
    // The check finds a cycle, and only one.
    let sample: BTreeMap<String, Vec<String>> = [
        ("a".to_owned(), vec!["b".to_owned()]),
        ("b".to_owned(), vec!["a".to_owned(), "c".to_owned()]),
        ("c".to_owned(), vec![]),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        module_cycles(&sample),
        vec![vec!["a".to_owned(), "b".to_owned()]]
    );
}

/// Paths from the crate root are read in every form a `use` or an expression writes.
#[test]
fn the_cycle_check_reads_every_path_from_the_crate_root() {
    let code = "use crate::{a::X, b, c::{D, E}, self};\nlet x = crate::f::g();\nuse crate::Item;";
    assert_eq!(crate_paths(code), vec!["a", "b", "c", "f", "Item"]);
    assert_eq!(code_of("// crate::z\nuse crate::y;"), "use crate::y;");
    let text = "use crate::a;\n#[cfg(test)]\nmod oracle;\nuse crate::b;\n#[cfg(test)]\nmod tests {\n    use crate::c;\n}\n";
    assert_eq!(crate_paths(before_test_module(text)), vec!["a", "b"]);
}
