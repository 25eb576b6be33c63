//! The typed error of a refused decision.

use crate::decision::Kind;

/// A decision that the ledger refuses (SPEC section 3). Nothing is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecisionError {
    /// Not valid JSON, an unknown field, or a field of the wrong type.
    #[error("invalid decision JSON: {message}")]
    Json {
        /// serde_json's description, with line and column.
        message: String,
    },
    /// A required field is absent.
    #[error("missing required field `{field}`")]
    Missing {
        /// The field.
        field: &'static str,
    },
    /// A field given on a kind it does not belong to.
    #[error("field `{field}` is not allowed on a `{kind}` decision")]
    NotAllowed {
        /// The field.
        field: &'static str,
        /// The decision's kind.
        kind: Kind,
    },
    /// A text field over its bound.
    #[error("field `{field}` is {len} bytes; at most {max} are stored")]
    TooLong {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A field whose value is malformed.
    #[error("field `{field}`: {why}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A stored decision that is valid but not in its one canonical encoding.
    #[error("stored decision is not in canonical form")]
    NotCanonical,
}
