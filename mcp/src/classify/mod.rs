//! What a line from the client is, decided with certainty before anything reaches the
//! server, or refused.
//!
//! The rule is an allow-list, read strictly (docs/MCP.md, "What reaches the server"):
//! a line passes only if it is one JSON object, parsed under RFC 8259 with no duplicate
//! member name at any depth, no nesting deeper than [`MAX_DEPTH`], no raw line break,
//! and an envelope of exactly the JSON-RPC members (`jsonrpc` `"2.0"`, `id` a string or an
//! integer a double holds exactly, `method` one of [`REQUESTS`] or [`NOTIFICATIONS`]
//! byte for byte after unescaping). `tools/call` is classified as a [`Call`], for the gate.
//! Anything else is a [`Refused`], answered or dropped by the proxy and never forwarded.
//!
//! What passes is forwarded as [`Classified::line`]: the bytes received, with the three
//! characters some line readers split on inside a string (U+0085, U+2028, U+2029)
//! escaped, so that every JSON parser and every line reader sees the one message that
//! was classified here.

use std::fmt;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use strict::{strict, Top};

mod strict;

/// The longest line read, in bytes (rmcp's stdio limit); a longer one is dropped.
pub const MAX_LINE: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;
/// The deepest nesting of objects and arrays a message may have; the envelope itself is
/// level 1, its `params` level 2, a call's `arguments` level 3.
pub const MAX_DEPTH: usize = 64;
/// The largest integer id: the largest integer every JSON parser reads exactly (2^53 - 1).
pub const MAX_ID: i64 = (1 << 53) - 1;

/// The requests a client may send (MCP 2025-11-25, the official SDKs' `ClientRequest`).
pub const REQUESTS: &[&str] = &[
    "initialize",
    "ping",
    "completion/complete",
    "logging/setLevel",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "tools/call",
    "tools/list",
    "tasks/get",
    "tasks/result",
    "tasks/list",
    "tasks/cancel",
];

/// The notifications a client may send (MCP 2025-11-25's `ClientNotification`).
pub const NOTIFICATIONS: &[&str] = &[
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/roots/list_changed",
    "notifications/tasks/status",
];

/// The members a JSON-RPC envelope may have.
const ENVELOPE: &[&str] = &["jsonrpc", "id", "method", "params", "result", "error"];
/// The members of `tools/call` params that pass (`task` is refused on its own).
const CALL_PARAMS: &[&str] = &["name", "arguments", "_meta"];

/// A request id the proxy can match answers to exactly.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Id {
    /// An integer, `-MAX_ID..=MAX_ID`, written as such (`1`, not `1.0` or `1e0`).
    Number(i64),
    /// A string.
    String(String),
}

impl Id {
    /// Its JSON value.
    pub fn to_value(&self) -> Value {
        match self {
            Id::Number(n) => Value::from(*n),
            Id::String(s) => Value::String(s.clone()),
        }
    }

    /// Its canonical JSON text: the key answers are matched by (`1` and `"1"` differ).
    pub fn key(&self) -> String {
        self.to_value().to_string()
    }

    /// An id from a parsed value (as in `notifications/cancelled`'s `requestId`).
    pub fn from_value(v: &Value) -> Option<Id> {
        match v {
            Value::String(s) => Some(Id::String(s.clone())),
            Value::Number(n) => n
                .as_i64()
                .filter(|n| n.unsigned_abs() <= MAX_ID as u64)
                .map(Id::Number),
            _ => None,
        }
    }
}

/// A `tools/call`, as the gate is asked about it.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// The tool's name, exactly as the server reads it.
    pub name: String,
    /// Its arguments (absent or `null`: none).
    pub arguments: Map<String, Value>,
    /// The client's W3C trace context, `params._meta.traceparent` (and `tracestate`),
    /// when it is exactly valid (`tally_record::trace`): the gate's check is made its
    /// child. A malformed one is `None` (the check starts a fresh trace); the call is
    /// neither refused for it nor is the bad value passed to the gate.
    pub trace: Option<crate::gate::Trace>,
}

/// A message classified with certainty.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    /// A `tools/call` request: the gate decides first.
    Call {
        /// Its id.
        id: Id,
        /// What it calls.
        call: Call,
    },
    /// Any other request of [`REQUESTS`].
    Request {
        /// Its id.
        id: Id,
        /// Its method.
        method: &'static str,
    },
    /// A notification of [`NOTIFICATIONS`].
    Notification {
        /// Its method.
        method: &'static str,
        /// Its params, if any.
        params: Option<Value>,
    },
    /// An answer (`result` or `error`) to a request the server sent.
    Response {
        /// The id it answers.
        id: Id,
    },
}

/// A line that may be forwarded, and what it is.
#[derive(Clone, Debug, PartialEq)]
pub struct Classified {
    /// The bytes to forward (without the newline): exactly what was classified.
    pub line: String,
    /// What the line is.
    pub message: Message,
}

/// A line that is not forwarded.
#[derive(Clone, Debug, PartialEq)]
pub struct Refused {
    /// Why.
    pub why: Why,
    /// The ids to answer with an error: the request's usable id, every member's of a
    /// batch; none when the line has no usable id or is itself an answer (then it is
    /// only dropped).
    pub answer: Vec<Id>,
}

/// Why a line from the client is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Why {
    /// Longer than [`MAX_LINE`].
    TooLong,
    /// Not UTF-8.
    NotUtf8 {
        /// The byte offset of the first bad byte.
        at: usize,
    },
    /// A raw carriage return or line feed inside the line (a line reader that splits
    /// there would read two messages).
    LineBreak {
        /// Its byte offset.
        at: usize,
    },
    /// Not JSON (serde_json's message, with line and column; a byte order mark is this).
    NotJson(String),
    /// JSON, but not an object.
    NotAnObject,
    /// A JSON-RPC batch (an array): MCP 2025-06-18 removed batches; none is passed.
    Batch,
    /// A member name twice in one object.
    DuplicateKey {
        /// The name.
        key: String,
        /// Where the object is (`.params.arguments`, `[0]`; empty: the envelope).
        at: String,
    },
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep {
        /// Where the nesting passes the bound.
        at: String,
    },
    /// An envelope member JSON-RPC does not have.
    UnknownMember(String),
    /// `jsonrpc` missing or not `"2.0"`.
    NotJsonRpc2,
    /// The id is not one the proxy can match answers to exactly.
    BadId(&'static str),
    /// The envelope is neither a request, a notification nor an answer.
    Ambiguous(&'static str),
    /// `method` is not a string.
    MethodNotString,
    /// A request whose method is not one of [`REQUESTS`] byte for byte.
    UnknownMethod(String),
    /// A notification whose method is not one of [`NOTIFICATIONS`] byte for byte (a
    /// request method without an id is this too).
    UnknownNotification(String),
    /// The params are not what the method takes.
    BadParams(String),
    /// A request whose id is already the id of a request in flight (the client's, or
    /// the proxy's own): an answer could not be matched to one of them.
    IdInUse,
    /// An answer to no request the server has in flight.
    UnexpectedAnswer,
}

impl Why {
    /// A short code for programs (the `reason` in the error's data).
    pub fn code(&self) -> &'static str {
        match self {
            Why::TooLong => "line_too_long",
            Why::NotUtf8 { .. } => "not_utf8",
            Why::LineBreak { .. } => "line_break",
            Why::NotJson(_) => "not_json",
            Why::NotAnObject => "not_an_object",
            Why::Batch => "batch",
            Why::DuplicateKey { .. } => "duplicate_key",
            Why::TooDeep { .. } => "too_deep",
            Why::UnknownMember(_) => "unknown_member",
            Why::NotJsonRpc2 => "not_jsonrpc_2",
            Why::BadId(_) => "bad_id",
            Why::Ambiguous(_) => "ambiguous",
            Why::MethodNotString => "method_not_string",
            Why::UnknownMethod(_) => "unknown_method",
            Why::UnknownNotification(_) => "unknown_notification",
            Why::BadParams(_) => "bad_params",
            Why::IdInUse => "id_in_use",
            Why::UnexpectedAnswer => "unexpected_answer",
        }
    }

    /// The JSON-RPC error code it is answered with.
    pub fn rpc_code(&self) -> i64 {
        match self {
            Why::TooLong | Why::NotUtf8 { .. } | Why::LineBreak { .. } | Why::NotJson(_) => -32700,
            Why::UnknownMethod(_) | Why::UnknownNotification(_) => -32601,
            Why::BadParams(_) => -32602,
            _ => -32600,
        }
    }
}

/// A name from the client, shown safely (escaped, and cut if long).
fn shown(s: &str) -> String {
    let mut out: String = s.chars().take(64).flat_map(char::escape_debug).collect();
    if s.chars().count() > 64 {
        out.push('…');
    }
    format!("\"{out}\"")
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let envelope = |at: &str| {
            if at.is_empty() {
                "the envelope".to_string()
            } else {
                shown(at)
            }
        };
        match self {
            Why::TooLong => write!(f, "the line is longer than {MAX_LINE} bytes"),
            Why::NotUtf8 { at } => write!(f, "the line is not UTF-8 (byte {at})"),
            Why::LineBreak { at } => write!(
                f,
                "the line holds a raw line break (byte {at}): a server reading lines would read two messages"
            ),
            Why::NotJson(e) => write!(f, "the line is not one JSON value ({e})"),
            Why::NotAnObject => write!(f, "the message is not a JSON object"),
            Why::Batch => write!(
                f,
                "a JSON-RPC batch: MCP has no batches since 2025-06-18; send each message on its own line"
            ),
            Why::DuplicateKey { key, at } => {
                write!(f, "the member {} appears twice in {}", shown(key), envelope(at))
            }
            Why::TooDeep { at } => write!(
                f,
                "the message nests deeper than {MAX_DEPTH} levels (at {})",
                envelope(at)
            ),
            Why::UnknownMember(k) => write!(
                f,
                "the envelope has a member {} that JSON-RPC does not (jsonrpc, id, method, params, result, error)",
                shown(k)
            ),
            Why::NotJsonRpc2 => write!(f, "\"jsonrpc\" is missing or not \"2.0\""),
            Why::BadId(why) => write!(f, "the id {why}"),
            Why::Ambiguous(why) => write!(f, "the message {why}"),
            Why::MethodNotString => write!(f, "\"method\" is not a string"),
            Why::UnknownMethod(m) => write!(
                f,
                "the method {} is not one tally mcp passes (methods are matched byte for byte)",
                shown(m)
            ),
            Why::UnknownNotification(m) => write!(
                f,
                "the notification {} is not one tally mcp passes (a request needs an id)",
                shown(m)
            ),
            Why::BadParams(why) => write!(f, "the params are not valid: {why}"),
            Why::IdInUse => write!(
                f,
                "the id is that of a request still in flight; a new request needs a new id"
            ),
            Why::UnexpectedAnswer => write!(
                f,
                "the message answers no request the server has in flight"
            ),
        }
    }
}

/// Classify one line (without its `\n`; one trailing `\r` is taken as part of the line
/// end).
pub fn classify(line: &[u8]) -> Result<Classified, Refused> {
    let drop = |why: Why| Refused {
        why,
        answer: Vec::new(),
    };
    if line.len() > MAX_LINE {
        return Err(drop(Why::TooLong));
    }
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = std::str::from_utf8(line).map_err(|e| {
        drop(Why::NotUtf8 {
            at: e.valid_up_to(),
        })
    })?;
    if let Some(at) = text.find(['\r', '\n']) {
        return Err(drop(Why::LineBreak { at }));
    }
    let text = escape_separators(text);
    let message = match serde_json::from_str::<Top<'_>>(&text) {
        Ok(Top::Object(members)) => envelope(&members)?,
        Ok(Top::Array(members)) => {
            return Err(Refused {
                why: Why::Batch,
                answer: members
                    .iter()
                    .filter_map(|m| match classify_object(m.get()) {
                        Ok(Message::Call { id, .. } | Message::Request { id, .. }) => {
                            Some(vec![id])
                        }
                        Ok(_) => None,
                        Err(r) => Some(r.answer),
                    })
                    .flatten()
                    .collect(),
            })
        }
        Ok(Top::Other) => return Err(drop(Why::NotAnObject)),
        Err(e) => return Err(drop(Why::NotJson(e.to_string()))),
    };
    Ok(Classified {
        line: text,
        message,
    })
}

/// A whole body read as the classifier reads a line (UTF-8, RFC 8259, no duplicate
/// member name, nesting bounded), into one value: what every conforming parser reads
/// of it, member names unescaped. Not classified: a batch is an array here.
pub fn strict_body(body: &[u8]) -> Result<Value, Why> {
    let text = std::str::from_utf8(body).map_err(|e| Why::NotUtf8 {
        at: e.valid_up_to(),
    })?;
    strict::strict_top(text)
}

/// A batch member: an object is classified like a line; anything else is refused.
fn classify_object(text: &str) -> Result<Message, Refused> {
    match serde_json::from_str::<Top<'_>>(text) {
        Ok(Top::Object(members)) => envelope(&members),
        _ => Err(Refused {
            why: Why::NotAnObject,
            answer: Vec::new(),
        }),
    }
}

/// U+0085, U+2028 and U+2029 can only be inside a JSON string (they are not JSON
/// whitespace), where `\uXXXX` means the same: escaped, no line reader splits there.
fn escape_separators(text: &str) -> String {
    if !text.contains(['\u{85}', '\u{2028}', '\u{2029}']) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\u{85}' | '\u{2028}' | '\u{2029}' => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// The envelope, member by member.
fn envelope(members: &[(String, &RawValue)]) -> Result<Message, Refused> {
    // The id first, so that whatever else is wrong can be answered under it.
    let ids: Vec<&RawValue> = members
        .iter()
        .filter(|(k, _)| k == "id")
        .map(|(_, v)| *v)
        .collect();
    let answers = !members.iter().any(|(k, _)| k == "result" || k == "error");
    let id = match ids.as_slice() {
        [raw] => Some(id_of(raw)),
        _ => None,
    };
    let usable = match &id {
        Some(Ok(id)) if answers => vec![id.clone()],
        _ => Vec::new(),
    };
    let refuse = |why: Why| Refused {
        why,
        answer: usable.clone(),
    };

    known_members(members).map_err(&refuse)?;
    let get = |name: &str| -> Result<Option<Value>, Refused> {
        let Some((_, raw)) = members.iter().find(|(k, _)| k == name) else {
            return Ok(None);
        };
        strict(raw.get(), name).map(Some).map_err(&refuse)
    };
    let jsonrpc = get("jsonrpc")?;
    let method = get("method")?;
    let params = get("params")?;
    let result = get("result")?;
    let error = get("error")?;
    if jsonrpc.as_ref().and_then(Value::as_str) != Some("2.0") {
        return Err(refuse(Why::NotJsonRpc2));
    }
    let id = match id {
        Some(Ok(id)) => Some(id),
        Some(Err(why)) => return Err(refuse(why)),
        None => None,
    };
    match (method, result, error) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => Err(refuse(Why::Ambiguous(
            "has both a method and a result or error",
        ))),
        (None, Some(_), Some(_)) => Err(refuse(Why::Ambiguous("has both a result and an error"))),
        (None, None, None) => Err(refuse(Why::Ambiguous(
            "has no method, result or error: it is neither a request nor an answer",
        ))),
        (None, result, error) => answer(id, &params, &result, &error).map_err(refuse),
        (Some(method), None, None) => request(id, method, params).map_err(refuse),
    }
}

/// Each member once, and each one the envelope may hold.
fn known_members(members: &[(String, &RawValue)]) -> Result<(), Why> {
    let mut seen: Vec<&str> = Vec::with_capacity(members.len());
    for (k, _) in members {
        if seen.contains(&k.as_str()) {
            return Err(Why::DuplicateKey {
                key: k.clone(),
                at: String::new(),
            });
        }
        if !ENVELOPE.contains(&k.as_str()) {
            return Err(Why::UnknownMember(k.clone()));
        }
        seen.push(k);
    }
    Ok(())
}

/// An answer: its id, no params, and an object for its result or error.
fn answer(
    id: Option<Id>,
    params: &Option<Value>,
    result: &Option<Value>,
    error: &Option<Value>,
) -> Result<Message, Why> {
    let Some(id) = id else {
        return Err(Why::BadId("is missing from an answer"));
    };
    if params.is_some() {
        return Err(Why::Ambiguous("is an answer with params"));
    }
    if result.as_ref().is_some_and(|r| !r.is_object())
        || error.as_ref().is_some_and(|e| !e.is_object())
    {
        return Err(Why::Ambiguous(
            "is an answer whose result or error is not an object",
        ));
    }
    Ok(Message::Response { id })
}

/// A request (with an id: a known method, a tool call read whole) or a notification
/// (without one), and its params.
fn request(id: Option<Id>, method: Value, params: Option<Value>) -> Result<Message, Why> {
    let Value::String(method) = method else {
        return Err(Why::MethodNotString);
    };
    match id {
        Some(id) => {
            let Some(&known) = REQUESTS.iter().find(|m| **m == method) else {
                return Err(Why::UnknownMethod(method));
            };
            if known == "tools/call" {
                let call = call(params).map_err(Why::BadParams)?;
                return Ok(Message::Call { id, call });
            }
            check_params(&params).map_err(Why::BadParams)?;
            Ok(Message::Request { id, method: known })
        }
        None => {
            let Some(&known) = NOTIFICATIONS.iter().find(|m| **m == method) else {
                return Err(Why::UnknownNotification(method));
            };
            check_params(&params).map_err(Why::BadParams)?;
            Ok(Message::Notification {
                method: known,
                params,
            })
        }
    }
}

/// An id: a string, or an integer every parser reads as the same integer, written in its
/// one canonical form.
fn id_of(raw: &RawValue) -> Result<Id, Why> {
    let text = raw.get();
    match strict(text, "id") {
        Ok(Value::String(s)) => Ok(Id::String(s)),
        Ok(Value::Null) => Err(Why::BadId("is null")),
        Ok(v @ Value::Number(_)) => match Id::from_value(&v) {
            Some(id) if id.key() == text => Ok(id),
            Some(_) => Err(Why::BadId("is not written as a plain integer")),
            None => Err(Why::BadId(
                "is a number that is not an integer of at most 2^53 - 1 (what every JSON parser reads exactly)",
            )),
        },
        Ok(_) => Err(Why::BadId("is not a string or an integer")),
        Err(why) => Err(why),
    }
}

/// Params other than `tools/call`'s: absent, `null` or an object.
fn check_params(params: &Option<Value>) -> Result<(), String> {
    match params {
        None | Some(Value::Null) | Some(Value::Object(_)) => Ok(()),
        Some(_) => Err("params must be an object".into()),
    }
}

/// `tools/call` params: exactly `name` (a string with no control character), and
/// optionally `arguments` and `_meta` (objects, or `null`).
fn call(params: Option<Value>) -> Result<Call, String> {
    let Some(Value::Object(params)) = params else {
        return Err("tools/call needs params, an object with the tool's name".into());
    };
    if params.contains_key("task") {
        return Err("a task-augmented tools/call (params.task) is not passed: tally mcp could not record its outcome; call the tool without `task`".into());
    }
    if let Some(k) = params.keys().find(|k| !CALL_PARAMS.contains(&k.as_str())) {
        return Err(format!(
            "tools/call params have a member {} (only name, arguments and _meta pass)",
            shown(k)
        ));
    }
    let name = match params.get("name") {
        Some(Value::String(n)) if n.is_empty() => return Err("the tool's name is empty".into()),
        Some(Value::String(n)) if n.chars().any(char::is_control) => {
            return Err(format!(
                "the tool's name {} has a control character",
                shown(n)
            ))
        }
        Some(Value::String(n)) => n.clone(),
        Some(_) => return Err("the tool's name is not a string".into()),
        None => return Err("tools/call params have no name".into()),
    };
    let arguments = match params.get("arguments") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(a)) => a.clone(),
        Some(_) => return Err("the arguments are not an object".into()),
    };
    let trace = match params.get("_meta") {
        None | Some(Value::Null) => None,
        Some(Value::Object(meta)) => {
            let text = |k: &str| match meta.get(k) {
                Some(Value::String(s)) => Some(s.as_str()),
                _ => None,
            };
            // Not a string, or not exactly valid: no parent (a fresh trace).
            tally_record::trace::incoming(text("traceparent"), text("tracestate"))
        }
        Some(_) => return Err("_meta is not an object".into()),
    };
    Ok(Call {
        name,
        arguments,
        trace,
    })
}
