//! The SSE stream answering one request in a session ends with that request's answer
//! (MCP: "after the JSON-RPC response has been sent, the server SHOULD close the SSE
//! stream"). rmcp's stream is left open a while after it; a client that has read its
//! answer then closes the connection (its body unfinished) and opens a new one for its
//! next request. Ended here, the connection is kept alive for the next request.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use serde::de::IgnoredAny;

/// A request's SSE body, ended once an event carrying a JSON-RPC answer (a `result` or
/// an `error`, no `method`) has passed. Every byte passes unchanged.
pub(super) struct EndsAtAnswer<B> {
    inner: B,
    /// The current event's text so far (`\r` left out).
    event: Vec<u8>,
    answered: bool,
}

impl<B> EndsAtAnswer<B> {
    pub(super) fn new(inner: B) -> EndsAtAnswer<B> {
        EndsAtAnswer {
            inner,
            event: Vec::new(),
            answered: false,
        }
    }

    /// Read `data`: whether an event it completes is an answer.
    fn answers(&mut self, data: &[u8]) -> bool {
        let mut answered = false;
        for &b in data.iter().filter(|&&b| b != b'\r') {
            self.event.push(b);
            if self.event.ends_with(b"\n\n") {
                answered |= is_answer(&self.event);
                self.event.clear();
            }
        }
        answered
    }
}

/// The JSON-RPC fields that tell an answer from a request or a notification.
#[derive(serde::Deserialize)]
struct Probe {
    method: Option<IgnoredAny>,
    result: Option<IgnoredAny>,
    error: Option<IgnoredAny>,
}

/// Whether an SSE event (its lines) carries a JSON-RPC answer.
fn is_answer(event: &[u8]) -> bool {
    let mut data = Vec::new();
    for line in event.split(|&b| b == b'\n') {
        if let Some(d) = line.strip_prefix(b"data:") {
            if !data.is_empty() {
                data.push(b'\n');
            }
            data.extend_from_slice(d.strip_prefix(b" ").unwrap_or(d));
        }
    }
    serde_json::from_slice::<Probe>(&data)
        .is_ok_and(|p| p.method.is_none() && (p.result.is_some() || p.error.is_some()))
}

impl<B> Body for EndsAtAnswer<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if self.answered {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.answered = self.answers(data);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.answered || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::{FutureExt, StreamExt};
    use http_body_util::{BodyExt, StreamBody};

    /// The events given, in the frames given, then a stream that never ends (rmcp's,
    /// left open after the answer).
    fn open(frames: &[&'static str]) -> impl Body<Data = Bytes, Error = std::convert::Infallible> {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = frames
            .iter()
            .map(|f| Ok(Frame::data(Bytes::from_static(f.as_bytes()))))
            .collect();
        StreamBody::new(futures::stream::iter(frames).chain(futures::stream::pending()))
    }

    /// The whole body, if it ends without waiting: `None` if it is left open.
    fn read(frames: &[&'static str]) -> Option<String> {
        let body = EndsAtAnswer::new(Box::pin(open(frames)));
        let collected = body.collect().now_or_never()?.expect("infallible");
        Some(String::from_utf8(collected.to_bytes().to_vec()).expect("utf-8"))
    }

    #[test]
    fn the_stream_ends_with_the_answer_every_byte_passed() {
        let priming = "data: \nid: 0/1\nretry: 3000\n\n";
        let answer =
            "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[]}}\nid: 0/2\n\n";
        assert_eq!(
            read(&[priming, answer]).as_deref(),
            Some(&*format!("{priming}{answer}"))
        );
        // An error answers as well; split across frames, with CRLF lines.
        let error = [
            "data: {\"jsonrpc\":\"2.0\",\"id\":7,",
            "\"error\":{\"code\":-1,\"message\":\"x\"}}\r\n\r\n",
        ];
        assert!(read(&error).is_some());
    }

    #[test]
    fn a_stream_without_its_answer_is_left_open() {
        // A notification and a request (each has a method) answer nothing; nor does an
        // event not yet complete, nor one that is not JSON.
        assert_eq!(read(&["data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n"]), None);
        assert_eq!(
            read(&[
                "data: {\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"roots/list\",\"result\":1}\n\n"
            ]),
            None
        );
        assert_eq!(
            read(&["data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n"]),
            None
        );
        assert_eq!(read(&["data: result error\n\n", ": comment\n\n"]), None);
    }
}
