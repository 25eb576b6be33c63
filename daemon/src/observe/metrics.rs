//! The daemon's Prometheus metrics (docs/OPERATOR.md lists every series), in the text
//! exposition format through `prometheus-client`.
//!
//! No label value is a string an agent chose: a tool is labelled with its name only when
//! the policy names it exactly (`Policy::named_tools`), every other tool is `other`;
//! decisions, reasons and statuses are closed sets of the gate's own codes; run names are
//! never labels (an agent could otherwise grow the series without bound).

use std::collections::BTreeSet;
use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

type Labels = Vec<(&'static str, String)>;

/// Every series the daemon exports.
pub(crate) struct Metrics {
    registry: Registry,
    /// Serialises scrapes: the gauges below are set from the gate's state just before
    /// encoding.
    scrape: Mutex<()>,
    named_tools: BTreeSet<String>,
    checks: Family<Labels, Counter>,
    outcomes: Family<Labels, Counter>,
    reserved: Counter,
    settled: Counter,
    rate_limited: Counter,
    check_seconds: Histogram,
    commit_seconds: Histogram,
    runs_open: Gauge,
    runs: Family<Labels, Gauge>,
    breakers: Family<Labels, Gauge>,
    held: Gauge,
    entries: Gauge,
    bytes: Gauge,
    round_trips: Counter,
}

/// The gate's state at a scrape.
pub(crate) struct Scraped {
    /// Runs by state (`running`, `paused`, `stopped`, ...), each state a gate code.
    pub runs_by_state: Vec<(&'static str, i64)>,
    /// Open runs.
    pub open: i64,
    /// Nanodollars held by open reservations, over all runs.
    pub held_nanos: i64,
    /// Breakers by state (`closed`, `open`, `half_open`).
    pub breakers: [(&'static str, i64); 3],
    /// Entries in the ledger.
    pub entries: i64,
    /// Bytes of the ledger's log on disk.
    pub bytes: i64,
    /// PostgreSQL round trips so far (0 for the embedded store).
    pub round_trips: u64,
}

impl Metrics {
    pub fn new(named_tools: BTreeSet<String>) -> Metrics {
        let mut registry = Registry::with_prefix("tally");
        let checks = Family::<Labels, Counter>::default();
        registry.register(
            "checks",
            "Checks decided, by decision, reason (none for an allow) and tool (a tool the policy names, else other)",
            checks.clone(),
        );
        let outcomes = Family::<Labels, Counter>::default();
        registry.register(
            "outcomes",
            "Outcomes reported for allowed calls, by status",
            outcomes.clone(),
        );
        let reserved = Counter::default();
        registry.register(
            "spend_reserved_nanos",
            "Nanodollars (1e-9 USD) reserved by allowed checks",
            reserved.clone(),
        );
        let settled = Counter::default();
        registry.register(
            "spend_settled_nanos",
            "Nanodollars (1e-9 USD) settled by reported outcomes",
            settled.clone(),
        );
        let rate_limited = Counter::default();
        registry.register(
            "rate_limited_requests",
            "Agent requests refused by the per-peer rate limit (429)",
            rate_limited.clone(),
        );
        // 50 us to ~1.6 s.
        let check_seconds = Histogram::new(exponential_buckets(0.00005, 2.0, 16));
        registry.register_with_unit(
            "check_duration",
            "Time from a check's body read to its durable answer",
            Unit::Seconds,
            check_seconds.clone(),
        );
        let commit_seconds = Histogram::new(exponential_buckets(0.00005, 2.0, 16));
        registry.register_with_unit(
            "ledger_sync_duration",
            "Time of each flush and fsync of the ledger's log (a group commit)",
            Unit::Seconds,
            commit_seconds.clone(),
        );
        let runs_open = Gauge::default();
        registry.register("runs_open", "Runs not stopped", runs_open.clone());
        let runs = Family::<Labels, Gauge>::default();
        registry.register("runs", "Runs by state", runs.clone());
        let breakers = Family::<Labels, Gauge>::default();
        registry.register(
            "breakers",
            "Downstream tools' circuit breakers by state",
            breakers.clone(),
        );
        let held = Gauge::default();
        registry.register(
            "held_nanos",
            "Nanodollars (1e-9 USD) held by open reservations, over all runs",
            held.clone(),
        );
        let entries = Gauge::default();
        registry.register("ledger_entries", "Entries in the ledger", entries.clone());
        let bytes = Gauge::default();
        registry.register_with_unit(
            "ledger_log",
            "Size of the ledger's log on disk",
            Unit::Bytes,
            bytes.clone(),
        );
        let round_trips = Counter::default();
        registry.register(
            "backend_round_trips",
            "Round trips to the PostgreSQL state backend (0 with the embedded store)",
            round_trips.clone(),
        );
        Metrics {
            registry,
            scrape: Mutex::new(()),
            named_tools,
            checks,
            outcomes,
            reserved,
            settled,
            rate_limited,
            check_seconds,
            commit_seconds,
            runs_open,
            runs,
            breakers,
            held,
            entries,
            bytes,
            round_trips,
        }
    }

    /// The label a tool gets: its name if the policy names it, else `other`.
    pub fn tool_label(&self, tool: &str) -> String {
        if self.named_tools.contains(tool) {
            tool.to_owned()
        } else {
            "other".to_owned()
        }
    }

    pub fn check(&self, decision: &'static str, reason: &'static str, tool: &str, secs: f64) {
        self.checks
            .get_or_create(&vec![
                ("decision", decision.to_owned()),
                ("reason", reason.to_owned()),
                ("tool", self.tool_label(tool)),
            ])
            .inc();
        self.check_seconds.observe(secs);
    }

    pub fn reserved(&self, nanos: u64) {
        self.reserved.inc_by(nanos);
    }

    pub fn outcome(&self, status: &'static str, settled_nanos: Option<u64>) {
        self.outcomes
            .get_or_create(&vec![("status", status.to_owned())])
            .inc();
        if let Some(c) = settled_nanos {
            self.settled.inc_by(c);
        }
    }

    pub fn rate_limited(&self) {
        self.rate_limited.inc();
    }

    pub fn synced(&self, secs: f64) {
        self.commit_seconds.observe(secs);
    }

    /// The text exposition of every series, the gauges set from `scraped`.
    pub fn encode(&self, scraped: &Scraped) -> String {
        let _one = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        self.runs.clear();
        for (state, n) in &scraped.runs_by_state {
            self.runs
                .get_or_create(&vec![("state", (*state).to_owned())])
                .set(*n);
        }
        self.runs_open.set(scraped.open);
        self.held.set(scraped.held_nanos);
        for (state, n) in scraped.breakers {
            self.breakers
                .get_or_create(&vec![("state", state.to_owned())])
                .set(n);
        }
        self.entries.set(scraped.entries);
        self.bytes.set(scraped.bytes);
        let seen = self.round_trips.get();
        self.round_trips
            .inc_by(scraped.round_trips.saturating_sub(seen));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
