//! One answer of the fake upstream in each API's words: Chat Completions, Responses and
//! Messages, JSON and streamed, ending as the model chose, at the request's limit, or
//! failed.

use serde_json::{json, Value};

use super::request::Numbers;
use super::ToolCall;

/// The request fields that carry an output limit.
pub(super) const LIMIT_FIELDS: [&str; 3] =
    ["max_tokens", "max_completion_tokens", "max_output_tokens"];

/// How an answer ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum End {
    /// As the model chose.
    Done,
    /// Cut at the request's output limit.
    AtLimit,
    /// Failed mid-answer (Responses: `response.failed`).
    Failed,
}

/// One answer, in each API's words.
pub(super) struct Reply<'a> {
    pub(super) model: &'a str,
    /// The billing tier that served it, said where the request named one.
    pub(super) tier: Option<&'a str>,
    pub(super) n: Numbers,
    pub(super) call: Option<&'a (usize, ToolCall)>,
    pub(super) text: &'a str,
    /// A script's text is streamed as it is; the models' own answers stream `w0 w1 ...`.
    pub(super) scripted: bool,
    pub(super) end: End,
}

/// `text` in `pieces` parts (at least one), as a stream sends it.
pub(super) fn split(text: &str, pieces: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(pieces.max(1)).max(1);
    let mut out: Vec<String> = chars.chunks(size).map(|c| c.iter().collect()).collect();
    if out.is_empty() {
        out.push(String::new());
    }
    out
}

impl Reply<'_> {
    /// The text's deltas, as a stream sends them.
    pub(super) fn deltas(&self, pieces: usize) -> Vec<String> {
        if self.scripted {
            split(self.text, pieces)
        } else {
            (0..pieces).map(|i| format!("w{i} ")).collect()
        }
    }

    pub(super) fn arguments(&self) -> String {
        self.call
            .map(|(_, c)| c.input.to_string())
            .unwrap_or_default()
    }

    pub(super) fn anthropic_usage(&self) -> Value {
        let n = self.n;
        let mut u = json!({"input_tokens": n.input, "output_tokens": n.output});
        if n.third > 0 {
            u["cache_creation_input_tokens"] = json!(n.third);
            u["cache_creation"] = json!({
                "ephemeral_5m_input_tokens": n.third.saturating_sub(n.fourth),
                "ephemeral_1h_input_tokens": n.fourth});
        }
        if n.searches > 0 {
            u["server_tool_use"] = json!({"web_search_requests": n.searches});
        }
        if let Some(t) = self.tier {
            u["service_tier"] = json!(t);
        }
        u
    }

    /// `v` with the top-level `service_tier` OpenAI answers carry, where one is said.
    pub(super) fn tiered(&self, mut v: Value) -> Value {
        if let Some(t) = self.tier {
            v["service_tier"] = json!(t);
        }
        v
    }

    pub(super) fn chat_usage(&self) -> Value {
        let n = self.n;
        let mut u = json!({"prompt_tokens": n.input, "completion_tokens": n.output, "total_tokens": n.input + n.output});
        if n.third > 0 {
            u["prompt_tokens_details"] = json!({"cached_tokens": n.third.min(n.input)});
        }
        if n.fourth > 0 {
            u["completion_tokens_details"] = json!({"reasoning_tokens": n.fourth.min(n.output)});
        }
        u
    }

    pub(super) fn responses_usage(&self) -> Value {
        let n = self.n;
        json!({"input_tokens": n.input,
               "input_tokens_details": {"cached_tokens": n.third.min(n.input)},
               "output_tokens": n.output,
               "output_tokens_details": {"reasoning_tokens": n.fourth.min(n.output)},
               "total_tokens": n.input + n.output})
    }

    /// Anthropic's content block (`tool_use` or `text`) and its stop reason.
    pub(super) fn block(&self) -> (Value, &'static str) {
        match self.call {
            Some((k, c)) => (
                json!({"type": "tool_use", "id": format!("toolu_fake_{k}"), "name": c.name, "input": c.input}),
                "tool_use",
            ),
            None if self.end == End::AtLimit => {
                (json!({"type": "text", "text": self.text}), "max_tokens")
            }
            None => (json!({"type": "text", "text": self.text}), "end_turn"),
        }
    }

    pub(super) fn message(&self) -> Value {
        let (block, stop) = self.block();
        json!({"id": "msg_fake", "type": "message", "role": "assistant", "model": self.model,
               "content": [block], "stop_reason": stop, "stop_sequence": null,
               "usage": self.anthropic_usage()})
    }

    pub(super) fn message_events(&self, pieces: usize) -> Vec<(Option<&'static str>, Value)> {
        // The input (and cache writes) in message_start; the output in the delta.
        let mut start_usage = self.anthropic_usage();
        start_usage["output_tokens"] = json!(1);
        if let Some(u) = start_usage.as_object_mut() {
            u.remove("server_tool_use");
        }
        let (_, stop) = self.block();
        let (opened, deltas) = match self.call {
            Some((k, c)) => (
                json!({"type": "tool_use", "id": format!("toolu_fake_{k}"), "name": c.name, "input": {}}),
                split(&self.arguments(), pieces)
                    .into_iter()
                    .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
                    .collect::<Vec<_>>(),
            ),
            None => (
                json!({"type": "text", "text": ""}),
                self.deltas(pieces)
                    .into_iter()
                    .map(|t| json!({"type": "text_delta", "text": t}))
                    .collect(),
            ),
        };
        let mut ev = vec![
            (
                Some("message_start"),
                json!({"type": "message_start", "message": {"id": "msg_fake", "type": "message", "role": "assistant", "model": self.model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": start_usage}}),
            ),
            (
                Some("content_block_start"),
                json!({"type": "content_block_start", "index": 0, "content_block": opened}),
            ),
            (Some("ping"), json!({"type": "ping"})),
        ];
        for d in deltas {
            ev.push((
                Some("content_block_delta"),
                json!({"type": "content_block_delta", "index": 0, "delta": d}),
            ));
        }
        ev.push((
            Some("content_block_stop"),
            json!({"type": "content_block_stop", "index": 0}),
        ));
        let mut delta_usage = json!({"output_tokens": self.n.output});
        if self.n.searches > 0 {
            delta_usage["server_tool_use"] = json!({"web_search_requests": self.n.searches});
        }
        ev.push((
            Some("message_delta"),
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": delta_usage}),
        ));
        ev.push((Some("message_stop"), json!({"type": "message_stop"})));
        ev
    }

    pub(super) fn completion(&self) -> Value {
        let (message, finish) = match self.call {
            Some((k, c)) => (
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_fake_{k}"), "type": "function", "function": {"name": c.name, "arguments": self.arguments()}}]}),
                "tool_calls",
            ),
            None if self.end == End::AtLimit => {
                (json!({"role": "assistant", "content": self.text}), "length")
            }
            None => (json!({"role": "assistant", "content": self.text}), "stop"),
        };
        self.tiered(json!({"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": self.model,
               "choices": [{"index": 0, "message": message, "finish_reason": finish}],
               "usage": self.chat_usage()}))
    }

    pub(super) fn completion_chunks(
        &self,
        pieces: usize,
        include_usage: bool,
    ) -> Vec<(Option<&'static str>, Value)> {
        let chunk = |delta: Value, finish: Value| {
            let mut c = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": self.model,
                               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
            if include_usage {
                c["usage"] = Value::Null;
            }
            c
        };
        let mut ev = Vec::new();
        let finish = match self.call {
            Some((k, c)) => {
                ev.push((None, chunk(json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": format!("call_fake_{k}"), "type": "function", "function": {"name": c.name, "arguments": ""}}]}), Value::Null)));
                for p in split(&self.arguments(), pieces) {
                    ev.push((
                        None,
                        chunk(
                            json!({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}),
                            Value::Null,
                        ),
                    ));
                }
                "tool_calls"
            }
            None => {
                ev.push((
                    None,
                    chunk(json!({"role": "assistant", "content": ""}), Value::Null),
                ));
                for t in self.deltas(pieces) {
                    ev.push((None, chunk(json!({"content": t}), Value::Null)));
                }
                if self.end == End::AtLimit {
                    "length"
                } else {
                    "stop"
                }
            }
        };
        ev.push((None, chunk(json!({}), json!(finish))));
        if include_usage {
            ev.push((None, self.tiered(json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": self.model, "choices": [],
                                  "usage": self.chat_usage()}))));
        }
        ev
    }

    /// The Responses API's output item, complete.
    pub(super) fn item(&self) -> Value {
        match self.call {
            Some((k, c)) => {
                json!({"type": "function_call", "id": format!("fc_fake_{k}"), "call_id": format!("call_fake_{k}"),
                                   "name": c.name, "arguments": self.arguments(), "status": "completed"})
            }
            None => {
                json!({"type": "message", "id": "msg_fake", "status": "completed", "role": "assistant",
                           "content": [{"type": "output_text", "text": self.text, "annotations": []}]})
            }
        }
    }

    /// A Responses API `response` object: under way (`in_progress`), with neither output
    /// nor usage; or at its end, with both: `completed`, `incomplete` (cut at the limit:
    /// `incomplete_details.reason` `max_output_tokens`), or `failed` (an `error`, no
    /// output, the usage only where the model's name gives it).
    pub(super) fn response(&self, done: bool) -> Value {
        let (status, incomplete, error) = match (done, self.end) {
            (false, _) => ("in_progress", Value::Null, Value::Null),
            (true, End::Done) => ("completed", Value::Null, Value::Null),
            (true, End::AtLimit) => (
                "incomplete",
                json!({"reason": "max_output_tokens"}),
                Value::Null,
            ),
            (true, End::Failed) => (
                "failed",
                Value::Null,
                json!({"code": "server_error", "message": "The model failed to generate a response."}),
            ),
        };
        let failed = self.end == End::Failed;
        let usage = if done && !(failed && self.n.input + self.n.output == 0) {
            self.responses_usage()
        } else {
            Value::Null
        };
        let output = if done && !failed {
            json!([self.item()])
        } else {
            json!([])
        };
        self.tiered(
            json!({"id": "resp_fake", "object": "response", "created_at": 1, "status": status,
               "model": self.model, "error": error, "incomplete_details": incomplete,
               "instructions": null, "metadata": {}, "parallel_tool_calls": true,
               "temperature": 1.0, "top_p": 1.0, "tool_choice": "auto", "tools": [],
               "text": {"format": {"type": "text"}},
               "output": output, "usage": usage}),
        )
    }

    pub(super) fn response_events(&self, pieces: usize) -> Vec<(Option<&'static str>, Value)> {
        let mut ev: Vec<(&'static str, Value)> = vec![
            (
                "response.created",
                json!({"response": self.response(false)}),
            ),
            (
                "response.in_progress",
                json!({"response": self.response(false)}),
            ),
        ];
        let item = self.item();
        match self.call {
            Some((k, c)) => {
                let id = format!("fc_fake_{k}");
                ev.push(("response.output_item.added", json!({"output_index": 0,
                    "item": {"type": "function_call", "id": id, "call_id": format!("call_fake_{k}"), "name": c.name, "arguments": "", "status": "in_progress"}})));
                for p in split(&self.arguments(), pieces) {
                    ev.push((
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": 0, "delta": p}),
                    ));
                }
                ev.push((
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": 0, "name": c.name, "arguments": self.arguments()}),
                ));
            }
            None => {
                let part =
                    |text: &str| json!({"type": "output_text", "text": text, "annotations": []});
                ev.push(("response.output_item.added", json!({"output_index": 0,
                    "item": {"type": "message", "id": "msg_fake", "status": "in_progress", "role": "assistant", "content": []}})));
                ev.push((
                    "response.content_part.added",
                    json!({"item_id": "msg_fake", "output_index": 0, "content_index": 0, "part": part("")}),
                ));
                for d in split(self.text, pieces) {
                    ev.push((
                        "response.output_text.delta",
                        json!({"item_id": "msg_fake", "output_index": 0, "content_index": 0, "delta": d, "logprobs": []}),
                    ));
                }
                ev.push((
                    "response.output_text.done",
                    json!({"item_id": "msg_fake", "output_index": 0, "content_index": 0, "text": self.text, "logprobs": []}),
                ));
                ev.push((
                    "response.content_part.done",
                    json!({"item_id": "msg_fake", "output_index": 0, "content_index": 0, "part": part(self.text)}),
                ));
            }
        }
        ev.push((
            "response.output_item.done",
            json!({"output_index": 0, "item": item}),
        ));
        let last = match self.end {
            End::Done => "response.completed",
            End::AtLimit => "response.incomplete",
            End::Failed => "response.failed",
        };
        ev.push((last, json!({"response": self.response(true)})));
        ev.into_iter()
            .enumerate()
            .map(|(i, (name, mut data))| {
                data["type"] = json!(name);
                data["sequence_number"] = json!(i);
                (Some(name), data)
            })
            .collect()
    }
}
