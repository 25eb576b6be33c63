//! The price table import's unit tests, on an excerpt of LiteLLM's real table.

use super::*;

/// Entries of LiteLLM's `model_prices_and_context_window.json`, verbatim.
const TABLE: &str =
    include_str!("../../../cli/tests/cmd/prices-import.in/model_prices_and_context_window.json");

fn opts(providers: &[(&str, &str)]) -> ImportOptions {
    ImportOptions {
        providers: providers
            .iter()
            .map(|(p, u)| ((*p).to_owned(), (*u).to_owned()))
            .collect(),
        models: Vec::new(),
        source: "model_prices_and_context_window.json".into(),
        as_of: Date::parse("2026-12-01").expect("a date"),
    }
}

#[test]
fn chat_models_are_written_exactly_and_the_rest_counted() {
    let got = import_litellm(TABLE, &opts(&[])).expect("imports");
    let prices = crate::upstreams::Prices::read(&got.toml).expect("the policy reads it");
    let nova = prices
        .model("bedrock_converse", "amazon.nova-2-lite-v1:0")
        .expect("priced");
    assert_eq!(nova.input_per_mtok, Nanos(300_000_000));
    assert_eq!(nova.cached_input_per_mtok, Nanos(75_000_000));
    assert_eq!(nova.output_per_mtok, Nanos(2_500_000_000));
    assert_eq!(nova.max_output_tokens, 64_000);
    assert_eq!(nova.context_tokens, 1_000_000);
    assert_eq!(
        nova.source.as_deref(),
        Some("model_prices_and_context_window.json")
    );
    assert_eq!(
        nova.as_of.map(|d| d.to_string()).as_deref(),
        Some("2026-12-01")
    );
    // `azure/` is the provider's prefix, not the API's id.
    let o4 = prices
        .model("azure", "us/o4-mini-2025-04-16")
        .expect("priced");
    assert_eq!(o4.input_per_mtok, Nanos(1_210_000_000));
    assert_eq!(o4.output_per_mtok, Nanos(4_840_000_000));
    let phi = prices
        .model("azure_ai", "Phi-4-mini-instruct")
        .expect("priced");
    assert_eq!(phi.input_per_mtok, Nanos(75_000_000));
    // No cache price in the table: a cache read is billed as input.
    assert_eq!(phi.cached_input_per_mtok, phi.input_per_mtok);
    assert_eq!(
        got.written,
        [("azure", 1), ("azure_ai", 2), ("bedrock_converse", 2)]
            .map(|(k, n)| (k.to_owned(), n))
            .into()
    );
    assert_eq!(
        got.skipped,
        [
            ("mode audio_transcription", 1),
            ("mode embedding", 1),
            ("mode image_generation", 1)
        ]
        .map(|(k, n)| (k.to_owned(), n))
        .into()
    );
}

#[test]
fn providers_are_chosen_and_named_and_models_filtered() {
    let mut o = opts(&[("azure_ai", "phi"), ("azure", "openai")]);
    o.models = vec!["Phi-4-mini*".into(), "us/o4-mini-2025-04-16".into()];
    let got = import_litellm(TABLE, &o).expect("imports");
    let prices = crate::upstreams::Prices::read(&got.toml).expect("reads");
    assert!(prices.model("phi", "Phi-4-mini-instruct").is_some());
    assert!(prices.model("phi", "Phi-4").is_none());
    assert!(prices.model("openai", "us/o4-mini-2025-04-16").is_some());
    assert_eq!(got.skipped.get("other provider"), Some(&3));
    assert_eq!(got.skipped.get("not in --model"), Some(&1));
    assert!(
        got.summary()
            .starts_with("2 prices written (openai 1, phi 1); "),
        "{}",
        got.summary()
    );
}

/// `entry` as the only model of a table.
fn one(entry: &str) -> Result<Imported, ImportError> {
    import_litellm(&format!("{{\"m\": {entry}}}"), &opts(&[]))
}

fn entry_error(entry: &str) -> (String, String) {
    match one(entry) {
        Err(ImportError::Entry { model, field, .. }) => (model, field),
        other => panic!("{entry}: {other:?}"),
    }
}

#[test]
fn a_malformed_entry_names_its_model_and_field() {
    let base = r#""litellm_provider": "openai", "mode": "chat""#;
    for (fields, field) in [
        (
            r#""input_cost_per_token": "1.5e-07", "output_cost_per_token": 6e-07"#,
            "input_cost_per_token",
        ),
        (
            r#""input_cost_per_token": -1e-07, "output_cost_per_token": 6e-07"#,
            "input_cost_per_token",
        ),
        (r#""output_cost_per_token": 6e-07"#, "input_cost_per_token"),
        (r#""input_cost_per_token": 1e-07"#, "output_cost_per_token"),
        (
            r#""input_cost_per_token": 1e-16, "output_cost_per_token": 6e-07"#,
            "input_cost_per_token",
        ),
        (
            r#""input_cost_per_token": 1e-07, "output_cost_per_token": 6e-07, "max_output_tokens": 1.5"#,
            "max_output_tokens",
        ),
        (
            r#""input_cost_per_token": 1e-07, "output_cost_per_token": 6e-07, "max_input_tokens": "lots""#,
            "max_input_tokens",
        ),
        (
            r#""input_cost_per_token": 1e-07, "output_cost_per_token": 6e-07, "cache_read_input_token_cost": 2e-07"#,
            "cache_read_input_token_cost",
        ),
    ] {
        assert_eq!(
            entry_error(&format!("{{{base}, {fields}}}")),
            ("m".into(), field.into()),
            "{fields}"
        );
    }
    assert_eq!(entry_error(r#"{"mode": "chat"}"#).1, "litellm_provider");
    assert_eq!(entry_error("[1]").1, "(entry)");
    assert_eq!(
        entry_error(r#"{"litellm_provider": "openai", "mode": 3}"#).1,
        "mode"
    );
}

#[test]
fn rates_one_price_cannot_state_are_skipped_and_counted() {
    let long = r#"{"litellm_provider": "gemini", "mode": "chat", "input_cost_per_token": 1.25e-06, "input_cost_per_token_above_200k_tokens": 2.5e-06, "output_cost_per_token": 1e-05}"#;
    let reasoning = r#"{"litellm_provider": "gemini", "mode": "chat", "input_cost_per_token": 1e-07, "output_cost_per_token": 4e-07, "output_cost_per_reasoning_token": 3.5e-06}"#;
    let free_output = r#"{"litellm_provider": "openai", "mode": "chat", "input_cost_per_token": 1e-07, "output_cost_per_token": 0.0}"#;
    let free_input = r#"{"litellm_provider": "openai", "mode": "chat", "input_cost_per_token": 0, "output_cost_per_token": 1e-07}"#;
    for (entry, why) in [
        (long, "priced by prompt length"),
        (reasoning, "reasoning priced apart"),
        (free_output, "a zero input or output rate"),
        (free_input, "a zero input or output rate"),
    ] {
        match one(entry) {
            Err(ImportError::Nothing { skipped }) => assert_eq!(skipped, format!("{why} 1")),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn hostile_names_are_refused_and_shown_escaped() {
    let entry = r#"{"litellm_provider": "openai", "mode": "chat", "input_cost_per_token": 1e-07, "output_cost_per_token": 1e-07}"#;
    let table = format!("{{\"gpt\\u001b[31m\\u202e\": {entry}}}");
    let err = import_litellm(&table, &opts(&[])).expect_err("refused");
    let text = err.to_string();
    assert!(
        matches!(err, ImportError::Entry { ref field, .. } if field == "(model id)"),
        "{text}"
    );
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{202e}'),
        "{text}"
    );
    let bad_provider = r#"{"litellm_provider": "a.b", "mode": "chat", "input_cost_per_token": 1e-07, "output_cost_per_token": 1e-07}"#;
    assert!(matches!(
        one(bad_provider),
        Err(ImportError::Upstream { .. })
    ));
    let mut o = opts(&[]);
    o.source = "evil\u{1b}[2J".into();
    assert!(matches!(
        import_litellm(TABLE, &o),
        Err(ImportError::Source(_))
    ));
}

#[test]
fn a_table_that_is_not_one_or_too_large_is_refused() {
    for text in ["", "[]", "{\"a\": 1", "nope"] {
        assert!(
            matches!(
                import_litellm(text, &opts(&[])),
                Err(ImportError::NotATable(_))
            ),
            "{text}"
        );
    }
    let entry = r#"{"litellm_provider": "openai", "mode": "chat", "input_cost_per_token": 1e-07, "output_cost_per_token": 1e-07}"#;
    let many: Vec<String> = (0..100)
        .map(|i| format!("\"model-{i}\": {entry}"))
        .collect();
    let table = format!("{{{}}}", many.join(","));
    assert!(matches!(
        import_litellm(&table, &opts(&[])),
        Err(ImportError::TooLarge { .. })
    ));
}

#[test]
fn two_entries_for_one_id_are_refused() {
    let entry = r#"{"litellm_provider": "gemini", "mode": "chat", "input_cost_per_token": 1e-07, "output_cost_per_token": 1e-07}"#;
    let table = format!("{{\"gemini/x\": {entry}, \"x\": {entry}}}");
    assert!(matches!(
        import_litellm(&table, &opts(&[])),
        Err(ImportError::Duplicate { .. })
    ));
}

#[test]
fn per_token_costs_become_exact_prices_per_million() {
    for (per_token, usd) in [
        (1.5e-07, "0.15"),
        (6e-07, "0.6"),
        (2.1875e-06, "2.1875"),
        (5.46875e-07, "0.546875"),
        (1.88e-05, "18.8"),
        (0.0, "0"),
        (7.5e-14, "0.000000075"),
    ] {
        assert_eq!(per_million(per_token), parse_usd(usd).ok(), "{per_token}");
    }
    // Finer than a nanodollar per million tokens: not a price the policy can hold.
    assert_eq!(per_million(1e-16), None);
}

#[test]
fn dated_snapshots_at_their_models_rates_become_its_aliases() {
    let at = |input: &str| {
        format!(
            r#"{{"litellm_provider": "openai", "mode": "chat", "input_cost_per_token": {input}, "output_cost_per_token": 6e-07}}"#
        )
    };
    let table = format!(
        "{{\"gpt-4o-mini\": {}, \"gpt-4o-mini-2024-07-18\": {}, \"claude-x\": {}, \"claude-x-20251001\": {}, \"gpt-4o\": {}, \"gpt-4o-2024-05-13\": {}}}",
        at("1.5e-07"), at("1.5e-07"), at("1e-06"), at("1e-06"), at("2.5e-06"), at("5e-06")
    );
    let got = import_litellm(&table, &opts(&[])).expect("imports");
    assert_eq!(got.aliased, 2);
    assert!(
        got.summary()
            .starts_with("4 prices written (openai 4), 2 dated ids among their aliases"),
        "{}",
        got.summary()
    );
    let prices = crate::upstreams::Prices::read(&got.toml).expect("reads");
    let mini = prices.model("openai", "gpt-4o-mini").expect("priced");
    assert_eq!(mini.aliases, vec!["gpt-4o-mini-2024-07-18".to_owned()]);
    assert_eq!(
        prices
            .model("openai", "claude-x-20251001")
            .map(|m| m.input_per_mtok),
        Some(Nanos(1_000_000_000))
    );
    // A snapshot at other rates keeps its own price.
    let old = prices.model("openai", "gpt-4o-2024-05-13").expect("priced");
    assert_eq!(old.input_per_mtok, Nanos(5_000_000_000));
    assert!(prices
        .model("openai", "gpt-4o")
        .expect("priced")
        .aliases
        .is_empty());
    assert_eq!(undated("gpt-4o-2024-05-13"), Some("gpt-4o"));
    assert_eq!(undated("claude-x-20251001"), Some("claude-x"));
    for id in ["gpt-4o", "o3-mini", "x-2024-5-13", "-20251001", "a-2025100"] {
        assert_eq!(undated(id), None, "{id}");
    }
}

#[test]
fn a_dated_snapshot_left_out_at_other_rates_than_its_written_model_is_refused() {
    let at = |input: &str, extra: &str| {
        format!(
            r#"{{"litellm_provider": "openai", "mode": "chat", "input_cost_per_token": {input}, "output_cost_per_token": 6e-07{extra}}}"#
        )
    };
    let table = |snapshot: &str| {
        format!(
            "{{\"gpt-4o\": {}, \"gpt-4o-20240513\": {snapshot}}}",
            at("2.5e-06", "")
        )
    };
    let only_base = |t: &str| {
        let mut o = opts(&[]);
        o.models = vec!["gpt-4o".into()];
        import_litellm(t, &o)
    };
    // Left out by --model at other rates, or skipped for rates one price cannot state:
    // the policy would bill it at gpt-4o's rates.
    let dearer = table(&at("5e-06", ""));
    let tiered = table(&at(
        "5e-06",
        r#", "input_cost_per_token_above_200k_tokens": 1e-05"#,
    ));
    for got in [only_base(&dearer), import_litellm(&tiered, &opts(&[]))] {
        match got {
            Err(ImportError::Entry { model, field, why }) => {
                assert_eq!(
                    (model.as_str(), field.as_str()),
                    ("gpt-4o-20240513", "(dated snapshot)")
                );
                assert!(why.contains("price the snapshot by hand"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }
    // Left out at its model's rates: priced right by the dated-suffix rule.
    let same = table(&at("2.5e-06", ""));
    let got = only_base(&same).expect("imports");
    let prices = crate::upstreams::Prices::read(&got.toml).expect("reads");
    assert_eq!(
        prices
            .model("openai", "gpt-4o-20240513")
            .map(|m| m.input_per_mtok),
        Some(Nanos(2_500_000_000))
    );
}
