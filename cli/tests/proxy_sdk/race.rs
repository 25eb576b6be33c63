use super::*;

/// How the upstream in a race bills.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bills {
    /// Within what each call reserved.
    Honestly,
    /// Past what calls reserved (more than the body's bytes in, more than `max_tokens`
    /// out).
    PastTheReservation,
}

/// 64 calls at once against a budget of 100 cents through each SDK, streaming (over
/// HTTPS) and not (over HTTP), the upstream reporting the usage of `models` in turn:
/// every call either went through or was refused in the SDK's own error with the reason,
/// and the ledger's settled total is the state's to the unit. Billed honestly, the run
/// never settles more than 100 cents and has no overrun. Billed past the reservations,
/// each call settles its bill: what is settled beyond 100 cents is exactly covered by
/// the overruns `tally verify` lists (each allowed while the budget had room, so at most
/// one per racing call), each with the seq of the outcome that records it, and no call
/// was allowed after an overrun's outcome (the audit finds nothing). Either way the
/// upstreams' bill is the ledger's.
fn race_within_the_budget(models: &str, bills: Bills) {
    let mut proxy = Proxy::start("");
    let mut runs = vec![];
    for sdk in SDKS {
        for stream in [false, true] {
            let tls = stream;
            let run = format!("race-{sdk}-{stream}");
            let token = proxy.run(&run, json!({"spend_cents": 100}));
            let mut args = vec!["race", "--n", "64", "--models", models];
            if stream {
                args.push("--stream");
            }
            let results = proxy.py(sdk, tls, &token, &args);
            assert_eq!(results.len(), 64);
            let passed = results.iter().filter(|r| r["ok"] == true).count();
            for r in results.iter().filter(|r| r["ok"] != true) {
                let (class, status) = refused(sdk);
                assert_eq!(r["error"], class, "{run}: {r}");
                assert_eq!(r["status"], status, "{r}");
                let m = r["message"].as_str().unwrap_or("");
                assert!(
                    m.contains("reservation_insufficient") || m.contains("budget_exceeded"),
                    "{run}: refused without the reason: {r}"
                );
            }
            // 5 cents of output reserved per call: 64 never fit, so refusals happened
            // (calls that settle below their reservation free budget for later ones).
            assert!(
                (1..64).contains(&passed),
                "{run}: {passed} calls went through"
            );
            let s = proxy.standing_settled(&run);
            let settled = nanos(&s, "settled");
            let held = nanos(&s, "held");
            if bills == Bills::Honestly {
                assert!(
                    settled + held <= 100 * CENT,
                    "{run}: settled {settled} + held {held} nanodollars past 100 cents: {s}"
                );
            }
            assert_eq!(held, 0, "{run}: every call ended: {s}");
            runs.push((run, settled, passed));
        }
    }
    proxy.upstreams_saw_only_the_key(&[]);
    for (run, settled, passed) in runs {
        let h = proxy.handoff(&run);
        assert_eq!(
            nanos(&h["spend"], "settled"),
            settled,
            "{run}: the ledger and the state disagree: {h}"
        );
        let (out, report) = tally().report(proxy.dir.path(), "verify", &[]);
        assert_eq!(out.status.code(), Some(0), "{run}: {report}");
        assert_eq!(report["audit"]["findings"], json!([]), "{run}: {report}");
        let overruns: Vec<&Value> = report["audit"]["overruns"]
            .as_array()
            .expect("overruns")
            .iter()
            .filter(|o| o["run"] == run.as_str())
            .collect();
        let over: u64 = overruns
            .iter()
            .map(|o| o["overrun_nanos"].as_u64().expect("overrun_nanos"))
            .sum();
        // Verify names each overrun by the seq of the outcome that records it.
        let listed: std::collections::BTreeSet<u64> = overruns
            .iter()
            .map(|o| o["seq"].as_u64().expect("seq"))
            .collect();
        let recorded: std::collections::BTreeSet<u64> = tally()
            .decisions(proxy.dir.path(), &run)
            .iter()
            .filter(|d| d["decision"]["overrun_nanos"].is_u64())
            .map(|d| d["seq"].as_u64().expect("seq"))
            .collect();
        assert_eq!(listed, recorded, "{run}");
        match bills {
            Bills::Honestly => assert!(overruns.is_empty(), "{run}: {overruns:?}"),
            Bills::PastTheReservation => {
                assert!(!overruns.is_empty(), "{run}: no overrun recorded");
                assert!(overruns.len() <= passed, "{run}: {overruns:?}");
                assert!(
                    settled <= 100 * CENT + over,
                    "{run}: {settled} settled, past the budget by more than the overruns ({over})"
                );
            }
        }
        proxy.serve();
    }
    proxy.verifies_the_bill();
}

/// Honest usage (within what each call reserved: none, some, all of `max_tokens`).
#[test]
fn sixty_four_racing_calls_never_settle_past_the_budget() {
    if sdks() {
        race_within_the_budget(
            "fake-ok,fake-usage-0-0,fake-usage-100-100,fake-usage-100-20",
            Bills::Honestly,
        );
    }
}

/// Usage far beyond what each call reserved (an upstream that bills past `max_tokens`
/// or past the body's bytes): each call settles its bill (the ledger equals the bill),
/// the excess is an overrun per call, recorded, and no call is allowed after one.
#[test]
fn sixty_four_racing_calls_past_their_reservations_settle_the_bill_as_overruns() {
    if sdks() {
        race_within_the_budget(
            "fake-ok,fake-usage-100-1000000,fake-usage-1000000-1000000",
            Bills::PastTheReservation,
        );
    }
}

/// Calls to one model at once, each its own prompt, are distinct calls, not retries of
/// one logical operation: with a budget that pays for all of them, 8 concurrent calls all
/// go through (none refused `retries_exhausted`, whose action `stop` would end the run).
#[test]
fn concurrent_calls_to_one_model_are_not_retries() {
    if !sdks() {
        return;
    }
    let mut proxy = Proxy::start("");
    for sdk in SDKS {
        let run = format!("parallel-{sdk}");
        let token = proxy.run(&run, json!({"spend_cents": 1000}));
        let results = proxy.py(
            sdk,
            false,
            &token,
            &["race", "--n", "8", "--model", "fake-ok"],
        );
        for r in &results {
            assert_eq!(r["ok"], true, "{run}: {r}");
        }
        // And one after another, after calls the upstream failed (5xx), new prompts are
        // not retries either.
        let run = format!("sequential-{sdk}");
        let token = proxy.run(&run, json!({"spend_cents": 1000}));
        for _ in 0..3 {
            let r = proxy.call(sdk, false, &token, &["--model", "fake-500"]);
            assert_eq!(r["error"], "InternalServerError", "{r}");
        }
        let r = proxy.call(sdk, false, &token, &["--model", "fake-500"]);
        assert_eq!(
            r["error"], "InternalServerError",
            "{run}: a new prompt refused: {r}"
        );
    }
    proxy.verifies_the_bill();
}
