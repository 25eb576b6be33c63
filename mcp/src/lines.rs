//! Line framing on stdio (MCP's stdio transport: one message per line), with tokio-util's
//! and rmcp's codecs.
//!
//! * From the client: raw lines (tokio-util's delimiter codec), so that the classifier
//!   sees exactly the bytes received, invalid UTF-8 and all; a line longer than
//!   [`MAX_LINE`] becomes [`ClientLine::TooLong`] and the stream goes on.
//! * From the server: rmcp's line codec over raw JSON values; a line that is not JSON is
//!   dropped, as rmcp's own stdio transport does.
//! * Out, both ways: each queued line and a newline.

use futures::SinkExt;
use rmcp::transport::async_rw::{JsonRpcMessageCodec, JsonRpcMessageCodecError};
use serde_json::value::RawValue;
use tokio::io::AsyncWrite;
use tokio::sync::mpsc;
use tokio_util::bytes::{Bytes, BytesMut};
use tokio_util::codec::{
    AnyDelimiterCodec, AnyDelimiterCodecError, Decoder, FramedWrite, LinesCodec,
};

use crate::classify::MAX_LINE;
use crate::log;

/// A line from the client.
pub enum ClientLine {
    /// The line's bytes, without the newline.
    Line(Bytes),
    /// A line longer than [`MAX_LINE`]; its bytes were skipped up to the next newline.
    TooLong,
}

/// The client's lines.
pub struct ClientLines(AnyDelimiterCodec);

impl ClientLines {
    pub fn new() -> ClientLines {
        ClientLines(AnyDelimiterCodec::new_with_max_length(
            b"\n".to_vec(),
            b"\n".to_vec(),
            MAX_LINE,
        ))
    }

    fn item(
        r: Result<Option<Bytes>, AnyDelimiterCodecError>,
    ) -> Result<Option<ClientLine>, std::io::Error> {
        match r {
            Ok(line) => Ok(line.map(ClientLine::Line)),
            Err(AnyDelimiterCodecError::MaxChunkLengthExceeded) => Ok(Some(ClientLine::TooLong)),
            Err(AnyDelimiterCodecError::Io(e)) => Err(e),
        }
    }
}

impl Decoder for ClientLines {
    type Item = ClientLine;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<ClientLine>, std::io::Error> {
        ClientLines::item(self.0.decode(buf))
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<ClientLine>, std::io::Error> {
        ClientLines::item(self.0.decode_eof(buf))
    }
}

/// The server's messages: rmcp's line codec, with its error policy for a proxy: a line
/// that is not JSON, or too long, is dropped and the stream goes on.
pub struct ServerLines(JsonRpcMessageCodec<Box<RawValue>>);

impl ServerLines {
    pub fn new() -> ServerLines {
        ServerLines(JsonRpcMessageCodec::new_with_max_length(MAX_LINE))
    }

    fn skip(e: JsonRpcMessageCodecError) -> Result<(), std::io::Error> {
        match e {
            JsonRpcMessageCodecError::Io(e) => Err(e),
            e => {
                log(&format!(
                    "dropped a line from the server that is not a JSON-RPC message: {e}"
                ));
                Ok(())
            }
        }
    }
}

impl Decoder for ServerLines {
    type Item = Box<RawValue>;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Box<RawValue>>, std::io::Error> {
        loop {
            match self.0.decode(buf) {
                Ok(item) => return Ok(item),
                Err(e) => ServerLines::skip(e)?,
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Box<RawValue>>, std::io::Error> {
        loop {
            match self.0.decode_eof(buf) {
                Ok(item) => return Ok(item),
                Err(e) => ServerLines::skip(e)?,
            }
        }
    }
}

/// A writer task's queue; `None` ends it (after what was queued before).
#[derive(Clone)]
pub struct Sender(mpsc::UnboundedSender<Option<String>>);

impl Sender {
    /// Queue one line (without its newline).
    pub fn send(&self, line: String) {
        let _ = self.0.send(Some(line));
    }

    /// End the writer once what is queued is written.
    pub fn close(&self) {
        let _ = self.0.send(None);
    }
}

/// A task writing each queued line, until `None` or a write fails.
pub fn writer<W: AsyncWrite + Unpin + Send + 'static>(
    out: W,
) -> (Sender, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Option<String>>();
    let task = tokio::spawn(async move {
        let mut out = FramedWrite::new(out, LinesCodec::new());
        while let Some(Some(line)) = rx.recv().await {
            if out.send(line).await.is_err() {
                break;
            }
        }
        // Dropping the writer closes it: for the server's stdin, that is MCP's stdio
        // shutdown.
    });
    (Sender(tx), task)
}
