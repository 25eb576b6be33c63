//! `tally man DIR` and `tally completions SHELL`: generated from the clap definitions in
//! `cli.rs`, so they say what the parser accepts.

use std::path::Path;

use anyhow::{Context, Result};
use clap::CommandFactory;

use crate::cli::Cli;
use crate::output::noteln;
use crate::Exit;

/// Write `tally.1` and one `tally-SUBCOMMAND.1` per subcommand into `dir`.
pub fn man(args: &crate::cli::ManArgs) -> Result<Exit> {
    let dir: &Path = &args.dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let cmd = Cli::command();
    let mut pages = vec![("tally".to_owned(), cmd.clone())];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("tally-{}", sub.get_name());
        pages.push((name.clone(), sub.clone().name(name)));
        for nested in sub.get_subcommands() {
            let name = format!("tally-{}-{}", sub.get_name(), nested.get_name());
            pages.push((name.clone(), nested.clone().name(name)));
        }
    }
    for (name, page) in &pages {
        let path = dir.join(format!("{name}.1"));
        let mut bytes = Vec::new();
        clap_mangen::Man::new(page.clone())
            .render(&mut bytes)
            .with_context(|| format!("rendering {}", path.display()))?;
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    noteln!(
        "wrote {} man pages to {} (e.g. `man -l {}/tally.1`)",
        pages.len(),
        dir.display(),
        dir.display()
    );
    Ok(Exit::Success)
}

/// Print the completion script for `shell` on standard output.
pub fn completions(args: &crate::cli::CompletionsArgs) -> Result<Exit> {
    let shell = args.shell;
    let mut bytes = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "tally", &mut bytes);
    crate::output::out!("{}", String::from_utf8_lossy(&bytes));
    Ok(Exit::Success)
}
