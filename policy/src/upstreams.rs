//! The upstreams tally's proxy forwards to (`[upstreams.NAME]`), and (in `prices.rs`)
//! what their calls cost (`[prices.UPSTREAM."MODEL"]`, `[prices.UPSTREAM.routes."METHOD
//! /path"]`): docs/GATE.md, "Upstreams and prices".

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tally_record::url::{redacted, Scheme, UpstreamUrl};

mod bedrock;
mod prices;
pub use bedrock::BedrockModelId;
pub use prices::*;

/// Default `max_request_bytes`: 1 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 1024 * 1024;
/// Default `timeout_ms`: 120 s.
pub const DEFAULT_UPSTREAM_TIMEOUT_MS: u64 = 120_000;
/// The largest `max_request_bytes` a policy may give: 64 MiB (the proxy holds a request
/// body whole to parse it).
pub const MAX_REQUEST_BYTES_LIMIT: u64 = 64 * 1024 * 1024;

/// The API an upstream speaks: how the proxy reads requests, usage and errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamKind {
    /// OpenAI's API (chat completions, and every API that copies it).
    Openai,
    /// Anthropic's Messages API.
    Anthropic,
    /// Any HTTP API, priced per route or by a cost header.
    Http,
    /// Google's Gemini API (`generateContent`, `streamGenerateContent`), the model named
    /// in the path.
    Gemini,
    /// Azure OpenAI: OpenAI's Chat Completions and Responses under
    /// `/openai/deployments/DEPLOYMENT/...` and `/openai/responses`, each deployment
    /// mapped to a priced model (`deployments`), with an `api-version` from
    /// `api_versions`.
    AzureOpenai,
    /// Amazon Bedrock's Converse API (`/model/MODEL/converse`, `/converse-stream`), the
    /// model named in the path, each call signed with the operator's AWS credential
    /// (SigV4, in `aws_region`).
    Bedrock,
}

impl UpstreamKind {
    /// Whether it is a model API (priced per model, by usage), not `http`.
    pub fn is_model(self) -> bool {
        self != UpstreamKind::Http
    }
}

/// One upstream (`[upstreams.NAME]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// Where it is: `http://` or `https://`, a host, an optional port and base path; no
    /// user, query or fragment. This or `url_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A file whose content (trailing line end removed) is the upstream's URL, read when
    /// `tally serve` starts: for a URL that carries a secret (a gateway's token in its
    /// path), which the policy, recorded in the ledger as written, then does not hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_file: Option<String>,
    /// Its API.
    pub kind: UpstreamKind,
    /// The name of the credential the proxy injects (`tally serve --credential
    /// NAME=FILE` gives its secret).
    pub credential: String,
    /// Methods allowed. Default `["POST"]`.
    #[serde(default = "default_methods")]
    pub methods: Vec<String>,
    /// Allowed path prefixes (each starting with `/`); empty allows none.
    #[serde(default)]
    pub paths: Vec<String>,
    /// The largest request body forwarded; larger gets 413. Default 1 MiB.
    #[serde(default = "default_max_request_bytes")]
    pub max_request_bytes: u64,
    /// The longest a call may take, ms (a run's remaining time may make it shorter).
    /// Default 120,000.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Extra trusted roots (a PEM file), added to the webpki roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// `http` kind: the response header carrying the call's cost in US dollars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_header: Option<String>,
    /// Model kinds: a request whose own `max_tokens` (or `max_completion_tokens`,
    /// `max_output_tokens`) costs more than the run can pay is forwarded with the limit
    /// lowered to what it can pay, instead of refused. Off by default: the agent then
    /// sees its answer cut where the limit was (`stop_reason: "max_tokens"`,
    /// `finish_reason: "length"`, Responses `status: "incomplete"`).
    #[serde(default)]
    pub clamp_max_tokens: bool,
    /// `anthropic` kind: the `anthropic-beta` values the agent may send on; any other is
    /// dropped from the header (a beta can change what a call bills). Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anthropic_beta: Vec<String>,
    /// `azure_openai` kind: each deployment name the agent may call, and the model whose
    /// price (`[prices.NAME."MODEL"]`) it is billed at. A deployment not listed is
    /// refused, naming it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub deployments: BTreeMap<String, String>,
    /// `azure_openai` kind: the `api-version` query values forwarded; any other query is
    /// refused. At least one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_versions: Vec<String>,
    /// `bedrock` kind: the AWS region each call is signed for (`us-east-1`); required
    /// there, refused elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws_region: Option<String>,
}

fn default_methods() -> Vec<String> {
    vec!["POST".to_owned()]
}
fn default_max_request_bytes() -> u64 {
    DEFAULT_MAX_REQUEST_BYTES
}
fn default_timeout_ms() -> u64 {
    DEFAULT_UPSTREAM_TIMEOUT_MS
}

/// The field an OpenAI Chat Completions request's output limit is injected as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MaxTokensField {
    /// `max_tokens` (the default).
    #[default]
    MaxTokens,
    /// `max_completion_tokens` (OpenAI's reasoning models refuse `max_tokens`).
    MaxCompletionTokens,
}

impl MaxTokensField {
    /// The JSON member's name.
    pub fn as_str(self) -> &'static str {
        match self {
            MaxTokensField::MaxTokens => "max_tokens",
            MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
        }
    }
}

/// A path prefix: starts with `/`, visible ASCII, no `?`, `#`, `..` segment or `%`.
pub(crate) fn valid_path(p: &str) -> bool {
    p.starts_with('/')
        && p.bytes().all(|b| b.is_ascii_graphic())
        && !p.contains(['?', '#', '%', '\\'])
        && !p.split('/').any(|s| s == ".." || s == ".")
}

/// An upstream's name: a URL path segment (`[A-Za-z0-9_-]`, at most 64 bytes).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Upstream {
    /// What is wrong with this upstream, if anything: the key under
    /// `upstreams.NAME` and why. `new`: a policy being put in force, whose `url` is also
    /// held to [`Upstream::in_force_problem`]; a recorded one is read as earlier builds,
    /// which took plain `http://` to any host, enforced it.
    pub(crate) fn problem(&self, new: bool) -> Option<(&'static str, String)> {
        self.request_problem()
            .or_else(|| self.kind_problem())
            .or_else(|| new.then(|| self.in_force_problem()).flatten())
    }

    /// What keeps this upstream from being put in force, whatever a ledger recorded: a
    /// `url` the proxy would not send to as written ([`url_in_force`]: the strict
    /// reading, and plain `http://` to a loopback host only, where the credential the
    /// proxy injects, and every prompt and answer, would otherwise cross the network
    /// unencrypted). A `url_file`'s URL is held to [`url_in_force`] when it is read.
    pub fn in_force_problem(&self) -> Option<(&'static str, String)> {
        let url = self.url.as_deref()?;
        url_in_force(url).err().map(|why| ("url", why))
    }

    /// What is wrong with where and how requests go: the URL, the credential, the
    /// methods and paths allowed, the bounds, the CA file.
    fn request_problem(&self) -> Option<(&'static str, String)> {
        if let Some(p) = self.where_problem() {
            return Some(p);
        }
        if self.credential.is_empty()
            || !self
                .credential
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        {
            return Some((
                "credential",
                "must name a credential (letters, digits, `_`, `-`, `.`) that `tally serve --credential NAME=FILE` gives".into(),
            ));
        }
        if self.methods.is_empty()
            || self
                .methods
                .iter()
                .any(|m| m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()))
        {
            return Some((
                "methods",
                "must list HTTP methods in upper case, like [\"POST\"]".into(),
            ));
        }
        if let Some(p) = self.paths.iter().find(|p| !valid_path(p)) {
            return Some((
                "paths",
                format!("`{p}` is not a path prefix: start it with `/`, no `?`, `#`, `%` or dot segments"),
            ));
        }
        if self.max_request_bytes == 0 || self.max_request_bytes > MAX_REQUEST_BYTES_LIMIT {
            return Some((
                "max_request_bytes",
                format!("must be between 1 and {MAX_REQUEST_BYTES_LIMIT} bytes"),
            ));
        }
        if self.timeout_ms == 0 {
            return Some(("timeout_ms", "must be at least 1 (ms)".into()));
        }
        if self.ca_file.as_deref() == Some("") {
            return Some(("ca_file", "is empty: give a PEM file's path".into()));
        }
        None
    }

    /// What is set that this kind of upstream does not take: beta names, a clamp on
    /// output, a cost header, Azure's deployments and API versions.
    fn kind_problem(&self) -> Option<(&'static str, String)> {
        if let Some(p) = self.azure_problem().or_else(|| self.bedrock_problem()) {
            return Some(p);
        }
        if !self.anthropic_beta.is_empty() && self.kind != UpstreamKind::Anthropic {
            return Some(("anthropic_beta", "is for `anthropic` upstreams only".into()));
        }
        if let Some(b) = self.anthropic_beta.iter().find(|b| {
            b.is_empty()
                || !b
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
        }) {
            return Some((
                "anthropic_beta",
                format!("`{b}` is not a beta name (letters, digits, `-`, `_`, `.`)"),
            ));
        }
        if self.clamp_max_tokens && self.kind == UpstreamKind::Http {
            return Some((
                "clamp_max_tokens",
                "is for model upstreams only (an `http` route has no output limit)".into(),
            ));
        }
        match (&self.cost_header, self.kind) {
            (Some(_), k) if k.is_model() => {
                return Some((
                    "cost_header",
                    "is for `http` upstreams only (model upstreams are priced by usage)".into(),
                ))
            }
            (Some(h), UpstreamKind::Http)
                if h.is_empty()
                    || !h
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') =>
            {
                return Some(("cost_header", format!("`{h}` is not a header name")))
            }
            _ => {}
        }
        None
    }
}

impl Upstream {
    /// What is wrong with `deployments` and `api_versions`: Azure's only, each at least
    /// one there, each deployment a name Azure allows (letters, digits, `-`, `_`, `.`, at
    /// most 64) mapped to a model id, each version letters, digits, `-` and `.`.
    fn azure_problem(&self) -> Option<(&'static str, String)> {
        let azure = self.kind == UpstreamKind::AzureOpenai;
        if !azure {
            if !self.deployments.is_empty() {
                return Some(("deployments", "is for `azure_openai` upstreams only".into()));
            }
            if !self.api_versions.is_empty() {
                return Some((
                    "api_versions",
                    "is for `azure_openai` upstreams only".into(),
                ));
            }
            return None;
        }
        if self.deployments.is_empty() {
            return Some((
                "deployments",
                "must map each deployment name to its priced model, like { \"prod-4o\" = \"gpt-4o\" }".into(),
            ));
        }
        if let Some((d, m)) = self.deployments.iter().find(|(d, m)| {
            !deployment_name(d) || m.is_empty() || m.len() > 256 || m.chars().any(char::is_control)
        }) {
            return Some((
                "deployments",
                format!("`{d}` = `{m}`: a deployment is 1 to 64 letters, digits, `-`, `_` or `.` (not starting with `.`), its model a model id of at most 256 bytes"),
            ));
        }
        if self.api_versions.is_empty() {
            return Some((
                "api_versions",
                "must list the `api-version` values forwarded, like [\"2024-10-21\"]".into(),
            ));
        }
        if let Some(v) = self.api_versions.iter().find(|v| {
            v.is_empty()
                || v.len() > 64
                || !v
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        }) {
            return Some((
                "api_versions",
                format!("`{v}` is not an API version (letters, digits, `-`, `.`)"),
            ));
        }
        None
    }
}

impl Upstream {
    /// What is wrong with `aws_region`: Bedrock's only, and there a region's name
    /// (lower-case letters, digits and `-`, at most 32); and with a `bedrock`
    /// upstream's `methods`: `POST` only (Converse and ConverseStream are, and each call
    /// is signed as one).
    fn bedrock_problem(&self) -> Option<(&'static str, String)> {
        if self.kind == UpstreamKind::Bedrock && self.methods != ["POST"] {
            return Some((
                "methods",
                "must be [\"POST\"] on a `bedrock` upstream (Converse and ConverseStream are called with POST, and each call is signed as one)".into(),
            ));
        }
        match (&self.aws_region, self.kind) {
            (Some(_), k) if k != UpstreamKind::Bedrock => {
                Some(("aws_region", "is for `bedrock` upstreams only".into()))
            }
            (None, UpstreamKind::Bedrock) => Some((
                "aws_region",
                "must name the AWS region calls are signed for, like \"us-east-1\"".into(),
            )),
            (Some(r), _)
                if r.is_empty()
                    || r.len() > 32
                    || !r
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') =>
            {
                Some((
                    "aws_region",
                    format!("`{r}` is not an AWS region (lower-case letters, digits, `-`)"),
                ))
            }
            _ => None,
        }
    }
}

/// An Azure OpenAI deployment name as the proxy accepts it in a path: 1 to 64 ASCII
/// letters, digits, `-`, `_` or `.`, not starting with `.`.
pub fn deployment_name(d: &str) -> bool {
    !d.is_empty()
        && d.len() <= 64
        && !d.starts_with('.')
        && d.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl Upstream {
    /// What is wrong with where the upstream is: `url` or `url_file`, one of them; a
    /// `url` of the shape every build took ([`UpstreamUrl::shape`]: a recorded policy is
    /// held to it alone, one put in force to [`Upstream::in_force_problem`] too).
    fn where_problem(&self) -> Option<(&'static str, String)> {
        match (&self.url, &self.url_file) {
            (None, None) => Some((
                "url",
                "give the upstream's `url` (or `url_file`, a file holding it)".into(),
            )),
            (Some(_), Some(_)) => Some(("url_file", "give `url` or `url_file`, not both".into())),
            (None, Some(file)) => file
                .is_empty()
                .then(|| ("url_file", "is empty: give a file's path".into())),
            (Some(url), None) => UpstreamUrl::shape(url)
                .err()
                .map(|e| ("url", format!("`{}`: {e}", redacted(url)))),
        }
    }
}

/// `url` (an upstream's `url`, or what its `url_file` holds) read as the proxy sends
/// to it ([`UpstreamUrl::parse`]), if a policy put in force may give it: `https://`, or
/// plain `http://` to a loopback host. An error shows the URL [`redacted`]: it may
/// carry a secret.
pub fn url_in_force(url: &str) -> Result<UpstreamUrl, String> {
    let shown = redacted(url);
    let u = UpstreamUrl::parse(url).map_err(|e| format!("`{shown}`: {e}"))?;
    if u.scheme() == Scheme::Http && !u.is_loopback() {
        // The authority as written: its port (a default one for `http`) is kept.
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let authority = rest.split('/').next().unwrap_or(rest);
        return Err(format!(
            "`{shown}` is plain http to a host that is not loopback: the credential the proxy injects, and every request and answer, would cross the network unencrypted. Use `https://{authority}`, or, for a gateway on this machine, a loopback address (127.0.0.1, ::1 or localhost)"
        ));
    }
    Ok(u)
}
