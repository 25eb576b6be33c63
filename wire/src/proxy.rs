//! What the model proxy's refusals name (docs/PROXY.md, "Refusals in the upstream's own
//! dialect"): a reason code of the gate, or an error of the proxy's own.

use std::fmt;

use serde::{Deserialize, Serialize};
use tally_record::Reason;

use crate::ErrorCode;

/// The code a proxy refusal carries (the OpenAI dialect's `error.code`, the Anthropic
/// dialect's `tally.reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum RefusalCode {
    /// A decision of the run's: the gate's reason code, recorded.
    Reason(Reason),
    /// What is not a decision of a run (`invalid_token`, `key_revoked`,
    /// `upstream_unreachable`, `upstream_timeout`, `upstream_error`, `invalid_request`,
    /// `too_many_connections`, `refused`).
    Error(ErrorCode),
}

impl RefusalCode {
    /// The code as it is on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalCode::Reason(r) => r.as_str(),
            RefusalCode::Error(e) => e.as_str(),
        }
    }
}

impl fmt::Display for RefusalCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_code_is_its_wire_name_and_reads_back() {
        for code in [
            RefusalCode::Reason(Reason::RetriesExhausted),
            RefusalCode::Error(ErrorCode::InvalidToken),
            RefusalCode::Error(ErrorCode::UpstreamTimeout),
        ] {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{code}\""));
            assert_eq!(serde_json::from_str::<RefusalCode>(&json).unwrap(), code);
        }
    }
}
