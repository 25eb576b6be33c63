//! What every handler of both sockets shares: the daemon's state ([`App`]), which socket
//! a router serves ([`Role`]), and reading a request body within its limits.

use std::sync::Arc;
use std::time::Duration;
use tally_wire::ErrorCode;

use axum::body::Body;
use axum::http::{header, HeaderMap, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tally_ledger::Ledger;
use tokio::sync::Semaphore;

use crate::bulk::BulkParsers;
use crate::commit::LedgerState;
use crate::error::ApiError;
use crate::limit::RateLimit;
use tally_gate::GateError;

/// Exports stream at most this many at once; more wait their turn.
pub(crate) const MAX_EXPORTS: usize = 2;
/// Export bytes are sent in chunks of about this size.
pub(crate) const EXPORT_CHUNK: usize = 64 * 1024;

/// Shared state of all handlers.
pub(crate) struct App {
    pub ledger: Arc<Ledger>,
    pub state: Arc<LedgerState>,
    pub gate: Arc<dyn tally_gate::Gatekeeper>,
    /// The thread the gate's decisions are made on.
    /// Metrics, the decision log and the live page's state.
    pub observer: Arc<crate::observe::Observer>,
    pub stage: crate::stage::Stage,
    pub in_flight: Arc<Semaphore>,
    pub max_in_flight: usize,
    pub exports: Arc<Semaphore>,
    /// Bodies over [`INLINE_PARSE_BYTES`] parsed at once: parsing expands JSON several
    /// times over in memory, so this bounds the daemon's peak.
    pub big_parses: Arc<Semaphore>,
    /// The threads that parse them, one per permit.
    pub bulk: BulkParsers,
    pub rate: Option<RateLimit>,
    pub max_body_bytes: usize,
    pub max_batch: usize,
    pub read_timeout: Duration,
    /// With the proxy on: the key that mints each started run's token.
    pub token_key: Option<Arc<tally_proxy::TokenKey>>,
    /// With the proxy on: the keys a proxied call may present (docs/KEYS.md).
    pub keys: Option<Arc<tally_proxy::KeyRing>>,
    /// Where the operator's views read the runs and breakers (never the decision thread).
    pub reader: crate::observe::reader::Reader,
}

/// What [`App::new`] needs from the options.
pub(crate) struct Limits {
    pub max_body_bytes: usize,
    pub max_in_flight: usize,
    pub max_batch: usize,
    pub rate_per_sec: Option<u32>,
    /// The clock the rate limit refills by.
    pub clock: Arc<dyn tally_ledger::clock::Clock>,
    pub read_timeout: Duration,
    /// The run token key (the proxy is on).
    pub token_key: Option<Arc<tally_proxy::TokenKey>>,
    /// The keys (the proxy is on).
    pub keys: Option<Arc<tally_proxy::KeyRing>>,
    /// A networked state backend's bound: a gate call that waited longer than this for
    /// the decision thread is refused as unavailable without being made.
    pub queue_bound: Option<Duration>,
}

/// Bodies larger than this are parsed and validated on a parse thread ([`BulkParsers`]),
/// so one big batch does not stall the connections sharing its async worker.
pub(crate) const INLINE_PARSE_BYTES: usize = 32 * 1024;

/// Big bodies parsed at once, each on a parse thread of its own.
const MAX_BIG_PARSES: usize = 4;

impl App {
    pub fn new(
        ledger: Arc<Ledger>,
        state: Arc<LedgerState>,
        gate: Arc<dyn tally_gate::Gatekeeper>,
        limits: Limits,
        observer: Arc<crate::observe::Observer>,
    ) -> std::io::Result<App> {
        let max_in_flight = limits.max_in_flight.max(1);
        let reader = crate::observe::reader::Reader::start(&gate)?;
        Ok(App {
            reader,
            ledger,
            state,
            gate,
            observer,
            stage: crate::stage::Stage::start(limits.queue_bound)?,
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            exports: Arc::new(Semaphore::new(MAX_EXPORTS)),
            big_parses: Arc::new(Semaphore::new(MAX_BIG_PARSES)),
            bulk: BulkParsers::start(MAX_BIG_PARSES)?,
            rate: limits
                .rate_per_sec
                .map(|r| RateLimit::new(r, Arc::clone(&limits.clock))),
            max_body_bytes: limits.max_body_bytes,
            max_batch: limits.max_batch.max(1),
            read_timeout: limits.read_timeout,
            token_key: limits.token_key,
            keys: limits.keys,
        })
    }
}

/// Which socket a router serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Agents: the gate's API (start, check, outcome, stop, where a run stands).
    Agent,
    /// The operator: raw decisions, pause, resume, kill, approvals, export.
    Operator,
}

fn too_large(max: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::BodyTooLarge,
        format!("request body is over {max} bytes; split the batch"),
    )
    .close()
}

/// Read the whole body within the read timeout and the size limit.
pub(crate) async fn read_body(
    app: &App,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > app.max_body_bytes as u64) {
        return Err(too_large(app.max_body_bytes));
    }
    let limited = Limited::new(body, app.max_body_bytes);
    match tokio::time::timeout(app.read_timeout, limited.collect()).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            ErrorCode::RequestTimeout,
            format!(
                "request body did not arrive within {}",
                tally_ledger::words::duration(app.read_timeout.as_millis() as u64)
            ),
        )
        .close()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(too_large(app.max_body_bytes))
        }
        Ok(Err(e)) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::BodyReadFailed,
            format!("reading the request body failed: {e}"),
        )
        .close()),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

impl App {
    /// A gate call that answers at once: here on the worker for the embedded store (a lock
    /// and memory), on the decision thread for a networked backend, which blocks for its
    /// round trips and must not do so on an async worker.
    pub(crate) async fn at_once<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, GateError> + Send + 'static,
    ) -> Result<T, GateError> {
        if self.gate.networked() {
            crate::stage::answered(&self.stage, move |done| done(f())).await
        } else {
            f()
        }
    }
}
