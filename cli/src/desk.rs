//! The human's desk in `tally top`: the approval requests waiting for an answer, each
//! with its countdown and its context, one of them selected; with an approver's key, `a`
//! grants the selected request's cost, signed exactly as `tally approve` signs
//! (`operator::signed`). Every agent-chosen text is escaped and bounded
//! (`approvals::row`).

use std::path::{Path, PathBuf};

use anyhow::Result;
use tally_api::{ApprovalRequest, RequestState};

use crate::approvals::row;
use crate::operator::{gate, refused, signed, Grant};

/// How long a grant made from `tally top` is valid when its request has no deadline.
const DEFAULT_VALID: &str = "10m";

/// The requests waiting, the selection, and the key that may answer them.
pub(crate) struct Desk {
    key: Option<PathBuf>,
    approver: Option<String>,
    selected: usize,
    /// What the last key press did, as people read it.
    pub said: String,
}

/// The pending requests the gate holds, nearest deadline first.
pub(crate) async fn pending(socket: &Path) -> Result<Vec<ApprovalRequest>> {
    let list = gate(socket)
        .await?
        .approval_requests()
        .await
        .map_err(refused)?;
    Ok(list
        .into_iter()
        .filter(|r| r.state == RequestState::Pending)
        .collect())
}

impl Desk {
    pub fn new(key: Option<PathBuf>, approver: Option<String>) -> Desk {
        let said = match key {
            Some(_) => "a approves the selected request (up/down or j/k select)".to_owned(),
            None => "read only: give --approver-key to approve with a".to_owned(),
        };
        Desk {
            key,
            approver,
            selected: 0,
            said,
        }
    }

    /// The selected row among `n`.
    pub fn selected(&self, n: usize) -> usize {
        self.selected.min(n.saturating_sub(1))
    }

    /// Move the selection by `by` rows among `n`.
    pub fn select(&mut self, by: isize, n: usize) {
        let at = self.selected(n);
        self.selected = at.saturating_add_signed(by).min(n.saturating_sub(1));
    }

    /// Each request as the desk shows it: its cells joined, one line.
    pub fn lines(list: &[ApprovalRequest]) -> Vec<String> {
        list.iter()
            .map(|r| {
                let [id, state, run, call, target, cost, standing, who] = row(r);
                format!(
                    "{id}  {state}  run {run}  {call} -> {target}  grant: {cost}  ({standing})  asked by {who}"
                )
            })
            .collect()
    }

    /// `a`: grant the selected request's cost with the approver's key, signed as
    /// `tally approve` signs; what happened goes in [`Desk::said`].
    pub fn approve(&mut self, socket: &Path, list: &[ApprovalRequest]) {
        let Some(key) = self.key.clone() else {
            self.said = "cannot approve: tally top was started without --approver-key".into();
            return;
        };
        let Some(r) = list.get(self.selected(list.len())) else {
            self.said = "nothing to approve: no request is waiting".into();
            return;
        };
        let grant = Grant {
            run: r.run.clone(),
            request: Some(r.id.clone()),
            key,
            approver: self.approver.clone(),
            expires: r
                .expires_in_ms
                .filter(|&ms| ms > 0)
                .map_or(DEFAULT_VALID.to_owned(), |ms| format!("{ms}ms")),
            scope: r.cost.clone(),
            note: None,
        };
        self.said = match signed(socket, grant) {
            Ok(text) => format!(
                "approved {}: {}",
                r.id,
                text.lines().next().unwrap_or_default()
            ),
            Err(e) => format!("not approved {}: {e:#}", r.id),
        };
    }
}
