//! One MCP server role per gateway session (rmcp makes one per `Mcp-Session-Id`):
//! `tools/list` merges every server's tools as `NAME__tool`; a `tools/call` is the call
//! the front classified, checked on the one gate path ([`crate::call`]) in the run the
//! session's token names, then made on its server and its outcome recorded.

use std::sync::{Arc, Mutex, OnceLock};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorCode, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;
use tally_record::Status;
use tally_wire::StartRequest;

use super::runs::{self, Hold};
use super::servers::{Backend, Called, Unlisted};
use super::SEPARATOR;
use crate::call::{self, Asker, Gated, Last};
use crate::classify::Call;
use crate::gate::Gate;

/// What the gateway's sessions share.
pub(super) struct Shared {
    pub(super) backends: Vec<Backend>,
    pub(super) asker: Asker,
}

/// Whom a request acts for, as the front read it from the credential.
#[derive(Clone, Debug)]
pub(super) struct RunOf(pub(super) super::Authorized);

/// The call the front classified, for the gate: exactly what the classifier read.
#[derive(Clone, Debug)]
pub(super) struct Classified(pub(super) Call);

/// An `initialize` being answered: the hold on its run, taken by the session it opens
/// (which then gives it back when it ends; one the session did not take, the front gives
/// back), and the protocol version the session negotiated.
pub(super) struct Opening {
    hold: Mutex<Option<Hold>>,
    negotiated: OnceLock<String>,
}

impl Opening {
    pub(super) fn new(hold: Hold) -> Opening {
        Opening {
            hold: Mutex::new(Some(hold)),
            negotiated: OnceLock::new(),
        }
    }

    /// The hold, if no one took it yet.
    pub(super) fn take(&self) -> Option<Hold> {
        self.hold.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// The version the session's `initialize` negotiated, once answered.
    pub(super) fn negotiated(&self) -> Option<String> {
        self.negotiated.get().cloned()
    }
}

/// One session.
pub(super) struct Session {
    shared: Arc<Shared>,
    /// The session's run, its gate worker, the run's ending (shared by the run's
    /// sessions) and the session's hold on the run (given back when the session ends,
    /// the run stopped if it was the last and the gateway started it): bound at its
    /// first request.
    bound: OnceLock<Bound>,
}

struct Bound {
    run: String,
    gate: Gate,
    ending: runs::Shared,
    _hold: Option<Hold>,
}

impl Session {
    pub(super) fn new(shared: Arc<Shared>) -> Session {
        Session {
            shared,
            bound: OnceLock::new(),
        }
    }

    /// The request's HTTP parts, as rmcp hands them over.
    fn parts(context: &RequestContext<RoleServer>) -> Option<&hyper::http::request::Parts> {
        context.extensions.get::<hyper::http::request::Parts>()
    }

    /// The session's run and gate: bound on its first request, the same after.
    fn gate(&self, context: &RequestContext<RoleServer>) -> Result<&Bound, ErrorData> {
        let parts = Self::parts(context);
        let run = parts
            .and_then(|p| p.extensions.get::<RunOf>())
            .ok_or_else(|| internal("the request carries no run"))?;
        let bound = self.bound.get_or_init(|| {
            let start = StartRequest {
                run: run.0.run.clone(),
                worker: self.shared.asker.worker.clone(),
                ..StartRequest::default()
            };
            // The worker never stops the run: the last hold on it does.
            let gate = Gate::join((run.0.gate)(), start, false);
            let hold = parts
                .and_then(|p| p.extensions.get::<Arc<Opening>>())
                .and_then(|o| o.take());
            if let Some(h) = &hold {
                h.bind(gate.clone());
            }
            Bound {
                run: run.0.run.clone(),
                gate,
                ending: hold
                    .as_ref()
                    .map_or_else(runs::Shared::default, |h| Arc::clone(h.ending())),
                _hold: hold,
            }
        });
        if bound.run != run.0.run {
            return Err(ErrorData::new(
                ErrorCode::INVALID_REQUEST,
                "this session acts in another run: a credential drives only its own sessions",
                None,
            ));
        }
        Ok(bound)
    }

    fn backend(&self, name: &str) -> Option<&Backend> {
        self.shared.backends.iter().find(|b| b.name == name)
    }
}

fn internal(why: &str) -> ErrorData {
    ErrorData::new(
        ErrorCode::INTERNAL_ERROR,
        format!("tally's MCP gateway: {why}; the call was not made"),
        None,
    )
}

fn invalid(why: String) -> ErrorData {
    ErrorData::new(ErrorCode::INVALID_PARAMS, why, None)
}

/// The answer to a call of a tool its server did not list: not checked, not made.
fn unlisted(why: Unlisted, name: &str) -> ErrorData {
    invalid(match why {
        Unlisted::Unknown => format!(
            "unknown tool `{name}`: its server did not list it (see tools/list); the call was not made"
        ),
        Unlisted::NoListing(e) => format!(
            "tool `{name}`: its server did not list its tools ({e}); the call was not made"
        ),
    })
}

impl ServerHandler for Session {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("tally-mcp-gateway", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, ErrorData> {
        // The session is bound to its credential's run from its first message.
        self.gate(&context)?;
        context.peer.set_peer_info(request.clone());
        let result = self.negotiate_initialize(&request)?;
        if let Some(o) = Self::parts(&context).and_then(|p| p.extensions.get::<Arc<Opening>>()) {
            let _ = o
                .negotiated
                .set(result.protocol_version.as_str().to_owned());
        }
        Ok(result)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.gate(&context)?;
        // Every server at once: one that hangs costs the list its time bound, no more.
        let listed =
            futures::future::join_all(self.shared.backends.iter().map(|b| b.tools())).await;
        let mut tools = Vec::new();
        for (b, listed) in self.shared.backends.iter().zip(listed) {
            match listed {
                Ok(t) => tools.extend(t),
                Err(e) => crate::log(&format!(
                    "gateway: server {} did not list its tools, left out of this list: {e}",
                    b.name
                )),
            }
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        _request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let bound = self.gate(&context)?;
        let (run, gate) = (&bound.run, &bound.gate);
        // The call exactly as the classifier read it (taken, not copied); rmcp's typed
        // copy is not used.
        let mut context = context;
        let Some(Classified(c)) = context
            .extensions
            .get_mut::<hyper::http::request::Parts>()
            .and_then(|p| p.extensions.remove::<Classified>())
        else {
            return Err(internal("the call was not classified"));
        };
        let Some((server, tool)) = c.name.split_once(SEPARATOR) else {
            return Err(invalid(format!(
                "unknown tool `{}`: the gateway's tools are named SERVER{SEPARATOR}tool",
                c.name
            )));
        };
        let Some(backend) = self.backend(server) else {
            return Err(invalid(format!(
                "unknown tool `{}`: no server `{server}` behind this gateway",
                c.name
            )));
        };
        let (args, arguments) = call::args(c.arguments).map_err(|e| {
            invalid(format!(
                "the call's arguments cannot be digested ({e}); the call was not made"
            ))
        })?;
        let effect = backend
            .effect(tool)
            .await
            .map_err(|u| unlisted(u, &c.name))?;
        let full = format!("{server}/{tool}");
        let request = call::check_request(run, &self.shared.asker, full.clone(), args, effect);
        let (gated, last) = call::ask(gate, request, c.trace, &full).await;
        {
            let mut ending = bound.ending.lock().unwrap_or_else(|p| p.into_inner());
            match last {
                Last::Cleared => ending.last_refusal = None,
                Last::Refused(reason, action) => ending.last_refusal = Some((reason, action)),
                Last::Unchanged => {}
            }
        }
        let (attempt, timeout) = match gated {
            Gated::NotMade(result) => return tool_result(result),
            Gated::Allowed { attempt, timeout } => (attempt, timeout),
        };
        let allowed = Allowed {
            run: run.clone(),
            gate: gate.clone(),
            server: server.to_owned(),
            tool: tool.to_owned(),
            attempt,
            timeout,
            effect,
        };
        let called = allowed.make(&self.shared, &bound.ending, arguments).await;
        answer(called, &full, server, timeout)
    }
}

/// A call the gate allowed.
struct Allowed {
    run: String,
    gate: Gate,
    server: String,
    tool: String,
    attempt: u64,
    timeout: std::time::Duration,
    effect: tally_record::Effect,
}

impl Allowed {
    /// Make the call on its server and record its outcome, in a task of its own: a
    /// session closed mid-call still records how the call ended.
    async fn make(
        self,
        shared: &Arc<Shared>,
        ending: &runs::Shared,
        arguments: serde_json::Map<String, Value>,
    ) -> Option<Called> {
        let (shared, ending) = (Arc::clone(shared), Arc::clone(ending));
        let made = tokio::spawn(async move {
            let backend = shared.backends.iter().find(|b| b.name == self.server)?;
            let called = backend.call(&self.tool, arguments, self.timeout).await;
            let (run, asker, attempt) = (&self.run, &shared.asker, self.attempt);
            let outcome = match &called {
                Called::Result(r) => {
                    let value = serde_json::to_value(r).unwrap_or(Value::Null);
                    call::answered(run, asker, attempt, Some(&value), None)
                }
                Called::Error(e) => {
                    let value = serde_json::to_value(e).unwrap_or(Value::Null);
                    call::answered(run, asker, attempt, None, Some(&value))
                }
                Called::Timeout => call::outcome(run, asker, attempt, Status::Timeout),
                Called::NotSent(_) => call::outcome(run, asker, attempt, Status::Error),
                Called::Lost(_) => {
                    if self.effect == tally_record::Effect::NonIdempotentWrite {
                        let mut e = ending.lock().unwrap_or_else(|p| p.into_inner());
                        e.unknown_write = true;
                    }
                    call::outcome(run, asker, attempt, Status::Unknown)
                }
            };
            self.gate.outcome(outcome);
            Some(called)
        });
        made.await.ok().flatten()
    }
}

/// What the client gets for a call that was made.
fn answer(
    called: Option<Called>,
    full: &str,
    server: &str,
    timeout: std::time::Duration,
) -> Result<CallToolResponse, ErrorData> {
    match called {
        Some(Called::Result(r)) => Ok(r.into()),
        Some(Called::Error(e)) => Err(e),
        Some(Called::Timeout) => tool_result(crate::reply::tool_error(
            format!("tally: {full} did not answer within {}, the time the gate allowed this call; its outcome is recorded as timeout. The tool may or may not have acted: check before calling it again.",
                tally_record::words::duration(timeout.as_millis() as u64)),
            None,
        )),
        Some(Called::NotSent(why)) => tool_result(crate::reply::tool_error(
            format!("tally: {server} could not be reached ({why}); the call was not sent and its outcome is recorded as error."),
            None,
        )),
        Some(Called::Lost(why)) => tool_result(crate::reply::tool_error(
            format!("tally: the connection to {server} failed during this call ({why}); its outcome is recorded as unknown. The tool may or may not have acted: check before calling it again."),
            None,
        )),
        None => Err(internal("the call's task ended")),
    }
}

fn tool_result(result: Value) -> Result<CallToolResponse, ErrorData> {
    serde_json::from_value::<CallToolResult>(result)
        .map(Into::into)
        .map_err(|e| internal(&format!("a tool result could not be written: {e}")))
}
