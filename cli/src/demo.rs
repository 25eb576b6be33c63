//! `tally demo`: the whole story on the embedded store.
use std::path::Path;

pub fn run(_dir: Option<&Path>) -> anyhow::Result<u8> {
    anyhow::bail!("WIRING: demo")
}
