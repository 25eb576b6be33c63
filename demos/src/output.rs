//! Where the demo writes: its story goes to standard output through `out!`/`outln!`.
//!
//! Nothing here panics: `print!` panics when standard output is a closed pipe (`tally
//! demo | head`) or a full disk. The first write error is kept and every later write
//! skipped; [`crate::run`] returns it once the demo is over.

use std::io::{self, Write};
use std::sync::Mutex;

static FAILED: Mutex<Option<io::Error>> = Mutex::new(None);

/// Write to standard output, like `print!`; see the module docs.
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::stdout(format_args!($($arg)*)) };
}

/// Write a line to standard output, like `println!`; see the module docs.
macro_rules! outln {
    () => { $crate::output::stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::output::stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {out, outln};

#[doc(hidden)]
pub fn stdout(args: std::fmt::Arguments<'_>) {
    let mut failed = FAILED.lock().unwrap_or_else(|p| p.into_inner());
    if failed.is_some() {
        return;
    }
    if let Err(e) = io::stdout().lock().write_fmt(args) {
        *failed = Some(e);
    }
}

/// Flush standard output; the first error any write met, if any.
pub fn finish() -> io::Result<()> {
    let flushed = io::stdout().lock().flush();
    let mut failed = FAILED.lock().unwrap_or_else(|p| p.into_inner());
    match failed.take() {
        Some(e) => Err(e),
        None => flushed,
    }
}
