//! Module cycles inside each crate: none beyond the known ones, which may only shrink.

use std::collections::BTreeMap;
use std::path::Path;

/// Module cycles inside a crate that are known and not yet untangled, each as the
/// sorted names of its top-level modules. The list may only shrink: a new cycle fails
/// [`no_crate_grows_a_module_cycle`], and so does a cycle that was untangled and is
/// still listed (take it off).
const KNOWN_CYCLES: &[(&str, &[&str])] = &[
    ("cli", &["commands", "no_walk", "prove", "witness"]),
    ("cli", &["demo", "demo_proxy"]),
    (
        "daemon",
        &["api", "app", "gate_api", "observe", "stage", "tiles"],
    ),
    ("ledger", &["export", "format", "keys", "tlog"]),
    (
        "policy",
        &[
            "apply", "call", "decide", "judge", "limits", "overrun", "refusals", "rules", "start",
            "state",
        ],
    ),
    ("proxy", &["media", "request", "tier"]),
    ("proxy", &["proxy", "stream"]),
    (
        "record",
        &["args", "canonical", "decision", "error", "strict"],
    ),
    ("testkit", &["daemon", "tally"]),
    ("verify", &["analysis", "replay"]),
    ("verify", &["report", "tree"]),
];

/// A crate's top-level modules and the others each names (`crate::m`), test modules
/// left out: a module's edges are those of every file under it.
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
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let to = edges.entry(module.clone()).or_default();
        for (at, _) in code.match_indices("crate::") {
            let m: String = code[at + 7..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !m.is_empty() && m != module && !to.contains(&m) {
                to.push(m);
            }
        }
    }
    edges
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

/// No crate's modules form a cycle beyond [`KNOWN_CYCLES`] (the daemon's `api` and
/// `gate_api` once used each other; the proxy's `forward` and `refuse` did until the
/// pieces both need moved to `refuse`).
#[test]
fn no_crate_grows_a_module_cycle() {
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
    let known: Vec<(String, Vec<String>)> = KNOWN_CYCLES
        .iter()
        .map(|(c, ms)| (c.to_string(), ms.iter().map(|m| m.to_string()).collect()))
        .collect();
    let new: Vec<_> = found.iter().filter(|f| !known.contains(f)).collect();
    let gone: Vec<_> = known.iter().filter(|k| !found.contains(k)).collect();
    assert!(
        new.is_empty() && gone.is_empty(),
        "module cycles not in KNOWN_CYCLES (untangle them): {new:?}\nlisted but gone (take them off): {gone:?}"
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
