//! tally's offline verifier.
#![forbid(unsafe_code)]

pub mod analysis;
pub mod event;

pub use event::Event;
