//! Server to client: answers to allowed calls are recorded as outcomes, and the `initialize`
//! and `tools/list` answers teach the server's name and the tools' annotations; everything is
//! forwarded as it came.

use super::*;

/// One message from the server, on its way to the client. The server is the operator's
/// own: its messages are read leniently and always forwarded.
pub(super) fn from_server(shared: &Shared, message: &RawValue) {
    let env = serde_json::from_str::<Value>(message.get()).unwrap_or_default();
    let method = env.get("method").and_then(Value::as_str);
    match (method, env.get("id")) {
        (None, Some(id)) => {
            let k = key(id);
            let mut state = shared.state();
            if let Some(reply) = state.own.remove(&k) {
                drop(state);
                let _ = reply.send(env);
                return; // the proxy's own request: the client never sees it
            }
            let asked = state.asked.remove(&k);
            if state.expired.remove(&k) {
                return; // answered late: the client already has the timeout result
            }
            match asked {
                Some(Asked::Call) => {
                    if let Some(p) = state.pending.remove(&k) {
                        drop(state);
                        p.timer.abort();
                        let o = crate::call::answered(
                            &shared.options.run,
                            &shared.options.asker(),
                            p.attempt,
                            env.get("result"),
                            env.get("error"),
                        );
                        shared.gate.outcome(o);
                    }
                }
                Some(Asked::Initialize) => {
                    let init = env
                        .get("result")
                        .cloned()
                        .map(serde_json::from_value::<InitializeResult>);
                    if let Some(Ok(init)) = init {
                        if state.server_name.is_none() {
                            state.server_name = Some(init.server_info.name);
                        }
                    }
                }
                Some(Asked::ToolsList) => {
                    if let Some(result) = env.get("result").cloned() {
                        learn_tools(&mut state, result);
                    }
                }
                Some(Asked::Other) | None => {}
            }
        }
        (Some(_), Some(id)) => {
            // The server's own request: the client's answer to it may pass.
            shared.state().server_asked.insert(key(id));
        }
        (Some("notifications/tools/list_changed"), None) => {
            // Annotations may have changed: learn them again when next needed.
            shared.state().tools.clear();
        }
        _ => {}
    }
    shared.to_client.send(message.get().to_owned());
}

pub(super) fn learn_tools(state: &mut State, result: Value) {
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
