//! `tally mcp`: the stdio MCP proxy (the work is in `tally-mcp`).

use anyhow::Context;

use crate::cli::McpArgs;
use crate::output::errln;
use crate::Exit;

/// Run the proxy: exit 0 when the server exited 0, else 2 (tally's exit codes are 0-3;
/// the server's own code is on stderr).
pub fn run(args: McpArgs) -> anyhow::Result<Exit> {
    let policy_map = match &args.policy_map {
        Some(path) => tally_mcp::PolicyMap::load(path)?,
        None => tally_mcp::PolicyMap::default(),
    };
    let options = tally_mcp::Options {
        socket: args.socket,
        run: args.run,
        goal: args.goal,
        worker: args.worker,
        credential: args.credential,
        server_name: args.server_name,
        policy_map,
        command: args.command,
    };
    // One thread: the proxy waits on pipes and one socket, and adds least latency so.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let status = runtime.block_on(tally_mcp::run(options));
    // Tokio reads stdin on a thread it cannot cancel: do not wait for it.
    runtime.shutdown_background();
    let status = status?;
    if status.success() {
        return Ok(Exit::Success);
    }
    errln!("tally mcp: the server exited with {status}");
    Ok(Exit::Error)
}
