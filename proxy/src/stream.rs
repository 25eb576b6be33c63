//! The upstream's answer, passed to the agent chunk by chunk while its usage and digest
//! are read from it; then the gate's outcome settles the truth.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use eventsource_stream::EventStream;
use futures::FutureExt;
use futures::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Response, StatusCode};
use tally_gate::{Caller, Gatekeeper, OutcomeRequest};
use tally_policy::{ModelPrice, UpstreamKind};
use tally_record::money::{parse_usd, Nanos};
use tally_record::{Effect, Status, UsageRefused};

use crate::proxy::Stage;
use crate::trace::CallSpan;
use crate::usage::{Keep, Reported, StreamUsage};
use crate::Body;

/// The most of a plain (not streamed) answer kept to read its usage: 16 MiB. A longer
/// answer passes through whole, and settles as `unknown` (its reservation held). Also the
/// largest event of a stream: one larger is cut, an `error` settled at its reservation.
const MAX_KEPT: usize = 16 * 1024 * 1024;

/// What settling an attempt needs.
#[derive(Clone)]
pub(crate) struct Settle {
    pub run: String,
    pub attempt: u64,
    pub seq: Option<u64>,
    pub caller: Caller,
    pub effect: Effect,
    pub kind: UpstreamKind,
    pub endpoint: crate::request::Endpoint,
    pub price: Option<ModelPrice>,
    pub route_price: Option<Nanos>,
    /// The billing tiers the call can land on.
    pub lands: crate::tier::Lands,
    pub cost_header: Option<String>,
    /// What the gate reserved for the call: the worst case it can cost.
    pub reserved: Nanos,
}

/// The gate, as a spawned task reaches it.
#[derive(Clone)]
pub(crate) struct Shared {
    pub gate: Arc<dyn Gatekeeper>,
    pub stage: Stage,
}

/// One allowed attempt's answer.
pub(crate) struct Pump {
    shared: Shared,
    settle: Settle,
    deadline: Instant,
    /// The call's span, ended with its outcome.
    span: Option<CallSpan>,
}

/// How an answer ended.
struct Ended {
    status: Status,
    nanos: Option<u64>,
    retry_after_ms: Option<u64>,
    digest: Option<String>,
    observed: Option<String>,
    usage_refused: Option<UsageRefused>,
    /// What the upstream reported, as recorded on the outcome.
    usage: Option<tally_record::Usage>,
}

/// What a complete answer says the call cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Billed {
    /// What the upstream's report costs at the policy's prices: the truth, settled whole.
    Cost(Nanos),
    /// No report (nothing to settle from: the reservation stays held).
    Missing,
    /// A report tally does not believe or cannot price.
    Refused(UsageRefused),
}

impl Pump {
    pub fn new(shared: Shared, settle: Settle, deadline: Instant, span: Option<CallSpan>) -> Pump {
        Pump {
            shared,
            settle,
            deadline,
            span,
        }
    }

    /// Settles with no answer body: a timeout, an unreachable upstream, a refused
    /// redirect.
    pub async fn settle_now(self, status: Status, observed: Option<String>) {
        let status = tally_policy::recorded_status(status, self.settle.effect);
        let nanos = tally_policy::is_rejection(status).then_some(0);
        outcome(
            &self.shared,
            &self.settle,
            Ended {
                status,
                nanos,
                retry_after_ms: None,
                digest: None,
                observed,
                usage_refused: None,
                usage: None,
            },
        )
        .await;
        if let Some(span) = self.span {
            span.end(status.as_str(), None, None);
        }
    }

    /// The answer to the agent: the upstream's status and headers (less hop-by-hop,
    /// plus `x-tally-run`, `x-tally-attempt`, `x-tally-seq`), its body streamed through.
    pub fn answer(
        self,
        response: Response<Incoming>,
        _client_asked_usage: bool,
        strip_usage: bool,
    ) -> Response<Body> {
        let (parts, body) = response.into_parts();
        let status = parts.status;
        let sse = parts
            .headers
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        let reframe = sse && strip_usage;
        let mut headers = HeaderMap::new();
        for (name, value) in &parts.headers {
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
        add("x-tally-run", self.settle.run.clone());
        add("x-tally-attempt", self.settle.attempt.to_string());
        if let Some(seq) = self.settle.seq {
            add("x-tally-seq", seq.to_string());
        }
        let header_cost = self
            .settle
            .cost_header
            .as_ref()
            .and_then(|h| parts.headers.get(h.as_str()))
            .map(|v| v.to_str().ok().and_then(|t| parse_usd(t.trim()).ok()));
        let retry_after_ms = parts
            .headers
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|s| s.saturating_mul(1000));
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(16);
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        tokio::spawn(self.pump(body, tx, status, sse, reframe, header_cost, retry_after_ms));
        let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
        *r.status_mut() = status;
        *r.headers_mut() = headers;
        r
    }

    #[allow(clippy::too_many_arguments)]
    async fn pump(
        mut self,
        mut body: Incoming,
        tx: tokio::sync::mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>,
        status: StatusCode,
        sse: bool,
        reframe: bool,
        header_cost: Option<Option<Nanos>>,
        retry_after_ms: Option<u64>,
    ) {
        let kind = self.settle.kind;
        let mut hasher = blake3::Hasher::new();
        let mut kept: Vec<u8> = Vec::new();
        let mut overflow = false;
        let mut usage = StreamUsage::new(self.settle.endpoint);
        let (feed, fed) =
            futures::channel::mpsc::unbounded::<Result<Bytes, std::convert::Infallible>>();
        let mut events = EventStream::new(fed);
        let mut client = Some(tx);
        let deadline = tokio::time::Instant::from_std(self.deadline);
        let mut used = None;
        // Bytes of the stream read since its last whole event.
        let mut pending = 0usize;
        // Chunks read since the last line end, not yet fed to the parser.
        let mut unfed: Vec<Bytes> = Vec::new();
        let end: Result<(), Status> = loop {
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Err(_) => break Err(Status::Timeout),
                Ok(None) => break Ok(()),
                Ok(Some(Err(_))) => break Err(Status::Unknown),
                Ok(Some(Ok(f))) => f,
            };
            let Ok(chunk) = frame.into_data() else {
                continue;
            };
            hasher.update(&chunk);
            let mut out = Vec::new();
            if sse {
                pending = pending.saturating_add(chunk.len());
                // The parser reads a line again from its start each time it is fed, so
                // bytes that end no line wait here until one does: a long line costs
                // its length once, not its length per chunk.
                if !chunk.iter().any(|&b| b == b'\n' || b == b'\r') {
                    if pending > MAX_KEPT {
                        break Err(Status::Error);
                    }
                    unfed.push(chunk.clone());
                } else {
                    for b in unfed.drain(..) {
                        let _ = feed.unbounded_send(Ok(b));
                    }
                    let _ = feed.unbounded_send(Ok(chunk.clone()));
                }
                while let Some(Some(Ok(ev))) = events.next().now_or_never() {
                    pending = 0;
                    let keep = usage.event(&ev.data);
                    if reframe && keep == Keep::Pass {
                        out.push(reframed(&ev));
                    }
                }
                // One event past the bound: a stream no API sends, never buffered on.
                if pending > MAX_KEPT {
                    break Err(Status::Error);
                }
            } else if !overflow {
                if kept.len() + chunk.len() > MAX_KEPT {
                    overflow = true;
                    kept = Vec::new();
                } else {
                    kept.extend_from_slice(&chunk);
                }
            }
            let forwarded: Vec<Bytes> = if reframe { out } else { vec![chunk] };
            if let Some(c) = &client {
                for b in forwarded {
                    if b.is_empty() {
                        continue;
                    }
                    // A client that went away stops receiving; the upstream is still
                    // read to its end (or the deadline) to settle what it cost.
                    let sent = tokio::time::timeout_at(deadline, c.send(Ok(Frame::data(b)))).await;
                    if !matches!(sent, Ok(Ok(()))) {
                        client = None;
                        break;
                    }
                }
            }
        };
        let digest = Some(hasher.finalize().to_hex().to_string());
        let ended = match end {
            Err(cut) => {
                if let Some(c) = client.take() {
                    let _ = c
                        .send(Err(std::io::Error::other("the upstream answer was cut")))
                        .await;
                }
                Ended {
                    status: tally_policy::recorded_status(cut, self.settle.effect),
                    // An event past the bound (`error`): final, so settled at the most the
                    // gate allowed, never at nothing. A cut or a timeout stays held.
                    nanos: tally_policy::is_final(cut).then_some(self.settle.reserved.0),
                    retry_after_ms: None,
                    digest,
                    observed: None,
                    usage_refused: None,
                    usage: None,
                }
            }
            Ok(()) => {
                if sse {
                    // A last event with no blank line after it is still an event.
                    for b in unfed.drain(..) {
                        let _ = feed.unbounded_send(Ok(b));
                    }
                    drop(feed);
                    while let Some(Some(Ok(ev))) = events.next().now_or_never() {
                        let keep = usage.event(&ev.data);
                        if let (true, Keep::Pass, Some(c)) = (reframe, keep, &client) {
                            let _ = tokio::time::timeout_at(
                                deadline,
                                c.send(Ok(Frame::data(reframed(&ev)))),
                            )
                            .await;
                        }
                    }
                }
                drop(client);
                let (reported, said) = if !status.is_success() || kind == UpstreamKind::Http {
                    (Reported::Missing, None)
                } else if sse {
                    (usage.reported(), usage.tier().map(str::to_owned))
                } else if overflow {
                    (Reported::Missing, None)
                } else {
                    crate::usage::answer(self.settle.endpoint, &kept)
                };
                let reported = reported.within(self.settle.price.as_ref());
                // The rates of the tier the answer says served it.
                let at_tier = self.settle.price.as_ref().and_then(|p| {
                    crate::tier::settled(p, kind, &self.settle.lands, said.as_deref())
                });
                used = reported.clone().usage();
                let billed = if !status.is_success() {
                    Billed::Missing
                } else if kind == UpstreamKind::Http {
                    match header_cost.unwrap_or(self.settle.route_price) {
                        Some(c) => Billed::Cost(c),
                        None => Billed::Missing,
                    }
                } else {
                    billed(&reported, self.settle.price.as_ref(), at_tier.as_ref())
                };
                let mut ended =
                    classify(status, billed, self.settle.reserved, retry_after_ms, digest);
                if status.is_success() {
                    ended.usage = used.as_ref().and_then(crate::usage::Usage::recorded);
                }
                ended
            }
        };
        let recorded = ended.status;
        outcome(&self.shared, &self.settle, ended).await;
        if let Some(span) = self.span.take() {
            span.end(recorded.as_str(), Some(status.as_u16()), used);
        }
    }
}

/// An event as the client would have received it.
fn reframed(ev: &eventsource_stream::Event) -> Bytes {
    let mut s = String::new();
    if !ev.event.is_empty() && ev.event != "message" {
        s.push_str(&format!("event: {}\n", ev.event));
    }
    if !ev.id.is_empty() {
        s.push_str(&format!("id: {}\n", ev.id));
    }
    for line in ev.data.split('\n') {
        s.push_str("data: ");
        s.push_str(line);
        s.push('\n');
    }
    s.push('\n');
    Bytes::from(s)
}

/// What a model call's reported usage comes to at its price (`price`, at the rates of
/// the tier the answer says served it: `at_tier`, none if that tier has no price): the
/// cost, nothing to settle from, or a report tally does not believe (`implausible`: it
/// cannot be true, or costs more than a `u64` of nanodollars) or cannot price
/// (`unpriced`: a class of usage or a tier with no price).
fn billed(reported: &Reported, price: Option<&ModelPrice>, at_tier: Option<&ModelPrice>) -> Billed {
    match (reported, price.and(Some(at_tier))) {
        (Reported::Implausible(_), _) => Billed::Refused(UsageRefused::Implausible),
        (Reported::Usage(_), Some(None)) => Billed::Refused(UsageRefused::Unpriced),
        (Reported::Usage(u), Some(Some(p))) if u.unpriced(p) => {
            Billed::Refused(UsageRefused::Unpriced)
        }
        (Reported::Usage(u), Some(Some(p))) => match u.cost(p) {
            Some(c) => Billed::Cost(c),
            None => Billed::Refused(UsageRefused::Implausible),
        },
        _ => Billed::Missing,
    }
}

/// The outcome of a complete answer: 2xx `ok`, settled at what the upstream reported,
/// **whatever the reservation was** (the upstream is the authority on what a call cost:
/// an excess is an overrun the gate records, never a number clipped away); 2xx with no
/// report `unknown` (the reservation held); 2xx with a report tally does not believe
/// (`usage_refused`) `error`, settled at the reservation. 429 and 503 with Retry-After
/// `rejected` with it; other 4xx `rejected`; 3xx `rejected`; 5xx `error`. Nothing is
/// charged for an answer that is not a success.
fn classify(
    status: StatusCode,
    billed: Billed,
    reserved: Nanos,
    retry_after_ms: Option<u64>,
    digest: Option<String>,
) -> Ended {
    let mut usage_refused = None;
    let (st, nanos, retry) = if status.is_success() {
        match billed {
            Billed::Cost(c) => (Status::Ok, Some(c.0), None),
            Billed::Missing => (Status::Unknown, None, None),
            Billed::Refused(why) => {
                usage_refused = Some(why);
                (Status::Error, Some(reserved.0), None)
            }
        }
    } else if (status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE)
        && retry_after_ms.is_some()
    {
        (Status::Rejected, Some(0), retry_after_ms)
    } else if status.is_server_error() {
        (Status::Error, Some(0), None)
    } else {
        (Status::Rejected, Some(0), None)
    };
    Ended {
        status: st,
        nanos,
        retry_after_ms: retry,
        digest,
        observed: None,
        usage_refused,
        usage: None,
    }
}

async fn outcome(shared: &Shared, s: &Settle, e: Ended) {
    let req = OutcomeRequest {
        run: s.run.clone(),
        attempt: s.attempt,
        status: e.status,
        settled_cents: None,
        settled_nanos: e.nanos,
        remote_ref: None,
        observed: e.observed,
        retry_after_ms: e.retry_after_ms,
        result_digest: e.digest,
        worker: None,
        usage_refused: e.usage_refused,
        usage: e.usage,
    };
    let caller = s.caller;
    let r = crate::proxy::call(&shared.gate, &shared.stage, move |gate, done| {
        gate.outcome(caller, req, done)
    })
    .await;
    if let Err(e) = r {
        eprintln!(
            "tally serve: proxy: the outcome of run {} attempt {} could not be recorded (its reservation stays held): {e}",
            s.run, s.attempt
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::Usage;

    fn price() -> ModelPrice {
        ModelPrice {
            max_output_tokens: 100,
            context_tokens: 1000,
            ..ModelPrice::new(Nanos(1_000_000_000), Nanos(2_000_000_000))
        }
    }

    fn settle(reported: Reported, reserved: u64) -> Ended {
        let b = billed(
            &reported.within(Some(&price())),
            Some(&price()),
            Some(&price()),
        );
        classify(StatusCode::OK, b, Nanos(reserved), None, None)
    }

    /// The bill settles whole, above the reservation too; usage that cannot be true or
    /// cannot be priced is an error at the reservation, with why; no usage is held.
    #[test]
    fn the_bill_settles_whole_and_only_what_cannot_be_true_is_refused() {
        let u = |input, output| Usage {
            input,
            output,
            ..Usage::default()
        };
        // 100 in at $1/M, 50 out at $2/M: 200,000 nanodollars, past a 1,000 reservation.
        let e = settle(Reported::Usage(u(100, 50)), 1_000);
        assert_eq!(
            (e.status, e.nanos, e.usage_refused),
            (Status::Ok, Some(200_000), None)
        );
        // Past the model's context plus its output limit: cannot be true.
        let e = settle(Reported::Usage(u(1000, 101)), 1_000);
        assert_eq!(
            (e.status, e.nanos, e.usage_refused),
            (Status::Error, Some(1_000), Some(UsageRefused::Implausible))
        );
        let e = settle(Reported::Implausible("negative".into()), 7);
        assert_eq!(
            (e.status, e.nanos, e.usage_refused),
            (Status::Error, Some(7), Some(UsageRefused::Implausible))
        );
        // Cache writes with no price: not guessed.
        let written = Usage {
            written: 10,
            ..u(1, 1)
        };
        let e = settle(Reported::Usage(written), 9);
        assert_eq!(
            (e.status, e.nanos, e.usage_refused),
            (Status::Error, Some(9), Some(UsageRefused::Unpriced))
        );
        // No usage: held (unknown, nothing settled).
        let e = settle(Reported::Missing, 9);
        assert_eq!(
            (e.status, e.nanos, e.usage_refused),
            (Status::Unknown, None, None)
        );
        // Not a success: nothing charged, whatever it reports.
        let b = billed(&Reported::Usage(u(100, 50)), Some(&price()), Some(&price()));
        let e = classify(StatusCode::INTERNAL_SERVER_ERROR, b, Nanos(9), None, None);
        assert_eq!((e.status, e.nanos), (Status::Error, Some(0)));
    }
}
