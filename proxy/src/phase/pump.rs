//! The pump phase: the upstream's answer passed to the agent (its status and headers
//! less hop-by-hop, plus `x-tally-run`, `x-tally-attempt`, `x-tally-seq`), its body
//! relayed chunk by chunk on a task of its own ([`relay`]) while its usage and BLAKE3
//! digest are read from it (JSON or SSE); when it has ended, what it cost ([`bill`])
//! is settled, and then the end of the answer released.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue};
use hyper::Response;
use tally_record::money::parse_usd;

use super::settle::{Settle, Settling};
use crate::endpoint::Endpoint;
use crate::Body;

mod bill;
mod relay;

use bill::Answer;
use relay::Relay;

/// The answer to the agent, its body relayed by a task that settles when it has ended;
/// with `strip_usage`, an SSE stream is reframed without the usage chunk the client
/// did not ask for. With `withheld` (an upstream whose URL is secret), an error answer
/// is read and settled as any other but the agent gets, in its place, the dialect's
/// own error with the upstream's status alone ([`withheld_error`]).
pub(super) fn pump(
    response: Response<Incoming>,
    (strip_usage, withheld): (bool, bool),
    settling: Settling,
) -> Response<Body> {
    let (parts, body) = response.into_parts();
    let content_type = parts
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::trim_start);
    let sse = content_type.is_some_and(|v| v.starts_with("text/event-stream"));
    let reframe = sse && strip_usage;
    let facts = settling.facts();
    let framed = framed(facts.endpoint, content_type);
    let headers = passed_back(&parts.headers, reframe, facts);
    let answer = Answer {
        status: parts.status,
        header_cost: facts
            .cost_header
            .as_ref()
            .and_then(|h| parts.headers.get(h.as_str()))
            .map(|v| v.to_str().ok().and_then(|t| parse_usd(t.trim()).ok())),
        retry_after_ms: parts
            .headers
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|s| s.saturating_mul(1000)),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(16);
    let broken = Arc::new(AtomicBool::new(false));
    let stream = body_of(rx, Arc::clone(&broken));
    let mut relay = Relay::new(facts.endpoint, sse, reframe, tx, broken, settling.deadline);
    if framed {
        relay = relay.framed();
    }
    let kind = facts.kind;
    let status = parts.status;
    let retry_after_ms = answer.retry_after_ms;
    let said = (withheld && !status.is_success())
        .then(|| withheld_error(kind, status, retry_after_ms, facts));
    tokio::spawn(relayed(body, relay, answer, settling));
    match said {
        Some(said) => {
            let (said_parts, said_body) = said.into_parts();
            let body = after(stream, said_body);
            Response::from_parts(said_parts, BodyExt::boxed(StreamBody::new(body)))
        }
        None => {
            let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
            *r.status_mut() = status;
            *r.headers_mut() = headers;
            r
        }
    }
}

/// What the agent gets for an error answer of an upstream whose URL is secret: the
/// dialect's own error, with the upstream's status and the call's `x-tally-` headers,
/// none of the upstream's headers or body (an error page may echo the URL's path), and
/// no `x-should-retry`: the client retries as it would the upstream's own status. The
/// upstream's `Retry-After` (read as a number of seconds, so it cannot carry the path) is
/// passed on, so that a rate-limited client waits as long as the upstream asked.
fn withheld_error(
    kind: tally_policy::UpstreamKind,
    status: hyper::StatusCode,
    retry_after_ms: Option<u64>,
    facts: &Settle,
) -> Response<Body> {
    let mut refusal = crate::dialect::Refusal::own(
        status,
        tally_wire::ErrorCode::UpstreamError,
        format!(
            "the upstream answered {status}; its answer is not passed back (the upstream's URL is secret, given by url_file)"
        ),
    );
    refusal.retry_after_ms = retry_after_ms;
    let said = refusal.response(kind);
    let (mut parts, body) = said.into_parts();
    parts.status = status;
    // The client retries by the status alone, as it would the upstream's own answer.
    parts.headers.remove("x-should-retry");
    let ours = passed_back(&HeaderMap::new(), false, facts);
    for (name, value) in &ours {
        parts.headers.insert(name.clone(), value.clone());
    }
    Response::from_parts(parts, body)
}

/// The frames of `relayed` dropped (read to their end, so the relay runs as for any
/// answer), then `said`'s; an error in its place where the relayed answer was cut.
fn after(
    relayed: impl futures::Stream<Item = Result<Frame<Bytes>, std::io::Error>> + Send + 'static,
    said: Body,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, std::io::Error>> {
    use futures::StreamExt;
    let relayed = relayed.filter_map(|item| async move { item.err().map(Err) });
    let said = futures::stream::unfold(Some(said), |state| async move {
        let mut said = state?;
        let frame = said.frame().await?;
        Some((frame, Some(said)))
    });
    relayed.chain(said)
}

/// Whether an answer is read as AWS event-stream frames: only Bedrock's ConverseStream
/// answering in them. Any other endpoint's answer in that content type (an `http`
/// route priced per call, say, in front of Bedrock's invoke-with-response-stream) is
/// passed through as its route prices it, never cut by a reader its dialect lacks.
fn framed(endpoint: Endpoint, content_type: Option<&str>) -> bool {
    endpoint == Endpoint::ConverseStream
        && content_type.is_some_and(|v| v.starts_with("application/vnd.amazon.eventstream"))
}

/// How long the end of an answer waits for its outcome to be sequenced: the decision
/// thread answers in well under a millisecond, so only a stuck gate (a stalled disk
/// under a synchronous write) reaches it. Past it the agent's answer ends with an error
/// (it is not told the call completed) and the outcome is recorded when the gate can.
const SEQUENCE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the agent's answer body is read from.
type Receiver = tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>;

/// The agent's answer body: the frames the relay sends, then, if the relay marked the
/// answer `broken` (not whole), an error, so that it never ends as if complete.
fn body_of(
    rx: Receiver,
    broken: Arc<AtomicBool>,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, std::io::Error>> {
    futures::stream::unfold(Some((rx, broken)), |state| async move {
        let (mut rx, broken) = state?;
        match rx.recv().await {
            Some(item) => Some((item, Some((rx, broken)))),
            None if broken.load(Ordering::SeqCst) => Some((
                Err(std::io::Error::other("the upstream answer was cut")),
                None,
            )),
            None => None,
        }
    })
}

/// The body relayed to its end (or the deadline), then what it cost settled, and only
/// then the end of the answer released: once the agent has it, any later decision, on
/// any socket, decides on state that includes the outcome. A gate that does not
/// sequence it within [`SEQUENCE_WAIT`] gets it later, and the answer is cut.
async fn relayed(mut body: Incoming, mut relay: Relay, answer: Answer, settling: Settling) {
    let end = relay.run(&mut body).await;
    let facts = settling.facts();
    let ended = match end {
        Err(cut) => bill::cut(facts, &answer, cut, relay.digest()),
        Ok(()) => {
            relay.last_events().await;
            let (reported, said) = relay.reported(answer.status, facts.kind);
            bill::answered(facts, &answer, reported, said, relay.digest())
        }
    };
    let mut settling = settling;
    settling.ended(ended);
    let mut settled = Box::pin(settling.settle());
    if tokio::time::timeout(SEQUENCE_WAIT, &mut settled)
        .await
        .is_err()
    {
        tokio::spawn(settled);
        return relay.cut().await;
    }
    match end {
        Err(_) => relay.cut().await,
        Ok(()) => relay.finish().await,
    }
}

/// The upstream's headers passed back, less hop-by-hop (and a reframed stream's
/// length), plus the call's own.
fn passed_back(upstream: &HeaderMap, reframe: bool, facts: &Settle) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in upstream {
        let n = name.as_str();
        if matches!(
            n,
            "connection"
                | "keep-alive"
                | "transfer-encoding"
                | "te"
                | "trailer"
                | "upgrade"
                | "proxy-authenticate"
        ) || (reframe && n == "content-length")
            || n.starts_with("x-tally-")
        {
            continue;
        }
        headers.append(name.clone(), value.clone());
    }
    let mut add = |name: &'static str, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    };
    add("x-tally-run", facts.run.clone());
    add("x-tally-attempt", facts.attempt.to_string());
    if let Some(seq) = facts.seq {
        add("x-tally-seq", seq.to_string());
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_converse_stream_is_read_as_frames() {
        let frames = Some("application/vnd.amazon.eventstream");
        assert!(framed(Endpoint::ConverseStream, frames));
        // An `http` route (Bedrock's invoke-with-response-stream, priced per call) in
        // the same content type passes through; so does any other dialect's.
        assert!(!framed(Endpoint::Route, frames));
        assert!(!framed(Endpoint::Converse, frames));
        assert!(!framed(Endpoint::ChatCompletions, frames));
        assert!(!framed(Endpoint::ConverseStream, Some("application/json")));
        assert!(!framed(Endpoint::ConverseStream, None));
    }

    /// A url_file upstream's error answer withheld: the agent gets the upstream's status
    /// and its `Retry-After` (a number, never its text), and no `x-should-retry`.
    #[test]
    fn a_withheld_error_keeps_the_upstreams_status_and_retry_after() {
        let facts = crate::phase::settle::tests::facts(tally_record::Effect::Read);
        let kind = tally_policy::UpstreamKind::Openai;
        let waited = |status: u16, after: Option<u64>| {
            let status = hyper::StatusCode::from_u16(status).unwrap();
            let r = withheld_error(kind, status, after, &facts);
            assert_eq!(r.status(), status);
            assert!(r.headers().get("x-should-retry").is_none());
            r.headers()
                .get(hyper::header::RETRY_AFTER)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        assert_eq!(waited(429, Some(30_000)).as_deref(), Some("30"));
        assert_eq!(waited(503, Some(1_500)).as_deref(), Some("2"));
        assert_eq!(waited(503, None), None);
        assert_eq!(waited(404, None), None);
    }
}
