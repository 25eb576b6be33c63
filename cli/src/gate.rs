//! The CLI's connection to a daemon: a [`GateClient`] connected now, so that a daemon
//! that is not there is said with what to do about it.

use std::path::Path;

use anyhow::Result;
use tally_api::{GateClient, GateError};

/// A client of the daemon on `socket`, connected; `what` names the socket and how to
/// get a daemon there (`the gate at PATH (is `tally serve` running?)`).
pub async fn connect(socket: &Path, what: impl FnOnce(&Path) -> String) -> Result<GateClient> {
    let mut gate = GateClient::new(socket);
    if let Err(e) = gate.connect().await {
        let why = match e {
            GateError::Unreachable { why, .. } => why,
            e => e.to_string(),
        };
        anyhow::bail!("connecting to {}: {why}", what(socket));
    }
    Ok(gate)
}
