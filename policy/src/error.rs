//! Typed errors of the policy core.

/// A policy file or approval that cannot be used. Nothing is changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Not valid TOML, an unknown key, or a value of the wrong type.
    #[error("policy: {message}")]
    Toml {
        /// What the TOML parser said, naming the key.
        message: String,
        /// Byte range of the offending text, where known.
        span: Option<(usize, usize)>,
    },
    /// A value that parses but cannot be enforced.
    #[error("policy: `{key}` {why}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// What is wrong.
        why: &'static str,
    },
    /// The policy text is over the size a policy record stores.
    #[error("policy is {len} bytes; at most {max} are recorded")]
    TooLong {
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
}

/// Why an approval (an override record) is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApprovalError {
    /// A field the approval needs is missing.
    #[error("approval has no `{0}`")]
    Missing(&'static str),
    /// The approver is not listed in the policy.
    #[error("approver `{0}` is not listed in the policy's [approvals.approvers]")]
    UnknownApprover(String),
    /// The digest does not match what the approval says.
    #[error("approval digest does not match its run, scope, approver and expiry")]
    Digest,
    /// The signature does not verify with the approver's listed key.
    #[error("approval signature does not verify with {approver}'s key")]
    Signature {
        /// The approver named.
        approver: String,
    },
    /// The approval grants nothing.
    #[error("approval grants nothing: give attempts, cents, a tool or an operation")]
    Empty,
}
