//! The hash maps the walk and the analysis keep names and keys in.
//!
//! Their keys come from the ledger (run, tool and worker names, and keys hashed from
//! them), which whoever wrote the records chose: an attacker could pick names that
//! collide under a hash function known in advance and make every look-up slow. aHash's
//! `RandomState` draws a random key per process from the operating system, as SipHash's
//! does in `std`, and hashes short keys several times faster.

/// A hash map with a random key per process.
pub(crate) type Map<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

/// A hash set with a random key per process.
pub(crate) type Set<T> = std::collections::HashSet<T, ahash::RandomState>;
