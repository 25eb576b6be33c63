//! The flat form of a typed record: [`Decision::from`] writes each field back where the
//! JSON has it, so `Decision -> Record -> Decision` is the identity.

use crate::decision::Decision;

use super::kinds::{
    Allow, Amount, Call, Deny, Head, Lease, Mark, Observer, Outcome, Override, Policy, Refund,
    Start, Stop,
};
use super::Record;

impl From<Record<'_>> for Decision {
    fn from(record: Record<'_>) -> Decision {
        let mut d = Decision {
            kind: Some(record.kind()),
            ..Decision::default()
        };
        match record {
            Record::Start(s) => start(&mut d, s),
            Record::Allow(a) => allow(&mut d, a),
            Record::Deny(n) => deny(&mut d, n),
            Record::Outcome(o) => outcome(&mut d, o),
            Record::Refund(r) => refund(&mut d, r),
            Record::Override(o) => grant(&mut d, o),
            Record::Stop(s) => stop(&mut d, s),
            Record::Policy(p) => policy(&mut d, p),
            Record::Pause(m) | Record::Resume(m) => mark(&mut d, m),
            Record::Lease(l) => lease(&mut d, l),
        }
        d
    }
}

fn start(d: &mut Decision, s: Start<'_>) {
    head(d, s.head);
    d.reason = s.reason;
    d.goal = s.goal.map(str::to_owned);
    d.budget = s.budget.cloned().map(Box::new);
    d.parent = s.parent.map(str::to_owned);
    d.credential = s.credential.map(str::to_owned);
    d.continues = s.continues.map(str::to_owned);
}

fn allow(d: &mut Decision, a: Allow<'_>) {
    head(d, a.head);
    d.reason = a.reason;
    call(d, a.call);
    d.timeout_ms = a.timeout_ms;
    d.grant = a.grant.map(str::to_owned);
}

fn deny(d: &mut Decision, n: Deny<'_>) {
    head(d, n.head);
    d.reason = Some(n.reason);
    call(d, n.call);
    d.retry_after_ms = n.retry_after_ms;
    d.request = n.request.cloned().map(Box::new);
}

fn outcome(d: &mut Decision, o: Outcome<'_>) {
    head(d, o.head);
    d.reason = o.reason;
    d.attempt = o.attempt;
    d.status = Some(o.status);
    (d.settled_cents, d.settled_nanos) = units(o.settled);
    d.remote_ref = o.remote_ref.map(str::to_owned);
    d.observed = o.observed.map(str::to_owned);
    d.retry_after_ms = o.retry_after_ms;
    d.result_digest = o.result_digest.map(str::to_owned);
    d.overrun_nanos = o.overrun_nanos.map(u64::from);
    match o.observer {
        Observer::Agent => {}
        Observer::Proxy {
            usage_refused,
            usage,
        } => {
            d.proxied = Some(true);
            d.usage_refused = usage_refused;
            d.usage = usage.cloned().map(Box::new);
        }
        Observer::Operator => d.operator = Some(true),
    }
    d.lease = o.lease;
}

fn refund(d: &mut Decision, r: Refund<'_>) {
    head(d, r.head);
    d.reason = r.reason;
    d.of = Some(r.of);
    d.slots = r.slots;
    (d.cents, d.nanos) = units(r.refunded);
    d.lease = r.lease;
}

fn grant(d: &mut Decision, o: Override<'_>) {
    head(d, o.head);
    d.reason = o.reason;
    d.approver = o.approver.map(str::to_owned);
    d.scope = o.scope.cloned().map(Box::new);
    d.digest = o.digest.map(str::to_owned);
    d.expires_ms = o.expires_ms;
    d.signature = o.signature.map(str::to_owned);
    d.note = o.note.map(str::to_owned);
    d.answers = o.answers.map(str::to_owned);
    d.tool = o.tool.map(str::to_owned);
    d.operation = o.operation.map(str::to_owned);
    d.args_digest = o.args_digest.map(str::to_owned);
}

fn stop(d: &mut Decision, s: Stop<'_>) {
    head(d, s.head);
    d.reason = Some(s.reason);
    d.limits = s.limits.cloned();
    d.note = s.note.map(str::to_owned);
}

fn policy(d: &mut Decision, p: Policy<'_>) {
    d.worker = p.worker.map(str::to_owned);
    d.at_ms = p.at_ms;
    d.reason = p.reason;
    d.policy = Some(p.policy.to_owned());
    d.policy_text = Some(p.policy_text.to_owned());
    d.uid = p.uid;
}

fn lease(d: &mut Decision, l: Lease<'_>) {
    d.worker = l.worker.map(str::to_owned);
    d.at_ms = l.at_ms;
    d.uid = l.uid;
    d.lease = Some(l.id);
    d.slice = Some(Box::new(l.slice.clone()));
}

fn mark(d: &mut Decision, m: Mark<'_>) {
    head(d, m.head);
    d.reason = m.reason;
}

fn head(d: &mut Decision, h: Head<'_>) {
    d.run = h.run.to_owned();
    d.worker = h.worker.map(str::to_owned);
    d.at_ms = h.at_ms;
    d.policy = h.policy.map(str::to_owned);
    d.uid = h.uid;
    d.state_version = h.state_version;
    d.prev_seq = h.prev_seq;
}

fn call(d: &mut Decision, c: Call<'_>) {
    d.tool = c.tool.map(str::to_owned);
    d.operation = c.operation.map(str::to_owned);
    d.args = c.args.cloned();
    d.args_digest = c.args_digest.map(str::to_owned);
    d.args_preview = c.args_preview.map(str::to_owned);
    d.effect = c.effect;
    d.idempotency_key = c.idempotency_key.map(str::to_owned);
    d.target = c.target.map(str::to_owned);
    d.channel = c.channel;
    d.depth = c.depth;
    d.parent = c.parent.map(str::to_owned);
    d.attempt = c.attempt;
    (d.reserve_cents, d.reserve_nanos) = units(c.reserve);
    d.remote_ref = c.remote_ref.map(str::to_owned);
    d.limits = c.limits.cloned();
    d.credential = c.credential.map(str::to_owned);
    d.proxied = c.proxied.then_some(true);
    d.trace_id = c.trace_id.map(str::to_owned);
    d.lease = c.lease;
}

/// An amount as the JSON gives it: `(cents, nanos)`, at most one of them.
fn units(amount: Option<Amount>) -> (Option<u64>, Option<u64>) {
    match amount {
        Some(Amount::Cents(c)) => (Some(c), None),
        Some(Amount::Nanos(n)) => (None, Some(n)),
        None => (None, None),
    }
}
