//! The one-pass reader against the canonicalizer it replaced (`oracle.rs`): the same
//! canonical bytes, so the same digest every ledger holds, and the same error, variant,
//! path and message, on generated text (nested, escaped, duplicated, deep, broken) and on
//! every file of the fuzz corpus.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::value::RawValue;
use serde_json::Value;

use super::{oracle, Args, MAX_ARGS_DEPTH};

/// Old and new agree on `text`, and what the new one also gives (the top-level members
/// and the value) is what serde_json reads from the canonical text.
fn agree(text: &str) {
    let old = oracle::parse(text);
    let new = Args::parse(text).map(|a| a.canonical().to_string());
    assert_eq!(new, old, "{text:?}");
    let read = Args::read(text);
    match (read, old) {
        (Ok(read), Ok(old)) => {
            assert_eq!(read.args.canonical(), old);
            let value = serde_json::from_str::<Value>(&old).ok();
            assert_eq!(read.value, value, "{text:?}");
            let members: Option<BTreeMap<String, Box<RawValue>>> = serde_json::from_str(&old).ok();
            let spans: Vec<(String, String)> = read
                .members
                .iter()
                .map(|(k, r)| (k.clone(), old[r.clone()].to_string()))
                .collect();
            let want: Vec<(String, String)> = members
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.get().to_string()))
                .collect();
            assert_eq!(spans, want, "{text:?}");
        }
        (Err(e), Err(old)) => assert_eq!(e, old, "{text:?}"),
        (read, old) => panic!("{text:?}: {:?} against {old:?}", read.map(|r| r.args)),
    }
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        "-?(0|[1-9][0-9]{0,25})(\\.[0-9]{1,12})?([eE][+-]?[0-9]{1,3})?",
        "-?[1-9][0-9]{0,3}[eE][+-]?[0-9]{17,21}",
        prop::sample::select(vec![
            "1e400",
            "-1e400",
            "-0",
            "1.0",
            "0.0",
            "-0e-5",
            "1e308",
            "1.7976931348623157e309",
            "18446744073709551616",
            "-9223372036854775809",
            "12.5e-400",
            "1e1000000000000000000",
            "1e-999999999999999999",
            "0.0000001",
        ])
        .prop_map(str::to_string),
    ]
}

fn string() -> impl Strategy<Value = String> {
    let piece = prop::sample::select(vec![
        "a",
        "id",
        "é",
        "😀",
        " ",
        "\\n",
        "\\t",
        "\\u0061",
        "\\u00e9",
        "\\u0000",
        "\\u001f",
        "\\ud83d\\ude00",
        "\\ud800",
        "\\udc00x",
        "\\\"",
        "\\\\",
        "\\/",
        "\\b\\f\\r",
        "\u{7f}",
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    ]);
    prop::collection::vec(piece, 0..5).prop_map(|p| format!("\"{}\"", p.concat()))
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec!["\"a\"", "\"b\"", "\"\\u0061\"", "\"é\"", "\"odd key\"", "\"\"", "\"id\""])
            .prop_map(str::to_string),
        1 => string(),
    ]
}

fn space() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", "", "", " ", "\n", " \t\r\n "])
}

fn text() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        prop::sample::select(vec!["null", "true", "false"]).prop_map(str::to_string),
        number(),
        string(),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec((inner.clone(), space()), 0..6).prop_map(|items| {
                let items: Vec<String> = items
                    .into_iter()
                    .map(|(v, s)| format!("{s}{v}{s}"))
                    .collect();
                format!("[{}]", items.join(","))
            }),
            prop::collection::vec((key(), inner, space()), 0..6).prop_map(|members| {
                let members: Vec<String> = members
                    .into_iter()
                    .map(|(k, v, s)| format!("{s}{k}{s}:{s}{v}"))
                    .collect();
                format!("{{{}}}", members.join(","))
            }),
        ]
    })
}

/// `text` with one byte's worth of damage: a character removed, or one put in.
fn damaged() -> impl Strategy<Value = String> {
    (
        text(),
        any::<prop::sample::Index>(),
        prop::sample::select(vec![
            "", "{", "}", "[", "]", ",", ":", "\"", "\\", "0", "-", "e", ".", "x", " ", "\u{1}",
            "nul", "1e",
        ]),
        any::<bool>(),
    )
        .prop_map(|(t, at, put, remove)| {
            let cuts: Vec<usize> = (0..=t.len()).filter(|&i| t.is_char_boundary(i)).collect();
            let i = cuts[at.index(cuts.len())];
            let mut t = t;
            if remove && i < t.len() {
                let c = t[i..].chars().next().map_or(0, char::len_utf8);
                t.replace_range(i..i + c, "");
            }
            t.insert_str(i, put);
            t
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn the_reader_equals_the_old_canonicalizer(t in text(), s in space()) {
        agree(&format!("{s}{t}{s}"));
    }

    #[test]
    fn the_reader_equals_the_old_canonicalizer_on_damaged_text(t in damaged()) {
        agree(&t);
    }
}

#[test]
fn deep_nesting_around_the_limit() {
    let limit = MAX_ARGS_DEPTH;
    for n in [
        1,
        2,
        limit - 2,
        limit - 1,
        limit,
        limit + 1,
        limit + 2,
        200,
        5000,
    ] {
        for (open, close) in [("[", "]"), ("{\"a\":", "}"), ("[{\"k\":", "}]")] {
            for inner in [
                "1",
                "[]",
                "{}",
                "1e1000000000000000000",
                "\"\\ud800\"",
                "{\"a\":1,\"a\":2}",
            ] {
                agree(&format!("{}{inner}{}", open.repeat(n), close.repeat(n)));
                // Broken below the limit and beyond it.
                agree(&format!("{}{inner}{}", open.repeat(n), close.repeat(n - 1)));
                agree(&format!("{}{inner},{}", open.repeat(n), close.repeat(n)));
            }
            // A problem at the top, nesting too deep below it: the walk's order decides.
            let deep = format!("{}1{}", open.repeat(n), close.repeat(n));
            agree(&format!("{{\"b\":{deep},\"a\":1,\"a\":2}}"));
            agree(&format!("{{\"b\":{deep},\"a\":1e1000000000000000000}}"));
            agree(&format!("{{\"a\":{deep},\"b\":1e1000000000000000000}}"));
            agree(&format!("[{deep},\"\\udc00\"]"));
        }
    }
}

#[test]
fn keys_that_do_not_decode_and_problems_in_walk_order() {
    for text in [
        r#"{"\ud800":1}"#,
        r#"{"a":{"\ud800":1},"a":2}"#,
        r#"{"b":{"\udc00":1},"a":1e1000000000000000000}"#,
        r#"{"b":1e1000000000000000000,"a":"\ud800"}"#,
        r#"{"x":[0,{"b":0,"id":1,"id":2}],"a":[1e1000000000000000000]}"#,
        r#"{"\u0061":{"z":1,"z":1},"a":1}"#,
        r#"[1e1000000000000000000, {"a":1,"a":1}]"#,
        r#"{"odd key":{"k":"\ud800"}}"#,
        " null ",
        "",
        "   ",
        "1 2",
        "01",
        "[1,]",
        "{\"a\":1,}",
        "\"\\x\"",
        "\"\\u12\"",
        "\"\\u12G4\"",
        "tru",
        "nulll",
        "-",
        "1.",
        "1e+",
        ".5",
        "\"abc",
        "\"\u{1}\"",
        "[\"a\"\u{0}]",
    ] {
        agree(text);
    }
}

/// Every fuzz corpus file that is UTF-8, and, for a decision, its `args`.
#[test]
fn the_fuzz_corpus_reads_the_same() {
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let mut seen = 0;
    for dir in std::fs::read_dir(&corpus).expect("fuzz/corpus") {
        let dir = dir.expect("a corpus").path();
        for file in std::fs::read_dir(&dir).expect("a corpus directory") {
            let bytes = std::fs::read(file.expect("a file").path()).expect("readable");
            for body in [&bytes[..], bytes.get(1..).unwrap_or_default()] {
                let Ok(text) = std::str::from_utf8(body) else {
                    continue;
                };
                agree(text);
                seen += 1;
                if let Ok(v) = serde_json::from_str::<BTreeMap<String, Box<RawValue>>>(text) {
                    if let Some(args) = v.get("args") {
                        agree(args.get());
                    }
                }
            }
        }
    }
    assert!(seen > 1000, "{seen} corpus texts");
}

#[test]
fn a_claude_code_sized_body_reads_the_same() {
    let text = include_str!("../../../proxy/testdata/claude-code-2.1.332-messages.json");
    agree(text);
    let mut v: Value = serde_json::from_str(text).expect("JSON");
    v["system"]
        .as_array_mut()
        .expect("blocks")
        .push(serde_json::json!({"type": "text", "text": "x\n\"é".repeat(20_000)}));
    agree(&serde_json::to_string_pretty(&v).expect("JSON"));
}
