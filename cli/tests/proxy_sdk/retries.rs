//! The SDKs at their default `max_retries` (2, for both): what tally says may be retried
//! is sent again, what would be refused again is sent once (`x-should-retry`).

use super::*;

/// A `stop` refusal (a model with no price: `scope_violation`) and an `ask` refusal
/// (`reservation_insufficient`) reach the proxy once each, however many retries the SDK
/// has: one deny each in the ledger, the SDK's exception raised with
/// `x-should-retry: false`. A `retry` refusal (the gate's rate limit, `Retry-After: 1`)
/// is sent again after its back-off and goes through: both racing calls succeed, and
/// the ledger holds the refusal the SDK retried.
#[test]
fn the_sdks_send_a_stop_refusal_once_and_retry_a_retry_refusal() {
    if !sdks() {
        return;
    }
    let mut proxy = Proxy::start("[rate]\nrun_per_sec = 1\nrun_burst = 1\n");
    for sdk in SDKS {
        let (class, status) = refused(sdk);
        let token = proxy.run(&format!("unpriced-{sdk}"), json!({"spend_cents": 100}));
        let r = proxy.call(
            sdk,
            false,
            &token,
            &["--default-retries", "--model", "fake-unpriced"],
        );
        raised(&r, class, status, "scope_violation");
        assert!(
            r["message"]
                .as_str()
                .is_some_and(|m| m.contains("action stop")),
            "{r}"
        );
        assert_eq!(r["headers"]["x-should-retry"], "false", "{r}");
        let token = proxy.run(&format!("poor-{sdk}"), json!({"spend_cents": 1}));
        let r = proxy.call(sdk, false, &token, &["--default-retries"]);
        raised(&r, class, status, "reservation_insufficient");
        assert!(
            r["message"]
                .as_str()
                .is_some_and(|m| m.contains("action ask")),
            "{r}"
        );
        assert_eq!(r["headers"]["x-should-retry"], "false", "{r}");
        let token = proxy.run(&format!("fast-{sdk}"), json!({"spend_cents": 100}));
        let results = proxy.py(
            sdk,
            false,
            &token,
            &["race", "--n", "2", "--default-retries"],
        );
        assert!(
            results.iter().all(|r| r["ok"] == true),
            "the refused call was retried after its Retry-After and went through: {results:?}"
        );
    }
    proxy.stop();
    let decisions = ledger::decisions(proxy.dir.path());
    for sdk in SDKS {
        for (run, reason) in [
            (format!("unpriced-{sdk}"), "scope_violation"),
            // Asked of a human (the policy's default `ask_on`), its cause in the answer.
            (format!("poor-{sdk}"), "approval_required"),
        ] {
            let checks = ledger::checks(&decisions, &run, sdk);
            assert_eq!(
                checks.len(),
                1,
                "{run}: the refused call reached the proxy once: {checks:#?}"
            );
            assert_eq!(ledger::count(&checks, "deny"), 1, "{checks:#?}");
            assert_eq!(checks[0]["reason"], reason, "{checks:#?}");
        }
        let run = format!("fast-{sdk}");
        let checks = ledger::checks(&decisions, &run, sdk);
        assert_eq!(ledger::count(&checks, "allow"), 2, "{run}: {checks:#?}");
        assert!(
            checks
                .iter()
                .any(|d| d["kind"] == "deny" && d["reason"] == "rate_limit_exceeded"),
            "{run}: one call was refused and retried: {checks:#?}"
        );
    }
}
