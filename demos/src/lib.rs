//! `tally demo`: the whole story on the embedded store. Agents append their decisions
//! through the daemon's socket, the ledger is exported and verified offline with only its
//! public key, then decrypted with the auditor key: loops, consistency findings and
//! handoffs are printed, and two attacks on the export are caught.
//!
//! The demo is a crate of its own, above the daemon, the proxy and `tally mcp` it shows:
//! the `tally` binary's `demo` and `mcp-demo-server` subcommands call [`run`] and
//! [`mcp_server`]; no production crate holds demo code.

#![forbid(unsafe_code)]

mod error;
mod gate;
mod mcp;
mod model;
mod output;
mod served;
mod standing;
mod stories;
mod tour;

use std::path::PathBuf;

pub use error::DemoError;

/// What `tally demo` is asked for.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct DemoOptions {
    /// Keep the demo's files here (a new or empty directory); `None`: a temporary
    /// directory, removed after.
    pub dir: Option<PathBuf>,
    /// Print every loop, finding and handoff, and the anchor checkpoint whole.
    pub verbose: bool,
}

impl DemoOptions {
    /// The demo in `dir` (or a temporary directory), `verbose` or in about a screen an act.
    pub fn new(dir: Option<PathBuf>, verbose: bool) -> DemoOptions {
        DemoOptions { dir, verbose }
    }
}

/// Tell the whole story on standard output; whether everything went as it must (the
/// gate's decisions, the proxy's, the verifier's verdicts). An error is a demo that could
/// not go on; a failed write to standard output is said once the story is told.
pub fn run(options: &DemoOptions) -> Result<bool, DemoError> {
    let ok = tour::run(options);
    let written = output::finish().map_err(DemoError::Output);
    let ok = ok?;
    written?;
    Ok(ok)
}

/// The MCP server of the demo's MCP story (a tool that keeps failing), on stdio, until
/// its client hangs up.
pub fn mcp_server() -> Result<(), DemoError> {
    mcp::server()
}
