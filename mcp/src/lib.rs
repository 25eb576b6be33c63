//! `tally mcp`: a stdio MCP proxy that puts tally's gate in front of an MCP server
//! without changing the agent.
//!
//! The MCP client starts the proxy in place of the server; the proxy starts the real
//! server and stands between them. Every line from the client is classified with
//! certainty first ([`classify`]): an allow-list of exact methods, read strictly; a line
//! that is not certainly one of them is answered with a JSON-RPC error (or dropped, if it
//! has no usable id), counted, and never forwarded. What passes is forwarded as the bytes
//! classified, except `tools/call`: each one is first checked with the gate
//! (`POST /v1/check` on the agent socket) as the tool `server/tool`, with the call's
//! arguments and the effect class its MCP annotations (or the policy map) give. A refusal
//! is answered, without reaching the server, by a tool result with `isError` and a text
//! the model can act on; an allowed call's answer is recorded as its outcome (`ok`,
//! `error`, or `timeout` when the server does not answer within the gate's time limit).
//! If the gate cannot be reached the call is not made.
//!
//! Framing and message types come from tokio-util's and the official Rust MCP SDK's
//! (`rmcp`) codecs, and rmcp's typed model for the answers the proxy reads.
#![forbid(unsafe_code)]

pub mod call;
pub mod classify;
#[doc(hidden)]
pub mod fuzzing;
mod gate;
pub mod gateway;
mod lines;
pub mod map;
mod proxy;
mod reply;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitStatus;

pub use gate::GateFailure;
pub use map::{MapError, PolicyMap};
use tally_wire::StartRequest;

/// Why the proxy could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// No server command was given.
    #[error("no MCP server command: give it after `--`, e.g. `tally mcp --socket agent.sock --run r1 -- python3 server.py`")]
    NoCommand,
    /// The server command could not be started.
    #[error("cannot start the MCP server `{command}`: {source}")]
    Spawn {
        /// The program.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// The policy map was refused.
    #[error(transparent)]
    Map(#[from] MapError),
    /// Waiting for the server failed.
    #[error("waiting for the MCP server: {0}")]
    Io(std::io::Error),
}

/// What the proxy needs.
#[derive(Clone, Debug)]
pub struct Options {
    /// The gate's agent socket.
    pub socket: PathBuf,
    /// The run every call is checked under; started if the gate does not hold it yet,
    /// joined if it does.
    pub run: String,
    /// The run's goal, if the proxy starts it.
    pub goal: Option<String>,
    /// The worker name recorded with each decision.
    pub worker: Option<String>,
    /// The credential the run is started and checked under.
    pub credential: Option<String>,
    /// The server's name in tool names (`server/tool`); default: its initialize answer's
    /// `serverInfo.name`.
    pub server_name: Option<String>,
    /// Effect overrides.
    pub policy_map: PolicyMap,
    /// The server's command and arguments.
    pub command: Vec<OsString>,
}

impl Options {
    fn asker(&self) -> call::Asker {
        call::Asker {
            worker: self.worker.clone(),
            credential: self.credential.clone(),
        }
    }

    fn start_request(&self) -> StartRequest {
        StartRequest {
            run: self.run.clone(),
            goal: self.goal.clone(),
            worker: self.worker.clone(),
            credential: self.credential.clone(),
            ..StartRequest::default()
        }
    }
}

/// Run the proxy on this process's stdin and stdout until the client hangs up or the
/// server exits; returns the server's exit status.
pub async fn run(options: Options) -> Result<ExitStatus, McpError> {
    proxy::run(options, tokio::io::stdin(), tokio::io::stdout()).await
}

/// A line on stderr (stdout is the MCP stream). A log that cannot be written must not
/// stop the proxy.
fn log(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "tally mcp: {line}");
}
