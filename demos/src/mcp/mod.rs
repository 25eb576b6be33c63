//! `tally demo`'s MCP story: a real MCP server (`tally mcp-demo-server`, whose one tool
//! keeps failing) behind `tally mcp`, and a client calling that tool in a loop, as an
//! agent stuck on a failing tool does. The gate stops the loop; the call it refused
//! never reaches the server.

use std::path::Path;
use std::process::Stdio;

use crate::error::{bail, Context, Result};
use crate::output::outln;

mod session;

/// The run the story's calls count against.
pub const RUN: &str = "mcp-reports";

/// Tell the story against the gate on `socket`; whether the gate stopped the loop.
pub async fn story(socket: &Path) -> Result<bool> {
    outln!("An MCP client loops on a failing tool: run `{RUN}`, through `tally mcp`.");
    let tally = std::env::current_exe().context("finding the tally binary")?;
    let mut proxy = tokio::process::Command::new(&tally)
        .arg("mcp")
        .arg("--socket")
        .arg(socket)
        .args(["--run", RUN, "--goal", "check the Q3 export", "--"])
        .arg(&tally)
        .arg("mcp-demo-server")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting tally mcp")?;
    let (Some(to_proxy), Some(from_proxy)) = (proxy.stdin.take(), proxy.stdout.take()) else {
        bail!("tally mcp gave no stdio");
    };
    let seen = session::loop_on_failing_tool(from_proxy, to_proxy, 10).await?;
    for (i, a) in seen.iter().enumerate() {
        let who = if a.refused { "" } else { "the server: " };
        outln!(
            "  call {}: {who}{}",
            i + 1,
            tally_verify::text::shown(&a.text)
        );
    }
    let _ = proxy.wait().await;
    let stopped = seen.last().is_some_and(|a| a.refused) && seen.len() < 10;
    if !stopped {
        outln!("  the gate did not stop the loop (see above)");
    }
    Ok(stopped)
}

/// `tally mcp-demo-server`: the story's MCP server, on stdio.
pub fn server() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(session::serve_reports(
        tokio::io::stdin(),
        tokio::io::stdout(),
    ))?;
    Ok(())
}
