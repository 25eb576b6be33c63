//! W3C Trace Context (https://www.w3.org/TR/trace-context/): the `traceparent` header an
//! agent may send with a check. Its trace id is recorded on the decision, so an auditor
//! can join the ledger to the agent's traces. A header that is not exactly a valid
//! version-00 `traceparent` is ignored (the check goes on without a trace id), never an
//! error: tracing must not change what the gate decides.

/// The trace id of a `traceparent` value: `00-{32 hex}-{16 hex}-{2 hex}`, lowercase,
/// neither id all zeros. Anything else is `None`.
pub(crate) fn trace_id(traceparent: &str) -> Option<String> {
    let mut parts = traceparent.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || version != "00" {
        return None;
    }
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let zero = |s: &str| s.bytes().all(|b| b == b'0');
    if !hex(trace, 32) || !hex(parent, 16) || !hex(flags, 2) || zero(trace) || zero(parent) {
        return None;
    }
    Some(trace.to_owned())
}

#[cfg(test)]
mod tests {
    use super::trace_id;

    #[test]
    fn only_an_exact_traceparent_gives_a_trace_id() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            trace_id(ok).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert_eq!(trace_id(bad), None, "{bad}");
        }
    }
}
