use super::*;

/// Each SDK, streaming and not, over HTTP and HTTPS: the call goes through, the SDK
/// parses the answer as the upstream's, tally's headers name the run and the attempt, the
/// upstream got the real key and never the token, and the run settled exactly what the
/// reported usage costs at the policy's prices.
#[test]
fn the_sdks_call_through_the_proxy_with_the_token() {
    if !sdks() {
        return;
    }
    let mut proxy = Proxy::start("");
    let mut tokens = vec![];
    let mut calls = 0;
    for sdk in SDKS {
        for tls in [false, true] {
            for stream in [false, true] {
                let run = format!("{sdk}-{tls}-{stream}");
                let token = proxy.run(&run, json!({"spend_cents": 100}));
                let mut args = vec!["--model", "fake-ok"];
                if stream {
                    args.push("--stream");
                }
                let r = proxy.call(sdk, tls, &token, &args);
                calls += 1;
                assert_eq!(r["ok"], true, "{run}: {r}");
                assert_eq!(r["headers"]["x-tally-run"], run.as_str(), "{r}");
                assert!(r["headers"]["x-tally-attempt"].is_string(), "{r}");
                assert!(r["headers"]["x-tally-seq"].is_string(), "{r}");
                assert!(!r["text"].as_str().unwrap_or("").is_empty(), "{r}");
                // OpenAI streaming: the proxy asked the upstream for usage, and the SDK,
                // which did not ask, sees no usage chunk.
                if sdk == "openai" && stream {
                    assert_eq!(r["usage"], Value::Null, "{r}");
                    assert_eq!(r["empty_choices"], 0, "{r}");
                } else {
                    assert_eq!(
                        r["usage"]["input_tokens"]
                            .as_u64()
                            .or(r["usage"]["prompt_tokens"].as_u64()),
                        Some(100),
                        "{r}"
                    );
                }
                let s = proxy.standing_settled(&run);
                assert_eq!(
                    nanos(&s, "settled"),
                    charged(&s, 100, 50),
                    "{run}: settled from the usage: {s}"
                );
                assert_eq!(nanos(&s, "held"), 0, "{run}: {s}");
                tokens.push(token);
            }
        }
    }
    // OpenAI streaming that asks for usage gets it, as from the upstream.
    let token = proxy.run("openai-usage", json!({"spend_cents": 100}));
    let r = proxy.call(
        "openai",
        false,
        &token,
        &["--model", "fake-ok", "--stream", "--include-usage"],
    );
    calls += 1;
    assert_eq!(r["usage"]["prompt_tokens"], 100, "{r}");
    assert_eq!(r["usage"]["completion_tokens"], 50, "{r}");
    tokens.push(token);
    for up in [&proxy.http, &proxy.https] {
        for seen in up.seen() {
            if seen.path.ends_with("/chat/completions") && seen.stream {
                let options: Value =
                    serde_json::from_str(seen.stream_options.as_deref().unwrap_or("null"))
                        .expect("stream_options JSON");
                assert_eq!(
                    options["include_usage"], true,
                    "the proxy did not ask for usage: {seen:?}"
                );
            }
        }
    }
    let t: Vec<&str> = tokens.iter().map(String::as_str).collect();
    assert_eq!(proxy.upstreams_saw_only_the_key(&t), calls);
    // And the ledger says what the state said.
    let h = proxy.handoff("openai-false-false");
    assert_eq!(
        nanos(&h["spend"], "settled"),
        charged(&h["spend"], 100, 50),
        "{h}"
    );
    proxy.verifies_the_bill();
}

/// An OpenAI agent that sends no `max_tokens` gets one: the most its remaining budget
/// can pay at the output price, capped by the model's limit; the upstream receives it.
#[test]
fn a_call_without_max_tokens_gets_one_its_budget_can_pay() {
    if !sdks() {
        return;
    }
    let mut proxy = Proxy::start("");
    for stream in [false, true] {
        let run = format!("nomax-{stream}");
        // 10 cents: at 0.05 cent per output token, fewer than 200 tokens.
        let token = proxy.run(&run, json!({"spend_cents": 10}));
        let mut args = vec!["--model", "fake-usage-100-50", "--no-max-tokens"];
        if stream {
            args.push("--stream");
        }
        let before = proxy.http.seen().len();
        let r = proxy.call("openai", false, &token, &args);
        assert_eq!(r["ok"], true, "{r}");
        let seen = proxy.http.seen();
        assert_eq!(seen.len(), before + 1);
        let injected = seen[before]
            .max_tokens
            .unwrap_or_else(|| panic!("no max_tokens reached the upstream: {:?}", seen[before]));
        assert!(injected > 0, "{injected}");
        assert!(
            injected * OUT_NANOS <= 10 * CENT,
            "{injected} output tokens cost more than the 10-cent budget"
        );
        // Not needlessly small: the input estimate is bounded, the rest is output.
        assert!(
            injected >= 100,
            "only {injected} tokens of a 200-token budget"
        );
        // The second call gets what is left after the first settled.
        let s = proxy.standing(&run);
        let left = 10 * CENT - nanos(&s, "settled");
        let r = proxy.call("openai", false, &token, &args);
        assert_eq!(r["ok"], true, "{r}");
        let seen = proxy.http.seen();
        let second = seen.last().and_then(|s| s.max_tokens).expect("max_tokens");
        assert!(
            second * OUT_NANOS <= left,
            "{second} tokens past what was left"
        );
    }
    // The model's own limit caps it when the budget could pay more.
    let token = proxy.run("nomax-small", json!({"spend_cents": 100}));
    let r = proxy.call(
        "openai",
        false,
        &token,
        &["--model", "fake-small", "--no-max-tokens"],
    );
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(
        proxy.http.seen().last().and_then(|s| s.max_tokens),
        Some(40)
    );
    proxy.verifies_the_bill();
}

/// A stopped run's token is refused with the stop's reason and action `stop` (403, the
/// OpenAI SDK's PermissionDeniedError; 402, the Anthropic SDK's PaymentRequiredError:
/// errors agents show and do not retry); a token never issued is 401
/// (AuthenticationError). Nothing reaches the upstream.
#[test]
fn a_stopped_runs_token_is_refused_with_its_reason_and_a_forged_one_401() {
    if !sdks() {
        return;
    }
    let mut proxy = Proxy::start("");
    for sdk in SDKS {
        let run = format!("stopped-{sdk}");
        let token = proxy.run(&run, json!({"spend_cents": 100}));
        assert_eq!(proxy.call(sdk, false, &token, &[])["ok"], true);
        let (status, v) = proxy.agent("POST", &format!("/v1/runs/{run}/stop"), Some(json!({})));
        assert_eq!(status, 200, "{v}");
        let before = proxy.http.seen().len();
        let r = proxy.call(sdk, false, &token, &[]);
        let (class, status) = refused(sdk);
        assert_eq!(r["error"], class, "{r}");
        assert_eq!(r["status"], status, "{r}");
        let m = r["message"].as_str().unwrap_or("");
        assert!(m.contains("completed") && m.contains("action stop"), "{r}");
        let r = proxy.call(sdk, false, "tally-not-a-token", &[]);
        assert_eq!(r["error"], "AuthenticationError", "{r}");
        assert_eq!(r["status"], 401, "{r}");
        assert_eq!(
            proxy.http.seen().len(),
            before,
            "a refused call reached the upstream"
        );
    }
    proxy.verifies_the_bill();
}

/// tally's refusals raise the SDK's normal errors with the reason code in the message:
/// `retry` as RateLimitError (429, Retry-After), `ask`/`stop` as PermissionDeniedError
/// (OpenAI) or PaymentRequiredError (Anthropic).
#[test]
fn refusals_raise_the_sdks_own_errors() {
    if !sdks() {
        return;
    }
    let mut proxy = Proxy::start("[rate]\nrun_per_sec = 1\nrun_burst = 1\n");
    for sdk in SDKS {
        for stream in [false, true] {
            let mut args = vec!["--model", "fake-ok"];
            if stream {
                args.push("--stream");
            }
            // A run whose budget cannot pay for one call: ask.
            let token = proxy.run(&format!("poor-{sdk}-{stream}"), json!({"spend_cents": 1}));
            let r = proxy.call(sdk, false, &token, &args);
            let (class, status) = refused(sdk);
            raised(&r, class, status, "reservation_insufficient");
            // A run past its rate (one call a second): retry, with Retry-After.
            let token = proxy.run(&format!("fast-{sdk}-{stream}"), json!({"spend_cents": 100}));
            let mut race = vec!["race", "--n", "3"];
            race.extend_from_slice(&args);
            let results = proxy.py(sdk, false, &token, &race);
            let limited: Vec<&Value> = results.iter().filter(|r| r["ok"] != true).collect();
            assert_eq!(results.len() - limited.len(), 1, "{results:?}");
            for r in limited {
                raised(r, "RateLimitError", 429, "rate_limit_exceeded");
                assert!(r["headers"]["retry-after"].is_string(), "{r}");
            }
        }
    }
    // The upstream's own 429 is passed through as the upstream's (and observed rejected).
    let token = proxy.run("upstream-429", json!({"spend_cents": 100}));
    let r = proxy.call("openai", false, &token, &["--model", "fake-429"]);
    assert_eq!(r["error"], "RateLimitError", "{r}");
    let s = proxy.standing_settled("upstream-429");
    assert_eq!(nanos(&s, "held"), 0, "a rejected call holds nothing: {s}");
    proxy.verifies_the_bill();
}

/// The Anthropic SDK set up as docs/PROXY.md ("The Anthropic SDK") says, from
/// `ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY`: `messages.count_tokens` gets the
/// upstream's count and reserves, settles and sends a limit for nothing; a message
/// reserves its forwarded body's bytes at the input price and its `max_tokens` at the
/// output price, and settles its usage.
#[test]
fn the_anthropic_sdk_counts_tokens_for_nothing_and_a_message_reserves_its_limit() {
    if !sdks() {
        return;
    }
    let mut proxy = Proxy::start("");
    let run = "anthropic-count";
    let token = proxy.run(run, json!({"spend_cents": 100}));
    let r = proxy.py("anthropic", false, &token, &["count", "--model", "fake-ok"]);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0]["ok"], true, "{r:?}");
    assert_eq!(r[0]["input_tokens"], 100, "{r:?}");
    let s = proxy.standing_settled(run);
    assert_eq!((nanos(&s, "settled"), nanos(&s, "held")), (0, 0), "{s}");
    let r = proxy.call(
        "anthropic",
        false,
        &token,
        &["--model", "fake-ok", "--max-tokens", "100"],
    );
    assert_eq!(r["ok"], true, "{r}");
    let s = proxy.standing_settled(run);
    assert_eq!(nanos(&s, "settled"), charged(&s, 100, 50), "{s}");
    let seen = proxy.http.seen();
    let paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(paths, ["/v1/messages/count_tokens", "/v1/messages"]);
    assert_eq!(seen[0].max_tokens, None, "{:?}", seen[0]);
    assert_eq!(seen[1].max_tokens, Some(100), "{:?}", seen[1]);
    proxy.stop();
    let decisions = ledger::decisions(proxy.dir.path());
    let reserved: Vec<u64> = ledger::checks(&decisions, run, "anthropic")
        .iter()
        .map(|d| d["reserve_nanos"].as_u64().unwrap_or(0))
        .collect();
    // The input bound is measured with the longest limit's 20 digits in place of `100`.
    let input_bound = seen[1].body_len as u64 - 3 + 20;
    assert_eq!(
        reserved,
        [0, input_bound * IN_NANOS + 100 * OUT_NANOS],
        "{decisions:#?}"
    );
    proxy.verifies_the_bill();
}
