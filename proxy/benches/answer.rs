//! The usage read of a model's answer, side by side in one run: the proxy's reader
//! (`tally_proxy::usage::answer`: the answer read once, only the members the usage
//! readers look at kept) against reading the same answer into a whole
//! `serde_json::Value`, which is what the proxy did before (and only part of it: the
//! readers then looked the usage up in that value, not timed here, so the ratio is the
//! least the whole reading cost more). Answers of 50, 100 and 200 KB as real ones are:
//! most of their bytes the model's text and its tool calls' inputs (Messages `text` and
//! `tool_use` blocks; Chat's message with `tool_calls`; Gemini's parts with
//! `functionCall`s), the usage last.
//!
//! ```text
//! cargo bench -p tally-proxy --bench answer     # TALLY_BENCH_SECS=0.3 per measurement
//! ```
//! Each line alternates the two readers, five rounds, and gives the median time to read
//! one answer.

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tally_proxy::request::Endpoint;
use tally_proxy::usage::{answer, Reported};

fn secs() -> Duration {
    Duration::from_secs_f64(
        std::env::var("TALLY_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0.3),
    )
}

/// A paragraph of a model's prose: words, punctuation, a newline and quotes to escape,
/// a few characters past ASCII; `i` makes each differ.
fn prose(i: usize) -> String {
    format!(
        "Step {i}: the test in `src/lib.rs` fails because the parser reads \"0.10\" as 0.1 and \
         drops the digits the digest needs. I will change `read_number` to keep the text, then \
         run the suite again — café, naïve, 数字.\nNext, the fixture at line {} needs the same fix; \
         the rest passes as before. ",
        i * 7
    )
}

/// A tool call's input as agents send them: a command, a path, an edit with code.
fn tool_input(i: usize) -> Value {
    json!({
        "command": format!("cargo test -p crate{i} -- --nocapture"),
        "path": format!("/home/agent/repo/src/module_{i}/mod.rs"),
        "old_string": format!("fn read_number(s: &str) -> f64 {{\n    s.parse().unwrap_or(0.0) // {i}\n}}"),
        "new_string": format!("fn read_number(s: &str) -> Number {{\n    Number::exact(s) // {i}\n}}"),
        "options": {"timeout_ms": 120000 + i, "env": {"RUST_LOG": "debug"}, "flags": ["-q", "--locked"]},
    })
}

/// An answer of `endpoint` of at least `bytes`: text and tool calls in turn, the usage.
fn answer_of(endpoint: Endpoint, bytes: usize) -> Vec<u8> {
    let mut i = 0;
    let mut body = Vec::new();
    let mut text = String::new();
    let mut calls = Vec::new();
    while body.len() < bytes {
        for _ in 0..4 {
            text.push_str(&prose(i));
        }
        calls.push((i, tool_input(i)));
        i += 1;
        let v = match endpoint {
            Endpoint::Messages => {
                let mut content = Vec::new();
                for (k, input) in &calls {
                    content.push(json!({"type": "text", "text": prose(*k)}));
                    content.push(json!({"type": "tool_use", "id": format!("toolu_{k:024}"), "name": "edit", "input": input}));
                }
                content.insert(0, json!({"type": "text", "text": text}));
                json!({"id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                       "content": content, "stop_reason": "tool_use", "stop_sequence": null,
                       "usage": {"input_tokens": 12000, "cache_read_input_tokens": 30000, "output_tokens": 9000,
                                 "service_tier": "standard"}})
            }
            Endpoint::ChatCompletions => {
                let tool_calls: Vec<Value> = calls
                    .iter()
                    .map(|(k, input)| {
                        json!({"id": format!("call_{k}"), "type": "function",
                        "function": {"name": "edit", "arguments": input.to_string()}})
                    })
                    .collect();
                json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1765000000, "model": "gpt-4.1",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": text,
                                    "tool_calls": tool_calls}, "finish_reason": "tool_calls"}],
                       "usage": {"prompt_tokens": 42000, "completion_tokens": 9000,
                                 "prompt_tokens_details": {"cached_tokens": 30000}},
                       "service_tier": "default"})
            }
            _ => {
                let mut parts = vec![json!({"text": text})];
                for (_, input) in &calls {
                    parts.push(json!({"functionCall": {"name": "edit", "args": input}}));
                }
                json!({"candidates": [{"content": {"parts": parts, "role": "model"}, "finishReason": "STOP", "index": 0}],
                       "usageMetadata": {"promptTokenCount": 42000, "candidatesTokenCount": 9000, "totalTokenCount": 51000},
                       "modelVersion": "gemini-2.5-pro"})
            }
        };
        body = serde_json::to_vec(&v).expect("JSON");
    }
    body
}

/// The time to read `body` once with `read`, measured over about [`secs`].
fn each(body: &[u8], read: &dyn Fn(&[u8]) -> bool) -> Duration {
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < secs() {
        assert!(black_box(read(black_box(body))));
        n += 1;
    }
    start.elapsed() / n
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    println!("| answer | bytes | whole Value, µs | the proxy's reader, µs | whole / reader |");
    println!("|---|---|---|---|---|");
    for (name, endpoint) in [
        ("messages", Endpoint::Messages),
        ("chat", Endpoint::ChatCompletions),
        ("gemini", Endpoint::GenerateContent),
    ] {
        for kb in [50, 100, 200] {
            let body = answer_of(endpoint, kb * 1024);
            let whole = |b: &[u8]| serde_json::from_slice::<Value>(b).is_ok();
            let pruned = |b: &[u8]| matches!(answer(endpoint, b).0, Reported::Usage(_));
            assert!(whole(&body) && pruned(&body), "{name} {kb} KB reads");
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for _ in 0..5 {
                a.push(each(&body, &whole));
                b.push(each(&body, &pruned));
            }
            let (a, b) = (median(a), median(b));
            println!(
                "| {name} | {} | {:.1} | {:.1} | {:.2} |",
                body.len(),
                a.as_secs_f64() * 1e6,
                b.as_secs_f64() * 1e6,
                a.as_secs_f64() / b.as_secs_f64()
            );
        }
    }
}
