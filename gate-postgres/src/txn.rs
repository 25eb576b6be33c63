//! One decision's transaction: the PostgreSQL transaction, its round trips (each within
//! the bound), the rows it read and what it writes back.

use std::collections::BTreeMap;
use std::sync::MutexGuard;

use tally_gate::GateError;
use tally_ledger::Reason;
use tally_policy::{CredentialState, PrincipalState, RunCount, RunState, SliceUse, ToolState};
use tokio_postgres::error::{Severity, SqlState};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement};

use crate::schema::{decode, encode, Statements};
use crate::{Conn, Postgres, TurnGuard};

/// One decision's transaction: the daemon's local lock, the PostgreSQL transaction, and
/// the rows read (locked) so far.
pub struct PostgresTxn<'a> {
    pub(crate) backend: &'a Postgres,
    pub(crate) conn: MutexGuard<'a, Option<Conn>>,
    /// Given back last (fields drop in order): after the connection's own lock.
    pub(crate) _turn: TurnGuard<'a>,
    /// A PostgreSQL transaction is open (or will be, with its first statement).
    pub(crate) open: bool,
    /// Its BEGIN was sent.
    pub(crate) begun: bool,
    pub(crate) runs: BTreeMap<String, RunState>,
    /// The runs as they were read, before the decision (what it took of their leased
    /// scopes is the difference).
    pub(crate) before: BTreeMap<String, RunState>,
    pub(crate) tools: BTreeMap<String, ToolState>,
    pub(crate) credentials: BTreeMap<String, CredentialState>,
    pub(crate) principals: BTreeMap<String, PrincipalState>,
    /// The principals as they were read, before the decision (what it took of their
    /// leased scopes is the difference, [`tally_policy::principal_use`]).
    pub(crate) principals_before: BTreeMap<String, PrincipalState>,
    /// Runs decided on their copy at home (run, holder): each locked, and its home
    /// checked, with the next statement sent ([`crate::lease::HOME_GUARD`]).
    pub(crate) guards: Vec<(String, (String, i64))>,
    /// Its COMMIT went out and no answer says it rolled back: it may have committed.
    /// Any other failure rolled it back, for certain.
    pub(crate) unsure: bool,
    /// Refused because a run's guard found it no longer at home here (taken back, taken
    /// over, or its holder's epoch fenced): the leased backend counts it.
    pub(crate) taken_back: bool,
}

pub(crate) fn tool_from(row: &Row) -> Result<ToolState, GateError> {
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

    /// Refused once the transaction ended.
    fn still_open(&self) -> Result<(), GateError> {
        match self.open {
            true => Ok(()),
            false => Err(GateError::Unavailable(
                "the gate's transaction already ended".into(),
            )),
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

    pub(crate) fn rows(
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
        let guards = std::mem::take(&mut self.guards);
        let guarded = guard_homes(client, &conn.st.home_guard, &guards);
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
            let began = async {
                match begin {
                    true => client.batch_execute("BEGIN").await,
                    false => Ok(()),
                }
            };
            let (began, held, rows) = tokio::join!(began, guarded, then);
            began?;
            Ok((held?, rows?))
        });
        match r {
            Ok((held, _)) if !held => {
                self.begun = true;
                self.taken_back = true;
                Err(taken_back())
            }
            Ok((_, rows)) => {
                match commit {
                    true => self.open = false,
                    false => self.begun = true,
                }
                Ok(rows)
            }
            Err(e) => {
                self.broken();
                Err(e)
            }
        }
    }

    /// The parameters of one write statement: a run's, a tool's and a credential's rows
    /// (any of them). `None` if this transaction holds none of them.
    pub(crate) fn row(
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
    pub(crate) fn write(
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
    /// What the decision moves in its runs' lease scopes and in their principals'
    /// (the owner's uid, in decimal): per run read and changed, what it took less what
    /// it gave back ([`tally_policy::slice_use`]); per owner, what its own counts moved
    /// ([`tally_policy::principal_use`]: never its attempts down); whether that is a
    /// bill already incurred ([`tally_policy::incurred`]: applied whatever room is left),
    /// and whether the run's slices are revoked (the run paused or stopped) or allowed
    /// again (resumed). In the scopes' order (runs, then principals, each by key): the
    /// order a central spend locks them in.
    pub(crate) fn lease_steps(&self, runs: &[String]) -> Vec<LeaseStep> {
        let mut steps = Vec::new();
        let mut owners: BTreeMap<String, (SliceUse, SliceUse, bool)> = BTreeMap::new();
        for name in runs {
            let (Some(before), Some(after)) = (self.before.get(name), self.runs.get(name)) else {
                continue;
            };
            let (took, gave) = tally_policy::slice_use(RunCount::of(before), RunCount::of(after));
            let held = crate::txn::held;
            let revoked = (held(before) != held(after)).then(|| held(after));
            let bill = tally_policy::incurred(before, after);
            let delta = net(took, gave);
            let raise = tally_policy::raised_limit(before, after).map(|l| cap_params(l.each()));
            if delta != [0; 4] || revoked.is_some() || raise.is_some() {
                steps.push(LeaseStep {
                    kind: "run",
                    key: name.clone(),
                    delta,
                    revoked,
                    bill,
                    raise,
                });
            }
            if let Some(uid) = after.owner_uid {
                let o = owners.entry(uid.to_string()).or_default();
                *o = (plus(o.0, took), plus(o.1, gave), o.2 || bill);
            }
        }
        for (key, (took, gave, bill)) in owners {
            let counts = self
                .principals_before
                .get(&key)
                .zip(self.principals.get(&key));
            let (took, gave) = tally_policy::principal_use(counts, (took, gave));
            let delta = net(took, gave);
            if delta != [0; 4] {
                steps.push(LeaseStep {
                    kind: "principal",
                    key,
                    delta,
                    revoked: None,
                    bill,
                    raise: None,
                });
            }
        }
        let rank = |k: &str| u8::from(k != "run");
        steps.sort_by(|a, b| (rank(a.kind), &a.key).cmp(&(rank(b.kind), &b.key)));
        steps
    }

    /// Runs decided at home whose lock no statement has sent yet are locked first
    /// (every path locks a run before its tool and its scopes; a home moved since fails
    /// its home's write too, so the COMMIT rolls back).
    pub(crate) fn seal(
        &mut self,
        last: Option<WriteRow>,
        steps: &[LeaseStep],
        homes: &[HomeWrite],
    ) -> Result<u64, GateError> {
        self.still_open()?;
        let Some(conn) = self.conn.as_ref() else {
            return Err(self.gone());
        };
        let begin = !self.begun;
        let (client, st) = (&conn.client, &conn.st);
        let (refused, away) = (std::cell::Cell::new(false), std::cell::Cell::new(false));
        let out = std::cell::Cell::new(None);
        let guards = std::mem::take(&mut self.guards);
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
            let guarded = guard_homes(client, &st.home_guard_sealed, &guards);
            let mut began = std::pin::pin!(futures::future::maybe_done(began));
            let mut guarded = std::pin::pin!(futures::future::maybe_done(guarded));
            let mut written = std::pin::pin!(futures::future::maybe_done(written));
            let _ = futures::poll!(began.as_mut());
            let _ = futures::poll!(guarded.as_mut());
            let _ = futures::poll!(written.as_mut());
            if let Some(Err(_)) = written.as_mut().output_mut() {
                if let Some(Err(e)) = written.as_mut().take_output() {
                    refused.set(true);
                    return Err(e);
                }
            }
            // The runs' writes (which lock their slices' rows) before the scopes' steps:
            // a return and a reclaim lock a slice before its scope too.
            let homed = write_homes(client, &st.home_write, homes);
            let stepped = step_scopes(client, st, steps);
            let (_, _, _, homed, stepped, version, committed) = tokio::join!(
                began.as_mut(),
                guarded.as_mut(),
                written.as_mut(),
                homed,
                stepped,
                client.query_one(&st.next_version, &[]),
                client.batch_execute("COMMIT")
            );
            let write = written.as_mut().output_mut().map(|r| r.as_ref().map(drop));
            away.set(matches!(guarded.as_mut().output_mut(), Some(Err(e)) if moved(e)));
            refused.set(rolled_back(&stepped, &homed, write, &committed) || away.get());
            out.set(exhausted(&stepped, steps));
            if let Some(r) = began.as_mut().take_output() {
                r?;
            }
            if let Some(r) = guarded.as_mut().take_output() {
                r?;
            }
            if let Some(r) = written.as_mut().take_output() {
                r?;
            }
            for r in stepped.into_iter().chain(homed) {
                r?;
            }
            let version = version?;
            committed?;
            Ok(version.get::<_, i64>(0))
        });
        self.sealed_out(r, refused.get(), away.get(), out.get())
    }

    /// [`PostgresTxn::sealed`], but a scope with no room left (`out`: its budget's
    /// reason) rolled back for certain is refused with that reason (no retry would fit),
    /// not as unavailable.
    fn sealed_out(
        &mut self,
        r: Result<i64, GateError>,
        refused: bool,
        away: bool,
        out: Option<Reason>,
    ) -> Result<u64, GateError> {
        match out {
            Some(reason) if r.is_err() && refused && !away => {
                let _rolled_back = self.sealed(r, true, false);
                Err(GateError::Refused(reason))
            }
            _ => self.sealed(r, refused, away),
        }
    }

    /// Whether this transaction sent nothing yet and holds no row to write: what it
    /// decides at home may then go into a group commit (`lease::group`).
    pub(crate) fn untouched(&self) -> bool {
        self.open
            && !self.begun
            && self.runs.is_empty()
            && self.tools.is_empty()
            && self.credentials.is_empty()
            && self.principals.is_empty()
    }

    /// The last round trip's answer: its state version, or its failure (`refused`: the
    /// server answered it with an error, so it rolled back for certain; `away`: a run's
    /// guard found it no longer at home here, and every statement was answered, so the
    /// connection is clean).
    fn sealed(
        &mut self,
        r: Result<i64, GateError>,
        refused: bool,
        away: bool,
    ) -> Result<u64, GateError> {
        if away {
            self.open = false;
            self.taken_back = true;
            return Err(taken_back());
        }
        match r {
            Ok(v) => {
                self.open = false;
                u64::try_from(v).map_err(|_| {
                    self.backend
                        .unavailable("to number a decision", "the state version is negative")
                })
            }
            Err(e) => {
                self.unsure = !refused;
                self.broken();
                match (refused, e) {
                    (false, GateError::Unavailable(why)) => Err(unsure(&why)),
                    (_, e) => Err(e),
                }
            }
        }
    }
}

/// A guard's refusal in the last round trip: the run is no longer at home here
/// ([`crate::lease::HOME_GUARD_SEALED`]).
fn moved(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::DIVISION_BY_ZERO)
}

/// A decision refused after `failed`, its `COMMIT` unanswered: it may have been
/// recorded. A check retried is a new decision; an outcome retried and refused as
/// already settled (`attempt_settled`) was recorded by the first try.
pub(crate) fn unsure(failed: &str) -> GateError {
    let failed = failed
        .strip_suffix("; the gate refuses until the database answers (retry)")
        .unwrap_or(failed);
    GateError::Unavailable(format!(
        "{failed}; its COMMIT went unanswered, so this decision may have been recorded: retry (a check retried is a new decision; an outcome retried and refused as already settled was recorded by this try)"
    ))
}

/// A decision refused because a run it decided at home was taken back or over.
pub(crate) fn taken_back() -> GateError {
    GateError::Unavailable(
        "a run decided here was taken back (a pause, resume or stop through another gate) or taken over by another host since: retry".into(),
    )
}

/// The budget's reason where a scope's step refused the use for want of room even
/// with no slice out (`tally_lease_step`'s detail `exhausted`, schema 10; each step is
/// sent as its raise, then its use): a retry would be refused the same way.
fn exhausted(
    stepped: &[Result<Vec<Row>, tokio_postgres::Error>],
    steps: &[LeaseStep],
) -> Option<Reason> {
    let out = |r: &Result<Vec<Row>, tokio_postgres::Error>| {
        let db = r.as_ref().err().and_then(|e| e.as_db_error());
        db.is_some_and(|d| d.detail() == Some("exhausted"))
    };
    let at = stepped.iter().position(out)?;
    steps.get(at / 2).map(|s| out_of_room(s.kind))
}

/// The reason a use is refused when its scope has no room left, slices out elsewhere or
/// not (a retry would be refused the same way until a human grants more): a
/// principal's budget across its runs (`principal_budget_exceeded`), else the run's own
/// (`budget_exceeded`); both ask.
pub(crate) fn out_of_room(kind: &str) -> Reason {
    match kind {
        "principal" => Reason::PrincipalBudgetExceeded,
        _ => Reason::BudgetExceeded,
    }
}

/// Whether the server answered a statement of the last round trip with an error, or
/// refused its COMMIT ([`commit_refused`]): the transaction then rolled back, for
/// certain.
fn rolled_back(
    stepped: &[Result<Vec<Row>, tokio_postgres::Error>],
    homed: &[Result<Vec<Row>, tokio_postgres::Error>],
    written: Option<Result<(), &tokio_postgres::Error>>,
    committed: &Result<(), tokio_postgres::Error>,
) -> bool {
    let server = |e: &tokio_postgres::Error| e.as_db_error().is_some();
    stepped
        .iter()
        .chain(homed)
        .any(|r| r.as_ref().is_err_and(server))
        || committed.as_ref().is_err_and(commit_refused)
        || written.is_some_and(|r| r.is_err_and(server))
}

/// Whether an error answering a `COMMIT` says it rolled back for certain
/// ([`commit_refused_as`]).
pub(crate) fn commit_refused(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|d| commit_refused_as(d.parsed_severity(), d.code()))
}

/// A `COMMIT` answered at ERROR severity (the session goes on, the transaction was
/// aborted) rolled back for certain, unless its class is a connection exception (08)
/// or an operator intervention (57: an administrator's or the server's shutdown, a
/// cancel), and `statement_completion_unknown` (40003): those, and a FATAL or PANIC
/// (the session ended), may come after the commit was made durable, so its outcome is
/// unknown.
pub(crate) fn commit_refused_as(severity: Option<Severity>, code: &SqlState) -> bool {
    let class = code.code().get(..2).unwrap_or("");
    matches!(severity, Some(Severity::Error))
        && class != "08"
        && class != "57"
        && *code != SqlState::T_R_STATEMENT_COMPLETION_UNKNOWN
}

/// Whether a run is held (paused or stopped): a change of it revokes or allows its
/// scope's slices. The one definition, for the central and the leased decisions.
pub(crate) fn held(run: &RunState) -> bool {
    run.paused || run.stop.is_some()
}

/// Two uses together.
fn plus(a: SliceUse, b: SliceUse) -> SliceUse {
    let (a, b) = (a.each(), b.each());
    let [attempts, nanos, side_effects, polls] = [0, 1, 2, 3].map(|i| a[i].saturating_add(b[i]));
    SliceUse {
        attempts,
        nanos,
        side_effects,
        polls,
    }
}

/// What was taken less what was given back, per dimension, as the database counts it.
fn net(took: SliceUse, gave: SliceUse) -> [i64; 4] {
    let (t, g) = (took.each(), gave.each());
    [0, 1, 2, 3]
        .map(|i| i64::try_from(t[i]).unwrap_or(i64::MAX) - i64::try_from(g[i]).unwrap_or(i64::MAX))
}

/// A run's limit as the scope's cap parameters (`None`: not capped, or past a bigint).
pub(crate) fn cap_params(limit: [Option<u64>; 4]) -> [Option<i64>; 4] {
    limit.map(|c| c.and_then(|n| i64::try_from(n).ok()))
}

/// Each lease scope moved in step (sent in order on the first poll): its cap raised
/// first where the decision raised its run's limit, then the use: a use that does not
/// fit beside the slices out fails the transaction (its COMMIT only rolls back); a bill
/// is applied whatever room is left.
async fn step_scopes(
    client: &tokio_postgres::Client,
    st: &crate::schema::Statements,
    steps: &[LeaseStep],
) -> Vec<Result<Vec<Row>, tokio_postgres::Error>> {
    let sent = steps.iter().flat_map(|s| {
        let raise = s.raise.map(|c| (s, c));
        [
            futures::future::Either::Left(async move {
                match raise {
                    Some((s, c)) => {
                        let p: [&(dyn ToSql + Sync); 6] =
                            [&s.kind, &s.key, &c[0], &c[1], &c[2], &c[3]];
                        client.query(&st.lease_raise, &p).await
                    }
                    None => Ok(Vec::new()),
                }
            }),
            futures::future::Either::Right(async move {
                let d = &s.delta;
                let p: [&(dyn ToSql + Sync); 8] = [
                    &s.kind, &s.key, &d[0], &d[1], &d[2], &d[3], &s.revoked, &s.bill,
                ];
                client.query(&st.lease_step, &p).await
            }),
        ]
    });
    futures::future::join_all(sent).await
}

/// Each run decided on its copy at home locked, if still at home here (sent in order on
/// the first poll): whether every one was.
async fn guard_homes(
    client: &tokio_postgres::Client,
    statement: &Statement,
    guards: &[(String, (String, i64))],
) -> Result<bool, tokio_postgres::Error> {
    let rows = futures::future::join_all(guards.iter().map(|(run, (me, epoch))| async move {
        let p: [&(dyn ToSql + Sync); 3] = [run, me, epoch];
        client.query(statement, &p).await
    }))
    .await;
    let mut held = true;
    for r in rows {
        held &= !r?.is_empty();
    }
    Ok(held)
}

/// Each run at home written through, guarded (sent in order on the first poll): a
/// guard that fails fails the transaction (its COMMIT only rolls back).
pub(crate) async fn write_homes(
    client: &tokio_postgres::Client,
    statement: &Statement,
    homes: &[HomeWrite],
) -> Vec<Result<Vec<Row>, tokio_postgres::Error>> {
    futures::future::join_all(homes.iter().map(|h| async move {
        let (home, epoch) = (h.home.as_ref().map(|h| &h.0), h.home.as_ref().map(|h| h.1));
        let (was, was_epoch) = (
            h.expected.as_ref().map(|h| &h.0),
            h.expected.as_ref().map(|h| h.1),
        );
        let (me, me_epoch) = (&h.slices.holder.0, h.slices.holder.1);
        let (took_on, took) = (
            h.slices.took.map(|t| t.0),
            h.slices.took.map(|t| t.1.to_vec()),
        );
        let (gave_on, gave) = (
            h.slices.gave.map(|t| t.0),
            h.slices.gave.map(|t| t.1.to_vec()),
        );
        let p: [&(dyn ToSql + Sync); 14] = [
            &h.run,
            &h.state,
            &h.open,
            &home,
            &epoch,
            &was,
            &was_epoch,
            me,
            &me_epoch,
            &took_on,
            &took,
            &gave_on,
            &gave,
            &h.slices.at,
        ];
        client.query(statement, &p).await
    }))
    .await
}

/// A run's state written by the holder it is at home on ([`crate::lease::HOME_WRITE`]).
#[derive(Clone, Debug)]
pub(crate) struct HomeWrite {
    pub(crate) run: String,
    pub(crate) state: Vec<u8>,
    pub(crate) open: bool,
    /// Its home after the decision, holder and epoch (NULL once stopped).
    pub(crate) home: Option<(String, i64)>,
    /// The home the copy was read under: the write fails unless the row still says so.
    pub(crate) expected: Option<(String, i64)>,
    /// The use the decision committed on this holder's slices of the run's scope.
    pub(crate) slices: SliceWrite,
}

/// What a decision at home took of a slice and gave back on one, committed with its
/// run's write (`schema::SCHEMA_V11`): the take refused, failing the transaction, unless
/// the slice is still held by `holder` (or was returned by it, the return counting it).
#[derive(Clone, Debug)]
pub(crate) struct SliceWrite {
    /// This holder and its epoch.
    pub(crate) holder: (String, i64),
    /// The slice taken on, and the use (attempts, nanodollars, side effects, polls).
    pub(crate) took: Option<(i64, [i64; 4])>,
    /// The slice given back on, and what.
    pub(crate) gave: Option<(i64, [i64; 4])>,
    /// The lease manager's time (`None`: the database's), against the slice's expiry.
    pub(crate) at: Option<std::time::SystemTime>,
}

/// What a leased decision writes besides what the transaction read: its runs at home,
/// and the steps of their scopes (bills, revocations).
#[derive(Clone, Debug, Default)]
pub(crate) struct Extra {
    pub(crate) homes: Vec<HomeWrite>,
    pub(crate) steps: Vec<LeaseStep>,
}

/// A lease scope (a run's or its principal's) moved by a central decision: settled up
/// (or down) by `delta` (attempts, nanodollars, side effects, polls), and revoked or not.
#[derive(Clone, Debug)]
pub(crate) struct LeaseStep {
    /// `run` or `principal`.
    pub(crate) kind: &'static str,
    pub(crate) key: String,
    pub(crate) delta: [i64; 4],
    /// A bill already incurred: applied whatever room is left.
    pub(crate) bill: bool,
    /// The scope's slices revoked (`true`), allowed again (`false`), or left (`None`).
    pub(crate) revoked: Option<bool>,
    /// The run's limit after a decision that raised it (an approval's grant used): the
    /// scope's cap raised to it ([`crate::lease::LEASE_RAISE`]) before the use is stepped.
    pub(crate) raise: Option<[Option<i64>; 4]>,
}

/// One write statement's parameters (see [`WRITE`]).
pub(crate) struct WriteRow {
    pub(crate) run_name: Option<String>,
    pub(crate) run_state: Option<Vec<u8>>,
    pub(crate) owner: Option<i64>,
    pub(crate) parent: Option<String>,
    pub(crate) open: Option<bool>,
    pub(crate) tool_name: Option<String>,
    pub(crate) tool_state: Option<Vec<u8>>,
    pub(crate) tool_flight: Option<Vec<u8>>,
    pub(crate) cred_name: Option<String>,
    pub(crate) cred_state: Option<Vec<u8>>,
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

impl Drop for PostgresTxn<'_> {
    fn drop(&mut self) {
        if self.open {
            // Not committed: keep nothing (a failure here drops the connection, which
            // rolls back on the server too).
            let _ = self.simple("to roll back", "ROLLBACK");
        }
    }
}

#[cfg(test)]
#[path = "txn_tests.rs"]
mod tests;
