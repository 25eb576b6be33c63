//! Witnesses end to end on loopback with the real binary: two `tally witness serve`, a
//! `tally serve` pushing its checkpoints to them under a tlog-policy quorum, then a
//! compromised writer that rolls the ledger back below what the witnesses cosigned, and
//! one that forks it. Both witnesses refuse, and `tally verify --witness-policy
//! --ask-witnesses` reports it, with no anchor held by anyone.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const TALLY: &str = env!("CARGO_BIN_EXE_tally");

fn tally(dir: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    tally_testkit::Tally::new(TALLY).run(dir, args, stdin.unwrap_or(""))
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).expect("utf-8")
}

/// A child killed when dropped (the test never leaves a server behind).
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start a witness; its listening URL from its first line.
fn witness(dir: &Path, name: &str, log_vkey: &str) -> (Server, String, String) {
    witness_with(dir, name, log_vkey, &[])
}

/// Start a witness with `extra` arguments (`--tls-cert`, `--tls-key`).
fn witness_with(
    dir: &Path,
    name: &str,
    log_vkey: &str,
    extra: &[&str],
) -> (Server, String, String) {
    let key = format!("{name}.key");
    let vkey = ok(&tally(
        dir,
        &[
            "witness",
            "keygen",
            "--name",
            &format!("example.org/{name}"),
            "--out",
            &key,
        ],
        None,
    ))
    .trim()
    .to_owned();
    let mut child = Command::new(TALLY)
        .args([
            "witness",
            "serve",
            "--key",
            &key,
            "--listen",
            "127.0.0.1:0",
            "--state",
            &format!("{name}-state"),
            "--log",
            log_vkey,
        ])
        .args(extra)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("witness");
    let mut line = String::new();
    BufReader::new(child.stderr.take().expect("stderr"))
        .read_line(&mut line)
        .expect("witness line");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://") || w.starts_with("https://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_owned();
    (Server(child), url, vkey)
}

/// Start `tally serve` pushing to the policy's witnesses; returns once it listens (its
/// first line), so a SIGTERM after it always ends in its last push.
fn serve(dir: &Path, policy: &str) -> (Server, BufReader<std::process::ChildStderr>) {
    serve_with(dir, policy, &[])
}

/// [`serve`] with `extra` arguments (`--witness-ca`).
fn serve_with(
    dir: &Path,
    policy: &str,
    extra: &[&str],
) -> (Server, BufReader<std::process::ChildStderr>) {
    let sock = dir.join("agent.sock");
    let _ = std::fs::remove_file(&sock);
    let mut s = Server(
        Command::new(TALLY)
            .args([
                "serve",
                "--ledger",
                "L",
                "--socket",
                sock.to_str().expect("path"),
                "--witness-policy",
                policy,
                "--witness-interval-ms",
                "100",
            ])
            .args(extra)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("serve"),
    );
    let mut err = BufReader::new(s.0.stderr.take().expect("stderr"));
    let mut line = String::new();
    err.read_line(&mut line).expect("serve line");
    assert!(line.contains("listening"), "{line}");
    (s, err)
}

/// Stop `tally serve` with SIGTERM (it pushes once more) and return what it said.
fn stop((mut s, mut err): (Server, BufReader<std::process::ChildStderr>)) -> String {
    let pid = rustix::process::Pid::from_raw(s.0.id() as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut err, &mut out).expect("stderr");
    let _ = s.0.wait();
    out
}

fn append(dir: &Path, run: &str, n: usize) {
    let lines: String = (0..n)
        .map(|i| format!("{{\"run\":\"{run}\",\"kind\":\"start\",\"goal\":\"step {i}\"}}\n"))
        .collect();
    ok(&tally(dir, &["append", "--ledger", "L"], Some(&lines)));
}

/// What a witness holds for the ledger (its monitoring endpoint), as (size, note).
fn held(url: &str, origin: &str) -> Option<(u64, String)> {
    use sha2::Digest;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let hash = hex::encode(sha2::Sha256::digest(origin.as_bytes()));
    let reply = rt
        .block_on(tally_daemon::witness::http(
            "GET",
            &format!("{url}/{hash}/checkpoint"),
            Vec::new(),
        ))
        .expect("GET");
    if reply.status == 404 {
        return None;
    }
    let text = String::from_utf8(reply.body).expect("utf-8");
    let size = text
        .lines()
        .nth(1)
        .expect("size line")
        .parse()
        .expect("size");
    Some((size, text))
}

fn post(url: &str, body: String) -> u16 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(tally_daemon::witness::http(
        "POST",
        &format!("{url}/add-checkpoint"),
        body.into_bytes(),
    ))
    .expect("POST")
    .status
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn copy_dir(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .args(["-a"])
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(status.success());
}

#[test]
fn two_witnesses_refuse_a_rollback_and_a_fork_and_verify_reports_them_without_an_anchor() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("mode");
    ok(&tally(dir, &["keygen", "--out", "auditor.key"], None));
    ok(&tally(
        dir,
        &["init", "--ledger", "L", "--recipient", "auditor.pub"],
        None,
    ));
    let log_vkey = ok(&tally(
        dir,
        &["checkpoint", "--ledger", "L", "--vkey"],
        None,
    ))
    .trim()
    .to_owned();
    let origin = log_vkey.split('+').next().expect("origin").to_owned();
    let (_w1, url1, vkey1) = witness(dir, "w1", &log_vkey);
    let (_w2, url2, vkey2) = witness(dir, "w2", &log_vkey);
    let policy = format!(
        "log {log_vkey}\nwitness w1 {vkey1} {url1}\nwitness w2 {vkey2} {url2}\ngroup both all w1 w2\nquorum both\n"
    );
    std::fs::write(dir.join("policy"), policy).expect("policy");

    // Size 4, kept aside by whoever will later take the writer host; then size 7.
    append(dir, "r1", 3);
    copy_dir(&dir.join("L"), &dir.join("L.at-4"));
    append(dir, "r2", 3);

    // The daemon pushes size 7: both witnesses cosign it, the cosigned checkpoint is kept.
    let s = serve(dir, "policy");
    wait_for("both witnesses to cosign size 7", || {
        held(&url1, &origin).is_some_and(|h| h.0 == 7)
            && held(&url2, &origin).is_some_and(|h| h.0 == 7)
    });
    wait_for("the cosigned checkpoint", || {
        dir.join("L/checkpoint.cosigned").exists()
    });
    stop(s);
    let cosigned = std::fs::read_to_string(dir.join("L/checkpoint.cosigned")).expect("cosigned");
    assert_eq!(
        cosigned.matches('\u{2014}').count(),
        3,
        "log + two witnesses:\n{cosigned}"
    );
    let v = tally(
        dir,
        &[
            "verify",
            "L",
            "--key",
            "L/ledger.pub",
            "--witness-policy",
            "policy",
            "--ask-witnesses",
        ],
        None,
    );
    let text = ok(&v);
    assert!(text.starts_with("INTACT"), "{text}");
    assert!(
        text.contains("witnessed   seq 0..=6 by a quorum (w1, w2)"),
        "{text}"
    );
    // A tlog-proof of one decision carries both cosignatures and checks offline.
    ok(&tally(
        dir,
        &["prove", "--ledger", "L", "--seq", "5", "--out", "p5"],
        None,
    ));
    let checked = ok(&tally(
        dir,
        &[
            "verify-proof",
            "p5",
            "--key",
            "L/ledger.pub",
            "--witness-policy",
            "policy",
        ],
        None,
    ));
    assert!(checked.contains("quorum met by w1, w2"), "{checked}");

    // Compromised: the writer host rolls the ledger back to size 4 (and drops the
    // cosigned checkpoint). Nothing in the ledger says so, and nobody holds an anchor.
    std::fs::rename(dir.join("L"), dir.join("L.real")).expect("mv");
    copy_dir(&dir.join("L.at-4"), &dir.join("L"));
    let alone = ok(&tally(dir, &["verify", "L", "--key", "L/ledger.pub"], None));
    assert!(
        alone.starts_with("INTACT"),
        "without the witnesses a rollback looks intact:\n{alone}"
    );
    let v = tally(
        dir,
        &[
            "verify",
            "L",
            "--key",
            "L/ledger.pub",
            "--witness-policy",
            "policy",
            "--ask-witnesses",
        ],
        None,
    );
    assert_eq!(
        v.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&v.stdout)
    );
    let text = String::from_utf8_lossy(&v.stdout);
    assert!(
        text.contains("anchor_missing") && text.contains("witness w1 holds size 7"),
        "{text}"
    );
    assert!(text.contains("witness w2 holds size 7"), "{text}");
    // Its daemon pushes again: both witnesses refuse, and keep size 7.
    let said = stop(serve(dir, "policy"));
    assert!(
        said.contains("witness w1 did not cosign size 4")
            && said.contains("truncated or rolled back"),
        "{said}"
    );
    assert!(said.contains("witness w2 did not cosign size 4"), "{said}");
    assert_eq!(held(&url1, &origin).map(|h| h.0), Some(7));
    assert_eq!(held(&url2, &origin).map(|h| h.0), Some(7));

    // Compromised again: from size 4 it writes another history past 7 (a fork).
    append(dir, "r3", 5);
    let cp = ok(&tally(dir, &["checkpoint", "--ledger", "L"], None));
    assert!(cp.lines().nth(1) == Some("9"), "{cp}");
    for url in [&url1, &url2] {
        // Claiming the witness's size with no proof, or a proof from the size it holds:
        // 422; claiming another old size: 409.
        assert_eq!(post(url, format!("old 7\n\n{cp}")), 422);
        assert_eq!(post(url, format!("old 4\n\n{cp}")), 409);
    }
    let said = stop(serve(dir, "policy"));
    assert!(
        said.contains("witness w1 did not cosign size 9: 422"),
        "{said}"
    );
    assert!(
        said.contains("witness w2 did not cosign size 9: 422"),
        "{said}"
    );
    assert!(!dir.join("L/checkpoint.cosigned").exists());
    let v = tally(
        dir,
        &[
            "verify",
            "L",
            "--key",
            "L/ledger.pub",
            "--witness-policy",
            "policy",
            "--ask-witnesses",
        ],
        None,
    );
    assert_eq!(v.status.code(), Some(1));
    let text = String::from_utf8_lossy(&v.stdout);
    assert!(
        text.contains("fork") && text.contains("witness w1 holds root"),
        "{text}"
    );
    // Without asking, the policy still finds no quorum on the forked ledger: exit 3.
    let v = tally(
        dir,
        &[
            "verify",
            "L",
            "--key",
            "L/ledger.pub",
            "--witness-policy",
            "policy",
        ],
        None,
    );
    assert_eq!(
        v.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&v.stdout)
    );

    // The real ledger still verifies against both witnesses.
    let v = tally(
        dir,
        &[
            "verify",
            "L.real",
            "--key",
            "L.real/ledger.pub",
            "--witness-policy",
            "policy",
            "--ask-witnesses",
        ],
        None,
    );
    assert_eq!(
        v.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&v.stdout)
    );
}

/// What a witness over HTTPS holds, asked with `client`.
fn held_with(
    client: &tally_daemon::witness::WitnessClient,
    url: &str,
    origin: &str,
) -> Result<Option<u64>, String> {
    use sha2::Digest;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let hash = hex::encode(sha2::Sha256::digest(origin.as_bytes()));
    let reply =
        rt.block_on(client.request("GET", &format!("{url}/{hash}/checkpoint"), Vec::new()))?;
    if reply.status == 404 {
        return Ok(None);
    }
    let text = String::from_utf8(reply.body).expect("utf-8");
    Ok(Some(
        text.lines().nth(1).expect("size").parse().expect("size"),
    ))
}

/// The witness protocol over HTTPS: `tally witness serve --tls-cert --tls-key` with a
/// certificate of a private CA (rcgen, made now); `tally serve` trusts it only with
/// `--witness-ca NAME=CA`, and `verify --ask-witnesses` likewise. Plain HTTP is refused
/// on a non-loopback address without `--plain-http`.
#[test]
fn witnesses_over_https_with_a_private_ca() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("mode");
    ok(&tally(dir, &["keygen", "--out", "auditor.key"], None));
    ok(&tally(
        dir,
        &["init", "--ledger", "L", "--recipient", "auditor.pub"],
        None,
    ));
    let log_vkey = ok(&tally(
        dir,
        &["checkpoint", "--ledger", "L", "--vkey"],
        None,
    ))
    .trim()
    .to_owned();
    let origin = log_vkey.split('+').next().expect("origin").to_owned();
    let pki = tally_testkit::tls::TestPki::new().write(dir, "w1");
    let (cert, key, ca) = (
        pki.cert.to_str().expect("path"),
        pki.key.to_str().expect("path"),
        pki.ca.to_str().expect("path"),
    );
    let (_w1, url, vkey) = witness_with(
        dir,
        "w1",
        &log_vkey,
        &["--tls-cert", cert, "--tls-key", key],
    );
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    std::fs::write(
        dir.join("policy"),
        format!("log {log_vkey}\nwitness w1 {vkey} {url}\nquorum w1\n"),
    )
    .expect("policy");
    append(dir, "r1", 3);

    // Without the CA the pusher does not trust the witness: nothing is cosigned.
    let said = stop(serve(dir, "policy"));
    assert!(
        said.contains("witness w1 did not cosign size 4") && said.contains("certificate"),
        "{said}"
    );
    assert!(!dir.join("L/checkpoint.cosigned").exists());
    let plain = tally_daemon::witness::WitnessClient::new(None).expect("client");
    assert!(held_with(&plain, &url, &origin).is_err());
    // Plain HTTP to a TLS port is no answer either.
    assert!(held_with(&plain, &url.replace("https://", "http://"), &origin).is_err());

    // With --witness-ca w1=CA: cosigned over TLS.
    let s = serve_with(dir, "policy", &["--witness-ca", &format!("w1={ca}")]);
    wait_for("the cosigned checkpoint", || {
        dir.join("L/checkpoint.cosigned").exists()
    });
    stop(s);
    let trusting =
        tally_daemon::witness::WitnessClient::new(Some(&pki.ca)).expect("client with the CA");
    assert_eq!(held_with(&trusting, &url, &origin), Ok(Some(4)));
    // A later daemon starts the witness at `old 0`, learns size 4 from its 409, and
    // sends the consistency proof 4 -> 7 (C2SP tlog-witness): cosigned.
    append(dir, "r2", 3);
    let s = serve_with(dir, "policy", &["--witness-ca", &format!("w1={ca}")]);
    wait_for("the witness to cosign size 7", || {
        held_with(&trusting, &url, &origin) == Ok(Some(7))
    });
    let said = stop(s);
    assert!(!said.contains("did not cosign"), "{said}");
    let v = tally(
        dir,
        &[
            "verify",
            "L",
            "--key",
            "L/ledger.pub",
            "--witness-policy",
            "policy",
            "--ask-witnesses",
            "--witness-ca",
            &format!("w1={ca}"),
        ],
        None,
    );
    let text = ok(&v);
    assert!(
        text.contains("witnessed   seq 0..=6 by a quorum (w1)"),
        "{text}"
    );
    // Asking without the CA cannot reach it: a usage/I-O error, not a verdict.
    let v = tally(
        dir,
        &[
            "verify",
            "L",
            "--key",
            "L/ledger.pub",
            "--witness-policy",
            "policy",
            "--ask-witnesses",
        ],
        None,
    );
    assert_eq!(v.status.code(), Some(2));
    // A CA for a witness the policy does not name, or a CA file that holds none.
    let v = tally(
        dir,
        &[
            "serve",
            "--ledger",
            "L",
            "--socket",
            "s2.sock",
            "--witness-policy",
            "policy",
            "--witness-ca",
            &format!("w9={ca}"),
        ],
        None,
    );
    assert_eq!(v.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&v.stderr).contains("w9"), "{v:?}");
    std::fs::write(dir.join("empty.pem"), "").expect("empty");
    let v = tally(
        dir,
        &[
            "serve",
            "--ledger",
            "L",
            "--socket",
            "s2.sock",
            "--witness-policy",
            "policy",
            "--witness-ca",
            "w1=empty.pem",
        ],
        None,
    );
    assert_eq!(v.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&v.stderr).contains("no PEM certificate"),
        "{v:?}"
    );

    // A witness will not serve plain HTTP beyond loopback unless told it is behind a
    // TLS-terminating proxy; a key file others can read is refused.
    let v = tally(
        dir,
        &[
            "witness",
            "serve",
            "--key",
            "w1.key",
            "--listen",
            "0.0.0.0:0",
            "--state",
            "s",
            "--log",
            &log_vkey,
        ],
        None,
    );
    assert_eq!(v.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&v.stderr).contains("--plain-http"),
        "{v:?}"
    );
    std::fs::set_permissions(
        &pki.key,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .expect("mode");
    let v = tally(
        dir,
        &[
            "witness",
            "serve",
            "--key",
            "w1.key",
            "--listen",
            "127.0.0.1:0",
            "--state",
            "s",
            "--log",
            &log_vkey,
            "--tls-cert",
            cert,
            "--tls-key",
            key,
        ],
        None,
    );
    assert_eq!(v.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&v.stderr).contains("--tls-key"),
        "{v:?}"
    );
}

/// A witness URL the pusher would not send to (plain HTTP beyond loopback, a path the
/// client would rewrite) stops `tally serve` before it says it started, naming the
/// witness and showing the URL redacted, instead of failing each push later.
#[test]
fn a_witness_url_the_pusher_would_refuse_stops_serve_before_it_starts() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ok(&tally(dir, &["keygen", "--out", "auditor.key"], None));
    ok(&tally(
        dir,
        &["init", "--ledger", "L", "--recipient", "auditor.pub"],
        None,
    ));
    let vkey = ok(&tally(
        dir,
        &[
            "witness",
            "keygen",
            "--name",
            "example.org/w1",
            "--out",
            "w1.key",
        ],
        None,
    ))
    .trim()
    .to_owned();
    for url in [
        "http://10.0.0.7:8080/t/SECRET",
        "https://w.example/t/%53ECRET",
    ] {
        std::fs::write(
            dir.join("policy"),
            format!("witness w1 {vkey} {url}\nquorum w1\n"),
        )
        .expect("policy");
        let v = tally(
            dir,
            &[
                "serve",
                "--ledger",
                "L",
                "--socket",
                "s.sock",
                "--witness-policy",
                "policy",
            ],
            None,
        );
        let said = String::from_utf8_lossy(&v.stderr);
        assert_eq!(v.status.code(), Some(2), "{url}: {said}");
        assert!(said.contains("witness w1"), "{url}: {said}");
        assert!(!said.contains("listening"), "{url}: {said}");
        assert!(!said.contains("SECRET"), "{url}: {said}");
    }
}
