//! The JSON bodies the daemon sends, as types clients in Rust can deserialize: the wire
//! crate's ([`tally_wire`]). A successful `POST /v1/decisions` replies with `[Receipt]`.

pub use tally_wire::{ErrorDetail, ErrorReply, Health, Receipt};
