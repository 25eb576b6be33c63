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
//! Threads: the backend drives its client on its own runtime and blocks the calling
//! thread for each round trip. Call the gate from a plain or blocking thread
//! (`tokio::task::spawn_blocking`), never from an async task.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tally_gate::backend::{Committed, Scopes, StateBackend, StateTxn};
use tally_gate::{Caller, GateError};
use tally_ledger::Ledger;
use tally_policy::{CredentialState, Policy, RunState, ToolState, View, ViewMut};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row, Statement};

/// The schema version this build creates and reads.
pub const SCHEMA_VERSION: i32 = 2;

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
    /// `statement_timeout` and `lock_timeout`): past it the decision is refused.
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

/// The first byte of every stored state value: the encoding that follows (postcard of the
/// policy core's state types; 2 since the core became the only judge, whose run state
/// records overruns and forgotten attempts). State of another format is never read: a
/// field read at the wrong place would be a wrong budget, so it is refused with its cause.
/// the same as the embedded backend's.
const STATE_FORMAT: u8 = 2;

fn encode<T: serde::Serialize>(v: &T) -> Vec<u8> {
    let mut out = vec![STATE_FORMAT];
    // Structs of numbers, strings, options and maps always serialize.
    out.extend(postcard::to_allocvec(v).unwrap_or_default());
    out
}

fn decode<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, GateError> {
    let unreadable = |why: String| {
        GateError::Unavailable(format!(
            "the gate's state for {what} in PostgreSQL is unreadable: {why}"
        ))
    };
    match bytes.split_first() {
        Some((&STATE_FORMAT, rest)) => {
            postcard::from_bytes(rest).map_err(|e| unreadable(e.to_string()))
        }
        Some((1, _)) => Err(unreadable(
            "it was written by an older tally (state format 1; this one reads 2): finish or \
             stop its runs with that version, or serve a new ledger"
                .into(),
        )),
        Some((other, _)) => Err(unreadable(format!(
            "unknown state format {other} (this tally reads 2): was it written by a newer tally?"
        ))),
        None => Err(unreadable("empty".into())),
    }
}

const SCHEMA_V1: &str = "
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
const SCHEMA_V2: &str = "CREATE SEQUENCE IF NOT EXISTS tally_state_version AS bigint;";

/// Every statement a decision uses, prepared once per connection.
struct Statements {
    run_lock: Statement,
    run_claim: Statement,
    run_exists: Statement,
    runs_open: Statement,
    children: Statement,
    owner_lock: Statement,
    owner_count: Statement,
    owner_runs: Statement,
    tool_lock: Statement,
    tool_insert: Statement,
    breakers: Statement,
    credential_lock: Statement,
    credential_insert: Statement,
    write: Statement,
    next_version: Statement,
}

const WRITE: &str = "
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
const NO_UID: i64 = -1;

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
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
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
        let mut config: tokio_postgres::Config = options
            .url
            .parse()
            .map_err(|e: tokio_postgres::Error| PostgresError::Url { why: e.to_string() })?;
        config.connect_timeout(options.timeout);
        if config.get_application_name().is_none() {
            config.application_name("tally");
        }
        let target = target_of(&config);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| PostgresError::Database {
                target: target.clone(),
                why: format!("cannot start the client's runtime: {e}"),
            })?;
        let backend = Postgres {
            ledger,
            config,
            target,
            timeout: options.timeout,
            rt: Rt(Some(rt)),
            turn: Turn::default(),
            conn: Mutex::new(None),
            round_trips: Arc::new(AtomicU64::new(0)),
        };
        backend.migrate()?;
        Ok(backend)
    }

    /// Host, port and database (no password).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Round trips to the database so far (connecting and preparing count one each),
    /// as a counter that stays readable once the backend is moved into its gate.
    pub fn round_trips(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.round_trips)
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
        let bound = self.timeout;
        match self
            .rt
            .block_on(async { tokio::time::timeout(bound, fut).await })
        {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.unavailable(what, &describe(&e))),
            Err(_) => {
                Err(self.unavailable(what, &format!("no answer within {} ms", bound.as_millis())))
            }
        }
    }

    fn connect(&self) -> Result<Conn, GateError> {
        let (client, connection) = self.wait("to connect", self.config.connect(NoTls))?;
        let task = self.rt.spawn(async move {
            let _ = connection.await;
        });
        // statement_timeout and lock_timeout bound the server's side of a round trip,
        // idle_in_transaction_session_timeout frees the rows of a daemon that stalls.
        let ms = self.timeout.as_millis().max(1);
        let setup = format!(
            "SET statement_timeout = {ms}; SET lock_timeout = {ms}; SET idle_in_transaction_session_timeout = {}",
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
                children: p("SELECT name FROM tally_runs WHERE parent = $1 AND open AND state IS NOT NULL ORDER BY name")?,
                owner_lock: p("INSERT INTO tally_owners (owner) VALUES ($1) ON CONFLICT (owner) DO UPDATE SET owner = EXCLUDED.owner")?,
                owner_count: p("SELECT count(*) FROM tally_runs WHERE open AND state IS NOT NULL AND owner_uid IS NOT DISTINCT FROM $1")?,
                owner_runs: p("SELECT name, state FROM tally_runs WHERE open AND state IS NOT NULL AND owner_uid IS NOT DISTINCT FROM $1 ORDER BY name")?,
                tool_lock: p("SELECT state, in_flight FROM tally_tools WHERE name = $1 FOR UPDATE")?,
                breakers: p("SELECT name, state FROM tally_tools ORDER BY name")?,
                tool_insert: p("INSERT INTO tally_tools (name, state, in_flight, version) VALUES ($1, $2, $3, 0) ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING state, in_flight")?,
                credential_lock: p("SELECT state FROM tally_credentials WHERE name = $1 FOR UPDATE")?,
                credential_insert: p("INSERT INTO tally_credentials (name, state, version) VALUES ($1, $2, 0) ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING state")?,
                write: p(WRITE)?,
                next_version: p("SELECT nextval('tally_state_version')")?,
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

    /// Create the schema, or check the one found, under an advisory lock (several
    /// daemons may start at once).
    fn migrate(&self) -> Result<(), PostgresError> {
        let failed = |e: GateError| PostgresError::Database {
            target: self.target.clone(),
            why: match e {
                GateError::Unavailable(why) => why,
                other => other.to_string(),
            },
        };
        let (client, connection) = self
            .wait("to connect", self.config.connect(NoTls))
            .map_err(failed)?;
        let task = self.rt.spawn(async move {
            let _ = connection.await;
        });
        let result = (|| {
            self.wait(
                "to create the schema",
                client.batch_execute(
                    "BEGIN; SELECT pg_advisory_xact_lock(7400331); \
                     CREATE TABLE IF NOT EXISTS tally_schema (version integer NOT NULL);",
                ),
            )?;
            let rows = self.wait(
                "to read the schema version",
                client.query("SELECT max(version) FROM tally_schema", &[]),
            )?;
            let found: Option<i32> = rows.first().and_then(|r| r.get(0));
            let steps: &[&str] = match found {
                None => &[SCHEMA_V1, SCHEMA_V2],
                Some(1) => &[SCHEMA_V2],
                Some(v) if v > SCHEMA_VERSION => {
                    return Ok(Err(PostgresError::SchemaTooNew {
                        target: self.target.clone(),
                        found: v,
                        known: SCHEMA_VERSION,
                    }))
                }
                Some(_) => &[],
            };
            if !steps.is_empty() {
                for step in steps {
                    self.wait("to create the schema", client.batch_execute(step))?;
                }
                self.wait(
                    "to record the schema version",
                    client.execute(
                        "INSERT INTO tally_schema (version) VALUES ($1)",
                        &[&SCHEMA_VERSION],
                    ),
                )?;
            }
            self.wait("to commit the schema", client.batch_execute("COMMIT"))?;
            Ok(Ok(()))
        })();
        drop(client);
        let _ = self.rt.block_on(task);
        result.map_err(failed)?
    }
}

/// The gate's local lock, with a deadline: a decision queued behind others on a slow
/// database is refused once the bound has passed, not one bound after another.
#[derive(Default)]
struct Turn {
    busy: Mutex<bool>,
    freed: std::sync::Condvar,
}

/// A held [`Turn`], given back on drop.
struct TurnGuard<'a>(&'a Turn);

impl Turn {
    fn take(&self, bound: Duration) -> Result<TurnGuard<'_>, GateError> {
        fn poisoned<T>(_: T) -> GateError {
            GateError::Unavailable("the gate's state lock was poisoned".into())
        }
        let deadline = std::time::Instant::now() + bound;
        let mut busy = self.busy.lock().map_err(poisoned)?;
        while *busy {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(GateError::Unavailable(format!(
                    "this gate's earlier decisions held PostgreSQL for more than {} ms; the gate refuses until the database answers (retry)",
                    bound.as_millis()
                )));
            }
            busy = self.freed.wait_timeout(busy, left).map_err(poisoned)?.0;
        }
        *busy = true;
        Ok(TurnGuard(self))
    }
}

impl Drop for TurnGuard<'_> {
    fn drop(&mut self) {
        *self.0.busy.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.0.freed.notify_one();
    }
}

/// One decision's transaction: the daemon's local lock, the PostgreSQL transaction, and
/// the rows read (locked) so far.
pub struct PostgresTxn<'a> {
    backend: &'a Postgres,
    conn: MutexGuard<'a, Option<Conn>>,
    /// Given back last (fields drop in order): after the connection's own lock.
    _turn: TurnGuard<'a>,
    /// A PostgreSQL transaction is open (or will be, with its first statement).
    open: bool,
    /// Its BEGIN was sent.
    begun: bool,
    runs: BTreeMap<String, RunState>,
    tools: BTreeMap<String, ToolState>,
    credentials: BTreeMap<String, CredentialState>,
    listed: Vec<RunState>,
    empty: RunState,
}

impl StateBackend for Postgres {
    type Txn<'a> = PostgresTxn<'a>;

    fn networked(&self) -> bool {
        true
    }

    fn begin(&self) -> Result<PostgresTxn<'_>, GateError> {
        let turn = self.turn.take(self.timeout)?;
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
            tools: BTreeMap::new(),
            credentials: BTreeMap::new(),
            listed: Vec::new(),
            empty: RunState::default(),
        };
        // BEGIN goes with the transaction's first statement.
        t.open = true;
        Ok(t)
    }
}

fn tool_from(row: &Row) -> Result<ToolState, GateError> {
    let mut tool: ToolState = decode("a tool", row.get::<_, &[u8]>(0))?;
    tool.in_flight = decode("a tool's calls in flight", row.get::<_, &[u8]>(1))?;
    Ok(tool)
}

impl PostgresTxn<'_> {
    /// The connection failed or timed out: drop it (the server rolls back) and refuse.
    fn broken(&mut self) {
        self.open = false;
        if let Some(c) = self.conn.take() {
            self.backend.close(c);
        }
    }

    fn gone(&self) -> GateError {
        self.backend
            .unavailable("to keep its connection", "the connection was lost")
    }

    /// `COMMIT` or `ROLLBACK` (nothing to send if no statement began the transaction).
    fn simple(&mut self, what: &str, sql: &str) -> Result<(), GateError> {
        if !self.begun {
            self.open = false;
            return Ok(());
        }
        let Some(conn) = self.conn.as_ref() else {
            return Err(self.gone());
        };
        let r = self.backend.wait(what, conn.client.batch_execute(sql));
        if r.is_err() {
            self.broken();
        }
        r
    }

    fn rows(
        &mut self,
        what: &str,
        st: fn(&Statements) -> &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, GateError> {
        self.rows_then(what, st, params, false)
    }

    /// One statement in one round trip: preceded by `BEGIN` if it is the transaction's
    /// first, and followed by `COMMIT` if `commit` (requests on one connection are
    /// pipelined in order; a `COMMIT` after a failed statement only rolls back).
    fn rows_then(
        &mut self,
        what: &str,
        st: fn(&Statements) -> &Statement,
        params: &[&(dyn ToSql + Sync)],
        commit: bool,
    ) -> Result<Vec<Row>, GateError> {
        if !self.open {
            return Err(GateError::Unavailable(
                "the gate's transaction already ended".into(),
            ));
        }
        let Some(conn) = self.conn.as_ref() else {
            return Err(self.gone());
        };
        let begin = !self.begun;
        let client = &conn.client;
        let statement = st(&conn.st);
        let then = async {
            if commit {
                let (rows, done) = tokio::join!(
                    client.query(statement, params),
                    client.batch_execute("COMMIT")
                );
                let rows = rows?;
                done?;
                Ok(rows)
            } else {
                client.query(statement, params).await
            }
        };
        let r = self.backend.wait(what, async {
            if begin {
                let (began, rows) = tokio::join!(client.batch_execute("BEGIN"), then);
                began?;
                rows
            } else {
                then.await
            }
        });
        match &r {
            Ok(_) if commit => self.open = false,
            Ok(_) => self.begun = true,
            Err(_) => self.broken(),
        }
        r
    }

    /// The parameters of one write statement: a run's, a tool's and a credential's rows
    /// (any of them). `None` if this transaction holds none of them.
    fn row(
        &self,
        run: Option<&str>,
        tool: Option<&str>,
        credential: Option<&str>,
    ) -> Option<WriteRow> {
        let run = run.and_then(|n| self.runs.get(n).map(|r| (n, r)));
        let tool = tool.and_then(|n| self.tools.get(n).map(|t| (n, t)));
        let credential = credential.and_then(|n| self.credentials.get(n).map(|c| (n, c)));
        if run.is_none() && tool.is_none() && credential.is_none() {
            return None;
        }
        Some(WriteRow {
            run_name: run.map(|(n, _)| n.to_owned()),
            run_state: run.map(|(_, r)| encode(r)),
            owner: run.and_then(|(_, r)| r.owner_uid.map(i64::from)),
            parent: run.and_then(|(_, r)| r.parent.clone()),
            open: run.map(|(_, r)| r.stop.is_none()),
            tool_name: tool.map(|(n, _)| n.to_owned()),
            tool_state: tool.map(|(_, t)| encode(t)),
            tool_flight: tool.map(|(_, t)| encode(&t.in_flight)),
            cred_name: credential.map(|(n, _)| n.to_owned()),
            cred_state: credential.map(|(_, c)| encode(c)),
        })
    }

    /// Write rows in one statement, and commit with it if `commit`.
    fn write(
        &mut self,
        run: Option<&str>,
        tool: Option<&str>,
        credential: Option<&str>,
        commit: bool,
    ) -> Result<(), GateError> {
        let Some(row) = self.row(run, tool, credential) else {
            return Ok(());
        };
        self.rows_then(
            "to write a decision's state",
            |s| &s.write,
            &row.params(),
            commit,
        )?;
        Ok(())
    }

    /// The transaction's last round trip: `last`'s write (if any), the next state
    /// version, and `COMMIT`, pipelined. Every row the decision touches is held by now,
    /// so the version orders it after every decision that touched one of them before.
    fn seal(&mut self, last: Option<WriteRow>) -> Result<u64, GateError> {
        if !self.open {
            return Err(GateError::Unavailable(
                "the gate's transaction already ended".into(),
            ));
        }
        let Some(conn) = self.conn.as_ref() else {
            return Err(self.gone());
        };
        let begin = !self.begun;
        let client = &conn.client;
        let st = &conn.st;
        let r = self.backend.wait("to commit a decision's state", async {
            let params = last.as_ref().map(WriteRow::params);
            let began = async {
                match begin {
                    true => client.batch_execute("BEGIN").await,
                    false => Ok(()),
                }
            };
            let written = async {
                match &params {
                    Some(p) => client.query(&st.write, p).await.map(drop),
                    None => Ok(()),
                }
            };
            // Requests go out on their futures' first polls, in order. A write that fails
            // before it is sent (its parameters do not encode) must not be followed by
            // the COMMIT of what came before it: polled once first, alone.
            let mut began = std::pin::pin!(futures::future::maybe_done(began));
            let mut written = std::pin::pin!(futures::future::maybe_done(written));
            let _ = futures::poll!(began.as_mut());
            let _ = futures::poll!(written.as_mut());
            if let Some(Err(_)) = written.as_mut().output_mut() {
                if let Some(Err(e)) = written.as_mut().take_output() {
                    return Err(e);
                }
            }
            let (_, _, version, committed) = tokio::join!(
                began.as_mut(),
                written.as_mut(),
                client.query_one(&st.next_version, &[]),
                client.batch_execute("COMMIT")
            );
            if let Some(r) = began.as_mut().take_output() {
                r?;
            }
            if let Some(r) = written.as_mut().take_output() {
                r?;
            }
            let version = version?;
            committed?;
            Ok(version.get::<_, i64>(0))
        });
        match r {
            Ok(v) => {
                self.open = false;
                u64::try_from(v).map_err(|_| {
                    self.backend
                        .unavailable("to number a decision", "the state version is negative")
                })
            }
            Err(e) => {
                self.broken();
                Err(e)
            }
        }
    }
}

/// One write statement's parameters (see [`WRITE`]).
struct WriteRow {
    run_name: Option<String>,
    run_state: Option<Vec<u8>>,
    owner: Option<i64>,
    parent: Option<String>,
    open: Option<bool>,
    tool_name: Option<String>,
    tool_state: Option<Vec<u8>>,
    tool_flight: Option<Vec<u8>>,
    cred_name: Option<String>,
    cred_state: Option<Vec<u8>>,
}

impl WriteRow {
    fn params(&self) -> [&(dyn ToSql + Sync); 10] {
        [
            &self.run_name,
            &self.run_state,
            &self.owner,
            &self.parent,
            &self.open,
            &self.tool_name,
            &self.tool_state,
            &self.tool_flight,
            &self.cred_name,
            &self.cred_state,
        ]
    }
}

impl StateTxn for PostgresTxn<'_> {
    fn is_new(&mut self, run: &str) -> Result<bool, GateError> {
        let raw = self
            .backend
            .ledger
            .state_get(&tally_gate::raw_run_entry(run).0)?;
        if raw.is_some() || self.runs.contains_key(run) {
            return Ok(false);
        }
        // Claiming the name inserts its row: a second daemon starting the same name waits
        // for this transaction, then finds the name taken.
        let claimed = self.rows("to claim a run's name", |s| &s.run_claim, &[&run])?;
        Ok(!claimed.is_empty())
    }

    fn governs(&mut self, run: &str) -> Result<bool, GateError> {
        if self.runs.contains_key(run) {
            return Ok(true);
        }
        Ok(!self
            .rows("to look a run up", |s| &s.run_exists, &[&run])?
            .is_empty())
    }

    fn run(&mut self, run: &str, caller: Caller) -> Result<&RunState, GateError> {
        if !self.runs.contains_key(run) {
            let rows = self.rows("to read a run", |s| &s.run_lock, &[&run])?;
            let row = rows
                .first()
                .ok_or_else(|| GateError::RunNotFound(run.to_owned()))?;
            let state: RunState = decode(&format!("run `{run}`"), row.get::<_, &[u8]>(0))?;
            self.runs.insert(run.to_owned(), state);
        }
        let state = self
            .runs
            .get(run)
            .ok_or_else(|| GateError::RunNotFound(run.to_owned()))?;
        // Exactly the uid that started it (loopback TCP peers are one identity), or the
        // operator.
        if caller.operator || state.owner_uid == caller.uid {
            Ok(state)
        } else {
            Err(GateError::NotOwner {
                run: run.to_owned(),
            })
        }
    }

    fn run_mut(&mut self, run: &str) -> Option<&mut RunState> {
        self.runs.get_mut(run)
    }

    fn insert_run(&mut self, run: RunState) {
        self.runs.insert(run.run.clone(), run);
    }

    fn open_runs_of(&mut self, uid: Option<u32>) -> Result<u64, GateError> {
        // The owner's row is held to the end of the transaction: two daemons never both
        // start its last allowed run.
        let owner = uid.map_or(NO_UID, i64::from);
        self.rows("to lock a uid's runs", |s| &s.owner_lock, &[&owner])?;
        let uid = uid.map(i64::from);
        let rows = self.rows("to count a uid's runs", |s| &s.owner_count, &[&uid])?;
        let n: i64 = rows.first().map_or(0, |r| r.get(0));
        Ok(u64::try_from(n).unwrap_or(0))
    }

    fn expired_runs_of(
        &mut self,
        uid: Option<u32>,
        expired: &dyn Fn(&RunState) -> bool,
    ) -> Result<Vec<String>, GateError> {
        let uid = uid.map(i64::from);
        let rows = self.rows("to list a uid's runs", |s| &s.owner_runs, &[&uid])?;
        let mut names = Vec::new();
        for row in &rows {
            let name: String = row.get(0);
            // What this transaction changed wins over what the database held.
            let state = match self.runs.get(&name) {
                Some(r) => r.clone(),
                None => decode::<RunState>("a run", row.get::<_, &[u8]>(1))?,
            };
            if state.stop.is_none() && expired(&state) {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn runs(&mut self) -> Result<Vec<&RunState>, GateError> {
        let rows = self.rows("to list the open runs", |s| &s.runs_open, &[])?;
        let mut listed = Vec::with_capacity(rows.len());
        for row in &rows {
            listed.push(decode::<RunState>("a run", row.get::<_, &[u8]>(0))?);
        }
        self.listed = listed;
        Ok(self.listed.iter().collect())
    }

    fn open_children(&mut self, run: &str) -> Result<Vec<String>, GateError> {
        let rows = self.rows("to list a run's children", |s| &s.children, &[&run])?;
        let mut children: BTreeSet<String> = rows.iter().map(|r| r.get(0)).collect();
        // What this transaction changed wins over what the database held at its start.
        for r in self.runs.values() {
            if r.parent.as_deref() == Some(run) {
                if r.stop.is_none() {
                    children.insert(r.run.clone());
                } else {
                    children.remove(&r.run);
                }
            }
        }
        Ok(children.into_iter().collect())
    }

    fn breakers(&mut self) -> Result<Vec<(String, tally_policy::Breaker)>, GateError> {
        let rows = self.rows("to list the tools", |s| &s.breakers, &[])?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let tool: ToolState = decode("a tool", row.get::<_, &[u8]>(1))?;
            out.push((row.get::<_, String>(0), tool.breaker));
        }
        Ok(out)
    }

    fn ensure_tool(&mut self, tool: &str, _now_ms: u64, _policy: &Policy) -> Result<(), GateError> {
        if self.tools.contains_key(tool) {
            return Ok(());
        }
        let mut rows = self.rows("to read a tool", |s| &s.tool_lock, &[&tool])?;
        if rows.is_empty() {
            let fresh = ToolState::default();
            let (state, flight) = (encode(&fresh), encode(&fresh.in_flight));
            rows = self.rows(
                "to create a tool",
                |s| &s.tool_insert,
                &[&tool, &state, &flight],
            )?;
        }
        let row = rows.first().ok_or_else(|| {
            self.backend
                .unavailable("to read a tool", "no row came back")
        })?;
        let state = tool_from(row)?;
        self.tools.insert(tool.to_owned(), state);
        Ok(())
    }

    fn ensure_credential(
        &mut self,
        credential: &str,
        _now_ms: u64,
        _policy: &Policy,
    ) -> Result<(), GateError> {
        if self.credentials.contains_key(credential) {
            return Ok(());
        }
        let mut rows = self.rows(
            "to read a credential",
            |s| &s.credential_lock,
            &[&credential],
        )?;
        if rows.is_empty() {
            let state = encode(&CredentialState::default());
            rows = self.rows(
                "to create a credential",
                |s| &s.credential_insert,
                &[&credential, &state],
            )?;
        }
        let row = rows.first().ok_or_else(|| {
            self.backend
                .unavailable("to read a credential", "no row came back")
        })?;
        let state: CredentialState = decode("a credential", row.get::<_, &[u8]>(0))?;
        self.credentials.insert(credential.to_owned(), state);
        Ok(())
    }

    fn view(&self, s: &Scopes<'_>) -> View<'_> {
        View {
            run: self.runs.get(s.run).unwrap_or(&self.empty),
            tool: s.tool.and_then(|t| self.tools.get(t)),
            credential: s.credential.and_then(|c| self.credentials.get(c)),
            family: Default::default(),
        }
    }

    fn view_mut(&mut self, s: &Scopes<'_>) -> ViewMut<'_> {
        let run = self
            .runs
            .entry(s.run.to_owned())
            .or_insert_with(|| RunState::new(s.run));
        ViewMut {
            run,
            tool: s.tool.and_then(|t| self.tools.get_mut(t)),
            credential: s.credential.and_then(|c| self.credentials.get_mut(c)),
            parent: None,
            continued: None,
        }
    }

    fn mark_stopped(&mut self, _run: &str) {
        // Nothing is kept in memory past the transaction.
    }

    fn pause_changed(&mut self, _run: &str, _paused: bool) -> Result<(), GateError> {
        // The run's row, pause included, is written with the record (`persist`).
        Ok(())
    }

    fn persist(&mut self, scopes: &[Scopes<'_>]) -> Result<u64, GateError> {
        if !self.open {
            return Err(GateError::Unavailable(
                "the gate's transaction already ended".into(),
            ));
        }
        let mut runs: Vec<String> = scopes.iter().map(|s| s.run.to_owned()).collect();
        runs.dedup();
        // Every tool and credential this transaction read is locked and may have
        // changed (a stop frees its calls' slots): write them all. Rows go three to a
        // statement (a run, a tool, a credential): a check writes, takes its version and
        // commits in one round trip.
        let (tools, creds) = if scopes.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            (
                self.tools.keys().cloned().collect::<Vec<_>>(),
                self.credentials.keys().cloned().collect::<Vec<_>>(),
            )
        };
        let n = runs.len().max(tools.len()).max(creds.len());
        for i in 0..n.saturating_sub(1) {
            self.write(
                runs.get(i).map(String::as_str),
                tools.get(i).map(String::as_str),
                creds.get(i).map(String::as_str),
                false,
            )?;
        }
        let last = n.checked_sub(1).and_then(|i| {
            self.row(
                runs.get(i).map(String::as_str),
                tools.get(i).map(String::as_str),
                creds.get(i).map(String::as_str),
            )
        });
        self.seal(last)
    }

    fn commit(
        self,
        plaintexts: Vec<Vec<u8>>,
        scopes: &[Scopes<'_>],
        ledger_state: Vec<(Vec<u8>, Vec<u8>)>,
        done: Committed,
    ) {
        let _ = scopes;
        if self.open {
            // The gate persists first (and so numbers the decision); a caller that did
            // not is refused, not recorded. Dropping the transaction rolls it back.
            return done(Err(tally_ledger::Error::Store(
                "a decision was committed before its state was persisted".into(),
            )));
        }
        // Queued under the local lock: this ledger's order is the order state changed.
        self.backend
            .ledger
            .submit_with_state(plaintexts, ledger_state, done);
        drop(self);
    }
}

impl Drop for PostgresTxn<'_> {
    fn drop(&mut self) {
        if self.open {
            // Not committed: keep nothing (a failure here drops the connection, which
            // rolls back on the server too).
            let _ = self.simple("to roll back", "ROLLBACK");
        }
    }
}
