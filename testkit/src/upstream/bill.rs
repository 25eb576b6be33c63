//! The one comparison of the upstreams' bill with the ledger: the prices a test gives,
//! what the fake billed, and what the ledger settled and holds.

use std::collections::BTreeMap;

use serde_json::Value;
use tally_record::money::{per_million, Nanos};

use super::{Billed, FakeUpstream};

/// A model's prices as a test gives them to the policy, each in nanodollars: per
/// million tokens of each class, and per web search.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Price {
    /// Per million input tokens.
    pub input_per_mtok: u64,
    /// Per million output tokens.
    pub output_per_mtok: u64,
    /// Per million cached input tokens.
    pub cached_input_per_mtok: u64,
    /// Per million tokens written to the 5-minute cache.
    pub cache_write_per_mtok: u64,
    /// Per million tokens written to the 1-hour cache.
    pub cache_write_1h_per_mtok: u64,
    /// Per web search.
    pub per_web_search: u64,
}

impl Price {
    /// Whole dollars per million input and output tokens (`input_per_mtok = 10`).
    pub fn usd(input_per_mtok: u64, output_per_mtok: u64) -> Price {
        let usd = tally_record::money::NANOS_PER_DOLLAR;
        Price {
            input_per_mtok: input_per_mtok * usd,
            output_per_mtok: output_per_mtok * usd,
            ..Price::default()
        }
    }

    /// What `b` costs at these prices, each class rounded up to the nanodollar as the
    /// proxy rounds it.
    pub fn of(&self, b: &Billed) -> u64 {
        let at = |units: u64, price: u64| {
            per_million(units, Nanos(price))
                .expect("a fake bill fits in u64 nanodollars")
                .0
        };
        at(b.input, self.input_per_mtok)
            + at(b.cached, self.cached_input_per_mtok)
            + at(b.written, self.cache_write_per_mtok)
            + at(b.written_1h, self.cache_write_1h_per_mtok)
            + at(b.output, self.output_per_mtok)
            + b.web_searches * self.per_web_search
    }
}

/// The ledger's side of the bill, as the auditor reads it: each run's handoff `spend`
/// (`tally handoff --json`), summed over the runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Nanodollars settled by outcomes.
    pub settled_nanos: u64,
    /// Nanodollars held: reserved by allowed calls with no settlement yet.
    pub held_nanos: u64,
}

impl Ledger {
    /// Every run's spend in a `tally handoff --json` report (its `handoffs`).
    pub fn handed_off(report: &Value) -> Ledger {
        let handoffs = report["handoffs"]
            .as_array()
            .unwrap_or_else(|| panic!("no handoffs in the handoff report: {report}"));
        Ledger::of(handoffs)
    }

    /// The spend of `handoffs` (each one run's handoff), summed.
    pub fn of(handoffs: &[Value]) -> Ledger {
        let nanos = |h: &Value, what: &str| {
            h["spend"][what]
                .as_u64()
                .unwrap_or_else(|| panic!("no spend.{what} in the handoff: {h}"))
        };
        handoffs.iter().fold(Ledger::default(), |l, h| Ledger {
            settled_nanos: l.settled_nanos + nanos(h, "settled_nanos"),
            held_nanos: l.held_nanos + nanos(h, "reserved_nanos"),
        })
    }
}

/// What the ledger counts that the fake upstream billed nothing for (it bills only
/// answers whose usage reached the client in full).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unbilled {
    /// Held: calls whose usage never reached the client (cut, killed, past a deadline),
    /// each held at its reservation ([`open_reservations`]).
    pub held_nanos: u64,
    /// Settled without a bill: an operator's settlement from the provider's own figure,
    /// an `error` settled at its reservation.
    pub settled_nanos: u64,
}

impl Unbilled {
    /// Nothing: every call the ledger counts the upstream billed, and nothing is held.
    pub const NONE: Unbilled = Unbilled {
        held_nanos: 0,
        settled_nanos: 0,
    };
}

/// What the allows among one run's `decisions` (each `{seq, decision}`, as `tally
/// verify-proof --json` lists them; [`crate::Tally::decisions`]) reserved for attempts no
/// outcome settled (none, or only an `unknown` or `timeout` naming no amount): what the
/// ledger must hold for them.
pub fn open_reservations(decisions: &[Value]) -> u64 {
    let attempt = |d: &Value| d["decision"]["attempt"].as_u64();
    let settles = |d: &Value| {
        let d = &d["decision"];
        d["kind"] == "outcome"
            && (d["settled_nanos"].is_u64()
                || !["unknown", "timeout"].contains(&d["status"].as_str().unwrap_or("")))
    };
    let settled: Vec<u64> = decisions
        .iter()
        .filter(|d| settles(d))
        .filter_map(attempt)
        .collect();
    decisions
        .iter()
        .filter(|d| d["decision"]["kind"] == "allow")
        .filter(|d| attempt(d).is_some_and(|a| !settled.contains(&a)))
        .map(|d| d["decision"]["reserve_nanos"].as_u64().unwrap_or(0))
        .sum()
}

/// What `upstreams` billed, priced at `prices` (by model; a billed model without a price
/// fails the test), nanodollars.
pub fn bill(upstreams: &[&FakeUpstream], prices: &[(&str, Price)]) -> u64 {
    let prices: BTreeMap<&str, Price> = prices.iter().copied().collect();
    upstreams
        .iter()
        .flat_map(|u| u.billed())
        .map(|b| {
            let key = match b.tier.as_deref() {
                None | Some("default" | "standard") => b.model.clone(),
                Some(t) => format!("{}@{t}", b.model),
            };
            prices
                .get(key.as_str())
                .unwrap_or_else(|| panic!("the fake upstream billed {key} with no price given"))
                .of(&b)
        })
        .sum()
}

/// The one comparison of the upstreams' bill with the ledger, to the nanodollar: every
/// answer `upstreams` billed, priced at `prices` ([`bill`]), plus what the ledger settled
/// without a bill (`unbilled.settled_nanos`), is what the ledger settled; and what the
/// ledger holds is exactly `unbilled.held_nanos`, the reservations of the calls the
/// upstream billed nothing for since their usage never reached the client.
pub fn assert_bill(
    upstreams: &[&FakeUpstream],
    prices: &[(&str, Price)],
    ledger: Ledger,
    unbilled: Unbilled,
) {
    let bill = bill(upstreams, prices);
    let billed: Vec<Billed> = upstreams.iter().flat_map(|u| u.billed()).collect();
    assert_eq!(
        ledger.settled_nanos,
        bill + unbilled.settled_nanos,
        "the ledger settled {} nanodollars; the upstream billed {bill} for {} answers, and \
         {} was settled without a bill: {billed:#?}",
        ledger.settled_nanos,
        billed.len(),
        unbilled.settled_nanos,
    );
    assert_eq!(
        ledger.held_nanos, unbilled.held_nanos,
        "the ledger holds {} nanodollars; the calls the upstream billed nothing for reserved {}",
        ledger.held_nanos, unbilled.held_nanos
    );
}
