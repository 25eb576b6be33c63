//! Group commit of the decisions at home (docs/FLEET.md, "Group commit"): a decision
//! at home that sent nothing to the database while it was made (its run's copy kept
//! here, its tool's breaker read from this daemon's view, no shared row read) is queued
//! here; one thread of the backend's, on a connection of its own, commits every
//! decision queued while the previous commit was in flight in ONE transaction (per
//! decision its runs' guarded writes, `tally_home_write`, which lock their rows, then
//! its state version; then `COMMIT`; in one round trip), and only then, in the order
//! they were queued, makes each decision's records at its version and hands them to
//! the ledger (which answers once they are durable). A commit that fails answers every decision of it, and every one
//! queued behind it, with a refusal (nothing queued for the ledger) and lets their
//! runs' copies go (read again from their rows next time); but where it failed only
//! because a run was taken back (its guarded write refused), only that run's decisions
//! are refused and the others committed again ([`taken`]).
//!
//! Decisions on one run stay serialised: the gate makes them one at a time (the
//! daemon's turn), each on the copy the previous one left; a later one is queued after
//! it, written after it in the same transaction or a later one, and refused with it if
//! its commit fails. Whatever is not such a decision ([`Group::drain`]) waits until
//! every queued one was committed and handed to the ledger: each ledger's versions
//! still rise, and each version is taken once its decision's rows are locked, as
//! before (so a decision of another daemon that locked a run's row before it has a
//! smaller version, one after it a larger).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tally_gate::GateError;
use tokio_postgres::{Client, NoTls, Statement};

use super::home::Home;
use crate::txn::{commit_refused, write_homes, HomeWrite};
use crate::Rt;

mod taken;

/// The most decisions one transaction carries: few enough that their statements are
/// sent in the order queued (`join_all` of at most 30 polls them in order), so their
/// versions rise in the order their records are queued.
const MOST: usize = 30;

/// Where [`Group::counts`] counts a decision whose run's guard found it no longer at
/// home here, and one made on a copy a failed group commit let go.
pub(crate) const GUARD_TAKEN_BACK: usize = 3;
pub(crate) const GUARD_STALE: usize = 4;
/// Where [`Group::counts`] counts a decision whose group's `COMMIT` went unanswered.
const GROUP_UNSURE: usize = 5;

/// The `application_name` of the group commit's connection, appended to the gate's own.
pub const GROUP_SUFFIX: &str = "-group";

/// What became of a queued decision's state.
pub(crate) enum Outcome {
    /// Committed at this state version: its records go to the ledger.
    Committed(u64),
    /// Rolled back for certain (or never sent): what it took may be given back.
    RolledBack(GateError),
    /// Its `COMMIT` went out unanswered: it may have committed (its use stays counted).
    Unsure(GateError),
}

/// One decision queued: its runs' writes, and what follows its commit.
pub(crate) struct Item {
    pub(crate) homes: Vec<HomeWrite>,
    /// The tools whose breakers it decided from this holder's views, and of those the
    /// ones whose views it changed (outcomes folded there while it is queued).
    pub(crate) tools: Vec<String>,
    pub(crate) changed: Vec<String>,
    /// Its effect on the tools' breaker views undone: run under the queue's lock if it
    /// rolled back for certain, before a later decision may be made.
    pub(crate) undo: Box<dyn FnOnce() + Send>,
    pub(crate) then: Box<dyn FnOnce(Outcome) + Send>,
}

/// The group commit's generation a decision began in: its failed commits, and its
/// decisions taken back that changed tools' breaker views ([`Group::queue`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Generation {
    all: u64,
    taint: u64,
}

#[derive(Default)]
struct Queue {
    items: Vec<Item>,
    in_flight: bool,
    /// Bumped by every failed commit: a decision made before it is not queued.
    generation: u64,
    /// Bumped when a decision taken back had changed tools' breaker views, and each
    /// such tool with the count it was bumped to: a decision that decided one of them
    /// from its view before is not queued ([`taken`]).
    taint: u64,
    tainted: BTreeMap<String, u64>,
    closed: bool,
    /// Decisions waiting in [`Group::drain`] now.
    draining: usize,
}

impl Queue {
    /// See [`Group::stale`].
    fn stale<'t>(
        &self,
        generation: Generation,
        tools: impl IntoIterator<Item = &'t String>,
    ) -> bool {
        self.generation != generation.all
            || tools
                .into_iter()
                .any(|t| self.tainted.get(t).is_some_and(|&at| at > generation.taint))
    }
}

struct Shared {
    queue: Mutex<Queue>,
    /// The committer waits here for decisions.
    queued: Condvar,
    /// Drains wait here for the queue to empty.
    emptied: Condvar,
    homes: Arc<Mutex<BTreeMap<String, Home>>>,
    link: Link,
    /// Transactions committed, decisions committed in them, decisions refused; and the
    /// lease guards' refusals (`GUARD_TAKEN_BACK`, `GUARD_STALE`), here or centrally.
    counts: [AtomicU64; 6],
}

/// Why a group's transaction did not commit.
pub(crate) struct Failed {
    /// It rolled back for certain.
    certain: bool,
    why: String,
    /// The decision whose run's guarded write the server refused first (a run taken
    /// back or taken over since its copy was kept here): every statement was answered,
    /// so the connection is clean and the other decisions may be committed again.
    taken_back: Option<usize>,
}

/// How the committer reaches the database.
struct Link {
    config: tokio_postgres::Config,
    target: String,
    timeout: Duration,
    round_trips: Arc<AtomicU64>,
}

/// The group commit of one leased backend.
pub(crate) struct Group {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Group {
    /// The committer thread started, on the central backend's database.
    pub(crate) fn start(
        central: &crate::Postgres,
        homes: Arc<Mutex<BTreeMap<String, Home>>>,
    ) -> std::io::Result<Group> {
        let mut config = central.config.clone();
        let name = format!(
            "{}{GROUP_SUFFIX}",
            config.get_application_name().unwrap_or("tally")
        );
        config.application_name(&name);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            queued: Condvar::new(),
            emptied: Condvar::new(),
            homes,
            counts: Default::default(),
            link: Link {
                config,
                target: central.target.clone(),
                timeout: central.timeout,
                round_trips: Arc::clone(&central.round_trips),
            },
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("tally-group-commit".into())
            .spawn(move || committer(&s, &Rt(Some(rt))))?;
        Ok(Group {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The generation a decision begins in (see [`Group::queue`]).
    pub(crate) fn generation(&self) -> Generation {
        let q = lock(&self.shared.queue);
        Generation {
            all: q.generation,
            taint: q.taint,
        }
    }

    /// Whether a commit failed since `generation`, or a decision taken back since changed
    /// the view of one of `tools` (a decision begun then, that decided them from their
    /// views, is refused).
    pub(crate) fn stale<'t>(
        &self,
        generation: Generation,
        tools: impl IntoIterator<Item = &'t String>,
    ) -> bool {
        lock(&self.shared.queue).stale(generation, tools)
    }

    /// Queue `item` if no commit failed since `generation` (a decision made on copies a
    /// failed commit let go is refused: nothing queued) and no decision taken back since
    /// changed the view of a tool `item` decided from its view, `apply` run first under
    /// the queue's lock (the copies it keeps are let go by any later failure).
    pub(crate) fn queue(
        &self,
        generation: Generation,
        item: Item,
        apply: impl FnOnce(),
    ) -> Result<(), GateError> {
        let mut q = lock(&self.shared.queue);
        if q.closed || q.stale(generation, &item.tools) {
            if !q.closed {
                self.guard_refused(GUARD_STALE);
            }
            return Err(GateError::Unavailable(
                "a commit of decisions made before this one failed: retry".into(),
            ));
        }
        apply();
        q.items.push(item);
        self.shared.queued.notify_one();
        Ok(())
    }

    /// Wait until every queued decision was committed and handed to the ledger (or
    /// refused), at most the bound.
    pub(crate) fn drain(&self) -> Result<(), GateError> {
        let bound = self.shared.link.timeout.saturating_mul(2);
        let deadline = Instant::now() + bound;
        let mut q = lock(&self.shared.queue);
        q.draining += 1;
        let mut r = Ok(());
        while !q.items.is_empty() || q.in_flight {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                r = Err(GateError::Unavailable(format!(
                    "this gate's queued decisions held PostgreSQL for more than {} ms; the gate refuses until the database answers (retry)",
                    bound.as_millis()
                )));
                break;
            }
            q = self
                .shared
                .emptied
                .wait_timeout(q, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        q.draining -= 1;
        r
    }

    /// Decisions waiting now for the queued ones to be committed ([`Group::drain`]).
    pub(crate) fn draining(&self) -> usize {
        lock(&self.shared.queue).draining
    }

    /// Decisions queued now, and whether a commit of them is in flight.
    pub(crate) fn pending(&self) -> (usize, bool) {
        let q = lock(&self.shared.queue);
        (q.items.len(), q.in_flight)
    }

    /// Transactions committed (`group_commits`), the decisions committed in them
    /// (`group_decisions`), decisions refused because their group did not commit or
    /// their run was taken back (`group_refused`); and the decisions the lease guards
    /// refused, in a group or centrally: their run's home taken back, taken over or its
    /// epoch fenced (`guard_taken_back`), or made on a copy a failed group commit let go
    /// (`guard_stale_copy`); and the decisions refused because their group's `COMMIT`
    /// went unanswered, which may have been recorded (`group_unsure`, within
    /// `group_refused`).
    pub(crate) fn counts(&self) -> [(&'static str, u64); 6] {
        let c = |i: usize| self.shared.counts[i].load(Ordering::Relaxed);
        [
            ("group_commits", c(0)),
            ("group_decisions", c(1)),
            ("group_refused", c(2)),
            ("group_unsure", c(GROUP_UNSURE)),
            ("guard_taken_back", c(GUARD_TAKEN_BACK)),
            ("guard_stale_copy", c(GUARD_STALE)),
        ]
    }

    /// One decision refused by a lease guard (`GUARD_TAKEN_BACK`, `GUARD_STALE`).
    pub(crate) fn guard_refused(&self, which: usize) {
        self.shared.counts[which].fetch_add(1, Ordering::Relaxed);
    }

    /// Every queued decision committed (or refused), then the thread ended.
    pub(crate) fn close(&self) {
        lock(&self.shared.queue).closed = true;
        self.shared.queued.notify_all();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.close();
    }
}

/// The committer: every decision queued so far in one transaction, then the next.
fn committer(s: &Shared, rt: &Rt) {
    let mut conn: Option<GroupConn> = None;
    loop {
        let batch = {
            let mut q = lock(&s.queue);
            while q.items.is_empty() && !q.closed {
                q = s.queued.wait(q).unwrap_or_else(|e| e.into_inner());
            }
            if q.items.is_empty() {
                return;
            }
            q.in_flight = true;
            let n = q.items.len().min(MOST);
            q.items.drain(..n).collect::<Vec<Item>>()
        };
        let (batch, r) = committed(s, rt, &mut conn, batch);
        answer(s, batch, r);
        lock(&s.queue).in_flight = false;
        s.emptied.notify_all();
    }
}

/// `batch` committed in one transaction; where a decision's run was taken back, that
/// decision and every later one on its runs refused ([`taken::refuse`]) and the others
/// committed again. What is left of the batch, and how its commit ended.
fn committed(
    s: &Shared,
    rt: &Rt,
    conn: &mut Option<GroupConn>,
    mut batch: Vec<Item>,
) -> (Vec<Item>, Result<Vec<u64>, Failed>) {
    loop {
        match s.link.commit(rt, conn, &batch) {
            Err(Failed {
                taken_back: Some(at),
                ..
            }) => batch = taken::refuse(s, batch, at),
            r => return (batch, r),
        }
        if batch.is_empty() {
            return (batch, Ok(Vec::new()));
        }
    }
}

/// Each decision of a commit answered in order; after a failure, every decision queued
/// behind it too, and all their runs' copies let go (and the breaker views' outcomes of
/// those rolled back for certain taken out) before a new decision may begin.
fn answer(s: &Shared, mut batch: Vec<Item>, r: Result<Vec<u64>, Failed>) {
    let Failed { certain, why, .. } = match r {
        Ok(_) if batch.is_empty() => return,
        Ok(versions) => {
            s.counts[0].fetch_add(1, Ordering::Relaxed);
            let n = u64::try_from(batch.len()).unwrap_or(u64::MAX);
            s.counts[1].fetch_add(n, Ordering::Relaxed);
            for (item, version) in batch.into_iter().zip(versions) {
                (item.then)(Outcome::Committed(version));
            }
            return;
        }
        Err(e) => e,
    };
    let behind = {
        let mut q = lock(&s.queue);
        let mut behind: Vec<Item> = q.items.drain(..).collect();
        let mut homes = lock(&s.homes);
        for item in batch.iter().chain(&behind) {
            for h in &item.homes {
                homes.remove(&h.run);
            }
        }
        drop(homes);
        let undone = if certain { &mut batch[..] } else { &mut [] };
        for item in undone.iter_mut().chain(&mut behind) {
            std::mem::replace(&mut item.undo, Box::new(|| ()))();
        }
        q.generation += 1;
        behind
    };
    let n = u64::try_from(batch.len() + behind.len()).unwrap_or(u64::MAX);
    s.counts[2].fetch_add(n, Ordering::Relaxed);
    if !certain {
        let n = u64::try_from(batch.len()).unwrap_or(u64::MAX);
        s.counts[GROUP_UNSURE].fetch_add(n, Ordering::Relaxed);
    }
    let failed = format!(
        "PostgreSQL at {} failed to commit a group of decisions: {why}",
        s.link.target
    );
    let refusal = || {
        GateError::Unavailable(format!(
            "{failed}; nothing of this decision was recorded (retry)"
        ))
    };
    for item in batch {
        let o = if certain {
            Outcome::RolledBack(refusal())
        } else {
            Outcome::Unsure(crate::txn::unsure(&failed))
        };
        (item.then)(o);
    }
    for item in behind {
        (item.then)(Outcome::RolledBack(refusal()));
    }
}

struct GroupConn {
    client: Client,
    task: tokio::task::JoinHandle<()>,
    home_write: Statement,
    next_version: Statement,
}

impl Link {
    fn bounded<T>(
        &self,
        rt: &Rt,
        fut: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, String> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        rt.bounded(self.timeout, fut)
    }

    fn connect(&self, rt: &Rt) -> Result<GroupConn, String> {
        let (client, connection) = self.bounded(rt, self.config.connect(NoTls))?;
        let task = rt.spawn(async move {
            let _ = connection.await;
        });
        // A row lock waited for half the bound at most (as the central connection's):
        // one such wait ends in an error, a certain rollback, not in the client's bound
        // (two in one batch may reach the bound: an unknown outcome).
        let ms = self.timeout.as_millis().max(1);
        let setup = format!(
            "SET statement_timeout = {ms}; SET lock_timeout = {}; SET idle_in_transaction_session_timeout = {}",
            (ms / 2).max(1),
            ms * 5
        );
        let ready = self
            .bounded(rt, client.batch_execute(&setup))
            .and_then(|()| self.bounded(rt, client.prepare(super::HOME_WRITE)))
            .and_then(|w| {
                let next = "SELECT nextval('tally_state_version')";
                Ok((w, self.bounded(rt, client.prepare(next))?))
            });
        match ready {
            Ok((home_write, next_version)) => Ok(GroupConn {
                client,
                task,
                home_write,
                next_version,
            }),
            Err(e) => {
                drop(client);
                task.abort();
                Err(e)
            }
        }
    }

    /// The committer's connection, made again if it was lost or dropped.
    fn ready<'c>(&self, rt: &Rt, conn: &'c mut Option<GroupConn>) -> Result<&'c GroupConn, String> {
        if conn.as_ref().is_some_and(|c| c.client.is_closed()) {
            if let Some(c) = conn.take() {
                c.task.abort();
            }
        }
        if conn.is_none() {
            *conn = Some(self.connect(rt)?);
        }
        conn.as_ref().ok_or_else(|| "no connection".to_owned())
    }

    /// One transaction of `batch` in one round trip: per decision its runs' writes
    /// (each locks its row), then its state version; then `COMMIT`. The versions, in
    /// order; or why not: whether it rolled back for certain (the server answered a
    /// statement with an error or refused the `COMMIT` ([`commit_refused`]), or nothing
    /// was sent), and which decision's guarded write was refused first, if that is why.
    fn commit(
        &self,
        rt: &Rt,
        conn: &mut Option<GroupConn>,
        batch: &[Item],
    ) -> Result<Vec<u64>, Failed> {
        let failed = |certain: bool, why: String| Failed {
            certain,
            why,
            taken_back: None,
        };
        let c = self.ready(rt, conn).map_err(|why| failed(true, why))?;
        let client = &c.client;
        let (rolled_back, taken) = (std::cell::Cell::new(false), std::cell::Cell::new(None));
        let r = self.bounded(rt, async {
            // Sent in order on their first polls: each decision's writes, then its version.
            let each = futures::future::join_all(batch.iter().map(|i| async move {
                let written = write_homes(client, &c.home_write, &i.homes);
                let (written, version) =
                    tokio::join!(written, client.query_one(&c.next_version, &[]));
                (written, version)
            }));
            let (began, each, committed) = tokio::join!(
                client.batch_execute("BEGIN"),
                each,
                client.batch_execute("COMMIT")
            );
            // A request that failed before any answer came (the connection found closed
            // when the batch was sent, as the first batch after a server restart is) is
            // not a certain rollback: nothing here proves no byte of the batch reached a
            // server that ran it, so the group counts as unknown (docs/FLEET.md).
            rolled_back.set(certain(&began, &each, &committed));
            // A `COMMIT` after a refused statement is answered (as a rollback): the
            // connection is clean.
            if began.is_ok() && committed.is_ok() {
                taken.set(first_refused_guard(&each));
            }
            began?;
            let mut versions = Vec::with_capacity(each.len());
            for (written, version) in each {
                for w in written {
                    w?;
                }
                versions.push(version?.get::<_, i64>(0));
            }
            committed?;
            Ok(versions)
        });
        let versions = r.map_err(|why| {
            let taken_back = taken.get().filter(|_| rolled_back.get());
            if taken_back.is_none() {
                if let Some(c) = conn.take() {
                    c.task.abort();
                }
            }
            Failed {
                certain: rolled_back.get(),
                why,
                taken_back,
            }
        })?;
        // Committed, but a negative version numbers no record: refused as an unknown
        // outcome (what the decisions took stays counted), as a central decision's, and
        // the connection dropped, as after any unknown outcome.
        let versions: Result<Vec<u64>, _> = versions.into_iter().map(u64::try_from).collect();
        versions.map_err(|_| {
            if let Some(c) = conn.take() {
                c.task.abort();
            }
            failed(false, "the state version is negative".into())
        })
    }
}

/// Whether the server answered a statement of the group's round trip with an error,
/// or refused its `COMMIT` ([`commit_refused`]): it rolled back for certain.
fn certain(
    began: &Result<(), tokio_postgres::Error>,
    each: &Each,
    committed: &Result<(), tokio_postgres::Error>,
) -> bool {
    let server = |e: &tokio_postgres::Error| e.as_db_error().is_some();
    began.as_ref().is_err_and(server)
        || each.iter().any(|(w, v)| {
            w.iter().any(|w| w.as_ref().is_err_and(server)) || v.as_ref().is_err_and(server)
        })
        || committed.as_ref().is_err_and(commit_refused)
}

/// Written and numbered per decision, as the group's round trip answered them.
type Each = [(
    Vec<Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>>,
    Result<tokio_postgres::Row, tokio_postgres::Error>,
)];

/// The decision whose statement the server refused first, if that refusal is a run's
/// guarded write finding the run no longer at home here (`tally_home_write`'s
/// `serialization_failure`: every statement after it was refused as in a failed
/// transaction, none of them ran).
fn first_refused_guard(each: &Each) -> Option<usize> {
    let first = each
        .iter()
        .enumerate()
        .find_map(|(i, (written, version))| {
            let refused = written.iter().find_map(|w| w.as_ref().err());
            refused.or(version.as_ref().err()).map(|e| (i, e))
        })?;
    let guard = first.1.code() == Some(&tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE);
    guard.then_some(first.0)
}
