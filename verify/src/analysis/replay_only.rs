//! The streaming replay alone, for a caller that wants only the replay report: the
//! analysis's one fold, fed every event, its replay report returned.

use crate::replay::ReplayReport;
use crate::Event;

use super::{Analysis, Config};

/// The streaming replay alone: the analysis's one fold ([`Analysis`]),
/// whose replay report it returns. Push events in seq order, then finish.
#[derive(Debug)]
pub struct Replay(Analysis);

impl Default for Replay {
    fn default() -> Replay {
        Replay::new()
    }
}

impl Replay {
    /// A new replay.
    pub fn new() -> Replay {
        Replay(Analysis::new(Config::default()))
    }

    /// Take the next event.
    pub fn push(&mut self, e: &Event) {
        self.0.push(e);
    }

    /// The report.
    pub fn finish(self) -> ReplayReport {
        self.0.finish().replay
    }
}
