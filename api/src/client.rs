//! The HTTP/1.1 connection under [`crate::GateClient`] (and the daemon's tests and load
//! generator): one keep-alive connection to the daemon, over its Unix socket or TCP
//! loopback. Appending decisions is the operator socket's (the agent socket only asks
//! the gate).
//!
//! ```no_run
//! # async fn demo() -> Result<(), tally_api::client::ClientError> {
//! let mut client = tally_api::client::Client::unix("/run/tally/operator.sock").await?;
//! let receipts = client.append(r#"{"run":"r1","kind":"start","goal":"export report"}"#).await?;
//! println!("seq {} hash {}", receipts[0].seq, receipts[0].hash);
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::path::Path;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
pub use hyper::Method;
use hyper::{header, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tally_wire::Receipt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

use crate::wire::{ErrorDetail, ErrorReply};

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Connecting failed (no daemon on that socket, permission denied, ...).
    #[error("cannot connect to the daemon: {0}")]
    Connect(std::io::Error),
    /// The connection failed mid-request: the outcome of an append is unknown.
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    /// The daemon refused the request with a typed error.
    #[error("{status}: {} ({})", error.message, error.code)]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The daemon's typed error.
        error: ErrorDetail,
    },
    /// The reply was not what the API promises.
    #[error("unexpected reply ({status}): {why}")]
    Unexpected {
        /// The HTTP status.
        status: u16,
        /// What was wrong with it.
        why: String,
    },
}

/// A reply: status, content type and the whole body.
#[derive(Clone, Debug)]
pub struct Reply {
    /// The HTTP status.
    pub status: StatusCode,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The body.
    pub body: Bytes,
    /// The `Retry-After` header in seconds, if the daemon sent one.
    pub retry_after_secs: Option<u64>,
}

/// One connection to the daemon. Requests on it run one at a time; open one client per
/// concurrent worker.
pub struct Client {
    sender: SendRequest<Full<Bytes>>,
    host: &'static str,
}

impl Client {
    /// Connect over the daemon's Unix socket.
    pub async fn unix(path: impl AsRef<Path>) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(ClientError::Connect)?;
        Client::handshake(stream, "localhost").await
    }

    /// Connect over TCP loopback.
    pub async fn tcp(addr: SocketAddr) -> Result<Client, ClientError> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(ClientError::Connect)?;
        stream.set_nodelay(true).map_err(ClientError::Connect)?;
        Client::handshake(stream, "localhost").await
    }

    /// Speak HTTP/1.1 to the daemon over a stream the caller opened (an in-process
    /// connection the daemon serves itself, as its MCP gateway's).
    pub async fn over(io: tokio::io::DuplexStream) -> Result<Client, ClientError> {
        Client::handshake(io, "localhost").await
    }

    async fn handshake<I>(io: I, host: &'static str) -> Result<Client, ClientError>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, connection) = http1::handshake(TokioIo::new(io)).await?;
        tokio::spawn(async move {
            // Ends when the client is dropped or the daemon closes the connection; the
            // next request then reports the error.
            let _ = connection.await;
        });
        Ok(Client { sender, host })
    }

    /// Send one request and read the whole reply.
    pub async fn request(
        &mut self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<Bytes>,
    ) -> Result<Reply, ClientError> {
        self.request_with(method, path, content_type, &[], body)
            .await
    }

    /// [`Client::request`] with extra headers; one whose value is not a valid header
    /// value is left out (never sent mangled).
    pub async fn request_with(
        &mut self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        headers: &[(&'static str, String)],
        body: impl Into<Bytes>,
    ) -> Result<Reply, ClientError> {
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, self.host);
        if let Some(ct) = content_type {
            builder = builder.header(header::CONTENT_TYPE, ct);
        }
        for (name, value) in headers {
            if let Ok(v) = header::HeaderValue::from_str(value) {
                builder = builder.header(*name, v);
            }
        }
        let request =
            builder
                .body(Full::new(body.into()))
                .map_err(|e| ClientError::Unexpected {
                    status: 0,
                    why: format!("bad request: {e}"),
                })?;
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let retry_after_secs = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let body = response.into_body().collect().await?.to_bytes();
        Ok(Reply {
            status,
            content_type,
            body,
            retry_after_secs,
        })
    }

    /// Append one decision (a JSON object) and return its receipt once durable.
    pub async fn append(&mut self, decision: &str) -> Result<Vec<Receipt>, ClientError> {
        let reply = self
            .request(
                Method::POST,
                "/v1/decisions",
                Some("application/json"),
                Bytes::copy_from_slice(decision.as_bytes()),
            )
            .await?;
        receipts(reply)
    }

    /// Append an NDJSON batch (one decision per line), atomically.
    pub async fn append_ndjson(
        &mut self,
        batch: impl Into<Bytes>,
    ) -> Result<Vec<Receipt>, ClientError> {
        let reply = self
            .request(
                Method::POST,
                "/v1/decisions",
                Some("application/x-ndjson"),
                batch,
            )
            .await?;
        receipts(reply)
    }
}

/// The receipts of a successful append, or the daemon's typed error.
pub fn receipts(reply: Reply) -> Result<Vec<Receipt>, ClientError> {
    json_of(&reply)
}

/// A successful reply's JSON body as `T`, or the daemon's typed error.
pub fn json_of<T: serde::de::DeserializeOwned>(reply: &Reply) -> Result<T, ClientError> {
    let status = reply.status.as_u16();
    if reply.status.is_success() {
        return serde_json::from_slice(&reply.body).map_err(|e| ClientError::Unexpected {
            status,
            why: e.to_string(),
        });
    }
    // A check the gate could not record is answered 503 with a deny the shape of a
    // check's answer and the error reply's detail beside it: the same typed refusal.
    let refused = serde_json::from_slice::<ErrorReply>(&reply.body)
        .map(|r| r.error)
        .or_else(|e| {
            serde_json::from_slice::<tally_wire::CheckUnavailable>(&reply.body)
                .map(|c| c.error)
                .map_err(|_| e)
        });
    match refused {
        Ok(error) => Err(ClientError::Refused { status, error }),
        Err(e) => Err(ClientError::Unexpected {
            status,
            why: format!(
                "an error reply that is not the daemon's typed JSON ({e}): {}",
                String::from_utf8_lossy(&reply.body[..reply.body.len().min(200)])
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, body: Vec<u8>) -> Reply {
        Reply {
            status: StatusCode::from_u16(status).expect("status"),
            content_type: Some("application/json".into()),
            body: Bytes::from(body),
            retry_after_secs: Some(1),
        }
    }

    #[test]
    fn a_check_the_gate_could_not_record_reads_as_its_typed_refusal() {
        let body = serde_json::to_vec(&tally_wire::CheckUnavailable::new("the disk is full"))
            .expect("json");
        match json_of::<serde_json::Value>(&reply(503, body)) {
            Err(ClientError::Refused { status, error }) => {
                assert_eq!(status, 503);
                assert_eq!(error.code, tally_wire::ErrorCode::GateUnavailable);
                assert_eq!(error.message, "the disk is full");
            }
            other => panic!("{other:?}"),
        }
        // Neither shape: unexpected, never a refusal made up.
        assert!(matches!(
            json_of::<serde_json::Value>(&reply(503, b"{\"decision\":\"deny\"}".to_vec())),
            Err(ClientError::Unexpected { status: 503, .. })
        ));
    }
}
