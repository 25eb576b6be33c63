//! A limit dimension's name is spelled in one file: `record/src/dimension.rs`, where
//! `Dimension` and `LimitKey` name them (ARCHITECTURE.md, one enum per name). Every other
//! source asks the enum (`LimitKey::SpendNanos`, `Dimension::SideEffects.as_str()`), so a
//! misspelt key is a compile error, not a dimension no one reads.

/// The file that spells the names.
const NAMES_FILE: &str = "record/src/dimension.rs";

/// Names that are nothing but a dimension: found wherever they stand as a literal.
const COMPOUND: [&str; 7] = [
    "deadline_ms",
    "spend_cents",
    "spend_nanos",
    "side_effects",
    "principal_runs",
    "principal_attempts",
    "principal_spend_nanos",
];

/// Names that are also words (a sentence's `3 attempts`, a call's `depth` field): found
/// only where code uses them as a key.
const WORDS: [&str; 4] = ["attempts", "polls", "depth", "rate"];

/// What stands before a literal that is used as a key.
const KEY_BEFORE: [&str; 10] = [
    "get(",
    "get(&",
    "[",
    "insert(",
    "remove(",
    "contains_key(",
    "entry(",
    "==",
    "!=",
    "from_name(",
];

/// Where a source file, up to its test module, spells a dimension's name: a compound
/// name as a literal (`"spend_nanos"`), or a word used as a key (`.get("attempts")`,
/// `"depth" =>`). A key of JSON text (`"spend_nanos":`, a body an example sends) is the
/// wire's, not code's.
fn names_outside_the_enum(path: &str, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let test_module = line.trim() == "#[cfg(test)]"
            && lines
                .get(i + 1)
                .is_some_and(|l| l.trim_start().starts_with("mod ") && l.trim_end().ends_with('{'));
        if test_module {
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        for name in COMPOUND.iter().chain(&WORDS) {
            let literal = format!("\"{name}\"");
            for (at, _) in code.match_indices(&literal) {
                let before = code[..at].trim_end();
                let after = code[at + literal.len()..].trim_start();
                if after.starts_with(':') && !after.starts_with("::") {
                    continue;
                }
                let spelled = COMPOUND.contains(name)
                    || KEY_BEFORE.iter().any(|k| before.ends_with(k))
                    || after.starts_with("=>")
                    || after.starts_with("==")
                    || after.starts_with("!=");
                if spelled {
                    found.push(format!(
                        "{path}:{}: spells {literal}: {}",
                        i + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    found
}

/// No source but `record/src/dimension.rs` (test code aside) spells a limit dimension's
/// name: the maps of `limits` are keyed by `LimitKey`, and a key is named by its variant.
#[test]
fn dimension_names_are_spelled_only_in_their_enum() {
    let Some(found) = super::sources::found_in_production_code(
        |path| path.starts_with("tests/") || path == NAMES_FILE,
        names_outside_the_enum,
    ) else {
        return;
    };
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The check finds a name spelled by hand, as the code spelled them before the enum, and
/// passes a word in a sentence, a field of another record, JSON text and test code.
#[test]
fn a_dimension_spelled_by_hand_is_found() {
    for text in [
        "    left_of(\"spend_nanos\").min(left_of(PRINCIPAL_SPEND))\n",
        "pub const PRINCIPAL_SPEND: &str = \"principal_spend_nanos\";\n",
        "            \"deadline_ms\" => None,\n",
        "        out.insert(\"depth\".to_owned(), Limit { used: depth, limit });\n",
        "    if let Some(l) = r.limits.get(\"attempts\") {\n",
        "        if let Some(d) = limits.get(\"depth\") {\n",
        "            if dim == \"depth\" {\n",
        "    let polls = limits[\"polls\"].used;\n",
        "            \"rate\" => 1,\n",
    ] {
        assert!(
            !names_outside_the_enum("x.rs", text).is_empty(),
            "not found: {text}"
        );
    }
    for text in [
        "            saved(attempts, \"attempt\", \"attempts\"),\n",
        "        (\"depth\", d.depth.is_some(), CALL),\n",
        "        json!({\"run\": \"r\", \"budget\": {\"spend_nanos\": 5_000_000_000u64}}),\n",
        "    r#\"{\"limits\":{\"attempts\":{\"used\":1}}}\"#\n",
        "    let x = LimitKey::SpendNanos; // not \"spend_nanos\" by hand\n",
        "fn f() {}\n#[cfg(test)]\nmod tests {\n    const S: &str = \"spend_nanos\";\n}\n",
    ] {
        let found = names_outside_the_enum("x.rs", text);
        assert!(found.is_empty(), "found: {found:?}");
    }
}
