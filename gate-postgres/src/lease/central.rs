//! What stays central while slices are out: revoking a scope's slices (its run paused or
//! killed), and spending the last units in the database, one decision at a time, with
//! every slice out counted as unavailable.

use super::types::{Amounts, LeaseError, Spent};
use super::{bigs, sql, Leases, Scope};

impl Leases {
    /// Revoke `scope`'s slices (`revoked`), or allow them again: while revoked no slice
    /// of it is granted or renewed, so every holder loses its slice at its next renewal
    /// (or at its expiry), and a central spend is refused.
    pub fn revoke(&self, scope: &Scope, revoked: bool) -> Result<(), LeaseError> {
        let (kind, key) = (scope.kind.as_str(), scope.key.as_str());
        let n = self.with("to revoke a scope's slices", async |db| {
            db.execute(sql::REVOKE, &[&kind, &key, &revoked]).await
        })?;
        if n == 0 {
            return Err(LeaseError::UnknownScope {
                kind,
                key: scope.key.clone(),
            });
        }
        Ok(())
    }

    /// Give back `need` settled in `scope` for a use whose decision then rolled back
    /// (spent centrally, or counted on a slice that went back saying it used it): the
    /// scope settled down by it, never below nothing, in one statement.
    pub fn unspend(&self, scope: &Scope, need: Amounts) -> Result<(), LeaseError> {
        let n = bigs("a give-back", &need)?.map(|x| -x);
        let (kind, key) = (scope.kind.as_str(), scope.key.as_str());
        self.with("to give back a spend", async |db| {
            let none: Option<bool> = None;
            let p: [&(dyn tokio_postgres::types::ToSql + Sync); 8] =
                [&kind, &key, &n[0], &n[1], &n[2], &n[3], &none, &false];
            db.execute(sql::STEP, &p).await
        })?;
        Ok(())
    }

    /// Spend `need` in every scope of `scopes` at once, centrally: settled up by it in
    /// one transaction, only if it fits in each scope beside what is settled, held and
    /// leased (the scopes locked in their order, so two spends never deadlock).
    /// [`Spent::Leased`]: it would fit but for the slices out (retry once they return).
    pub fn spend(&self, scopes: &[Scope], need: Amounts) -> Result<Spent, LeaseError> {
        let n = bigs("a spend", &need)?;
        let mut sorted: Vec<&Scope> = scopes.iter().collect();
        sorted.sort();
        sorted.dedup();
        let r = self.run("to spend centrally", async |db| {
            db.batch_execute("BEGIN").await?;
            let mut spent = Spent::Spent;
            for scope in &sorted {
                let (kind, key) = (scope.kind.as_str(), scope.key.as_str());
                let p: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
                    [&kind, &key, &n[0], &n[1], &n[2], &n[3]];
                let Some(lock) = db.query_opt(sql::SCOPE_LOCK, &p).await? else {
                    db.batch_execute("ROLLBACK").await?;
                    return Ok(Err((kind, scope.key.clone())));
                };
                if lock.get::<_, bool>(0) {
                    spent = Spent::Revoked;
                    break;
                }
                if !lock.get::<_, bool>(1) {
                    spent = Spent::Refused;
                    break;
                }
                if db.query_opt(sql::SPEND, &p).await?.is_none() {
                    spent = Spent::Leased;
                    break;
                }
            }
            let end = if spent == Spent::Spent {
                "COMMIT"
            } else {
                "ROLLBACK"
            };
            db.batch_execute(end).await?;
            Ok(Ok(spent))
        })?;
        match r {
            Ok(Ok(spent)) => Ok(spent),
            Ok(Err((kind, key))) => Err(LeaseError::UnknownScope { kind, key }),
            Err(e) => Err(self.unavailable("to spend centrally", crate::describe(&e))),
        }
    }
}
