//! `tally witness keygen|serve`, and what `verify --witness-policy` and `serve
//! --witness-policy` read: the policy file, and the witnesses' own latest views.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use ed25519_dalek::SigningKey;
use tally_daemon::witness::WitnessClient;
use tally_ledger::tlog::note::{Note, Vkey, TYPE_COSIGNATURE};
use tally_ledger::tlog::policy::Policy;
use tally_ledger::tlog::witness::{origin_hash, Witness};
use tally_verify::tree::TreeAnchor;
use zeroize::Zeroizing;

use crate::cli::WitnessCommand;
use crate::output::{errln, noteln, outln};
use crate::Exit;

const WITNESS_KEY_HEADER: &str = "tally witness key v1\n";

/// Read a C2SP tlog-policy file.
pub fn read_policy(path: &Path) -> Result<Policy> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("reading the witness policy {}", path.display()))?;
    Policy::parse(&bytes).with_context(|| format!("{}", path.display()))
}

/// `--witness-ca NAME=PEM`s: by witness name, the CA file to trust beside the Mozilla
/// roots. A name given twice is refused.
pub fn ca_files(args: &[String]) -> Result<BTreeMap<String, PathBuf>> {
    let mut out = BTreeMap::new();
    for a in args {
        let Some((name, file)) = a
            .split_once('=')
            .filter(|(n, f)| !n.is_empty() && !f.is_empty())
        else {
            bail!("--witness-ca {a}: give NAME=PEM (the witness's name in the policy, a CA file)");
        };
        if out.insert(name.to_owned(), PathBuf::from(file)).is_some() {
            bail!("--witness-ca: `{name}` is given twice");
        }
    }
    Ok(out)
}

/// Judge each of an audit's ledgers' cosigned checkpoints by the policy at `path`; with
/// `ask`, also hold each ledger to the latest checkpoint each witness with a URL says it
/// cosigned (over HTTPS, trusting `cas` for the witnesses it names).
pub fn apply_policy(
    ledgers: &mut [tally_verify::audit::Ledger],
    path: &Path,
    ask: bool,
    cas: &BTreeMap<String, PathBuf>,
) -> Result<()> {
    let policy = read_policy(path)?;
    if let Some(name) = cas
        .keys()
        .find(|n| !policy.witnesses.iter().any(|w| &w.name == *n))
    {
        bail!(
            "--witness-ca {name}: not a witness of {} (give the name of a `witness` line)",
            path.display()
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the HTTP client")?;
    for l in ledgers.iter_mut() {
        l.options.witness_policy = Some(policy.clone());
        if !ask {
            continue;
        }
        let origin = tally_ledger::tlog::origin(l.options.public.ledger_id);
        for w in &policy.witnesses {
            let Some(url) = &w.url else { continue };
            let url = format!(
                "{}/{}/checkpoint",
                url.trim_end_matches('/'),
                origin_hash(&origin)
            );
            let client = WitnessClient::new(cas.get(&w.name).map(PathBuf::as_path))
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("--witness-ca for witness {}", w.name))?;
            let reply = runtime
                .block_on(client.request("GET", &url, Vec::new()))
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("asking witness {} for its view of {origin}", w.name))?;
            match reply.status {
                404 => continue,
                200 => {}
                s => bail!(
                    "witness {} answered {s} for its view of {origin} ({})",
                    w.name,
                    tally_record::url::redacted(&url)
                ),
            }
            let note = Note::parse(&reply.body).with_context(|| {
                format!(
                    "witness {} answered {} with no checkpoint",
                    w.name,
                    tally_record::url::redacted(&url)
                )
            })?;
            let sig = note
                .sig_of(&w.vkey.name, w.vkey.key_id())
                .with_context(|| {
                    format!(
                        "witness {}'s view of {origin} carries no cosignature of its key",
                        w.name
                    )
                })?;
            w.vkey
                .verify_cosignature(&note.text, sig)
                .with_context(|| format!("witness {}'s view of {origin}", w.name))?;
            l.options.tree_anchors.push(TreeAnchor {
                source: format!("witness {}", w.name),
                note,
            });
        }
    }
    Ok(())
}

/// `tally witness ...`.
pub fn run(command: WitnessCommand) -> Result<Exit> {
    match command {
        WitnessCommand::Keygen { name, out } => keygen(&name, &out),
        WitnessCommand::Serve {
            key,
            listen,
            tls_cert,
            tls_key,
            plain_http,
            state,
            logs,
        } => {
            let tls = match (tls_cert, tls_key) {
                (Some(c), Some(k)) => {
                    Some(tally_daemon::witness::tls_acceptor(&c, &k).map_err(anyhow::Error::msg)?)
                }
                _ => None,
            };
            if tls.is_none() && !plain_http && !listen.ip().is_loopback() {
                bail!(
                    "--listen {listen}: not a loopback address, and no --tls-cert/--tls-key: serve HTTPS there, or give --plain-http if a TLS-terminating proxy is in front"
                );
            }
            serve(&key, listen, tls, &state, &logs)
        }
    }
}

fn keygen(name: &str, out: &Path) -> Result<Exit> {
    if !tally_ledger::tlog::note::valid_name(name) {
        bail!("--name {name:?}: a witness name has no space and no `+` (e.g. example.org/w1)");
    }
    let pub_path = out.with_extension("pub");
    if out.symlink_metadata().is_ok() || pub_path.symlink_metadata().is_ok() {
        bail!(
            "{} or {} already exists: give another --out",
            out.display(),
            pub_path.display()
        );
    }
    let key = SigningKey::generate(&mut rand_core::OsRng);
    let seed = Zeroizing::new(hex::encode(key.to_bytes()));
    let text = Zeroizing::new(format!(
        "{WITNESS_KEY_HEADER}name {name}\nsign {}\n",
        seed.as_str()
    ));
    tally_ledger::keys::write_secret_file(out, text.as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    let vkey = Vkey::new(name, TYPE_COSIGNATURE, key.verifying_key().to_bytes())
        .context("witness name")?;
    std::fs::write(&pub_path, format!("{}\n", vkey.to_text()))
        .with_context(|| format!("writing {}", pub_path.display()))?;
    noteln!("wrote {} (0600) and {}", out.display(), pub_path.display());
    outln!("{}", vkey.to_text());
    Ok(Exit::Success)
}

fn read_key(path: &Path) -> Result<(String, SigningKey)> {
    let text = tally_ledger::keys::read_secret_file(path)
        .with_context(|| format!("reading the witness key {}", path.display()))?;
    let bad = || {
        anyhow::anyhow!(
            "{}: not a tally witness key (`tally witness keygen`)",
            path.display()
        )
    };
    let rest = text.strip_prefix(WITNESS_KEY_HEADER).ok_or_else(bad)?;
    let mut lines = rest.split('\n');
    let name = lines
        .next()
        .and_then(|l| l.strip_prefix("name "))
        .ok_or_else(bad)?;
    let sign = lines
        .next()
        .and_then(|l| l.strip_prefix("sign "))
        .ok_or_else(bad)?;
    if lines.next() != Some("") || lines.next().is_some() {
        return Err(bad());
    }
    let seed = Zeroizing::new(
        tally_ledger::format::parse_hex::<32>(sign, "witness key").map_err(|_| bad())?,
    );
    Ok((name.to_owned(), SigningKey::from_bytes(&seed)))
}

fn serve(
    key: &Path,
    listen: std::net::SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    state: &Path,
    logs: &[String],
) -> Result<Exit> {
    let (name, key) = read_key(key)?;
    let mut vkeys = Vec::new();
    for l in logs {
        let v = Vkey::parse(l).with_context(|| format!("--log {l}"))?;
        if v.sig_type != tally_ledger::tlog::note::TYPE_ED25519 {
            bail!("--log {l}: a log's key is of signature type 0x01 (`tally checkpoint --vkey`)");
        }
        vkeys.push(v);
    }
    let witness =
        Arc::new(Witness::new(&name, key, vkeys, state).map_err(|e| anyhow::anyhow!("{e}"))?);
    let vkey = witness.vkey().to_text();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let addr = listener.local_addr().context("the listening address")?;
        errln!(
            "tally witness: {name} ({vkey}) listening on {} for {} log(s); state in {}",
            tally_daemon::witness::describe(addr, tls.is_some()),
            logs.len(),
            state.display()
        );
        let shutdown = async {
            use tokio::signal::unix::{signal, SignalKind};
            if let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
            }
        };
        tally_daemon::witness::serve_witness(witness, listener, tls, shutdown)
            .await
            .context("serving")
    })?;
    errln!("tally witness: stopped");
    Ok(Exit::Success)
}
