//! Cases of the merged audit (several ledgers read as one), driving the real
//! `tally` over ledgers written with the ledger library, state versions crafted by hand
//! (a hostile or confused writer: the daemon's and the CLI's appends refuse the field).

use std::path::Path;
use std::process::Output;

use tally_ledger::keys::AuditorKey;
use tally_ledger::{Decision, Ledger, Rotation};

use crate::fixture;

/// `dir/NAME`: a new ledger encrypted to `dir/a.pub` holding `lines` (one decision each).
fn ledger(dir: &Path, name: &str, lines: &[&str]) {
    let auditor = AuditorKey::read(&dir.join("a.key")).expect("auditor key");
    Ledger::init(&dir.join(name), &auditor.public(), Rotation::default()).expect("init");
    let l = Ledger::open(&dir.join(name)).expect("open");
    let decisions: Vec<Decision> = lines
        .iter()
        .map(|t| Decision::from_json(t).expect("decision"))
        .collect();
    l.append_batch(decisions).expect("append");
}

fn tally(dir: &Path, args: &[&str]) -> Output {
    fixture::tally()
        .args(args)
        .current_dir(dir)
        .output()
        .expect("tally runs")
}

/// `tally CMD L1 L2 ... --key L1/ledger.pub ... --auditor-key a.key --json`.
fn audit(dir: &Path, cmd: &str, ledgers: &[&str], extra: &[&str]) -> (Option<i32>, String) {
    let keys: Vec<String> = ledgers.iter().map(|l| format!("{l}/ledger.pub")).collect();
    let mut args: Vec<&str> = vec![cmd];
    args.extend(ledgers);
    for k in &keys {
        args.push("--key");
        args.push(k);
    }
    args.extend(["--auditor-key", "a.key"]);
    args.extend(extra);
    let o = tally(dir, &args);
    (
        o.status.code(),
        format!(
            "{}\n--- stderr\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

fn setup() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let _ = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    fixture::ok(tmp.path(), &["keygen", "--out", "a.key"], "");
    tmp
}

const A: &[&str] = &[
    r#"{"run":"r","kind":"start","goal":"g","budget":{"attempts":3},"state_version":10}"#,
    r#"{"run":"r","kind":"allow","tool":"http","operation":"get","args":{},"effect":"read","attempt":1,"state_version":11}"#,
    r#"{"run":"r","kind":"outcome","attempt":2,"status":"ok","state_version":14}"#,
    r#"{"run":"r","kind":"stop","reason":"completed","state_version":15}"#,
];
const B: &[&str] = &[
    r#"{"run":"r","kind":"outcome","attempt":1,"status":"ok","state_version":12}"#,
    r#"{"run":"r","kind":"allow","tool":"http","operation":"get","args":{},"effect":"read","attempt":2,"state_version":13}"#,
];

// Sound: one run spread over two ledgers audits clean, whichever order they are given in.
#[test]
fn the_order_the_ledgers_are_given_in_does_not_change_the_verdict() {
    let tmp = setup();
    let d = tmp.path();
    ledger(d, "a", A);
    ledger(d, "b", B);
    let (ab, out_ab) = audit(d, "verify", &["a", "b"], &[]);
    let (ba, out_ba) = audit(d, "verify", &["b", "a"], &[]);
    assert_eq!(ab, Some(0), "{out_ab}");
    assert_eq!(ba, Some(0), "{out_ba}");
    let (h_ab, out) = audit(d, "handoff", &["a", "b"], &["--json"]);
    assert_eq!(h_ab, Some(0), "{out}");
    let (h_ba, out) = audit(d, "handoff", &["b", "a"], &["--json"]);
    assert_eq!(h_ba, Some(0), "{out}");
}

// Sound: the same ledger under two paths (its directory and its export) is refused.
#[test]
fn one_ledger_under_two_paths_is_refused() {
    let tmp = setup();
    let d = tmp.path();
    ledger(d, "a", A);
    fixture::ok(d, &["export", "--ledger", "a", "--out", "a.tally"], "");
    let o = tally(
        d,
        &[
            "verify",
            "a",
            "a.tally",
            "--key",
            "a/ledger.pub",
            "--key",
            "a/ledger.pub",
            "--auditor-key",
            "a.key",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("same ledger"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

// Sound: a tampered ledger among intact ones fails the merged verify, and the reports
// refuse without --force.
#[test]
fn a_tampered_ledger_among_intact_ones_is_refused() {
    let tmp = setup();
    let d = tmp.path();
    ledger(d, "a", A);
    ledger(d, "b", B);
    fixture::ok(d, &["export", "--ledger", "b", "--out", "b.tally"], "");
    let mut bytes = std::fs::read(d.join("b.tally")).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    std::fs::write(d.join("bad.tally"), bytes).unwrap();
    let args = |cmd: &'static str| -> Vec<&'static str> {
        vec![
            cmd,
            "a",
            "bad.tally",
            "--key",
            "a/ledger.pub",
            "--key",
            "b/ledger.pub",
            "--auditor-key",
            "a.key",
        ]
    };
    let o = tally(d, &args("verify"));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("TAMPERED: ledger 2 of 2"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    for cmd in ["loops", "handoff", "stats"] {
        let o = tally(d, &args(cmd));
        assert_eq!(o.status.code(), Some(1), "{cmd}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("refusing to report"),
            "{cmd}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

// A record without a version goes with the versioned record before it in its ledger, so
// a ledger could put a call it records after another host's stop of the run ahead of that
// stop. Here ledger b records an allow of `r` without a version after its own version 13;
// the stop is ledger a's version 15. Read as one, the allow sorts before the stop; the
// run has records in two ledgers, one without a version, so the merge reports it
// (`unordered`), and exits 1.
#[test]
fn an_unversioned_call_after_versioned_ones_is_reported_in_a_merged_audit() {
    let tmp = setup();
    let d = tmp.path();
    ledger(d, "a", A);
    let late = |v: &str| {
        let mut b = B.to_vec();
        b.push(if v.is_empty() {
            r#"{"run":"r","kind":"allow","tool":"http","operation":"delete","args":{},"effect":"non_idempotent_write","attempt":3}"#
        } else {
            r#"{"run":"r","kind":"allow","tool":"http","operation":"delete","args":{},"effect":"non_idempotent_write","attempt":3,"state_version":16}"#
        });
        b.push(r#"{"run":"r","kind":"outcome","attempt":3,"status":"ok"}"#);
        b
    };
    // Control: the same allow at a version past the stop is found.
    ledger(d, "late", &late("16"));
    let (code, out) = audit(d, "verify", &["a", "late"], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("after"), "{out}");
    // Without a version it sorts before the stop: the merge says the run is unordered.
    ledger(d, "hidden", &late(""));
    let (code, out) = audit(d, "verify", &["a", "hidden"], &[]);
    assert_ne!(
        code,
        Some(0),
        "an allow without a version, after ledger 2's versioned records, hides before ledger 1's stop:\n{out}"
    );
    assert!(
        out.contains("their order across ledgers is unknown"),
        "{out}"
    );
}

/// The kinds of the audit's and the replay's findings in `tally verify --json`'s output.
fn finding_kinds(out: &str) -> Vec<String> {
    let json = out.split("\n--- stderr").next().unwrap_or_default();
    let doc: serde_json::Value = serde_json::from_str(json).expect("verify --json");
    let mut kinds: Vec<String> = ["audit", "replay"]
        .iter()
        .flat_map(|k| doc[k]["findings"].as_array().cloned().unwrap_or_default())
        .map(|f| f["kind"].as_str().unwrap_or_default().to_owned())
        .collect();
    kinds.sort();
    kinds
}

// Records written before the fleet's state numbered its decisions (a schema 1 database,
// migrated in place; or any unversioned records) all take the key of the versioned record
// before them, 0; ties go by ledger id, not by the order the ledgers are given in. Here
// the same two ledgers, in both orders: the same verdict and the same findings.
#[test]
fn unversioned_records_of_two_ledgers_do_not_depend_on_the_order_given() {
    let tmp = setup();
    let d = tmp.path();
    let strip = |lines: &[&str]| -> Vec<String> {
        lines
            .iter()
            .map(|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                v.as_object_mut().unwrap().remove("state_version");
                v.to_string()
            })
            .collect()
    };
    let a = strip(A);
    let b = strip(B);
    ledger(d, "a", &a.iter().map(String::as_str).collect::<Vec<_>>());
    ledger(d, "b", &b.iter().map(String::as_str).collect::<Vec<_>>());
    let (ab, out_ab) = audit(d, "verify", &["a", "b"], &["--json"]);
    let (ba, out_ba) = audit(d, "verify", &["b", "a"], &["--json"]);
    let (kab, kba) = (finding_kinds(&out_ab), finding_kinds(&out_ba));
    assert_eq!(
        (ab, &kab),
        (ba, &kba),
        "the same two ledgers, given in two orders, audit differently:\n{out_ab}\n=====\n{out_ba}"
    );
}

// `handoff --run RUN` counts only that run's findings (docs/REPORTS.md), merge findings
// included. Here run `s` of ledger 1 and run `t` of ledger 2 share state version 3; run
// `r` is clean.
#[test]
fn handoff_of_one_run_counts_only_that_runs_merge_findings() {
    let tmp = setup();
    let d = tmp.path();
    ledger(
        d,
        "a",
        &[
            r#"{"run":"r","kind":"start","goal":"g","state_version":1}"#,
            r#"{"run":"r","kind":"stop","reason":"completed","state_version":2}"#,
            r#"{"run":"s","kind":"start","goal":"g","state_version":3}"#,
        ],
    );
    ledger(
        d,
        "b",
        &[r#"{"run":"t","kind":"start","goal":"g","state_version":3}"#],
    );
    let (code, out) = audit(d, "verify", &["a", "b"], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("state version 3 is also"), "{out}");
    let (code, out) = audit(d, "handoff", &["a", "b"], &["--run", "r"]);
    assert_eq!(code, Some(0), "run r has no finding, merged or not:\n{out}");
}

// Without --auditor-key nothing is decrypted, so nothing is merged, and the text does not
// claim a merge.
#[test]
fn a_merged_verify_without_the_auditor_key_does_not_claim_a_merge() {
    let tmp = setup();
    let d = tmp.path();
    ledger(d, "a", A);
    ledger(d, "b", B);
    let o = tally(
        d,
        &[
            "verify",
            "a",
            "b",
            "--key",
            "a/ledger.pub",
            "--key",
            "b/ledger.pub",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        !out.contains("merged: 0 decisions"),
        "nothing was decrypted, so nothing was merged:\n{out}"
    );
}

/// A slice event of `id`, held by `holder`, on run `r`'s budget, granted at `t` (ms
/// since the epoch), with `attempts`; a return closes it at `t + 1000`.
fn slice(id: u64, event: &str, holder: &str, attempts: u64, t: u64) -> String {
    let closed = if event == "return" {
        format!(r#","closed_at_ms":{}"#, t + 1_000)
    } else {
        String::new()
    };
    format!(
        r#"{{"run":"","kind":"lease","lease":{id},"slice":{{"event":"{event}","holder":"{holder}","epoch":1,"scope_kind":"run","scope_key":"r","attempts":{attempts},"granted_at_ms":{t},"expires_at_ms":{}{closed}}}}}"#,
        t + 3_600_000
    )
}

/// `doc` is valid against docs/schemas/verify.json.
fn schema_valid(doc: &serde_json::Value) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/schemas/verify.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("schema")).expect("json");
    let validator = jsonschema::draft202012::new(&schema).expect("a valid schema");
    let errors: Vec<String> = validator.iter_errors(doc).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}\n{doc:#}");
}

// Two hosts lease slices of one run's 10 attempts: 6 each, the second granted while the
// first is open, is past the run's cap; the same slices one after the other are not.
// `tally verify A B` over their ledgers says which, in text and in JSON.
#[test]
fn a_merged_verify_proves_two_hosts_slices_within_the_runs_cap_or_finds_them_past_it() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let t = u64::try_from(now.as_millis()).unwrap() - 60_000;
    let start =
        r#"{"run":"r","kind":"start","goal":"g","budget":{"attempts":10},"state_version":10}"#;
    let allow = r#"{"run":"r","kind":"allow","tool":"http","operation":"get","args":{},"effect":"read","attempt":1,"lease":1,"state_version":11}"#;
    let tmp = setup();
    let d = tmp.path();
    let (a1, b1) = (
        slice(1, "grant", "host-a", 6, t),
        slice(2, "grant", "host-b", 6, t + 10),
    );
    ledger(d, "a", &[start, &a1, allow]);
    ledger(d, "b", &[&b1]);
    let (code, out) = audit(d, "verify", &["a", "b"], &["--json"]);
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(finding_kinds(&out), ["slices_over_cap"], "{out}");
    let doc: serde_json::Value =
        serde_json::from_str(out.split("\n--- stderr").next().unwrap()).unwrap();
    schema_valid(&doc);
    let f = &doc["audit"]["findings"][0];
    assert_eq!(
        (f["seq"].as_str(), f["lease"].as_u64()),
        (Some("2:1"), Some(2)),
        "{f}"
    );
    assert_eq!(doc["audit"]["leases"][0]["most_leased"]["attempts"], 12);
    let (code, text) = audit(d, "verify", &["a", "b"], &[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("slices_over_cap") && text.contains("INCONSISTENT"),
        "{text}"
    );

    // Host A returns its slice (the return written) before host B's grant: never more
    // than 6 at once.
    let tmp = setup();
    let d = tmp.path();
    let a2 = slice(1, "return", "host-a", 6, t);
    let b2 = slice(2, "grant", "host-b", 6, t + 120_000);
    ledger(d, "a", &[start, &a1, allow, &a2]);
    ledger(d, "b", &[&b2]);
    let (code, out) = audit(d, "verify", &["a", "b"], &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let doc: serde_json::Value =
        serde_json::from_str(out.split("\n--- stderr").next().unwrap()).unwrap();
    schema_valid(&doc);
    assert_eq!(doc["audit"]["leases"][0]["cap"]["known"]["attempts"], 10);
}
