//! The commit pipeline: appends queue, the *commit* stage takes them as one group and
//! writes it (through the [`Writer`](super::writer::Writer)), the *sync* stage makes what
//! was written durable and only then acknowledges it.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::clock::Clock;
use crate::error::Error;
use crate::format::Checkpoint;
use crate::segment::{LogWriter, MAX_STATE_LEN};
use crate::store::Store;
use crate::tlog::merkle::TreeHash;

use super::group::{Applied, Pending, Reply};
use super::linger::lingering;
use super::writer::{state_bound, Writer, STATE_CHECK_LEN};

/// Most decisions a commit group gathers from the queue, so one group's latency and memory
/// stay bounded. A single larger append is still one group (it is atomic).
pub(super) const MAX_GROUP: usize = 16_384;

/// The commit pipeline's shared state.
pub(super) struct Queue {
    /// Decisions waiting for the next group.
    pub(super) pending: Vec<Pending>,
    /// How many of `pending` are not deferred: any of them starts a group.
    pub(super) eager: usize,
    /// Groups written, waiting for the next fsync.
    pub(super) applied: Vec<Applied>,
    /// Someone holds the commit role (encrypting and writing a group).
    pub(super) committing: bool,
    /// Someone holds the sync role (flushing and fsyncing).
    pub(super) syncing: bool,
    /// The syncer is taking what it will sync; the next group starts once it has.
    pub(super) flushing: bool,
    /// The committer thread is asleep, waiting for work (so it is woken only when it has
    /// some: a condvar notify is a system call).
    pub(super) commit_idle: bool,
    /// The committer thread's sleep is timed: only young deferred appends are queued,
    /// and it looks again once the oldest one's linger is up.
    pub(super) commit_lingering: bool,
    /// The syncer thread is asleep, waiting for work.
    pub(super) sync_idle: bool,
    /// The latest checkpoint whose group is durable and acknowledged.
    pub(super) durable: Checkpoint,
    /// The Merkle tree's root at the durable checkpoint's size.
    pub(super) durable_root: TreeHash,
    /// Set once a write or fsync failed: every group not yet written is refused, and so
    /// is every later append.
    pub(super) poisoned: Option<String>,
    /// Set once an fsync failed or a pipeline thread panicked: whether the groups written
    /// are durable is then unknown, so those not yet acknowledged are refused too. A
    /// failed write of the log or the index leaves this unset: each group written whole
    /// before it is still synced and acknowledged (the log holds it, and a restart finds
    /// it there).
    pub(super) unknown: Option<String>,
    /// The ledger is being dropped: the threads finish what is queued and exit.
    pub(super) closing: bool,
}

/// What the appenders and the two pipeline threads share.
pub(super) struct Shared {
    /// The log: the record of truth.
    pub(super) log: LogWriter,
    /// The sled index: derived state and index points, never synced per group.
    pub(super) store: Store,
    pub(super) queue: Mutex<Queue>,
    /// Signalled when decisions are queued, or a written group was taken by the syncer.
    pub(super) to_commit: Condvar,
    /// Signalled when a group is written.
    pub(super) to_sync: Condvar,
    /// Signalled when a sync has answered its groups ([`super::Ledger::flush`] waits on it).
    pub(super) synced: Condvar,
    pub(super) writer: Mutex<Writer>,
    /// Told how long each flush and fsync took ([`super::Ledger::on_sync`]).
    pub(super) on_sync: std::sync::OnceLock<SyncObserver>,
    /// Times deferred appends' lingers (the writer's clock).
    pub(super) clock: Arc<dyn Clock>,
}

/// Told how long each flush and fsync of the log took.
pub type SyncObserver = Box<dyn Fn(std::time::Duration) + Send + Sync>;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in a commit stage poisons the ledger (see `RoleGuard`), so a guard recovered
    // from a panicking thread is never used to write again.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Answer every reply with a refusal: the first with the error itself, the rest with
/// the ledger's poisoned state. Call without holding the queue's lock.
pub(super) fn refuse(replies: impl Iterator<Item = Reply>, first: Error, why: &str) {
    let mut first = Some(first);
    for reply in replies {
        let e = first
            .take()
            .unwrap_or_else(|| Error::Poisoned(why.to_string()));
        reply.send(Err(e));
    }
}

/// The two roles of the commit pipeline.
#[derive(Clone, Copy)]
pub(super) enum Role {
    Commit,
    Sync,
}

impl Shared {
    /// Wake the committer thread if it sleeps and may start a group, or sleeps untimed
    /// while a deferred append waits for its linger to be timed. Call holding the queue's
    /// lock, after changing what it waits for.
    pub(super) fn wake_committer(&self, queue: &Queue) {
        if queue.commit_idle
            && !queue.committing
            && !queue.flushing
            && !queue.pending.is_empty()
            && queue.applied.is_empty()
            && (!queue.commit_lingering || self.lingering(queue).is_none())
        {
            self.to_commit.notify_one();
        }
    }

    /// How long the queued appends wait before a group may start: `None` if it may
    /// now (see [`lingering`]).
    fn lingering(&self, queue: &Queue) -> Option<std::time::Duration> {
        let oldest = queue.pending.first().and_then(|p| p.deferred_since);
        lingering(queue.eager, queue.closing, oldest, self.clock.now_ms())
    }

    /// Every deferred append queued now made due (it starts a group), then wait until
    /// nothing is queued, being written or being synced (or the ledger is poisoned).
    pub(super) fn flush(&self) -> Result<Checkpoint, Error> {
        let mut queue = lock(&self.queue);
        let mut due = 0;
        for p in &mut queue.pending {
            due += usize::from(p.deferred_since.take().is_some());
        }
        queue.eager += due;
        self.wake_committer(&queue);
        loop {
            if let Some(why) = &queue.poisoned {
                return Err(Error::Poisoned(why.clone()));
            }
            if queue.pending.is_empty()
                && queue.applied.is_empty()
                && !queue.committing
                && !queue.syncing
            {
                return Ok(queue.durable.clone());
            }
            queue = self.synced.wait(queue).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Wake the syncer thread if it sleeps and has written groups to sync.
    fn wake_syncer(&self, queue: &Queue) {
        if queue.sync_idle && !queue.syncing && !queue.applied.is_empty() {
            self.to_sync.notify_one();
        }
    }

    /// The committer thread: commits queued decisions whenever no one else does.
    pub(super) fn commit_loop(&self) {
        let mut queue = lock(&self.queue);
        loop {
            // Start a group only once the syncer has taken the one before and sled's flush
            // is over, so the next group gathers everything that arrives meanwhile; and
            // not for young deferred appends alone (they wait to ride a later one).
            let linger = if queue.committing
                || queue.flushing
                || queue.pending.is_empty()
                || !queue.applied.is_empty()
            {
                if queue.closing && queue.pending.is_empty() {
                    // The syncer exits only once no group is being committed, and may
                    // be asleep waiting for that (a last group that failed leaves it
                    // nothing to sync, so nothing else wakes it).
                    self.to_sync.notify_all();
                    return;
                }
                Some(None)
            } else {
                self.lingering(&queue).map(Some)
            };
            if let Some(timed) = linger {
                queue.commit_idle = true;
                queue.commit_lingering = timed.is_some();
                queue = match timed {
                    None => self
                        .to_commit
                        .wait(queue)
                        .unwrap_or_else(|e| e.into_inner()),
                    Some(t) => {
                        let waited = self.to_commit.wait_timeout(queue, t);
                        waited.unwrap_or_else(|e| e.into_inner()).0
                    }
                };
                queue.commit_idle = false;
                queue.commit_lingering = false;
                continue;
            }
            queue = self.commit_once(queue);
            self.wake_syncer(&queue);
        }
    }

    /// The syncer thread: syncs written groups whenever no one else does.
    pub(super) fn sync_loop(&self) {
        let mut queue = lock(&self.queue);
        loop {
            if queue.syncing || queue.applied.is_empty() {
                if queue.closing
                    && queue.applied.is_empty()
                    && queue.pending.is_empty()
                    && !queue.committing
                {
                    return;
                }
                queue.sync_idle = true;
                queue = self.to_sync.wait(queue).unwrap_or_else(|e| e.into_inner());
                queue.sync_idle = false;
                continue;
            }
            queue = self.sync_once(queue);
        }
    }

    /// Stage one, on the calling thread: encrypt, chain, sign and write everything
    /// queued as one group, and leave it for the syncer.
    pub(super) fn commit_once<'a>(
        &'a self,
        mut queue: MutexGuard<'a, Queue>,
    ) -> MutexGuard<'a, Queue> {
        queue.committing = true;
        // Whole appends, oldest first, until the group holds MAX_GROUP decisions.
        // And until its state frame could reach MAX_STATE_LEN (each append's own state
        // is within it: `submit_with_state`).
        let (mut count, mut bytes, mut taken) = (0, STATE_CHECK_LEN, 0);
        let take = queue
            .pending
            .iter()
            .take_while(|p| {
                let more = state_bound(&p.state);
                let room = taken == 0 || (count < MAX_GROUP && bytes + more <= MAX_STATE_LEN);
                count += p.plaintexts.len();
                bytes += more;
                taken += 1;
                room
            })
            .count();
        let group: Vec<Pending> = queue.pending.drain(..take).collect();
        let eager = group.iter().filter(|p| p.deferred_since.is_none()).count();
        queue.eager = queue.eager.saturating_sub(eager);
        let poisoned = queue.poisoned.clone();
        drop(queue);
        let guard = RoleGuard(self, Role::Commit);
        let outcome = match poisoned {
            Some(why) => Err((Error::Poisoned(why), group)),
            None => lock(&self.writer).apply(&self.log, &self.store, group),
        };
        // The guard stays until the refusals below are sent: a reply callback that panics
        // there must poison the ledger and wake the syncer like any panic in this role,
        // not leave it waiting for a committer that is gone.
        let mut queue = lock(&self.queue);
        queue.committing = false;
        // An fsync failed or the syncer died while this group was written: no one may
        // sync it now, so it is refused, never left waiting. (Poisoned by a failed index
        // write meanwhile, it is whole in the log and is synced like any other.)
        let outcome = match (outcome, queue.unknown.clone()) {
            (Ok(applied), Some(why)) => {
                let replies: Vec<Reply> = applied
                    .replies
                    .into_iter()
                    .map(|(reply, _)| reply)
                    .collect();
                Err((Error::Poisoned(why), replies))
            }
            (Ok(applied), None) => Ok(applied),
            (Err((e, group)), _) => Err((e, group.into_iter().map(|p| p.reply).collect())),
        };
        match outcome {
            Ok(applied) => {
                queue.applied.push(applied);
                // The index failed (this group's fold, or a durable write meanwhile): this
                // group is whole in the log and goes on to the syncer; every group after
                // it is refused before its log write.
                if let Some(why) = self.store.failed() {
                    queue.poisoned.get_or_insert(why);
                    self.synced.notify_all();
                }
            }
            Err((e, replies)) => {
                let why = queue.poisoned.get_or_insert_with(|| e.to_string()).clone();
                drop(queue);
                refuse(replies.into_iter(), e, &why);
                queue = lock(&self.queue);
                self.wake_committer(&queue);
                self.synced.notify_all();
            }
        }
        std::mem::forget(guard);
        queue
    }

    /// Stage two, on the calling thread: flush and fsync everything written so far,
    /// then acknowledge it.
    pub(super) fn sync_once<'a>(
        &'a self,
        mut queue: MutexGuard<'a, Queue>,
    ) -> MutexGuard<'a, Queue> {
        queue.syncing = true;
        queue.flushing = true;
        let groups = std::mem::take(&mut queue.applied);
        let poisoned = queue.unknown.clone();
        drop(queue);
        let guard = RoleGuard(self, Role::Sync);
        let flushed = match poisoned {
            Some(why) => Err(Error::Poisoned(why)),
            None => Ok(()),
        };
        {
            // The committer may start the next group now, while the fsync runs.
            let mut queue = lock(&self.queue);
            queue.flushing = false;
            self.wake_committer(&queue);
        }
        // A measurement for the operator (the fsync histogram), not a time any rule reads.
        let began = std::time::Instant::now();
        let synced = flushed.and_then(|()| self.log.sync());
        if let Some(tell) = self.on_sync.get() {
            tell(began.elapsed());
        }
        // The replies go out without the queue's lock (they may read the ledger), but
        // still holding the sync role, so the next sync's replies cannot overtake them.
        let mut queue = lock(&self.queue);
        match synced {
            Ok(()) => {
                if let Some(last) = groups.last() {
                    if last.checkpoint.size > queue.durable.size {
                        queue.durable = last.checkpoint.clone();
                        queue.durable_root = last.root;
                    }
                }
                drop(queue);
                for group in groups {
                    for (reply, receipts) in group.replies {
                        reply.send(Ok(receipts));
                    }
                }
            }
            Err(e) => {
                let why = queue.poisoned.get_or_insert_with(|| e.to_string()).clone();
                queue.unknown.get_or_insert_with(|| why.clone());
                drop(queue);
                let replies = groups
                    .into_iter()
                    .flat_map(|g| g.replies.into_iter().map(|(reply, _)| reply));
                refuse(replies, e, &why);
            }
        }
        std::mem::forget(guard);
        let mut queue = lock(&self.queue);
        queue.syncing = false;
        self.wake_syncer(&queue);
        self.synced.notify_all();
        queue
    }
}

/// Held while a pipeline role runs without the queue's lock; forgotten when the role
/// ends normally. If its thread panics instead, the ledger is poisoned, the role freed
/// and every queued or written group dropped, so their appenders get an error rather
/// than waiting forever, and later appends are refused.
pub(super) struct RoleGuard<'a>(&'a Shared, Role);

impl Drop for RoleGuard<'_> {
    fn drop(&mut self) {
        let mut queue = lock(&self.0.queue);
        let why = queue
            .poisoned
            .get_or_insert_with(|| "a commit thread panicked".into())
            .clone();
        queue.unknown.get_or_insert(why);
        match self.1 {
            Role::Commit => queue.committing = false,
            Role::Sync => {
                queue.syncing = false;
                queue.flushing = false;
            }
        }
        let pending = std::mem::take(&mut queue.pending);
        queue.eager = 0;
        let applied = std::mem::take(&mut queue.applied);
        drop(queue);
        // Their replies answer with an error as they drop, outside the lock.
        drop((pending, applied));
        self.0.to_commit.notify_all();
        self.0.to_sync.notify_all();
        self.0.synced.notify_all();
    }
}
