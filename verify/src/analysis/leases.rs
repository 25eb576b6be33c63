//! The lease audit (docs/VERIFY.md, "Leases"): over one ledger, or the merged ledgers
//! of a fleet, each leased slice from its `lease` records and the decisions that name
//! it. Per slice, the decisions naming it are in its holder's ledger, made while it was
//! open and unexpired, and use no more than its bounds; per scope, the slices open at
//! any moment bound no more than the scope's cap. What counts against a slice, and what
//! is past a bound or a cap, is the policy core's (`tally_policy::leased`).

use std::collections::BTreeMap;

use tally_ledger::decision::{LeaseEvent, LeaseScope, Slice, SliceAmounts};
use tally_ledger::{Decision, Kind};
use tally_policy::{Inconsistency, OutsideLease, RunCount, RunState, SliceUse};

use super::findings::AuditFinding;
use super::report::{Cap, ScopeLeases};
use crate::event::{Event, Seq};

/// Most lease findings listed; the rest are counted.
const MAX_LISTED: usize = 1000;

/// One slice, as its records and decisions so far say.
#[derive(Debug)]
struct Held {
    /// The ledger its grant is in (its holder's).
    ledger: u16,
    /// Its grant's slice (holder, scope, bounds).
    grant: Slice,
    /// Its expiry, renewals included.
    expires_at_ms: u64,
    /// Whether it was returned or reclaimed (and by which event first).
    closed: Option<LeaseEvent>,
    /// Whether a return was recorded.
    returned: bool,
    /// What the decisions naming it used.
    used: SliceUse,
    /// Whether its overspending was reported (once per slice).
    overspent: bool,
    /// The ledger's wall time of the last decision naming it in its holder's ledger:
    /// it was open at least until then, whatever its return says.
    last_decided_ms: u64,
}

/// A slice opening or closing on its scope, for the check over time.
#[derive(Debug)]
struct Change {
    at_ms: u64,
    lease: u64,
    /// Opens before closes at one moment for one slice.
    closes: bool,
    seq: Seq,
}

/// The lease audit's state: every slice seen, and every opening and closing.
#[derive(Debug, Default)]
pub(super) struct Leases {
    slices: BTreeMap<u64, Held>,
    /// Which slice each attempt's allow took its reservation on (run, attempt): only
    /// that slice is credited what its outcome or refund gives back.
    takers: BTreeMap<(String, u64), u64>,
    changes: Vec<Change>,
    findings: Vec<AuditFinding>,
    omitted: u64,
}

impl Leases {
    /// A `lease` record: the slice's event, checked against its history.
    pub(super) fn record(&mut self, e: &Event) {
        let d: &Decision = &e.decision;
        let (Some(id), Some(slice)) = (d.lease, d.slice.as_ref()) else {
            return;
        };
        let why = match (slice.event, self.slices.get_mut(&id)) {
            (LeaseEvent::Grant, Some(_)) => Some("a second grant of one slice id".to_owned()),
            (LeaseEvent::Grant, None) => {
                self.open(e, id, slice);
                None
            }
            (_, None) => Some(format!(
                "a {} of a slice never granted",
                slice.event.as_str()
            )),
            (_, Some(held)) => later_event(held, e, slice),
        };
        if let Some(why) = why {
            self.find(
                e.seq,
                "",
                Inconsistency::LeaseMisrecorded { lease: id, why },
            );
        } else if slice.event.closes() {
            self.close(e, id, slice);
        }
    }

    fn open(&mut self, e: &Event, id: u64, slice: &Slice) {
        self.slices.insert(
            id,
            Held {
                ledger: e.seq.ledger,
                grant: slice.clone(),
                expires_at_ms: slice.expires_at_ms,
                closed: None,
                returned: false,
                used: SliceUse::default(),
                overspent: false,
                last_decided_ms: 0,
            },
        );
        self.changes.push(Change {
            at_ms: slice.granted_at_ms,
            lease: id,
            closes: false,
            seq: e.seq,
        });
    }

    /// A return or reclaim that follows from the slice's history: it closes the slice
    /// on its scope the first time, at the later of the `closed_at_ms` it says and the
    /// ledger's wall time of its record (a holder cannot backdate it to before it was
    /// written; the last decision made on it moves it later still, at the end); a
    /// return saying less used than its decisions used is a finding.
    fn close(&mut self, e: &Event, id: u64, slice: &Slice) {
        let Some(held) = self.slices.get_mut(&id) else {
            return;
        };
        let first = held.closed.is_none();
        held.closed.get_or_insert(slice.event);
        held.returned |= slice.event == LeaseEvent::Return;
        let said = slice.used().each();
        let used = held.used.each();
        let short = (0..4).find(|&i| said[i].is_some_and(|s| s < used[i]));
        if first {
            self.changes.push(Change {
                at_ms: slice
                    .closed_at_ms
                    .unwrap_or(slice.granted_at_ms)
                    .max(e.wall_ms),
                lease: id,
                closes: true,
                seq: e.seq,
            });
        }
        if let Some(i) = short {
            let why = format!(
                "its {} says {} {} used, its decisions used {}",
                slice.event.as_str(),
                said[i].unwrap_or(0),
                SliceAmounts::NAMES[i],
                used[i]
            );
            self.find(
                e.seq,
                "",
                Inconsistency::LeaseMisrecorded { lease: id, why },
            );
        }
    }

    /// A decision naming slice `id`: where and when it may be made on it, and what it
    /// used of it (the change it made to its run's count, `before` to `after`).
    /// `core` is its run's state (its owner and credential, for the slice's scope).
    pub(super) fn decision(
        &mut self,
        e: &Event,
        id: u64,
        (before, after): (RunCount, RunCount),
        core: &RunState,
    ) {
        let d = &e.decision;
        let credential = d.credential.as_deref().or(core.credential.as_deref());
        if let Some(h) = self
            .slices
            .get_mut(&id)
            .filter(|h| h.ledger == e.seq.ledger)
        {
            h.last_decided_ms = h.last_decided_ms.max(e.wall_ms);
        }
        // A run whose start is in no ledger given is owned by the uid its decision says.
        let owner = core.owner_uid.or(d.uid);
        let outside = match self.slices.get(&id) {
            None => Some(OutsideLease::Unknown),
            Some(h) if h.ledger != e.seq.ledger => Some(OutsideLease::OtherHolder),
            Some(h) => match tally_policy::in_scope(
                (h.grant.scope_kind, &h.grant.scope_key),
                &d.run,
                owner,
                credential,
            ) {
                Err(why) => Some(why),
                Ok(()) => self.outside_in_time(e, id),
            },
        };
        let run = d.run.clone();
        if let Some(why) = outside {
            self.find(
                e.seq,
                &run,
                Inconsistency::DecisionOutsideLease { lease: id, why },
            );
            return;
        }
        let Some(held) = self.slices.get_mut(&id) else {
            return;
        };
        held.used.add(before, after);
        let past = held.used.past(&held.grant.bounds());
        if let Some(p) = past.filter(|_| !held.overspent) {
            held.overspent = true;
            let kind = Inconsistency::LeaseOverspent {
                lease: id,
                dimension: p.dimension.to_owned(),
                used: p.used,
                bound: p.bound,
            };
            self.find(e.seq, &run, kind);
        }
    }

    /// Whether a decision naming slice `id` (granted in its ledger, of its scope) is
    /// outside it: made after it closed or expired, or giving back on it what another
    /// slice took.
    fn outside_in_time(&mut self, e: &Event, id: u64) -> Option<OutsideLease> {
        let h = self.slices.get(&id)?;
        if h.closed.is_some() {
            Some(OutsideLease::Closed)
        } else if e.wall_ms > h.expires_at_ms {
            Some(OutsideLease::Expired)
        } else {
            self.taker(&e.decision, id).err()
        }
    }

    /// An allow on slice `id` takes its attempt on it; an outcome or a refund of an
    /// attempt may give back only on the slice its allow took it on
    /// (`tally_policy::gives_back_on`).
    fn taker(&mut self, d: &Decision, id: u64) -> Result<(), OutsideLease> {
        let attempt = match d.kind() {
            Kind::Allow => {
                if let Some(a) = d.attempt {
                    self.takers.insert((d.run.clone(), a), id);
                }
                return Ok(());
            }
            Kind::Outcome => d.attempt,
            Kind::Refund => d.of,
            _ => return Ok(()),
        };
        let allowed_on = attempt.and_then(|a| self.takers.get(&(d.run.clone(), a)).copied());
        tally_policy::gives_back_on(allowed_on, id)
    }

    fn find(&mut self, seq: Seq, run: &str, kind: Inconsistency) {
        if self.findings.len() < MAX_LISTED {
            self.findings.push(AuditFinding {
                seq,
                run: run.to_owned(),
                kind,
            });
        } else {
            self.omitted += 1;
        }
    }

    /// The check over time, per scope: the slices open at each moment (by time, then
    /// lease id) against the scope's cap (`cap`: `None` when the ledgers do not say
    /// it). Gives the findings, how many more there were, and each scope's summary.
    pub(super) fn finish(
        mut self,
        cap: impl Fn(LeaseScope, &str) -> Option<SliceAmounts>,
    ) -> (Vec<AuditFinding>, u64, Vec<ScopeLeases>) {
        // A slice is open until the last decision made on it, if that is later.
        for c in self.changes.iter_mut().filter(|c| c.closes) {
            if let Some(held) = self.slices.get(&c.lease) {
                c.at_ms = c.at_ms.max(held.last_decided_ms);
            }
        }
        self.changes
            .sort_by_key(|c| (c.at_ms, c.lease, c.closes, c.seq));
        let mut scopes: BTreeMap<(LeaseScope, String), Scope> = BTreeMap::new();
        let changes = std::mem::take(&mut self.changes);
        let slices = std::mem::take(&mut self.slices);
        for c in &changes {
            let Some(held) = slices.get(&c.lease) else {
                continue;
            };
            let g = &held.grant;
            let key = (g.scope_kind, g.scope_key.clone());
            let scope = scopes.entry(key).or_insert_with(|| Scope {
                cap: cap(g.scope_kind, &g.scope_key),
                ..Scope::default()
            });
            let bounds = g.bounds().each().map(|b| b.unwrap_or(0));
            if c.closes {
                for (open, b) in scope.open.iter_mut().zip(bounds) {
                    *open = open.saturating_sub(b);
                }
                continue;
            }
            scope.slices += 1;
            for (i, b) in bounds.into_iter().enumerate() {
                scope.open[i] = scope.open[i].saturating_add(b);
                scope.most[i] = scope.most[i].max(scope.open[i]);
            }
            let past = scope
                .cap
                .as_ref()
                .and_then(|cap| tally_policy::slices_past_cap(scope.open, cap));
            if let Some(p) = past {
                let run = if g.scope_kind == LeaseScope::Run {
                    g.scope_key.as_str()
                } else {
                    ""
                };
                let kind = Inconsistency::SlicesOverCap {
                    scope_kind: g.scope_kind,
                    scope_key: g.scope_key.clone(),
                    dimension: p.dimension.to_owned(),
                    leased: p.used,
                    cap: p.bound,
                    lease: c.lease,
                };
                self.find(c.seq, run, kind);
            }
        }
        let summary = scopes
            .into_iter()
            .map(|((scope_kind, scope_key), s)| ScopeLeases {
                scope_kind,
                scope_key,
                slices: s.slices,
                most_leased: s.most.into(),
                cap: s.cap.map_or(Cap::Unknown, |c| Cap::Known(c.into())),
            })
            .collect();
        (self.findings, self.omitted, summary)
    }
}

/// One scope in the check over time.
#[derive(Debug, Default)]
struct Scope {
    cap: Option<SliceAmounts>,
    open: [u64; 4],
    most: [u64; 4],
    slices: u64,
}

/// What is wrong with a renewal, return or reclaim of a slice granted before: in
/// another ledger than its grant, a holder, scope or bounds other than its grant's, an
/// event after it closed (a reclaimed slice may still be returned once), a renewal
/// shortening it. Applies a renewal.
fn later_event(held: &mut Held, e: &Event, slice: &Slice) -> Option<String> {
    let g = &held.grant;
    let same = g.holder == slice.holder
        && g.scope_kind == slice.scope_kind
        && g.scope_key == slice.scope_key
        && g.bounds() == slice.bounds()
        && g.granted_at_ms == slice.granted_at_ms;
    let event = slice.event.as_str();
    let why = if held.ledger != e.seq.ledger {
        format!("a {event} in another ledger than its grant's (its holder's)")
    } else if !same {
        format!("a {event} naming another holder, scope, bounds or grant time than its grant")
    } else {
        match (slice.event, held.closed) {
            (LeaseEvent::Renew, Some(_)) => format!("a {event} after the slice closed"),
            (LeaseEvent::Renew, None) if e.wall_ms > held.expires_at_ms => {
                "a renewal written after the slice expired".to_owned()
            }
            (LeaseEvent::Renew, None) if slice.expires_at_ms < held.expires_at_ms => {
                "a renewal shortening the slice".to_owned()
            }
            (LeaseEvent::Renew, None) => {
                held.expires_at_ms = slice.expires_at_ms;
                return None;
            }
            (LeaseEvent::Return, Some(LeaseEvent::Reclaim)) if !held.returned => return None,
            (_, Some(_)) => format!("a {event} after the slice closed"),
            (_, None) => return None,
        }
    };
    Some(why)
}
