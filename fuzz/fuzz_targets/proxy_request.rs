//! The proxy's readers of what an agent and an upstream send (`tally_proxy::request` and
//! `tally_proxy::usage`): never panic; a request that is accepted is forwarded as a body
//! the same strict reader accepts again with the same model, stream and `max_tokens` (the
//! capped or injected one), at most as long as the input bound, and its worst case is at
//! least what the input bound and the output asked for cost. Usage readers never panic on
//! any answer or event.
#![no_main]
use tally_policy::{ModelPrice, UpstreamKind};
use tally_proxy::request::parse;
use tally_proxy::usage::{from_body, StreamUsage};
use tally_record::money::{per_million, Nanos};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let kind = if selector & 1 == 0 {
        UpstreamKind::Openai
    } else {
        UpstreamKind::Anthropic
    };
    // The usage readers take anything.
    let _ = from_body(kind, body);
    if let Ok(text) = std::str::from_utf8(body) {
        let mut s = StreamUsage::new(kind);
        for line in text.split('\n') {
            s.event(line);
        }
        let _ = s.usage();
    }
    let Ok(request) = parse(kind, body) else {
        return;
    };
    let price = ModelPrice {
        input_per_mtok: Nanos(u64::from(selector) * 1_000_000),
        cached_input_per_mtok: Nanos(u64::from(selector >> 1) * 1_000_000),
        output_per_mtok: Nanos(u64::from(selector >> 2) * 10_000_000),
        max_output_tokens: 1 + u64::from(selector) * 64,
    };
    let remaining = Nanos(u64::from(selector) * 1_000_000_000);
    let priced = request.price(kind, &price, remaining);
    assert!(priced.input_bound >= priced.body.len() as u64);
    assert!(priced.max_tokens >= 1 && priced.max_tokens <= price.max_output_tokens);
    let again = parse(kind, &priced.body).unwrap_or_else(|e| {
        panic!(
            "the forwarded body is refused: {e}\n{}",
            String::from_utf8_lossy(&priced.body)
        )
    });
    assert_eq!(again.model, request.model);
    assert_eq!(again.stream, request.stream);
    assert_eq!(again.choices, request.choices);
    assert_eq!(again.max_tokens, Some(priced.max_tokens));
    let input = per_million(
        priced.input_bound,
        price.input_per_mtok.max(price.cached_input_per_mtok),
    );
    let output = per_million(
        priced.max_tokens.saturating_mul(request.choices),
        price.output_per_mtok,
    );
    if let (Some(i), Some(o)) = (input, output) {
        if let Some(total) = i.checked_add(o) {
            assert!(priced.worst >= total, "{priced:?}");
        }
    }
    if priced.injected {
        assert!(
            priced.worst <= remaining || priced.max_tokens == 1,
            "an injected max_tokens the budget cannot pay: {priced:?}"
        );
    }
});
