//! Reading a stored plaintext: the fast reader of the one canonical form first
//! ([`crate::canonical`]), then the general strict parse, which names what is wrong.

use crate::canonical;
use crate::decision::Decision;
use crate::error::DecisionError;

impl Decision {
    /// Parse a stored plaintext strictly: it must be a valid decision in exactly its
    /// canonical form, with no raw `args`.
    ///
    /// Canonical bytes are read by a reader that accepts that one form and nothing else,
    /// then validated; anything it refuses goes through [`Decision::from_stored_general`],
    /// which names what is wrong. The result is the same either way, only faster.
    pub fn from_stored(bytes: &[u8]) -> Result<Decision, DecisionError> {
        if let Some(d) = canonical::parse(bytes) {
            d.validate()?;
            return Ok(d);
        }
        Decision::from_stored_general(bytes)
    }

    /// [`Decision::from_stored`] into a box: the canonical reader reads the decision
    /// where it stays, so it is not moved (it is about a kilobyte) on its way there. For a
    /// reader that hands decisions on boxed, as the verifier does.
    pub fn from_stored_boxed(bytes: &[u8]) -> Result<Box<Decision>, DecisionError> {
        let mut d = Box::<Decision>::default();
        if let Some(longest) = canonical::parse_into(bytes, &mut d) {
            d.validate_read(longest)?;
            return Ok(d);
        }
        Decision::from_stored_general(bytes).map(Box::new)
    }

    /// The general strict parse of a stored plaintext: JSON parse, no raw `args`, the record
    /// checks, then a re-encoding that must equal the stored bytes. [`Decision::from_stored`]
    /// gives the same result; this one is public so tests and fuzzers can hold the two
    /// to that.
    pub fn from_stored_general(bytes: &[u8]) -> Result<Decision, DecisionError> {
        let text = std::str::from_utf8(bytes).map_err(|_| DecisionError::Json {
            message: "stored decision is not UTF-8".into(),
        })?;
        let d = Decision::from_json(text)?;
        if d.args.is_some() {
            return Err(DecisionError::Invalid {
                field: "args",
                why: "raw arguments must never be stored",
            });
        }
        d.validate()?;
        // Re-encode straight into a comparison with the stored bytes: no second copy.
        let mut same = SameBytes {
            expected: bytes,
            at: 0,
        };
        if serde_json::to_writer(&mut same, &d).is_err() || same.at != bytes.len() {
            return Err(DecisionError::NotCanonical);
        }
        Ok(d)
    }
}

/// An `io::Write` that accepts exactly `expected`, byte for byte, and fails at the first
/// difference (or at more bytes than expected).
struct SameBytes<'a> {
    expected: &'a [u8],
    at: usize,
}

impl std::io::Write for SameBytes<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let end = self.at + buf.len();
        if self.expected.get(self.at..end) != Some(buf) {
            return Err(std::io::Error::other("differs from the canonical encoding"));
        }
        self.at = end;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
