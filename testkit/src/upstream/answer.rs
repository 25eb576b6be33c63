//! How the fake upstream answers one request: what it asked, kept in [`Seen`]; the key
//! checked; the answers chosen by model name alone (redirects, errors); the usage its
//! model (or script) reports; then the answer in its API's dialect ([`Reply`]), whole or
//! streamed, billed once its usage reached the client.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::http::request::Parts;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};

use super::reply::{End, Reply, LIMIT_FIELDS};
use super::request::{
    api_of, gemini_path, has_tools, images, key_at, numbers_after, tool_results, Api, KeyAt,
    Numbers,
};
use super::{Billed, Body, Script, Seen, State};

/// What one request asks, as the fake reads it.
struct Asked {
    /// Its path (and query).
    path: String,
    /// Its body as JSON (`null` if it is not).
    json: Value,
    api: Api,
    /// Whether its API is Anthropic's.
    anthropic: bool,
    /// Its `model`, empty if none.
    model: String,
    /// Whether it asked for a stream.
    stream: bool,
}

impl Asked {
    fn read(parts: &Parts, bytes: &[u8]) -> Asked {
        let json: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default();
        let api = api_of(&path);
        let mut model = json.get("model").and_then(Value::as_str).map(str::to_owned);
        let mut stream = json.get("stream").and_then(Value::as_bool).unwrap_or(false);
        if let Some((m, s)) = gemini_path(&path).or_else(|| super::bedrock::bedrock_path(&path)) {
            // Gemini, Bedrock: the model and the stream are the path's.
            (model, stream) = (Some(m), s);
        }
        if model.is_none() {
            // Azure OpenAI: the deployment in the path.
            model = path
                .strip_prefix("/openai/deployments/")
                .and_then(|p| p.split('/').next())
                .map(str::to_owned);
        }
        Asked {
            path,
            api,
            anthropic: matches!(api, Api::Messages | Api::CountTokens),
            model: model.unwrap_or_default(),
            stream,
            json,
        }
    }
}

impl State {
    pub(super) async fn answer(&self, req: Request<Incoming>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let asked = Asked::read(&parts, &bytes);
        let real_key = match key_at(&asked.path, asked.api) {
            KeyAt::Sigv4 if self.unsigned_ok.load(std::sync::atomic::Ordering::SeqCst) => true,
            KeyAt::Sigv4 => signed(&parts, &bytes).await,
            at => self.real_key(&parts, at, &asked.path),
        };
        self.keep_seen(&parts, &asked, real_key, &bytes);
        if !real_key && asked.api == Api::Bedrock {
            return super::bedrock::invalid_signature();
        }
        if !real_key {
            return unauthorized(asked.anthropic);
        }
        if let Some(r) = self.redirected(&asked.model) {
            return r;
        }
        if let Some(r) = by_name(&asked) {
            return r;
        }
        let script = self
            .scripts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&asked.model)
            .cloned();
        let (n, at_limit) = numbers(&asked, script.as_ref());
        if asked.api == Api::CountTokens {
            // Counting is free: an answer with no usage, nothing billed.
            return full(StatusCode::OK, json!({"input_tokens": n.input}));
        }
        self.reply(&asked, script.as_ref(), n, at_limit).await
    }

    /// Whether the request carries the real key where its API puts it, and in no other
    /// key header (nor, for Gemini, a `key=` query).
    fn real_key(&self, parts: &Parts, at: KeyAt, path: &str) -> bool {
        let bearer = format!("Bearer {}", self.key);
        let (name, want) = match at {
            KeyAt::Bearer | KeyAt::Sigv4 => ("authorization", bearer.as_str()),
            KeyAt::XApiKey => ("x-api-key", self.key.as_str()),
            KeyAt::Goog => ("x-goog-api-key", self.key.as_str()),
            KeyAt::Azure => ("api-key", self.key.as_str()),
        };
        let others = ["authorization", "x-api-key", "x-goog-api-key", "api-key"]
            .iter()
            .filter(|n| **n != name)
            .all(|n| parts.headers.get(*n).is_none());
        let query_key = path
            .split_once('?')
            .is_some_and(|(_, q)| q.split('&').any(|kv| kv.starts_with("key=")));
        header(parts, name) == want && others && !query_key
    }

    /// Keep what the request carried, for the test to read ([`Seen`]).
    fn keep_seen(&self, parts: &Parts, asked: &Asked, real_key: bool, body: &[u8]) {
        let body_len = body.len();
        let json = &asked.json;
        let token_seen = asked.path.contains("tly_")
            || parts
                .headers
                .values()
                .any(|v| String::from_utf8_lossy(v.as_bytes()).contains("tly_"));
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Seen {
                method: parts.method.to_string(),
                path: asked.path.clone(),
                real_key,
                token_seen,
                headers: parts
                    .headers
                    .keys()
                    .map(|k| k.as_str().to_owned())
                    .collect(),
                model: json.get("model").and_then(Value::as_str).map(str::to_owned),
                max_tokens: json
                    .get("max_tokens")
                    .or_else(|| json.get("max_completion_tokens"))
                    .or_else(|| json.get("max_output_tokens"))
                    .or_else(|| json.pointer("/generationConfig/maxOutputTokens"))
                    .or_else(|| json.pointer("/inferenceConfig/maxTokens"))
                    .and_then(Value::as_u64),
                limit_fields: LIMIT_FIELDS
                    .iter()
                    .filter(|k| json.get(**k).is_some())
                    .map(|k| (*k).to_owned())
                    .collect(),
                stream_options: json.get("stream_options").map(|v| v.to_string()),
                stream: asked.stream,
                body_len,
                body: String::from_utf8_lossy(body).into_owned(),
                trace: ["traceparent", "tracestate"]
                    .iter()
                    .flat_map(|n| parts.headers.get_all(*n).iter())
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                    .collect(),
            });
    }

    /// A 302 to the `Location` a test gave this model ([`super::FakeUpstream::redirect`]),
    /// byte for byte.
    fn redirected(&self, model: &str) -> Option<Response<Body>> {
        let to = self
            .redirects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(model)
            .cloned()?;
        Some(
            Response::builder()
                .status(StatusCode::FOUND)
                .header(
                    "location",
                    hyper::header::HeaderValue::from_bytes(&to).expect("a header value"),
                )
                .body(Full::new(Bytes::new()).map_err(|e| match e {}).boxed())
                .expect("response"),
        )
    }

    /// The model's answer, in the request's API's dialect, whole or streamed; billed once
    /// its usage has reached the client.
    async fn reply(
        &self,
        asked: &Asked,
        script: Option<&Script>,
        n: Numbers,
        at_limit: bool,
    ) -> Response<Body> {
        let (api, json, model) = (asked.api, &asked.json, asked.model.as_str());
        // The turn: the script's next tool call while the agent offers tools, else text.
        let call = script.and_then(|s| {
            let k = tool_results(api, json);
            (has_tools(json) && k < s.calls.len()).then(|| (k, s.calls[k].clone()))
        });
        let text = script.map_or("hello from the fake upstream".to_owned(), |s| {
            s.then.clone()
        });
        let cut = model == "fake-cut";
        // A failed response bills what its usage says, if it says anything.
        let failed = model.starts_with("fake-failed");
        let unbilled = failed && n.input + n.output == 0;
        let tier = tier(asked);
        // Billed once the answer's usage has reached the client: never for a cut answer or
        // one with no usage, a stream only at its end (not one the client left).
        let broken = matches!(model, "fake-huge-event" | "fake-bad-crc" | "fake-bad-frame");
        let billed = (!cut && !unbilled && !broken).then(|| Billed {
            path: asked.path.clone(),
            model: model.to_owned(),
            tier: tier.clone(),
            ..billed(api, n)
        });
        let log = Arc::clone(&self.billed);
        let bill: AtEnd = Box::new(move || {
            if let Some(b) = billed {
                log.lock().unwrap_or_else(|e| e.into_inner()).push(b);
            }
        });
        let reply = Reply {
            model,
            tier: tier.as_deref(),
            n,
            call: call.as_ref(),
            text: &text,
            scripted: script.is_some(),
            end: if failed {
                End::Failed
            } else if at_limit {
                End::AtLimit
            } else {
                End::Done
            },
        };
        if asked.stream {
            stream(asked, &reply, bill)
        } else {
            whole(asked, &reply, bill).await
        }
    }
}

/// Whether a Bedrock request is signed by the fake's AWS credential (botocore's check,
/// on a thread of its own), with no other key header.
async fn signed(parts: &Parts, body: &[u8]) -> bool {
    let others = ["x-api-key", "x-goog-api-key", "api-key"]
        .iter()
        .all(|n| parts.headers.get(*n).is_none());
    let host = header(parts, "host");
    let url = format!(
        "http://{host}{}",
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
    );
    let input = super::bedrock::check_input(parts.method.as_str(), &url, &parts.headers, body);
    others
        && tokio::task::spawn_blocking(move || super::bedrock::signed(input))
            .await
            .unwrap_or(false)
}

/// A request header's value, empty if it has none (or none in text).
fn header(parts: &Parts, name: &str) -> String {
    parts
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// 401, as the request's API says a wrong key.
fn unauthorized(anthropic: bool) -> Response<Body> {
    let e = if anthropic {
        json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}})
    } else {
        json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "invalid_api_key", "param": null}})
    };
    full(StatusCode::UNAUTHORIZED, e)
}

/// The answers a model's name alone chooses: 429, 500, a redirect; none for the others.
fn by_name(asked: &Asked) -> Option<Response<Body>> {
    let model = asked.model.as_str();
    match model {
        "fake-429" => {
            let mut r = full(
                StatusCode::TOO_MANY_REQUESTS,
                json!({"error": {"message": "slow down", "type": "rate_limit_error"}}),
            );
            r.headers_mut()
                .insert("retry-after", hyper::header::HeaderValue::from_static("2"));
            Some(r)
        }
        m if m.starts_with("fake-failed") && !(asked.api == Api::Responses && asked.stream) => {
            Some(full(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": {"message": "upstream broke", "type": "server_error"}}),
            ))
        }
        "fake-500" => Some(full(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": {"message": "upstream broke", "type": "server_error"}}),
        )),
        "fake-redirect" | "fake-redirect-same" => {
            let to = if model == "fake-redirect" {
                "http://127.0.0.2:1/elsewhere"
            } else {
                "/v1/elsewhere"
            };
            Some(
                Response::builder()
                    .status(StatusCode::FOUND)
                    .header("location", to)
                    .body(Full::new(Bytes::new()).map_err(|e| match e {}).boxed())
                    .expect("response"),
            )
        }
        _ => None,
    }
}

/// The usage the answer reports, as its model's name (or its script) says; and whether
/// the answer stops at the request's limit, short of what it would say.
fn numbers(asked: &Asked, script: Option<&Script>) -> (Numbers, bool) {
    let (api, json) = (asked.api, &asked.json);
    let n = match asked.model.as_str() {
        // Failed with no usage at all.
        "fake-failed" => Numbers::default(),
        m if m.starts_with("fake-failed-") => {
            let mut next = numbers_after(m, "fake-failed-");
            Numbers {
                input: next(),
                output: next(),
                ..Numbers::default()
            }
        }
        m if m.starts_with("fake-usage-") => {
            let mut next = numbers_after(m, "fake-usage-");
            Numbers {
                input: next(),
                output: next(),
                third: next(),
                fourth: next(),
                searches: 0,
            }
        }
        m if m.starts_with("fake-images-") => {
            let each = numbers_after(m, "fake-images-")();
            Numbers {
                input: 100 + each * images(api, json),
                output: 50,
                ..Numbers::default()
            }
        }
        m if m.starts_with("fake-bill-tools-") => {
            let mut next = numbers_after(m, "fake-bill-tools-");
            let (tool_prompt, searches) = (next(), next());
            Numbers {
                input: 100 + if has_tools(json) { tool_prompt } else { 0 },
                output: 50,
                searches,
                ..Numbers::default()
            }
        }
        _ => {
            let (input, output) = script.map_or((100, 50), |s| s.usage);
            // As a real API: never more output than the request's limit.
            let limit = LIMIT_FIELDS
                .iter()
                .find_map(|k| json.get(*k).and_then(Value::as_u64))
                .or_else(|| {
                    json.pointer("/generationConfig/maxOutputTokens")
                        .or_else(|| json.pointer("/inferenceConfig/maxTokens"))
                        .and_then(Value::as_u64)
                })
                .unwrap_or(u64::MAX);
            let at_limit = script.is_none() && limit < output;
            let n = Numbers {
                input,
                output: output.min(limit),
                ..Numbers::default()
            };
            return (n, at_limit);
        }
    };
    (n, false)
}

/// The tier that serves the answer: the one named, else (`auto`, none) the model's.
fn tier(asked: &Asked) -> Option<String> {
    let (json, anthropic) = (&asked.json, asked.anthropic);
    match json.get("service_tier").and_then(Value::as_str) {
        Some("default") if !anthropic => Some("default".to_owned()),
        Some("standard_only") => Some("standard".to_owned()),
        Some(t) if t != "auto" => Some(t.to_owned()),
        _ => asked
            .model
            .strip_prefix("fake-tier-")
            .map(str::to_owned)
            .or_else(|| {
                json.get("service_tier")
                    .map(|_| if anthropic { "standard" } else { "default" }.to_owned())
            }),
    }
}

/// The usage `n` by class of token, as the API's bill counts it.
fn billed(api: Api, n: Numbers) -> Billed {
    match api {
        Api::Bedrock => Billed {
            input: n.input,
            cached: n.third,
            written: n.fourth,
            output: n.output,
            ..Billed::default()
        },
        Api::Messages => Billed {
            input: n.input,
            written: n.third.saturating_sub(n.fourth),
            written_1h: n.fourth.min(n.third),
            output: n.output,
            web_searches: n.searches,
            ..Billed::default()
        },
        _ => Billed {
            input: n.input - n.third.min(n.input),
            cached: n.third.min(n.input),
            output: n.output,
            reasoning: n.fourth.min(n.output),
            ..Billed::default()
        },
    }
}

/// The answer as one JSON body (`fake-cut`: cut mid-body; `fake-slow`: after 10 s),
/// billed as it is sent.
async fn whole(asked: &Asked, reply: &Reply<'_>, bill: AtEnd) -> Response<Body> {
    let body = match asked.api {
        Api::Messages => reply.message(),
        Api::Responses => reply.response(true),
        Api::Gemini => reply.gemini(),
        Api::Bedrock => reply.converse(),
        _ => reply.completion(),
    };
    let text = Bytes::from(body.to_string());
    if asked.model == "fake-cut" {
        // A length promised, half of it sent, then the connection cut.
        let half = text.slice(..text.len() / 2);
        return Response::builder()
            .header("content-type", "application/json")
            .header("content-length", text.len())
            .body(streamed(vec![half], Duration::ZERO, true, None))
            .expect("response");
    }
    if asked.model == "fake-slow" {
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    bill();
    full(StatusCode::OK, body)
}

/// The answer as its API streams it, billed at the stream's end (`fake-cut`: cut after 2
/// chunks; `fake-slow`: 50 chunks, 200 ms apart; `fake-huge-event`: an event that never
/// ends).
fn stream(asked: &Asked, reply: &Reply<'_>, bill: AtEnd) -> Response<Body> {
    let (cut, slow) = (asked.model == "fake-cut", asked.model == "fake-slow");
    let pieces = if slow { 50 } else { 3 };
    let mut chunks = match asked.api {
        Api::Messages => sse(&reply.message_events(pieces)),
        Api::Responses => sse(&reply.response_events(pieces)),
        Api::Gemini => sse(&reply.gemini_chunks(pieces)),
        Api::Bedrock => reply.converse_frames(pieces),
        _ => {
            let include_usage = asked
                .json
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let mut c = sse(&reply.completion_chunks(pieces, include_usage));
            c.push(Bytes::from_static(b"data: [DONE]\n\n"));
            c
        }
    };
    if cut {
        chunks.truncate(2);
    }
    if asked.model == "fake-huge-event" {
        // After its first events, one event that never ends: 17 MiB of data in 1 MiB
        // chunks, no blank line (a stream no API sends).
        chunks.truncate(1);
        chunks.push(Bytes::from_static(b"data: "));
        chunks.extend((0..17).map(|_| Bytes::from(vec![b'x'; 1 << 20])));
    }
    let every = if slow {
        Duration::from_millis(200)
    } else if cut {
        Duration::from_millis(20)
    } else {
        Duration::ZERO
    };
    let content_type = if asked.api == Api::Bedrock {
        "application/vnd.amazon.eventstream"
    } else {
        "text/event-stream"
    };
    Response::builder()
        .header("content-type", content_type)
        .header("cache-control", "no-cache")
        .body(streamed(chunks, every, cut, Some(bill)))
        .expect("response")
}

pub(super) fn full(status: StatusCode, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(
            Full::new(Bytes::from(body.to_string()))
                .map_err(|e| match e {})
                .boxed(),
        )
        .expect("response")
}

/// What to do once a body has been sent to its end (the fake's bill of an answer).
type AtEnd = Box<dyn FnOnce() + Send + Sync>;

/// A body of `chunks`, each after `every`, then `end`: `Ok` ends it cleanly (then
/// `at_end` runs: the client read it all), `Err` cuts the connection.
fn streamed(chunks: Vec<Bytes>, every: Duration, cut: bool, at_end: Option<AtEnd>) -> Body {
    let s = futures::stream::unfold(
        (chunks.into_iter(), cut, false, at_end),
        move |(mut it, cut, done, at_end)| async move {
            if done {
                return None;
            }
            match it.next() {
                Some(c) => {
                    if !every.is_zero() {
                        tokio::time::sleep(every).await;
                    }
                    Some((Ok(Frame::data(c)), (it, cut, false, at_end)))
                }
                None if cut => {
                    // What was sent reaches the client (hyper flushes it) before the cut.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Some((
                        Err(std::io::Error::other("cut by the fake upstream")),
                        (it, cut, true, at_end),
                    ))
                }
                None => {
                    if let Some(f) = at_end {
                        f();
                    }
                    None
                }
            }
        },
    );
    StreamBody::new(s).boxed()
}

fn sse(events: &[(Option<&str>, Value)]) -> Vec<Bytes> {
    events
        .iter()
        .map(|(name, data)| {
            Bytes::from(match name {
                Some(n) => format!("event: {n}\ndata: {data}\n\n"),
                None => format!("data: {data}\n\n"),
            })
        })
        .collect()
}
