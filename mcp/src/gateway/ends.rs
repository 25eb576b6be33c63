//! The SSE stream answering one request in a session ends with that request's answer
//! (MCP: "after the JSON-RPC response has been sent, the server SHOULD close the SSE
//! stream"). rmcp's stream is left open a while after it; a client that has read its
//! answer then closes the connection (its body unfinished) and opens a new one for its
//! next request. Ended here, the connection is kept alive for the next request.
//!
//! A POST passed on holds one request: the gateway refuses JSON-RPC batches (MCP has
//! none since 2025-06-18; the classifier refuses an array whatever the session's
//! version). The count is still taken from the body read, not assumed: a stream is
//! ended only once every request the body holds has its answer, and left as rmcp made
//! it when the body's requests cannot be counted with certainty.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use serde::de::IgnoredAny;

/// A POST's SSE body, ended once as many events carrying a JSON-RPC answer (a `result`
/// or an `error`, no `method`) as the POST held requests have passed. Every byte passes
/// unchanged.
pub(super) struct EndsAtAnswer<B> {
    inner: B,
    /// The current event's text so far (`\r` left out).
    event: Vec<u8>,
    /// The answers still awaited.
    left: usize,
}

impl<B> EndsAtAnswer<B> {
    /// `inner` ended after `requests` answers (see [`requests`]).
    pub(super) fn new(inner: B, requests: usize) -> EndsAtAnswer<B> {
        EndsAtAnswer {
            inner,
            event: Vec::new(),
            left: requests,
        }
    }

    /// Read `data`: the answers still awaited once the events it completes are read.
    fn answers(&mut self, data: &[u8]) -> usize {
        for &b in data.iter().filter(|&&b| b != b'\r') {
            self.event.push(b);
            if self.event.ends_with(b"\n\n") {
                if is_answer(&self.event) {
                    self.left = self.left.saturating_sub(1);
                }
                self.event.clear();
            }
        }
        self.left
    }
}

/// The requests (messages with an `id` and a `method`) a POST's body, as read strictly,
/// holds: one message or each of a batch. None when they cannot be counted with
/// certainty (a batch member that is not an object, or no request at all): such a
/// stream is not ended here.
pub(super) fn requests(body: &serde_json::Value) -> Option<usize> {
    let is_request = |m: &serde_json::Value| -> Option<bool> {
        let m = m.as_object()?;
        Some(m.contains_key("id") && m.contains_key("method"))
    };
    let count = match body {
        serde_json::Value::Array(all) => all
            .iter()
            .try_fold(0, |n, m| is_request(m).map(|r| n + usize::from(r)))?,
        one => usize::from(is_request(one)?),
    };
    (count > 0).then_some(count)
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
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.answers(data);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0 || self.inner.is_end_stream()
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
        read_after(frames, 1)
    }

    /// [`read`], for a POST of `requests` requests.
    fn read_after(frames: &[&'static str], requests: usize) -> Option<String> {
        let body = EndsAtAnswer::new(Box::pin(open(frames)), requests);
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

    #[test]
    fn a_batch_of_two_ends_with_its_second_answer_not_its_first() {
        let one = "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n";
        let two = "data: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}\n\n";
        assert_eq!(read_after(&[one], 2), None, "cut after its first answer");
        assert_eq!(
            read_after(&[one, two], 2).as_deref(),
            Some(&*format!("{one}{two}"))
        );
        let body: serde_json::Value = serde_json::from_str(
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/x"},{"jsonrpc":"2.0","id":2,"method":"tools/list"}]"#,
        )
        .expect("json");
        assert_eq!(requests(&body), Some(2));
    }

    #[test]
    fn a_body_whose_requests_cannot_be_counted_is_not_ended() {
        let count = |text: &str| requests(&serde_json::from_str(text).expect("json"));
        assert_eq!(
            count(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            Some(1)
        );
        for text in [
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},2]"#,
            r#"[]"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            r#""ping""#,
        ] {
            assert_eq!(count(text), None, "{text}");
        }
    }
}
