//! Who asks the gate. The requests and answers themselves are the wire's
//! ([`tally_wire`]): the gate decides with them, every client sends and reads them.

/// Who is asking: the peer's uid as the socket reports it (`None` in-process).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    /// The peer's Unix uid.
    pub uid: Option<u32>,
    /// Whether this is the operator (the operator socket, or an in-process owner).
    pub operator: bool,
    /// Whether this is tally's proxy acting for the run's owner (`uid` is that owner):
    /// its checks mark their attempts as the proxy's, whose outcomes only it reports.
    pub proxied: bool,
}

impl Caller {
    /// Refused `not_authorized` (with `why`) unless this is the operator.
    pub(crate) fn operator_only(&self, why: &str) -> Result<(), crate::GateError> {
        if self.operator {
            Ok(())
        } else {
            Err(crate::GateError::NotAuthorized(why.into()))
        }
    }
}
