//! The policy map: it overrides annotations, unlisted tools are looked up, and a bad one
//! stops `tally mcp` before anything starts.

use super::*;

#[test]
fn the_policy_map_overrides_annotations_and_unlisted_tools_are_looked_up() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("");
    let map = gate.path("map.toml");
    std::fs::write(
        &map,
        "[effects]\n\"files/lookup\" = \"non_idempotent_write\"\n",
    )
    .expect("map");
    let mut raw = Raw::start(&gate.proxy("map1", &["--policy-map", &map]), &[]);
    let mut got = initialize(&mut raw);
    // The client never lists tools: the proxy asks the server itself.
    got.extend(raw.exchange(
        &call(2, "put", json!({"key": "k", "value": "v"})),
        Some(&json!(2)),
    ));
    got.extend(raw.exchange(&call(3, "lookup", json!({"key": "k"})), Some(&json!(3))));
    got.extend(raw.exchange(&call(4, "nonesuch", json!({})), Some(&json!(4))));
    raw.close();
    assert!(
        !got.iter().any(|l| l.contains("tally-mcp-")),
        "the proxy's own requests stay between it and the server: {got:#?}"
    );
    let ds = gate.finish("map1");
    let effects = allowed_effects(&ds);
    assert_eq!(
        effects,
        vec![
            ("files/put".into(), Effect::IdempotentWrite),
            ("files/lookup".into(), Effect::NonIdempotentWrite),
            ("files/nonesuch".into(), Effect::NonIdempotentWrite),
        ]
    );
}

#[test]
fn a_bad_policy_map_stops_tally_mcp_before_anything_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let map = p(dir.path(), "map.toml");
    std::fs::write(&map, "[effects]\n\"files/put\" = \"write\"\n").expect("map");
    let marker = p(dir.path(), "started");
    let out = tally()
        .command()
        .args([
            "mcp",
            "--socket",
            "/nonexistent.sock",
            "--run",
            "r",
            "--policy-map",
            &map,
            "--",
            "touch",
            &marker,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("tally mcp");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("map.toml")
            && stderr.contains("line 2")
            && stderr.contains("non_idempotent_write"),
        "{stderr}"
    );
    assert!(!Path::new(&marker).exists(), "the server was never started");

    let out = tally()
        .command()
        .args(["mcp", "--socket", "/nonexistent.sock", "--run", "r"])
        .stdin(Stdio::null())
        .output()
        .expect("tally mcp");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("SERVER_COMMAND"));
}
