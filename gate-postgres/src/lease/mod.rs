//! Leased slices of budgets (docs/FLEET.md, "Leased slices (the foundation)"): a holder
//! (one daemon) leases a slice of a scope's remaining budget from PostgreSQL, and the
//! database keeps, in one statement per grant, settled + held + every slice out within
//! each cap ([`sql`] says why no race breaks it).
//!
//! [`Leases`] is one holder's lease manager: opening it bumps the holder's epoch (an
//! older manager of the same holder is fenced off) and adopts the holder's slices still
//! out; then [`Leases::grant`], [`Leases::renew`], [`Leases::release`] (the unused part
//! back, once) and [`Leases::reclaim_expired`] (only past expiry plus the skew margin).
//! [`Slices`] is one daemon's side: the slices it holds, a use taken locally when it
//! fits ([`Slices::take`]), refills, central spends of the last units, and the periodic
//! work ([`Slices::tick`]). [`Leased`] is the gate's backend that decides runs at home
//! inside them ([`home`]), [`open_leased`] and [`spawn_timer`] how a daemon opens it.

mod backend;
mod breakers;
mod calls;
mod central;
mod events;
mod group;
mod holder;
mod home;
mod open;
mod sql;
mod tick;
mod types;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tokio_postgres::{Client, NoTls, Row};

pub use backend::{txn::LeasedTxn, Leased};
pub use breakers::{BreakersTicked, ViewLimits};
pub use events::{on_lease_event, LeaseEvent, LeaseMetrics, Sink};
pub use group::GROUP_SUFFIX;
pub use holder::{SliceError, SliceOptions, Slices, Taken};
pub(crate) use home::{HOME_GUARD, HOME_GUARD_SEALED, HOME_READ, HOME_WRITE};
pub use open::{open_leased, spawn_timer, LeaseSetup};
pub(crate) use sql::LEASE_RAISE;
pub use tick::{spawn_ticks, Ticked};
pub use types::{
    Amounts, Caps, Grant, Lease, LeaseClock, LeaseError, Outlook, Reclaimed, Released, Scope,
    ScopeKind, Spent,
};

use crate::{Options, PostgresError, Rt};

/// How a lease manager times its slices.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    /// How long a slice (or a renewal) lasts.
    pub ttl: Duration,
    /// How long past a slice's expiry it is still left to its holder before it may be
    /// reclaimed: the clock skew and request latency between a holder and the database.
    pub margin: Duration,
    /// Where the time is read.
    pub clock: LeaseClock,
}

impl Default for LeaseOptions {
    /// Slices of 10 s, reclaimed 5 s past their expiry, on the database's clock.
    fn default() -> LeaseOptions {
        LeaseOptions {
            ttl: Duration::from_secs(10),
            margin: Duration::from_secs(5),
            clock: LeaseClock::database(),
        }
    }
}

struct Conn {
    client: Client,
    task: tokio::task::JoinHandle<()>,
}

/// One holder's lease manager, on a connection of its own (made again after it breaks).
pub struct Leases {
    config: tokio_postgres::Config,
    target: String,
    timeout: Duration,
    rt: Rt,
    conn: Mutex<Option<Conn>>,
    holder: String,
    epoch: i64,
    options: LeaseOptions,
    adopted: Vec<Lease>,
    /// Every use of this manager's slices is committed with its decision (the leased
    /// backend's): its slices' committed use is counted from 0 ([`Leases::commits_use`]).
    commits: AtomicBool,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("target", &self.target)
            .field("holder", &self.holder)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

/// A count as the tables hold it (bigint).
fn big(what: &str, n: u64) -> Result<i64, LeaseError> {
    i64::try_from(n).map_err(|_| LeaseError::Invalid(format!("{what} {n} is above 2^63 - 1")))
}

fn bigs(what: &str, a: &Amounts) -> Result<[i64; 4], LeaseError> {
    let e = a.each();
    Ok([
        big(what, e[0])?,
        big(what, e[1])?,
        big(what, e[2])?,
        big(what, e[3])?,
    ])
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Four bigint columns from `at`, as amounts (a negative value reads as 0).
fn amounts_at(row: &Row, at: usize) -> Amounts {
    let v = |i: usize| u64::try_from(row.get::<_, i64>(at + i)).unwrap_or(0);
    Amounts::from_each([v(0), v(1), v(2), v(3)])
}

/// Four nullable bigint columns from `at`, as what is left (a negative room reads as 0).
fn left_at(row: &Row, at: usize) -> Caps {
    let v = |i: usize| {
        row.get::<_, Option<i64>>(at + i)
            .map(|n| u64::try_from(n).unwrap_or(0))
    };
    Caps::from_each([v(0), v(1), v(2), v(3)])
}

fn scope_at(row: &Row, at: usize) -> Scope {
    let kind: &str = row.get(at);
    Scope {
        // The table's CHECK holds the kinds.
        kind: ScopeKind::parse(kind).unwrap_or(ScopeKind::Run),
        key: row.get(at + 1),
    }
}

fn interval_of(row: &Row, at: usize) -> Duration {
    row.get::<_, Interval>(at).0
}

/// A PostgreSQL `interval` of whole microseconds (days and months: none here).
struct Interval(Duration);

impl<'a> tokio_postgres::types::FromSql<'a> for Interval {
    fn from_sql(
        _: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Interval, Box<dyn std::error::Error + Sync + Send>> {
        let bytes: [u8; 16] = raw.try_into()?;
        let mut us = [0u8; 8];
        us.copy_from_slice(&bytes[..8]);
        let mut days = [0u8; 4];
        days.copy_from_slice(&bytes[8..12]);
        let us = i64::from_be_bytes(us) + i64::from(i32::from_be_bytes(days)) * 86_400_000_000;
        Ok(Interval(Duration::from_micros(
            u64::try_from(us).unwrap_or(0),
        )))
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        *ty == tokio_postgres::types::Type::INTERVAL
    }
}

/// A lease row of [`sql::ADOPT`] or [`sql::HELD`].
fn lease_of(row: &Row) -> Lease {
    Lease {
        id: row.get(0),
        scope: scope_at(row, 1),
        epoch: row.get(3),
        granted: amounts_at(row, 4),
        granted_at: row.get(8),
        expires_at: row.get(9),
        valid_for: interval_of(row, 10),
        committed: committed_at(row, 11),
    }
}

/// Four nullable bigint columns from `at`, a slice's committed use (NULL: not known).
fn committed_at(row: &Row, at: usize) -> Option<Amounts> {
    row.get::<_, Option<i64>>(at).map(|_| {
        let v = |i: usize| {
            row.get::<_, Option<i64>>(at + i)
                .map_or(0, |n| u64::try_from(n).unwrap_or(0))
        };
        Amounts::from_each([v(0), v(1), v(2), v(3)])
    })
}

impl Leases {
    /// Connect as `holder` (a name unique to one daemon, stable across its restarts),
    /// create or migrate the schema, take the holder's name at a new epoch and adopt its
    /// slices still out ([`Leases::adopted`]).
    pub fn open(
        options: &Options,
        holder: &str,
        leases: LeaseOptions,
    ) -> Result<Leases, PostgresError> {
        let (config, target, rt) = crate::client(options, "tally-leases")?;
        crate::schema::migrate(&rt, &config, &target, options.timeout, &AtomicU64::new(0))?;
        let mut manager = Leases {
            config,
            target: target.clone(),
            timeout: options.timeout,
            rt,
            conn: Mutex::new(None),
            holder: holder.to_owned(),
            epoch: 0,
            options: leases,
            adopted: Vec::new(),
            commits: AtomicBool::new(false),
        };
        let (epoch, adopted) = manager.bump().map_err(|e| PostgresError::Database {
            target,
            why: e.to_string(),
        })?;
        manager.epoch = epoch;
        manager.adopted = adopted;
        Ok(manager)
    }

    /// The holder's name.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// This manager's epoch.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// From now on every use of this manager's slices is committed with its decision,
    /// in the decision's transaction (`tally_home_write` with the slice: the leased
    /// backend's decisions at home do): the slices it grants count their committed use
    /// from 0, so a reclaim settles that use and gives the rest back. A manager whose
    /// uses are not committed so (the default) grants slices whose use is not known:
    /// settled whole when reclaimed.
    ///
    /// **It is the whole manager's, for every slice it grants from now on**, not a
    /// grant's: call it only on a manager every use of whose slices is committed so (the
    /// leased backend calls it on its own). A use of such a slice that is not committed
    /// with its decision (a `Slices::take` outside the leased backend) is missing from
    /// its committed use: a reclaim would settle less than was used, and give it back.
    pub fn commits_use(&self) {
        self.commits.store(true, Ordering::Relaxed);
    }

    /// Whether this manager's slices count their committed use ([`Leases::commits_use`]).
    pub(crate) fn commits(&self) -> bool {
        self.commits.load(Ordering::Relaxed)
    }

    /// The manager's time, as the lease statements take it (`None`: the database's).
    pub(crate) fn clock_now(&self) -> Option<SystemTime> {
        self.now()
    }

    /// The holder's slices that were out when this manager opened (granted by an earlier
    /// manager of the holder, now this one's to renew or return).
    pub fn adopted(&self) -> &[Lease] {
        &self.adopted
    }

    fn unavailable(&self, what: &'static str, why: String) -> LeaseError {
        LeaseError::Unavailable {
            target: self.target.clone(),
            what,
            why,
        }
    }

    /// Run `f` on the connection (made first if there is none) within the bound: the
    /// database's own error inside, no answer (or no connection) outside. After any
    /// failure the connection is dropped (the server rolls back what it began) and made
    /// again next time.
    fn run<T>(
        &self,
        what: &'static str,
        f: impl AsyncFnOnce(&Client) -> Result<T, tokio_postgres::Error>,
    ) -> Result<Result<T, tokio_postgres::Error>, LeaseError> {
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if conn.as_ref().is_some_and(|c| c.client.is_closed()) {
            if let Some(c) = conn.take() {
                c.task.abort();
            }
        }
        if conn.is_none() {
            let (client, connection) = self
                .rt
                .bounded(self.timeout, self.config.connect(NoTls))
                .map_err(|why| self.unavailable("to connect", why))?;
            let task = self.rt.spawn(async move {
                let _ = connection.await;
            });
            *conn = Some(Conn { client, task });
        }
        let Some(c) = conn.as_ref() else {
            return Err(self.unavailable(what, "no connection".into()));
        };
        let r = self
            .rt
            .block_on(async { tokio::time::timeout(self.timeout, f(&c.client)).await });
        if !matches!(r, Ok(Ok(_))) {
            if let Some(c) = conn.take() {
                c.task.abort();
            }
        }
        r.map_err(|_| {
            self.unavailable(
                what,
                format!("no answer within {} ms", self.timeout.as_millis()),
            )
        })
    }

    /// [`Leases::run`], the database's error said as unavailable.
    fn with<T>(
        &self,
        what: &'static str,
        f: impl AsyncFnOnce(&Client) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, LeaseError> {
        self.run(what, f)?
            .map_err(|e| self.unavailable(what, crate::describe(&e)))
    }

    fn now(&self) -> Option<SystemTime> {
        self.options.clock.now()
    }

    /// Bump the holder's epoch and adopt its slices out, in one transaction.
    fn bump(&self) -> Result<(i64, Vec<Lease>), LeaseError> {
        let holder = self.holder.as_str();
        self.with("to take the holder's epoch", async |c| {
            c.batch_execute("BEGIN").await?;
            let epoch: i64 = c.query_one(sql::BUMP, &[&holder]).await?.get(0);
            let rows = c.query(sql::ADOPT, &[&holder, &epoch]).await?;
            c.batch_execute("COMMIT").await?;
            Ok((epoch, rows.iter().map(lease_of).collect()))
        })
    }

    /// This holder's slices out now, granted at this manager's epoch (after a grant
    /// whose answer was lost, one may be here that the caller never saw).
    pub fn held(&self) -> Result<Vec<Lease>, LeaseError> {
        let (holder, now, epoch) = (self.holder.as_str(), self.now(), self.epoch);
        self.with("to list the holder's slices", async |c| {
            Ok(c.query(sql::HELD, &[&holder, &now, &epoch])
                .await?
                .iter()
                .map(lease_of)
                .collect())
        })
    }
}
