//! JSON reports that match their published schemas, and the documented examples too.

use super::*;

/// The JSON the commands print is what the docs say: one document with
/// `version` (and `verdict` for verify), each valid against its schema in docs/schemas/.
#[test]
fn json_reports_match_their_published_schemas() {
    let mut decisions = clean_run("clean");
    decisions.extend(bad_run("bad"));
    decisions.extend([
        json!({"run": "w", "kind": "start", "goal": "write", "budget": {"attempts": 9, "spend_cents": 100}}),
        json!({"run": "w", "kind": "allow", "tool": "pay", "operation": "pay.create", "attempt": 1,
               "effect": "non_idempotent_write", "args": {"a": 1}, "reserve_cents": 40, "at_ms": 1}),
        json!({"run": "w", "kind": "outcome", "status": "timeout", "attempt": 1}),
        json!({"run": "w", "kind": "allow", "tool": "job", "operation": "job.start", "attempt": 2,
               "effect": "idempotent_write", "args": {"a": 2}, "at_ms": 2}),
        json!({"run": "w", "kind": "outcome", "status": "running", "attempt": 2, "remote_ref": "j1",
               "observed": "queued", "retry_after_ms": 100}),
    ]);
    for a in 3..=6 {
        decisions.push(
            json!({"run": "w", "kind": "allow", "tool": "get", "attempt": a,
                              "args": {"same": 1}, "effect": "read", "at_ms": 10 + a}),
        );
    }
    let cli = Cli::new(&decisions);
    let cut = cut_at_boundary(&cli);
    let cut = cut.to_str().expect("path");
    let bad = tampered(&cli);
    let bad = bad.to_str().expect("path");
    let schema = |name: &str| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/schemas")
            .join(format!("{name}.json"));
        let text = std::fs::read_to_string(&path).expect("schema file");
        let schema: Value = serde_json::from_str(&text).expect("schema is JSON");
        assert_eq!(
            schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
            "{name}"
        );
        jsonschema::draft202012::new(&schema).expect("a valid schema")
    };
    // For verify, the chain's verdict: audit findings make it exit 1 whatever the
    // verdict, over incomplete evidence too, as loops and handoff do.
    let verdicts = ["intact", "intact", "incomplete", "incomplete", "tampered"];
    let cases: Vec<(&str, Vec<&str>, i32)> = vec![
        (
            "verify",
            vec!["verify", "L.tally", "--key", "L/ledger.pub", "--json"],
            0,
        ),
        ("verify", with_keys(&["verify", "L.tally", "--json"]), 1),
        (
            "verify",
            vec!["verify", cut, "--key", "L/ledger.pub", "--json"],
            3,
        ),
        ("verify", with_keys(&["verify", cut, "--json"]), 1),
        (
            "verify",
            vec!["verify", bad, "--key", "L/ledger.pub", "--json"],
            1,
        ),
        ("loops", with_keys(&["loops", "L.tally", "--json"]), 1),
        ("loops", with_keys(&["loops", cut, "--json"]), 1),
        ("loops", with_keys(&["loops", bad, "--json"]), 1),
        ("loops", with_keys(&["loops", bad, "--json", "--force"]), 1),
        ("handoff", with_keys(&["handoff", "L.tally", "--json"]), 1),
        (
            "handoff",
            with_keys(&["handoff", "L.tally", "--run", "w", "--json"]),
            0,
        ),
        (
            "handoff",
            with_keys(&["handoff", cut, "--run", "clean", "--json"]),
            3,
        ),
        ("handoff", with_keys(&["handoff", bad, "--json"]), 1),
        ("stats", with_keys(&["stats", "L.tally", "--json"]), 1),
        (
            "stats",
            with_keys(&["stats", "L.tally", "--run", "w", "--json"]),
            0,
        ),
        (
            "stats",
            with_keys(&["stats", cut, "--run", "clean", "--json"]),
            3,
        ),
        ("stats", with_keys(&["stats", bad, "--json"]), 1),
    ];
    for (i, (name, args, want)) in cases.into_iter().enumerate() {
        let out = cli.run(&args);
        assert_eq!(code(&out), want, "{args:?}: {}", text(&out.stderr));
        let doc: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", text(&out.stdout)));
        let errors: Vec<String> = schema(name)
            .iter_errors(&doc)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{args:?}:\n{}\n{doc:#}",
            errors.join("\n")
        );
        assert_eq!(doc["version"], 2, "{args:?}");
        if let Some(verdict) = verdicts.get(i) {
            assert_eq!(doc["verdict"], *verdict, "{args:?}");
        }
    }
}

/// The documents REPORTS.md shows are what the schemas accept, so the
/// docs cannot drift from the output the schema test checks.
#[test]
fn the_documented_examples_match_the_schemas() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    let reports = std::fs::read_to_string(docs.join("REPORTS.md")).expect("REPORTS.md");
    let mut checked = Vec::new();
    for block in reports.split("```json\n").skip(1) {
        let body = block.split("```").next().unwrap_or_default();
        let Ok(doc) = serde_json::from_str::<Value>(body) else {
            continue; // a fragment, not a whole document
        };
        let name = if doc.get("loops").is_some() {
            "loops"
        } else if doc.get("handoffs").is_some() {
            "handoff"
        } else if doc.get("runs").is_some() {
            "stats"
        } else {
            continue;
        };
        let text = std::fs::read_to_string(docs.join("schemas").join(format!("{name}.json")))
            .expect("schema");
        let schema: Value = serde_json::from_str(&text).expect("schema JSON");
        let validator = jsonschema::draft202012::new(&schema).expect("valid schema");
        let errors: Vec<String> = validator
            .iter_errors(&doc)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{name} example:\n{}", errors.join("\n"));
        checked.push(name);
    }
    assert_eq!(checked, ["loops", "handoff", "stats"]);
}
