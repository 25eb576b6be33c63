//! The gate's state in PostgreSQL: every daemon that shares the database shares one
//! budget per run, one rate bucket and one circuit breaker per tool, one backstop per
//! credential. Each daemon keeps its own ledger.
//!
//! A decision is one PostgreSQL transaction (the seam of [`tally_gate::backend`]):
//!
//! * the rows it touches are locked with `SELECT ... FOR UPDATE` in one fixed order, run
//!   then tool then credential (a missing tool or credential row is inserted first, so
//!   there is always a row to lock); a new run's name is claimed by inserting its row;
//! * the gate decides with the pure core, the backend writes what the decision left
//!   (each row's `version` goes up by one) and commits, **then** queues the decision on
//!   the local ledger: after a crash the state can only be ahead of the ledger (the
//!   conservative side), never behind;
//! * a daemon's own decisions are serialized by one local lock held until the decision
//!   is queued, so each ledger's order is the order its scopes changed.
//!
//! Failure closes: an unreachable database, or one slower than the bound
//! ([`Options::timeout`], for connecting and for every round trip), is
//! [`GateError::Unavailable`] (the daemon answers `gate_unavailable`, action `retry`),
//! never an allow. The connection is dropped and made again at the next decision, so a
//! database that comes back is used again without a restart.
//!
//! Leased slices of budgets ([`Leases`]: grant, renew, return, reclaim, fenced by an
//! epoch) and one daemon's side of them ([`Slices`]) are the foundation of deciding
//! inside a slice; a decision of this backend on a run whose lease scope is defined
//! keeps that scope in step in its own transaction (docs/FLEET.md, "Deciding inside
//! slices"). [`Leased`] is the backend that decides inside them (`tally serve --leases`:
//! a run at home on one daemon, its uses counted in that daemon's slice; docs/FLEET.md,
//! "The leased mode").
//!
//! Threads: the backend drives its client on its own runtime and blocks the calling
//! thread for each round trip. Call the gate from a plain or blocking thread
//! (`tokio::task::spawn_blocking`), never from an async task.
#![forbid(unsafe_code)]

mod gatekeeper;
mod lease;
mod overview;
mod schema;
mod state;
mod txn;
pub use gatekeeper::gatekeeper;
pub use gatekeeper::leased_gatekeeper;
pub use lease::GROUP_SUFFIX;
pub use lease::{
    on_lease_event, open_leased, spawn_ticks, spawn_timer, Amounts, BreakersTicked, Caps, Grant,
    Lease, LeaseClock, LeaseError, LeaseEvent, LeaseMetrics, LeaseOptions, LeaseSetup, Leased,
    LeasedTxn, Leases, Outlook, Reclaimed, Released, Scope, ScopeKind, Sink, SliceError,
    SliceOptions, Slices, Spent, Taken, Ticked, ViewLimits,
};
pub use overview::VIEW_SUFFIX;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tally_gate::backend::StateBackend;
use tally_gate::GateError;
use tally_ledger::Ledger;
use tokio_postgres::{Client, NoTls};

use schema::{Statements, WRITE};
pub use txn::PostgresTxn;

/// The schema version this build creates and reads.
pub const SCHEMA_VERSION: i32 = 11;

/// The default bound on connecting and on each round trip.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Why the backend could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresError {
    /// The connection string does not parse.
    #[error("--state: not a PostgreSQL connection string ({why}); expected postgres://USER@HOST:PORT/DATABASE or host=/run/postgresql dbname=tally")]
    Url {
        /// What the parser said.
        why: String,
    },
    /// The database could not be reached, or refused the schema.
    #[error("PostgreSQL at {target}: {why}")]
    Database {
        /// Host, port and database (never the password).
        target: String,
        /// What went wrong, and what to do.
        why: String,
    },
    /// The database was migrated by a newer tally.
    #[error("PostgreSQL at {target}: its tally schema is version {found}, this tally knows versions up to {known}; upgrade tally on this host")]
    SchemaTooNew {
        /// Host, port and database.
        target: String,
        /// The version found.
        found: i32,
        /// The newest this build knows.
        known: i32,
    },
}

/// How to reach the database.
#[derive(Clone, Debug)]
pub struct Options {
    /// A libpq-style connection string (`postgres://user@host:port/db`, or key=value).
    pub url: String,
    /// Bound on connecting and on each round trip (also the server's
    /// `statement_timeout`; `lock_timeout` is half of it): past it the decision is
    /// refused.
    pub timeout: Duration,
}

impl Options {
    /// `url` with the default bound.
    pub fn new(url: &str) -> Options {
        Options {
            url: url.to_owned(),
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

struct Conn {
    client: Client,
    task: tokio::task::JoinHandle<()>,
    st: Statements,
}

/// The backend's own runtime. Dropped without waiting for its tasks, so that a gate
/// may be dropped anywhere, an async context included (tokio refuses to block there).
struct Rt(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for Rt {
    type Target = tokio::runtime::Runtime;
    fn deref(&self) -> &tokio::runtime::Runtime {
        // Taken only by Drop.
        self.0
            .as_ref()
            .expect("the runtime lives as long as the backend")
    }
}

impl Rt {
    /// One round trip bounded by `bound`: its value, or why there was none (the
    /// server's error, or no answer in time) in words.
    pub(crate) fn bounded<T>(
        &self,
        bound: Duration,
        fut: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, String> {
        match self.block_on(async { tokio::time::timeout(bound, fut).await }) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(describe(&e)),
            Err(_) => Err(format!("no answer within {} ms", bound.as_millis())),
        }
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The PostgreSQL state backend of one gate (one daemon).
pub struct Postgres {
    ledger: Arc<Ledger>,
    config: tokio_postgres::Config,
    target: String,
    timeout: Duration,
    rt: Rt,
    /// One decision at a time, waited for no longer than the bound.
    turn: Turn,
    conn: Mutex<Option<Conn>>,
    round_trips: Arc<AtomicU64>,
    /// The operator's views, on a connection of their own.
    reader: overview::Reader,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// The connection settings of `options` (named `application` unless the URL names
/// one), the target they name (no password) and a runtime for the client's round trips.
fn client(
    options: &Options,
    application: &str,
) -> Result<(tokio_postgres::Config, String, Rt), PostgresError> {
    let mut config: tokio_postgres::Config = options
        .url
        .parse()
        .map_err(|e: tokio_postgres::Error| PostgresError::Url { why: e.to_string() })?;
    config.connect_timeout(options.timeout);
    if config.get_application_name().is_none() {
        config.application_name(application);
    }
    let target = target_of(&config);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| PostgresError::Database {
            target: target.clone(),
            why: format!("cannot start the client's runtime: {e}"),
        })?;
    Ok((config, target, Rt(Some(rt))))
}

fn target_of(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "{host}:{port}/{}",
        config.get_dbname().unwrap_or("(default database)")
    )
}

fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

impl Postgres {
    /// Connect, create or migrate the schema, and hold the ledger this daemon writes.
    pub fn open(ledger: Arc<Ledger>, options: &Options) -> Result<Postgres, PostgresError> {
        let (config, target, rt) = client(options, "tally")?;
        let round_trips = Arc::new(AtomicU64::new(0));
        let reader =
            overview::Reader::new(&config, &target, options.timeout, Arc::clone(&round_trips))
                .map_err(|e| PostgresError::Database {
                    target: target.clone(),
                    why: format!("cannot start the view's runtime: {e}"),
                })?;
        let backend = Postgres {
            ledger,
            config,
            target,
            timeout: options.timeout,
            rt,
            turn: Turn::default(),
            conn: Mutex::new(None),
            round_trips,
            reader,
        };
        backend.migrate()?;
        Ok(backend)
    }

    /// Host, port and database (no password).
    pub fn target(&self) -> &str {
        &self.target
    }

    fn unavailable(&self, what: &str, why: &str) -> GateError {
        GateError::Unavailable(format!(
            "PostgreSQL at {} failed {what}: {why}; the gate refuses until the database answers (retry)",
            self.target
        ))
    }

    /// One round trip, bounded by the timeout.
    fn wait<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, GateError> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        self.rt
            .bounded(self.timeout, fut)
            .map_err(|why| self.unavailable(what, &why))
    }

    fn connect(&self) -> Result<Conn, GateError> {
        let (client, connection) = self.wait("to connect", self.config.connect(NoTls))?;
        let task = self.rt.spawn(async move {
            let _ = connection.await;
        });
        // statement_timeout and lock_timeout bound the server's side of a round trip
        // (a row lock waited for half the bound at most: one such wait ends in an error,
        // a certain rollback, before the client's bound makes the outcome unknown; two
        // in one round trip may reach the bound),
        // idle_in_transaction_session_timeout frees the rows of a daemon that stalls.
        let ms = self.timeout.as_millis().max(1);
        let setup = format!(
            "SET statement_timeout = {ms}; SET lock_timeout = {}; SET idle_in_transaction_session_timeout = {}",
            (ms / 2).max(1),
            ms * 5
        );
        let prepared = (|| {
            self.wait("to set its timeouts", client.batch_execute(&setup))?;
            let c = &client;
            let p = |sql: &'static str| self.wait("to prepare a statement", c.prepare(sql));
            Ok::<_, GateError>(Statements {
                run_lock: p("SELECT state FROM tally_runs WHERE name = $1 AND state IS NOT NULL FOR UPDATE")?,
                run_claim: p("INSERT INTO tally_runs (name, state, version, open) VALUES ($1, NULL, 0, false) ON CONFLICT (name) DO NOTHING RETURNING version")?,
                run_exists: p("SELECT 1 FROM tally_runs WHERE name = $1 AND state IS NOT NULL")?,
                runs_open: p("SELECT state FROM tally_runs WHERE open AND state IS NOT NULL ORDER BY name")?,
                runs_named: p("SELECT state FROM tally_runs WHERE starts_with(name, $1) AND state IS NOT NULL ORDER BY name")?,
                children: p("SELECT name FROM tally_runs WHERE parent = $1 AND open AND state IS NOT NULL ORDER BY name")?,
                owner_lock: p("INSERT INTO tally_owners (owner) VALUES ($1) ON CONFLICT (owner) DO UPDATE SET owner = EXCLUDED.owner")?,
                owner_count: p("SELECT count(*) FROM tally_runs WHERE open AND state IS NOT NULL AND owner_uid IS NOT DISTINCT FROM $1")?,
                owner_runs: p("SELECT name, state FROM tally_runs WHERE open AND state IS NOT NULL AND owner_uid IS NOT DISTINCT FROM $1 ORDER BY name")?,
                tool_lock: p("SELECT state, in_flight FROM tally_tools WHERE name = $1 FOR UPDATE")?,
                breakers: p("SELECT name, state FROM tally_tools ORDER BY name")?,
                breakers_of: p("SELECT name, state FROM tally_tools WHERE name = ANY($1) ORDER BY name")?,
                tool_insert: p("INSERT INTO tally_tools (name, state, in_flight, version) VALUES ($1, $2, $3, 0) ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING state, in_flight")?,
                credential_lock: p("SELECT state FROM tally_credentials WHERE name = $1 FOR UPDATE")?,
                credential_insert: p("INSERT INTO tally_credentials (name, state, version) VALUES ($1, $2, 0) ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING state")?,
                principal_lock: p("SELECT state FROM tally_principals WHERE uid = $1 FOR UPDATE")?,
                principal_insert: p("INSERT INTO tally_principals (uid, state, version) VALUES ($1, $2, 0) ON CONFLICT (uid) DO UPDATE SET uid = EXCLUDED.uid RETURNING state")?,
                principal_write: p("UPDATE tally_principals SET state = $2, version = version + 1 WHERE uid = $1")?,
                write: p(WRITE)?,
                next_version: p("SELECT nextval('tally_state_version')")?,
                lease_step: p("SELECT tally_lease_step($1, $2, $3, $4, $5, $6, $7, $8)")?,
                home_read: p(lease::HOME_READ)?,
                home_guard: p(lease::HOME_GUARD)?,
                home_guard_sealed: p(lease::HOME_GUARD_SEALED)?,
                lease_raise: p(lease::LEASE_RAISE)?,
                home_write: p(lease::HOME_WRITE)?,
            })
        })();
        match prepared {
            Ok(st) => Ok(Conn { client, task, st }),
            Err(e) => {
                drop(client);
                task.abort();
                let _ = self.rt.block_on(task);
                Err(e)
            }
        }
    }

    /// Drop a connection and let its task end (the server then rolls back and frees
    /// whatever it held).
    fn close(&self, conn: Conn) {
        let Conn { client, task, .. } = conn;
        drop(client);
        task.abort();
        let _ = self.rt.block_on(task);
    }

    /// Create the schema, or check the one found (the lease manager does the same).
    fn migrate(&self) -> Result<(), PostgresError> {
        schema::migrate(
            &self.rt,
            &self.config,
            &self.target,
            self.timeout,
            &self.round_trips,
        )
    }
}

/// The gate's local lock, with a deadline: a decision queued behind others on a slow
/// database is refused once the bound has passed, not one bound after another. The
/// lease thread's work (the breakers' views flushed and refreshed) takes it first:
/// while it waits, no decision takes the turn before it, so a steady stream of
/// decisions never keeps a tick's flush out for the bound.
#[derive(Default)]
struct Turn {
    state: Mutex<TurnState>,
    /// Decisions wait here.
    freed: std::sync::Condvar,
    /// The lease thread's work waits here.
    freed_first: std::sync::Condvar,
}

#[derive(Default)]
struct TurnState {
    busy: bool,
    /// Takers waiting to go first.
    first: usize,
    /// Takers waiting, in all.
    waiting: usize,
}

/// A held [`Turn`], given back on drop.
struct TurnGuard<'a>(&'a Turn);

impl Turn {
    fn take(&self, bound: Duration, first: bool) -> Result<TurnGuard<'_>, GateError> {
        fn poisoned<T>(_: T) -> GateError {
            GateError::Unavailable("the gate's state lock was poisoned".into())
        }
        let deadline = std::time::Instant::now() + bound;
        let mut s = self.state.lock().map_err(poisoned)?;
        s.first += usize::from(first);
        s.waiting += 1;
        while s.busy || (!first && s.first > 0) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                s.first -= usize::from(first);
                s.waiting -= 1;
                if first && s.first == 0 && !s.busy {
                    self.freed.notify_one();
                }
                return Err(GateError::Unavailable(format!(
                    "this gate's earlier decisions held PostgreSQL for more than {} ms; the gate refuses until the database answers (retry)",
                    bound.as_millis()
                )));
            }
            let cv = if first {
                &self.freed_first
            } else {
                &self.freed
            };
            s = cv.wait_timeout(s, left).map_err(poisoned)?.0;
        }
        s.first -= usize::from(first);
        s.waiting -= 1;
        s.busy = true;
        Ok(TurnGuard(self))
    }
}

impl Drop for TurnGuard<'_> {
    fn drop(&mut self) {
        let mut s = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        s.busy = false;
        if s.first > 0 {
            self.0.freed_first.notify_one();
        } else {
            self.0.freed.notify_one();
        }
    }
}

impl StateBackend for Postgres {
    type Txn<'a> = PostgresTxn<'a>;

    fn networked(&self) -> bool {
        true
    }

    /// Round trips to the database so far (connecting and preparing count one each).
    fn round_trips(&self) -> Option<u64> {
        Some(self.round_trips.load(Ordering::Relaxed))
    }

    /// On the view's own connection, without the decisions' turn.
    fn overview(&self) -> Option<Result<tally_gate::backend::Overview, GateError>> {
        Some(self.reader.read())
    }

    fn overview_apart(&self) -> bool {
        true
    }

    fn begin(&self) -> Result<PostgresTxn<'_>, GateError> {
        self.begin_in(self.turn.take(self.timeout, false)?)
    }
}

impl Postgres {
    /// A transaction for the lease thread's work: it takes the turn before any decision
    /// waiting for it ([`Turn`]).
    pub(crate) fn begin_first(&self) -> Result<PostgresTxn<'_>, GateError> {
        self.begin_in(self.turn.take(self.timeout, true)?)
    }

    /// A transaction in the turn held.
    fn begin_in<'a>(&'a self, turn: TurnGuard<'a>) -> Result<PostgresTxn<'a>, GateError> {
        // Uncontended: only the holder of the turn takes it.
        let mut conn = self
            .conn
            .lock()
            .map_err(|_| GateError::Unavailable("the gate's state lock was poisoned".into()))?;
        if conn.as_ref().is_some_and(|c| c.client.is_closed()) {
            if let Some(c) = conn.take() {
                self.close(c);
            }
        }
        if conn.is_none() {
            *conn = Some(self.connect()?);
        }
        let mut t = PostgresTxn {
            backend: self,
            conn,
            _turn: turn,
            open: false,
            begun: false,
            runs: BTreeMap::new(),
            before: BTreeMap::new(),
            tools: BTreeMap::new(),
            credentials: BTreeMap::new(),
            principals: BTreeMap::new(),
            principals_before: BTreeMap::new(),
            guards: Vec::new(),
            unsure: false,
            taken_back: false,
        };
        // BEGIN goes with the transaction's first statement.
        t.open = true;
        Ok(t)
    }
}

#[cfg(test)]
mod turn {
    use super::Turn;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// Spins (no sleep) until `n` takers wait on `turn`.
    fn until_waiting(turn: &Turn, n: usize) {
        while turn.state.lock().expect("state").waiting < n {
            std::thread::yield_now();
        }
    }

    #[test]
    fn the_lease_threads_work_takes_the_turn_before_a_decision_that_waited_longer() {
        let turn = Arc::new(Turn::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let bound = Duration::from_secs(600);
        let held = turn.take(bound, false).expect("taken");
        let spawn = |first: bool, name: &'static str| {
            let (turn, order) = (Arc::clone(&turn), Arc::clone(&order));
            std::thread::spawn(move || {
                let _g = turn.take(bound, first).expect("taken");
                order.lock().expect("order").push(name);
            })
        };
        let decision = spawn(false, "decision");
        until_waiting(&turn, 1);
        let lease = spawn(true, "lease thread");
        until_waiting(&turn, 2);
        drop(held);
        decision.join().expect("decision");
        lease.join().expect("lease thread");
        assert_eq!(*order.lock().expect("order"), ["lease thread", "decision"]);
    }

    #[test]
    fn a_first_taker_that_gives_up_lets_the_decisions_behind_it_go() {
        let turn = Arc::new(Turn::default());
        let held = turn.take(Duration::from_secs(600), false).expect("taken");
        // Gives up at once: its bound is zero.
        assert!(turn.take(Duration::ZERO, true).is_err());
        assert_eq!(turn.state.lock().expect("state").first, 0);
        drop(held);
        drop(turn.take(Duration::ZERO, false).expect("free again"));
    }
}
