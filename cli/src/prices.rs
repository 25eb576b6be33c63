//! `tally prices import FILE`: a published price table (LiteLLM's
//! `model_prices_and_context_window.json`) read into the policy's model prices
//! (docs/PROXY.md, "Importing prices"). The policy core reads the table and writes the
//! prices; this edge reads the file, names the day and writes the result.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use tally_policy::dates::Date;
use tally_policy::price_import::{import_litellm, ImportOptions};
use tally_record::clock::{Clock, SystemClock};

use crate::cli::PricesImportArgs;
use crate::output::{noteln, out};
use crate::Exit;

/// `tally prices import`.
pub fn import(args: &PricesImportArgs) -> Result<Exit> {
    if let Some(out) = &args.out {
        if out.symlink_metadata().is_ok() {
            bail!(
                "{} already exists: prices are never written over a file; move it away or choose another path",
                out.display()
            );
        }
    }
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading the price table {}", args.file.display()))?;
    let opts = ImportOptions {
        providers: args.provider.iter().cloned().collect(),
        models: args.model.clone(),
        source: match &args.source {
            Some(s) => s.clone(),
            None => file_name(&args.file),
        },
        as_of: args
            .as_of
            .unwrap_or_else(|| Date::of_ms(SystemClock.now_ms())),
    };
    let imported = import_litellm(&text, &opts)
        .with_context(|| format!("importing {}", args.file.display()))?;
    match &args.out {
        None => out!("{}", imported.toml),
        Some(path) => {
            write_new(path, &imported.toml)?;
            noteln!(
                "wrote {}: {}; add its tables to the policy, beside the upstreams they name",
                path.display(),
                imported.summary()
            );
        }
    }
    Ok(Exit::Success)
}

/// The table's file name, as the prices' default `source`.
fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Write `text` to a new file at `path` (never over one), durably; on failure, nothing
/// is left there.
fn write_new(path: &Path, text: &str) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    let written = file
        .write_all(text.as_bytes())
        .and_then(|()| file.sync_all());
    if let Err(e) = written {
        drop(file);
        let _ = std::fs::remove_file(path);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}
