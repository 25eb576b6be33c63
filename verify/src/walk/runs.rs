//! The run links on the walk (with the auditor key): each run's last decision, against
//! which the next one's `prev_seq` is judged.

use tally_ledger::Decision;

/// Each run's last decision as delivered, and the decisions that could not be read.
#[derive(Default)]
pub(super) struct Runs {
    /// Each run's last decision seq, and whether it carried a run link.
    links: crate::hash::Map<String, (u64, bool)>,
    /// Decisions that did not decrypt or were invalid (a link to one is not a finding).
    unreadable: crate::hash::Set<u64>,
}

impl Runs {
    /// The decision at `seq` could not be read.
    pub(super) fn unreadable(&mut self, seq: u64) {
        self.unreadable.insert(seq);
    }

    /// A decrypted decision's run link: `prev_seq` must be its run's previous decision.
    /// Why it is not, if it is not.
    pub(super) fn link(&mut self, seq: u64, d: &Decision) -> Option<String> {
        if d.run.is_empty() {
            return None;
        }
        // One look-up of the run's name: its entry is read and updated in place; the
        // name is copied once, at the run's first decision.
        let last = (seq, d.prev_seq.is_some());
        let before = match self.links.get_mut(d.run.as_str()) {
            Some(l) => Some(std::mem::replace(l, last)),
            None => {
                self.links.insert(d.run.clone(), last);
                None
            }
        };
        match (d.prev_seq, before) {
            // A link to a decision that could not be read: that one is the finding.
            (Some(p), _) if !self.unreadable.is_empty() && self.unreadable.contains(&p) => None,
            (Some(p), Some((last, _))) if p != last => Some(format!(
                "names seq {p} as its run's previous decision, but that is seq {last}"
            )),
            (Some(p), None) => Some(format!(
                "names seq {p} as its run's previous decision, but it is the run's first here"
            )),
            (None, Some((last, true))) => Some(format!(
                "carries no link to its run's previous decision (seq {last})"
            )),
            _ => None,
        }
    }
}
