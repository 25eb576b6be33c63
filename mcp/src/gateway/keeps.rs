//! The HTTP client for a Streamable HTTP server behind the gateway: reqwest's, as rmcp
//! uses it, except that a POST's SSE answer rmcp lets go of before its end is read to
//! its end (bounded) before it is dropped. rmcp stops reading once it has the JSON-RPC
//! answer (its own drain after it is bounded at 50 ms, and does not run to the body's
//! end when the server's last chunk comes after rmcp let go); an HTTP/1.1 body dropped
//! unfinished closes its connection, so nearly every call opened a new one (a TCP handshake, and a new connection for the server to accept).
//! Read to its end, the body gives its connection back to the client's pool and the
//! next call reuses it. What is read after rmcp let go is discarded, as rmcp would have
//! discarded it; a server that keeps the stream open past [`DRAIN_TIME`] or sends more
//! than [`DRAIN_BYTES`] loses its connection, as before.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::{BoxStream, Stream, StreamExt};
use hyper::header::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sse_stream::Sse;

/// At most this long is spent reading a let-go answer's rest.
pub(super) const DRAIN_TIME: Duration = Duration::from_secs(1);
/// At most this much of a let-go answer's rest (its events' fields) is read.
pub(super) const DRAIN_BYTES: usize = 64 * 1024;

/// reqwest's client, whose POST answers keep their connection (see the module).
#[derive(Clone)]
pub(super) struct Keeps(pub(super) reqwest::Client);

type Events = BoxStream<'static, Result<Sse, SseError>>;
type Posted = Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>;

/// A POST's answer: an SSE one read to its end when let go of.
fn kept(posted: Posted) -> Posted {
    Ok(match posted? {
        StreamableHttpPostResponse::Sse(events, session) => {
            StreamableHttpPostResponse::Sse(Drains::new(events).boxed(), session)
        }
        other => other,
    })
}

impl StreamableHttpClient for Keeps {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Posted {
        kept(
            self.0
                .post_message(uri, message, session_id, auth_header, custom_headers)
                .await,
        )
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Posted {
        let posted = self.0.post_message_with_max_sse_event_size(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            max_sse_event_size,
        );
        kept(posted.await)
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Posted {
        let posted = self.0.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        );
        kept(posted.await)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<reqwest::Error>> {
        self.0
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    // A GET's stream is the session's standing one: not drained, left as reqwest's.
    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Events, StreamableHttpError<reqwest::Error>> {
        self.0
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<Events, StreamableHttpError<reqwest::Error>> {
        let stream = self.0.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            max_sse_event_size,
        );
        stream.await
    }
}

/// An SSE stream that, dropped before its end, has its rest read (bounded) by a task of
/// its own, then dropped.
struct Drains<S: Stream + Unpin + Send + 'static>
where
    S::Item: Weighs,
{
    /// `None` once it ended.
    events: Option<S>,
}

impl<S: Stream + Unpin + Send + 'static> Drains<S>
where
    S::Item: Weighs,
{
    fn new(events: S) -> Drains<S> {
        Drains {
            events: Some(events),
        }
    }
}

impl<S: Stream + Unpin + Send + 'static> Stream for Drains<S>
where
    S::Item: Weighs,
{
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let Some(events) = self.events.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = events.poll_next_unpin(cx);
        if let Poll::Ready(None) = polled {
            self.events = None;
        }
        polled
    }
}

impl<S: Stream + Unpin + Send + 'static> Drop for Drains<S>
where
    S::Item: Weighs,
{
    fn drop(&mut self) {
        let (Some(events), Ok(runtime)) =
            (self.events.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        runtime.spawn(drain(events));
    }
}

/// The size an event's fields take (what reading it cost); none for an error.
trait Weighs {
    fn weight(&self) -> Option<usize>;
}

impl Weighs for Result<Sse, SseError> {
    fn weight(&self) -> Option<usize> {
        let sse = self.as_ref().ok()?;
        let fields = [&sse.event, &sse.data, &sse.id];
        Some(
            fields
                .iter()
                .map(|f| f.as_ref().map_or(0, String::len))
                .sum::<usize>()
                + 1,
        )
    }
}

/// Read `events` to its end, at most [`DRAIN_BYTES`] of it and for at most
/// [`DRAIN_TIME`]; an error ends it.
async fn drain<S: Stream + Unpin>(mut events: S)
where
    S::Item: Weighs,
{
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut read = 0;
        while let Some(event) = events.next().await {
            match event.weight() {
                Some(w) if read + w <= DRAIN_BYTES => read += w,
                _ => return,
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    type Item = Result<bytes::Bytes, std::convert::Infallible>;

    impl Weighs for Item {
        fn weight(&self) -> Option<usize> {
            self.as_ref().ok().map(|b| b.len() + 1)
        }
    }

    /// `items`, then `ended` set once the stream's end was read.
    fn tracked(items: Vec<Item>, ended: Arc<AtomicBool>) -> BoxStream<'static, Item> {
        let end = futures::stream::once(async move {
            ended.store(true, Ordering::SeqCst);
            None
        });
        futures::stream::iter(items.into_iter().map(Some))
            .chain(end)
            .filter_map(futures::future::ready)
            .boxed()
    }

    fn chunk(n: usize) -> Item {
        Ok(bytes::Bytes::from(vec![b'x'; n]))
    }

    #[tokio::test]
    async fn a_stream_let_go_before_its_end_is_read_to_its_end() {
        let ended = Arc::new(AtomicBool::new(false));
        let mut events = Drains::new(tracked(vec![chunk(10), chunk(5)], ended.clone()));
        assert!(events.next().await.is_some());
        drop(events);
        for _ in 0..100 {
            if ended.load(Ordering::SeqCst) {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the rest was not read");
    }

    #[tokio::test]
    async fn more_than_the_bound_is_not_read() {
        let ended = Arc::new(AtomicBool::new(false));
        let items = vec![chunk(DRAIN_BYTES), chunk(1)];
        drain(tracked(items, ended.clone())).await;
        assert!(!ended.load(Ordering::SeqCst), "read past the bound");
        let ended = Arc::new(AtomicBool::new(false));
        drain(tracked(vec![chunk(DRAIN_BYTES - 1)], ended.clone())).await;
        assert!(ended.load(Ordering::SeqCst));
    }
}
