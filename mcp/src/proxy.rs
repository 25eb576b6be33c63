//! The message pump. Two directions, each in its own task:
//!
//! * client to server, one message at a time in arrival order: each line is classified
//!   ([`crate::classify`]); a refused one is answered (or dropped) and counted, never
//!   forwarded; a `tools/call` waits for the gate's answer before it (or anything after
//!   it) goes on, so ordering is kept; what passes is forwarded as the bytes classified;
//! * server to client: answers to allowed calls are recorded as outcomes, the
//!   `initialize` and `tools/list` answers teach the server's name and the tools'
//!   annotations; everything is forwarded as it came.
//!
//! The proxy keeps the ids in flight both ways: a client request may not reuse the id of
//! one still in flight, and a client answer must answer a request the server sent.

use std::collections::{HashMap, HashSet};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tally_api::ErrorCode;

use futures::StreamExt;
use rmcp::model::{InitializeResult, ListToolsResult};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tally_record::{Action, Effect, Reason, Status};
use tally_wire::OutcomeRequest;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::oneshot;
use tokio_util::codec::FramedRead;

use crate::classify::{self, Call, Id, Message, Refused, Why};
use crate::gate::{Gate, GateFailure};
use crate::lines::{writer, ClientLine, ClientLines, Sender, ServerLines};
use crate::{log, reply, McpError, Options};

mod gated;
mod server;

use gated::{call, outcome};
use server::from_server;

/// How long the proxy waits for its own `tools/list`.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);
/// After the client hangs up, how long the server has to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// A request id as a map key (its canonical JSON: `1` and `"1"` differ).
type Key = String;

fn key(id: &Value) -> Key {
    id.to_string()
}

/// What a client request in flight was, to read its answer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Asked {
    Initialize,
    ToolsList,
    Call,
    Other,
}

struct Pending {
    attempt: u64,
    tool: String,
    effect: Effect,
    cancelled: bool,
    timer: tokio::task::AbortHandle,
}

#[derive(Default)]
struct State {
    server_name: Option<String>,
    /// Effects learned from `tools/list`, by the server's tool name.
    tools: HashMap<String, Effect>,
    /// The client's requests forwarded and not answered yet, by id.
    asked: HashMap<Key, Asked>,
    /// Allowed calls forwarded and not answered yet, by request id.
    pending: HashMap<Key, Pending>,
    /// Calls that timed out: a late answer is dropped (the client had its answer).
    expired: HashSet<Key>,
    /// The proxy's own requests to the server.
    own: HashMap<Key, oneshot::Sender<Value>>,
    next_own: u64,
    /// The server's requests to the client not answered yet.
    server_asked: HashSet<Key>,
    /// Messages from the client refused, never forwarded.
    refused: u64,
    /// The gate's last answer in this session, if it was a refusal: its reason and
    /// action (an allow clears it). What the run's stop says at the end.
    last_refusal: Option<(Reason, Action)>,
}

#[derive(Clone)]
struct Shared {
    state: Arc<Mutex<State>>,
    gate: Gate,
    options: Arc<Options>,
    to_client: Sender,
    to_server: Sender,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere must not silence the gate: keep using the state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
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
    let mut child = spawn_server(&options)?;
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
            let mut lines = FramedRead::new(server_out, ServerLines::new());
            while let Some(Ok(message)) = lines.next().await {
                from_server(&shared, &message);
            }
        })
    };
    let mut from_client = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut lines = FramedRead::new(client_in, ClientLines::new());
            while let Some(Ok(line)) = lines.next().await {
                from_client(&shared, line).await;
            }
        })
    };

    // Whichever side ends first ends the session: the client closing its stdin, a
    // signal (how some clients and hosts end a session), or the server exiting.
    let mut signals = Signals::new().map_err(McpError::Io)?;
    let (ended, status) = tokio::select! {
        _ = &mut from_client => ("the client closed its stdin", stop_server(&shared, &mut child).await),
        name = signals.next() => (name, stop_server(&shared, &mut child).await),
        status = child.wait() => ("the server exited", status),
    };
    let status = status.map_err(McpError::Io)?;
    from_client.abort();
    // What the server wrote last is still forwarded (and its outcomes recorded).
    let _ = tokio::time::timeout(Duration::from_secs(2), from_server).await;

    end_session(&shared, &gate, ended).await;
    gate.flush().await;
    let refused = shared.state().refused;
    if refused > 0 {
        log(&format!(
            "{refused} {} from the client {} refused and never reached the server",
            if refused == 1 { "message" } else { "messages" },
            if refused == 1 { "was" } else { "were" },
        ));
    }
    shared.to_client.close();
    let _ = tokio::time::timeout(Duration::from_secs(2), client_writer).await;
    Ok(status)
}

/// The MCP server, its stdin and stdout piped to the proxy, its stderr the proxy's.
fn spawn_server(options: &Options) -> Result<tokio::process::Child, McpError> {
    let (program, args) = options.command.split_first().ok_or(McpError::NoCommand)?;
    tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| McpError::Spawn {
            command: program.to_string_lossy().into_owned(),
            source,
        })
}

/// The session is over (`ended` says how): calls the server never answered are recorded
/// `unknown`, then the run it started is stopped after its outcomes, unless a human may
/// still grant what its last refusal asked (docs/MCP.md, "The run, and the end of a
/// session").
async fn end_session(shared: &Shared, gate: &Gate, ended: &str) {
    let unanswered: Vec<Pending> = shared.state().pending.drain().map(|(_, p)| p).collect();
    let unknown_write = unanswered
        .iter()
        .any(|p| p.effect == Effect::NonIdempotentWrite);
    for p in unanswered {
        p.timer.abort();
        shared
            .gate
            .outcome(outcome(&shared.options, p.attempt, Status::Unknown));
    }
    let last_refusal = shared.state().last_refusal;
    let reason = crate::call::end_reason(unknown_write, last_refusal);
    if let (None, Some((reason, _))) = (reason, last_refusal) {
        // A human may grant more: the run stays open for the approval, and for the next
        // session under this --run, which joins it.
        log(&format!(
            "{ended}: the run is left open: the gate's last answer ({reason}) waits for a human's decision"
        ));
    }
    if let Some(reason) = reason {
        match gate.stop(reason).await {
            Some(Ok(run)) => log(&format!("{ended}: run {run} stopped ({reason})")),
            Some(Err(GateFailure::Refused {
                code: ErrorCode::RunStopped,
                ..
            })) => log(&format!("{ended}: the run had already stopped")),
            Some(Err(e)) => log(&format!("{ended}: the run could not be stopped: {e}")),
            None => {}
        }
    }
}

/// The client is gone: close the server's stdin (MCP's stdio shutdown) and give it
/// [`EXIT_GRACE`] to exit before it is killed.
async fn stop_server(
    shared: &Shared,
    child: &mut tokio::process::Child,
) -> std::io::Result<ExitStatus> {
    shared.to_server.close();
    match tokio::time::timeout(EXIT_GRACE, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            let _ = child.start_kill();
            child.wait().await
        }
    }
}

/// SIGTERM, SIGINT and SIGHUP: each ends the session as the client closing would.
struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM arrived",
            _ = self.int.recv() => "SIGINT arrived",
            _ = self.hup.recv() => "SIGHUP arrived",
        }
    }
}

/// A message refused: answered with an error under each usable id (or only dropped),
/// logged and counted; never forwarded.
fn refuse(shared: &Shared, refused: Refused) {
    let count = {
        let mut state = shared.state();
        state.refused += 1;
        state.refused
    };
    let answered = if refused.answer.is_empty() {
        "dropped"
    } else {
        "answered with an error"
    };
    log(&format!(
        "refused a message from the client, not forwarded ({answered}; {count} refused so far): {}",
        refused.why
    ));
    for id in &refused.answer {
        shared
            .to_client
            .send(reply::refused(id, &refused.why, count));
    }
}

/// One line from the client: classified, then forwarded (a call, once the gate allows
/// it) or refused.
async fn from_client(shared: &Shared, line: ClientLine) {
    let classified = match line {
        ClientLine::Line(bytes) => classify::classify(&bytes),
        ClientLine::TooLong => Err(Refused {
            why: Why::TooLong,
            answer: Vec::new(),
        }),
    };
    let classified = match classified {
        Ok(c) => c,
        Err(r) => return refuse(shared, r),
    };
    let in_flight =
        |state: &State, k: &Key| state.asked.contains_key(k) || state.own.contains_key(k);
    match classified.message {
        Message::Call { id, call: c } => {
            if in_flight(&shared.state(), &id.key()) {
                return refuse(
                    shared,
                    Refused {
                        why: Why::IdInUse,
                        answer: Vec::new(),
                    },
                );
            }
            call(shared, id, c, classified.line).await;
        }
        Message::Request { id, method } => {
            let k = id.key();
            let mut state = shared.state();
            if in_flight(&state, &k) {
                drop(state);
                return refuse(
                    shared,
                    Refused {
                        why: Why::IdInUse,
                        answer: Vec::new(),
                    },
                );
            }
            let asked = match method {
                "initialize" => Asked::Initialize,
                "tools/list" => Asked::ToolsList,
                _ => Asked::Other,
            };
            state.asked.insert(k, asked);
            drop(state);
            shared.to_server.send(classified.line);
        }
        Message::Notification { method, params } => {
            if method == "notifications/cancelled" {
                let cancelled = params
                    .as_ref()
                    .and_then(|p| p.get("requestId"))
                    .and_then(Id::from_value);
                if let Some(id) = cancelled {
                    if let Some(p) = shared.state().pending.get_mut(&id.key()) {
                        // The client wants no answer; the outcome is still recorded.
                        p.cancelled = true;
                    }
                }
            }
            shared.to_server.send(classified.line);
        }
        Message::Response { id } => {
            if !shared.state().server_asked.remove(&id.key()) {
                return refuse(
                    shared,
                    Refused {
                        why: Why::UnexpectedAnswer,
                        answer: Vec::new(),
                    },
                );
            }
            shared.to_server.send(classified.line);
        }
    }
}
