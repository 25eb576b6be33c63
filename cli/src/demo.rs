//! `tally demo` and `tally mcp-demo-server`: the story is the tally-demos crate's; the
//! CLI hands it its arguments and says how it ended.

use anyhow::Result;

use crate::cli::DemoArgs;
use crate::Exit;

/// `tally demo`: the whole story; findings if anything did not go as it must.
pub fn run(args: &DemoArgs) -> Result<Exit> {
    let options = tally_demos::DemoOptions::new(args.dir.clone(), args.verbose);
    Ok(match tally_demos::run(&options)? {
        true => Exit::Success,
        false => Exit::Findings,
    })
}

/// `tally mcp-demo-server`: the MCP story's server, on stdio.
pub fn mcp_server() -> Result<Exit> {
    tally_demos::mcp_server()?;
    Ok(Exit::Success)
}
