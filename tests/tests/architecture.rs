//! The crate graph ARCHITECTURE.md draws, read from `cargo metadata`: every dependency
//! between this workspace's crates points down its layers, no library links clap or
//! anyhow, the daemon links no database, and a client (`tally-api`, `tally-mcp`) links
//! neither the daemon nor a database, nor (through any crate, `cargo tree`) the gate, the
//! ledger or the policy core: only the wire.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Each crate's layer (ARCHITECTURE.md): a crate may depend only on crates of lower
/// layers.
const LAYERS: [(&str, u32); 16] = [
    ("tally-record", 0),
    ("tally-ledger", 1),
    ("tally-policy", 1),
    ("tally-wire", 1),
    ("tally-gate", 2),
    ("tally-verify", 2),
    ("tally-api", 2),
    ("tally-gate-postgres", 3),
    ("tally-proxy", 3),
    ("tally-mcp", 3),
    ("tally-daemon", 4),
    ("tally-testkit", 4),
    ("tally-demos", 5),
    ("tally-cli", 6),
    ("tally-load", 5),
    ("tally-tests", 5),
];

/// Crates that must never be among a crate's (normal) dependencies.
const FORBIDDEN: [(&str, &[&str]); 5] = [
    (
        "tally-proxy",
        &[
            "tally-daemon",
            "tally-gate-postgres",
            "tokio-postgres",
            "axum",
            "clap",
            "anyhow",
        ],
    ),
    (
        "tally-daemon",
        &["tally-gate-postgres", "tokio-postgres", "clap", "anyhow"],
    ),
    (
        "tally-mcp",
        &[
            "tally-daemon",
            "tally-gate-postgres",
            "tokio-postgres",
            "axum",
            "clap",
            "anyhow",
        ],
    ),
    (
        "tally-api",
        &[
            "tally-daemon",
            "tally-gate-postgres",
            "tokio-postgres",
            "axum",
            "clap",
            "anyhow",
        ],
    ),
    (
        "tally-gate",
        &["tally-gate-postgres", "tokio-postgres", "hyper", "axum"],
    ),
];

/// Every package's normal dependencies, by package name.
fn graph() -> BTreeMap<String, Vec<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(&root)
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().expect("a name").to_owned())
                .collect();
            (p["name"].as_str().expect("a name").to_owned(), deps)
        })
        .collect()
}

/// Why each edge of `graph` is wrong, if it is.
fn wrong(graph: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    let layer: BTreeMap<&str, u32> = LAYERS.into_iter().collect();
    let mut wrong = Vec::new();
    for (krate, deps) in graph {
        let Some(&mine) = layer.get(krate.as_str()) else {
            wrong.push(format!(
                "{krate} has no layer in ARCHITECTURE.md (and this test)"
            ));
            continue;
        };
        let library = !["tally-cli", "tally-load", "tally-tests"].contains(&krate.as_str());
        for dep in deps {
            if let Some(&theirs) = layer.get(dep.as_str()) {
                if theirs >= mine {
                    wrong.push(format!(
                        "{krate} (layer {mine}) depends on {dep} (layer {theirs}): dependencies point down"
                    ));
                }
            }
            if library && ["clap", "anyhow"].contains(&dep.as_str()) {
                wrong.push(format!(
                    "{krate} is a library and depends on {dep}: only tally-cli does"
                ));
            }
            for (k, banned) in FORBIDDEN {
                if k == krate && banned.contains(&dep.as_str()) {
                    wrong.push(format!("{krate} must not depend on {dep}"));
                }
            }
        }
    }
    wrong
}

#[test]
fn dependencies_point_the_way_architecture_md_says() {
    let graph = graph();
    assert!(graph.len() >= LAYERS.len(), "{graph:?}");
    let wrong = wrong(&graph);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md"))
            .expect("ARCHITECTURE.md");
    for (krate, _) in LAYERS {
        assert!(
            doc.contains(&format!("`{krate}`")),
            "ARCHITECTURE.md does not name {krate}"
        );
    }
}

/// The check finds what it must: each edge the issue names, added to the real graph.
#[test]
fn a_dependency_the_wrong_way_is_found() {
    for (krate, dep) in [
        ("tally-daemon", "tally-gate-postgres"),
        ("tally-mcp", "tally-daemon"),
        ("tally-mcp", "tokio-postgres"),
        ("tally-verify", "anyhow"),
        ("tally-policy", "clap"),
        ("tally-ledger", "tally-gate"),
    ] {
        let mut graph = graph();
        graph
            .get_mut(krate)
            .expect("the crate")
            .push(dep.to_owned());
        let found = wrong(&graph);
        assert!(
            found.iter().any(|w| w.contains(krate) && w.contains(dep)),
            "{krate} -> {dep} not found: {found:?}"
        );
    }
}

/// Crates a client must not link, through any crate: what `cargo tree -e normal` lists.
const NOT_IN_A_CLIENT: [&str; 5] = [
    "tally-gate",
    "tally-ledger",
    "tally-policy",
    "sled",
    "tokio-postgres",
];

/// The packages `krate` links (its normal dependencies, transitively, for this host), as
/// `cargo tree` resolves them.
fn linked(krate: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "-p", krate, "-e", "normal", "--offline"])
        .args(["--prefix", "none", "--format", "{p}"])
        .current_dir(&root)
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// What of [`NOT_IN_A_CLIENT`] a client's linked packages hold.
fn banned_in_a_client(linked: &[String]) -> Vec<&'static str> {
    NOT_IN_A_CLIENT
        .into_iter()
        .filter(|b| linked.iter().any(|l| l == b))
        .collect()
}

/// A client speaks the wire (`tally-wire`, over `tally-record`) and links no gate, no
/// ledger, no policy core and no database, through any crate.
#[test]
fn a_client_links_the_wire_and_no_gate_ledger_or_database() {
    for client in ["tally-api", "tally-mcp"] {
        let linked = linked(client);
        assert!(
            linked.iter().any(|l| l == "tally-wire"),
            "{client} does not link tally-wire: {linked:?}"
        );
        let banned = banned_in_a_client(&linked);
        assert!(banned.is_empty(), "{client} links {banned:?}");
    }
    // The check finds what it must: the daemon links all of them but the database.
    let daemon = banned_in_a_client(&linked("tally-daemon"));
    assert_eq!(
        daemon,
        ["tally-gate", "tally-ledger", "tally-policy", "sled"],
        "the daemon's links, as the check sees them"
    );
}

/// The client and wire types are tally-api's and tally-wire's alone: the daemon does not
/// re-export them (a
/// client would otherwise reach them through the server's crate), and `tally-load` (its own
/// package, not a binary of the daemon's) uses the api's client.
#[test]
fn the_daemon_re_exports_no_client_or_wire_type() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let lib = std::fs::read_to_string(root.join("daemon/src/lib.rs")).expect("daemon/src/lib.rs");
    for line in lib.lines() {
        assert!(
            !(line.trim_start().starts_with("pub use tally_api")
                || line.trim_start().starts_with("pub use tally_wire")),
            "daemon/src/lib.rs re-exports tally-api or tally-wire: {line}"
        );
    }
    assert!(
        !root.join("daemon/src/bin").exists(),
        "a binary in the daemon's library crate (tally-load lives in load/)"
    );
    // tally-load's modules (main.rs and those beside it), read as one.
    let load: String = std::fs::read_dir(root.join("load/src"))
        .expect("load/src")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| std::fs::read_to_string(p).expect("a source file"))
        .collect();
    assert!(
        load.contains("use tally_api::client::"),
        "tally-load uses tally-api's client"
    );
}

/// Every fuzz target (a `[[bin]]` of fuzz/Cargo.toml) is listed in SECURITY.md and in
/// fuzz/README.md, and has its source file.
#[test]
fn every_fuzz_target_is_listed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = std::fs::read_to_string(root.join("fuzz/Cargo.toml")).expect("fuzz/Cargo.toml");
    let security = std::fs::read_to_string(root.join("SECURITY.md")).expect("SECURITY.md");
    let readme = std::fs::read_to_string(root.join("fuzz/README.md")).expect("fuzz/README.md");
    let mut targets = Vec::new();
    let mut in_bin = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin {
            if let Some(name) = line.strip_prefix("name = ") {
                targets.push(name.trim_matches('"').to_owned());
            }
        }
    }
    assert!(targets.len() >= 10, "{targets:?}");
    for t in &targets {
        let row = format!("| `{t}` |");
        assert!(
            security.contains(&row),
            "SECURITY.md does not list the fuzz target {t}"
        );
        assert!(
            readme.contains(&row),
            "fuzz/README.md does not list the fuzz target {t}"
        );
        assert!(
            root.join(format!("fuzz/fuzz_targets/{t}.rs")).is_file(),
            "no fuzz/fuzz_targets/{t}.rs"
        );
    }
    for t in ["daemon_body", "mcp_classify"] {
        assert!(targets.iter().any(|x| x == t), "no fuzz target {t}");
    }
}

/// No source, doc or manifest names an entry of an issue tracker a clone of this
/// repository does not have (the word issue and a number): a reader cannot follow it. Say what the
/// test or the code is about instead.
#[test]
fn nothing_names_an_issue_a_clone_does_not_have() {
    let root = super::sources::root();
    let Some(paths) = super::sources::listed(&[]) else {
        return;
    };
    let mut named = Vec::new();
    for path in paths.iter().map(String::as_str) {
        let text_file = [".rs", ".md", ".toml", ".py", ".mjs", ".ts", ".yaml"]
            .iter()
            .any(|e| path.ends_with(e));
        if !text_file || path.contains("node_modules") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(path)) else {
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            let lower = line.to_ascii_lowercase();
            let mut rest = lower.as_str();
            while let Some(at) = rest.find("issue ") {
                let after = &rest[at + 6..];
                let upstream = rest[..at].ends_with("github ") || lower.contains("upstream");
                if after.starts_with(|c: char| c.is_ascii_digit() || c == '#') && !upstream {
                    named.push(format!("{path}:{}: {line}", i + 1));
                    break;
                }
                rest = after;
            }
        }
    }
    assert!(named.is_empty(), "{}", named.join("\n"));
}

/// Where `text` spells an error code as a string rather than as the wire's `ErrorCode`:
/// an `ApiError::new` or `Refusal::own` whose code is a literal, a code compared with a
/// literal, or a literal `"code"` in a JSON body. Each as `line: text`.
fn string_codes(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for call in ["ApiError::new(", "Refusal::own("] {
        for (at, _) in text.match_indices(call) {
            let args = &text[at + call.len()..];
            let mut depth = 0i32;
            let comma = args.char_indices().find(|&(_, c)| {
                match c {
                    '(' | '[' | '{' => depth += 1,
                    ')' | ']' | '}' => depth -= 1,
                    _ => {}
                }
                c == ',' && depth == 0
            });
            if let Some((i, _)) = comma {
                if args[i + 1..].trim_start().starts_with('"') {
                    found.push(at);
                }
            }
        }
    }
    for pattern in ["code() == Some(\"", "code == \""] {
        found.extend(text.match_indices(pattern).map(|(at, _)| at));
    }
    // A JSON body's `"code"` is tally's only if it is one of tally's codes (the fake
    // upstream answers the OpenAI API's own, `invalid_api_key`).
    for (at, _) in text.match_indices("\"code\": \"") {
        let rest = &text[at + 9..];
        let code = rest.split('"').next().unwrap_or_default();
        if tally_wire::ErrorCode::ALL
            .iter()
            .any(|c| c.as_str() == code)
        {
            found.push(at);
        }
    }
    found
        .into_iter()
        .map(|at| {
            let line = text[..at].lines().count().max(1);
            let shown = text.lines().nth(line - 1).unwrap_or_default().trim();
            format!("{line}: {shown}")
        })
        .collect()
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).expect("a source directory") {
        let path = e.expect("an entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// Error codes are the wire's `ErrorCode` (and a proxy refusal's `RefusalCode`): no
/// crate's source but `tally-wire`'s spells one as a string, to send or to match.
#[test]
fn no_error_code_is_a_string_outside_the_wire() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for (krate, _) in LAYERS {
        let dir = krate.trim_start_matches("tally-");
        if dir != "wire" && root.join(dir).join("src").is_dir() {
            sources(&root.join(dir).join("src"), &mut files);
        }
    }
    assert!(files.len() > 100, "{} files", files.len());
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("a source file");
        for at in string_codes(&text) {
            found.push(format!("{}:{at}", f.display()));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
    // The check finds what it must.
    let old = r#"
        ApiError::new(StatusCode::CONFLICT, "run_exists", msg);
        Refusal::own(
            StatusCode::UNAUTHORIZED,
            "invalid_token",
            message,
        );
        Err(e) if e.code() == Some("run_not_found") => {}
        Err(GateFailure::Refused { code, .. }) if code == "not_owner" => {}
        json!({"error": {"code": "gate_unavailable"}});
        ApiError::new(bad, ErrorCode::InvalidJson, format!("{}", "x"));
    "#;
    assert_eq!(string_codes(old).len(), 5, "{:?}", string_codes(old));
}

/// The public functions of `tally-api` whose signature passes a `serde_json::Value`:
/// each as `file: signature`.
fn untyped_client_signatures(file: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for start in ["pub fn ", "pub async fn "] {
        for (at, _) in text.match_indices(start) {
            let signature = text[at..].split(['{', ';']).next().unwrap_or_default();
            let untyped = signature
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .any(|word| word == "Value");
            if untyped {
                found.push(format!("{file}: {}", signature.trim()));
            }
        }
    }
    found
}

/// The client answers typed: no public function of `tally-api` takes or returns a
/// `serde_json::Value`.
#[test]
fn the_client_passes_nothing_untyped() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../api/src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() >= 3, "{files:?}");
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("a source file");
        found.extend(untyped_client_signatures(&f.display().to_string(), &text));
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
    // The check finds what it must.
    let old = "pub async fn runs(&mut self) -> Result<Value, GateError> {\n}\n\
               pub fn settle(&mut self, run: &str) -> Result<Logged, GateError> {\n}\n\
               pub async fn act(\n    &mut self,\n    body: serde_json::Value,\n) -> Result<(), E>;";
    assert_eq!(untyped_client_signatures("old", old).len(), 2);
}
