//! The proxy's readers of what an agent and an upstream send (`tally_proxy::request` and
//! `tally_proxy::usage`): never panic; a request that is accepted is forwarded as a body
//! the same strict reader accepts again with the same model, stream and output limit (the
//! capped, clamped or injected one), at most as long as the input bound, and its worst case is at
//! least what the input bound and the output asked for cost. Usage readers never panic on
//! any answer or event, and read an answer as they read it whole into a `Value`.
#![no_main]
use tally_policy::ModelPrice;
use tally_proxy::request::{parse, Endpoint};
use tally_proxy::usage::{answer, answer_of_value, from_body, StreamUsage};
use tally_record::money::{per_million, Nanos};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let endpoint = match selector & 3 {
        0 => Endpoint::ChatCompletions,
        1 => Endpoint::Messages,
        2 => Endpoint::Responses,
        _ => Endpoint::CountTokens,
    };
    // The usage readers take anything, and read an answer as they read it whole into a
    // `Value` (but where serde_json's private marker key, which its `Value` reader alone
    // reads as its own, may be in it).
    let _ = from_body(endpoint, body);
    let marked = body.windows(7).any(|w| w == b"private") || body.windows(2).any(|w| w == b"\\u");
    if let (Ok(v), false) = (serde_json::from_slice(body), marked) {
        assert_eq!(answer(endpoint, body), answer_of_value(endpoint, &v));
    }
    if let Ok(text) = std::str::from_utf8(body) {
        let mut s = StreamUsage::new(endpoint);
        for line in text.split('\n') {
            s.event(line);
        }
        let _ = s.reported();
    }
    let Ok(request) = parse(endpoint, body) else {
        return;
    };
    let input = Nanos(u64::from(selector) * 1_000_000);
    let price = ModelPrice {
        cached_input_per_mtok: Nanos(u64::from(selector >> 1) * 1_000_000).min(input),
        cache_write_per_mtok: Some(Nanos(u64::from(selector) * 1_250_000)),
        cache_write_1h_per_mtok: Some(Nanos(u64::from(selector) * 2_000_000)),
        max_output_tokens: 1 + u64::from(selector) * 64,
        tool_prompt_tokens: u64::from(selector >> 3) * 100,
        web_search_per_use: Some(Nanos(10_000_000)),
        ..ModelPrice::new(input, Nanos(u64::from(selector >> 2) * 10_000_000))
    };
    let remaining = Nanos(u64::from(selector) * 1_000_000_000);
    let Ok(priced) = request.price(&price, remaining, selector & 4 != 0) else {
        return;
    };
    if endpoint == Endpoint::CountTokens {
        assert_eq!(priced.worst, Nanos(0));
        return;
    }
    assert!(priced.input_bound >= priced.body.len() as u64);
    assert!(priced.max_tokens >= 1 && priced.max_tokens <= price.max_output_tokens);
    let again = parse(endpoint, &priced.body).unwrap_or_else(|e| {
        panic!(
            "the forwarded body is refused: {e}\n{}",
            String::from_utf8_lossy(&priced.body)
        )
    });
    assert_eq!(again.model, request.model);
    assert_eq!(again.stream, request.stream);
    assert_eq!(again.choices, request.choices);
    assert_eq!(again.max_tokens, Some(priced.max_tokens));
    let rate = price.input_rate(request.cache).unwrap_or(Nanos::MAX);
    let input = per_million(priced.input_bound, rate);
    let output = per_million(
        priced.max_tokens.saturating_mul(request.choices),
        price.output_per_mtok,
    );
    if let (Some(i), Some(o)) = (input, output) {
        if let Some(total) = i.checked_add(o) {
            assert!(priced.worst >= total, "{priced:?}");
        }
    }
    if priced.injected || priced.clamped {
        assert!(
            priced.worst <= remaining || priced.max_tokens == 1,
            "an injected or clamped limit the budget cannot pay: {priced:?}"
        );
    }
});
