//! Typed errors of the policy core.

/// A policy file or approval that cannot be used. Nothing is changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Not valid TOML, an unknown key, or a value of the wrong type.
    #[error("policy: {}{message}", place(*.line, .key.as_deref()))]
    Toml {
        /// What the TOML parser said, and what to write instead where that is clear.
        message: String,
        /// The key at fault as a dotted path (`ceiling.attempts`), where known.
        key: Option<String>,
        /// The 1-based line of the offending text, where known.
        line: Option<usize>,
        /// Byte range of the offending text, where known.
        span: Option<(usize, usize)>,
    },
    /// A value that parses but cannot be enforced.
    #[error("policy: {}`{key}` {why}", place(*.line, None))]
    Invalid {
        /// The key, as a dotted path (`ceiling.attempts`, `credentials.ci.period_ms`).
        key: String,
        /// What is wrong, and what to give instead.
        why: String,
        /// The 1-based line of its value in the file, where it is written in one.
        line: Option<usize>,
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
    #[error(
        "approval grants nothing: give attempts, spend (nanos or cents), a tool or an operation"
    )]
    Empty,
    /// A continuation grant (its scope names `new_run`) that is not one.
    #[error("continuation grant is not valid: {0}")]
    Continuation(&'static str),
    /// A denial (reason `denied_by_approver`) that is not one.
    #[error("denial is not valid: {0}")]
    Denial(&'static str),
}

/// `line N, `key`: ` (either part only where known).
fn place(line: Option<usize>, key: Option<&str>) -> String {
    match (line, key) {
        (Some(l), Some(k)) => format!("line {l}, `{k}`: "),
        (Some(l), None) => format!("line {l}: "),
        (None, Some(k)) => format!("`{k}`: "),
        (None, None) => String::new(),
    }
}
