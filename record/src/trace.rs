//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the `traceparent` an agent
//! may send with a check (an HTTP header on `POST /v1/check` or a proxied model call, an
//! MCP `tools/call`'s `params._meta.traceparent`), and the `tracestate` that goes with it.
//!
//! Parsed strictly, for every door the same way: exactly a version-`00` `traceparent`
//! (`00-{32 hex}-{16 hex}-{2 hex}`, lowercase, neither id all zeros, no further field).
//! Anything else (another version, `ff` included; uppercase; a wrong length; extra
//! fields) is no parent at all: the check starts a fresh trace, never an error, and never
//! passes the bad value on. Tracing must not change what the gate decides.

/// A valid `traceparent`: the trace, the caller's span in it, and whether the caller
/// sampled it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Traceparent {
    /// The trace id, 32 lowercase hex characters, not all zeros.
    pub trace_id: String,
    /// The caller's span id (the parent), 16 lowercase hex characters, not all zeros.
    pub span_id: String,
    /// The flags' sampled bit: the caller records this trace.
    pub sampled: bool,
}

/// The most `tracestate` bytes passed on: 32 list members of the W3C's usual size. A
/// longer value is dropped whole (W3C lets a vendor drop it rather than guess which
/// members to keep).
pub const MAX_TRACESTATE_BYTES: usize = 512;

impl Traceparent {
    /// `value` parsed strictly; `None` unless it is exactly a valid version-00 header.
    pub fn parse(value: &str) -> Option<Traceparent> {
        let mut parts = value.split('-');
        let (version, trace, parent, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || version != "00" {
            return None;
        }
        let hex = |s: &str, n: usize| {
            s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        let zero = |s: &str| s.bytes().all(|b| b == b'0');
        if !hex(trace, 32) || !hex(parent, 16) || !hex(flags, 2) || zero(trace) || zero(parent) {
            return None;
        }
        Some(Traceparent {
            trace_id: trace.to_owned(),
            span_id: parent.to_owned(),
            sampled: u8::from_str_radix(flags, 16).is_ok_and(|f| f & 1 == 1),
        })
    }

    /// The header value naming this parent (version 00; only the sampled flag is kept).
    pub fn header(&self) -> String {
        format!(
            "00-{}-{}-{}",
            self.trace_id,
            self.span_id,
            if self.sampled { "01" } else { "00" }
        )
    }
}

/// The trace context of an incoming request, from its headers' values: the
/// `traceparent` values (W3C: more than one is invalid, so none is taken) and the
/// `tracestate` values (joined by `,`, as HTTP combines repeated fields). The
/// `tracestate` is kept only beside a valid `traceparent`, and only if it is header-safe
/// (visible ASCII, spaces and tabs) and at most [`MAX_TRACESTATE_BYTES`]; its members are
/// checked by whoever builds a span from it.
pub fn incoming<'a>(
    traceparents: impl IntoIterator<Item = &'a str>,
    tracestates: impl IntoIterator<Item = &'a str>,
) -> Option<(Traceparent, Option<String>)> {
    let mut tp = traceparents.into_iter();
    let (Some(one), None) = (tp.next(), tp.next()) else {
        return None;
    };
    let parent = Traceparent::parse(one)?;
    let state: Vec<&str> = tracestates.into_iter().collect();
    let state = state.join(",");
    Some((parent, tracestate(&state).map(str::to_owned)))
}

/// A `tracestate` value that may be passed on: not empty, header-safe (visible ASCII,
/// spaces and tabs), at most [`MAX_TRACESTATE_BYTES`].
pub fn tracestate(value: &str) -> Option<&str> {
    let ok = !value.trim().is_empty()
        && value.len() <= MAX_TRACESTATE_BYTES
        && value
            .bytes()
            .all(|b| b == b'\t' || (0x20..0x7f).contains(&b));
    ok.then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn only_an_exact_version_00_traceparent_parses() {
        let p = Traceparent::parse(OK).expect("valid");
        assert_eq!(p.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.span_id, "00f067aa0ba902b7");
        assert!(p.sampled);
        assert_eq!(p.header(), OK);
        let unsampled =
            Traceparent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
                .expect("valid");
        assert!(!unsampled.sampled);
        // Flags other than sampled are read, not kept.
        let other = Traceparent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03")
            .expect("valid");
        assert!(other.sampled);
        assert_eq!(other.header(), OK);
        for bad in [
            "",
            "-",
            "00",
            "00---",
            // Another version: 01 (not known here), ff (forbidden by W3C).
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // Uppercase hex anywhere.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A",
            "0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // All-zero ids.
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // Extra fields.
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            // Wrong lengths.
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47366-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b77-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-001",
            "000-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            // Not hex, signs, spaces, other separators, non-ASCII.
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01",
        ] {
            assert_eq!(Traceparent::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn one_traceparent_and_a_header_safe_tracestate() {
        let (p, s) = incoming([OK], ["a=1", "b=2"]).expect("valid");
        assert_eq!(p.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(s.as_deref(), Some("a=1,b=2"));
        assert_eq!(incoming([OK], []).expect("valid").1, None);
        // Two traceparents: neither is believed.
        assert_eq!(incoming([OK, OK], ["a=1"]), None);
        assert_eq!(incoming([], ["a=1"]), None);
        // A tracestate beside an invalid traceparent is dropped with it.
        assert_eq!(incoming(["01-x"], ["a=1"]), None);
        // A tracestate that is not header-safe, or too long, is dropped; the parent stays.
        for bad in ["a=1\n", "a=\u{7f}", "a=é", " ", &"a".repeat(513)] {
            let (_, s) = incoming([OK], [bad]).expect("the parent stays");
            assert_eq!(s, None, "{bad:?}");
        }
        assert!(tracestate(&"a".repeat(512)).is_some());
    }
}
