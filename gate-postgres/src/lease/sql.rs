//! The lease manager's statements (the tables are `schema::SCHEMA_V4`). `$now` is the
//! manager's clock: NULL for the database's `now()`.
//!
//! Why a grant can never take a scope past its caps, under READ COMMITTED and any number
//! of managers at once: [`GRANT`] adds the slice to the scope's `leased_*` in ONE
//! `UPDATE` whose `WHERE` is the invariant itself (settled + held + leased + the slice
//! within each cap). An `UPDATE` locks the row it changes; one that finds the row
//! changed by a transaction that committed meanwhile re-reads the row's newest version
//! and evaluates its `WHERE` again on it (PostgreSQL's EvalPlanQual) before writing. So
//! every grant's check and add happen on the latest committed totals, one grant at a
//! time per scope: no two can both see the same room. The slice's row is inserted by
//! the same statement, only if the update matched. `tally_lease_scopes_within` (a CHECK)
//! refuses any other write that would break the invariant.
//!
//! The epoch: the grant's first step reads the holder's row `FOR SHARE` and matches only
//! if the manager's epoch is current. Opening a manager bumps the epoch (an `UPDATE` of
//! that row), which waits for every grant holding the share lock to commit; a grant
//! after the bump finds the new epoch and is refused. So once a manager opened, no older
//! manager of the holder grants, renews or returns anything. (`MATERIALIZED`: the
//! holder's row is read, and locked, as a step of its own.)

/// Take the holder's name at a new epoch: $1 holder.
pub(crate) const BUMP: &str = "
INSERT INTO tally_lease_holders (holder, epoch) VALUES ($1, 1)
ON CONFLICT (holder) DO UPDATE SET epoch = tally_lease_holders.epoch + 1
RETURNING epoch";

/// Adopt the holder's slices still out (run after [`BUMP`], in its transaction, whose
/// wait saw every earlier grant commit): $1 holder, $2 the new epoch.
pub(crate) const ADOPT: &str = "
UPDATE tally_leases SET epoch = $2 WHERE holder = $1 AND state = 'held'
RETURNING id, kind, key, epoch, attempts, nanos, effects, polls, granted_at, expires_at,
    expires_at - granted_at, committed_attempts, committed_nanos, committed_effects, committed_polls";

/// This holder's slices out granted at its epoch $3 (an older epoch's are adopted or
/// not this manager's): $1 holder, $2 $now.
pub(crate) const HELD: &str = "
SELECT id, kind, key, epoch, attempts, nanos, effects, polls, granted_at, expires_at,
    greatest(expires_at - COALESCE($2::timestamptz, now()), interval '0'),
    committed_attempts, committed_nanos, committed_effects, committed_polls
FROM tally_leases WHERE holder = $1 AND state = 'held' AND epoch = $3 ORDER BY id";

/// Define a scope, or change a defined scope's caps: $1 kind, $2 key, $3..$6 caps,
/// $7..$10 settled, $11..$14 held. What is settled, held and billed is set only when the
/// scope is new: a redefinition never moves it (a definer's counts may be stale; [`RESET`]
/// starts a period anew). While slices of it are out a redefinition must keep which
/// dimensions are capped (a slice's are fixed at its grant) and settled + held + leased
/// within each new cap. No row: refused, nothing changed.
pub(crate) const DEFINE: &str = "
INSERT INTO tally_lease_scopes AS s (kind, key, cap_attempts, cap_nanos, cap_effects, cap_polls,
    settled_attempts, settled_nanos, settled_effects, settled_polls,
    held_attempts, held_nanos, held_effects, held_polls)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
ON CONFLICT (kind, key) DO UPDATE SET
    cap_attempts = EXCLUDED.cap_attempts, cap_nanos = EXCLUDED.cap_nanos,
    cap_effects = EXCLUDED.cap_effects, cap_polls = EXCLUDED.cap_polls
WHERE s.leased_attempts + s.leased_nanos + s.leased_effects + s.leased_polls = 0 OR (
    (s.cap_attempts IS NULL) = (EXCLUDED.cap_attempts IS NULL)
    AND (s.cap_nanos IS NULL) = (EXCLUDED.cap_nanos IS NULL)
    AND (s.cap_effects IS NULL) = (EXCLUDED.cap_effects IS NULL)
    AND (s.cap_polls IS NULL) = (EXCLUDED.cap_polls IS NULL)
    AND (EXCLUDED.cap_attempts IS NULL OR s.settled_attempts + s.held_attempts + s.leased_attempts <= EXCLUDED.cap_attempts)
    AND (EXCLUDED.cap_nanos IS NULL OR s.settled_nanos + s.held_nanos + s.leased_nanos <= EXCLUDED.cap_nanos)
    AND (EXCLUDED.cap_effects IS NULL OR s.settled_effects + s.held_effects + s.leased_effects <= EXCLUDED.cap_effects)
    AND (EXCLUDED.cap_polls IS NULL OR s.settled_polls + s.held_polls + s.leased_polls <= EXCLUDED.cap_polls))
RETURNING 1";

/// Why [`DEFINE`] was refused: whether it changed which dimensions are capped (else it
/// put a cap below what is out): $1 kind, $2 key, $3..$6 the caps asked.
pub(crate) const DEFINE_WHY: &str = "
SELECT (cap_attempts IS NULL) <> ($3::bigint IS NULL) OR (cap_nanos IS NULL) <> ($4::bigint IS NULL)
    OR (cap_effects IS NULL) <> ($5::bigint IS NULL) OR (cap_polls IS NULL) <> ($6::bigint IS NULL)
FROM tally_lease_scopes WHERE kind = $1 AND key = $2";

/// Start a scope's period anew: settled $3..$6 and held $7..$10, nothing billed, only
/// while no slice of it is out: $1 kind, $2 key. No row: unknown, or slices are out.
pub(crate) const RESET: &str = "
UPDATE tally_lease_scopes SET
    settled_attempts = $3, settled_nanos = $4, settled_effects = $5, settled_polls = $6,
    held_attempts = $7, held_nanos = $8, held_effects = $9, held_polls = $10,
    billed_attempts = 0, billed_nanos = 0, billed_effects = 0, billed_polls = 0
WHERE kind = $1 AND key = $2
  AND leased_attempts + leased_nanos + leased_effects + leased_polls = 0
RETURNING 1";

/// Whether a scope is defined: $1 kind, $2 key.
pub(crate) const KNOWN: &str = "SELECT 1 FROM tally_lease_scopes WHERE kind = $1 AND key = $2";

/// Grant a slice in one statement: $1 kind, $2 key, $3 holder, $4 epoch, $5..$8 the
/// slice, $9 its time to live in ms, $10 $now, $11 whether its holder commits each use
/// of it (its committed use starts at 0; else NULL: not known). No row: refused (see
/// the module's doc).
pub(crate) const GRANT: &str = "
WITH h AS MATERIALIZED (
    SELECT 1 FROM tally_lease_holders WHERE holder = $3 AND epoch = $4 FOR SHARE
), s AS (
    UPDATE tally_lease_scopes SET
        leased_attempts = leased_attempts + $5, leased_nanos = leased_nanos + $6,
        leased_effects = leased_effects + $7, leased_polls = leased_polls + $8
    WHERE kind = $1 AND key = $2 AND EXISTS (SELECT 1 FROM h) AND NOT revoked
      AND (cap_attempts IS NULL OR settled_attempts + held_attempts + leased_attempts + $5 <= cap_attempts)
      AND (cap_nanos IS NULL OR settled_nanos + held_nanos + leased_nanos + $6 <= cap_nanos)
      AND (cap_effects IS NULL OR settled_effects + held_effects + leased_effects + $7 <= cap_effects)
      AND (cap_polls IS NULL OR settled_polls + held_polls + leased_polls + $8 <= cap_polls)
    RETURNING kind, key
), t AS (
    SELECT COALESCE($10::timestamptz, now()) AS at
)
INSERT INTO tally_leases (kind, key, holder, epoch, attempts, nanos, effects, polls, state,
    granted_at, expires_at, committed_attempts, committed_nanos, committed_effects, committed_polls)
SELECT s.kind, s.key, $3, $4, $5, $6, $7, $8, 'held', t.at, t.at + $9::bigint * interval '1 millisecond',
    c.n, c.n, c.n, c.n
FROM s, t, (SELECT CASE WHEN $11::boolean THEN 0::bigint END AS n) c
RETURNING id, granted_at, expires_at";

/// What a scope has left, the holder's epoch (why a grant matched nothing) and the
/// holders of its slices out or granted within the window: $1 kind, $2 key, $3 holder,
/// $4 the window in ms, $5 $now.
pub(crate) const LEFT: &str = "
SELECT (SELECT epoch FROM tally_lease_holders WHERE holder = $3),
    cap_attempts - (settled_attempts + held_attempts + leased_attempts),
    cap_nanos - (settled_nanos + held_nanos + leased_nanos),
    cap_effects - (settled_effects + held_effects + leased_effects),
    cap_polls - (settled_polls + held_polls + leased_polls),
    (SELECT count(DISTINCT holder) FROM tally_leases l
     WHERE l.kind = $1 AND l.key = $2
       AND (l.state = 'held' OR l.granted_at > COALESCE($5::timestamptz, now()) - $4::bigint * interval '1 millisecond')),
    revoked
FROM tally_lease_scopes WHERE kind = $1 AND key = $2";

/// Renew a held slice, never shortening it: $1 id, $2 holder, $3 epoch, $4 time to live
/// in ms, $5 $now. No row: refused (not this holder's, stale, ended or expired, its
/// scope revoked or past a cap: a central bill overran it, so its slices run out).
pub(crate) const RENEW: &str = "
WITH h AS MATERIALIZED (
    SELECT 1 FROM tally_lease_holders WHERE holder = $2 AND epoch = $3 FOR SHARE
), t AS (
    SELECT COALESCE($5::timestamptz, now()) AS at
)
UPDATE tally_leases l SET expires_at = greatest(l.expires_at, t.at + $4::bigint * interval '1 millisecond')
FROM t
WHERE l.id = $1 AND l.holder = $2 AND l.state = 'held' AND l.expires_at > t.at
  AND EXISTS (SELECT 1 FROM h)
  AND NOT EXISTS (SELECT 1 FROM tally_lease_scopes s WHERE s.kind = l.kind AND s.key = l.key AND (s.revoked
      OR s.settled_attempts + s.held_attempts + s.leased_attempts > s.cap_attempts
      OR s.settled_nanos + s.held_nanos + s.leased_nanos > s.cap_nanos
      OR s.settled_effects + s.held_effects + s.leased_effects > s.cap_effects
      OR s.settled_polls + s.held_polls + s.leased_polls > s.cap_polls))
RETURNING l.expires_at, l.expires_at - t.at";

/// A lease as it stands, its holder's epoch, and whether its scope is revoked (paused,
/// stopped, or overrun past a cap): $1 id, $2 $now.
pub(crate) const LEASE: &str = "
SELECT l.holder, l.state, l.expires_at <= COALESCE($2::timestamptz, now()),
    (SELECT epoch FROM tally_lease_holders h WHERE h.holder = l.holder),
    (SELECT s.revoked
        OR s.settled_attempts + s.held_attempts + s.leased_attempts > s.cap_attempts
        OR s.settled_nanos + s.held_nanos + s.leased_nanos > s.cap_nanos
        OR s.settled_effects + s.held_effects + s.leased_effects > s.cap_effects
        OR s.settled_polls + s.held_polls + s.leased_polls > s.cap_polls
     FROM tally_lease_scopes s WHERE s.kind = l.kind AND s.key = l.key)
FROM tally_leases l WHERE l.id = $1";

/// The holder's row, shared to the end of the return's transaction: $1 holder.
pub(crate) const HOLDER_SHARE: &str =
    "SELECT epoch FROM tally_lease_holders WHERE holder = $1 FOR SHARE";

/// A lease, locked to the end of the return's transaction, its committed use (NULL:
/// not known) and, reclaimed, what its reclaim settled (NULL: reclaimed by a build of
/// schema 10, which settled it whole): $1 id.
pub(crate) const LEASE_LOCK: &str = "
SELECT holder, state, kind, key, attempts, nanos, effects, polls,
    committed_attempts, committed_nanos, committed_effects, committed_polls,
    used_attempts, used_nanos, used_effects, used_polls
FROM tally_leases WHERE id = $1 FOR UPDATE";

/// Close a lease as returned: $1 id, $2..$5 used, $6 $now, $7 whether the return
/// settled all its holder said it used (`covers_use`: a use its holder commits on it
/// later is then counted; else refused, `schema::SCHEMA_V11`).
pub(crate) const CLOSE: &str = "
UPDATE tally_leases SET state = 'returned', used_attempts = $2, used_nanos = $3,
    used_effects = $4, used_polls = $5, ended_at = COALESCE($6::timestamptz, now()),
    covers_use = $7
WHERE id = $1";

/// Move amounts of a scope: leased down by $3..$6, settled up by $7..$10 (negative:
/// down): $1 kind, $2 key.
pub(crate) const MOVE: &str = "
UPDATE tally_lease_scopes SET
    leased_attempts = leased_attempts - $3, leased_nanos = leased_nanos - $4,
    leased_effects = leased_effects - $5, leased_polls = leased_polls - $6,
    settled_attempts = settled_attempts + $7, settled_nanos = settled_nanos + $8,
    settled_effects = settled_effects + $9, settled_polls = settled_polls + $10
WHERE kind = $1 AND key = $2";

/// One reclaimer at a time (two would lock scopes in crossing orders).
pub(crate) const RECLAIM_LOCK: &str = "SELECT pg_advisory_xact_lock(7400332)";

/// Every held slice past its expiry and the margin, reclaimed: $1 margin in ms, $2
/// $now. An `UPDATE` re-reads a row changed meanwhile, so a slice renewed or returned
/// since the statement began is left alone; each slice is reclaimed once. What it
/// settles: its committed use, or the whole slice where that is not known (NULL). A
/// use committed on it later is refused (`tally_home_write` wants it held), and one
/// committed before is in the row this statement locks and reads. What it settled is
/// kept in `used_*` (its holder's late return starts from it). The slices are locked in
/// their ids' order. A group commit's home writes lock theirs in queue order, so a group
/// writing two slices already past their expiry can cross a reclaim of both: PostgreSQL
/// aborts one side (a deadlock or the lock timeout), a refused group or a reclaim left
/// to the next tick, never a hang.
pub(crate) const RECLAIM: &str = "
WITH due AS (
    SELECT id FROM tally_leases
    WHERE state = 'held'
      AND expires_at + $1::bigint * interval '1 millisecond' < COALESCE($2::timestamptz, now())
    ORDER BY id FOR UPDATE
)
UPDATE tally_leases l SET state = 'reclaimed', ended_at = COALESCE($2::timestamptz, now()),
    used_attempts = coalesce(committed_attempts, attempts), used_nanos = coalesce(committed_nanos, nanos),
    used_effects = coalesce(committed_effects, effects), used_polls = coalesce(committed_polls, polls)
FROM due WHERE l.id = due.id AND l.state = 'held'
RETURNING l.id, l.kind, l.key, l.holder, l.attempts, l.nanos, l.effects, l.polls,
    l.used_attempts, l.used_nanos, l.used_effects, l.used_polls";

/// Revoke (or restore) a scope's slices: $1 kind, $2 key, $3 revoked.
pub(crate) const REVOKE: &str =
    "UPDATE tally_lease_scopes SET revoked = $3 WHERE kind = $1 AND key = $2";

/// A scope, locked for a central spend, and whether $3..$6 would fit in it were no
/// slice out, and every reclaimed slice whose holder may still give it back (its epoch
/// still the slice's: not restarted, not fenced) refunded all it may refund (what its
/// reclaim settled, `used_*`, NULL: whole, above its committed use, NULL: 0): only then
/// is the scope out of room for good ($1 kind, $2 key). A reclaimed slice of an earlier
/// epoch is never given back (`release` refuses a stale epoch, adoption moves only held
/// slices): settled for good; a return never settles less than the committed use.
pub(crate) const SCOPE_LOCK: &str = "
SELECT s.revoked,
    (cap_attempts IS NULL OR settled_attempts - r.a + held_attempts + $3 <= cap_attempts)
    AND (cap_nanos IS NULL OR settled_nanos - r.n + held_nanos + $4 <= cap_nanos)
    AND (cap_effects IS NULL OR settled_effects - r.e + held_effects + $5 <= cap_effects)
    AND (cap_polls IS NULL OR settled_polls - r.p + held_polls + $6 <= cap_polls)
FROM tally_lease_scopes s, LATERAL (
    SELECT coalesce(sum(coalesce(used_attempts, attempts) - coalesce(committed_attempts, 0)), 0)::bigint a,
        coalesce(sum(coalesce(used_nanos, nanos) - coalesce(committed_nanos, 0)), 0)::bigint n,
        coalesce(sum(coalesce(used_effects, effects) - coalesce(committed_effects, 0)), 0)::bigint e,
        coalesce(sum(coalesce(used_polls, polls) - coalesce(committed_polls, 0)), 0)::bigint p
    FROM tally_leases l JOIN tally_lease_holders h ON h.holder = l.holder AND h.epoch = l.epoch
    WHERE l.kind = s.kind AND l.key = s.key AND l.state = 'reclaimed') r
WHERE s.kind = $1 AND s.key = $2 FOR UPDATE OF s";

/// Spend centrally, within the invariant (slices out counted as unavailable): settled
/// up by $3..$6: $1 kind, $2 key. No row: it does not fit.
pub(crate) const SPEND: &str = "
UPDATE tally_lease_scopes SET
    settled_attempts = settled_attempts + $3, settled_nanos = settled_nanos + $4,
    settled_effects = settled_effects + $5, settled_polls = settled_polls + $6
WHERE kind = $1 AND key = $2
  AND (cap_attempts IS NULL OR settled_attempts + held_attempts + leased_attempts + $3 <= cap_attempts)
  AND (cap_nanos IS NULL OR settled_nanos + held_nanos + leased_nanos + $4 <= cap_nanos)
  AND (cap_effects IS NULL OR settled_effects + held_effects + leased_effects + $5 <= cap_effects)
  AND (cap_polls IS NULL OR settled_polls + held_polls + leased_polls + $6 <= cap_polls)
RETURNING 1";

/// Raise a run's scope's cap to its run's limit after a decision that raised it (an
/// approval's grant used), in the decision's own transaction: each capped dimension
/// to the greater of its cap and the limit ($3..$6; NULL: left), never down, never
/// capping what is not: $1 kind, $2 key.
pub(crate) const LEASE_RAISE: &str = "
UPDATE tally_lease_scopes SET
    cap_attempts = CASE WHEN cap_attempts IS NULL OR $3::bigint IS NULL THEN cap_attempts ELSE greatest(cap_attempts, $3) END,
    cap_nanos = CASE WHEN cap_nanos IS NULL OR $4::bigint IS NULL THEN cap_nanos ELSE greatest(cap_nanos, $4) END,
    cap_effects = CASE WHEN cap_effects IS NULL OR $5::bigint IS NULL THEN cap_effects ELSE greatest(cap_effects, $5) END,
    cap_polls = CASE WHEN cap_polls IS NULL OR $6::bigint IS NULL THEN cap_polls ELSE greatest(cap_polls, $6) END
WHERE kind = $1 AND key = $2";

/// A scope settled by a step of its own ($1 kind, $2 key, $3-$6 the amounts, $7 revoked
/// or not, $8 a bill): `tally_lease_step`, as a central decision calls it.
pub(super) const STEP: &str = "SELECT tally_lease_step($1, $2, $3, $4, $5, $6, $7, $8)";
