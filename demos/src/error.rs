//! The demo's one error: what it was doing when it could not go on, and why.

use std::error::Error;
use std::fmt;

/// Why `tally demo` (or its MCP server) could not go on.
#[derive(Debug)]
#[non_exhaustive]
pub enum DemoError {
    /// A step failed: what it was doing, and the error it met.
    Step {
        /// What the demo was doing (`reading the export`).
        what: String,
        /// The error it met.
        source: Box<dyn Error + Send + Sync>,
    },
    /// The demo cannot go on, for the reason said (`the daemon did not start on ...`).
    Refused(String),
    /// Writing the story to standard output failed (a closed pipe, a full disk).
    Output(std::io::Error),
}

impl fmt::Display for DemoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DemoError::Step { what, .. } => f.write_str(what),
            DemoError::Refused(why) => f.write_str(why),
            DemoError::Output(_) => f.write_str("writing to standard output"),
        }
    }
}

impl Error for DemoError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            DemoError::Step { source, .. } => Some(source.as_ref()),
            DemoError::Refused(_) => None,
            DemoError::Output(e) => Some(e),
        }
    }
}

/// An error of a library the demo calls, said as that error says itself.
macro_rules! from_errors {
    ($($t:ty),* $(,)?) => {$(
        impl From<$t> for DemoError {
            fn from(e: $t) -> DemoError {
                DemoError::Step { what: e.to_string(), source: Box::new(e) }
            }
        }
    )*};
}

from_errors!(
    std::io::Error,
    serde_json::Error,
    tokio::task::JoinError,
    hyper::Error,
    hyper::http::Error,
    tally_ledger::Error,
    tally_api::GateError,
    tally_api::client::ClientError,
    tally_ledger::FormatError,
    tally_daemon::DaemonError,
    tally_policy::PolicyError,
    tally_mcp::McpError,
);

/// The demo's `Result`.
pub type Result<T, E = DemoError> = std::result::Result<T, E>;

/// What the demo was doing when an error came, said with it (as `anyhow::Context`).
pub(crate) trait Context<T> {
    /// The error, with what the demo was doing.
    fn context(self, what: impl Into<String>) -> Result<T>;
    /// The error, with what the demo was doing, said only if it failed.
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T>;
}

impl<T, E: Error + Send + Sync + 'static> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.map_err(|e| DemoError::Step {
            what: what.into(),
            source: Box::new(e),
        })
    }

    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|e| DemoError::Step {
            what: what().into(),
            source: Box::new(e),
        })
    }
}

/// Leave with [`DemoError::Refused`], the reason formatted (as `anyhow::bail!`).
macro_rules! bail {
    ($($arg:tt)*) => { return Err($crate::error::DemoError::Refused(format!($($arg)*))) };
}

pub(crate) use bail;
