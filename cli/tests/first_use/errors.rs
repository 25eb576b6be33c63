//! Errors that say what, where and what to do: policies, keys, a missing ledger.

use super::*;
use crate::verify::ledger_with_groups;

/// `tally policy check FILE` on `policy`: its exit code and standard error.
fn policy_check(policy: &str) -> (Option<i32>, String) {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("policy.toml"), policy).unwrap();
    let out = run(tmp.path(), &["policy", "check", "policy.toml"], "");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A policy error names the key and its line, and says what to write instead.
#[test]
fn a_policy_error_names_the_key_and_the_line() {
    let (code, err) = policy_check("# budgets\n\n[ceiling]\nattempts = \"5\"\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("line 4")
            && err.contains("ceiling.attempts")
            && err.contains("without quotes"),
        "{err}"
    );
    let (code, err) = policy_check("[loops]\nidentical_consecutive = 3\nidentical_calls = 2\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("line 3") && err.contains("loops.identical_calls"),
        "{err}"
    );
    let (code, err) = policy_check("[retries]\nread = 0\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("line 2") && err.contains("retries.read"),
        "{err}"
    );
}

/// Zero where it makes every run useless is refused, naming the key and its line: a
/// ceiling of 0 attempts (no call could ever be made) or a deadline of 0 ms, no open
/// runs at all, a per-tool bar of 0 calls, approvals valid for 0 ms. Zero where it means
/// "none" (no side effects, no polls, no children, no spend) or "off" (a rate) is a
/// policy like any other.
#[test]
fn zero_values_that_make_runs_useless_are_refused() {
    for (policy, key, line) in [
        ("[ceiling]\nattempts = 0\n", "ceiling.attempts", 2),
        ("[ceiling]\ndeadline_ms = 0\n", "ceiling.deadline_ms", 2),
        (
            "[credentials.ci.ceiling]\nattempts = 0\n",
            "credentials.ci.ceiling.attempts",
            2,
        ),
        ("max_open_runs_per_uid = 0\n", "max_open_runs_per_uid", 1),
        ("[loops]\ntool_calls = 0\n", "loops.tool_calls", 2),
        ("[loops]\ntool_window_ms = 0\n", "loops.tool_window_ms", 2),
        (
            "[approvals]\nmax_expiry_ms = 0\n",
            "approvals.max_expiry_ms",
            2,
        ),
    ] {
        let (code, err) = policy_check(policy);
        assert_eq!(code, Some(2), "{policy}: {err}");
        assert!(
            err.contains(key) && err.contains(&format!("line {line}")),
            "{policy}: {err}"
        );
    }
    for policy in [
        "[ceiling]\nside_effects = 0\npolls = 0\ndepth = 0\nspend_cents = 0\n",
        "[rate]\nrun_per_sec = 0\ntool_per_sec = 0\n",
    ] {
        let (code, err) = policy_check(policy);
        assert_eq!(code, Some(0), "{policy}: {err}");
    }
}

/// `--auditor-key` given the public half says so, not "chmod 600".
#[test]
fn an_auditor_key_that_is_the_public_half_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ledger_with_groups(d, &[3]);
    for args in [
        &[
            "verify",
            "ledger",
            "--key",
            "ledger/ledger.pub",
            "--auditor-key",
            "auditor.pub",
        ][..],
        &[
            "handoff",
            "ledger",
            "--key",
            "ledger/ledger.pub",
            "--auditor-key",
            "auditor.pub",
        ][..],
    ] {
        let out = run(d, args, "");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("public") && err.contains("auditor.key") && !err.contains("chmod"),
            "{err}"
        );
    }
}

/// `tally serve --ledger` naming no ledger says what to do: create one with `tally init`.
#[test]
fn serve_on_a_missing_ledger_says_how_to_make_one() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let out = run(d, &["serve", "--ledger", "nodir", "--socket", "s.sock"], "");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("nodir") && err.contains("tally init --ledger nodir"),
        "{err}"
    );
    assert!(!d.join("nodir").exists(), "it made the directory");
}
