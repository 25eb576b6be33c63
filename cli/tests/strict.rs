//! Through the real `tally append`: arguments are hashed by their exact
//! value, and duplicate keys, nulls and non-JSON whitespace are refused with the line
//! named and nothing written.

use std::path::Path;
use std::process::Output;

fn tally(dir: &Path, args: &[&str], stdin: &str) -> Output {
    tally_testkit::Tally::new(env!("CARGO_BIN_EXE_tally")).run(dir, args, stdin)
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn refused(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const APPEND: &[&str] = &["append", "--ledger", "L"];
const LOOPS: &[&str] = &[
    "loops",
    "L",
    "--key",
    "L/ledger.pub",
    "--auditor-key",
    "auditor.key",
    "--json",
];

fn allows(amounts: &[&str]) -> String {
    let mut s = String::from("{\"run\":\"r\",\"kind\":\"start\",\"goal\":\"pay\"}\n");
    for (i, a) in amounts.iter().enumerate() {
        s.push_str(&format!(
            "{{\"run\":\"r\",\"kind\":\"allow\",\"tool\":\"pay\",\"at_ms\":{i},\"attempt\":{},\"args\":{{\"amount\":{a}}}}}\n",
            i + 1
        ));
    }
    s
}

#[test]
fn issue_11_append_reads_arguments_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    ok(&tally(dir, &["keygen", "--out", "auditor.key"], ""));
    ok(&tally(
        dir,
        &["init", "--ledger", "L", "--recipient", "auditor.pub"],
        "",
    ));

    // Three different amounts that one f64 cannot tell apart: no repeated call.
    let amounts = [
        "18446744073709551616",
        "18446744073709551617",
        "18446744073709551618",
    ];
    assert_eq!(
        ok(&tally(dir, APPEND, &allows(&amounts))).lines().count(),
        4
    );
    let loops = ok(&tally(dir, LOOPS, ""));
    assert!(!loops.contains("\"pattern\""), "{loops}");

    // The same amount four times is a repeated call (the gate's rule allows three in a
    // row), under the digest docs/FORMAT.md gives for exactly these arguments.
    let same = allows(&[amounts[0]; 4]).replace("\"r\"", "\"q\"");
    ok(&tally(dir, APPEND, &same));
    let loops = ok(&tally(dir, LOOPS, ""));
    assert_eq!(
        loops.matches("\"pattern\": \"exact_repetition\"").count(),
        1,
        "{loops}"
    );
    assert!(
        loops.contains(
            "\"args_digest\": \"2508fceaf9a5add7f6ebeb28a6e560874dff0527ba3abb0b2b4714a7d5589314\""
        ),
        "{loops}"
    );

    // Refused, each naming its stdin line, and nothing of the batch written.
    let before = ok(&tally(dir, &["checkpoint", "--ledger", "L"], ""));
    let good = "{\"run\":\"s\",\"kind\":\"start\"}\n";
    for (input, line, says) in [
        (
            format!("{good}{{\"run\":\"s\",\"kind\":\"allow\",\"args\":{{\"a\":1,\"a\":2}}}}\n"),
            2,
            "duplicate key `a` in `args`",
        ),
        (
            format!("{good}{{\"run\":\"s\",\"kind\":\"stop\",\"reason\":\"completed\",\"limits\":{{\"attempts\":{{\"used\":1,\"limit\":2}},\"attempts\":{{\"used\":0,\"limit\":2}}}}}}\n"),
            2,
            "duplicate key `attempts` in `limits`",
        ),
        (format!("{good}\u{a0}\n{good}"), 2, "U+00A0"),
        (
            format!("\n{good}{{\"run\":\"s\",\"kind\":\"start\",\"goal\":null}}\n"),
            3,
            "field `goal` is null",
        ),
    ] {
        let err = refused(&tally(dir, APPEND, &input));
        assert!(err.contains(&format!("stdin line {line}")), "{err}");
        assert!(err.contains(says), "{err}");
    }
    let err = refused(&tally(
        dir,
        &[
            "append",
            "--ledger",
            "L",
            r#"{"run":"s","kind":"start","budget":{"attempts":1,"attempts":9}}"#,
        ],
        "",
    ));
    assert!(
        err.contains("duplicate key `attempts` in `budget`"),
        "{err}"
    );
    assert_eq!(
        ok(&tally(dir, &["checkpoint", "--ledger", "L"], "")),
        before
    );
}
