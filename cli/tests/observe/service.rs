//! The service files in dist/.

use super::*;

/// `dist/`: the sample policy is valid, and the systemd unit is one systemd accepts, with
/// the hardening README promises.
#[test]
fn the_service_files_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tmp = tempfile::tempdir().expect("tmp");
    ok(
        tmp.path(),
        &[
            "policy",
            "check",
            root.join("dist/policy.toml").to_str().expect("path"),
        ],
    );
    let unit = std::fs::read_to_string(root.join("dist/tally.service")).expect("unit");
    for line in [
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "StateDirectory=tally",
        "RuntimeDirectory=tally",
        "--socket-group tally-agents",
        "--operator-socket",
        "--metrics-listen 127.0.0.1:9464",
    ] {
        assert!(unit.contains(line), "the unit lacks {line}");
    }
    if !tally_testkit::have(
        "systemd-analyze",
        &["--version"],
        "apt-get install systemd (README, Development)",
    ) {
        return;
    }
    let bin = tally().path().to_path_buf();
    let here = tmp.path().join("tally.service");
    std::fs::write(
        &here,
        unit.replace("/usr/local/bin/tally", bin.to_str().expect("path")),
    )
    .expect("unit");
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&here)
        .output()
        .expect("systemd-analyze");
    let said = String::from_utf8_lossy(&out.stderr);
    // It may warn of things outside the unit (this machine's other units); never of ours.
    let ours: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("tally.service"))
        .collect();
    assert!(out.status.success() && ours.is_empty(), "{said}");
}
