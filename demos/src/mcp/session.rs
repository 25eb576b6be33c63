//! A real MCP server and client for `tally demo`'s MCP story: a `reports` server whose
//! one tool fails every time (its upstream is down), and a client that calls it in a
//! loop, as an agent stuck on a failing tool does, through `tally mcp`.
//!
//! Both speak MCP over stdio with rmcp's line codec (JSON-RPC framing is rmcp's); the
//! messages are the protocol's own shapes.

use futures::{SinkExt, StreamExt};
use rmcp::transport::async_rw::JsonRpcMessageCodec;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::error::DemoError;

/// The protocol version the demo client asks for.
const PROTOCOL: &str = "2025-06-18";

fn io(e: impl std::fmt::Display) -> DemoError {
    DemoError::Refused(format!("the MCP session failed: {e}"))
}

/// Serve the demo's `reports` server on `input`/`output` until the client hangs up.
pub async fn serve_reports(
    input: impl AsyncRead + Unpin,
    output: impl AsyncWrite + Unpin,
) -> Result<(), DemoError> {
    let mut lines = FramedRead::new(input, JsonRpcMessageCodec::<Value>::default());
    let mut out = FramedWrite::new(output, JsonRpcMessageCodec::<Value>::default());
    while let Some(message) = lines.next().await {
        let message = message.map_err(io)?;
        let (Some(id), Some(method)) = (message.get("id"), message["method"].as_str()) else {
            continue; // a notification, or an answer: nothing to say
        };
        let result = match method {
            "initialize" => json!({
                "protocolVersion": message["params"]["protocolVersion"].as_str().unwrap_or(PROTOCOL),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "reports", "version": "1.0.0"},
            }),
            "tools/list" => json!({"tools": [{
                "name": "export_status",
                "description": "The status of a report export",
                "inputSchema": {"type": "object", "properties": {"export": {"type": "string"}}},
                "annotations": {"readOnlyHint": true},
            }]}),
            "tools/call" => json!({
                "content": [{"type": "text", "text": "upstream 503: the export service is unavailable"}],
                "isError": true,
            }),
            _ => {
                let error = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "method not found"}});
                out.send(error).await.map_err(io)?;
                continue;
            }
        };
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": result});
        out.send(answer).await.map_err(io)?;
    }
    Ok(())
}

/// What the looping client saw: each call's answer text, and whether it was the
/// server's failure or tally's refusal.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// The result's text.
    pub text: String,
    /// Whether tally refused the call (it never reached the server).
    pub refused: bool,
}

/// Initialize a session over `input`/`output` (the proxy's stdio), list the tools, then
/// call `export_status` with the same arguments until tally refuses it or `max` calls.
pub async fn loop_on_failing_tool(
    input: impl AsyncRead + Unpin,
    output: impl AsyncWrite + Unpin,
    max: u64,
) -> Result<Vec<Attempt>, DemoError> {
    let mut s = Session {
        lines: FramedRead::new(input, JsonRpcMessageCodec::<Value>::default()),
        out: FramedWrite::new(output, JsonRpcMessageCodec::<Value>::default()),
        next: 0,
    };
    let init = json!({"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "agent", "version": "1.0.0"}});
    s.ask("initialize", init).await?;
    s.out
        .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await
        .map_err(io)?;
    s.ask("tools/list", json!({})).await?;
    let mut seen = Vec::new();
    for _ in 0..max {
        let call = json!({"name": "export_status", "arguments": {"export": "q3"}});
        let answer = s.ask("tools/call", call).await?;
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let refused = text.starts_with("tally");
        seen.push(Attempt { text, refused });
        if refused {
            break;
        }
    }
    Ok(seen)
}

/// A client session: requests with ids, answers matched to them.
struct Session<R, W> {
    lines: FramedRead<R, JsonRpcMessageCodec<Value>>,
    out: FramedWrite<W, JsonRpcMessageCodec<Value>>,
    next: u64,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin> Session<R, W> {
    async fn ask(&mut self, method: &str, params: Value) -> Result<Value, DemoError> {
        self.next += 1;
        let id = self.next;
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.out.send(request).await.map_err(io)?;
        while let Some(message) = self.lines.next().await {
            let message = message.map_err(io)?;
            if message["id"] == json!(id) {
                return Ok(message);
            }
        }
        Err(io("the proxy closed the session"))
    }
}
