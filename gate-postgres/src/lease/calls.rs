//! The lease manager's calls: define a scope, read its outlook, grant, renew, return and
//! reclaim slices.

use std::time::{Duration, SystemTime};

use tokio_postgres::error::SqlState;

use super::types::{Amounts, Caps, Grant, Lease, LeaseError, Outlook, Reclaimed, Released};
use super::{amounts_at, big, bigs, interval_of, left_at, ms, scope_at, sql, Leases, Scope};

/// What a return finds, under the lease's lock.
enum Found {
    Missing,
    Stale(i64),
    NotHolder,
    Returned,
    Open {
        reclaimed: bool,
        granted: Amounts,
        /// Its committed use (`None`: not known).
        committed: Option<Amounts>,
        /// Reclaimed: what its reclaim settled (`None`: not recorded, the whole slice).
        settled: Option<Amounts>,
    },
}

impl Leases {
    /// Define a scope: its caps and what is settled and held centrally (`None` cap: no
    /// limit). Once defined, a redefinition changes its caps only: what is settled,
    /// held and billed stays the database's ([`Leases::reset`] starts a period anew).
    /// While slices of it are out, refused, nothing changed, if it would change which
    /// dimensions are capped ([`LeaseError::SlicesOut`]) or put a cap below what is
    /// settled, held and leased ([`LeaseError::Overcommitted`]).
    pub fn define(
        &self,
        scope: &Scope,
        caps: Caps,
        settled: Amounts,
        held: Amounts,
    ) -> Result<(), LeaseError> {
        let (kind, key) = (scope.kind.as_str(), scope.key.as_str());
        let mut c = [None; 4];
        for (i, cap) in caps.each().iter().enumerate() {
            c[i] = cap.map(|n| big("a cap", n)).transpose()?;
        }
        let (s, h) = (bigs("settled", &settled)?, bigs("held", &held)?);
        let r = self.run("to define a lease scope", async |db| {
            let p: [&(dyn tokio_postgres::types::ToSql + Sync); 14] = [
                &kind, &key, &c[0], &c[1], &c[2], &c[3], &s[0], &s[1], &s[2], &s[3], &h[0], &h[1],
                &h[2], &h[3],
            ];
            if db.execute(sql::DEFINE, &p).await? == 1 {
                return Ok(None);
            }
            let why = db.query_opt(sql::DEFINE_WHY, &p[..6]).await?;
            Ok(Some(why.is_some_and(|r| r.get::<_, bool>(0))))
        })?;
        let out = || scope.key.clone();
        match r {
            Ok(None) => Ok(()),
            Ok(Some(true)) => Err(LeaseError::SlicesOut { kind, key: out() }),
            Ok(Some(false)) => Err(LeaseError::Overcommitted { kind, key: out() }),
            Err(e) if e.code() == Some(&SqlState::CHECK_VIOLATION) => {
                Err(LeaseError::Overcommitted { kind, key: out() })
            }
            Err(e) => Err(self.unavailable("to define a lease scope", crate::describe(&e))),
        }
    }

    /// Start a defined scope's period anew: what is settled and held centrally set to
    /// `settled` and `held`, nothing billed. Only while no slice of it is out
    /// ([`LeaseError::SlicesOut`]: revoke it and wait for its slices to return or be
    /// reclaimed); an unknown scope: [`LeaseError::UnknownScope`].
    pub fn reset(&self, scope: &Scope, settled: Amounts, held: Amounts) -> Result<(), LeaseError> {
        let (kind, key) = (scope.kind.as_str(), scope.key.as_str());
        let (s, h) = (bigs("settled", &settled)?, bigs("held", &held)?);
        let (done, known) = self.with("to reset a lease scope", async |db| {
            let p: [&(dyn tokio_postgres::types::ToSql + Sync); 10] = [
                &kind, &key, &s[0], &s[1], &s[2], &s[3], &h[0], &h[1], &h[2], &h[3],
            ];
            if db.execute(sql::RESET, &p).await? == 1 {
                return Ok((true, true));
            }
            let known = db.query_opt(sql::KNOWN, &p[..2]).await?;
            Ok((false, known.is_some()))
        })?;
        let key = scope.key.clone();
        match (done, known) {
            (true, _) => Ok(()),
            (false, true) => Err(LeaseError::SlicesOut { kind, key }),
            (false, false) => Err(LeaseError::UnknownScope { kind, key }),
        }
    }

    /// What `scope` has left, and how many distinct holders have a slice of it out or
    /// were granted one within `window` (what [`tally_policy::slice_size`] sizes by).
    pub fn outlook(&self, scope: &Scope, window: Duration) -> Result<Outlook, LeaseError> {
        let (kind, key, holder) = (scope.kind.as_str(), scope.key.as_str(), &self.holder);
        let (window, now) = (ms(window), self.now());
        let rows = self.with("to read a lease scope", async |db| {
            db.query(sql::LEFT, &[&kind, &key, holder, &window, &now])
                .await
        })?;
        let row = rows.first().ok_or_else(|| LeaseError::UnknownScope {
            kind,
            key: scope.key.clone(),
        })?;
        Ok(Outlook {
            left: left_at(row, 1),
            holders: u64::try_from(row.get::<_, i64>(5)).unwrap_or(0),
        })
    }

    /// Lease `want` of `scope` for the manager's time to live, in one statement: the
    /// slice, or [`Grant::Refused`] with what is left when it does not fit.
    pub fn grant(&self, scope: &Scope, want: Amounts) -> Result<Grant, LeaseError> {
        if want == Amounts::default() {
            return Err(LeaseError::Invalid("a slice of nothing".into()));
        }
        let w = bigs("a slice", &want)?;
        let (kind, key, holder, epoch) = (
            scope.kind.as_str(),
            scope.key.as_str(),
            &self.holder,
            &self.epoch,
        );
        let (ttl, now, commits) = (ms(self.options.ttl), self.now(), self.commits());
        let rows = self.with("to grant a slice", async |db| {
            db.query(
                sql::GRANT,
                &[
                    &kind, &key, holder, epoch, &w[0], &w[1], &w[2], &w[3], &ttl, &now, &commits,
                ],
            )
            .await
        })?;
        if let Some(row) = rows.first() {
            let (granted_at, expires_at): (SystemTime, SystemTime) = (row.get(1), row.get(2));
            return Ok(Grant::Granted(Lease {
                id: row.get(0),
                scope: scope.clone(),
                epoch: self.epoch,
                granted: want,
                granted_at,
                expires_at,
                valid_for: self.options.ttl,
                committed: commits.then(Amounts::default),
            }));
        }
        self.why_refused(scope)
    }

    /// A grant matched nothing: a stale epoch, an unknown scope, or too little left.
    fn why_refused(&self, scope: &Scope) -> Result<Grant, LeaseError> {
        let (kind, key, holder) = (scope.kind.as_str(), scope.key.as_str(), &self.holder);
        let now = self.now();
        let rows = self.with("to read a lease scope", async |db| {
            db.query(sql::LEFT, &[&kind, &key, holder, &0i64, &now])
                .await
        })?;
        let Some(row) = rows.first() else {
            return Err(LeaseError::UnknownScope {
                kind,
                key: scope.key.clone(),
            });
        };
        self.current(row.get(0))?;
        if row.get::<_, bool>(6) {
            return Ok(Grant::Revoked);
        }
        Ok(Grant::Refused {
            left: left_at(row, 1),
        })
    }

    /// Refused if the holder's epoch in the database is not this manager's.
    fn current(&self, found: Option<i64>) -> Result<(), LeaseError> {
        match found {
            Some(e) if e == self.epoch => Ok(()),
            other => Err(LeaseError::StaleEpoch {
                holder: self.holder.clone(),
                epoch: self.epoch,
                current: other.unwrap_or(0),
            }),
        }
    }

    /// Extend a held slice by the time to live from now (never shortening it). Refused
    /// once it expired, ended, or this manager was replaced.
    pub fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let (id, holder, epoch) = (&lease.id, &self.holder, &self.epoch);
        let (ttl, now) = (ms(self.options.ttl), self.now());
        let rows = self.with("to renew a slice", async |db| {
            db.query(sql::RENEW, &[id, holder, epoch, &ttl, &now]).await
        })?;
        if let Some(row) = rows.first() {
            return Ok(Lease {
                epoch: self.epoch,
                expires_at: row.get(0),
                valid_for: interval_of(row, 1),
                ..lease.clone()
            });
        }
        let rows = self.with("to read a slice", async |db| {
            db.query(sql::LEASE, &[id, &now]).await
        })?;
        let Some(row) = rows.first().filter(|r| r.get::<_, &str>(0) == holder) else {
            return Err(LeaseError::NotHolder {
                id: lease.id,
                holder: holder.clone(),
            });
        };
        self.current(row.get(3))?;
        let state: &str = row.get(1);
        Err(LeaseError::Ended {
            id: lease.id,
            state: if state == "held" && row.get::<_, Option<bool>>(4) == Some(true) {
                "revoked".to_owned()
            } else if state == "held" && row.get::<_, bool>(2) {
                "expired".to_owned()
            } else {
                state.to_owned()
            },
        })
    }

    /// Give a slice back, saying what of it was `used`: the used part is settled, the
    /// rest goes back to the scope. Once: a second return of the same lease changes
    /// nothing ([`Released::Already`]). A slice reclaimed meanwhile settled its
    /// committed use (or, not known, the whole slice): where that covers `used`, what it
    /// settled beyond `used` is refunded now ([`Released::Refunded`]); where it does not
    /// (uses counted, not committed yet) nothing moves, and those uses are refused at
    /// their commit ([`Released::Late`]). A slice whose committed use is known never
    /// settles less than it (the decisions committed on it are in their runs' rows).
    pub fn release(&self, id: i64, used: Amounts) -> Result<Released, LeaseError> {
        let u = bigs("used", &used)?;
        let (holder, epoch, now) = (&self.holder, self.epoch, self.now());
        let (found, released) = self.with("to return a slice", async |db| {
            db.batch_execute("BEGIN").await?;
            let current: Option<i64> = db
                .query_opt(sql::HOLDER_SHARE, &[holder])
                .await?
                .map(|r| r.get(0));
            let row = db.query_opt(sql::LEASE_LOCK, &[&id]).await?;
            let found = match (current, &row) {
                (c, _) if c != Some(epoch) => Found::Stale(c.unwrap_or(0)),
                (_, None) => Found::Missing,
                (_, Some(r)) if r.get::<_, &str>(0) != holder => Found::NotHolder,
                (_, Some(r)) if r.get::<_, &str>(1) == "returned" => Found::Returned,
                (_, Some(r)) => Found::Open {
                    reclaimed: r.get::<_, &str>(1) == "reclaimed",
                    granted: amounts_at(r, 4),
                    committed: super::committed_at(r, 8),
                    settled: super::committed_at(r, 12),
                },
            };
            let mut released = None;
            if let (
                Found::Open {
                    reclaimed,
                    granted,
                    committed,
                    settled,
                },
                Some(r),
            ) = (&found, &row)
            {
                if used.within(granted) {
                    let was = reclaimed.then(|| settled.unwrap_or(*granted));
                    let s = settles(was, granted, *committed, u);
                    let (kind, key): (&str, &str) = (r.get(2), r.get(3));
                    let (c, covers) = (s.closed, s.released != Released::Late);
                    db.execute(
                        sql::CLOSE,
                        &[&id, &c[0], &c[1], &c[2], &c[3], &now, &covers],
                    )
                    .await?;
                    move_amounts(db, kind, key, s.leased, s.settled).await?;
                    released = Some(s.released);
                }
            }
            db.batch_execute("COMMIT").await?;
            Ok((found, released))
        })?;
        match (found, released) {
            (_, Some(r)) => Ok(r),
            (Found::Stale(current), _) => Err(LeaseError::StaleEpoch {
                holder: holder.clone(),
                epoch,
                current,
            }),
            (Found::Missing | Found::NotHolder, _) => Err(LeaseError::NotHolder {
                id,
                holder: holder.clone(),
            }),
            (Found::Returned, _) => Ok(Released::Already),
            (Found::Open { granted, .. }, None) => {
                Err(LeaseError::UsedMoreThanGranted { id, used, granted })
            }
        }
    }

    /// Reclaim every slice (of any holder) that expired more than the margin ago: each
    /// settles its committed use (or, where that is not known, is counted as spent
    /// whole: its holder may have spent all of it before its expiry) and is no longer
    /// leased; the rest goes back to the scope now (a slice spent whole: at its
    /// holder's late return, which refunds the unused part). Each slice is reclaimed
    /// once, whoever calls this, however often.
    pub fn reclaim_expired(&self) -> Result<Vec<Reclaimed>, LeaseError> {
        let (margin, now) = (ms(self.options.margin), self.now());
        self.with("to reclaim expired slices", async |db| {
            db.batch_execute("BEGIN").await?;
            db.query(sql::RECLAIM_LOCK, &[]).await?;
            let rows = db.query(sql::RECLAIM, &[&margin, &now]).await?;
            let reclaimed: Vec<Reclaimed> = rows
                .iter()
                .map(|r| Reclaimed {
                    id: r.get(0),
                    scope: scope_at(r, 1),
                    holder: r.get(3),
                    granted: amounts_at(r, 4),
                    settled: amounts_at(r, 8),
                })
                .collect();
            // One update per scope, in the scopes' order: leased down by the slices,
            // settled up by what each settles.
            type Sums = ([i64; 4], [i64; 4]);
            let mut per: std::collections::BTreeMap<&Scope, Sums> = Default::default();
            let big = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            for r in &reclaimed {
                let (leased, settled) = per.entry(&r.scope).or_default();
                for (i, (g, u)) in r
                    .granted
                    .each()
                    .into_iter()
                    .zip(r.settled.each())
                    .enumerate()
                {
                    leased[i] += big(g);
                    settled[i] += big(u);
                }
            }
            for (scope, (leased, settled)) in per {
                move_amounts(db, scope.kind.as_str(), &scope.key, leased, settled).await?;
            }
            db.batch_execute("COMMIT").await?;
            Ok(reclaimed)
        })
    }
}

/// What a return moves ([`settles`]).
struct Settles {
    /// The scope's leased amounts down by this.
    leased: [i64; 4],
    /// Its settled amounts up by this (negative: down).
    settled: [i64; 4],
    /// The use the slice closes with (what is settled of it).
    closed: [i64; 4],
    released: Released,
}

/// What a return of a slice covering `granted` with `committed` use (`None`: not known)
/// moves, its holder saying it used `u`; `reclaimed`: what its reclaim settled (`None`:
/// held). Held: leased down by the slice, the greater of `u` and the committed use
/// settled. Reclaimed: settled down to the greater of `u` and the committed use, never
/// up (the rest went back to the scope at the reclaim, and may be leased again): where
/// the reclaim settled less than that (its committed use, the holder counting uses not
/// committed yet) nothing moves, and those uses are refused at their commit
/// ([`Released::Late`]).
fn settles(
    reclaimed: Option<Amounts>,
    granted: &Amounts,
    committed: Option<Amounts>,
    u: [i64; 4],
) -> Settles {
    let big = |a: &Amounts| a.each().map(|n| i64::try_from(n).unwrap_or(i64::MAX));
    let g = big(granted);
    let floor = committed.as_ref().map_or([0; 4], big);
    let used = [0, 1, 2, 3].map(|i| u[i].max(floor[i]));
    let Some(was) = reclaimed.as_ref().map(big) else {
        return Settles {
            leased: g,
            settled: used,
            closed: used,
            released: Released::Returned,
        };
    };
    let now = [0, 1, 2, 3].map(|i| used[i].min(was[i]));
    Settles {
        leased: [0; 4],
        settled: [0, 1, 2, 3].map(|i| now[i] - was[i]),
        closed: now,
        released: if now == used {
            Released::Refunded
        } else {
            Released::Late
        },
    }
}

/// A scope's leased amounts down by `leased`, its settled amounts up by `settled`.
async fn move_amounts(
    db: &tokio_postgres::Client,
    kind: &str,
    key: &str,
    leased: [i64; 4],
    settled: [i64; 4],
) -> Result<u64, tokio_postgres::Error> {
    let (l, s) = (&leased, &settled);
    db.execute(
        sql::MOVE,
        &[
            &kind, &key, &l[0], &l[1], &l[2], &l[3], &s[0], &s[1], &s[2], &s[3],
        ],
    )
    .await
}
