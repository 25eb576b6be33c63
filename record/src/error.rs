//! The typed error of a refused decision.

use crate::codes::Kind;

/// A decision that the ledger refuses (docs/FORMAT.md). Nothing is written.
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
    /// A key given twice in one object: in the decision itself, in `budget`, `scope`,
    /// `limits` or one of its entries, or anywhere in `args`. JSON parsers disagree on
    /// which one wins, so neither does.
    #[error("duplicate key `{key}` in {} at line {line} column {column}: each key may appear once per object; remove one of them", place(.path))]
    DuplicateKey {
        /// The object holding it: empty for the decision, else e.g. `budget`,
        /// `limits.attempts`, `args.items[2]`.
        path: String,
        /// The key, decoded.
        key: String,
        /// 1-based line of the text where it was found.
        line: usize,
        /// Column (in bytes) of the text where it was found.
        column: usize,
    },
    /// A field given as `null`. A null is never read as an absent field.
    #[error("field `{field}` is null at line {line} column {column}: leave the field out to say it is absent")]
    Null {
        /// The field, e.g. `goal` or `budget.attempts`.
        field: String,
        /// 1-based line of the text.
        line: usize,
        /// Column (in bytes) of the text.
        column: usize,
    },
    /// A character that Unicode calls whitespace but JSON does not (JSON allows only
    /// space, tab, line feed and carriage return between tokens).
    #[error("U+{:04X} at line {line} column {column} is not JSON whitespace (JSON allows only space, tab, LF and CR between values): remove it", u32::from(*.found))]
    NotJsonWhitespace {
        /// The character.
        found: char,
        /// 1-based line of the text.
        line: usize,
        /// Column (in bytes) of the text.
        column: usize,
    },
    /// `args` that cannot be read exactly.
    #[error("field `args`: {0}")]
    Args(#[from] ArgsError),
    /// One amount given both in cents and in nanodollars.
    #[error("`{cents}` and `{nanos}` are the same amount in two units: give one of them (`{nanos}` for nanodollars, 10^-9 USD)")]
    BothUnits {
        /// The field in cents.
        cents: &'static str,
        /// The field in nanodollars.
        nanos: &'static str,
    },
    /// An amount in cents too large to count in nanodollars (a `u64`).
    #[error("`{field}` = {cents} cents does not fit in nanodollars (at most 1844674407370 cents): give a smaller amount")]
    CentsOverflow {
        /// The field in cents.
        field: &'static str,
        /// The amount given.
        cents: u64,
    },
}

fn place(path: &str) -> String {
    if path.is_empty() {
        "the decision object".into()
    } else {
        format!("`{path}`")
    }
}

/// Call arguments that cannot be read exactly (so cannot be given a digest).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgsError {
    /// A key given twice in one object of the arguments.
    #[error("duplicate key `{key}` in `{path}`: each key may appear once per object; remove one of them")]
    DuplicateKey {
        /// The object, e.g. `args` or `args.items[2]`.
        path: String,
        /// The key, decoded.
        key: String,
    },
    /// The arguments are `null`.
    #[error("`args` is null: leave the field out when the call has no arguments")]
    Null,
    /// Arrays and objects nested too deep.
    #[error("`{path}` is nested deeper than {max} arrays and objects")]
    TooDeep {
        /// Where the limit was reached.
        path: String,
        /// The limit.
        max: usize,
    },
    /// A number whose exponent is beyond what tally reads.
    #[error(
        "the number at `{path}` has an exponent beyond {max} in magnitude: send it as a string"
    )]
    ExponentOutOfRange {
        /// Where the number is.
        path: String,
        /// The largest exponent read.
        max: u64,
    },
    /// Not valid JSON.
    #[error("invalid JSON in `{path}`: {message}")]
    Json {
        /// Where.
        path: String,
        /// serde_json's description.
        message: String,
    },
}
