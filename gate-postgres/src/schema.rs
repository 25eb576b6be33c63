//! The schema: its tables and migrations, the prepared statements, and how a state row's
//! value is encoded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
    pub(crate) runs_named: Statement,
    pub(crate) children: Statement,
    pub(crate) owner_lock: Statement,
    pub(crate) owner_count: Statement,
    pub(crate) owner_runs: Statement,
    pub(crate) tool_lock: Statement,
    pub(crate) tool_insert: Statement,
    pub(crate) breakers: Statement,
    /// The breakers of the tools named (a holder's views, refreshed).
    pub(crate) breakers_of: Statement,
    pub(crate) credential_lock: Statement,
    pub(crate) credential_insert: Statement,
    pub(crate) principal_lock: Statement,
    pub(crate) principal_insert: Statement,
    pub(crate) principal_write: Statement,
    pub(crate) write: Statement,
    pub(crate) next_version: Statement,
    pub(crate) lease_step: Statement,
    /// A run's row (locked), home and scope (`lease::home`).
    pub(crate) home_read: Statement,
    /// A run at home here locked, if still at home here (`lease::home`).
    pub(crate) home_guard: Statement,
    pub(crate) home_guard_sealed: Statement,
    pub(crate) lease_raise: Statement,
    /// A run's state written by the holder it lives on (`lease::home::HOME_WRITE`).
    pub(crate) home_write: Statement,
}

pub(crate) const WRITE: &str = "
WITH r AS (
    INSERT INTO tally_runs (name, state, version, owner_uid, parent, open)
    SELECT $1::text, $2::bytea, 1, $3::bigint, $4::text, $5::boolean WHERE $1::text IS NOT NULL
    ON CONFLICT (name) DO UPDATE SET state = EXCLUDED.state, version = tally_runs.version + 1,
        owner_uid = EXCLUDED.owner_uid, parent = EXCLUDED.parent, open = EXCLUDED.open,
        home = NULL
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

/// Version 4: leased slices of budgets (docs/FLEET.md, "Leased slices"): each scope's
/// caps and what is settled, held centrally and leased out; every slice granted; each
/// holder's epoch. `tally_lease_scopes_within` holds the invariant on every row: while
/// any slice of a scope is out, settled + held + leased is within each cap (a cap of
/// NULL: no limit). The grant's conditional update (`lease::sql::GRANT`) is what keeps
/// it under races; the constraint refuses any other write that would break it.
pub(crate) const SCHEMA_V4: &str = "
CREATE TABLE IF NOT EXISTS tally_lease_scopes (
    kind text NOT NULL CHECK (kind IN ('run', 'principal', 'credential', 'bucket')),
    key text NOT NULL,
    cap_attempts bigint, cap_nanos bigint, cap_effects bigint, cap_polls bigint,
    settled_attempts bigint NOT NULL DEFAULT 0, settled_nanos bigint NOT NULL DEFAULT 0,
    settled_effects bigint NOT NULL DEFAULT 0, settled_polls bigint NOT NULL DEFAULT 0,
    held_attempts bigint NOT NULL DEFAULT 0, held_nanos bigint NOT NULL DEFAULT 0,
    held_effects bigint NOT NULL DEFAULT 0, held_polls bigint NOT NULL DEFAULT 0,
    leased_attempts bigint NOT NULL DEFAULT 0, leased_nanos bigint NOT NULL DEFAULT 0,
    leased_effects bigint NOT NULL DEFAULT 0, leased_polls bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (kind, key),
    CONSTRAINT tally_lease_scopes_nonnegative CHECK (least(
        settled_attempts, settled_nanos, settled_effects, settled_polls,
        held_attempts, held_nanos, held_effects, held_polls,
        leased_attempts, leased_nanos, leased_effects, leased_polls) >= 0),
    CONSTRAINT tally_lease_scopes_within CHECK (
        leased_attempts + leased_nanos + leased_effects + leased_polls = 0 OR (
        (cap_attempts IS NULL OR settled_attempts + held_attempts + leased_attempts <= cap_attempts)
        AND (cap_nanos IS NULL OR settled_nanos + held_nanos + leased_nanos <= cap_nanos)
        AND (cap_effects IS NULL OR settled_effects + held_effects + leased_effects <= cap_effects)
        AND (cap_polls IS NULL OR settled_polls + held_polls + leased_polls <= cap_polls)))
);
CREATE TABLE IF NOT EXISTS tally_lease_holders (
    holder text PRIMARY KEY,
    epoch bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS tally_leases (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind text NOT NULL,
    key text NOT NULL,
    holder text NOT NULL REFERENCES tally_lease_holders (holder),
    epoch bigint NOT NULL,
    attempts bigint NOT NULL CHECK (attempts >= 0),
    nanos bigint NOT NULL CHECK (nanos >= 0),
    effects bigint NOT NULL CHECK (effects >= 0),
    polls bigint NOT NULL CHECK (polls >= 0),
    state text NOT NULL CHECK (state IN ('held', 'returned', 'reclaimed')),
    used_attempts bigint, used_nanos bigint, used_effects bigint, used_polls bigint,
    granted_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    ended_at timestamptz,
    FOREIGN KEY (kind, key) REFERENCES tally_lease_scopes (kind, key)
);
CREATE INDEX IF NOT EXISTS tally_leases_scope ON tally_leases (kind, key, granted_at);
CREATE INDEX IF NOT EXISTS tally_leases_held ON tally_leases (expires_at) WHERE state = 'held';
CREATE INDEX IF NOT EXISTS tally_leases_holder ON tally_leases (holder) WHERE state = 'held';
";

/// Version 5: a scope's slices can be revoked (its run paused or killed): no grant and
/// no renewal of its slices while `revoked`; and `tally_lease_step`, which a central
/// decision calls in its own transaction to move its run's scope in step with the run
/// (settled up by what it took, down by what it gave back), refusing (the transaction
/// fails) a use that does not fit beside the slices out, and revoking the scope's slices
/// when the run is paused or stopped (allowed again on resume). A run without a scope:
/// nothing.
pub(crate) const SCHEMA_V5: &str = "
ALTER TABLE tally_lease_scopes ADD COLUMN IF NOT EXISTS revoked boolean NOT NULL DEFAULT false;
CREATE OR REPLACE FUNCTION tally_lease_step(k text, name text, a bigint, n bigint, e bigint, p bigint,
    r boolean)
RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    IF r IS NOT NULL THEN
        UPDATE tally_lease_scopes SET revoked = r WHERE kind = k AND key = name;
    END IF;
    IF a = 0 AND n = 0 AND e = 0 AND p = 0 THEN
        RETURN;
    END IF;
    UPDATE tally_lease_scopes SET
        settled_attempts = greatest(settled_attempts + a, 0),
        settled_nanos = greatest(settled_nanos + n, 0),
        settled_effects = greatest(settled_effects + e, 0),
        settled_polls = greatest(settled_polls + p, 0)
    WHERE kind = k AND key = name
      AND (a <= 0 OR cap_attempts IS NULL OR settled_attempts + held_attempts + leased_attempts + a <= cap_attempts)
      AND (n <= 0 OR cap_nanos IS NULL OR settled_nanos + held_nanos + leased_nanos + n <= cap_nanos)
      AND (e <= 0 OR cap_effects IS NULL OR settled_effects + held_effects + leased_effects + e <= cap_effects)
      AND (p <= 0 OR cap_polls IS NULL OR settled_polls + held_polls + leased_polls + p <= cap_polls);
    IF NOT FOUND AND EXISTS (SELECT 1 FROM tally_lease_scopes WHERE kind = k AND key = name) THEN
        RAISE EXCEPTION 'lease scope % %: no room left beside the slices out', k, name
            USING ERRCODE = 'check_violation';
    END IF;
END
$f$;
";

/// Version 6: a central decision that settles what its run already did (an outcome
/// above its reservation: `tally_policy::incurred`) is applied whatever room is left
/// (`bill`): the bill was incurred before it was recorded. What it puts a scope past its
/// cap beside the slices out is kept in `billed_*`, which the invariant allows for and
/// nothing else raises: grants, renewals' scopes and central spends are still held to the
/// cap itself, so later uses are refused instead.
pub(crate) const SCHEMA_V6: &str = "
ALTER TABLE tally_lease_scopes
    ADD COLUMN IF NOT EXISTS billed_attempts bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS billed_nanos bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS billed_effects bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS billed_polls bigint NOT NULL DEFAULT 0;
ALTER TABLE tally_lease_scopes DROP CONSTRAINT IF EXISTS tally_lease_scopes_within;
ALTER TABLE tally_lease_scopes ADD CONSTRAINT tally_lease_scopes_within CHECK (
    leased_attempts + leased_nanos + leased_effects + leased_polls = 0 OR (
    (cap_attempts IS NULL OR settled_attempts + held_attempts + leased_attempts <= cap_attempts + billed_attempts)
    AND (cap_nanos IS NULL OR settled_nanos + held_nanos + leased_nanos <= cap_nanos + billed_nanos)
    AND (cap_effects IS NULL OR settled_effects + held_effects + leased_effects <= cap_effects + billed_effects)
    AND (cap_polls IS NULL OR settled_polls + held_polls + leased_polls <= cap_polls + billed_polls)));
DROP FUNCTION IF EXISTS tally_lease_step(text, text, bigint, bigint, bigint, bigint, boolean);
CREATE OR REPLACE FUNCTION tally_lease_step(k text, name text, a bigint, n bigint, e bigint, p bigint,
    r boolean, bill boolean)
RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    IF r IS NOT NULL THEN
        UPDATE tally_lease_scopes SET revoked = r WHERE kind = k AND key = name;
    END IF;
    IF a = 0 AND n = 0 AND e = 0 AND p = 0 THEN
        RETURN;
    END IF;
    IF bill THEN
        UPDATE tally_lease_scopes SET
            settled_attempts = greatest(settled_attempts + a, 0),
            settled_nanos = greatest(settled_nanos + n, 0),
            settled_effects = greatest(settled_effects + e, 0),
            settled_polls = greatest(settled_polls + p, 0),
            billed_attempts = CASE WHEN cap_attempts IS NULL THEN billed_attempts ELSE greatest(billed_attempts,
                greatest(settled_attempts + a, 0) + held_attempts + leased_attempts - cap_attempts) END,
            billed_nanos = CASE WHEN cap_nanos IS NULL THEN billed_nanos ELSE greatest(billed_nanos,
                greatest(settled_nanos + n, 0) + held_nanos + leased_nanos - cap_nanos) END,
            billed_effects = CASE WHEN cap_effects IS NULL THEN billed_effects ELSE greatest(billed_effects,
                greatest(settled_effects + e, 0) + held_effects + leased_effects - cap_effects) END,
            billed_polls = CASE WHEN cap_polls IS NULL THEN billed_polls ELSE greatest(billed_polls,
                greatest(settled_polls + p, 0) + held_polls + leased_polls - cap_polls) END
        WHERE kind = k AND key = name;
        RETURN;
    END IF;
    UPDATE tally_lease_scopes SET
        settled_attempts = greatest(settled_attempts + a, 0),
        settled_nanos = greatest(settled_nanos + n, 0),
        settled_effects = greatest(settled_effects + e, 0),
        settled_polls = greatest(settled_polls + p, 0)
    WHERE kind = k AND key = name
      AND (a <= 0 OR cap_attempts IS NULL OR settled_attempts + held_attempts + leased_attempts + a <= cap_attempts)
      AND (n <= 0 OR cap_nanos IS NULL OR settled_nanos + held_nanos + leased_nanos + n <= cap_nanos)
      AND (e <= 0 OR cap_effects IS NULL OR settled_effects + held_effects + leased_effects + e <= cap_effects)
      AND (p <= 0 OR cap_polls IS NULL OR settled_polls + held_polls + leased_polls + p <= cap_polls);
    IF NOT FOUND AND EXISTS (SELECT 1 FROM tally_lease_scopes WHERE kind = k AND key = name) THEN
        RAISE EXCEPTION 'lease scope % %: no room left beside the slices out', k, name
            USING ERRCODE = 'check_violation';
    END IF;
END
$f$;
";

/// Version 7: a rolling upgrade keeps working, and a bill is a bill of cost only.
/// `tally_lease_step` with seven arguments (what daemons of schema 5 call on every
/// central decision) is back, as the eight-argument one with `bill` false. A bill
/// (`bill`) passes the cap in nanodollars only: attempts, side effects and polls are
/// held to their caps as any central use is, and `billed_*` of those no longer rises.
pub(crate) const SCHEMA_V7: &str = "
CREATE OR REPLACE FUNCTION tally_lease_step(k text, name text, a bigint, n bigint, e bigint, p bigint,
    r boolean, bill boolean)
RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    IF r IS NOT NULL THEN
        UPDATE tally_lease_scopes SET revoked = r WHERE kind = k AND key = name;
    END IF;
    IF a = 0 AND n = 0 AND e = 0 AND p = 0 THEN
        RETURN;
    END IF;
    UPDATE tally_lease_scopes SET
        settled_attempts = greatest(settled_attempts + a, 0),
        settled_nanos = greatest(settled_nanos + n, 0),
        settled_effects = greatest(settled_effects + e, 0),
        settled_polls = greatest(settled_polls + p, 0),
        billed_nanos = CASE WHEN NOT bill OR cap_nanos IS NULL THEN billed_nanos ELSE greatest(billed_nanos,
            greatest(settled_nanos + n, 0) + held_nanos + leased_nanos - cap_nanos) END
    WHERE kind = k AND key = name
      AND (a <= 0 OR cap_attempts IS NULL OR settled_attempts + held_attempts + leased_attempts + a <= cap_attempts)
      AND (n <= 0 OR bill OR cap_nanos IS NULL OR settled_nanos + held_nanos + leased_nanos + n <= cap_nanos)
      AND (e <= 0 OR cap_effects IS NULL OR settled_effects + held_effects + leased_effects + e <= cap_effects)
      AND (p <= 0 OR cap_polls IS NULL OR settled_polls + held_polls + leased_polls + p <= cap_polls);
    IF NOT FOUND AND EXISTS (SELECT 1 FROM tally_lease_scopes WHERE kind = k AND key = name) THEN
        RAISE EXCEPTION 'lease scope % %: no room left beside the slices out', k, name
            USING ERRCODE = 'check_violation';
    END IF;
END
$f$;
CREATE OR REPLACE FUNCTION tally_lease_step(k text, name text, a bigint, n bigint, e bigint, p bigint,
    r boolean)
RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM tally_lease_step(k, name, a, n, e, p, r, false);
END
$f$;
";

/// Version 8: a run's home (docs/FLEET.md, "The leased mode"): the holder deciding a
/// leased run on its own copy of the run's state, written through on every decision it
/// makes (guarded by this column), or NULL. A central write of the run takes the home
/// back (sets it NULL): the holder's next write fails its guard and reloads the row.
pub(crate) const SCHEMA_V8: &str = "
ALTER TABLE tally_runs ADD COLUMN IF NOT EXISTS home text;
CREATE OR REPLACE FUNCTION tally_home_write(n text, s bytea, o boolean, h text, expected text)
RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    UPDATE tally_runs SET state = s, version = version + 1, open = o, home = h
    WHERE name = n AND state IS NOT NULL AND home IS NOT DISTINCT FROM expected;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % is no longer at home on this host (a central decision took it back, or another host took it over): retry', n
            USING ERRCODE = 'serialization_failure';
    END IF;
END
$f$;
";

/// Version 9: a run's home is kept only by its home's own write. Every other UPDATE of
/// a run's row clears its home (a trigger), whatever the statement says: so a daemon of
/// an earlier schema, whose central write leaves `home` as it is, still takes the home
/// back, and the holder's next write fails its guard. `tally_home_write` says it is a
/// home write with a transaction-local flag, set for its own UPDATE only. A home is its
/// holder and the holder's epoch (`home_epoch`): two processes under one holder name (a
/// rolling deploy, a frozen process resumed) never pass each other's guard.
pub(crate) const SCHEMA_V9: &str = "
ALTER TABLE tally_runs ADD COLUMN IF NOT EXISTS home_epoch bigint;
UPDATE tally_runs SET home = NULL WHERE home IS NOT NULL;
CREATE OR REPLACE FUNCTION tally_home_kept() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF coalesce(current_setting('tally.home_write', true), '') <> 'on' THEN
        NEW.home := NULL;
        NEW.home_epoch := NULL;
    END IF;
    RETURN NEW;
END
$f$;
DROP TRIGGER IF EXISTS tally_runs_home ON tally_runs;
CREATE TRIGGER tally_runs_home BEFORE UPDATE ON tally_runs
    FOR EACH ROW EXECUTE FUNCTION tally_home_kept();
CREATE OR REPLACE FUNCTION tally_home_write(n text, s bytea, o boolean, h text, he bigint,
    expected text, expected_epoch bigint)
RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM set_config('tally.home_write', 'on', true);
    UPDATE tally_runs SET state = s, version = version + 1, open = o, home = h, home_epoch = he
    WHERE name = n AND state IS NOT NULL AND home IS NOT DISTINCT FROM expected
      AND home_epoch IS NOT DISTINCT FROM expected_epoch;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % is no longer at home on this host (a central decision took it back, or another host took it over): retry', n
            USING ERRCODE = 'serialization_failure';
    END IF;
    PERFORM set_config('tally.home_write', '', true);
END
$f$;
";

/// Version 10: a scope with no room left is told apart from one whose room is in
/// slices out. `tally_lease_step` (same arguments, so a daemon of schema 9 beside it calls
/// it unchanged and is refused as before) raises its `check_violation` with the detail
/// `exhausted` where the use would not fit even with no slice out and every slice
/// reclaimed (settled whole) but not yet given back by its holder refunded whole
/// (settled less those + held + use past a cap): the gate then refuses with the
/// budget's reason instead of a retry. Only a reclaimed slice whose holder's epoch is
/// still the slice's may be given back (a later epoch's `release` of it is refused):
/// one of a dead and restarted, or fenced, holder is settled whole for good.
/// `tally_leases_reclaimed` finds a scope's reclaimed slices.
/// Step 10 was amended in place after it shipped (the partial index, and reclaimed
/// slices counted only while their holder's epoch holds): a database found at 10 runs
/// it again, before the later steps (their functions replace step 10's). Every
/// statement in it is `CREATE OR REPLACE` or `IF NOT EXISTS`. A database found later
/// runs nothing again: no lock taken on a table at each open.
const AMENDED: i32 = 10;

pub(crate) const SCHEMA_V10: &str = "
CREATE INDEX IF NOT EXISTS tally_leases_reclaimed ON tally_leases (kind, key) WHERE state = 'reclaimed';
CREATE OR REPLACE FUNCTION tally_lease_step(k text, name text, a bigint, n bigint, e bigint, p bigint,
    r boolean, bill boolean)
RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    IF r IS NOT NULL THEN
        UPDATE tally_lease_scopes SET revoked = r WHERE kind = k AND key = name;
    END IF;
    IF a = 0 AND n = 0 AND e = 0 AND p = 0 THEN
        RETURN;
    END IF;
    UPDATE tally_lease_scopes SET
        settled_attempts = greatest(settled_attempts + a, 0),
        settled_nanos = greatest(settled_nanos + n, 0),
        settled_effects = greatest(settled_effects + e, 0),
        settled_polls = greatest(settled_polls + p, 0),
        billed_nanos = CASE WHEN NOT bill OR cap_nanos IS NULL THEN billed_nanos ELSE greatest(billed_nanos,
            greatest(settled_nanos + n, 0) + held_nanos + leased_nanos - cap_nanos) END
    WHERE kind = k AND key = name
      AND (a <= 0 OR cap_attempts IS NULL OR settled_attempts + held_attempts + leased_attempts + a <= cap_attempts)
      AND (n <= 0 OR bill OR cap_nanos IS NULL OR settled_nanos + held_nanos + leased_nanos + n <= cap_nanos)
      AND (e <= 0 OR cap_effects IS NULL OR settled_effects + held_effects + leased_effects + e <= cap_effects)
      AND (p <= 0 OR cap_polls IS NULL OR settled_polls + held_polls + leased_polls + p <= cap_polls);
    IF NOT FOUND AND EXISTS (SELECT 1 FROM tally_lease_scopes s, LATERAL (
        SELECT coalesce(sum(attempts), 0) ra, coalesce(sum(nanos), 0) rn,
            coalesce(sum(effects), 0) re, coalesce(sum(polls), 0) rp
        FROM tally_leases l JOIN tally_lease_holders h ON h.holder = l.holder AND h.epoch = l.epoch
        WHERE l.kind = k AND l.key = name AND l.state = 'reclaimed') r
      WHERE s.kind = k AND s.key = name
      AND ((a > 0 AND cap_attempts IS NOT NULL AND settled_attempts - ra + held_attempts + a > cap_attempts)
        OR (n > 0 AND NOT bill AND cap_nanos IS NOT NULL AND settled_nanos - rn + held_nanos + n > cap_nanos)
        OR (e > 0 AND cap_effects IS NOT NULL AND settled_effects - re + held_effects + e > cap_effects)
        OR (p > 0 AND cap_polls IS NOT NULL AND settled_polls - rp + held_polls + p > cap_polls))) THEN
        RAISE EXCEPTION 'lease scope % %: no room left', k, name
            USING ERRCODE = 'check_violation', DETAIL = 'exhausted';
    END IF;
    IF NOT FOUND AND EXISTS (SELECT 1 FROM tally_lease_scopes WHERE kind = k AND key = name) THEN
        RAISE EXCEPTION 'lease scope % %: no room left beside the slices out', k, name
            USING ERRCODE = 'check_violation';
    END IF;
END
$f$;
";

/// Version 11: a slice's committed use (docs/FLEET.md, "Committed use"). Every decision
/// at home commits, in its run's guarded write (`tally_home_write`, now with the slice it
/// took on and the one it gave back on), the use it took of its slice and what it gave
/// back, so `committed_*` of a held slice is always an upper bound of the net use its
/// holder answered on it. The write locks the slice's row and is refused (the
/// transaction fails, `serialization_failure` as a run taken back) unless the slice is
/// held by this holder at this epoch and unexpired, or was returned by it at this epoch
/// by a return that settled all it said it used (`covers_use`: that return said a use
/// counting this one: the holder counts a use before its decision is queued, and
/// returns a slice only after); the committed use never passes the slice. A reclaim
/// settles the committed use, records it (`used_*`) and gives the rest back; a late
/// return starts from what it recorded (NULL, a schema-10 build's reclaim: the whole
/// slice), and where that is less than its holder says, settles nothing and leaves
/// `covers_use` false; an adoption starts from the committed use. NULL committed use (a
/// slice granted by a manager that commits no use, or out before this version): not
/// known, settled whole as before (and a use on it checked as above, never counted).
/// `tally_lease_step`'s `exhausted` counts of a reclaimed slice what its return may still
/// refund: what its reclaim settled above its committed use. The columns are added only
/// where missing and the CHECK `NOT VALID` (new columns, all NULL: no scan under the
/// table's lock).
pub(crate) const SCHEMA_V11: &str = "
DO $d$ BEGIN
    IF (SELECT count(*) FROM pg_attribute WHERE attrelid = 'tally_leases'::regclass AND NOT attisdropped
        AND attname IN ('committed_attempts', 'committed_nanos', 'committed_effects', 'committed_polls',
            'covers_use')) < 5 THEN
        ALTER TABLE tally_leases
            ADD COLUMN IF NOT EXISTS committed_attempts bigint, ADD COLUMN IF NOT EXISTS committed_nanos bigint,
            ADD COLUMN IF NOT EXISTS committed_effects bigint, ADD COLUMN IF NOT EXISTS committed_polls bigint,
            ADD COLUMN IF NOT EXISTS covers_use boolean;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'tally_leases_committed_within'
                   AND conrelid = 'tally_leases'::regclass) THEN
        ALTER TABLE tally_leases ADD CONSTRAINT tally_leases_committed_within CHECK (
            (committed_attempts IS NULL) = (committed_nanos IS NULL)
            AND (committed_attempts IS NULL) = (committed_effects IS NULL)
            AND (committed_attempts IS NULL) = (committed_polls IS NULL)
            AND coalesce(committed_attempts BETWEEN 0 AND attempts, true)
            AND coalesce(committed_nanos BETWEEN 0 AND nanos, true)
            AND coalesce(committed_effects BETWEEN 0 AND effects, true)
            AND coalesce(committed_polls BETWEEN 0 AND polls, true)) NOT VALID;
    END IF;
END $d$;
CREATE OR REPLACE FUNCTION tally_home_write(n text, s bytea, o boolean, h text, he bigint,
    expected text, expected_epoch bigint, me text, me_epoch bigint, took_on bigint,
    took bigint[], gave_on bigint, gave bigint[], at timestamptz)
RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM tally_home_write(n, s, o, h, he, expected, expected_epoch);
    IF gave_on IS NOT NULL THEN
        UPDATE tally_leases SET
            committed_attempts = greatest(committed_attempts - gave[1], 0),
            committed_nanos = greatest(committed_nanos - gave[2], 0),
            committed_effects = greatest(committed_effects - gave[3], 0),
            committed_polls = greatest(committed_polls - gave[4], 0)
        WHERE id = gave_on AND holder = me AND epoch = me_epoch AND state = 'held'
          AND committed_attempts IS NOT NULL;
    END IF;
    IF took_on IS NULL THEN
        RETURN;
    END IF;
    UPDATE tally_leases SET
        committed_attempts = committed_attempts + CASE WHEN attempts = 0 THEN 0 ELSE took[1] END,
        committed_nanos = committed_nanos + CASE WHEN nanos = 0 THEN 0 ELSE took[2] END,
        committed_effects = committed_effects + CASE WHEN effects = 0 THEN 0 ELSE took[3] END,
        committed_polls = committed_polls + CASE WHEN polls = 0 THEN 0 ELSE took[4] END
    WHERE id = took_on AND holder = me AND epoch = me_epoch AND state = 'held'
      AND expires_at > coalesce(at, now())
      AND (attempts = 0 OR coalesce(committed_attempts, 0) + took[1] <= attempts)
      AND (nanos = 0 OR coalesce(committed_nanos, 0) + took[2] <= nanos)
      AND (effects = 0 OR coalesce(committed_effects, 0) + took[3] <= effects)
      AND (polls = 0 OR coalesce(committed_polls, 0) + took[4] <= polls);
    IF FOUND OR EXISTS (SELECT 1 FROM tally_leases WHERE id = took_on AND holder = me
        AND epoch = me_epoch AND state = 'returned' AND covers_use) THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'slice % of run % is no longer held by this host (reclaimed, expired, or its holder restarted): retry', took_on, n
        USING ERRCODE = 'serialization_failure', DETAIL = 'slice ended';
END
$f$;
CREATE OR REPLACE FUNCTION tally_lease_step(k text, name text, a bigint, n bigint, e bigint, p bigint,
    r boolean, bill boolean)
RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    IF r IS NOT NULL THEN
        UPDATE tally_lease_scopes SET revoked = r WHERE kind = k AND key = name;
    END IF;
    IF a = 0 AND n = 0 AND e = 0 AND p = 0 THEN
        RETURN;
    END IF;
    UPDATE tally_lease_scopes SET
        settled_attempts = greatest(settled_attempts + a, 0),
        settled_nanos = greatest(settled_nanos + n, 0),
        settled_effects = greatest(settled_effects + e, 0),
        settled_polls = greatest(settled_polls + p, 0),
        billed_nanos = CASE WHEN NOT bill OR cap_nanos IS NULL THEN billed_nanos ELSE greatest(billed_nanos,
            greatest(settled_nanos + n, 0) + held_nanos + leased_nanos - cap_nanos) END
    WHERE kind = k AND key = name
      AND (a <= 0 OR cap_attempts IS NULL OR settled_attempts + held_attempts + leased_attempts + a <= cap_attempts)
      AND (n <= 0 OR bill OR cap_nanos IS NULL OR settled_nanos + held_nanos + leased_nanos + n <= cap_nanos)
      AND (e <= 0 OR cap_effects IS NULL OR settled_effects + held_effects + leased_effects + e <= cap_effects)
      AND (p <= 0 OR cap_polls IS NULL OR settled_polls + held_polls + leased_polls + p <= cap_polls);
    IF NOT FOUND AND EXISTS (SELECT 1 FROM tally_lease_scopes s, LATERAL (
        SELECT coalesce(sum(coalesce(used_attempts, attempts) - coalesce(committed_attempts, 0)), 0) ra,
            coalesce(sum(coalesce(used_nanos, nanos) - coalesce(committed_nanos, 0)), 0) rn,
            coalesce(sum(coalesce(used_effects, effects) - coalesce(committed_effects, 0)), 0) re,
            coalesce(sum(coalesce(used_polls, polls) - coalesce(committed_polls, 0)), 0) rp
        FROM tally_leases l JOIN tally_lease_holders h ON h.holder = l.holder AND h.epoch = l.epoch
        WHERE l.kind = k AND l.key = name AND l.state = 'reclaimed') r
      WHERE s.kind = k AND s.key = name
      AND ((a > 0 AND cap_attempts IS NOT NULL AND settled_attempts - ra + held_attempts + a > cap_attempts)
        OR (n > 0 AND NOT bill AND cap_nanos IS NOT NULL AND settled_nanos - rn + held_nanos + n > cap_nanos)
        OR (e > 0 AND cap_effects IS NOT NULL AND settled_effects - re + held_effects + e > cap_effects)
        OR (p > 0 AND cap_polls IS NOT NULL AND settled_polls - rp + held_polls + p > cap_polls))) THEN
        RAISE EXCEPTION 'lease scope % %: no room left', k, name
            USING ERRCODE = 'check_violation', DETAIL = 'exhausted';
    END IF;
    IF NOT FOUND AND EXISTS (SELECT 1 FROM tally_lease_scopes WHERE kind = k AND key = name) THEN
        RAISE EXCEPTION 'lease scope % %: no room left beside the slices out', k, name
            USING ERRCODE = 'check_violation';
    END IF;
END
$f$;
";

/// One round trip of the migration: bounded by `timeout`, counted in `trips`, its
/// failure said as the gate says it.
struct Migration<'a> {
    rt: &'a crate::Rt,
    target: &'a str,
    timeout: Duration,
    trips: &'a AtomicU64,
}

impl Migration<'_> {
    fn wait<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, crate::PostgresError> {
        self.trips.fetch_add(1, Ordering::Relaxed);
        self.rt
            .bounded(self.timeout, fut)
            .map_err(|why| crate::PostgresError::Database {
                target: self.target.to_owned(),
                why: format!(
                    "PostgreSQL at {} failed {what}: {why}; the gate refuses until the database answers (retry)",
                    self.target
                ),
            })
    }

    /// The steps from the version found to [`crate::SCHEMA_VERSION`], in one transaction.
    fn steps(&self, client: &tokio_postgres::Client) -> Result<(), crate::PostgresError> {
        self.wait(
            "to create the schema",
            client.batch_execute(&format!(
                "BEGIN; SET LOCAL lock_timeout = {}; SELECT pg_advisory_xact_lock(7400331); \
                     CREATE TABLE IF NOT EXISTS tally_schema (version integer NOT NULL);",
                // Within the round trip's bound: the server ends a statement
                // queued behind another's lock and answers, before the bound.
                (self.timeout.as_millis() / 2).max(1)
            )),
        )?;
        let rows = self.wait(
            "to read the schema version",
            client.query("SELECT max(version) FROM tally_schema", &[]),
        )?;
        let found: Option<i32> = rows.first().and_then(|r| r.get(0));
        let all = [
            SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5, SCHEMA_V6, SCHEMA_V7, SCHEMA_V8,
            SCHEMA_V9, SCHEMA_V10, SCHEMA_V11,
        ];
        let from = match found {
            None => 0,
            Some(v) if v > crate::SCHEMA_VERSION => {
                return Err(crate::PostgresError::SchemaTooNew {
                    target: self.target.to_owned(),
                    found: v,
                    known: crate::SCHEMA_VERSION,
                })
            }
            Some(v) => usize::try_from(v).unwrap_or(0).min(all.len()),
        };
        let steps = &all[from..];
        // A database already at the amended version may hold its first form: its step is
        // idempotent, so it is run again (the version is not recorded again), before the
        // later steps (whose functions replace its own). A database at a later version
        // had it run already: nothing is run again (no table lock taken at each open).
        if found == Some(AMENDED) {
            self.wait("to update the schema", client.batch_execute(SCHEMA_V10))?;
        }
        if !steps.is_empty() {
            for step in steps {
                self.wait("to create the schema", client.batch_execute(step))?;
            }
            self.wait(
                "to record the schema version",
                client.execute(
                    "INSERT INTO tally_schema (version) VALUES ($1)",
                    &[&crate::SCHEMA_VERSION],
                ),
            )?;
        }
        self.wait("to commit the schema", client.batch_execute("COMMIT"))
    }
}

/// Create the schema, or check the one found, under an advisory lock (several daemons,
/// and their lease managers, may start at once), on a connection of its own.
pub(crate) fn migrate(
    rt: &crate::Rt,
    config: &tokio_postgres::Config,
    target: &str,
    timeout: Duration,
    trips: &AtomicU64,
) -> Result<(), crate::PostgresError> {
    let m = Migration {
        rt,
        target,
        timeout,
        trips,
    };
    let (client, connection) = m.wait("to connect", config.connect(tokio_postgres::NoTls))?;
    let task = rt.spawn(async move {
        let _ = connection.await;
    });
    let result = m.steps(&client);
    drop(client);
    // The connection ends once the server answered what was sent: within the bound
    // (its `lock_timeout` ends a statement queued behind a lock), else left to end.
    let _ = rt.block_on(async { tokio::time::timeout(timeout, task).await });
    result
}
