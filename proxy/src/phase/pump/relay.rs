//! The relay of an answer's body: each chunk hashed, passed to the agent (a stream the
//! client did not ask usage of reframed without its usage chunk) and read for usage,
//! an SSE stream event by event, an AWS event stream frame by frame (a frame that
//! fails its CRC or cannot be classified cuts it, its outcome unknown), a plain body kept (up to [`MAX_KEPT`]) to be read
//! whole at its end. A client that went away stops receiving; the upstream is still
//! read to its end (or the deadline) to settle what it cost. The end of the answer (a
//! plain answer's last chunk, any body's end) is released only once the outcome is
//! sequenced ([`Relay::finish`], [`Relay::cut`]).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use eventsource_stream::{Event, EventStream};
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use futures::{FutureExt, StreamExt};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::StatusCode;
use tally_policy::UpstreamKind;
use tally_record::Status;

use crate::request::Endpoint;
use crate::usage::{Keep, Reported, StreamUsage};

/// The most of a plain (not streamed) answer kept to read its usage: 16 MiB. A longer
/// answer passes through whole, and settles as `unknown` (its reservation held). Also the
/// largest event of a stream: one larger is cut, an `error` settled at its reservation.
const MAX_KEPT: usize = 16 * 1024 * 1024;

/// Where the agent's answer body is sent.
pub(super) type Client = tokio::sync::mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>;

/// One answer's body, as it is relayed.
pub(super) struct Relay {
    endpoint: Endpoint,
    sse: bool,
    reframe: bool,
    deadline: tokio::time::Instant,
    client: Option<Client>,
    hasher: blake3::Hasher,
    /// A plain answer, kept to read its usage, unless it overflowed.
    kept: Vec<u8>,
    overflow: bool,
    /// A stream's usage, read event by event.
    usage: StreamUsage,
    feed: UnboundedSender<Result<Bytes, Infallible>>,
    events: EventStream<UnboundedReceiver<Result<Bytes, Infallible>>>,
    /// Bytes of the stream read since its last whole event.
    pending: usize,
    /// Chunks read since the last line end, not yet fed to the parser.
    unfed: Vec<Bytes>,
    /// A plain answer's last chunk read, held back until the next one is read or, at the
    /// end, the outcome is sequenced ([`Relay::finish`]): the agent has no whole answer
    /// before any later decision would see what it cost.
    last: Option<Bytes>,
    /// An AWS event stream's frames (Bedrock's ConverseStream), if the answer is one.
    frames: Option<crate::bedrock::frames::Frames>,
    /// Set when the agent's answer is not whole (a send that timed out, a cut): its
    /// body then ends with an error after what was queued, never as if complete.
    broken: Arc<AtomicBool>,
}

impl Relay {
    pub fn new(
        endpoint: Endpoint,
        sse: bool,
        reframe: bool,
        client: Client,
        broken: Arc<AtomicBool>,
        deadline: Instant,
    ) -> Relay {
        let (feed, fed) = futures::channel::mpsc::unbounded::<Result<Bytes, Infallible>>();
        Relay {
            endpoint,
            sse,
            reframe,
            deadline: tokio::time::Instant::from_std(deadline),
            client: Some(client),
            hasher: blake3::Hasher::new(),
            kept: Vec::new(),
            overflow: false,
            usage: StreamUsage::new(endpoint),
            feed,
            events: EventStream::new(fed),
            pending: 0,
            unfed: Vec::new(),
            last: None,
            frames: None,
            broken,
        }
    }

    /// The same, the answer read as an AWS event stream
    /// (`application/vnd.amazon.eventstream`).
    pub fn framed(mut self) -> Relay {
        self.frames = Some(crate::bedrock::frames::Frames::new());
        self
    }

    /// Whether the answer is a stream of events (SSE or AWS event-stream frames), each
    /// chunk passed on as it comes.
    fn streamed(&self) -> bool {
        self.sse || self.frames.is_some()
    }

    /// Relays `body` to its end (`Ok`), or until it is cut: the status of the cut (a
    /// timeout, a broken body, an event past the bound).
    pub async fn run(&mut self, body: &mut Incoming) -> Result<(), Status> {
        loop {
            let frame = match tokio::time::timeout_at(self.deadline, body.frame()).await {
                Err(_) => return Err(Status::Timeout),
                // A stream that ends inside a frame was cut.
                Ok(None) if self.frames.as_ref().is_some_and(|f| f.partial()) => {
                    return Err(Status::Unknown)
                }
                Ok(None) => return Ok(()),
                Ok(Some(Err(_))) => return Err(Status::Unknown),
                Ok(Some(Ok(f))) => f,
            };
            let Ok(chunk) = frame.into_data() else {
                continue;
            };
            self.hasher.update(&chunk);
            let mut out = Vec::new();
            if self.sse {
                out = self.events_of(&chunk)?;
            } else if self.frames.is_some() {
                self.frames_of(&chunk)?;
            } else {
                self.keep(&chunk);
            }
            let forwarded = if self.reframe { out } else { vec![chunk] };
            self.send(forwarded).await;
        }
    }

    /// A stream's chunk fed to the event parser: the events it completes read for
    /// usage, and (reframing) those the client sees.
    fn events_of(&mut self, chunk: &Bytes) -> Result<Vec<Bytes>, Status> {
        self.pending = self.pending.saturating_add(chunk.len());
        // The parser reads a line again from its start each time it is fed, so bytes
        // that end no line wait here until one does: a long line costs its length
        // once, not its length per chunk.
        if !chunk.iter().any(|&b| b == b'\n' || b == b'\r') {
            if self.pending > MAX_KEPT {
                return Err(Status::Error);
            }
            self.unfed.push(chunk.clone());
        } else {
            for b in self.unfed.drain(..) {
                let _ = self.feed.unbounded_send(Ok(b));
            }
            let _ = self.feed.unbounded_send(Ok(chunk.clone()));
        }
        let mut out = Vec::new();
        while let Some(Some(Ok(ev))) = self.events.next().now_or_never() {
            self.pending = 0;
            let keep = self.usage.event(&ev.data);
            if self.reframe && keep == Keep::Pass {
                out.push(reframed(&ev));
            }
        }
        // One event past the bound: a stream no API sends, never buffered on.
        if self.pending > MAX_KEPT {
            return Err(Status::Error);
        }
        Ok(out)
    }

    /// An event stream's chunk decoded: the frames it completes read for usage. A frame
    /// that fails its CRC, or that cannot be classified, cuts the stream (`unknown`: its
    /// usage can no longer be read, what was used stays held); one past the bound is an
    /// `error`, as an SSE event past it.
    fn frames_of(&mut self, chunk: &Bytes) -> Result<(), Status> {
        use crate::bedrock::frames::{FrameError, Framed};
        let Some(frames) = self.frames.as_mut() else {
            return Ok(());
        };
        match frames.feed(chunk, MAX_KEPT) {
            Ok(read) => {
                for f in read {
                    match f {
                        Framed::Event { kind, payload } => self.usage.frame(kind, &payload),
                        Framed::Exception(what) => self.usage.exception(&what),
                    }
                }
                Ok(())
            }
            Err(FrameError::TooLarge(_)) => Err(Status::Error),
            Err(_) => Err(Status::Unknown),
        }
    }

    /// A plain answer's chunk kept, until it is more than [`MAX_KEPT`].
    fn keep(&mut self, chunk: &Bytes) {
        if self.overflow {
            return;
        }
        if self.kept.len() + chunk.len() > MAX_KEPT {
            self.overflow = true;
            self.kept = Vec::new();
        } else {
            self.kept.extend_from_slice(chunk);
        }
    }

    /// `forwarded` sent to the client, unless it went away; a plain answer's last chunk
    /// held back until the next one comes.
    async fn send(&mut self, forwarded: Vec<Bytes>) {
        for b in forwarded {
            if b.is_empty() {
                continue;
            }
            let b = if self.streamed() {
                b
            } else {
                match self.last.replace(b) {
                    Some(earlier) => earlier,
                    None => continue,
                }
            };
            self.pass(b).await;
        }
    }

    /// `b` sent to the client, unless it went away.
    async fn pass(&mut self, b: Bytes) {
        let Some(c) = &self.client else {
            return;
        };
        let sent = tokio::time::timeout_at(self.deadline, c.send(Ok(Frame::data(b)))).await;
        if !matches!(sent, Ok(Ok(()))) {
            // Gone, or too slow to take the answer by the deadline: what it has is not
            // the whole answer, and its body must not end as if it were.
            self.broken.store(true, Ordering::SeqCst);
            self.client = None;
        }
    }

    /// The end of the answer released to the client: the chunk held back, then the end
    /// of its body. Called once the outcome is sequenced.
    pub async fn finish(mut self) {
        if let Some(b) = self.last.take() {
            self.pass(b).await;
        }
        self.client = None;
    }

    /// The client told the answer was cut, after what it was sent (the chunk held back
    /// too). Called once the outcome is sequenced.
    pub async fn cut(mut self) {
        if let Some(b) = self.last.take() {
            self.pass(b).await;
        }
        // The body's end is an error, after what was queued (never a wait on a client
        // that does not read).
        self.broken.store(true, Ordering::SeqCst);
        self.client = None;
    }

    /// At the stream's end, its last event (one with no blank line after it is still
    /// an event) read and passed on. The client's body ends later ([`Relay::finish`]).
    pub async fn last_events(&mut self) {
        if !self.sse {
            return;
        }
        for b in self.unfed.drain(..) {
            let _ = self.feed.unbounded_send(Ok(b));
        }
        self.feed.close_channel();
        while let Some(Some(Ok(ev))) = self.events.next().now_or_never() {
            let keep = self.usage.event(&ev.data);
            if self.reframe && keep == Keep::Pass {
                self.pass(reframed(&ev)).await;
            }
        }
    }

    /// The usage a complete answer with `status` from an upstream of `kind` reported,
    /// and the tier it says served it.
    pub fn reported(&self, status: StatusCode, kind: UpstreamKind) -> (Reported, Option<String>) {
        if !status.is_success() || kind == UpstreamKind::Http {
            (Reported::Missing, None)
        } else if self.streamed() {
            (self.usage.reported(), self.usage.tier().map(str::to_owned))
        } else if self.overflow {
            (Reported::Missing, None)
        } else {
            crate::usage::answer(self.endpoint, &self.kept)
        }
    }

    /// The BLAKE3 digest of the answer's bytes as read.
    pub fn digest(&self) -> String {
        self.hasher.finalize().to_hex().to_string()
    }
}

/// An event as the client would have received it.
fn reframed(ev: &Event) -> Bytes {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn relay(
        capacity: usize,
        within: Duration,
    ) -> (Relay, super::super::Receiver, Arc<AtomicBool>) {
        let (tx, rx) = tokio::sync::mpsc::channel(capacity);
        let broken = Arc::new(AtomicBool::new(false));
        let r = Relay::new(
            Endpoint::ChatCompletions,
            false,
            false,
            tx,
            Arc::clone(&broken),
            Instant::now() + within,
        );
        (r, rx, broken)
    }

    #[tokio::test]
    async fn an_answer_the_agent_took_whole_ends_cleanly() {
        let (mut r, rx, broken) = relay(4, Duration::from_secs(5));
        r.send(vec![
            Bytes::from_static(b"{\"a\":"),
            Bytes::from_static(b"1}"),
        ])
        .await;
        r.finish().await;
        let got: Vec<_> = super::super::body_of(rx, broken).collect().await;
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(Result::is_ok));
    }

    #[tokio::test]
    async fn an_agent_too_slow_to_take_the_answer_never_sees_a_clean_end() {
        // One frame fits; the agent reads nothing before the deadline.
        let (mut r, rx, broken) = relay(1, Duration::from_millis(50));
        r.send(vec![
            Bytes::from_static(b"one"),
            Bytes::from_static(b"two"),
            Bytes::from_static(b"three"),
        ])
        .await;
        r.finish().await;
        let got: Vec<_> = super::super::body_of(rx, broken).collect().await;
        assert!(
            got.first().is_some_and(Result::is_ok),
            "what was queued first"
        );
        assert!(
            got.last().is_some_and(Result::is_err),
            "the body ends with an error: {got:?}"
        );
    }

    #[tokio::test]
    async fn a_cut_answer_ends_with_an_error_after_what_was_sent() {
        let (mut r, rx, broken) = relay(4, Duration::from_secs(5));
        r.send(vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")])
            .await;
        r.cut().await;
        let got: Vec<_> = super::super::body_of(rx, broken).collect().await;
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got[..2].iter().all(Result::is_ok));
        assert!(got[2].is_err());
    }
}
