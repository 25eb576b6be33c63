//! The scopes whose state one decision reads and writes: the names a backend reads,
//! locks and writes back for it.

/// The scopes whose state one decision reads and writes.
#[derive(Clone, Copy, Debug)]
pub struct Scopes<'a> {
    /// The run.
    pub run: &'a str,
    /// The downstream tool, if the decision touches one.
    pub tool: Option<&'a str>,
    /// The credential, if the decision touches one.
    pub credential: Option<&'a str>,
    /// The principal (a uid, in decimal), if the decision touches one.
    pub principal: Option<&'a str>,
}

impl<'a> Scopes<'a> {
    /// The run alone.
    pub fn run(run: &'a str) -> Scopes<'a> {
        Scopes {
            run,
            tool: None,
            credential: None,
            principal: None,
        }
    }
}
