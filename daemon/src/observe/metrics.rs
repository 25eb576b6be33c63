//! The daemon's Prometheus metrics (docs/OPERATOR.md lists every series), in the text
//! exposition format through `prometheus-client`.
//!
//! No label value is a string an agent chose: a tool is labelled with its name only when
//! the policy names it exactly (`Policy::named_tools`, and the upstreams' names: the
//! proxy's calls are their upstream's), every other tool is `other`; an upstream and a
//! model only as the policy names and prices them ([`Upstreams`]), else `other`;
//! decisions, reasons and statuses are closed sets of the gate's own codes; run names are
//! never labels (an agent could otherwise grow the series without bound).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
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
    overruns: Counter,
    overrun_nanos: Counter,
    rate_limited: Counter,
    mcp_refused_connections: Counter,
    /// `initialize`s the MCP gateway refused, by the bound on sessions they were over
    /// (`tally_mcp::gateway::SessionBound`).
    mcp_refused_sessions: Family<Labels, Counter>,
    check_seconds: Histogram,
    commit_seconds: Histogram,
    runs_open: Gauge,
    runs: Family<Labels, Gauge>,
    breakers: Family<Labels, Gauge>,
    held: Gauge,
    entries: Gauge,
    bytes: Gauge,
    round_trips: Counter,
    /// Key calls refused, by a reason of [`tally_proxy::key_spend::KeyRefusal`] only (never
    /// a key's id: a label per key would grow with whatever keys an agent makes up).
    key_refusals: Family<Labels, Counter>,
    lease_events: Family<Labels, Counter>,
    breaker_outcomes_unflushed: Gauge,
    upstreams: Upstreams,
    upstream_checks: Family<Labels, Counter>,
    upstream_reserved: Family<Labels, Counter>,
    upstream_settled: Family<Labels, Counter>,
    upstream_tokens: Family<Labels, Counter>,
    upstream_web_searches: Family<Labels, Counter>,
    /// The labels of each proxied attempt not yet settled, so that its outcome (which
    /// names no upstream) is counted under its call's upstream and model.
    open_calls: Mutex<OpenCalls>,
}

/// A proxied call's labels: its upstream and model as the policy names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Call {
    pub upstream: String,
    pub model: String,
}

impl Call {
    fn labels(&self) -> Labels {
        vec![
            ("upstream", self.upstream.clone()),
            ("model", self.model.clone()),
        ]
    }
}

/// The upstreams the policy names, with the model ids it prices for each: the only
/// values the `upstream` and `model` labels take (besides `other`, and `none` for an
/// `http` upstream, whose calls have no model).
pub(crate) struct Upstreams {
    kinds: BTreeMap<String, tally_policy::UpstreamKind>,
    prices: tally_policy::Prices,
}

impl Upstreams {
    pub fn of(policy: &tally_policy::Policy) -> Upstreams {
        Upstreams {
            kinds: policy
                .upstreams
                .iter()
                .map(|(n, u)| (n.clone(), u.kind))
                .collect(),
            prices: policy.prices.clone(),
        }
    }

    /// The labels of a call to `upstream` that names `model` (as the agent sent it).
    pub fn call(&self, upstream: &str, model: Option<&str>) -> Call {
        let Some(kind) = self.kinds.get(upstream) else {
            return Call {
                upstream: OTHER.into(),
                model: OTHER.into(),
            };
        };
        let model = if *kind == tally_policy::UpstreamKind::Http {
            "none".to_owned()
        } else {
            model
                .and_then(|m| self.priced(*kind, upstream, m))
                .unwrap_or_else(|| OTHER.to_owned())
        };
        Call {
            upstream: upstream.to_owned(),
            model,
        }
    }

    /// The id of the price `model` is charged at on `upstream` (of `kind`), by the rule
    /// the proxy charges it by ([`tally_policy::Prices::priced`]: a Bedrock id under its
    /// version and geography rules): a price's own id, also for an id the price covers
    /// under another name, or None if it is not priced.
    fn priced(
        &self,
        kind: tally_policy::UpstreamKind,
        upstream: &str,
        model: &str,
    ) -> Option<String> {
        let price = self.prices.priced(kind, upstream, model)?;
        let models = &self.prices.0.get(upstream)?.models;
        if models.contains_key(model) {
            return Some(model.to_owned());
        }
        // The price entry found is one of the policy's own: its key is the label.
        models
            .iter()
            .find(|(_, p)| std::ptr::eq(*p, price))
            .map(|(k, _)| k.clone())
    }
}

const OTHER: &str = "other";

/// Proxied attempts not yet settled, oldest first past [`MAX_OPEN_CALLS`].
#[derive(Default)]
struct OpenCalls {
    by: HashMap<(String, u64), Call>,
    order: VecDeque<(String, u64)>,
}

/// Proxied attempts whose labels are kept until their outcome: beyond this many held at
/// once the oldest is forgotten (its settlement is then counted under `other`).
const MAX_OPEN_CALLS: usize = 100_000;

impl OpenCalls {
    fn insert(&mut self, key: (String, u64), call: Call) {
        while self.by.len() >= MAX_OPEN_CALLS {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            self.by.remove(&old);
        }
        if self.by.insert(key.clone(), call).is_none() {
            self.order.push_back(key);
        }
        // Keys settled meanwhile are dropped from the front as they come up.
        while self.order.front().is_some_and(|k| !self.by.contains_key(k)) {
            self.order.pop_front();
        }
    }
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
    /// Key calls refused so far, by reason (none without the proxy's keys).
    pub key_refusals: Vec<(&'static str, u64)>,
    /// Lease events of this holder so far, by event (none without `--leases`).
    pub lease_events: Vec<(&'static str, u64)>,
    /// Outcomes this holder's breaker views keep, not yet in the tools' rows (0
    /// without `--leases`).
    pub breaker_outcomes_unflushed: u64,
}

impl Metrics {
    /// Every series registered, with its help text, in the order `/metrics` lists them.
    // Long: one registration per metric beside its name and help text, read as a table;
    // split, a name would sit apart from the series it registers.
    pub fn new(policy: &tally_policy::Policy) -> Metrics {
        let mut named_tools = policy.named_tools();
        named_tools.extend(policy.upstreams.keys().cloned());
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
            "Outcomes recorded for allowed calls (reported, or observed by the proxy), by status",
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
            "Nanodollars (1e-9 USD) settled by recorded outcomes (reported, or observed by the proxy)",
            settled.clone(),
        );
        let overruns = Counter::default();
        registry.register(
            "overruns",
            "Outcomes that settled above their attempt's reservation (the upstream billed more than the gate reserved: the run spends nothing more until a human grants it)",
            overruns.clone(),
        );
        let overrun_nanos = Counter::default();
        registry.register(
            "overrun_nanos",
            "Nanodollars (1e-9 USD) settled above the reservations of the calls that overran",
            overrun_nanos.clone(),
        );
        let upstream_checks = Family::<Labels, Counter>::default();
        registry.register(
            "upstream_checks",
            "The proxy's checks, by decision, upstream and model (as the policy names and prices them, else other; none for an http upstream)",
            upstream_checks.clone(),
        );
        let upstream_reserved = Family::<Labels, Counter>::default();
        registry.register(
            "upstream_spend_reserved_nanos",
            "Nanodollars (1e-9 USD) reserved by the proxy's allowed calls, by upstream and model",
            upstream_reserved.clone(),
        );
        let upstream_settled = Family::<Labels, Counter>::default();
        registry.register(
            "upstream_spend_settled_nanos",
            "Nanodollars (1e-9 USD) settled by the proxy's observed outcomes, by upstream and model",
            upstream_settled.clone(),
        );
        let upstream_tokens = Family::<Labels, Counter>::default();
        registry.register(
            "upstream_tokens",
            "Tokens the upstreams reported for the proxy's calls, by upstream, model and price class (input, cached, cache_write, cache_write_1h, output)",
            upstream_tokens.clone(),
        );
        let upstream_web_searches = Family::<Labels, Counter>::default();
        registry.register(
            "upstream_web_searches",
            "Server-side web searches the upstreams reported for the proxy's calls, by upstream and model",
            upstream_web_searches.clone(),
        );
        let rate_limited = Counter::default();
        registry.register(
            "rate_limited_requests",
            "Agent requests refused by the per-peer rate limit (429)",
            rate_limited.clone(),
        );
        let mcp_refused_connections = Counter::default();
        registry.register(
            "mcp_refused_connections",
            "Connections the MCP gateway (tally serve --mcp-listen) refused over its bound (--mcp-max-connections): answered 503, or closed unanswered while too many refusals were being written",
            mcp_refused_connections.clone(),
        );
        let mcp_refused_sessions = Family::<Labels, Counter>::default();
        registry.register(
            "mcp_refused_sessions",
            "initialize requests the MCP gateway (tally serve --mcp-listen) refused over a bound on sessions, by bound: gateway (--mcp-max-sessions, answered 503), credential (one run token's or key's, --mcp-max-sessions-per-credential, answered 429)",
            mcp_refused_sessions.clone(),
        );
        for bound in ["gateway", "credential"] {
            let _ = mcp_refused_sessions.get_or_create(&vec![("bound", bound.to_owned())]);
        }
        // 50 us to ~1.6 s.
        let check_seconds = Histogram::new(exponential_buckets(0.00005, 2.0, 16));
        registry.register_with_unit(
            "check_duration",
            "Time from a check reaching the gate to its durable answer (the agent socket's and the proxy's)",
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
        let key_refusals = Family::<Labels, Counter>::default();
        registry.register(
            "key_refusals",
            "Calls with a key (docs/KEYS.md) refused by the key itself, by reason: invalid_key, key_revoked, budget_exceeded (its budget per day), runs_exceeded (its runs per day), principal_unbounded, invalid_task",
            key_refusals.clone(),
        );
        let lease_events = Family::<Labels, Counter>::default();
        registry.register(
            "lease_events",
            "This daemon's leased slices (tally serve --leases), by event: granted, renewed, returned, reclaimed (expired slices of any holder it reclaimed), lost, refused (a use no slice covered); and its views of the tools' breakers: breaker_flushed (a tool's outcomes folded into its row), breaker_flush_failed (kept for the next tick), breaker_flush_unsure (let go, the flush's COMMIT unanswered), breaker_refresh_failed (the rows not read again), breaker_unreadable (a row the decoder refused); and its group commit of decisions at home: group_commits (transactions committed), group_decisions (decisions committed in them), group_refused (decisions refused by a group that did not commit, or because their run was taken back), group_unsure (of those, decisions whose group's COMMIT went unanswered: they may have been recorded); and the lease guards' refusals: guard_taken_back (a decision refused because its run's home was taken back, taken over or its epoch fenced), guard_stale_copy (one made on a run's copy a failed group commit let go)",
            lease_events.clone(),
        );
        let breaker_outcomes_unflushed = Gauge::default();
        registry.register(
            "breaker_outcomes_unflushed",
            "Outcomes this daemon's views of the tools' breakers keep (tally serve --leases), not yet folded into the tools' rows: bounded per tool while flushes succeed, growing while they fail",
            breaker_outcomes_unflushed.clone(),
        );
        for r in tally_proxy::key_spend::KeyRefusal::ALL {
            let _ = key_refusals.get_or_create(&vec![("reason", r.as_str().to_owned())]);
        }
        Metrics {
            key_refusals,
            lease_events,
            breaker_outcomes_unflushed,
            registry,
            scrape: Mutex::new(()),
            named_tools,
            checks,
            outcomes,
            reserved,
            settled,
            overruns,
            overrun_nanos,
            rate_limited,
            mcp_refused_connections,
            mcp_refused_sessions,
            check_seconds,
            commit_seconds,
            runs_open,
            runs,
            breakers,
            held,
            entries,
            bytes,
            round_trips,
            upstreams: Upstreams::of(policy),
            upstream_checks,
            upstream_reserved,
            upstream_settled,
            upstream_tokens,
            upstream_web_searches,
            open_calls: Mutex::new(OpenCalls::default()),
        }
    }

    /// The labels of the proxy's check `req`: its tool is the upstream, its preview the
    /// model it names.
    pub fn call_of(&self, req: &tally_gate::CheckRequest) -> Call {
        self.upstreams.call(&req.tool, req.args_preview.as_deref())
    }

    /// A proxied check's answer: counted by upstream and model, and an allowed attempt's
    /// labels kept for its outcome.
    pub fn upstream_check(
        &self,
        call: &Call,
        decision: &'static str,
        run: &str,
        attempt: Option<u64>,
        reserved_nanos: Option<u64>,
    ) {
        let mut l = call.labels();
        l.push(("decision", decision.to_owned()));
        self.upstream_checks.get_or_create(&l).inc();
        if let (Some(a), Some(n)) = (attempt, reserved_nanos) {
            self.upstream_reserved
                .get_or_create(&call.labels())
                .inc_by(n);
            self.open_calls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert((run.to_owned(), a), call.clone());
        }
    }

    /// A proxied attempt's settlement (an outcome of an attempt that is not the proxy's
    /// changes nothing here), with the usage the upstream reported. Its labels are
    /// forgotten once it is settled.
    pub fn upstream_outcome(
        &self,
        run: &str,
        attempt: u64,
        settled_nanos: Option<u64>,
        usage: Option<&tally_ledger::Usage>,
    ) {
        let Some(n) = settled_nanos else {
            // Held still (`unknown`, `timeout`): a later outcome settles it.
            return;
        };
        let call = self
            .open_calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by
            .remove(&(run.to_owned(), attempt));
        let Some(call) = call else {
            return;
        };
        self.upstream_settled
            .get_or_create(&call.labels())
            .inc_by(n);
        let Some(u) = usage else {
            return;
        };
        for (class, n) in [
            ("input", u.input_tokens),
            ("cached", u.cached_tokens),
            ("cache_write", u.cache_write_tokens),
            ("cache_write_1h", u.cache_write_1h_tokens),
            ("output", u.output_tokens),
        ] {
            if let Some(n) = n {
                let mut l = call.labels();
                l.push(("class", class.to_owned()));
                self.upstream_tokens.get_or_create(&l).inc_by(n);
            }
        }
        if let Some(n) = u.web_searches {
            self.upstream_web_searches
                .get_or_create(&call.labels())
                .inc_by(n);
        }
    }

    /// The label a tool gets: its name if the policy names it, else `other`.
    pub fn tool_label(&self, tool: &str) -> String {
        if self.named_tools.contains(tool) {
            tool.to_owned()
        } else {
            OTHER.to_owned()
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

    pub fn outcome(&self, status: &'static str, settled_nanos: Option<u64>, overrun: Option<u64>) {
        self.outcomes
            .get_or_create(&vec![("status", status.to_owned())])
            .inc();
        if let Some(c) = settled_nanos {
            self.settled.inc_by(c);
        }
        if let Some(o) = overrun {
            self.overruns.inc();
            self.overrun_nanos.inc_by(o);
        }
    }

    pub fn rate_limited(&self) {
        self.rate_limited.inc();
    }

    /// The MCP gateway refused a connection over its bound.
    pub fn mcp_refused_connection(&self) {
        self.mcp_refused_connections.inc();
    }

    /// The MCP gateway refused an `initialize` over a bound on sessions.
    pub fn mcp_refused_session(&self, bound: tally_mcp::gateway::SessionBound) {
        self.mcp_refused_sessions
            .get_or_create(&vec![("bound", bound.as_str().to_owned())])
            .inc();
    }

    pub fn synced(&self, secs: f64) {
        self.commit_seconds.observe(secs);
    }

    /// The `serve --notify` delivery series (only when notifications are on).
    pub fn register_notify(&mut self, c: &crate::notify::Counters) {
        let r = &mut self.registry;
        r.register(
            "notify_delivered",
            "Approval events a --notify receiver answered 2xx to",
            c.delivered.clone(),
        );
        r.register(
            "notify_failed_attempts",
            "Attempts to deliver an approval event that failed (retried with back-off)",
            c.failed.clone(),
        );
        r.register(
            "notify_dropped",
            "Approval events never delivered, by why (queue_full: dropped as the oldest of a full queue; gave_up: every attempt failed)",
            c.dropped.clone(),
        );
        r.register(
            "notify_queue_depth",
            "Approval events waiting in the receivers' queues",
            c.depth.clone(),
        );
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
        for (reason, n) in &scraped.key_refusals {
            let c = self
                .key_refusals
                .get_or_create(&vec![("reason", (*reason).to_owned())]);
            c.inc_by(n.saturating_sub(c.get()));
        }
        for (event, n) in &scraped.lease_events {
            let c = self
                .lease_events
                .get_or_create(&vec![("event", (*event).to_owned())]);
            c.inc_by(n.saturating_sub(c.get()));
        }
        self.breaker_outcomes_unflushed
            .set(i64::try_from(scraped.breaker_outcomes_unflushed).unwrap_or(i64::MAX));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bedrock_id_is_labelled_with_the_price_it_is_charged_at() {
        let policy = tally_policy::Policy::from_toml(
            r#"
[upstreams.b]
url = "https://bedrock-runtime.us-east-1.amazonaws.com"
kind = "bedrock"
credential = "aws"
aws_region = "us-east-1"

[upstreams.o]
url = "https://api.openai.com"
kind = "openai"
credential = "o"

[prices.b."anthropic.claude-3-5-haiku"]
input_per_mtok = "0.80"
output_per_mtok = "4"

[prices.o."us.gpt-4o-v1"]
input_per_mtok = "1"
output_per_mtok = "1"
"#,
        )
        .expect("policy");
        let u = Upstreams::of(&policy);
        let model = |up: &str, m: &str| u.call(up, Some(m)).model;
        for id in [
            "anthropic.claude-3-5-haiku",
            "anthropic.claude-3-5-haiku-20241022-v1:0",
            "us.anthropic.claude-3-5-haiku-20241022-v1:0",
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-5-haiku-20241022-v1:0",
        ] {
            assert_eq!(model("b", id), "anthropic.claude-3-5-haiku", "{id}");
        }
        // What the proxy would refuse or not price is `other`.
        assert_eq!(model("b", "xx.anthropic.claude-3-5-haiku-v1:0"), OTHER);
        assert_eq!(model("b", "Anthropic.claude-3-5-haiku"), OTHER);
        // Bedrock's rules are Bedrock's only: another upstream's ids are as priced.
        assert_eq!(model("o", "us.gpt-4o-v1"), "us.gpt-4o-v1");
        assert_eq!(model("o", "gpt-4o"), OTHER);
    }
}
