//! `tally prices import` end to end with the real binary: what it writes is a policy's
//! prices (the policy check accepts it beside its upstreams), and a refused import
//! leaves nothing behind.

use std::path::Path;

use crate::fixture::kit;

/// An excerpt of LiteLLM's real table (also the trycmd case's).
const TABLE: &str = "tests/cmd/prices-import.in/model_prices_and_context_window.json";

const UPSTREAMS: &str = r#"max_price_age_days = 30

[upstreams.openai]
url = "https://example.openai.azure.com"
kind = "openai"
credential = "azure"
paths = ["/openai/"]

[upstreams.bedrock]
url = "https://bedrock-runtime.us-east-1.amazonaws.com"
kind = "openai"
credential = "bedrock"
paths = ["/"]
"#;

fn table() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(TABLE)
        .display()
        .to_string()
}

#[test]
fn imported_prices_make_a_policy_the_check_accepts() {
    let dir = tempfile::tempdir().expect("a dir");
    let out = dir.path().join("prices.toml");
    let args = [
        "prices",
        "import",
        &table(),
        "--out",
        "prices.toml",
        "--provider",
        "azure=openai",
        "--provider",
        "bedrock_converse=bedrock",
        "--as-of",
        "2026-12-01",
    ];
    let o = kit().run(dir.path(), &args, "");
    let note = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{note}");
    assert!(
        note.contains("3 prices written (bedrock 2, openai 1)"),
        "{note}"
    );
    let prices = std::fs::read_to_string(&out).expect("written");
    let policy = format!("{UPSTREAMS}\n{prices}");
    // Within the bound: valid, no warning.
    let fresh = kit().run(
        dir.path(),
        &["policy", "check", "-", "--today", "2026-12-31"],
        &policy,
    );
    assert!(
        fresh.status.success(),
        "{}",
        String::from_utf8_lossy(&fresh.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&fresh.stderr), "");
    let shown = String::from_utf8_lossy(&fresh.stdout);
    assert!(
        shown.contains("# prices.bedrock.\"amazon.nova-2-lite-v1:0\" covers:"),
        "{shown}"
    );
    // A day past it: still valid, each price warned of.
    let old = kit().run(
        dir.path(),
        &["policy", "check", "-", "--today", "2027-01-01"],
        &policy,
    );
    assert!(old.status.success());
    let warned = String::from_utf8_lossy(&old.stderr);
    assert_eq!(
        warned
            .matches("is 31 days old (as_of 2026-12-01; max_price_age_days = 30)")
            .count(),
        3,
        "{warned}"
    );
    // A second import never writes over the first.
    let again = kit().run(dir.path(), &args, "");
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    assert_eq!(std::fs::read_to_string(&out).expect("kept"), prices);
}

#[test]
fn a_refused_import_writes_nothing() {
    let dir = tempfile::tempdir().expect("a dir");
    let good = std::fs::read_to_string(table()).expect("the table");
    for (name, text, says) in [
        (
            "string-cost.json",
            good.replace(
                "\"input_cost_per_token\": 6e-08,",
                "\"input_cost_per_token\": \"6e-08\",",
            ),
            "model \"amazon.nova-lite-v1:0\": `input_cost_per_token`",
        ),
        (
            "no-output.json",
            good.replace("\"output_cost_per_token\": 2.5e-06,", ""),
            "model \"amazon.nova-2-lite-v1:0\": `output_cost_per_token` is missing",
        ),
        (
            "cut.json",
            good[..good.len() / 2].to_owned(),
            "is not a JSON object of models",
        ),
    ] {
        std::fs::write(dir.path().join(name), text).expect("write");
        let o = kit().run(
            dir.path(),
            &["prices", "import", name, "--out", "prices.toml"],
            "",
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(says), "{name}: {err}");
        assert!(!dir.path().join("prices.toml").exists(), "{name}");
    }
    // Nothing of the asked-for provider: refused, nothing written.
    let o = kit().run(
        dir.path(),
        &[
            "prices",
            "import",
            &table(),
            "--provider",
            "nobody",
            "--out",
            "prices.toml",
        ],
        "",
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("no chat model of the table matched (other provider 8)"));
    assert!(!dir.path().join("prices.toml").exists());
}
