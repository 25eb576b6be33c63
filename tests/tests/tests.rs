//! Workspace-level adversarial tests of the verifier (SECURITY.md 5).

mod architecture;
mod backup;
mod bill_rule;
mod crafted;
mod cycles;
mod dimension_names;
mod edge;
mod flips;
mod judged;
mod keys;
mod lengths;
mod loops;
mod principals;
mod reasons;
mod replay;
mod roundtrip;
mod rules_in_core;
mod seals;
mod sources;
mod store;
mod tamper;
mod tree_thread;
mod truncation;
