//! Amazon Bedrock's model ids as a call names them in its path, classified
//! ([`BedrockModelId`]), and the price such a call is charged at
//! ([`Prices::priced`]): the one rule the proxy, the daemon's metrics and
//! `tally policy check` use.

use super::{ModelPrice, Prices, UpstreamKind};

/// What a Bedrock model id in a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BedrockModelId<'a> {
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

impl<'a> BedrockModelId<'a> {
    /// `id` classified; `None` for what is neither a model id nor an ARN of a kind the
    /// proxy prices (a provisioned model, a custom model, a prompt: refused).
    pub fn classify(id: &'a str) -> Option<BedrockModelId<'a>> {
        if id.len() > MAX_ID {
            return None;
        }
        let Some(arn) = id.strip_prefix("arn:") else {
            return plain(id).then_some(BedrockModelId::Id(id));
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
            "foundation-model" | "inference-profile" => {
                Some(BedrockModelId::Arn { resource: rest })
            }
            "application-inference-profile" => Some(BedrockModelId::Profile),
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

impl Prices {
    /// The price a call naming `model` on `upstream` (of `kind`) is charged at: on a
    /// `bedrock` upstream, by the id's class ([`BedrockModelId`]): a model or
    /// cross-region profile id under [`Prices::bedrock_model`]'s version and geography
    /// rules; a foundation-model or inference-profile ARN by its whole ARN, else its
    /// resource id under those rules; an application inference profile's ARN only by
    /// itself; anything else unpriced. On any other upstream, [`Prices::model`].
    pub fn priced(&self, kind: UpstreamKind, upstream: &str, model: &str) -> Option<&ModelPrice> {
        if kind != UpstreamKind::Bedrock {
            return self.model(upstream, model);
        }
        match BedrockModelId::classify(model)? {
            BedrockModelId::Id(m) => self.bedrock_model(upstream, m),
            BedrockModelId::Arn { resource } => self
                .model(upstream, model)
                .or_else(|| self.bedrock_model(upstream, resource)),
            BedrockModelId::Profile => self.model(upstream, model),
        }
    }
}

/// The Bedrock spellings a price named `name` covers beyond its name, aliases and dated
/// snapshots, as `tally policy check` prints them: a version suffix and a
/// cross-region prefix, and the ARN of a foundation model or system inference profile.
pub(super) fn covered(name: &str) -> Vec<String> {
    vec![
        format!("[GEO.]{name}[-YYYYMMDD][-vN[:M]]"),
        format!("arn:...:foundation-model/ or inference-profile/[GEO.]{name}[-YYYYMMDD][-vN[:M]]"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arns_classify_by_their_resource() {
        assert_eq!(
            BedrockModelId::classify(
                "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-pro-v1:0"
            ),
            Some(BedrockModelId::Arn {
                resource: "amazon.nova-pro-v1:0"
            })
        );
        assert_eq!(
            BedrockModelId::classify(
                "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3"
            ),
            Some(BedrockModelId::Profile)
        );
        assert_eq!(
            BedrockModelId::classify("arn:aws:bedrock:us-east-1:123456789012:provisioned-model/x"),
            None
        );
    }
}
