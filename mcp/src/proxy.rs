//! The message pump. Two directions, each in its own task:
//!
//! * client to server, one message at a time in arrival order: a `tools/call` waits for
//!   the gate's answer before it (or anything after it) goes on, so ordering is kept;
//! * server to client: answers to allowed calls are recorded as outcomes, the
//!   `initialize` and `tools/list` answers teach the server's name and the tools'
//!   annotations; everything is forwarded as it came.
//!
//! Messages travel as the exact bytes received (rmcp's line codec over
//! `serde_json::value::RawValue`); only the ones the proxy must read are parsed, with
//! rmcp's typed model.

use std::collections::{HashMap, HashSet};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, CancelledNotificationParam, ContentBlock,
    InitializeResult, ListToolsResult, MetaObject,
};
use rmcp::transport::async_rw::{JsonRpcMessageCodec, JsonRpcMessageCodecError};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tally_gate::{CheckAnswer, CheckRequest, OutcomeRequest};
use tally_ledger::{Effect, Status};
use tally_policy::Verdict;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder, FramedRead, FramedWrite};

use crate::gate::{Gate, GateFailure};
use crate::{log, McpError, Options};

/// A line longer than this is dropped (rmcp's stdio default).
const MAX_LINE: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;
/// A call the gate gave no `timeout_ms` ends after this.
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the proxy waits for its own `tools/list`.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);
/// After the client hangs up, how long the server has to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(5);

type Raw = Box<RawValue>;

/// rmcp's line codec, with its error policy for a proxy: a line that is not JSON, or too
/// long, is dropped (as rmcp's own stdio transport does) and the stream goes on.
struct Lines(JsonRpcMessageCodec<Raw>);

impl Lines {
    fn new() -> Lines {
        Lines(JsonRpcMessageCodec::new_with_max_length(MAX_LINE))
    }

    fn skip(e: JsonRpcMessageCodecError) -> Result<(), std::io::Error> {
        match e {
            JsonRpcMessageCodecError::Io(e) => Err(e),
            e => {
                log(&format!(
                    "dropped a line that is not a JSON-RPC message: {e}"
                ));
                Ok(())
            }
        }
    }
}

impl Decoder for Lines {
    type Item = Raw;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Raw>, std::io::Error> {
        loop {
            match self.0.decode(buf) {
                Ok(item) => return Ok(item),
                Err(e) => Lines::skip(e)?,
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Raw>, std::io::Error> {
        loop {
            match self.0.decode_eof(buf) {
                Ok(item) => return Ok(item),
                Err(e) => Lines::skip(e)?,
            }
        }
    }
}

impl Encoder<Raw> for Lines {
    type Error = std::io::Error;

    fn encode(&mut self, item: Raw, buf: &mut BytesMut) -> Result<(), std::io::Error> {
        self.0.encode(item, buf).map_err(Into::into)
    }
}

/// The JSON-RPC envelope fields the proxy routes by.
#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    params: Option<Value>,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

/// A request id as a map key (its canonical JSON: `1` and `"1"` differ).
type Key = String;

fn key(id: &Value) -> Key {
    id.to_string()
}

struct Pending {
    attempt: u64,
    tool: String,
    cancelled: bool,
    timer: tokio::task::AbortHandle,
}

#[derive(Default)]
struct State {
    server_name: Option<String>,
    /// Effects learned from `tools/list`, by the server's tool name.
    tools: HashMap<String, Effect>,
    /// Allowed calls forwarded and not answered yet, by request id.
    pending: HashMap<Key, Pending>,
    /// Calls that timed out: a late answer is dropped (the client had its answer).
    expired: HashSet<Key>,
    /// The client's `initialize` and `tools/list` requests, to read their answers.
    initialize: Vec<Key>,
    lists: Vec<Key>,
    /// The proxy's own requests to the server.
    own: HashMap<Key, oneshot::Sender<Envelope>>,
    next_own: u64,
}

#[derive(Clone)]
struct Shared {
    state: Arc<Mutex<State>>,
    gate: Gate,
    options: Arc<Options>,
    to_client: Sender,
    to_server: Sender,
}

/// A writer task's queue; `None` ends it (after what was queued before).
#[derive(Clone)]
struct Sender(mpsc::UnboundedSender<Option<Raw>>);

impl Sender {
    fn send(&self, message: Raw) {
        let _ = self.0.send(Some(message));
    }

    fn close(&self) {
        let _ = self.0.send(None);
    }
}

/// A task writing each queued message as one line, until `None` or a write fails.
fn writer<W: AsyncWrite + Unpin + Send + 'static>(out: W) -> (Sender, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Option<Raw>>();
    let task = tokio::spawn(async move {
        let mut out = FramedWrite::new(out, Lines::new());
        while let Some(Some(m)) = rx.recv().await {
            if out.send(m).await.is_err() {
                break;
            }
        }
        // Dropping the writer closes it: for the server's stdin, that is MCP's
        // stdio shutdown.
    });
    (Sender(tx), task)
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere must not silence the gate: keep using the state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn raw(value: &Value) -> Raw {
    RawValue::from_string(value.to_string()).expect("serde_json writes valid JSON")
}

/// Run the proxy over the given client streams until the client hangs up (then the
/// server is asked to exit) or the server exits.
pub async fn run<R, W>(
    options: Options,
    client_in: R,
    client_out: W,
) -> Result<ExitStatus, McpError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (program, args) = options.command.split_first().ok_or(McpError::NoCommand)?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| McpError::Spawn {
            command: program.to_string_lossy().into_owned(),
            source,
        })?;
    let server_in = child.stdin.take().expect("piped");
    let server_out = child.stdout.take().expect("piped");

    let gate = Gate::spawn(options.socket.clone(), options.start_request());
    let (to_client, client_writer) = writer(client_out);
    let (to_server, _server_writer) = writer(server_in);
    let shared = Shared {
        state: Arc::new(Mutex::new(State {
            server_name: options.server_name.clone(),
            ..State::default()
        })),
        gate: gate.clone(),
        options: Arc::new(options),
        to_client,
        to_server,
    };

    let from_server = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut lines = FramedRead::new(server_out, Lines::new());
            while let Some(Ok(message)) = lines.next().await {
                from_server(&shared, message);
            }
        })
    };
    let mut from_client = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut lines = FramedRead::new(client_in, Lines::new());
            while let Some(Ok(message)) = lines.next().await {
                from_client(&shared, message).await;
            }
        })
    };

    // Whichever side ends first ends the session.
    let status = tokio::select! {
        _ = &mut from_client => {
            // The client hung up: close the server's stdin and give it time to exit.
            shared.to_server.close();
            match tokio::time::timeout(EXIT_GRACE, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    let _ = child.start_kill();
                    child.wait().await
                }
            }
        }
        status = child.wait() => status,
    }
    .map_err(McpError::Io)?;
    from_client.abort();
    // What the server wrote last is still forwarded (and its outcomes recorded).
    let _ = tokio::time::timeout(Duration::from_secs(2), from_server).await;

    // Calls the server never answered: their outcome is unknown.
    let unanswered: Vec<Pending> = shared.state().pending.drain().map(|(_, p)| p).collect();
    for p in unanswered {
        p.timer.abort();
        shared
            .gate
            .outcome(outcome(&shared.options, p.attempt, Status::Unknown));
    }
    gate.flush().await;
    shared.to_client.close();
    let _ = tokio::time::timeout(Duration::from_secs(2), client_writer).await;
    Ok(status)
}

fn outcome(options: &Options, attempt: u64, status: Status) -> OutcomeRequest {
    OutcomeRequest {
        run: options.run.clone(),
        attempt,
        status,
        settled_cents: None,
        remote_ref: None,
        observed: None,
        retry_after_ms: None,
        result_digest: None,
        worker: options.worker.clone(),
    }
}

/// One message from the server, on its way to the client.
fn from_server(shared: &Shared, message: Raw) {
    let Ok(env) = serde_json::from_str::<Envelope>(message.get()) else {
        // Not an object (a batch, or something odd): pass it on as it is.
        shared.to_client.send(message);
        return;
    };
    match (&env.method, &env.id) {
        (None, Some(id)) => {
            let k = key(id);
            let mut state = shared.state();
            if state.expired.remove(&k) {
                return; // answered late: the client already has the timeout result
            }
            if let Some(reply) = state.own.remove(&k) {
                drop(state);
                let _ = reply.send(env);
                return; // the proxy's own request: the client never sees it
            }
            if let Some(p) = state.pending.remove(&k) {
                drop(state);
                p.timer.abort();
                let failed = env.error.is_some()
                    || env
                        .result
                        .as_ref()
                        .and_then(|r| r.get("isError"))
                        .and_then(Value::as_bool)
                        .unwrap_or(false);
                let status = if failed { Status::Error } else { Status::Ok };
                shared
                    .gate
                    .outcome(outcome(&shared.options, p.attempt, status));
            } else if let Some(i) = state.initialize.iter().position(|x| *x == k) {
                state.initialize.remove(i);
                if let Some(Ok(init)) = env.result.map(serde_json::from_value::<InitializeResult>) {
                    if state.server_name.is_none() {
                        state.server_name = Some(init.server_info.name);
                    }
                }
            } else if let Some(i) = state.lists.iter().position(|x| *x == k) {
                state.lists.remove(i);
                if let Some(result) = env.result {
                    learn_tools(&mut state, result);
                }
            }
        }
        (Some(m), None) if m == "notifications/tools/list_changed" => {
            // Annotations may have changed: learn them again when next needed.
            shared.state().tools.clear();
        }
        _ => {}
    }
    shared.to_client.send(message);
}

fn learn_tools(state: &mut State, result: Value) {
    match serde_json::from_value::<ListToolsResult>(result) {
        Ok(list) => {
            for tool in list.tools {
                state.tools.insert(
                    tool.name.to_string(),
                    crate::map::effect_of(tool.annotations.as_ref()),
                );
            }
        }
        Err(e) => log(&format!("a tools/list answer could not be read: {e}")),
    }
}

/// One message from the client, on its way to the server.
async fn from_client(shared: &Shared, message: Raw) {
    let Ok(env) = serde_json::from_str::<Envelope>(message.get()) else {
        if let Ok(batch) = serde_json::from_str::<Vec<Raw>>(message.get()) {
            // A JSON-RPC batch (MCP 2025-03-26): each member on its own, so that no
            // tools/call passes unchecked inside one.
            for m in batch {
                Box::pin(from_client(shared, m)).await;
            }
            return;
        }
        shared.to_server.send(message);
        return;
    };
    match (env.method.as_deref(), &env.id) {
        (Some("tools/call"), Some(id)) => {
            call(shared, id.clone(), env.params, message).await;
            return;
        }
        (Some("initialize"), Some(id)) => shared.state().initialize.push(key(id)),
        (Some("tools/list"), Some(id)) => shared.state().lists.push(key(id)),
        (Some("notifications/cancelled"), None) => {
            let cancelled = env
                .params
                .and_then(|p| serde_json::from_value::<CancelledNotificationParam>(p).ok())
                .and_then(|p| p.request_id);
            if let Some(id) = cancelled {
                let id = serde_json::to_value(id).expect("an id serializes");
                if let Some(p) = shared.state().pending.get_mut(&key(&id)) {
                    // The client wants no answer; the outcome is still recorded.
                    p.cancelled = true;
                }
            }
        }
        _ => {}
    }
    shared.to_server.send(message);
}

/// A `tools/call`: asked of the gate first; forwarded unchanged only on an allow.
async fn call(shared: &Shared, id: Value, params: Option<Value>, message: Raw) {
    let params = match params.map(serde_json::from_value::<CallToolRequestParams>) {
        Some(Ok(p)) => p,
        Some(Err(e)) => {
            return reply_error(
                shared,
                &id,
                -32602,
                &format!(
                "tally mcp: the tools/call params are not valid ({e}); the call was not forwarded"
            ),
            )
        }
        None => {
            return reply_error(
                shared,
                &id,
                -32602,
                "tally mcp: tools/call without params; the call was not forwarded",
            )
        }
    };
    let server = shared.state().server_name.clone();
    let Some(server) = server else {
        return deny_text(shared, &id, None, "tally mcp has not seen the server's initialize answer, so it cannot name the tool for the gate: the call was not made. Initialize the session first (or start tally mcp with --server-name).".into());
    };
    let tool = format!("{server}/{}", params.name);
    let args = match tally_ledger::decision::Args::from_value(&Value::Object(
        params.arguments.clone().unwrap_or_default(),
    )) {
        Ok(a) => a,
        Err(e) => {
            return reply_error(
                shared,
                &id,
                -32602,
                &format!("tally mcp: the call's arguments cannot be digested ({e}); the call was not forwarded"),
            )
        }
    };
    let effect = effect(shared, &params.name, &tool).await;
    let request = CheckRequest {
        run: shared.options.run.clone(),
        worker: shared.options.worker.clone(),
        tool: tool.clone(),
        operation: None,
        args: Some(args),
        args_preview: None,
        effect,
        idempotency_key: None,
        target: None,
        channel: Some(tally_ledger::decision::Channel::Tool),
        depth: None,
        reserve_cents: None,
        remote_ref: None,
        credential: shared.options.credential.clone(),
        timeout_ms: None,
    };
    match shared.gate.check(request).await {
        Ok(answer) if answer.decision == Verdict::Allow => {
            let Some(attempt) = answer.attempt else {
                return deny_text(shared, &id, Some(&answer), "tally's gate allowed the call without an attempt number to record its outcome under: the call was not made.".into());
            };
            let timeout = answer
                .timeout_ms
                .map(Duration::from_millis)
                .unwrap_or(DEFAULT_CALL_TIMEOUT);
            let timer = tokio::spawn(expire(shared.clone(), id.clone(), timeout)).abort_handle();
            shared.state().pending.insert(
                key(&id),
                Pending {
                    attempt,
                    tool,
                    cancelled: false,
                    timer,
                },
            );
            shared.to_server.send(message);
        }
        Ok(answer) => {
            let text = refusal_text(&tool, &answer);
            deny_text(shared, &id, Some(&answer), text);
        }
        Err(failure) => {
            let text = format!(
                "tally could not check this call to {tool} with its gate, so the call was not made (fail closed): {failure}. Action: retry later; if it keeps failing, a human must check that `tally serve` runs on that socket{}.",
                match &failure {
                    GateFailure::Refused { code, .. } if code == "run_not_found" || code == "not_owner" => " and that the run is this user's",
                    _ => "",
                }
            );
            deny_text(shared, &id, None, text);
        }
    }
}

/// No answer in time: the outcome is `timeout`, the server is told to cancel, and the
/// client (unless it cancelled itself) gets an error result.
async fn expire(shared: Shared, id: Value, after: Duration) {
    tokio::time::sleep(after).await;
    let Some(p) = ({
        let mut state = shared.state();
        let p = state.pending.remove(&key(&id));
        if p.is_some() {
            state.expired.insert(key(&id));
        }
        p
    }) else {
        return;
    };
    shared
        .gate
        .outcome(outcome(&shared.options, p.attempt, Status::Timeout));
    let cancel = json!({
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": id, "reason": "tally mcp: no answer within the gate's time limit"},
    });
    shared.to_server.send(raw(&cancel));
    if !p.cancelled {
        let text = format!(
            "tally: {} did not answer within {} ms, the time the gate allowed this call; it was cancelled and its outcome recorded as timeout. The tool may or may not have acted: check before calling it again.",
            p.tool,
            after.as_millis()
        );
        let result = tool_error(text, None);
        shared
            .to_client
            .send(raw(&json!({"jsonrpc": "2.0", "id": id, "result": result})));
    }
}

/// The effect a call is checked under: the map's, else the tool's annotations (asking
/// the server for its tool list if the client has not), else a non-idempotent write.
async fn effect(shared: &Shared, name: &str, tool: &str) -> Effect {
    if let Some(e) = shared.options.policy_map.effect(tool) {
        return e;
    }
    if let Some(e) = shared.state().tools.get(name) {
        return *e;
    }
    list_tools(shared).await;
    shared
        .state()
        .tools
        .get(name)
        .copied()
        .unwrap_or(Effect::NonIdempotentWrite)
}

/// The proxy's own `tools/list`, every page, under ids the client does not use.
async fn list_tools(shared: &Shared) {
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut state = shared.state();
            state.next_own += 1;
            let id = Value::String(format!("tally-mcp-{}", state.next_own));
            state.own.insert(key(&id), tx);
            id
        };
        let mut request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"});
        if let Some(c) = &cursor {
            request["params"] = json!({ "cursor": c });
        }
        shared.to_server.send(raw(&request));
        let Ok(Ok(env)) = tokio::time::timeout(LIST_TIMEOUT, rx).await else {
            shared.state().own.remove(&key(&id));
            log("the server did not answer the proxy's tools/list: unlisted tools count as non-idempotent writes");
            return;
        };
        let Some(result) = env.result else { return };
        let next = result
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_string);
        learn_tools(&mut shared.state(), result);
        match next {
            Some(c) => cursor = Some(c),
            None => return,
        }
    }
}

fn reply_error(shared: &Shared, id: &Value, code: i64, message: &str) {
    let reply = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    shared.to_client.send(raw(&reply));
}

/// An MCP tool result with `isError` and a text the model can act on; the gate's answer
/// also goes in `_meta` under `tally/gate`, for programs.
fn tool_error(text: String, answer: Option<&CheckAnswer>) -> Value {
    let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
    // Older protocol versions have no resultType; leave it out, as a server would.
    result.result_type = None;
    if let Some(a) = answer {
        let mut meta = serde_json::Map::new();
        meta.insert(
            "tally/gate".into(),
            json!({
                "decision": a.decision,
                "reason": a.reason,
                "action": a.action,
                "cause": a.cause,
                "retry_after_ms": a.retry_after_ms,
                "seq": a.seq,
            }),
        );
        result.meta = Some(MetaObject(meta));
    }
    serde_json::to_value(result).expect("a tool result serializes")
}

fn deny_text(shared: &Shared, id: &Value, answer: Option<&CheckAnswer>, text: String) {
    let result = tool_error(text, answer);
    shared
        .to_client
        .send(raw(&json!({"jsonrpc": "2.0", "id": id, "result": result})));
}

/// What the model reads when the gate refuses: what, why, what to do, and when.
fn refusal_text(tool: &str, a: &CheckAnswer) -> String {
    let reason = a.reason.map(|r| r.as_str()).unwrap_or("refused");
    let action = a.action.map(|x| x.as_str()).unwrap_or("stop");
    let todo = match action {
        "retry" => "wait, then try again",
        "ask" => "a human must approve more (tally approve) before this can go on; say so and wait",
        _ => "do not call it again for this task; report what happened and what is left to do",
    };
    let mut text = match (a.decision, a.cause) {
        (Verdict::RequireApproval, Some(cause)) => format!(
            "tally refused this call to {tool}: {cause}, and going on needs a human's approval ({reason}). Action: {action}: {todo}."
        ),
        _ => format!("tally refused this call to {tool}: {reason}. Action: {action}: {todo}."),
    };
    if let Some(ms) = a.retry_after_ms {
        text.push_str(&format!(" Retry after {ms} ms."));
    }
    if let Some(seq) = a.seq {
        text.push_str(&format!(" (Recorded in tally's ledger, seq {seq}.)"));
    }
    text
}
