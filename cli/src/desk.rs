//! The human's desk in `tally top`: the approval requests waiting for an answer, each
//! with its countdown and its context, one of them selected; with an approver's key, `a`
//! grants the selected request's cost, signed exactly as `tally approve` signs
//! (`operator::signed`), and `d` asks for a note on the status line and denies it, signed
//! as `tally deny` signs (`deny::denied`). Every agent-chosen text is escaped and bounded
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
    /// A denial being written: the request's id and the note typed so far.
    noting: Option<(String, String)>,
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
            Some(_) => {
                "a approves, d denies the selected request (up/down or j/k select)".to_owned()
            }
            None => "read only: give --approver-key to approve with a or deny with d".to_owned(),
        };
        Desk {
            key,
            approver,
            selected: 0,
            noting: None,
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

    /// Whether a denial's note is being typed: keys then go to it.
    pub fn noting(&self) -> bool {
        self.noting.is_some()
    }

    /// `d`: start a denial of the selected request; its note is typed next.
    pub fn start_denial(&mut self, list: &[ApprovalRequest]) {
        if self.key.is_none() {
            self.said = "cannot deny: tally top was started without --approver-key".into();
            return;
        }
        let Some(r) = list.get(self.selected(list.len())) else {
            self.said = "nothing to deny: no request is waiting".into();
            return;
        };
        self.noting = Some((r.id.clone(), String::new()));
        self.show_note();
    }

    /// A character typed into the note (at most `MAX_DENIAL_NOTE` bytes).
    pub fn type_char(&mut self, c: char) {
        if let Some((_, note)) = &mut self.noting {
            if note.len() + c.len_utf8() <= tally_policy::approval::MAX_DENIAL_NOTE {
                note.push(c);
            }
        }
        self.show_note();
    }

    /// Backspace in the note.
    pub fn erase(&mut self) {
        if let Some((_, note)) = &mut self.noting {
            note.pop();
        }
        self.show_note();
    }

    /// Esc: the denial is dropped, nothing sent.
    pub fn cancel(&mut self) {
        if let Some((id, _)) = self.noting.take() {
            self.said = format!("not denied {id}: cancelled");
        }
    }

    fn show_note(&mut self) {
        if let Some((id, note)) = &self.noting {
            self.said = format!(
                "why deny {id}? {}_ (Enter denies, Esc cancels)",
                tally_verify::text::shown(note)
            );
        }
    }

    /// Enter: deny the request with the note typed, signed as `tally deny` signs; what
    /// happened goes in [`Desk::said`].
    pub fn deny(&mut self, socket: &Path, list: &[ApprovalRequest]) {
        let (Some((id, note)), Some(key)) = (self.noting.take(), self.key.clone()) else {
            return;
        };
        let Some(r) = list.iter().find(|r| r.id == id) else {
            self.said = format!("not denied {id}: it is no longer waiting");
            return;
        };
        self.said = match crate::deny::denied(socket, r, &key, self.approver.as_deref(), &note) {
            Ok(text) => text.lines().next().unwrap_or_default().to_owned(),
            Err(e) => format!("not denied {id}: {e:#}"),
        };
    }
}
