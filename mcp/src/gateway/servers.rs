//! The servers behind the gateway: one rmcp client each, shared by every session,
//! connected on first use and again after its transport failed; the effect class of
//! each tool, learned from its `tools/list` (as `tally mcp` learns it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, Tool};
use rmcp::service::{RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Map, Value};
use tally_record::Effect;

use super::{Server, Target, SEPARATOR};

/// How long connecting to a server (its initialize exchange) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

type Client = RunningService<RoleClient, ()>;

/// One server and its client.
pub(super) struct Backend {
    pub(super) name: String,
    target: Target,
    client: tokio::sync::Mutex<Option<Arc<Client>>>,
    /// Effects learned from its `tools/list`, by its own tool name.
    effects: Mutex<HashMap<String, Effect>>,
}

/// How a call to a server ended, when it was made.
pub(super) enum Called {
    /// It answered with a result (`isError` or not).
    Result(CallToolResult),
    /// It answered with a JSON-RPC error.
    Error(rmcp::ErrorData),
    /// No answer in time.
    Timeout,
    /// The transport failed: whether the server acted is unknown.
    Lost(String),
}

impl Backend {
    pub(super) fn new(server: Server) -> Backend {
        Backend {
            name: server.name,
            target: server.target,
            client: tokio::sync::Mutex::new(None),
            effects: Mutex::new(HashMap::new()),
        }
    }

    /// The connected client, connecting if there is none.
    async fn client(&self) -> Result<Arc<Client>, String> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(Arc::clone(c));
        }
        let client = tokio::time::timeout(CONNECT_TIMEOUT, connect(&self.target))
            .await
            .map_err(|_| "it did not finish initializing in time".to_owned())??;
        let client = Arc::new(client);
        *slot = Some(Arc::clone(&client));
        Ok(client)
    }

    /// Forget the client after a transport failure: the next use connects again.
    async fn drop_client(&self) {
        *self.client.lock().await = None;
    }

    /// Its tools, each renamed `NAME__tool`; their effects learned on the way.
    pub(super) async fn tools(&self) -> Result<Vec<Tool>, String> {
        let client = self.client().await?;
        let tools = match client.peer().list_all_tools().await {
            Ok(t) => t,
            Err(e) => {
                self.drop_client().await;
                return Err(e.to_string());
            }
        };
        let mut effects = self.effects.lock().unwrap_or_else(|p| p.into_inner());
        Ok(tools
            .into_iter()
            .map(|mut tool| {
                effects.insert(
                    tool.name.to_string(),
                    crate::map::effect_of(tool.annotations.as_ref()),
                );
                tool.name = format!("{}{SEPARATOR}{}", self.name, tool.name).into();
                tool
            })
            .collect())
    }

    /// The effect a call of `tool` is checked under: its annotations (listing the
    /// server's tools first if they are not known yet), else a non-idempotent write.
    pub(super) async fn effect(&self, tool: &str) -> Effect {
        let known = |b: &Backend| {
            b.effects
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(tool)
                .copied()
        };
        if let Some(e) = known(self) {
            return e;
        }
        if let Err(e) = self.tools().await {
            crate::log(&format!(
                "gateway: server {} did not list its tools ({e}): unlisted tools count as non-idempotent writes",
                self.name
            ));
        }
        known(self).unwrap_or(Effect::NonIdempotentWrite)
    }

    /// Call `tool` with `arguments`, waiting at most `timeout`.
    pub(super) async fn call(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
        timeout: Duration,
    ) -> Called {
        let client = match self.client().await {
            Ok(c) => c,
            Err(e) => return Called::Lost(format!("cannot connect: {e}")),
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        match tokio::time::timeout(timeout, client.peer().call_tool(params)).await {
            Err(_) => Called::Timeout,
            Ok(Ok(result)) => Called::Result(result),
            Ok(Err(ServiceError::McpError(e))) => Called::Error(e),
            Ok(Err(e)) => {
                self.drop_client().await;
                Called::Lost(e.to_string())
            }
        }
    }
}

/// Start or reach the server and run MCP's initialize exchange with it.
async fn connect(target: &Target) -> Result<Client, String> {
    match target {
        Target::Command(command) => {
            let (program, args) = command.split_first().ok_or("no command")?;
            let mut c = tokio::process::Command::new(program);
            c.args(args);
            // The server's stderr is the daemon's (a pipe no one reads would fill).
            let (transport, _) = TokioChildProcess::builder(c)
                .stderr(std::process::Stdio::inherit())
                .spawn()
                .map_err(|e| format!("cannot start `{program}`: {e}"))?;
            ().serve(transport).await.map_err(|e| e.to_string())
        }
        Target::Url { url, credential } => {
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            if let Some((name, secret)) = credential {
                let name = hyper::header::HeaderName::try_from(name.as_str())
                    .map_err(|e| format!("header {name}: {e}"))?;
                let mut value =
                    hyper::header::HeaderValue::try_from(secret.0.as_str()).map_err(|_| {
                        format!("the credential for header {name} is not a header value")
                    })?;
                value.set_sensitive(true);
                config.custom_headers.insert(name, value);
            }
            let transport = StreamableHttpClientTransport::from_config(config);
            ().serve(transport).await.map_err(|e| e.to_string())
        }
    }
}
