//! The MCP proxy's classifier (`tally mcp`, every line a client sends): never panics;
//! whatever a lenient reader could take for a `tools/call` is classified as that call or
//! refused, and what passes is forwarded as bytes that read as what was classified. The
//! invariant is `tally_mcp::fuzzing::classify`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tally_mcp::fuzzing::classify(data));
