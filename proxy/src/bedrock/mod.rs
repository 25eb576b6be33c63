//! Amazon Bedrock's Converse API as the proxy reads its paths: `/model/MODEL/converse`
//! and `/model/MODEL/converse-stream`, the model id the path's, read strictly
//! ([`model_path`], [`ModelId`]), and the path forwarded rebuilt from it in one spelling
//! ([`upstream_path`]). The operator's AWS credential signs each call ([`sign`]); a
//! stream's AWS event-stream frames are read by [`frames`].

pub mod frames;
pub mod sign;

/// What a Bedrock model id in a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelId<'a> {
    /// A model or cross-region inference profile id (`anthropic.claude-3-5-haiku-20241022-v1:0`,
    /// `us.anthropic.claude-3-5-haiku-20241022-v1:0`).
    Id(&'a str),
    /// The ARN of a foundation model or a system inference profile: priced by its
    /// whole ARN if the policy names it, else as its resource id (`resource`).
    Arn {
        /// The id after `foundation-model/` or `inference-profile/`.
        resource: &'a str,
    },
    /// The ARN of an application inference profile: priced only by the whole ARN (the
    /// policy must name it, or list it in a price's `aliases`), since the model it
    /// routes to is not in it.
    Profile,
}

/// The most bytes of a model id, ARN included.
const MAX_ID: usize = 256;

impl<'a> ModelId<'a> {
    /// `id` classified; `None` for what is neither a model id nor an ARN of a kind the
    /// proxy prices (a provisioned model, a custom model, a prompt: refused).
    pub fn classify(id: &'a str) -> Option<ModelId<'a>> {
        if id.len() > MAX_ID {
            return None;
        }
        let Some(arn) = id.strip_prefix("arn:") else {
            return plain(id).then_some(ModelId::Id(id));
        };
        let mut parts = arn.splitn(5, ':');
        let (partition, service, region, account, resource) = (
            parts.next()?,
            parts.next()?,
            parts.next()?,
            parts.next()?,
            parts.next()?,
        );
        let region_ok = region.is_empty()
            || region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        let account_ok = account.is_empty()
            || (account.len() == 12 && account.bytes().all(|b| b.is_ascii_digit()));
        if !matches!(partition, "aws" | "aws-us-gov" | "aws-cn")
            || service != "bedrock"
            || !region_ok
            || !account_ok
        {
            return None;
        }
        let (kind, rest) = resource.split_once('/')?;
        if !plain(rest) {
            return None;
        }
        match kind {
            "foundation-model" | "inference-profile" => Some(ModelId::Arn { resource: rest }),
            "application-inference-profile" => Some(ModelId::Profile),
            _ => None,
        }
    }
}

/// A model id as Bedrock spells one: 1 to 256 bytes of lower-case ASCII letters,
/// digits, `.`, `-` and `:`, starting and ending with a letter or digit, no `..` or
/// `::` (so no `/`, `%`, space, dot segment or upper case).
fn plain(m: &str) -> bool {
    let ok =
        |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b':');
    !m.is_empty()
        && m.len() <= MAX_ID
        && m.bytes().all(ok)
        && m.as_bytes()[0].is_ascii_alphanumeric()
        && m.as_bytes()[m.len() - 1].is_ascii_alphanumeric()
        && !m.contains("..")
        && !m.contains("::")
}

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

/// The ids a Bedrock model `id` may be priced under, most specific first, for
/// [`tally_policy::Prices::model`] (`exact`) or [`tally_policy::Prices::bedrock_model`]
/// (the version and geography rules): the whole id exactly, then (a model or a
/// foundation-model or inference-profile ARN) its id under the rules.
pub(crate) fn price<'p>(
    prices: &'p tally_policy::Prices,
    upstream: &str,
    id: &str,
) -> Option<&'p tally_policy::ModelPrice> {
    match ModelId::classify(id)? {
        ModelId::Id(m) => prices.bedrock_model(upstream, m),
        ModelId::Arn { resource } => prices
            .model(upstream, id)
            .or_else(|| prices.bedrock_model(upstream, resource)),
        ModelId::Profile => prices.model(upstream, id),
    }
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

    #[test]
    fn arns_classify_by_their_resource() {
        assert_eq!(
            ModelId::classify("arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-pro-v1:0"),
            Some(ModelId::Arn {
                resource: "amazon.nova-pro-v1:0"
            })
        );
        assert_eq!(
            ModelId::classify(
                "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3"
            ),
            Some(ModelId::Profile)
        );
        assert_eq!(
            ModelId::classify("arn:aws:bedrock:us-east-1:123456789012:provisioned-model/x"),
            None
        );
    }
}
