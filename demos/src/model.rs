//! `tally demo`'s model story: an agent calls a model through tally's proxy in a loop,
//! holding only its run's token, until its spend budget stops it. The model API is an
//! OpenAI-style endpoint on loopback in this process (no network): it answers every call
//! with the same usage and counts which key each call carried.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

use tally_api::GateClient;

use crate::error::{bail, Context, Result};
use crate::output::outln;

/// The run the story's model calls count against.
pub const RUN: &str = "model-agent";
/// The story's upstream, as the policy names it.
const UPSTREAM: &str = "openai";
/// The name of the upstream's credential (the daemon holds its secret).
pub const CREDENTIAL: &str = "openai";
/// The model, and what every call of it uses: 1,000 tokens in, 500 out.
const MODEL: &str = "demo-model";
const INPUT_TOKENS: u64 = 1000;
const OUTPUT_TOKENS: u64 = 500;
/// The run's budget, cents.
const BUDGET_CENTS: u64 = 20;

/// The policy's part for the story: the upstream and the model's prices (10 and 40
/// dollars per million tokens: a call of 1,000 tokens in and 500 out costs 3¢).
pub fn policy(upstream: &str) -> String {
    format!(
        "[upstreams.{UPSTREAM}]\nurl = \"{upstream}\"\nkind = \"openai\"\ncredential = \"{CREDENTIAL}\"\n\
         paths = [\"/v1/chat/completions\"]\n\
         [prices.{UPSTREAM}.\"{MODEL}\"]\ninput_per_mtok = \"10\"\noutput_per_mtok = \"40\"\n\
         max_output_tokens = 4096\n"
    )
}

/// What the model API saw.
#[derive(Default, Debug)]
struct Seen {
    /// Calls that carried the operator's key.
    with_key: u64,
    /// Calls that carried anything else (the agent's token, no key).
    without: u64,
}

/// The model API on loopback: `POST /v1/chat/completions` answered with a completion of
/// `OUTPUT_TOKENS` tokens (at most the request's `max_tokens`) and its usage, for the
/// operator's key only (401 otherwise, as the real API answers).
pub struct FakeModel {
    addr: SocketAddr,
    key: String,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeModel {
    /// Listen on 127.0.0.1 (a port the system picks), accepting `key`.
    pub async fn start(key: &str) -> Result<FakeModel> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("the demo's model API cannot listen on loopback")?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (k, s) = (format!("Bearer {key}"), Arc::clone(&seen));
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (k, s) = (k.clone(), Arc::clone(&s));
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        answer(req, k.clone(), Arc::clone(&s))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(FakeModel {
            addr,
            key: key.to_owned(),
            seen,
            task,
        })
    }

    /// Its base URL, for the policy.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The operator's key (the credential the daemon is given).
    pub fn key(&self) -> &str {
        &self.key
    }

    fn seen(&self) -> (u64, u64) {
        let s = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        (s.with_key, s.without)
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    req: Request<hyper::body::Incoming>,
    key: String,
    seen: Arc<Mutex<Seen>>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let authorized = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .is_some_and(|v| v.as_bytes() == key.as_bytes());
    let path_ok = req.uri().path() == "/v1/chat/completions";
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    {
        let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
        if authorized {
            s.with_key += 1;
        } else {
            s.without += 1;
        }
    }
    let reply = |status: StatusCode, v: Value| {
        let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
        *r.status_mut() = status;
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        Ok(r)
    };
    if !authorized {
        return reply(
            StatusCode::UNAUTHORIZED,
            json!({"error": {"message": "invalid API key", "type": "invalid_request_error", "code": "invalid_api_key"}}),
        );
    }
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if !path_ok || request["model"] != MODEL {
        return reply(
            StatusCode::NOT_FOUND,
            json!({"error": {"message": "no such model or route", "type": "invalid_request_error"}}),
        );
    }
    let output = request["max_tokens"]
        .as_u64()
        .map_or(OUTPUT_TOKENS, |m| m.min(OUTPUT_TOKENS));
    reply(
        StatusCode::OK,
        json!({
            "id": "chatcmpl-demo", "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "Next step planned."}}],
            "usage": {"prompt_tokens": INPUT_TOKENS, "completion_tokens": output,
                      "total_tokens": INPUT_TOKENS + output}
        }),
    )
}

/// What the proxy answered a call: status, tally's headers (`x-tally-*`) and the body.
struct Answer {
    status: StatusCode,
    tally: Vec<String>,
    body: Value,
}

/// One chat completion through the proxy at `proxy`, with `token` as the API key.
async fn complete(proxy: SocketAddr, token: &str, step: u64) -> Result<Answer> {
    let stream = tokio::net::TcpStream::connect(proxy)
        .await
        .with_context(|| format!("connecting to the proxy on {proxy}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    // A prompt as long as the tokens the model bills for it (about four bytes a token),
    // so the worst case the proxy reserves covers what the call costs.
    let context: String = (1..=INPUT_TOKENS / 25)
        .map(|i| format!("table t{i:03}: move to the new schema, keep its indexes.\n"))
        .collect();
    let body = json!({"model": MODEL, "max_tokens": OUTPUT_TOKENS,
        "messages": [{"role": "user", "content": format!("Plan step {step} of the migration.\n{context}")}]});
    let req = Request::post(format!("/{UPSTREAM}/v1/chat/completions"))
        .header(hyper::header::HOST, proxy.to_string())
        .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))?;
    let response = sender.send_request(req).await?;
    let status = response.status();
    let tally = response
        .headers()
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("x-tally-"))
        .map(|(k, v)| format!("{k}: {}", String::from_utf8_lossy(v.as_bytes())))
        .collect();
    let bytes = response.into_body().collect().await?.to_bytes();
    Ok(Answer {
        status,
        tally,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    })
}

/// Nanodollars as the ledger's money is shown (`$0.03`).
fn dollars(nanos: u64) -> String {
    tally_record::money::Nanos(nanos).to_string()
}

/// A run's settled spend in nanodollars, from its standing.
/// The run once its calls are settled: the proxy records a call's outcome as its answer
/// ends, so the answer can arrive a moment before its settlement is durable. Waits for
/// nothing to be held (at most 5 s), never for a fixed time.
async fn settled_run(op: &mut GateClient) -> Result<tally_api::Standing> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let v = op.run(RUN).await?;
        if v.held_nanos == 0 || std::time::Instant::now() > until {
            return Ok(v);
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Tell the story against the gate on `socket` with its proxy on `proxy`; whether it went
/// as it must: calls allowed while the budget could pay for them, then refused with the
/// reason, spend within the budget, the model API never saw the token, and the token of
/// the stopped run no longer works.
pub async fn story(
    socket: &Path,
    operator_socket: &Path,
    proxy: SocketAddr,
    model: &FakeModel,
    verbose: bool,
) -> Result<bool> {
    let mut gate = GateClient::new(socket);
    let token = start_run(&mut gate, proxy).await?;
    let mut op = GateClient::new(operator_socket);
    let calls = call_until_refused(proxy, &token, &mut op, verbose).await?;
    let Some((reason, forbidden)) = calls.refusal else {
        outln!("  the budget never stopped the agent (see above)");
        return Ok(false);
    };
    let mut ok = forbidden;
    ok &= calls.allowed > 0 && calls.settled <= BUDGET_CENTS * 10_000_000;
    let _: Value = gate
        .post(&format!("/v1/runs/{RUN}/stop"), &json!({"reason": reason}))
        .await?;
    outln!(
        "  {}",
        crate::standing::standing(operator_socket, RUN).await?
    );
    let status = complete(proxy, &token, 0).await?.status;
    let (with_key, without) = model.seen();
    outln!(
        "The model API saw the operator's key on all {with_key} calls and the agent's token on none;"
    );
    outln!(
        "the stopped run's token is refused now (HTTP {}): it spent its run alone.",
        status.as_u16()
    );
    ok &= with_key == calls.allowed && without == 0 && status == StatusCode::FORBIDDEN;
    if !ok {
        outln!("  the proxy did not do as it must (see above)");
    }
    Ok(ok)
}

/// Start the story's run and say what the agent holds; the run's token.
async fn start_run(gate: &mut GateClient, proxy: SocketAddr) -> Result<String> {
    let started: Value = gate
        .post(
            "/v1/runs",
            &json!({"run": RUN, "goal": "plan the database migration",
                    "budget": {"spend_cents": BUDGET_CENTS}}),
        )
        .await
        .context("starting the model agent's run")?;
    let Some(token) = started["token"].as_str().map(str::to_owned) else {
        bail!("the gate gave the run no token: {started}");
    };
    outln!("An agent plans a migration with a model, step after step: run `{RUN}`, {BUDGET_CENTS}¢ to spend.");
    outln!(
        "It holds a run token ({}…), not the API key: OPENAI_BASE_URL=http://{proxy}/{UPSTREAM}/v1.",
        &token[..token.len().min(12)]
    );
    outln!(
        "The proxy reserves each call's worst case (input estimated, 500 tokens out), then settles its usage."
    );
    Ok(token)
}

/// The agent's calls until the budget refused one.
struct Calls {
    /// Calls the proxy let through.
    allowed: u64,
    /// The run's settled spend after the last allowed call, in nanos.
    settled: u64,
    /// The refusal's code, and whether it was the 403 it must be; none if never refused.
    refusal: Option<(String, bool)>,
}

/// Call the model step after step (at most 20), showing what each call settled, until
/// one is refused.
async fn call_until_refused(
    proxy: SocketAddr,
    token: &str,
    op: &mut GateClient,
    verbose: bool,
) -> Result<Calls> {
    let mut calls = Calls {
        allowed: 0,
        settled: 0,
        refusal: None,
    };
    for step in 1..=20 {
        let Answer {
            status,
            tally,
            body,
        } = complete(proxy, token, step).await?;
        if status != StatusCode::OK {
            let code = show_refusal(step, status, &body, verbose);
            calls.refusal = Some((code, status == StatusCode::FORBIDDEN));
            break;
        }
        calls.allowed += 1;
        let now = settled_run(op).await?.settled_nanos;
        outln!(
            "  call {step}: {} tokens in, {} out: {} settled ({} so far)",
            body["usage"]["prompt_tokens"],
            body["usage"]["completion_tokens"],
            dollars(now - calls.settled),
            dollars(now)
        );
        if verbose {
            outln!("    the proxy's headers: {}", tally.join(", "));
        }
        calls.settled = now;
    }
    Ok(calls)
}

/// Say how call `step` was refused, as the agent's SDK sees it; the refusal's code.
fn show_refusal(step: u64, status: StatusCode, body: &Value, verbose: bool) -> String {
    let code = body["error"]["code"].as_str().unwrap_or("?").to_owned();
    let action = body["error"]["action"].as_str().unwrap_or("?");
    outln!(
        "  call {step}: refused before it reached the model: HTTP {}, {code} (action {action})",
        status.as_u16()
    );
    outln!(
        "    the SDK raises {}: \"{}\"",
        if status == StatusCode::TOO_MANY_REQUESTS {
            "RateLimitError"
        } else {
            "PermissionDeniedError"
        },
        tally_verify::text::shown(body["error"]["message"].as_str().unwrap_or(""))
    );
    if verbose {
        outln!("    the answer's body, in OpenAI's error format: {body}");
    }
    outln!("    the budget cannot pay for another call; a human may grant more (`tally approve`)");
    code
}
