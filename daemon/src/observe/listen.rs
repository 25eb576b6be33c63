//! The listener of `serve --metrics-listen`: loopback TCP, so any local process can reach
//! it. Everything it may hold is bounded apart from the agent and operator sockets, so a
//! flood here never takes a connection, a thread or a decision from the gate:
//!
//! * at most [`ViewLimits::max_connections`] connections are served at once; one more is
//!   answered `503 too_many_connections` with `Retry-After` and closed (and when
//!   [`MAX_REFUSING`] are being refused already, it is closed at once);
//! * the request line and headers must arrive within the read timeout (slowloris), and
//!   are at most [`MAX_HEAD_BYTES`]; a request with a body is refused (`413`, closed):
//!   every route here is a `GET`;
//! * a write that makes no progress for the write timeout ends the connection (a client
//!   that holds an event stream open and reads nothing);
//! * event streams, here and on the operator socket, are counted by the observer
//!   ([`super::Observer::streams`]): one past the limit is `503 too_many_streams`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tally_wire::ErrorCode;

use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::TokioTimer;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::error::ApiError;
use crate::peers::WriteDeadline;

/// Connections being told they are over the limit at once; more are just closed.
pub(crate) const MAX_REFUSING: usize = 16;

/// The most bytes of a request line and headers (hyper's read buffer; over it hyper
/// answers `431` and closes).
pub(crate) const MAX_HEAD_BYTES: usize = 16 * 1024;

/// What the listener of `serve --metrics-listen` may hold.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ViewLimits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Headers must arrive within it; idle keep-alive connections close after it.
    pub read_timeout: Duration,
    /// A write blocked this long ends the connection.
    pub write_timeout: Duration,
}

/// Serve `router` on `listener` within `limits` until `stop` resolves; then stop
/// accepting and let each connection finish (its event stream ends with the daemon).
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ViewLimits,
    stop: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let mut tasks = JoinSet::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    let mut refuse = http1::Builder::new();
    refuse
        .timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout.min(Duration::from_secs(2)))
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(false);
    let router = router.layer(axum::middleware::from_fn(no_body));
    let refusal = too_many_connections(limits.max_connections);
    tally_proxy::accept::until(&listener, stop, |stream, peer| {
        while tasks.try_join_next().is_some() {}
        let io = WriteDeadline::new(stream, limits.write_timeout);
        match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => crate::server::serve_connection(
                &builder, &graceful, &mut tasks, &router, io, peer, slot,
            ),
            Err(_) => {
                let Ok(r) = Arc::clone(&refusing).try_acquire_owned() else {
                    // Dropped: closed at once.
                    return;
                };
                crate::server::serve_connection(
                    &refuse, &graceful, &mut tasks, &refusal, io, peer, r,
                );
            }
        }
    })
    .await;
    drop(listener);
    // Each connection finishes the request it is in (streams end as the daemon closes);
    // a client that does not let go is cut after a second.
    let _ = tokio::time::timeout(Duration::from_secs(1), graceful.shutdown()).await;
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
}

/// Every route here is a `GET` without a body: a request that announces one is refused
/// and its connection closed (nothing reads it, so nothing buffers it).
async fn no_body(request: Request, next: axum::middleware::Next) -> Response {
    let h = request.headers();
    let length = h
        .get(header::CONTENT_LENGTH)
        .map(|v| v.as_bytes() != b"0")
        .unwrap_or(false);
    if length || h.contains_key(header::TRANSFER_ENCODING) {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::BodyNotAllowed,
            "the metrics listener serves GET requests only, without a body",
        )
        .close()
        .into_response();
    }
    next.run(request).await
}

/// A router that answers anything with `503 too_many_connections` and closes.
fn too_many_connections(max: usize) -> Router {
    let message = format!(
        "the metrics listener serves {max} connections at once and all are taken; retry \
         after the Retry-After seconds, and close connections to it you no longer read"
    );
    Router::new().fallback(move || {
        let message = message.clone();
        async move {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::TooManyConnections,
                message,
            )
            .close();
            e.retry_after_secs = Some(1);
            e
        }
    })
}
