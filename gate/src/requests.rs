//! The approval requests the gate recorded (docs/APPROVALS.md): each `require_approval`
//! deny, kept in memory once it is durable, with its answer, and listed for the
//! operator with its state as the run stands now.
//!
//! The record is the request: what is listed is read from it. The book is filled from
//! the records the gate commits and, when the gate opens, from those of the ledger's
//! current key epoch (the ones the writer can still read back).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tally_ledger::decision::Request;
use tally_ledger::{Decision, Kind, Ledger, Reason};
use tally_policy::{Now, RunState};
use tally_wire::{ApprovalRequest, RequestState};

use crate::backend::{StateBackend, StateTxn};
use crate::commit::AfterDurable;
use crate::work::Work;
use crate::Approval;
use crate::{Gate, GateError};

/// The most requests the book keeps; when full, the uid holding the most gives way, its
/// answered and moot ones first, then its oldest.
pub const MAX_REQUESTS: usize = 4096;

/// The most requests the book keeps of one run: a run that asks more pushes out its own
/// oldest, never another run's.
pub const MAX_REQUESTS_PER_RUN: usize = 64;

/// An answer to a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Answer {
    /// Approved or denied.
    pub state: RequestState,
    /// The approver.
    pub by: String,
    /// The approver's note.
    pub note: Option<String>,
}

/// The request `record` answers, and how: the one place a record is read as an answer.
pub(crate) fn answer_of(record: &Decision) -> Option<(&str, Answer)> {
    let id = record.answers.as_deref()?;
    let state = match (record.kind, record.reason) {
        (Some(Kind::Override), None) => RequestState::Approved,
        (Some(Kind::Override), Some(Reason::DeniedByApprover)) => RequestState::Denied,
        _ => return None,
    };
    let answer = Answer {
        state,
        by: record.approver.clone().unwrap_or_default(),
        note: record.note.clone(),
    };
    Some((id, answer))
}

/// One request: its deny record, its seq, and its answer if it has one.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub record: Decision,
    pub request: Request,
    pub seq: u64,
    pub answer: Option<Answer>,
    /// Whether its call was asked again (a newer request of the same run, tool,
    /// operation and arguments) before it was answered.
    pub asked_again: bool,
    /// Whether an answer to it was decided and is being made durable: a second answer
    /// is refused from then on, before the first is in the book.
    pub claimed: bool,
    /// The seq of its answer, once answered.
    pub answered_seq: Option<u64>,
}

impl Entry {
    /// Whether `other` asks for the same call: same run, tool, operation, arguments.
    fn same_call(&self, other: &Decision) -> bool {
        let d = &self.record;
        (&d.run, &d.tool, &d.operation, &d.args_digest)
            == (
                &other.run,
                &other.tool,
                &other.operation,
                &other.args_digest,
            )
    }

    /// Whether it may still be answered, as far as the book knows.
    fn open(&self) -> bool {
        self.answer.is_none() && !self.asked_again
    }

    /// Whether this entry holds the answer to `asked`'s call: it is of the same call and
    /// is being answered, or was answered after `asked` was asked.
    fn answers_call_of(&self, asked: &Entry) -> bool {
        self.same_call(&asked.record)
            && ((self.claimed && self.answer.is_none())
                || self.answered_seq.is_some_and(|seq| seq > asked.seq))
    }
}

/// The requests, by id.
#[derive(Default)]
pub(crate) struct Book {
    entries: Mutex<BTreeMap<String, Entry>>,
}

impl Book {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keep what `record` (recorded at `seq`) is to the book: a request, or the answer
    /// to one it holds. Anything else is not the book's.
    pub fn note(&self, record: &Decision, seq: u64) {
        if record.request.is_some() {
            self.add(record.clone(), seq);
        } else if let Some((id, answer)) = answer_of(record) {
            self.answer(id, answer, seq);
        }
    }

    /// What keeps `record` in the book once it is durable (its receipt is the first).
    pub fn noting(self: &Arc<Book>, record: Decision) -> AfterDurable {
        let book = Arc::clone(self);
        Box::new(move |receipts: &[tally_ledger::Receipt]| {
            if let Some(r) = receipts.first() {
                book.note(&record, r.seq);
            }
        })
    }

    /// Fill the book from the decisions of `ledger`'s current key epoch, in order: the
    /// requests among them, the newest [`MAX_REQUESTS`] kept, with their answers. Reads
    /// at most that one epoch, one record at a time. A decision of the epoch that does
    /// not open with the writer's own key means the log was altered or damaged: the
    /// gate does not decide on what is left of it (fail closed).
    pub fn recall(&self, ledger: &Ledger) -> Result<tally_ledger::EpochRead, GateError> {
        let read = ledger.read_epoch(|seq, d| self.note(&d, seq))?;
        if read.unreadable > 0 {
            return Err(GateError::Unavailable(format!(
                "{} decision record(s) of the ledger's current key epoch (from seq {}) do not open with the writer's own key: the log was altered or damaged, and the approval requests it holds cannot be read back. Run `tally verify` on the ledger to find them",
                read.unreadable, read.from_seq
            )));
        }
        Ok(read)
    }

    /// Keep the request `record` is (recorded at `seq`). The same request asked again
    /// keeps its first record; an unanswered request of the same call is asked again.
    fn add(&self, record: Decision, seq: u64) {
        let Some(request) = record.request.as_deref().cloned() else {
            return;
        };
        let id = request.id.clone();
        let mut entries = self.lock();
        if entries.contains_key(&id) {
            return;
        }
        for e in entries.values_mut() {
            if e.answer.is_none() && e.same_call(&record) {
                e.asked_again = true;
            }
        }
        make_room(
            &mut entries,
            |e| e.record.run == record.run,
            MAX_REQUESTS_PER_RUN,
        );
        make_room_fairly(&mut entries);
        entries.insert(
            id,
            Entry {
                record,
                request,
                seq,
                answer: None,
                asked_again: false,
                claimed: false,
                answered_seq: None,
            },
        );
    }

    /// The request `id`, if the book holds it.
    pub fn get(&self, id: &str) -> Option<Entry> {
        self.lock().get(id).cloned()
    }

    /// Record the answer to `id`. Another unanswered request of the same call is moot
    /// from then on: that call has its answer.
    fn answer(&self, id: &str, answer: Answer, seq: u64) {
        let mut entries = self.lock();
        let Some(e) = entries.get_mut(id) else {
            return;
        };
        e.answer = Some(answer);
        e.answered_seq = Some(seq);
        let record = e.record.clone();
        for e in entries.values_mut() {
            if e.answer.is_none() && e.same_call(&record) {
                e.asked_again = true;
            }
        }
    }

    /// Claim request `id` for an answer being made durable: false if it is answered or
    /// claimed already (or the book no longer holds it).
    fn claim(&self, id: &str) -> bool {
        let mut entries = self.lock();
        let Some(asked) = entries.get(id) else {
            return false;
        };
        if entries.values().any(|o| o.answers_call_of(asked)) {
            return false;
        }
        if let Some(e) = entries.get_mut(id) {
            e.claimed = true;
        }
        true
    }

    /// Whether request `id`'s call has its answer already, or one being made durable
    /// (through it or through another request of the same call asked before).
    fn call_answered(&self, id: &str) -> bool {
        let entries = self.lock();
        entries
            .get(id)
            .is_some_and(|asked| entries.values().any(|o| o.answers_call_of(asked)))
    }

    /// Every request the book holds.
    pub fn all(&self) -> Vec<Entry> {
        self.lock().values().cloned().collect()
    }
}

/// Room for one more among the entries `mine` picks, when there are `most` of them
/// already: the first to go is an answered or moot one, then the oldest.
fn make_room(entries: &mut BTreeMap<String, Entry>, mine: impl Fn(&Entry) -> bool, most: usize) {
    if entries.values().filter(|e| mine(e)).count() < most {
        return;
    }
    let first = entries
        .iter()
        .filter(|(_, e)| mine(e))
        .min_by_key(|(_, e)| (e.open(), e.seq))
        .map(|(k, _)| k.clone());
    if let Some(k) = first {
        entries.remove(&k);
    }
}

/// Room for one more when the book holds [`MAX_REQUESTS`]: taken from the uid that
/// holds the most (an agent that floods the book over many runs pushes out its own).
fn make_room_fairly(entries: &mut BTreeMap<String, Entry>) {
    if entries.len() < MAX_REQUESTS {
        return;
    }
    let mut held: BTreeMap<Option<u32>, usize> = BTreeMap::new();
    for e in entries.values() {
        *held.entry(e.record.uid).or_default() += 1;
    }
    if let Some((&uid, _)) = held.iter().max_by_key(|(_, n)| **n) {
        make_room(entries, |e| e.record.uid == uid, 0);
    }
}

/// Where a request stands now: answered, or moot once its call was asked again or its
/// run stopped (or the gate no longer holds it), or expired past the run's deadline, else
/// pending.
pub(crate) fn state_of(entry: &Entry, run: Option<(&RunState, Now)>) -> RequestState {
    if let Some(a) = &entry.answer {
        return a.state;
    }
    if entry.asked_again {
        return RequestState::Moot;
    }
    match run {
        None => RequestState::Moot,
        Some((r, _)) if r.stop.is_some() => RequestState::Moot,
        Some((r, now)) if tally_policy::past_deadline(&r.budget, now.at_ms.unwrap_or(0)) => {
            RequestState::Expired
        }
        Some(_) => RequestState::Pending,
    }
}

/// The request as the operator socket lists it.
pub(crate) fn listed(entry: &Entry, run: Option<(&RunState, Now)>) -> ApprovalRequest {
    let d = &entry.record;
    let state = state_of(entry, run);
    let request = entry.request.clone();
    let expires_in_ms = match (state, run) {
        (RequestState::Pending, Some((r, now))) => {
            tally_policy::deadline_left(&r.budget, now.at_ms.unwrap_or(0))
        }
        _ => None,
    };
    ApprovalRequest {
        id: request.id,
        state,
        run: d.run.clone(),
        seq: entry.seq,
        at_ms: d.at_ms.unwrap_or(0),
        tool: d.tool.clone().unwrap_or_default(),
        operation: d.operation.clone(),
        effect: d.effect,
        target: d.target.clone(),
        args_digest: d.args_digest.clone(),
        args_preview: d.args_preview.clone(),
        reason: d.reason.unwrap_or(tally_ledger::Reason::ApprovalRequired),
        cause: request.cause,
        cost: request.cost,
        limits: d.limits.clone().unwrap_or_default(),
        calls: request.calls,
        left_ms: request.left_ms,
        expires_in_ms,
        uid: d.uid,
        worker: d.worker.clone(),
        credential: d.credential.clone(),
        answered_by: entry.answer.as_ref().map(|a| a.by.clone()),
        note: entry.answer.as_ref().and_then(|a| a.note.clone()),
    }
}

/// The listing's order: pending first, nearest deadline first; then the rest, newest
/// first.
pub(crate) fn order(list: &mut [ApprovalRequest]) {
    list.sort_by_key(|r| {
        let pending = r.state == RequestState::Pending;
        (
            !pending,
            r.expires_in_ms.unwrap_or(u64::MAX),
            std::cmp::Reverse(r.seq),
        )
    });
}

impl<B: StateBackend> Gate<B> {
    /// Every approval request the gate holds, with its state as its run stands now:
    /// pending first, nearest deadline first, then the answered, expired and moot ones,
    /// newest first (docs/APPROVALS.md). Read only.
    pub fn approval_requests(&self) -> Result<Vec<ApprovalRequest>, GateError> {
        let entries = self.requests.all();
        let mut t = self.begin()?;
        let mut list = Vec::with_capacity(entries.len());
        for e in &entries {
            list.push(self.request_in(&mut t, e));
        }
        order(&mut list);
        Ok(list)
    }

    /// The approval request `id`, as [`Gate::approval_requests`] lists it.
    pub fn approval_request(&self, id: &str) -> Result<ApprovalRequest, GateError> {
        let entry = self
            .requests
            .get(id)
            .ok_or_else(|| GateError::RequestNotFound(id.to_owned()))?;
        let mut t = self.begin()?;
        Ok(self.request_in(&mut t, &entry))
    }

    /// One request as its run stands in `t` (a run the gate no longer holds: moot).
    fn request_in<T: StateTxn>(&self, t: &mut Work<T>, e: &Entry) -> ApprovalRequest {
        let run = t.run(&e.record.run).ok().cloned();
        listed(e, run.as_ref().map(|r| (r, self.clock(r))))
    }
}

impl<B: StateBackend> Gate<B> {
    /// Refused unless approval `a` may answer request `id` of run `state` at `now`: a
    /// request the gate holds, of that run, pending, and `a` granting exactly its cost.
    pub(crate) fn answerable(
        &self,
        id: &str,
        a: &Approval,
        state: &RunState,
        now: Now,
    ) -> Result<(), GateError> {
        let entry = self.pending_request(id, &a.run, state, now)?;
        if a.scope != entry.request.cost {
            return Err(GateError::ApprovalRefused(format!(
                "the scope is not request `{id}`'s cost: `tally approve {id}` signs exactly that"
            )));
        }
        Ok(())
    }

    /// The request `id`, refused unless the gate holds it, it is run `run`'s (whose state
    /// is `state`), and it is pending at `now`.
    pub(crate) fn pending_request(
        &self,
        id: &str,
        run: &str,
        state: &RunState,
        now: Now,
    ) -> Result<Entry, GateError> {
        let entry = self
            .requests
            .get(id)
            .ok_or_else(|| GateError::RequestNotFound(id.to_owned()))?;
        if entry.record.run != run {
            return Err(GateError::ApprovalRefused(format!(
                "request `{id}` is another run's; sign the request of the run it names"
            )));
        }
        // A request whose call was asked again may still be answered (the newer request
        // asks the same): an agent that asks and asks cannot outrun the human. Once one
        // of them is answered, or being answered, the call takes no other answer.
        let answerable = Entry {
            asked_again: false,
            ..entry.clone()
        };
        match state_of(&answerable, Some((state, now))) {
            RequestState::Pending if self.requests.call_answered(id) => {
                Err(GateError::ApprovalRefused(format!(
                    "request `{id}`'s call is answered already (through it or a request \
                     of the same call): it takes no other answer"
                )))
            }
            RequestState::Pending => Ok(entry),
            RequestState::Expired => Err(GateError::RequestExpired(id.to_owned())),
            other => Err(GateError::ApprovalRefused(format!(
                "request `{id}` is {}: it takes no other answer",
                other.as_str()
            ))),
        }
    }

    /// Claim request `id` for the answer this step records (after every check, before
    /// the state changes): refused if another answer got there first.
    pub(crate) fn claim_request(&self, id: &str) -> Result<(), GateError> {
        if self.requests.claim(id) {
            Ok(())
        } else {
            Err(GateError::ApprovalRefused(format!(
                "request `{id}` was answered meanwhile: it takes no other answer"
            )))
        }
    }

    /// What keeps `record` (a request, or an answer) in the book once it is durable.
    pub(crate) fn noting(&self, record: &Decision) -> AfterDurable {
        self.requests.noting(record.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_ledger::decision::Scope;

    /// A request of `run` for the call with argument digest `n`.
    fn asked(run: &str, n: u64) -> Decision {
        Decision {
            run: run.into(),
            kind: Some(Kind::Deny),
            tool: Some("email.send".into()),
            args_digest: Some(format!("{n:064x}")),
            request: Some(Box::new(Request {
                id: format!("{run}-{n}"),
                cause: Reason::ApprovalRequired,
                cost: Scope::default(),
                calls: n,
                left_ms: None,
            })),
            ..Decision::default()
        }
    }

    /// A run that asks and asks pushes out its own oldest requests: another run's
    /// pending request stays answerable.
    #[test]
    fn a_flooding_run_evicts_only_its_own_requests() {
        let book = Book::default();
        book.note(&asked("victim", 0), 1);
        for n in 0..(MAX_REQUESTS_PER_RUN as u64 + 50) {
            book.note(&asked("flood", n), 2 + n);
        }
        assert!(
            book.get("victim-0").is_some(),
            "another run's request stays"
        );
        let flood = book
            .all()
            .iter()
            .filter(|e| e.record.run == "flood")
            .count();
        assert_eq!(flood, MAX_REQUESTS_PER_RUN);
        assert!(
            book.get("flood-0").is_none(),
            "the flood's oldest went first"
        );
        assert!(book.get("flood-113").is_some(), "its newest is kept");
    }

    /// An approval of one request of a call and a denial of another request of the same
    /// call, decided at once: the second claim is refused. A request of that call asked
    /// after the answer is a new question.
    #[test]
    fn a_call_takes_one_answer_whichever_request_it_comes_through() {
        let book = Book::default();
        let same = |seq: u64| {
            let mut d = asked("r", 7);
            if let Some(r) = d.request.as_mut() {
                r.id = format!("r-7-{seq}");
            }
            (d, seq)
        };
        for (d, seq) in [same(1), same(2)] {
            book.note(&d, seq);
        }
        assert!(book.claim("r-7-1"), "the first answer claims the call");
        assert!(
            !book.claim("r-7-2"),
            "a second, through another request, is refused"
        );
        assert!(book.call_answered("r-7-2"));
        let approved = Answer {
            state: RequestState::Approved,
            by: "dana".into(),
            note: None,
        };
        book.answer("r-7-1", approved, 3);
        assert!(!book.claim("r-7-1") && !book.claim("r-7-2"));
        let (later, seq) = same(4);
        book.note(&later, seq);
        assert!(
            !book.call_answered("r-7-4"),
            "asked after the answer: a new question"
        );
        assert!(book.claim("r-7-4"));
    }

    /// An agent flooding the book over many runs pushes out its own requests, never
    /// another uid's.
    #[test]
    fn a_uid_flooding_over_many_runs_evicts_only_its_own() {
        let book = Book::default();
        let mut victim = asked("victim", 0);
        victim.uid = Some(7);
        book.note(&victim, 1);
        let mut seq = 2;
        for run in 0..(MAX_REQUESTS / MAX_REQUESTS_PER_RUN + 2) {
            for n in 0..MAX_REQUESTS_PER_RUN as u64 {
                let mut d = asked(&format!("flood{run}"), n);
                d.uid = Some(1000);
                book.note(&d, seq);
                seq += 1;
            }
        }
        assert_eq!(book.all().len(), MAX_REQUESTS);
        assert!(
            book.get("victim-0").is_some(),
            "another uid's request stays"
        );
    }
}
