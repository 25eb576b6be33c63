//! Rules live only in the policy core: no crate but `tally-policy` matches on an
//! outcome's `Status` or compares a budget limit (ARCHITECTURE.md, where the rules live).

/// Sources that may match on a `Status` and compare a limit: the policy core (the rules),
/// the record crate (which defines both), and test code.
const RULE_HOLDERS: [&str; 3] = ["policy/", "record/", "tests/"];

/// Whether an identifier goes on with `c`.
fn ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Where `Status::Variant` stands in `code` (not `PendingStatus::`, not a path to the
/// type): the text before it and the text after the variant's name.
fn statuses(code: &str) -> impl Iterator<Item = (&str, &str)> {
    code.match_indices("Status::").filter_map(|(at, _)| {
        let before = &code[..at];
        let after = &code[at + "Status::".len()..];
        (!before.ends_with(ident) && after.starts_with(|c: char| c.is_ascii_uppercase()))
            .then(|| (before, after.trim_start_matches(ident)))
    })
}

/// Whether a line of code matches on an outcome's `Status`: a `Status::Variant` left of
/// a `=>`, beside `==`, `!=` or an or-pattern's `|`, or in a `let` pattern. Building a
/// status (`Err(Status::Timeout)`, `=> (Status::Ok, ...)`) is not a match.
fn matches_a_status(code: &str) -> bool {
    statuses(code).any(|(before, rest)| {
        let rest = rest.trim_start_matches(')').trim_start();
        let before = before.trim_end();
        let in_let = before
            .rfind("let ")
            .is_some_and(|l| !before[l..].contains('='));
        rest.contains("=>")
            || ["==", "!=", "|"]
                .iter()
                .any(|o| before.ends_with(o) || rest.starts_with(o))
            || in_let
    })
}

/// Whether a statement compares a budget limit: a limit operand (`.limit`, `*_limit()`,
/// `budget.DIMENSION`, `deadline_ms`) with ` >= `, ` <= `, ` > `, ` < `, `.min(`,
/// `.max(` or `saturating_sub(`. Naming a limit (`deadline_ms: Some(..)`) is not.
fn compares_a_limit(statement: &str) -> bool {
    let operand = statement.contains("_limit()")
        || statement
            .match_indices(".limit")
            .any(|(at, _)| !statement[at + ".limit".len()..].starts_with(ident))
        || ["attempts", "spend_nanos", "side_effects", "polls", "depth"]
            .iter()
            .any(|d| statement.contains(&format!("budget.{d}")))
        || statement.contains("deadline_ms");
    operand
        && [
            " >= ",
            " <= ",
            " > ",
            " < ",
            ".min(",
            ".max(",
            "saturating_sub(",
        ]
        .iter()
        .any(|c| statement.contains(c))
}

/// Where a source file, up to its test module, breaks "rules only in the core": a line
/// that matches on a `Status`, or a statement (its lines joined, up to a `;`, a `}`, a
/// lone `{` or a blank line, so that a chain rustfmt split is read whole) that compares
/// a limit or names a `Status` in a `matches!`.
fn rules_outside_the_core(path: &str, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let (mut statement, mut from) = (String::new(), 0);
    for (i, line) in lines.iter().enumerate() {
        // An inline test module ends the code; `mod oracle;` only declares a file.
        let test_module = line.trim() == "#[cfg(test)]"
            && lines
                .get(i + 1)
                .is_some_and(|l| l.trim_start().starts_with("mod ") && l.trim_end().ends_with('{'));
        if test_module {
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        if matches_a_status(code) {
            found.push(format!(
                "{path}:{}: matches on a Status: {}",
                i + 1,
                line.trim()
            ));
        }
        if statement.is_empty() {
            from = i + 1;
        }
        statement.push(' ');
        statement.push_str(code.trim());
        let code = code.trim();
        if code.ends_with([';', '}']) || code == "{" || code.is_empty() {
            if compares_a_limit(&statement) {
                found.push(format!("{path}:{from}: compares a limit: {statement}"));
            }
            if statement.contains("matches!(") && statuses(&statement).next().is_some() {
                found.push(format!("{path}:{from}: matches on a Status: {statement}"));
            }
            statement.clear();
        }
    }
    found
}

/// The policy core answers every rule (ARCHITECTURE.md, where the rules live): no crate
/// but `tally-policy` matches on an outcome's `Status` or compares a budget limit; the
/// gate, the proxy, verify and the rest ask the core (`is_failure`, `past_deadline`,
/// `call_timeout`, `spend_left`, the refusal order, ...).
#[test]
fn rules_live_only_in_the_policy_core() {
    let Some(found) = super::sources::found_in_production_code(
        |path| RULE_HOLDERS.iter().any(|h| path.starts_with(h)),
        rules_outside_the_core,
    ) else {
        return;
    };
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The check finds what it must: each copy of a rule the core now answers, as it was
/// written outside it (rustfmt's line breaks included), and nothing in code that builds
/// a status or names a limit.
#[test]
fn a_rule_outside_the_core_is_found() {
    for text in [
        "        let failed = matches!(o.status, Status::Error | Status::Timeout);\n",
        "    let f = matches!(\n        o.status,\n        Status::Timeout\n    );\n",
        "            if o.status == Status::Ok {\n",
        "            Some(tally_ledger::Status::Timeout) => \"it timed out\",\n",
        "                Some(Status::Running) if job.is_some_and(|j| j.finished) => continue,\n",
        "    if status == Status::Timeout && effect == Effect::NonIdempotentWrite {\n",
        "        Status::Error | Status::Timeout\n",
        "    if let Some(Status::Unknown) = a.status {\n",
        "    run.budget.deadline_ms.is_some_and(|d| at >= d)\n}\n",
        "        if standing\n            .budget\n            .deadline_ms\n            .is_some_and(|d| standing.at_ms >= d)\n        {\n",
        "        let timeout_ms = caught\n            .standing\n            .budget\n            .deadline_ms\n            .map_or(u.timeout_ms, |d| {\n                u.timeout_ms.min(d.saturating_sub(caught.standing.at_ms))\n            });\n",
        "        Some(l) => Nanos(l.limit.saturating_sub(l.used)),\n    };\n",
        "            over_cap: h.attempts.limit.is_some_and(|l| h.attempts.used > l),\n}\n",
        "        && run.attempts_limit().is_some_and(|limit| run.attempts_used >= limit);\n",
    ] {
        assert!(
            !rules_outside_the_core("x.rs", text).is_empty(),
            "not found: {text}"
        );
    }
    for text in [
        "                Err(_) => break Err(Status::Timeout),\n",
        "            Billed::Cost(c) => (Status::Ok, Some(c.0), None),\n",
        "    let status = if failed { Status::Error } else { Status::Ok };\n",
        "    let status = tally_ledger::Status::Unknown;\n",
        "                PendingStatus::Timeout => \"timed out, outcome unknown\",\n",
        "    if tally_policy::is_failure(o.status) {\n",
        "    let left = tally_policy::spend_left(&standing.limits);\n",
        "    // a status == Status::Ok in a comment is words\n",
        "        deadline_ms: Some(3_600_000),\n",
        "fn f() {}\n#[cfg(test)]\nmod tests {\n    fn g() { assert!(s == Status::Ok); }\n}\n",
    ] {
        let found = rules_outside_the_core("x.rs", text);
        assert!(found.is_empty(), "found: {found:?}");
    }
}
