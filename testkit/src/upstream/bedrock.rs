//! The fake's Bedrock Converse: `/model/MODEL/converse` answers a Converse response
//! (`output.message`, `stopReason`, `usage`: `fake-usage-I-O-R-W` reports R cache-read
//! and W cache-write input tokens beside I input and O output), and
//! `/model/MODEL/converse-stream` the same as AWS event-stream frames
//! (`application/vnd.amazon.eventstream`: `messageStart`, `contentBlockDelta`s,
//! `contentBlockStop`, `messageStop`, `metadata` with the usage), framed by smithy-rs's
//! encoder. `fake-bad-crc` sends a `metadata` frame whose message CRC is wrong,
//! `fake-bad-frame` an event of a type ConverseStream never sends, each after two good
//! frames; neither is billed (no usage reaches the client). `fake-cut-frame` ends its
//! body cleanly halfway through its `metadata` frame; `fake-exception` sends a
//! `throttlingException` frame after two good frames, then a `metadata` event anyway;
//! `fake-metadata-twice` sends a `metadata` event of a million tokens each way (its
//! total wrong) and then one of a token each: none of these is billed either.
//!
//! Each call must be signed (SigV4, service `bedrock`, region [`AWS_REGION`]) with
//! [`AWS_CREDENTIAL`]: the signature is recomputed by botocore, AWS's Python SDK, from
//! the request as received ([`SIGV4_CHECK`]), an implementation independent of the one
//! the proxy signs with.

use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use bytes::Bytes;
use serde_json::{json, Value};

use super::reply::{End, Reply};

/// The AWS credential the fake's Bedrock accepts, as a `bedrock` upstream's credential
/// file holds it: `ACCESS_KEY_ID:SECRET_ACCESS_KEY:SESSION_TOKEN`.
pub const AWS_CREDENTIAL: &str =
    "AKIAFAKEBEDROCK12345:fake/Secret+Access+Key0123456789abcdefghij:FakeSessionToken//abc+def=";

/// The region its calls must be signed for.
pub const AWS_REGION: &str = "us-east-1";

/// The check of one request's signature, in Python with botocore: the request as JSON
/// on stdin (`method`, `url`, `headers` as `[name, value]` pairs, `body` in base64),
/// exit 0 if its `Authorization` is AWS4-HMAC-SHA256 by the expected key for
/// `bedrock` in the region, over `host`, `x-amz-date`, `content-type` and the session
/// token, with a signature botocore computes the same, dated within 15 minutes.
pub const SIGV4_CHECK: &str = include_str!("sigv4_check.py");

/// One request as the check reads it.
pub(super) fn check_input(
    method: &str,
    url: &str,
    headers: &hyper::HeaderMap,
    body: &[u8],
) -> String {
    use base64::Engine;
    let encode = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let pairs: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    json!({"method": method, "url": url, "headers": pairs, "body": encode(body),
           "credential": AWS_CREDENTIAL, "region": AWS_REGION})
    .to_string()
}

/// Whether the request's signature checks out, by botocore ([`SIGV4_CHECK`]); false if
/// python3 cannot run it.
pub(super) fn signed(input: String) -> bool {
    use std::io::Write;
    let child = std::process::Command::new("python3")
        .args(["-c", SIGV4_CHECK])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn();
    let Ok(mut child) = child else {
        return false;
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input.as_bytes());
    }
    child.wait().is_ok_and(|s| s.success())
}

/// 403 `InvalidSignatureException`, as Bedrock answers a call it cannot verify.
pub(super) fn invalid_signature() -> hyper::Response<super::Body> {
    let mut r = super::answer::full(
        hyper::StatusCode::FORBIDDEN,
        json!({"message": "The request signature we calculated does not match the signature you provided."}),
    );
    r.headers_mut().insert(
        "x-amzn-errortype",
        hyper::header::HeaderValue::from_static("InvalidSignatureException"),
    );
    r
}

/// A Bedrock model path's model id (`%3A` and `%2F` decoded) and whether it streams.
pub(super) fn bedrock_path(path: &str) -> Option<(String, bool)> {
    let p = path.split('?').next().unwrap_or("");
    let (model, method) = p.strip_prefix("/model/")?.split_once('/')?;
    let stream = match method {
        "converse" => false,
        "converse-stream" => true,
        _ => return None,
    };
    let model = model
        .replace("%3A", ":")
        .replace("%3a", ":")
        .replace("%2F", "/")
        .replace("%2f", "/");
    Some((model, stream))
}

impl Reply<'_> {
    /// `usage`: `n.input` input, `n.output` output, `n.third` cache-read and `n.fourth`
    /// cache-write tokens, and their total.
    fn converse_usage(&self) -> Value {
        let n = self.n;
        let mut u = json!({"inputTokens": n.input, "outputTokens": n.output,
                           "totalTokens": n.input + n.output + n.third + n.fourth});
        if n.third > 0 {
            u["cacheReadInputTokens"] = json!(n.third);
        }
        if n.fourth > 0 {
            u["cacheWriteInputTokens"] = json!(n.fourth);
        }
        u
    }

    fn stop_reason(&self) -> &'static str {
        if self.end == End::AtLimit {
            "max_tokens"
        } else {
            "end_turn"
        }
    }

    /// The whole answer.
    pub(super) fn converse(&self) -> Value {
        json!({"output": {"message": {"role": "assistant", "content": [{"text": self.text}]}},
               "stopReason": self.stop_reason(), "usage": self.converse_usage(),
               "metrics": {"latencyMs": 1}})
    }

    /// The stream's frames: the text in `pieces` deltas, then the stop and the usage;
    /// `fake-bad-crc` and `fake-bad-frame` go wrong after two.
    pub(super) fn converse_frames(&self, pieces: usize) -> Vec<Bytes> {
        // A text block has no contentBlockStart (its `start` names a tool use only).
        let mut events = vec![("messageStart", json!({"role": "assistant"}))];
        for d in self.deltas(pieces) {
            events.push((
                "contentBlockDelta",
                json!({"contentBlockIndex": 0, "delta": {"text": d}}),
            ));
        }
        events.push(("contentBlockStop", json!({"contentBlockIndex": 0})));
        events.push(("messageStop", json!({"stopReason": self.stop_reason()})));
        events.push((
            "metadata",
            json!({"usage": self.converse_usage(), "metrics": {"latencyMs": 1}}),
        ));
        let mut frames: Vec<Bytes> = events.iter().map(|(k, v)| frame(k, v)).collect();
        match self.model {
            "fake-bad-crc" => {
                let mut bad = frame("metadata", &json!({"usage": self.converse_usage()})).to_vec();
                let n = bad.len();
                bad[n - 1] ^= 0xff;
                frames.truncate(2);
                frames.push(Bytes::from(bad));
            }
            "fake-bad-frame" => {
                frames.truncate(2);
                frames.push(frame(
                    "surpriseEvent",
                    &json!({"usage": self.converse_usage()}),
                ));
            }
            "fake-cut-frame" => {
                let last = frames.pop().expect("metadata");
                frames.push(last.slice(..last.len() / 2));
            }
            "fake-exception" => {
                let last = frames.pop().expect("metadata");
                frames.truncate(2);
                frames.push(exception("throttlingException"));
                frames.push(last);
            }
            "fake-metadata-twice" => {
                let small =
                    json!({"usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}});
                let huge = json!({"usage": {"inputTokens": 1_000_000, "outputTokens": 1_000_000, "totalTokens": 5}});
                frames.pop();
                frames.push(frame("metadata", &huge));
                frames.push(frame("metadata", &small));
            }
            _ => {}
        }
        frames
    }
}

/// An exception frame of type `kind`, as Bedrock sends one mid-stream.
fn exception(kind: &str) -> Bytes {
    encoded(
        (":exception-type", kind),
        "exception",
        &json!({"message": "slow down"}),
    )
}

/// One event frame of type `kind` with a JSON payload.
fn frame(kind: &str, payload: &Value) -> Bytes {
    encoded((":event-type", kind), "event", payload)
}

/// One event-stream frame: its type header (`name`, `kind`), its message type, and
/// `payload` as JSON.
fn encoded(
    (name, kind): (&'static str, &str),
    message_type: &'static str,
    payload: &Value,
) -> Bytes {
    let m = Message::new(Bytes::from(payload.to_string()))
        .add_header(Header::new(
            name,
            HeaderValue::String(kind.to_owned().into()),
        ))
        .add_header(Header::new(
            ":content-type",
            HeaderValue::String("application/json".into()),
        ))
        .add_header(Header::new(
            ":message-type",
            HeaderValue::String(message_type.into()),
        ));
    let mut out = Vec::new();
    write_message_to(&m, &mut out).expect("an event-stream frame");
    Bytes::from(out)
}
