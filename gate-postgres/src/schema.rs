//! The schema: its tables and migrations, the prepared statements, and how a state row's
//! value is encoded.

use tally_gate::GateError;
use tokio_postgres::Statement;

/// A state value as stored, in the policy core's format
/// ([`tally_policy::state::encode_frame`]), the same as the embedded backend's.
pub(crate) fn encode<T: tally_policy::state::Stored>(v: &T) -> Vec<u8> {
    tally_policy::state::encode_frame(v)
}

/// A stored state value: state kept in cents by an earlier tally is read exactly in
/// nanodollars; a format it cannot read is refused with its cause.
pub(crate) fn decode<T: tally_policy::state::Stored>(
    what: &str,
    bytes: &[u8],
) -> Result<T, GateError> {
    tally_policy::state::decode_frame(bytes).map_err(|why| {
        GateError::Unavailable(format!(
            "the gate's state for {what} in PostgreSQL is unreadable: {why}"
        ))
    })
}

pub(crate) const SCHEMA_V1: &str = "
CREATE TABLE tally_runs (
    name text PRIMARY KEY,
    state bytea,
    version bigint NOT NULL,
    owner_uid bigint,
    parent text,
    open boolean NOT NULL
);
CREATE INDEX tally_runs_open_parent ON tally_runs (parent) WHERE open;
CREATE INDEX tally_runs_open_owner ON tally_runs (owner_uid) WHERE open;
CREATE TABLE tally_tools (
    name text PRIMARY KEY,
    state bytea NOT NULL,
    in_flight bytea NOT NULL,
    version bigint NOT NULL
);
CREATE TABLE tally_credentials (
    name text PRIMARY KEY,
    state bytea NOT NULL,
    version bigint NOT NULL
);
CREATE TABLE tally_owners (
    owner bigint PRIMARY KEY
);
";

/// Version 2: the state version every decision is recorded at (docs/FLEET.md).
pub(crate) const SCHEMA_V2: &str = "CREATE SEQUENCE IF NOT EXISTS tally_state_version AS bigint;";

/// Version 3: principals' budgets across their runs, one row per uid (docs/GATE.md,
/// "Principals"), shared by every daemon of the fleet.
pub(crate) const SCHEMA_V3: &str = "
CREATE TABLE IF NOT EXISTS tally_principals (
    uid bigint PRIMARY KEY,
    state bytea NOT NULL,
    version bigint NOT NULL
);";

/// Every statement a decision uses, prepared once per connection.
pub(crate) struct Statements {
    pub(crate) run_lock: Statement,
    pub(crate) run_claim: Statement,
    pub(crate) run_exists: Statement,
    pub(crate) runs_open: Statement,
    pub(crate) children: Statement,
    pub(crate) owner_lock: Statement,
    pub(crate) owner_count: Statement,
    pub(crate) owner_runs: Statement,
    pub(crate) tool_lock: Statement,
    pub(crate) tool_insert: Statement,
    pub(crate) breakers: Statement,
    pub(crate) credential_lock: Statement,
    pub(crate) credential_insert: Statement,
    pub(crate) principal_lock: Statement,
    pub(crate) principal_insert: Statement,
    pub(crate) principal_write: Statement,
    pub(crate) write: Statement,
    pub(crate) next_version: Statement,
}

pub(crate) const WRITE: &str = "
WITH r AS (
    INSERT INTO tally_runs (name, state, version, owner_uid, parent, open)
    SELECT $1::text, $2::bytea, 1, $3::bigint, $4::text, $5::boolean WHERE $1::text IS NOT NULL
    ON CONFLICT (name) DO UPDATE SET state = EXCLUDED.state, version = tally_runs.version + 1,
        owner_uid = EXCLUDED.owner_uid, parent = EXCLUDED.parent, open = EXCLUDED.open
    RETURNING version),
t AS (
    INSERT INTO tally_tools (name, state, in_flight, version)
    SELECT $6::text, $7::bytea, $8::bytea, 1 WHERE $6::text IS NOT NULL
    ON CONFLICT (name) DO UPDATE SET state = EXCLUDED.state, in_flight = EXCLUDED.in_flight,
        version = tally_tools.version + 1
    RETURNING version),
c AS (
    INSERT INTO tally_credentials (name, state, version)
    SELECT $9::text, $10::bytea, 1 WHERE $9::text IS NOT NULL
    ON CONFLICT (name) DO UPDATE SET state = EXCLUDED.state, version = tally_credentials.version + 1
    RETURNING version)
SELECT (SELECT version FROM r), (SELECT version FROM t), (SELECT version FROM c)";

/// TCP peers (no uid) count as one owner.
pub(crate) const NO_UID: i64 = -1;
