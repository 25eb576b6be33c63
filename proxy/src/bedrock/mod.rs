//! Amazon Bedrock's Converse API as the proxy reads its paths: `/model/MODEL/converse`
//! and `/model/MODEL/converse-stream`, the model id the path's, read strictly
//! ([`model_path`], [`ModelId`]), and the path forwarded rebuilt from it in one spelling
//! ([`upstream_path`]). The operator's AWS credential signs each call ([`sign`]); a
//! stream's AWS event-stream frames are read by [`frames`].

pub mod frames;
pub mod sign;

pub use tally_policy::upstreams::BedrockModelId as ModelId;

/// Bedrock's `/model/MODEL/converse` or `/model/MODEL/converse-stream`, the model id
/// percent-decoded strictly: `%3A` is `:` and `%2F` is `/` (as the AWS SDKs encode an
/// id), any other escape, or a raw byte outside an id's, is refused; the id must then
/// classify ([`ModelId::classify`]). The id and whether it is the stream's path;
/// `None` for any other path.
pub(crate) fn model_path(path: &str) -> Option<(String, bool)> {
    let rest = path.strip_prefix("/model/")?;
    let (raw, method) = rest.split_once('/')?;
    let stream = match method {
        "converse" => false,
        "converse-stream" => true,
        _ => return None,
    };
    let id = decode(raw)?;
    ModelId::classify(&id)?;
    Some((id, stream))
}

/// A path segment's model id: `%3A` (or `%3a`) as `:`, `%2F` (`%2f`) as `/`, no other
/// escape.
fn decode(raw: &str) -> Option<String> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let esc = rest.get(i..i + 3)?;
        out.push(match esc {
            "%3A" | "%3a" => ':',
            "%2F" | "%2f" => '/',
            _ => return None,
        });
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The path forwarded for model `id` (`stream`: ConverseStream's): the id encoded as
/// the AWS SDKs encode it (`:` as `%3A`, `/` as `%2F`), whatever spelling the agent
/// sent.
pub(crate) fn upstream_path(stream: bool, id: &str) -> String {
    let method = if stream {
        "converse-stream"
    } else {
        "converse"
    };
    let enc = id.replace(':', "%3A").replace('/', "%2F");
    format!("/model/{enc}/{method}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_id_is_read_from_the_path_in_one_spelling() {
        let id = |p: &str| model_path(p).map(|(id, _)| id);
        let haiku = "anthropic.claude-3-5-haiku-20241022-v1:0";
        for path in [
            format!("/model/{haiku}/converse"),
            "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse".into(),
            "/model/anthropic.claude-3-5-haiku-20241022-v1%3a0/converse-stream".into(),
        ] {
            assert_eq!(id(&path).as_deref(), Some(haiku), "{path}");
        }
        let arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-5-haiku-20241022-v1:0";
        let sent = arn.replace(':', "%3A").replace('/', "%2F");
        assert_eq!(id(&format!("/model/{sent}/converse")).as_deref(), Some(arn));
        assert_eq!(upstream_path(false, arn), format!("/model/{sent}/converse"));
        for bad in [
            "/model/../converse",
            "/model/..%2F..%2Fx/converse",
            "/model/%2E%2E/converse",
            "/model/a%2Fb/converse",
            "/model/Anthropic.claude/converse",
            "/model/a b/converse",
            "/model/x%/converse",
            "/model/x%3/converse",
            "/model//converse",
            "/model/x/converse/",
            "/model/x/invoke",
            "/model/x/converse-stream/x",
            "/model/x:/converse",
            "/model/-x/converse",
            "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Aprompt%2Fabc/converse",
            "/model/arn%3Aaws%3As3%3A%3A%3Afoundation-model%2Fx/converse",
            "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Afoundation-model%2Fx/converse",
            "/v1/model/x/converse",
        ] {
            assert_eq!(model_path(bad), None, "{bad}");
        }
        let long = "a".repeat(257);
        assert_eq!(model_path(&format!("/model/{long}/converse")), None);
    }
}
