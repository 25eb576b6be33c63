//! The daemon serving the demo's ledger through acts 2 and 3, and the agents it serves.

use std::path::Path;
use std::sync::Arc;

use tally_api::client::Client;
use tally_ledger::Ledger;

use crate::error::{bail, Context, DemoError, Result};
use crate::gate::gate_story;
use crate::output::outln;
use crate::standing::standing;

/// The daemon serving the demo's ledger through acts 2 and 3: the gate on its sockets
/// and the model proxy on loopback, in front of the demo's model API.
pub(crate) struct Served {
    runtime: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<Result<(), tally_daemon::DaemonError>>>,
    dana: tally_ledger::keys::ApproverKey,
    model: crate::model::FakeModel,
    proxy: std::net::SocketAddr,
}

impl Served {
    /// Serve `ledger` on the agent and operator sockets, with the proxy on a loopback
    /// port in front of a model API of the demo's own (in this process, no network).
    pub(crate) fn start(
        ledger: &Arc<Ledger>,
        ledger_dir: &Path,
        socket: &Path,
        operator_socket: &Path,
    ) -> Result<Served> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        // The operator's key to the model API: the daemon holds it, the agent never does.
        let key = format!(
            "sk-demo-{}",
            hex::encode(rand_core::RngCore::next_u64(&mut rand_core::OsRng).to_be_bytes())
        );
        let model = runtime.block_on(crate::model::FakeModel::start(&key))?;
        let proxy = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free loopback port for the proxy")?;
        let mut options = tally_daemon::ServeOptions::new(ledger_dir, socket);
        options.operator_socket = Some(operator_socket.to_path_buf());
        // The demo's approver: a human whose key the policy lists; and the model API.
        let dana = tally_ledger::keys::ApproverKey::generate();
        options.policy = tally_policy::Recorded::new(&format!(
            "[approvals.approvers]\ndana = \"{}\"\n{}",
            dana.public_hex(),
            crate::model::policy(&model.url())
        ))?;
        let mut proxied = tally_daemon::ProxyServe::default();
        proxied.listen = Some(proxy);
        proxied.credentials.insert(
            crate::model::CREDENTIAL.to_owned(),
            zeroize::Zeroizing::new(model.key().to_owned()),
        );
        options.proxy = Some(proxied);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = runtime.spawn(tally_daemon::serve(Arc::clone(ledger), options, async {
            let _ = stopped.await;
        }));
        let mut served = Served {
            runtime,
            stop: Some(stop),
            server: Some(server),
            dana,
            model,
            proxy,
        };
        let mut tries = 0;
        while !socket.exists()
            || !operator_socket.exists()
            || std::net::TcpStream::connect(proxy).is_err()
        {
            tries += 1;
            if tries > 500 || served.server.as_ref().is_some_and(|s| s.is_finished()) {
                served.stop()?;
                bail!("the daemon did not start on {}", socket.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok(served)
    }

    /// Act 2: agents ask the gate on the agent socket (a retry storm, a repeated payment
    /// whose outcome is unknown, a reservation over budget, an MCP client), and the
    /// recorded runs of the corpus are imported on the operator socket, one request at a
    /// time, concurrently. Returns (imported, refused, whether the gate behaved as it
    /// must).
    pub(crate) fn agents(
        &self,
        socket: &Path,
        operator_socket: &Path,
        corpus: Vec<(&'static str, Vec<tally_ledger::Decision>)>,
    ) -> Result<(usize, usize, bool)> {
        self.runtime.block_on(async {
            let gated = gate_story(socket, operator_socket, &self.dana).await?;
            let gated = crate::mcp::story(socket).await? && gated;
            outln!(
                "  the client went away, and `tally mcp` ended its session: {}",
                standing(operator_socket, crate::mcp::RUN).await?
            );
            let agents: Vec<_> = corpus
                .into_iter()
                .map(|(_, decisions)| {
                    let socket = operator_socket.to_path_buf();
                    tokio::spawn(async move {
                        let mut client = Client::unix(&socket).await?;
                        let (mut appended, mut refused) = (0, 0);
                        for d in decisions {
                            match client.append(&serde_json::to_string(&d)?).await {
                                Ok(_) => appended += 1,
                                Err(_) => refused += 1,
                            }
                        }
                        Ok::<_, DemoError>((appended, refused))
                    })
                })
                .collect();
            let (mut appended, mut refused) = (0, 0);
            for agent in agents {
                let (a, r) = agent.await??;
                appended += a;
                refused += r;
            }
            Ok((appended, refused, gated))
        })
    }

    /// Act 3: an agent loop calling the model through the proxy.
    pub(crate) fn model_story(
        &self,
        socket: &Path,
        operator_socket: &Path,
        verbose: bool,
    ) -> Result<bool> {
        self.runtime.block_on(crate::model::story(
            socket,
            operator_socket,
            self.proxy,
            &self.model,
            verbose,
        ))
    }

    /// Stop the daemon and wait for it (its decisions all durable).
    pub(crate) fn stop(&mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            self.runtime.block_on(server)??;
        }
        Ok(())
    }
}
