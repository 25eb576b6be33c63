//! Typed errors: [`DaemonError`] for starting and running the daemon, and [`ApiError`]
//! for what one HTTP request gets back.

use std::io;
use std::path::PathBuf;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tally_ledger::DecisionError;

use tally_wire::ErrorCode;
use tally_wire::{ErrorDetail, ErrorReply};

/// Why the daemon could not start, or ended with an error.
///
/// Each message is whole: it includes its cause, and no variant reports that cause again
/// as its `source()`, so printing the error with its chain says everything once.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    /// Opening the ledger failed (not a ledger, locked by another process, ...).
    #[error("ledger: {0}")]
    Ledger(tally_ledger::Error),
    /// The gate could not open over the ledger (its stored state is unreadable, or the
    /// policy could not be recorded).
    #[error("gate: {0}")]
    Gate(String),
    /// The ledger directory does not exist: nothing was started.
    #[error("{}: no ledger here: create one with `tally init --ledger {} --recipient auditor.pub` (the auditor's public key), or give the directory of an existing ledger", .path.display(), .path.display())]
    NoLedger {
        /// The directory given.
        path: PathBuf,
    },
    /// The ledger directory is open to other users; only the daemon's user may reach it.
    #[error("{path}: ledger directory has mode {mode:o}; only the daemon's user may read it: run `chmod 700 {path}`")]
    LedgerPermissions {
        /// The ledger directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Another process is already serving on the socket path.
    #[error(
        "{path}: another process is listening on this socket; stop it or choose another --socket"
    )]
    SocketInUse {
        /// The socket path.
        path: PathBuf,
    },
    /// The socket path exists and is not a socket; the daemon never deletes such a file.
    #[error("{path}: exists and is not a socket; remove it or choose another --socket")]
    SocketPathTaken {
        /// The socket path.
        path: PathBuf,
    },
    /// A TCP listen address that is not loopback: the daemon has no authentication, so it
    /// only listens where local processes alone can reach it.
    #[error("{addr}: not a loopback address; the daemon only listens on 127.0.0.0/8 or ::1")]
    NotLoopback {
        /// The refused address.
        addr: std::net::SocketAddr,
    },
    /// The MCP gateway cannot start: a server's credential cannot be read, or the run
    /// token key cannot be opened.
    #[error("MCP gateway: {0}")]
    McpGateway(String),
    /// A witness's URL is one the pusher would not send to.
    #[error("--witness-policy: {0}")]
    WitnessUrl(#[from] crate::witness::WitnessUrlError),
    /// The witness pusher cannot start (a CA file, a witness name).
    #[error("witnesses: {0}")]
    Witness(String),
    /// Notifications cannot start (the secret file, a receiver URL, the CA file).
    #[error("--notify: {0}")]
    Notify(String),
    /// A proxy upstream's `url_file` cannot be read, or holds a URL a policy put in
    /// force may not give (shown redacted).
    #[error("proxy: {0}")]
    UpstreamUrlFile(String),
    /// The proxy cannot start (a missing credential, a `ca_file`, the run token key).
    #[error("proxy: {0}")]
    Proxy(#[from] tally_proxy::ProxyError),
    /// `--otlp-endpoint` could not be used; nothing was started.
    #[error("--otlp-endpoint {endpoint}: {why}; give the collector's OTLP/HTTP address, e.g. http://127.0.0.1:4318")]
    Otlp {
        /// The endpoint given, shown redacted (`tally_record::url::redacted`).
        endpoint: String,
        /// Why it cannot be used.
        why: String,
    },
    /// The directory a socket is to be created in does not exist (or is not a
    /// directory); nothing was started and nothing written.
    #[error("{dir}: the directory for the socket {socket} does not exist (or is not a directory); create it (e.g. `install -d -m 0750 {dir}`, or systemd's RuntimeDirectory=) or choose another socket path")]
    SocketDirMissing {
        /// The missing directory.
        dir: PathBuf,
        /// The socket path asked for.
        socket: PathBuf,
    },
    /// A socket mode that is not octal permission bits the daemon's user can use.
    #[error("socket mode {text:?}: {why}")]
    BadSocketMode {
        /// The mode as given.
        text: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A socket group name that the group file does not list.
    #[error(
        "no group named {name:?} in {file}; create it (`groupadd {name}`) or give its numeric gid"
    )]
    UnknownGroup {
        /// The name as given.
        name: String,
        /// The file searched.
        file: PathBuf,
    },
    /// Binding a listener failed.
    #[error("cannot listen on {addr}: {error}")]
    Bind {
        /// The socket path or TCP address.
        addr: String,
        /// The OS error.
        error: io::Error,
    },
    /// A file system operation on the socket failed.
    #[error("{path}: {error}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// The async runtime, or the threads that parse big bodies, could not be started.
    #[error("cannot start the runtime: {0}")]
    Runtime(io::Error),
    /// SIGTERM/SIGINT handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signal(io::Error),
    /// The ledger stopped accepting writes while the daemon ran (every later append got
    /// 503 and nothing unconfirmed was acknowledged). Restart once the cause is fixed.
    #[error("the ledger failed while serving and refused appends from then on: {0}")]
    LedgerFailed(String),
}

impl DaemonError {
    pub(crate) fn io(path: impl Into<PathBuf>, error: io::Error) -> DaemonError {
        DaemonError::Io {
            path: path.into(),
            error,
        }
    }
}

impl From<tally_ledger::Error> for DaemonError {
    fn from(e: tally_ledger::Error) -> DaemonError {
        DaemonError::Ledger(e)
    }
}

/// An HTTP error reply: status and the typed JSON body
/// `{"error": {"code", "message", "field"?, "line"?, "column"?}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub detail: Box<ErrorDetail>,
    pub retry_after_secs: Option<u64>,
    pub close: bool,
}

impl ApiError {
    pub fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            detail: Box::new(ErrorDetail {
                code,
                message: message.into(),
                field: None,
                line: None,
                column: None,
                cause: None,
            }),
            retry_after_secs: None,
            close: false,
        }
    }

    pub fn field(mut self, field: impl Into<String>) -> ApiError {
        self.detail.field = Some(field.into());
        self
    }

    pub fn line(mut self, line: Option<usize>) -> ApiError {
        self.detail.line = line;
        self
    }

    pub fn column(mut self, column: Option<usize>) -> ApiError {
        self.detail.column = column;
        self
    }

    /// Ask hyper to close the connection after the reply (the body was not read whole).
    pub fn close(mut self) -> ApiError {
        self.close = true;
        self
    }

    /// A decision the ledger refused (400), naming the field at fault.
    pub fn decision(e: &DecisionError) -> ApiError {
        let bad = StatusCode::BAD_REQUEST;
        match e {
            DecisionError::Missing { field } => {
                ApiError::new(bad, ErrorCode::MissingField, e.to_string()).field(*field)
            }
            DecisionError::NotAllowed { field, .. } => {
                ApiError::new(bad, ErrorCode::FieldNotAllowed, e.to_string()).field(*field)
            }
            DecisionError::TooLong { field, .. } => {
                ApiError::new(bad, ErrorCode::FieldTooLong, e.to_string()).field(*field)
            }
            DecisionError::Invalid { field, .. } => {
                ApiError::new(bad, ErrorCode::InvalidField, e.to_string()).field(*field)
            }
            DecisionError::Json { .. } => ApiError::new(bad, ErrorCode::InvalidJson, e.to_string()),
            _ => ApiError::new(bad, ErrorCode::InvalidDecision, e.to_string()),
        }
    }

    /// The ledger cannot write: fail closed (503), acknowledge nothing.
    pub fn unavailable(why: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::LedgerUnavailable,
            format!("the ledger cannot write; nothing in this request is acknowledged: {why}"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let reply = ErrorReply {
            error: *self.detail,
        };
        let mut response = (self.status, axum::Json(reply)).into_response();
        let headers = response.headers_mut();
        if let Some(secs) = self.retry_after_secs {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.close {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}
