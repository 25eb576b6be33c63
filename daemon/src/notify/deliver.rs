//! Delivery to one receiver: its queue drained in order, each body POSTed with a fresh
//! `Tally-Signature`, retried with exponential back-off up to a cap, then given up
//! (counted). Nothing here is on the gate's path: a dead receiver only fills its queue.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use tokio::sync::watch;

use super::hub::{Receiver, Shared};

/// The longest one attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "tally-signature";

/// Drain `receiver`'s queue until `stop` says stop.
pub(crate) async fn drain(
    shared: Arc<Shared>,
    receiver: Arc<Receiver>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let body = tokio::select! {
            b = receiver.queue.pop(&shared.counters) => b,
            _ = stop.wait_for(|s| *s) => return,
        };
        if !deliver(&shared, &receiver, body, &mut stop).await {
            return;
        }
    }
}

/// One body, attempted until delivered or given up. False when stopped meanwhile.
async fn deliver(
    shared: &Shared,
    receiver: &Receiver,
    body: Bytes,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let o = &shared.options;
    let mut wait = o.retry_base;
    for attempt in 1..=o.attempts.max(1) {
        let sent = tokio::select! {
            r = post(shared, receiver, body.clone()) => r,
            _ = stop.wait_for(|s| *s) => return false,
        };
        if sent.is_ok() {
            shared.counters.delivered.inc();
            return true;
        }
        shared.counters.failed.inc();
        if attempt >= o.attempts {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return false,
        }
        wait = (wait * 2).min(o.retry_cap);
    }
    shared.counters.drop_one("gave_up");
    true
}

/// One POST; `Ok` on a 2xx answer.
async fn post(shared: &Shared, receiver: &Receiver, body: Bytes) -> Result<(), String> {
    let t = shared.clock.now_ms() / 1000;
    let signature = shared.secret.sign(t, &body);
    let req = axum::http::Request::post(receiver.url.clone())
        .header(axum::http::header::CONTENT_TYPE, "application/json")
        .header(axum::http::header::USER_AGENT, "tally-notify")
        .header(SIGNATURE_HEADER, signature)
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let res = tokio::time::timeout(ATTEMPT_TIMEOUT, shared.client.request(req))
        .await
        .map_err(|_| "timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    if res.status().is_success() {
        Ok(())
    } else {
        Err(format!("answered {}", res.status()))
    }
}
