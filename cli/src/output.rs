//! Where `tally` writes. Reports go to standard output through `out!`/`outln!`; notes
//! for the person at the terminal go to standard error through `note!`/`noteln!`
//! (silenced by `--quiet`), and `errln!` is for what must be said even then.
//!
//! Nothing here panics: `print!` panics when standard output is a closed pipe (`tally
//! verify ... | head`) or a full disk. The first write error is kept and every later
//! write skipped; `main` then ends quietly for a closed pipe and exits 2 for anything
//! else (see `finish`).

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static FAILED: Mutex<Option<io::Error>> = Mutex::new(None);
static QUIET: AtomicBool = AtomicBool::new(false);

/// Write to standard output, like `print!`; see the module docs.
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::stdout(format_args!($($arg)*)) };
}

/// Write a line to standard output, like `println!`; see the module docs.
macro_rules! outln {
    () => { $crate::output::stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::output::stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

/// A note on standard error (not with `--quiet`), like `eprint!`.
macro_rules! note {
    ($($arg:tt)*) => { $crate::output::stderr(false, format_args!($($arg)*)) };
}

/// A note line on standard error (not with `--quiet`), like `eprintln!`.
macro_rules! noteln {
    ($($arg:tt)*) => { $crate::output::stderr(false, format_args!("{}\n", format_args!($($arg)*))) };
}

/// A line on standard error that `--quiet` does not silence: why a command failed.
macro_rules! errln {
    ($($arg:tt)*) => { $crate::output::stderr(true, format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {errln, note, noteln, out, outln};

/// `--quiet`: no notes and no progress, only reports and errors.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether `--quiet` was given.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

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

#[doc(hidden)]
pub fn stderr(always: bool, args: std::fmt::Arguments<'_>) {
    if always || !quiet() {
        // Standard error is where a failure would be reported: if it is gone, stay silent.
        let _ = io::stderr().lock().write_fmt(args);
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
