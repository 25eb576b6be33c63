//! The MCP gateway `tally serve --mcp-listen ADDR` runs (tally-mcp's [`gateway`]): the
//! policy's `[mcp.NAME]` servers, their credentials read here (a file or an environment
//! variable the policy names; the value is never logged) and their TLS configured here
//! (tally-proxy's one HTTPS client configuration, with a server's `ca_file`), the
//! credential of every request read ([`crate::mcp_auth`]), and the connections it refuses
//! counted in the metrics.

use std::sync::Arc;

use axum::Router;
use tally_mcp::gateway::{self, GatewayOptions, RemoteClient, Secret, Server, Target};
use tally_policy::mcp_servers::McpServer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use zeroize::Zeroizing;

use crate::app::App;
use crate::error::DaemonError;
use crate::options::ServeOptions;
use crate::secret_file::read_file;

/// The gateway's task.
pub(crate) struct Gateway {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Gateway {
    /// The policy's servers, their files read, credentials read and HTTP clients built
    /// ([`server`]), if the gateway has a `listener`: before `tally serve` says it
    /// started, so a server that could not be reached stops the start.
    pub(crate) fn servers(
        options: &ServeOptions,
        listener: Option<&TcpListener>,
    ) -> Result<Vec<Server>, DaemonError> {
        if listener.is_none() {
            return Ok(Vec::new());
        }
        options
            .policy
            .policy
            .mcp
            .iter()
            .map(|(name, s)| server(name, s))
            .collect()
    }

    /// Start the gateway to `servers` ([`Gateway::servers`]) on `listener` (bound from
    /// `--mcp-listen`), if there is one; `agent` is the agent socket's router, which its
    /// checks go through.
    pub(crate) fn start(
        app: &Arc<App>,
        options: &ServeOptions,
        servers: Vec<Server>,
        agent: &Router,
        listener: Option<TcpListener>,
    ) -> Result<Option<Gateway>, DaemonError> {
        let Some(listener) = listener else {
            return Ok(None);
        };
        // Every credential a policy entry names is kept from the stdio servers.
        let hidden_env = options
            .policy
            .policy
            .mcp
            .values()
            .filter_map(|s| s.credential_env.clone())
            .collect();
        let gateway_options = GatewayOptions {
            servers,
            hidden_env,
            credentials: Arc::new(crate::mcp_auth::Auth::new(Arc::clone(app), agent.clone())),
            limits: options.mcp_limits,
            clock: Arc::clone(&options.clock),
            worker: Some("tally-mcp-gateway".to_owned()),
            on_refused: {
                let observer = Arc::clone(&app.observer);
                Arc::new(move || observer.metrics.mcp_refused_connection())
            },
            on_session_refused: {
                let observer = Arc::clone(&app.observer);
                Arc::new(move |bound| observer.metrics.mcp_refused_session(bound))
            },
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(e) = gateway::serve(listener, gateway_options, shutdown).await {
                crate::log(&format!("tally serve: the MCP gateway stopped: {e}"));
            }
        });
        Ok(Some(Gateway { stop, task }))
    }

    /// Stop accepting, end the gateway's sessions (the runs they started stopped) and
    /// kill its stdio servers.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// A server of the policy, its credential read and a remote one's HTTP client built
/// (whatever would keep it from being reached stops the start). An entry a policy in force could not
/// have (a recorded policy's plain `http://` to another host) is refused.
fn server(name: &str, s: &McpServer) -> Result<Server, DaemonError> {
    if let Some((key, why)) = s.in_force_problem() {
        return Err(DaemonError::McpGateway(format!(
            "[mcp.{name}] {key}: {why}"
        )));
    }
    let url = match (&s.url, &s.url_file) {
        (Some(url), _) => Some(url.clone()),
        (None, Some(file)) => Some(url_of_file(name, s, file)?),
        (None, None) => None,
    };
    let target = match url {
        None => Target::Command(s.command.clone()),
        Some(url) => Target::Url {
            url,
            credential: credential(name, s)?,
            client: RemoteClient::new(tls(name, s)?)
                .map_err(|e| DaemonError::McpGateway(format!("[mcp.{name}]: {e}")))?,
        },
    };
    Ok(Server {
        name: name.to_owned(),
        target,
    })
}

/// The URL a server's `url_file` holds ([`crate::secret_file::read_file`]), held to the rules of a URL put
/// in force; an error shows it redacted.
fn url_of_file(name: &str, s: &McpServer, file: &str) -> Result<String, DaemonError> {
    let bad = |why: String| DaemonError::McpGateway(format!("[mcp.{name}] url_file {file}: {why}"));
    let url = read_file(file).map_err(bad)?;
    checked_url(name, s, file, &url)
}

/// `url` (what a server's `url_file` holds) if it is a URL the gateway would put in
/// force; an error shows it redacted.
fn checked_url(name: &str, s: &McpServer, file: &str, url: &str) -> Result<String, DaemonError> {
    match s.url_file_problem(url) {
        Some((key, why)) => Err(DaemonError::McpGateway(format!(
            "[mcp.{name}] url_file {file}: {key}: {why}"
        ))),
        None => Ok(url.to_owned()),
    }
}

/// The `url_file`s of `policy`'s MCP servers that cannot be read here (warnings, see
/// [`crate::url_files::check_url_files`]), or the first whose URL the gateway would
/// not put in force.
pub(crate) fn unread_url_files(policy: &tally_policy::Policy) -> Result<Vec<String>, DaemonError> {
    let mut unread = Vec::new();
    for (name, s) in &policy.mcp {
        if let (None, Some(file)) = (&s.url, &s.url_file) {
            match read_file(file) {
                Ok(url) => checked_url(name, s, file, &url).map(drop)?,
                Err(why) => unread.push(format!(
                    "[mcp.{name}] url_file {file}: {why} (not checked here; tally serve reads it)"
                )),
            }
        }
    }
    Ok(unread)
}

/// The TLS configuration a `url` server is reached with: tally's one HTTPS client's
/// (the Mozilla roots), trusting its `ca_file` too, read now.
fn tls(name: &str, s: &McpServer) -> Result<rustls::ClientConfig, DaemonError> {
    let ca_file = s.ca_file.as_deref().map(std::path::Path::new);
    tally_proxy::tls::client_config(ca_file).map_err(|e| {
        let why = match (e, &s.ca_file) {
            (tally_proxy::tls::TlsError::CaFile { why }, Some(file)) => {
                format!("ca_file {file}: {why}")
            }
            (e, _) => e.to_string(),
        };
        DaemonError::McpGateway(format!("[mcp.{name}]: {why}"))
    })
}

/// The header and value a `url` server's credential gives, if it has one.
fn credential(name: &str, s: &McpServer) -> Result<Option<(String, Secret)>, DaemonError> {
    let bad = |why: String| DaemonError::McpGateway(format!("[mcp.{name}]: {why}"));
    let value = match (&s.credential_file, &s.credential_env) {
        (Some(file), _) => {
            read_file(file).map_err(|e| bad(format!("credential_file {file}: {e}")))?
        }
        (None, Some(var)) => Zeroizing::new(
            std::env::var(var)
                .map_err(|_| bad(format!("credential_env {var} is not set (or not UTF-8)")))?,
        ),
        (None, None) => return Ok(None),
    };
    if value.is_empty() || hyper::header::HeaderValue::from_str(&value).is_err() {
        return Err(bad(
            "the credential is empty or not a header value (one line of visible characters)".into(),
        ));
    }
    let header = s
        .header
        .clone()
        .unwrap_or_else(|| "Authorization".to_owned());
    Ok(Some((header, Secret(value))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A policy a ledger recorded reads with plain `http://` to any host (earlier builds
    /// took it); the gateway still never reaches such a server.
    #[test]
    fn a_recorded_plain_http_server_elsewhere_is_not_started() {
        let text = "[mcp.search]\nurl = \"http://10.0.0.7:8000/mcp\"\n";
        let recorded = tally_policy::Recorded::from_ledger(text).expect("a recorded policy");
        match server("search", &recorded.policy.mcp["search"]) {
            Err(DaemonError::McpGateway(why)) => {
                assert!(
                    why.contains("[mcp.search] url") && why.contains("loopback"),
                    "{why}"
                )
            }
            other => panic!("{:?}", other.map(|s| s.name)),
        }
    }

    /// A server's URL given in a `url_file` is read at start and held to the rules of a
    /// URL put in force; a refusal shows it redacted.
    #[test]
    fn a_url_file_is_read_at_start_and_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("web.url");
        let s = McpServer {
            url_file: Some(file.display().to_string()),
            ..McpServer::default()
        };
        std::fs::write(&file, "http://127.0.0.1:9/t/SECRET/mcp\n").expect("write");
        match server("web", &s) {
            Ok(Server {
                target: Target::Url { url, .. },
                ..
            }) => assert_eq!(url, "http://127.0.0.1:9/t/SECRET/mcp"),
            other => panic!("{other:?}"),
        }
        for text in ["http://10.0.0.7/t/SECRET/mcp", "https://u:SECRET@h/mcp", ""] {
            std::fs::write(&file, text).expect("write");
            match server("web", &s) {
                Err(DaemonError::McpGateway(why)) => {
                    assert!(why.contains("[mcp.web] url_file"), "{why}");
                    assert!(!why.contains("SECRET"), "{why}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        std::fs::remove_file(&file).expect("rm");
        assert!(server("web", &s).is_err());
    }

    /// A Kubernetes secret volume's key is a link to a link (`token -> ..data/token`,
    /// `..data -> ..2026_12_07...`): it is followed to the file.
    #[test]
    fn a_secret_volumes_linked_key_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let at = |name: &str| dir.path().join(name);
        std::fs::create_dir(at("..2026_12_07")).expect("mkdir");
        std::fs::write(at("..2026_12_07/token"), "Bearer tok\n").expect("write");
        std::os::unix::fs::symlink("..2026_12_07", at("..data")).expect("symlink");
        std::os::unix::fs::symlink("..data/token", at("token")).expect("symlink");
        let s = McpServer {
            url: Some("https://h/mcp".into()),
            credential_file: Some(at("token").display().to_string()),
            ..McpServer::default()
        };
        match credential("web", &s) {
            Ok(Some((header, value))) => {
                assert_eq!(header, "Authorization");
                assert_eq!(value.0.as_str(), "Bearer tok");
            }
            other => panic!("{:?}", other.map(|c| c.map(|(h, _)| h))),
        }
    }

    /// `tally policy check` away from a server's secrets (in CI): a `url_file` it cannot
    /// read is a warning; one it reads whose URL breaks a rule is an error.
    #[test]
    fn an_unreadable_url_file_is_a_warning_a_bad_url_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("web.url");
        let text = format!("[mcp.web]\nurl_file = {:?}\n", file.display().to_string());
        let policy = tally_policy::Policy::from_toml(&text).expect("policy");
        let warnings =
            crate::url_files::check_url_files(&policy).expect("a missing file is no error");
        assert!(
            matches!(warnings.as_slice(), [w] if w.contains("[mcp.web] url_file") && w.contains("not checked here")),
            "{warnings:?}"
        );
        std::fs::write(&file, "https://127.0.0.1:9/mcp\n").expect("write");
        assert_eq!(
            crate::url_files::check_url_files(&policy).expect("a good URL"),
            Vec::<String>::new()
        );
        std::fs::write(&file, "http://10.0.0.7:8000/t/SECRET/mcp\n").expect("write");
        match crate::url_files::check_url_files(&policy) {
            Err(DaemonError::McpGateway(why)) => {
                assert!(
                    why.contains("[mcp.web] url_file") && !why.contains("SECRET"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    /// A remote server's HTTP client is built at start, over tally's one TLS
    /// configuration: a configuration the HTTP client does not take fails here (and
    /// `tally serve` at its start), not at a first call.
    #[test]
    fn a_remote_servers_http_client_is_built_at_start() {
        let s = McpServer {
            url: Some("https://mcp.example.com/mcp".into()),
            ..McpServer::default()
        };
        match server("web", &s) {
            Ok(Server {
                target: Target::Url { url, .. },
                ..
            }) => assert_eq!(url, "https://mcp.example.com/mcp"),
            other => panic!("{other:?}"),
        }
    }
}
