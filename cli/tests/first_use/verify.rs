//! Verify without the auditor key names the entry whose bytes were changed.

use super::*;

/// `n` decisions of run `run` (a start, then allows), as NDJSON.
fn decisions(run: &str, n: usize) -> String {
    let mut s = format!("{{\"run\":\"{run}\",\"kind\":\"start\"}}\n");
    for i in 1..n {
        s += &format!(
            "{{\"run\":\"{run}\",\"kind\":\"allow\",\"tool\":\"http\",\"effect\":\"read\",\"args\":{{\"page\":{i}}},\"attempt\":{i}}}\n"
        );
    }
    s
}

/// A ledger in `dir/ledger` whose commit groups end at the given seqs (each `append` is
/// one group, sealed by one checkpoint), exported to `dir/ledger.tally`.
pub(crate) fn ledger_with_groups(dir: &Path, ends: &[u64]) {
    ok(dir, &["keygen", "--out", "auditor.key"], "");
    ok(
        dir,
        &["init", "--ledger", "ledger", "--recipient", "auditor.pub"],
        "",
    );
    let mut last = 0;
    for (i, &end) in ends.iter().enumerate() {
        let input = decisions(&format!("r{i}"), (end - last) as usize);
        ok(dir, &["append", "--ledger", "ledger"], &input);
        last = end;
    }
    ok(
        dir,
        &["export", "--ledger", "ledger", "--out", "ledger.tally"],
        "",
    );
}

/// The byte offsets of each entry frame's payload in an export, in seq order.
fn entry_offsets(export: &[u8]) -> Vec<usize> {
    let mut at = 16; // "tally export v2\n"
    let mut entries = Vec::new();
    while at + 5 <= export.len() {
        let tag = export[at];
        let len = u32::from_be_bytes(export[at + 1..at + 5].try_into().unwrap()) as usize;
        if tag == 1 {
            entries.push(at + 5);
        }
        if tag == 0xff {
            break;
        }
        at += 5 + len;
    }
    entries
}

/// `dir/ledger.tally` with one byte of entry `seq` flipped at `offset` into the entry
/// (the header is 98 bytes; a decision's ciphertext follows), as `dir/NAME`.
fn flipped(dir: &Path, name: &str, seq: usize, offset: usize) {
    let mut bytes = std::fs::read(dir.join("ledger.tally")).unwrap();
    let at = entry_offsets(&bytes)[seq] + offset;
    bytes[at] ^= 0x20;
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// The first line of `tally verify FILE` and its JSON findings' (seq, kind), with and
/// without the auditor key.
fn verdicts(dir: &Path, file: &str) -> Vec<(String, Vec<(u64, String)>)> {
    let keyless = ["verify", file, "--key", "ledger/ledger.pub"];
    let keyed = [&keyless[..], &["--auditor-key", "auditor.key"]].concat();
    [&keyless[..], &keyed[..]]
        .iter()
        .map(|args| {
            let out = run(dir, args, "");
            assert_eq!(out.status.code(), Some(1), "{}", text(&out));
            let first = String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .unwrap_or_default()
                .to_string();
            let json = run(dir, &[&args[..], &["--json"]].concat(), "");
            let report: Value = serde_json::from_slice(&json.stdout).expect("JSON");
            let findings = report["findings"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    (
                        f["seq"].as_u64().unwrap(),
                        f["kind"].as_str().unwrap().to_string(),
                    )
                })
                .collect();
            (first, findings)
        })
        .collect()
}

/// One byte of entry 71's ciphertext flipped, entry 71 the last of its commit group: the
/// checkpoint after it signs a head its bytes no longer hash to. Verify names seq 71, with
/// the auditor key and without it (it said `first bad seq 72 ... checkpoint_head_mismatch`
/// without the key).
#[test]
fn keyless_verify_names_the_entry_whose_bytes_were_changed_before_a_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ledger_with_groups(d, &[71, 80]);
    flipped(d, "t.tally", 71, 98 + 10);
    for (first, findings) in verdicts(d, "t.tally") {
        assert!(
            first.starts_with("TAMPERED: first bad seq 71: "),
            "{first}\n{findings:?}"
        );
        assert!(
            findings.iter().all(|(seq, _)| *seq == 71),
            "one altered entry, findings elsewhere: {findings:?}"
        );
        assert_eq!(findings[0].1, "entry_altered", "{findings:?}");
    }
}

/// Entry 70's ciphertext flipped inside a group: the next entry still links to its old
/// hash, and the checkpoint after that next entry vouches for it. Verify names seq 70.
#[test]
fn keyless_verify_names_the_entry_whose_bytes_were_changed_inside_a_group() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ledger_with_groups(d, &[71, 80]);
    flipped(d, "t.tally", 70, 98 + 10);
    for (first, findings) in verdicts(d, "t.tally") {
        assert!(
            first.starts_with("TAMPERED: first bad seq 70: "),
            "{first}\n{findings:?}"
        );
        assert!(
            findings.iter().all(|(seq, _)| *seq == 70),
            "one altered entry, findings elsewhere: {findings:?}"
        );
    }
}

/// The other way round: entry 72's previous-hash changed (its own header). Entry 71 is
/// intact and sealed; verify names 72, never 71.
#[test]
fn a_changed_link_is_named_where_it_is_not_on_the_entry_before() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ledger_with_groups(d, &[71, 80]);
    // prev_hash is at bytes 38..70 of the header (docs/FORMAT.md).
    flipped(d, "t.tally", 72, 38 + 3);
    let (first, findings) = &verdicts(d, "t.tally")[0];
    assert!(
        first.starts_with("TAMPERED: first bad seq 72: "),
        "{first}\n{findings:?}"
    );
    assert_eq!(findings[0], (72, "broken_link".to_string()), "{findings:?}");
}
