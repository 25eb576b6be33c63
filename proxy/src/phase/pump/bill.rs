//! What an answer cost: how a cut or a complete answer ends the call, for the settle
//! phase (docs/PROXY.md, "Outcomes, observed").

use hyper::StatusCode;
use tally_policy::{ModelPrice, UpstreamKind};
use tally_record::money::Nanos;
use tally_record::{Status, UsageRefused};

use crate::phase::settle::{Ended, Settle};
use crate::usage::Reported;

/// What the answer's head says, for its bill.
pub(super) struct Answer {
    pub status: StatusCode,
    /// The operator's cost header, if the upstream has one and sent it (`None` inside:
    /// sent, and not an amount).
    pub header_cost: Option<Option<Nanos>>,
    pub retry_after_ms: Option<u64>,
}

/// What a complete answer says the call cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Billed {
    /// What the upstream's report costs at the policy's prices: the truth, settled whole.
    Cost(Nanos),
    /// No report (nothing to settle from: the reservation stays held).
    Missing,
    /// A report tally does not believe or cannot price.
    Refused(UsageRefused),
}

/// The end of an answer cut at `cut` (a timeout, a broken body, an event past the
/// bound): an event past the bound (`error`) is final, so settled at the most the gate
/// allowed, never at nothing; a cut or a timeout stays held.
pub(super) fn cut(s: &Settle, answer: &Answer, cut: Status, digest: String) -> Ended {
    Ended {
        status: tally_policy::recorded_status(cut, s.effect),
        nanos: tally_policy::is_final(cut).then_some(s.reserved.0),
        retry_after_ms: None,
        digest: Some(digest),
        observed: None,
        usage_refused: None,
        usage: None,
        http: Some(answer.status.as_u16()),
        used: None,
    }
}

/// The end of a complete answer that `reported` its usage (and `said` which tier
/// served it).
pub(super) fn answered(
    s: &Settle,
    answer: &Answer,
    reported: Reported,
    said: Option<String>,
    digest: String,
) -> Ended {
    let status = answer.status;
    let reported = reported.within(s.price.as_ref(), s.choices);
    // The rates of the tier the answer says served it.
    let at_tier = s
        .price
        .as_ref()
        .and_then(|p| crate::tier::settled(p, s.kind, &s.lands, said.as_deref()));
    let used = reported.clone().usage();
    let billed = if !status.is_success() {
        Billed::Missing
    } else if s.kind == UpstreamKind::Http {
        match answer.header_cost.unwrap_or(s.route_price) {
            Some(c) => Billed::Cost(c),
            None => Billed::Missing,
        }
    } else {
        billed(&reported, s.price.as_ref(), at_tier.as_ref())
    };
    let mut ended = classify(
        status,
        billed,
        s.reserved,
        answer.retry_after_ms,
        Some(digest),
    );
    if status.is_success() {
        ended.usage = used.as_ref().and_then(crate::usage::Usage::recorded);
    }
    ended.http = Some(status.as_u16());
    ended.used = used;
    ended
}

/// What a model call's reported usage comes to at its price (`price`, at the rates of
/// the tier the answer says served it: `at_tier`, none if that tier has no price): the
/// cost, nothing to settle from, or a report tally does not believe (`implausible`: it
/// cannot be true, or costs more than a `u64` of nanodollars) or cannot price
/// (`unpriced`: a class of usage or a tier with no price).
fn billed(reported: &Reported, price: Option<&ModelPrice>, at_tier: Option<&ModelPrice>) -> Billed {
    match (reported, price.and(Some(at_tier))) {
        (Reported::Implausible(_), _) => Billed::Refused(UsageRefused::Implausible),
        (Reported::Usage(_), Some(None)) => Billed::Refused(UsageRefused::Unpriced),
        (Reported::Usage(u), Some(Some(p))) if u.unpriced(p) => {
            Billed::Refused(UsageRefused::Unpriced)
        }
        (Reported::Usage(u), Some(Some(p))) => match u.cost(p) {
            Some(c) => Billed::Cost(c),
            None => Billed::Refused(UsageRefused::Implausible),
        },
        _ => Billed::Missing,
    }
}

/// The outcome of a complete answer: 2xx `ok`, settled at what the upstream reported,
/// **whatever the reservation was** (the upstream is the authority on what a call cost:
/// an excess is an overrun the gate records, never a number clipped away); 2xx with no
/// report `unknown` (the reservation held); 2xx with a report tally does not believe
/// (`usage_refused`) `error`, settled at the reservation. 429 and 503 with Retry-After
/// `rejected` with it; other 4xx `rejected`; 3xx `rejected`; 5xx `error`. Nothing is
/// charged for an answer that is not a success.
fn classify(
    status: StatusCode,
    billed: Billed,
    reserved: Nanos,
    retry_after_ms: Option<u64>,
    digest: Option<String>,
) -> Ended {
    let mut usage_refused = None;
    let (st, nanos, retry) = if status.is_success() {
        match billed {
            Billed::Cost(c) => (Status::Ok, Some(c.0), None),
            Billed::Missing => (Status::Unknown, None, None),
            Billed::Refused(why) => {
                usage_refused = Some(why);
                (Status::Error, Some(reserved.0), None)
            }
        }
    } else if (status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE)
        && retry_after_ms.is_some()
    {
        (Status::Rejected, Some(0), retry_after_ms)
    } else if status.is_server_error() {
        (Status::Error, Some(0), None)
    } else {
        (Status::Rejected, Some(0), None)
    };
    Ended {
        status: st,
        nanos,
        retry_after_ms: retry,
        digest,
        observed: None,
        usage_refused,
        usage: None,
        http: None,
        used: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::Usage;

    fn price() -> ModelPrice {
        ModelPrice {
            max_output_tokens: 100,
            context_tokens: 1000,
            ..ModelPrice::new(Nanos(1_000_000_000), Nanos(2_000_000_000))
        }
    }

    fn settle(reported: Reported, reserved: u64) -> Ended {
        let b = billed(
            &reported.within(Some(&price()), 1),
            Some(&price()),
            Some(&price()),
        );
        classify(StatusCode::OK, b, Nanos(reserved), None, None)
    }

    /// The bill settles whole, above the reservation too; usage that cannot be true or
    /// cannot be priced is an error at the reservation, with why; no usage is held.
    #[test]
    fn the_bill_settles_whole_and_only_what_cannot_be_true_is_refused() {
        let u = |input, output| Usage {
            input,
            output,
            ..Usage::default()
        };
        // 100 in at $1/M, 50 out at $2/M: 200,000 nanodollars, past a 1,000 reservation.
        let e = settle(Reported::Usage(u(100, 50)), 1_000);
        assert_eq!(
            (e.status, e.nanos, e.usage_refused),
            (Status::Ok, Some(200_000), None)
        );
        // Past the model's context plus its output limit: cannot be true.
        let e = settle(Reported::Usage(u(1000, 101)), 1_000);
        assert_eq!(
            (e.status, e.nanos, e.usage_refused),
            (Status::Error, Some(1_000), Some(UsageRefused::Implausible))
        );
        let e = settle(Reported::Implausible("negative".into()), 7);
        assert_eq!(
            (e.status, e.nanos, e.usage_refused),
            (Status::Error, Some(7), Some(UsageRefused::Implausible))
        );
        // Cache writes with no price: not guessed.
        let written = Usage {
            written: 10,
            ..u(1, 1)
        };
        let e = settle(Reported::Usage(written), 9);
        assert_eq!(
            (e.status, e.nanos, e.usage_refused),
            (Status::Error, Some(9), Some(UsageRefused::Unpriced))
        );
        // No usage: held (unknown, nothing settled).
        let e = settle(Reported::Missing, 9);
        assert_eq!(
            (e.status, e.nanos, e.usage_refused),
            (Status::Unknown, None, None)
        );
        // Not a success: nothing charged, whatever it reports.
        let b = billed(&Reported::Usage(u(100, 50)), Some(&price()), Some(&price()));
        let e = classify(StatusCode::INTERNAL_SERVER_ERROR, b, Nanos(9), None, None);
        assert_eq!((e.status, e.nanos), (Status::Error, Some(0)));
    }
}
