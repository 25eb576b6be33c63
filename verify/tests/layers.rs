//! The analysis modules depend on each other one way only (analysis/mod.rs's doc says
//! which): each names, in code, only modules below it. The cycles there once were
//! (handoff <-> run, run and render -> the analysis root) fail here.

use std::path::Path;

/// Bottom first; `mod.rs` (the root, which ties them together) is above them all.
const LAYERS: &[&str] = &[
    "names", "findings", "loops", "handoff", "report", "run", "refill", "leases", "render",
];

/// The sibling modules a file under `analysis/` names outside comments (`super::X` from a
/// top-level file, `super::super::X` or `crate::analysis::X` from anywhere).
fn named(text: &str, nested: bool) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let prefixes: &[&str] = if nested {
            &["super::super::", "crate::analysis::"]
        } else {
            &["super::", "crate::analysis::"]
        };
        for prefix in prefixes {
            let mut rest = code;
            while let Some(at) = rest.find(prefix) {
                rest = &rest[at + prefix.len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                // `super::super::x` is found once as `super::super::`, not also as `super::`.
                if name != "super" {
                    out.push(if rest[name.len()..].starts_with("::") {
                        name
                    } else {
                        // An item of the root itself (`crate::analysis::MAX`).
                        "mod".to_owned()
                    });
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn each_analysis_module_names_only_modules_below_it() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/analysis");
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut wrong = Vec::new();
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("analysis") {
        let path = entry.expect("entry").path();
        let (module, files): (String, Vec<(std::path::PathBuf, bool)>) = if path.is_dir() {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let files = std::fs::read_dir(&path)
                .expect("dir")
                .map(|e| e.expect("entry").path())
                .map(|p| {
                    let nested = p.file_name().is_some_and(|n| n != "mod.rs");
                    (p, nested)
                })
                .collect();
            (name, files)
        } else {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if name == "mod" {
                continue;
            }
            (name, vec![(path, false)])
        };
        let own = rank(&module).unwrap_or_else(|| panic!("analysis/{module}: not in LAYERS"));
        for (file, nested) in files {
            seen += 1;
            let text = std::fs::read_to_string(&file).expect("read");
            for n in named(&text, nested) {
                if n == module && !nested {
                    continue;
                }
                match rank(&n) {
                    Some(r) if r < own => {}
                    // A nested file naming its own module's siblings through `super::`
                    // is inside its module, not a dependency.
                    _ if nested && n == module => {}
                    _ => wrong.push(format!("{} -> {n}", file.display())),
                }
            }
        }
    }
    assert!(seen >= LAYERS.len(), "read {seen} files");
    assert!(
        wrong.is_empty(),
        "dependencies pointing up or sideways: {wrong:?}"
    );
}

#[test]
fn the_check_sees_siblings_and_the_root() {
    let top = "use super::loops::{Loop};\nuse super::run::RunAnalysis; // super::x\n";
    assert_eq!(named(top, false), vec!["loops", "run"]);
    let nested = "use super::Job;\nif n >= crate::analysis::MAX_LISTED {}\nuse super::super::handoff::When;\n";
    assert_eq!(named(nested, true), vec!["handoff", "mod"]);
}
