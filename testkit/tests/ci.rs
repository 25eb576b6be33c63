//! README's one command for the full suite is `.ci/run`, and it installs what README
//! says the suite needs, at the versions README pins, and runs the commands README names.

use std::path::Path;

fn read(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn readme_and_ci_run_agree() {
    let readme = read("README.md");
    let ci = read(".ci/run");
    assert!(
        readme.contains("sudo .ci/run"),
        "README's commands do not name .ci/run"
    );
    // Every pinned Python package README names is installed by .ci/run at that version,
    // and the other way round.
    let pins = |text: &str| -> std::collections::BTreeSet<String> {
        text.split(|c: char| c.is_whitespace() || "`'\"(),".contains(c))
            .filter(|w| w.contains("==") && !w.starts_with('='))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(pins(&readme), pins(&ci), "pinned packages differ");
    assert!(pins(&ci).contains("schemathesis==4.32.5") && pins(&ci).contains("mcp==1.30.0"));
    for needed in [
        "pytest",
        "wheel",
        "postgresql",
        "npm install --prefix mcp/tests/node",
        "curl",
        "e2fsprogs",
        "iproute2",
        "util-linux",
        "nodejs",
    ] {
        assert!(ci.contains(needed), ".ci/run does not install {needed}");
    }
    for command in [
        "cargo fmt --all -- --check",
        "cargo clippy --workspace --all-targets --locked -- -D warnings",
        "CI=1 cargo test --workspace --locked --no-fail-fast",
    ] {
        assert!(ci.contains(command), ".ci/run does not run `{command}`");
        // README wraps lines: compare with whitespace collapsed.
        let flat = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flat(&readme).contains(&flat(command)),
            "README does not say .ci/run runs `{command}`"
        );
    }
}
