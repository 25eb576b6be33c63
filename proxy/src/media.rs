//! Images and other media in a model request: where each API takes an image, how many a
//! request holds, and how many of the body's bytes are their encoded data.
//!
//! An image costs the input tokens the API counts for it, bounded per image by the
//! price's `image_tokens`, not by its bytes: a base64 image's data is many times its
//! tokens, so its data is left out of the body's byte bound and the image is reserved at
//! `image_tokens` instead. The rest of the part (its type, media type, punctuation)
//! stays in the byte bound; a URL (the upstream fetches it) stays in it too.
//!
//! Images are read only where each API takes them:
//!
//! * Anthropic Messages: `messages[i].content[j]` of type `image`, and the `content[k]`
//!   of a `tool_result` block there (a `source` of type `base64`, `url` or `file`);
//! * OpenAI Chat Completions: `messages[i].content[j]` of type `image_url` (an
//!   `image_url.url`);
//! * OpenAI Responses: `input[i].content[j]` of type `input_image`, and the `output[k]`
//!   of a `function_call_output` item (an `image_url` or a `file_id`).
//!
//! Anything else of a media type, at any depth (an image elsewhere; audio, files,
//! documents, video anywhere), is priced by a measure the policy has no price for, so
//! it is refused, naming where it is.

use std::collections::HashSet;

use serde_json::Value;

use crate::endpoint::{Endpoint, RequestError};

/// Content part types priced by a measure other than their bytes.
const MEDIA: &[&str] = &[
    "image_url",
    "input_image",
    "image",
    "input_audio",
    "audio",
    "audio_url",
    "file",
    "input_file",
    "document",
    "video",
    "video_url",
];

/// The images a request holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Images {
    /// How many.
    pub count: u64,
    /// The bytes of their base64 data (left out of the body's byte bound).
    pub data_bytes: u64,
    /// Where the first one is (`messages[0].content[1]`), as a refusal names it.
    pub first: Option<String>,
}

/// The images in `body`, a request to `endpoint`; refused where a media part is
/// anywhere an image is not read, or an image is not one the API takes.
pub fn images(endpoint: Endpoint, body: &Value) -> Result<Images, RequestError> {
    let mut found: Vec<(String, &Value)> = Vec::new();
    let kind = |v: &Value| v.get("type").and_then(Value::as_str).map(str::to_owned);
    match endpoint {
        Endpoint::Messages => {
            for (i, m) in parts(body, "messages") {
                for (j, c) in parts(m, "content") {
                    let at = format!("messages[{i}].content[{j}]");
                    match kind(c).as_deref() {
                        Some("image") => found.push((at, c)),
                        Some("tool_result") => {
                            for (k, r) in parts(c, "content") {
                                if kind(r).as_deref() == Some("image") {
                                    found.push((format!("{at}.content[{k}]"), r));
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        Endpoint::ChatCompletions => {
            for (i, m) in parts(body, "messages") {
                for (j, c) in parts(m, "content") {
                    if kind(c).as_deref() == Some("image_url") {
                        found.push((format!("messages[{i}].content[{j}]"), c));
                    }
                }
            }
        }
        Endpoint::Responses => {
            for (i, item) in parts(body, "input") {
                let key = match kind(item).as_deref() {
                    Some("function_call_output") => "output",
                    _ => "content",
                };
                for (j, c) in parts(item, key) {
                    if kind(c).as_deref() == Some("input_image") {
                        found.push((format!("input[{i}].{key}[{j}]"), c));
                    }
                }
            }
        }
        _ => {}
    }
    let mut out = Images {
        count: found.len() as u64,
        data_bytes: 0,
        first: found.first().map(|(at, _)| at.clone()),
    };
    for (at, part) in &found {
        out.data_bytes = out
            .data_bytes
            .saturating_add(data_bytes(endpoint, at, part)?);
    }
    // A set: each object walked is looked up once, not against every image found.
    let read: HashSet<*const Value> = found.iter().map(|(_, v)| *v as *const Value).collect();
    let mut path = Vec::new();
    elsewhere(body, &read, &mut path)?;
    Ok(out)
}

/// The bytes of an image part's base64 data (0 for a URL or a file id), checking it is
/// an image the API takes.
fn data_bytes(endpoint: Endpoint, at: &str, part: &Value) -> Result<u64, RequestError> {
    let bad = |why: &str| RequestError::Unpriced {
        field: at.to_owned(),
        why: format!("is an image tally cannot read ({why})"),
    };
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
    let inline = |url: &str| {
        if url.starts_with("data:") {
            url.len() as u64
        } else {
            0
        }
    };
    match endpoint {
        Endpoint::Messages => {
            let source = part.get("source").ok_or_else(|| bad("no `source`"))?;
            match text(source.get("type")).as_deref() {
                Some("base64") => text(source.get("data"))
                    .map(|d| d.len() as u64)
                    .ok_or_else(|| bad("a base64 `source` without its `data`")),
                Some("url") if text(source.get("url")).is_some() => Ok(0),
                Some("file") if text(source.get("file_id")).is_some() => Ok(0),
                _ => Err(bad("a `source` of type base64, url or file")),
            }
        }
        Endpoint::ChatCompletions => match part.get("image_url") {
            Some(Value::Object(o)) => text(o.get("url"))
                .map(|u| inline(&u))
                .ok_or_else(|| bad("an `image_url` without its `url`")),
            _ => Err(bad("an `image_url` object")),
        },
        _ => match (text(part.get("image_url")), text(part.get("file_id"))) {
            (Some(u), None) => Ok(inline(&u)),
            (None, Some(_)) => Ok(0),
            _ => Err(bad("one `image_url` or `file_id`")),
        },
    }
}

/// The elements of the list `v[key]` (none if it is not a list), numbered.
fn parts<'a>(v: &'a Value, key: &str) -> Vec<(usize, &'a Value)> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().enumerate().collect())
        .unwrap_or_default()
}

/// One step of the path to a value: a member's name or an item's place.
enum Step<'v> {
    Key(&'v str),
    Item(usize),
}

/// `path` as a refusal names it (`messages[0].content[1]`): rendered only for a refusal,
/// never for each value walked.
fn rendered(path: &[Step<'_>]) -> String {
    let mut at = String::new();
    for (n, step) in path.iter().enumerate() {
        match step {
            Step::Key(k) if n == 0 => at.push_str(k),
            Step::Key(k) => {
                at.push('.');
                at.push_str(k);
            }
            Step::Item(i) => at.push_str(&format!("[{i}]")),
        }
    }
    at
}

/// Refuses a media part anywhere but the image parts read (`read`), naming its path.
fn elsewhere<'v>(
    v: &'v Value,
    read: &HashSet<*const Value>,
    path: &mut Vec<Step<'v>>,
) -> Result<(), RequestError> {
    match v {
        Value::Object(o) => {
            if read.contains(&(v as *const Value)) {
                return Ok(());
            }
            if let Some(Value::String(t)) = o.get("type") {
                if MEDIA.contains(&t.as_str()) {
                    let at = rendered(path);
                    let why = if t.contains("image") {
                        format!("is `{t}` content where this endpoint's requests take no image, which tally does not price")
                    } else {
                        format!("is `{t}` content (audio, a file, a document, video), billed by a measure tally has no price for")
                    };
                    return Err(RequestError::Unpriced {
                        field: if at.is_empty() {
                            "type".into()
                        } else {
                            format!("{at}.type")
                        },
                        why,
                    });
                }
            }
            for (k, x) in o {
                path.push(Step::Key(k));
                elsewhere(x, read, path)?;
                path.pop();
            }
            Ok(())
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                path.push(Step::Item(i));
                elsewhere(x, read, path)?;
                path.pop();
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::parse;
    use serde_json::json;
    use tally_policy::ModelPrice;
    use tally_record::money::{per_million, Nanos};

    /// 4,000 bytes of base64: far more than the tokens of the image it encodes.
    fn png() -> String {
        "iVBORw0K".repeat(500)
    }

    fn field(endpoint: Endpoint, body: Value) -> String {
        match parse(endpoint, body.to_string().as_bytes()) {
            Err(RequestError::Unpriced { field, .. }) => field,
            other => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn each_image_is_reserved_at_image_tokens_not_at_its_bytes() {
        let p = ModelPrice {
            image_tokens: Some(1600),
            ..ModelPrice::new(Nanos(1_000_000_000), Nanos(2_000_000_000))
        };
        let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png()}});
        let body = json!({"model": "m", "max_tokens": 10, "messages": [
            {"role": "user", "content": [image.clone(), {"type": "text", "text": "what is this?"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [image]}]}]});
        let r = parse(Endpoint::Messages, body.to_string().as_bytes()).expect("reads");
        assert_eq!(r.images.count, 2);
        assert_eq!(r.images.data_bytes, 8000);
        let q = r.price(&p, Nanos(0), false).expect("priced");
        // The body less the images' data, its limit at 20 digits, plus 2 x 1600.
        assert_eq!(q.input_bound, q.body.len() as u64 - 2 + 20 - 8000 + 3200);
        assert_eq!(
            Some(q.worst),
            per_million(q.input_bound, Nanos(1_000_000_000))
                .and_then(|i| i.checked_add(Nanos(20_000)))
        );
        // No image_tokens: refused, naming the first image.
        match r.price(&ModelPrice::new(Nanos(1), Nanos(1)), Nanos(0), false) {
            Err(RequestError::Unpriced { field, .. }) => {
                assert_eq!(field, "messages[0].content[0]")
            }
            other => panic!("{other:?}"),
        }
        // OpenAI's: Chat's image_url (a data URL's bytes left out, a link's kept) and
        // Responses' input_image, in a message and in a function's output.
        let data = format!("data:image/png;base64,{}", png());
        let chat = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data, "detail": "high"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]});
        let r = parse(Endpoint::ChatCompletions, chat.to_string().as_bytes()).expect("reads");
        assert_eq!(
            (r.images.count, r.images.data_bytes),
            (2, data.len() as u64)
        );
        let resp = json!({"model": "m", "input": [
            {"role": "user", "content": [{"type": "input_image", "image_url": data}]},
            {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "file_id": "file_1"}]}]});
        let r = parse(Endpoint::Responses, resp.to_string().as_bytes()).expect("reads");
        assert_eq!(
            (r.images.count, r.images.data_bytes),
            (2, data.len() as u64)
        );
    }

    #[test]
    fn media_is_read_only_where_each_api_takes_it() {
        let m = |content: Value| json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": content}]});
        // Audio, files, documents: no price covers them.
        assert_eq!(
            field(
                Endpoint::Messages,
                m(json!([{"type": "document", "source": {"type": "base64", "data": "x"}}]))
            ),
            "messages[0].content[0].type"
        );
        assert_eq!(
            field(
                Endpoint::ChatCompletions,
                m(json!([{"type": "input_audio", "input_audio": {"data": "x"}}]))
            ),
            "messages[0].content[0].type"
        );
        assert_eq!(
            field(
                Endpoint::ChatCompletions,
                m(json!([{"type": "file", "file": {"file_id": "f"}}]))
            ),
            "messages[0].content[0].type"
        );
        // An image in another dialect's spelling, or where the API takes none.
        assert_eq!(
            field(
                Endpoint::ChatCompletions,
                m(json!([{"type": "image", "source": {"type": "base64", "data": "x"}}]))
            ),
            "messages[0].content[0].type"
        );
        assert_eq!(
            field(
                Endpoint::Messages,
                json!({"model": "m", "max_tokens": 1, "system": [{"type": "image", "source": {"type": "base64", "data": "x"}}], "messages": []})
            ),
            "system[0].type"
        );
        // An image the API takes, malformed: refused, never counted as nothing.
        for bad in [
            json!({"type": "image", "source": {"type": "base64"}}),
            json!({"type": "image", "source": {"type": "text", "data": "x"}}),
            json!({"type": "image"}),
        ] {
            assert_eq!(
                field(Endpoint::Messages, m(json!([bad]))),
                "messages[0].content[0]"
            );
        }
        assert_eq!(
            field(
                Endpoint::ChatCompletions,
                m(json!([{"type": "image_url", "image_url": "https://x"}]))
            ),
            "messages[0].content[0]"
        );
    }

    #[test]
    fn a_body_of_many_images_reads_the_same_walked_once() {
        // 20,000 image parts where Chat takes them: each counted, and one more anywhere
        // else (the last thing walked) refused by its exact path.
        let n = 20_000;
        let part = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}});
        let parts = |n: usize| vec![part.clone(); n];
        let body = json!({"model": "m", "messages": [
            {"role": "user", "content": parts(n / 2)},
            {"role": "user", "content": parts(n / 2)}]});
        let got = images(Endpoint::ChatCompletions, &body).expect("reads");
        assert_eq!(
            got,
            Images {
                count: n as u64,
                data_bytes: n as u64 * 26,
                first: Some("messages[0].content[0]".into()),
            }
        );
        let mut stray = body.clone();
        stray["messages"][1]["z"] = json!([{"x": parts(2)}]);
        match images(Endpoint::ChatCompletions, &stray) {
            Err(RequestError::Unpriced { field, .. }) => {
                assert_eq!(field, "messages[1].z[0].x[0].type")
            }
            other => panic!("{other:?}"),
        }
    }
}
