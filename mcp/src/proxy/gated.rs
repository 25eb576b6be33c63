//! A `tools/call` through the gate: checked before it is forwarded, answered by the proxy
//! when it is not made, its outcome recorded when the server answers or the call expires.

use super::server::learn_tools;
use super::*;
use crate::call::{Gated, Last};

pub(super) fn outcome(options: &Options, attempt: u64, status: Status) -> OutcomeRequest {
    crate::call::outcome(&options.run, &options.asker(), attempt, status)
}

/// A `tools/call`: asked of the gate first; forwarded, as the bytes classified, only on
/// an allow.
pub(super) async fn call(shared: &Shared, id: Id, c: Call, line: String) {
    let id_value = id.to_value();
    let server = shared.state().server_name.clone();
    let Some(server) = server else {
        return not_made(shared, &id_value, "tally mcp has not seen the server's initialize answer, so it cannot name the tool for the gate: the call was not made. Initialize the session first (or start tally mcp with --server-name).".into());
    };
    let tool = format!("{server}/{}", c.name);
    let args = match crate::call::args(c.arguments) {
        Ok((a, _)) => a,
        Err(e) => {
            return shared.to_client.send(reply::error(
                &id_value,
                -32602,
                &format!("tally mcp: the call's arguments cannot be digested ({e}); the call was not forwarded"),
                None,
            ))
        }
    };
    let effect = effect(shared, &c.name, &tool).await;
    let request = crate::call::check_request(
        &shared.options.run,
        &shared.options.asker(),
        tool.clone(),
        args,
        effect,
    );
    let (gated, last) = crate::call::ask(&shared.gate, request, c.trace, &tool).await;
    match last {
        Last::Cleared => shared.state().last_refusal = None,
        Last::Refused(reason, action) => shared.state().last_refusal = Some((reason, action)),
        Last::Unchanged => {}
    }
    match gated {
        Gated::Allowed { attempt, timeout } => forward(
            shared,
            &id,
            &id_value,
            (attempt, timeout),
            tool,
            effect,
            line,
        ),
        Gated::NotMade(result) => shared
            .to_client
            .send(json!({"jsonrpc": "2.0", "id": id_value, "result": result}).to_string()),
    }
}

/// An allowed call: pending under its attempt, its timer started, the line forwarded to
/// the server as it was classified.
fn forward(
    shared: &Shared,
    id: &Id,
    id_value: &Value,
    (attempt, timeout): (u64, Duration),
    tool: String,
    effect: tally_record::decision::Effect,
    line: String,
) {
    let timer = tokio::spawn(expire(shared.clone(), id_value.clone(), timeout)).abort_handle();
    let k = id.key();
    let mut state = shared.state();
    state.asked.insert(k.clone(), Asked::Call);
    state.pending.insert(
        k,
        Pending {
            attempt,
            tool,
            effect,
            cancelled: false,
            timer,
        },
    );
    drop(state);
    shared.to_server.send(line);
}

pub(super) fn not_made(shared: &Shared, id: &Value, text: String) {
    shared.to_client.send(reply::not_made(id, None, text));
}

/// No answer in time: the outcome is `timeout`, the server is told to cancel, and the
/// client (unless it cancelled itself) gets an error result.
pub(super) async fn expire(shared: Shared, id: Value, after: Duration) {
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
    shared.to_server.send(cancel.to_string());
    if !p.cancelled {
        let text = format!(
            "tally: {} did not answer within {}, the time the gate allowed this call; it was cancelled and its outcome recorded as timeout. The tool may or may not have acted: check before calling it again.",
            p.tool,
            tally_record::words::duration(after.as_millis() as u64)
        );
        not_made(&shared, &id, text);
    }
}

/// The effect a call is checked under: the map's, else the tool's annotations (asking
/// the server for its tool list if the client has not), else a non-idempotent write.
pub(super) async fn effect(shared: &Shared, name: &str, tool: &str) -> Effect {
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

/// The proxy's own `tools/list`, every page, under ids no request in flight uses.
pub(super) async fn list_tools(shared: &Shared) {
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut state = shared.state();
            let id = loop {
                state.next_own += 1;
                let id = Value::String(format!("tally-mcp-{}", state.next_own));
                if !state.asked.contains_key(&key(&id)) {
                    break id;
                }
            };
            state.own.insert(key(&id), tx);
            id
        };
        let mut request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"});
        if let Some(c) = &cursor {
            request["params"] = json!({ "cursor": c });
        }
        shared.to_server.send(request.to_string());
        let Ok(Ok(env)) = tokio::time::timeout(LIST_TIMEOUT, rx).await else {
            shared.state().own.remove(&key(&id));
            log("the server did not answer the proxy's tools/list: unlisted tools count as non-idempotent writes");
            return;
        };
        let Some(result) = env.get("result").cloned() else {
            return;
        };
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
