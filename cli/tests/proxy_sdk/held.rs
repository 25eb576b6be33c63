use super::*;

/// A response cut mid-stream (and a non-streaming body cut short), both SDKs: the SDK
/// raises, the reservation stays held (outcome unknown), nothing is settled below what
/// the call may have cost, and so after a restart of the daemon.
#[test]
fn a_cut_response_stays_held_at_its_reservation() {
    if !sdks() {
        return;
    }
    let mut proxy = Proxy::start("");
    let mut runs = vec![];
    for sdk in SDKS {
        for stream in [false, true] {
            let run = format!("cut-{sdk}-{stream}");
            let token = proxy.run(&run, json!({"spend_cents": 100}));
            let mut args = vec!["--model", "fake-cut"];
            if stream {
                args.push("--stream");
            }
            let r = proxy.call(sdk, false, &token, &args);
            assert_ne!(r["ok"], true, "{run}: a cut response read as whole: {r}");
            let s = proxy.standing(&run);
            assert_eq!(nanos(&s, "settled"), 0, "{run}: {s}");
            assert!(
                nanos(&s, "held") >= 100 * OUT_NANOS,
                "{run}: less held than the output it may have cost: {s}"
            );
            runs.push((run, nanos(&s, "held")));
        }
    }
    proxy.stop();
    proxy.serve();
    for (run, held) in &runs {
        let s = proxy.standing(run);
        assert_eq!(nanos(&s, "held"), *held, "{run}: after a restart: {s}");
        assert_eq!(nanos(&s, "settled"), 0, "{run}: {s}");
    }
    // The ledger holds what the state holds.
    for (run, held) in &runs {
        let h = proxy.handoff(run);
        assert_eq!(nanos(&h["spend"], "reserved"), *held, "{h}");
        assert_eq!(nanos(&h["spend"], "settled"), 0, "{h}");
        proxy.serve();
    }
    proxy.verifies_the_bill();
}

/// `kill -9` of the daemon while a stream is passing through it: the SDK raises, and
/// after a restart the reservation is held (the call may have cost it), never lost and
/// never settled lower.
#[test]
fn kill_9_mid_stream_keeps_the_reservation_held() {
    if !sdks() {
        return;
    }
    let mut proxy = Proxy::start("");
    for sdk in SDKS {
        let run = format!("kill-{sdk}");
        let token = proxy.run(&run, json!({"spend_cents": 100}));
        let mut child = proxy
            .py_command(
                sdk,
                false,
                &token,
                &["hold", "--model", "fake-slow", "--stream"],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = lines.next().expect("a line").expect("read");
        assert_eq!(first, r#"{"first": true}"#, "{first}");
        let held = nanos(&proxy.standing(&run), "held");
        assert!(held >= 100 * OUT_NANOS, "{held}");
        proxy.kill9();
        let last: Value =
            serde_json::from_str(&lines.next().expect("a line").expect("read")).expect("JSON");
        assert_ne!(last["ok"], true, "a killed stream read as whole: {last}");
        let _ = child.wait();
        proxy.serve();
        let s = proxy.standing(&run);
        assert_eq!(nanos(&s, "held"), held, "{run}: after kill -9: {s}");
        assert_eq!(nanos(&s, "settled"), 0, "{run}: {s}");
    }
    let h = proxy.handoff("kill-openai");
    assert!(nanos(&h["spend"], "reserved") >= 100 * OUT_NANOS, "{h}");
    proxy.verifies_the_bill();
}

/// A redirect to another host is refused (`scope_violation`, the SDK's
/// PermissionDeniedError or PaymentRequiredError), never followed.
#[test]
fn a_redirect_to_another_host_is_refused() {
    if !sdks() {
        return;
    }
    let mut proxy = Proxy::start("");
    for sdk in SDKS {
        for stream in [false, true] {
            let token = proxy.run(
                &format!("redirect-{sdk}-{stream}"),
                json!({"spend_cents": 100}),
            );
            let mut args = vec!["--model", "fake-redirect"];
            if stream {
                args.push("--stream");
            }
            let r = proxy.call(sdk, false, &token, &args);
            let (class, status) = refused(sdk);
            raised(&r, class, status, "scope_violation");
        }
    }
    // The redirect's target (127.0.0.2:1) is no upstream: only the four calls reached one.
    assert_eq!(proxy.upstreams_saw_only_the_key(&[]), 4);
    proxy.verifies_the_bill();
}
