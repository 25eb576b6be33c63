//! tally's HTTP/model proxy: in `tally serve`, between an agent and the upstreams the
//! policy names (`[upstreams.NAME]`), it prices, forwards and observes the calls that
//! cost money, through the gate (docs/PROXY.md).
//!
//! Each request to `/<NAME>/<upstream path>` goes through named phases over one record
//! of the call (`phase/`, docs/PROXY.md, "How a call flows"):
//!
//! 1. authenticate: the run token (the agent's API key) names the run ([`token`]);
//!    unknown, forged, stopped or expired: 401 or 403, whatever the path, and nothing
//!    recorded;
//! 2. plan: the upstream must be named, the method and path its own; the body at most
//!    its `max_request_bytes` (413), whole within the read timeout (408), read strictly
//!    ([`request`]) and priced; each refusal here is recorded through the gate as the
//!    run's `deny` before it is answered;
//! 3. check: the worst case is reserved: the gate's `check` with the run owner's uid
//!    (`proxied`), refused in the upstream's dialect ([`dialect`]);
//! 4. forward: the request goes to the upstream with the real credential (the agent's
//!    key never does), redirects never followed, and refused unless they stay on it;
//! 5. pump: the answer streams back chunk by chunk while its usage ([`usage`]) and
//!    BLAKE3 digest are read from it;
//! 6. settle: the gate's `outcome` settles the truth; once the check allowed the call,
//!    it always runs, whatever ended the call.
//!
//! With a tracer, each call that reaches the gate is a span ([`trace`]).
//!
//! Depends on the gate, the policy core, the record crate, the API types and the
//! OpenTelemetry API only; the daemon wires it into `tally serve` (and gives it its
//! tracer).
#![forbid(unsafe_code)]

pub mod accept;
pub mod bedrock;
pub mod dialect;
mod endpoint;
pub mod key_run;
pub mod key_spend;
mod key_turns;
pub mod keys;
pub mod media;
mod phase;
mod proxy;
mod pruned;
mod redirect;
mod refuse;
pub mod request;
pub mod tier;
pub mod tls;
pub mod token;
pub mod trace;
pub mod usage;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};

pub use accept::Peer;
pub use keys::KeyRing;
pub use proxy::{
    read_credential, Admit, Proxy, ProxyError, ProxyOptions, Secret, Stage, DEFAULT_READ_TIMEOUT,
};
pub use token::TokenKey;

/// The body of the proxy's answers.
pub type Body = BoxBody<Bytes, std::io::Error>;

/// An empty body.
pub(crate) fn empty() -> Body {
    Empty::new().map_err(|e| match e {}).boxed()
}
