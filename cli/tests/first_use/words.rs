//! What a person reads: the demo's story, numbers as people read them, one export
//! extension, and CLI.md naming every flag.

use super::*;

/// The acts of a demo's output (`== N. Title` headings), each with its lines.
fn acts(text: &str) -> Vec<(String, usize)> {
    let mut acts: Vec<(String, usize)> = vec![("(before act 1)".into(), 0)];
    for line in text.lines() {
        if line.starts_with("== ") {
            acts.push((line.to_string(), 0));
        } else if let Some(last) = acts.last_mut() {
            last.1 += 1;
        }
    }
    acts
}

/// Durations as `603701 ms`, run clocks as `t+44 ms`: what a person should never have to
/// read.
fn unreadable_numbers(text: &str) -> Vec<String> {
    let mut bad = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for w in words.windows(2) {
            let digits = w[0].trim_start_matches(['(', 't', '+']);
            let ms = w[1].trim_end_matches([',', ')', '.', ';', ':']) == "ms"
                || digits.ends_with("ms") && digits.trim_end_matches("ms").parse::<u64>().is_ok();
            if (ms
                && digits
                    .trim_end_matches("ms")
                    .parse::<u64>()
                    .is_ok_and(|n| n >= 1000))
                || w[0].contains("t+")
            {
                bad.push(line.to_string());
            }
        }
        if line.contains("t+") || line.contains("ms all told") {
            bad.push(line.to_string());
        }
    }
    bad
}

/// `tally demo` tells its story in about a screen per act (`--verbose` prints every
/// loop, finding and handoff), with numbers a person reads and no jargon, says where
/// its files are (removed at the end unless `--dir` keeps them), names its export
/// `.tally`, and its handoffs agree with what it narrated.
#[test]
fn the_demo_reads_as_a_story() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let out = run(d, &["demo"], "");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{}", self::text(&out));
    for (act, lines) in acts(&text) {
        assert!(lines <= 45, "{act} takes {lines} lines:\n{text}");
    }
    let bad = unreadable_numbers(&text);
    assert!(
        bad.is_empty(),
        "numbers a person should not have to read:\n{}",
        bad.join("\n")
    );
    // The model act: the agent loops on the model through the proxy until the budget
    // refuses a call before it reaches the model; the model API saw the operator's key
    // on every call and the token on none; the stopped run's token is dead.
    let model_act = text
        .split("\n== ")
        .find(|a| a.starts_with("3."))
        .unwrap_or_else(|| panic!("no act 3:\n{text}"));
    assert!(model_act.contains("  call 1: "), "{model_act}");
    assert!(
        model_act.contains("refused before it reached the model: HTTP 403"),
        "{model_act}"
    );
    assert!(
        model_act.contains("the agent's token on none"),
        "{model_act}"
    );
    assert!(model_act.contains("refused now (HTTP 403)"), "{model_act}");
    for jargon in [
        "taken as recorded",
        "accepted as recorded",
        "group commit",
        "fsynced",
    ] {
        assert!(!text.contains(jargon), "jargon `{jargon}`:\n{text}");
    }
    assert!(
        text.contains("removed") && text.contains("tally demo --dir"),
        "it does not say its files go away, or how to keep them:\n{text}"
    );
    // The export has the one extension used everywhere.
    assert!(text.contains("ledger.tally holds"), "{text}");
    assert!(!text.contains(".tex"), "{text}");

    // Everything, and the files kept.
    let kept = d.join("kept");
    let out = run(d, &["demo", "--verbose", "--dir", "kept"], "");
    let verbose = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{}", self::text(&out));
    assert!(
        verbose.lines().count() > text.lines().count() + 100,
        "{verbose}"
    );
    assert!(
        verbose.contains("Run normal: \"Fix the flaky login test\""),
        "{verbose}"
    );
    let bad = unreadable_numbers(&verbose);
    assert!(
        bad.is_empty(),
        "numbers a person should not have to read:\n{}",
        bad.join("\n")
    );
    let export = kept.join("ledger.tally");
    assert!(export.is_file(), "no {}", export.display());
    assert!(verbose.contains(&export.display().to_string()), "{verbose}");

    // What the demo narrated about each run it sent through the gate (acts 2 and 3, from
    // the gate's own view of the run) is what the exported ledger's handoff says (act 6, and
    // `tally handoff` on the kept files), line for line.
    let act = |text: &str, n: &str| -> Vec<String> {
        text.split("\n== ")
            .find(|a| a.starts_with(n))
            .unwrap_or_else(|| panic!("no act {n}:\n{text}"))
            .lines()
            .map(str::to_owned)
            .collect()
    };
    for (run, told) in [
        ("export-q3", "2."),
        ("lost-post", "2."),
        ("summarize", "2."),
        ("mcp-reports", "2."),
        ("model-agent", "3."),
    ] {
        let said = |lines: Vec<String>| -> String {
            let tag = format!("run {run}: ");
            let line = lines
                .iter()
                .find_map(|l| l.find(&tag).map(|at| l[at..].to_owned()))
                .unwrap_or_else(|| panic!("no line says where {run} stands:\n{text}"));
            line
        };
        let narrated = said(act(&text, told));
        assert_eq!(narrated, said(act(&text, "6.")), "{text}");
        let handoff = ok(
            d,
            &[
                "handoff",
                "kept/ledger.tally",
                "--key",
                "kept/ledger/ledger.pub",
                "--auditor-key",
                "kept/auditor.key",
                "--run",
                run,
                "--json",
            ],
            "",
        );
        let handoff: Value = serde_json::from_str(&handoff).unwrap();
        let h = &handoff["handoffs"][0];
        // Stopped by a stop record; open (its last call refused or not) is running.
        let state = match (h["stop"]["status"].as_str(), h["stop"]["reason"].as_str()) {
            (Some("stopped"), Some(reason)) => format!("stopped ({reason})"),
            _ => "running".to_owned(),
        };
        let from_ledger = format!(
            "run {run}: {state}; {} of {} attempts used; {} settled",
            h["attempts"]["used"],
            h["attempts"]["limit"],
            tally_ledger::money::Nanos(h["spend"]["settled_nanos"].as_u64().unwrap_or(0))
        );
        assert_eq!(
            narrated, from_ledger,
            "the demo and its handoff disagree: {h}"
        );
        // And the kept demo narrated the same as the default one.
        assert_eq!(said(act(&verbose, told)), from_ledger, "{verbose}");
    }
}

/// The export's extension is one name everywhere a user meets it: the docs, the
/// README, the CLI's help and test cases, the demo and the daemon's `GET /v1/export`
/// file name. Every file named as the output of an export, or as what `verify`,
/// `loops`, `handoff` or `stats` read, ends `.tally` (it was `.tex` in some places and
/// `.tally-export` in others).
#[test]
fn the_export_extension_is_one_name_everywhere() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files: Vec<PathBuf> = vec![root.join("README.md"), root.join("SECURITY.md")];
    for dir in [
        "docs",
        "cli/tests/cmd",
        "cli/src",
        "daemon/src",
        "clients/python",
        "clients/node",
    ] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension()
                .is_some_and(|x| ["md", "toml", "rs", "yaml"].iter().any(|y| x == *y))
            {
                files.push(p);
            }
        }
    }
    let mut named = 0;
    let mut wrong = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for line in text.lines() {
            let words: Vec<&str> = line
                .split(|c: char| c.is_whitespace() || "`'\"(),;=".contains(c))
                .filter(|w| !w.is_empty())
                .collect();
            for w in words.windows(2) {
                let reads = ["verify", "loops", "handoff", "stats"].contains(&w[0])
                    && !w[1].starts_with('-')
                    && w[1].contains('.');
                let export = ["--out", "-o", "filename"].contains(&w[0]) && line.contains("export");
                let name = w[1].trim_matches(|c: char| c == '\\' || c == '"');
                // A file name: a stem, one dot, an extension; not `...`, not a sentence's
                // full stop, not a key, an anchor or a policy.
                let file = name.rsplit_once('.').is_some_and(|(stem, ext)| {
                    !stem.is_empty()
                        && !stem.ends_with('.')
                        && stem.chars().last().is_some_and(|c| c.is_alphanumeric())
                        && !ext.is_empty()
                        && ext.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                });
                let other = ["key", "pub", "cp", "txt", "md", "ndjson", "sock", "proof"]
                    .iter()
                    .any(|e| name.ends_with(&format!(".{e}")));
                if !(reads || export) || !file || other {
                    continue;
                }
                named += 1;
                if !name.ends_with(".tally") {
                    wrong.push(format!("{}: {line}", f.display()));
                }
            }
            for ext in [".tex ", ".tex\"", ".tex`", ".tally-export"] {
                if line.contains(ext) {
                    wrong.push(format!("{}: {line}", f.display()));
                }
            }
        }
    }
    assert!(
        named > 10,
        "the scan found only {named} export names: it reads nothing"
    );
    assert!(
        wrong.is_empty(),
        "export files not named NAME.tally:\n{}",
        wrong.join("\n")
    );
    // The daemon names its download so, and `tally export --help` says so.
    let api = std::fs::read_to_string(root.join("daemon/src/api.rs")).unwrap();
    assert!(
        api.contains("filename=\\\"ledger.tally\\\""),
        "GET /v1/export's file name"
    );
    let tmp = tempfile::tempdir().unwrap();
    assert!(ok(tmp.path(), &["export", "--help"], "").contains("NAME.tally"));
}

/// docs/CLI.md names every flag of every command (`tally CMD --help`, subcommands of
/// `witness`, `policy` and `hook` too), so a user reading it finds each one.
#[test]
fn cli_md_covers_every_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/CLI.md"))
        .unwrap();
    let commands = |args: &[&str]| -> Vec<String> {
        let help = ok(d, &[args, &["--help"]].concat(), "");
        help.lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| !l.is_empty())
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .filter(|c| c != "help")
            .collect()
    };
    let mut missing = Vec::new();
    let mut seen = 0;
    for sub in commands(&[]) {
        let mut leaves = vec![vec![sub.clone()]];
        if ["witness", "policy", "hook", "keys"].contains(&sub.as_str()) {
            leaves = commands(&[&sub])
                .into_iter()
                .map(|s| vec![sub.clone(), s])
                .collect();
        }
        for leaf in leaves {
            let args: Vec<&str> = leaf.iter().map(String::as_str).collect();
            for line in ok(d, &[&args[..], &["--help"]].concat(), "").lines() {
                let Some(flag) = line
                    .split_whitespace()
                    .map(|w| w.trim_end_matches(','))
                    .find(|w| w.starts_with("--"))
                else {
                    continue;
                };
                if !line.trim_start().starts_with('-')
                    || ["--help", "--quiet", "--version"].contains(&flag)
                {
                    continue;
                }
                seen += 1;
                if !doc.contains(flag) {
                    missing.push(format!("tally {} {flag}", leaf.join(" ")));
                }
            }
        }
    }
    assert!(seen > 50, "only {seen} flags found: the help was not read");
    assert!(
        missing.is_empty(),
        "docs/CLI.md does not name:\n{}",
        missing.join("\n")
    );
}
