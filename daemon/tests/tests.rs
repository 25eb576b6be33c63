//! The append daemon's integration tests: each starts the real server on a temporary
//! Unix socket over a temporary ledger and checks the store afterwards.

mod common;

mod api;
mod approvals;
mod clients;
mod concurrency;
mod edge;
mod failure;
mod flood;
mod gate;
mod gate_client;
mod kill;
mod lifecycle;
mod mcp_connections;
mod mcp_gateway;
mod mcp_hardened;
mod money;
mod notify;
mod ownership;
mod proxied;
mod refill;
mod review;
mod schema;
mod strict;
mod tiles;
mod view;
