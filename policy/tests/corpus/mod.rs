//! The differential corpus (`corpus/*.ndjson` at the repository root, described in its
//! README): every scenario's decisions folded through `apply`, in order, and its final
//! numbers held to the `expect` line, which follows docs/GATE.md, how a budget is counted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tally_policy::{apply, Inconsistency, Policy, RunState, ToolState, ViewMut};
use tally_record::{Decision, Kind};

use crate::support::now;

/// Keys of one run's `expect`, and whether each is required.
/// Held and settled spend are given in cents (`held_cents`, `settled_cents`: the state's
/// nanodollars must be exactly that many cents) or in nanodollars (`held_nanos`,
/// `settled_nanos`): one of each pair is required.
const EXPECT_KEYS: &[(&str, bool)] = &[
    ("attempts_used", true),
    ("held_cents", false),
    ("settled_cents", false),
    ("held_nanos", false),
    ("settled_nanos", false),
    ("side_effects_used", true),
    ("stop", true),
    ("inconsistencies", true),
    ("overrun", false),
    ("polls", false),
];

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../corpus")
}

fn scenarios() -> Vec<PathBuf> {
    let dir = corpus_dir();
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read the corpus directory {}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("corpus directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "ndjson"))
        .collect();
    files.sort();
    files
}

/// One run's numbers after the fold.
#[derive(Default)]
struct Folded {
    state: Option<RunState>,
    found: Vec<Inconsistency>,
}

/// Replay one scenario: `Err` lists every way it disagrees with its `expect` (or why it
/// cannot be replayed), each message naming the file, and the line or run.
fn replay(name: &str, text: &str) -> Result<(), Vec<String>> {
    let fail = |msg: String| Err(vec![format!("corpus/{name}: {msg}")]);
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty())
        .collect();
    let Some((&(expect_line, expect_text), mut body)) = lines.split_last() else {
        return fail("empty scenario".into());
    };
    let expect: Value = match serde_json::from_str(expect_text) {
        Ok(v) => v,
        Err(e) => {
            return fail(format!(
                "line {expect_line}: the expect line is not JSON: {e}"
            ))
        }
    };
    let Some(expect) = expect
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.get("expect"))
        .and_then(Value::as_object)
    else {
        return fail(format!(
            "line {expect_line}: the last line must be {{\"expect\": {{RUN: {{...}}}}}}"
        ));
    };

    let mut policy = Policy::default();
    if let Some((&(n, first), rest)) = body.split_first() {
        let v: Option<Value> = serde_json::from_str(first).ok();
        if let Some(p) = v.as_ref().and_then(|v| v.get("policy")) {
            let Some(toml) = p.as_str().filter(|_| {
                v.as_ref()
                    .and_then(Value::as_object)
                    .is_some_and(|o| o.len() == 1)
            }) else {
                return fail(format!(
                    "line {n}: a policy line is {{\"policy\": \"<TOML text>\"}}"
                ));
            };
            policy = match Policy::from_toml(toml) {
                Ok(p) => p,
                Err(e) => return fail(format!("line {n}: {e}")),
            };
            body = rest;
        }
    }

    let mut runs: BTreeMap<String, Folded> = BTreeMap::new();
    let mut tools: BTreeMap<String, ToolState> = BTreeMap::new();
    for &(n, line) in body {
        let d = match Decision::from_json(line) {
            Ok(d) => d,
            Err(e) => return fail(format!("line {n}: not a decision: {e}")),
        };
        if let Err(e) = d.validate() {
            return fail(format!("line {n}: not a valid decision: {e}"));
        }
        let Some(at) = d.at_ms else {
            return fail(format!("line {n}: every corpus decision gives at_ms"));
        };
        if d.kind() == Kind::Policy {
            return fail(format!(
                "line {n}: policy records belong on the first line as {{\"policy\": ...}}"
            ));
        }
        let folded = runs.entry(d.run.clone()).or_default();
        let run = folded.state.get_or_insert_with(|| RunState::new(&d.run));
        let tool_name = match d.kind() {
            Kind::Outcome => d.attempt.and_then(|a| run.tool_of(a)).map(str::to_owned),
            _ => d.tool.clone(),
        };
        let tool = tool_name.map(|t| tools.entry(t).or_default());
        let found = apply(
            &policy,
            ViewMut {
                run,
                tool,
                credential: None,
                parent: None,
                continued: None,
                principal: None,
            },
            &d,
            now(at),
        );
        folded.found.extend(found);
    }

    let mut errors = Vec::new();
    for run in runs.keys().filter(|r| !expect.contains_key(*r)) {
        errors.push(format!(
            "corpus/{name}: run {run}: has decisions but no expect entry"
        ));
    }
    for (run, want) in expect {
        let at = |msg: String| format!("corpus/{name}: run {run}: {msg}");
        let Some(Folded {
            state: Some(state),
            found,
        }) = runs.get(run)
        else {
            errors.push(at("named in expect but has no decisions".into()));
            continue;
        };
        let Some(want) = want.as_object() else {
            errors.push(at("its expect is not an object".into()));
            continue;
        };
        for key in want.keys() {
            if !EXPECT_KEYS.iter().any(|(k, _)| k == key) {
                errors.push(at(format!("unknown expect key `{key}`")));
            }
        }
        for (key, required) in EXPECT_KEYS {
            if *required && !want.contains_key(*key) {
                errors.push(at(format!("expect lacks `{key}`")));
            }
        }
        for (cents, nanos) in [
            ("held_cents", "held_nanos"),
            ("settled_cents", "settled_nanos"),
        ] {
            if want.contains_key(cents) == want.contains_key(nanos) {
                errors.push(at(format!("expect gives one of `{cents}` and `{nanos}`")));
            }
        }
        let kinds: Vec<Value> = found
            .iter()
            .map(|i| serde_json::to_value(i).expect("an inconsistency serializes")["kind"].clone())
            .collect();
        let got: BTreeMap<&str, Value> = [
            ("attempts_used", Value::from(state.attempts_used)),
            // The corpus's records count cents; the state counts nanodollars, exactly.
            ("held_cents", cents(state.held_nanos)),
            ("settled_cents", cents(state.settled_nanos)),
            ("held_nanos", Value::from(state.held_nanos)),
            ("settled_nanos", Value::from(state.settled_nanos)),
            ("side_effects_used", Value::from(state.side_effects_used)),
            (
                "stop",
                state.stop.map_or(Value::Null, |r| Value::from(r.as_str())),
            ),
            ("overrun", Value::from(state.overrun)),
            ("inconsistencies", Value::from(kinds)),
        ]
        .into_iter()
        .collect();
        for (key, value) in &got {
            let expected = match (want.get(*key), *key) {
                (Some(v), _) => v.clone(),
                (None, "overrun") => Value::Bool(false),
                (None, _) => continue,
            };
            if &expected != value {
                let detail = if *key == "inconsistencies" {
                    format!(" (in full: {found:?})")
                } else {
                    String::new()
                };
                errors.push(at(format!(
                    "{key}: expected {expected}, got {value}{detail}"
                )));
            }
        }
        if let Some(polls) = want.get("polls") {
            let Some(polls) = polls.as_object() else {
                errors.push(at("`polls` is {REMOTE_REF: polls}".into()));
                continue;
            };
            for (remote, n) in polls {
                let got = state.remote(remote).map_or(0, |r| r.polls);
                if n.as_u64() != Some(got) {
                    errors.push(at(format!("polls of {remote}: expected {n}, got {got}")));
                }
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

#[test]
fn corpus_replays_to_the_numbers_spec_3_1_gives() {
    let files = scenarios();
    assert!(
        !files.is_empty(),
        "no scenarios (*.ndjson) in the corpus directory {}",
        corpus_dir().display()
    );
    let mut failures = Vec::new();
    for path in &files {
        let name = path.file_name().expect("a file name").to_string_lossy();
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        if let Err(errors) = replay(&name, &text) {
            failures.extend(errors);
        }
    }
    assert!(
        failures.is_empty(),
        "{} disagreement(s) with the corpus ({} scenarios):\n  {}",
        failures.len(),
        files.len(),
        failures.join("\n  ")
    );
}

#[test]
fn corpus_covers_the_required_scenarios() {
    let names: Vec<String> = scenarios()
        .iter()
        .map(|p| {
            p.file_stem()
                .expect("a stem")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    for required in [
        "plain_run",
        "refund_default_slot",
        "refund_without_attempt",
        "double_refund",
        "rejected_refunds_itself",
        "error_stays_counted",
        "timeout_then_late_ok",
        "unknown_then_ok",
        "settled_above_reserved",
        "duplicate_settle",
        "outcome_without_allow",
        "exempt_tool",
        "poll_uses_no_attempt",
        "side_effects",
        "first_stop_wins",
        "repeated_unknown_write",
        "allow_beyond_limit",
        "overflow_never_wraps",
        "cents_and_nanos_count_alike",
    ] {
        assert!(
            names.iter().any(|n| n == required),
            "corpus/{required}.ndjson is missing"
        );
    }
}

/// The replay itself is checked: a wrong number fails, naming the file and the run.
#[test]
fn a_wrong_number_fails_naming_file_and_run() {
    let text = concat!(
        r#"{"run":"r9","kind":"start","at_ms":0,"budget":{"attempts":3}}"#,
        "\n",
        r#"{"run":"r9","kind":"allow","at_ms":1,"tool":"t","effect":"read","attempt":1}"#,
        "\n",
        r#"{"expect":{"r9":{"attempts_used":2,"held_cents":0,"settled_cents":0,"side_effects_used":0,"stop":null,"inconsistencies":["overflow"]}}}"#,
    );
    let errors = replay("made_up.ndjson", text).expect_err("a wrong expect must fail");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("corpus/made_up.ndjson: run r9: attempts_used: expected 2, got 1")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("run r9: inconsistencies: expected [\"overflow\"], got []")),
        "{errors:?}"
    );

    let missing = concat!(
        r#"{"run":"r1","kind":"start","at_ms":0}"#,
        "\n",
        r#"{"expect":{}}"#,
    );
    let errors = replay("m.ndjson", missing).expect_err("an unexpected run must fail");
    assert!(
        errors[0].contains("run r1: has decisions but no expect entry"),
        "{errors:?}"
    );

    let no_time = concat!(
        r#"{"run":"r1","kind":"start"}"#,
        "\n",
        r#"{"expect":{"r1":{}}}"#,
    );
    let errors = replay("t.ndjson", no_time).expect_err("a decision without at_ms must fail");
    assert!(
        errors[0].contains("line 1: every corpus decision gives at_ms"),
        "{errors:?}"
    );
}

/// Nanodollars as whole cents, or `null` if they are not a whole number of cents.
fn cents(nanos: u64) -> Value {
    tally_record::money::Nanos(nanos)
        .whole_cents()
        .map_or(Value::Null, Value::from)
}
