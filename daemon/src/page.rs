//! The live page (read only) and `/metrics`, on the operator socket and on the optional
//! loopback listener of `serve --metrics-listen`. Plain HTML, CSS and one small script,
//! no build step; the script writes only `textContent` (a run name an agent chose is
//! shown as text, never markup) under a Content-Security-Policy that allows nothing but
//! this page's own script, style and stream.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tally_wire::ErrorCode;

use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::StreamExt;
use serde::Deserialize;

use crate::app::App;
use crate::error::ApiError;

const HTML: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/page.js");
const STYLE: &str = include_str!("page/page.css");

/// The page's policy: its own script, style and stream, nothing else (no inline script,
/// no frames, no forms).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The least time between two snapshots on one stream. A snapshot lists every run the
/// gate holds (about 10 ms with 1,300 runs in the embedded store, part of it under the
/// gate's lock), so a page refreshed five times a second cost a busy gate a few percent
/// of its throughput; once a second is what a person watching can follow.
const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// A snapshot at least this often even when nothing was decided (breakers half-open,
/// minutes roll over).
const MAX_INTERVAL: Duration = Duration::from_secs(2);

/// The read-only routes, added to `routes`.
pub(crate) fn routes(routes: Router<Arc<App>>) -> Router<Arc<App>> {
    routes
        .route("/metrics", get(metrics))
        .route("/live", get(page))
        .route("/live/page.js", get(script))
        .route("/live/page.css", get(style))
        .route("/v1/live", get(snapshot))
        .route("/v1/live/events", get(events))
}

/// The router of `serve --metrics-listen`: the read-only routes only.
pub(crate) fn listener_router(app: Arc<App>) -> Router {
    routes(Router::new())
        .layer(axum::middleware::from_fn(loopback_only))
        .with_state(app)
}

/// On the TCP listener, a browser page of another site, or a name that rebinds to
/// loopback, is refused: the Host must be loopback and an Origin, if sent, this host.
async fn loopback_only(request: Request, next: axum::middleware::Next) -> Response {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    let origin_ok = headers
        .get(header::ORIGIN)
        .is_none_or(|o| o.to_str().ok() == Some(&format!("http://{host}")));
    if !matches!(name, "localhost" | "127.0.0.1" | "::1") || !origin_ok {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorCode::Forbidden,
            "the metrics listener answers loopback hosts and its own page only",
        )
        .close()
        .into_response();
    }
    next.run(request).await
}

fn with_type(body: &'static str, content_type: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

async fn page() -> Response {
    let mut r = with_type(HTML, "text/html; charset=utf-8");
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

async fn script() -> Response {
    with_type(SCRIPT, "text/javascript; charset=utf-8")
}

async fn style() -> Response {
    with_type(STYLE, "text/css; charset=utf-8")
}

async fn metrics(State(app): State<Arc<App>>) -> Result<Response, ApiError> {
    let text = crate::view::metrics_text(&app)
        .await
        .map_err(crate::stage::gate_error)?;
    let mut r = text.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    Ok(r)
}

/// `?page=N`: which page of runs (0-based, 50 a page, nearest to a limit first).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageQuery {
    #[serde(default)]
    page: usize,
}

fn bad_query(e: axum::extract::rejection::QueryRejection) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidQuery,
        format!(
            "{}; the only parameter is `page`, a page number from 0",
            e.body_text()
        ),
    )
}

async fn snapshot(
    State(app): State<Arc<App>>,
    q: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q.map_err(bad_query)?;
    let snap = crate::view::snapshot(&app, q.page)
        .await
        .map_err(crate::stage::gate_error)?;
    Ok(axum::Json(snap).into_response())
}

async fn events(
    State(app): State<Arc<App>>,
    q: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q.map_err(bad_query)?;
    let page = q.page;
    // Held as long as the stream is open.
    let Ok(stream_slot) = Arc::clone(&app.observer.streams).try_acquire_owned() else {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::TooManyStreams,
            format!(
                "{} live event streams are open already, the most this daemon serves; \
                 retry after the Retry-After seconds, or close a page you no longer watch \
                 (GET /v1/live answers one snapshot without a stream)",
                app.observer.max_streams
            ),
        );
        e.retry_after_secs = Some(5);
        return Err(e);
    };
    let changed = app.observer.changed.subscribe();
    let closing = app.observer.closing.subscribe();
    let stream = futures::stream::unfold(
        (app, changed, closing, true, stream_slot),
        move |(app, mut changed, mut closing, first, slot)| async move {
            if *closing.borrow() {
                return None;
            }
            if !first {
                let wait = async {
                    tokio::time::sleep(MIN_INTERVAL).await;
                    // Wait for a decision, or at most MAX_INTERVAL.
                    let _ = tokio::time::timeout(MAX_INTERVAL, changed.changed()).await;
                };
                tokio::select! {
                    () = wait => {}
                    _ = closing.wait_for(|c| *c) => return None,
                }
            }
            changed.borrow_and_update();
            let event = match crate::view::snapshot(&app, page).await {
                Ok(snap) => Event::default()
                    .event("snapshot")
                    .json_data(&snap)
                    .unwrap_or_else(|_| Event::default().event("error").data("encoding")),
                Err(e) => Event::default().event("error").data(e.to_string()),
            };
            let desk = desk_event(&app).await;
            Some((
                futures::stream::iter([Ok::<_, Infallible>(event), Ok(desk)]),
                (app, changed, closing, false, slot),
            ))
        },
    )
    .flatten();
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// The `requests` event: the pending approval requests and the operator socket
/// (`view::Desk`).
async fn desk_event(app: &Arc<App>) -> Event {
    match crate::view::desk(app).await {
        Ok(desk) => Event::default()
            .event("requests")
            .json_data(&desk)
            .unwrap_or_else(|_| Event::default().event("error").data("encoding")),
        Err(e) => Event::default().event("error").data(e.to_string()),
    }
}
