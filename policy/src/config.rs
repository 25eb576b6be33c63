//! The policy: one TOML file, every key optional with a documented default, unknown keys
//! refused. Its digest (BLAKE3 of the exact text) names it in every decision.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tally_record::decision::{policy_digest, Budget, MAX_POLICY_BYTES};
use tally_record::{Effect, Reason};

use ed25519_dalek::VerifyingKey;

use crate::error::PolicyError;
pub use crate::principals::{PrincipalLimits, Principals};

mod defaults;

/// A policy as the gate enforces it. Parse with [`Policy::from_toml`]; every field has
/// the default documented on it (and in `docs/POLICY.md`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// The most a run may be granted, per dimension; a start may ask for less, never
    /// more. Defaults: attempts 50, deadline 1 h, spend $10.00, side effects 20, polls 30
    /// per remote operation, depth 3. Spend is written `spend_usd = "12.50"` (exact
    /// dollars) or `spend_cents = 1250`, and kept in nanodollars.
    #[serde(with = "crate::prices::budget")]
    pub ceiling: Budget,
    /// Attempts of one logical operation (its `operation`, else tool and arguments)
    /// between two `ok` outcomes, by effect class.
    pub retries: Retries,
    /// Loop breakers.
    pub loops: Loops,
    /// Polling rules (docs/GATE.md, how a budget is counted).
    pub polls: Polls,
    /// The circuit breaker each downstream tool has, shared by every run.
    pub breaker: Breaker,
    /// Token buckets and in-flight bounds.
    pub rate: Rate,
    /// What runs may reach.
    pub scope: ScopeRules,
    /// Who may approve, and which refusals a human may lift.
    pub approvals: Approvals,
    /// Per-credential ceilings and spend backstops, by credential name.
    pub credentials: BTreeMap<String, Credential>,
    /// Runs one uid may hold open at once (started, not stopped). Default 1,000: a flood
    /// of new run names is refused, never allowed to evict another run's counters.
    pub max_open_runs_per_uid: u64,
    /// Tool name -> its price per call, exact US dollars (`search = "0.002"`). A call
    /// of the tool reserves at least its price, whatever the caller declares.
    pub tool_prices: BTreeMap<String, crate::prices::Usd>,
    /// Principal budgets: what one uid may start and spend across all its runs per
    /// period (docs/GATE.md, "Principals"). Default: none.
    pub principals: Principals,
    /// The upstreams `tally serve`'s proxy forwards to, by name (docs/GATE.md,
    /// "Upstreams and prices"). Default: none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub upstreams: BTreeMap<String, crate::upstreams::Upstream>,
    /// What calls through the proxy cost, by upstream (read exactly from the text).
    #[serde(skip_serializing_if = "crate::upstreams::Prices::is_empty")]
    pub prices: crate::upstreams::Prices,
    /// The oldest a model price's `as_of` may be, days: `tally policy check` warns of an
    /// older price, or one with no `as_of` (docs/PROXY.md, "Importing prices"). Default:
    /// none (no warning). Prices are still enforced as written: this only warns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_price_age_days: Option<u64>,
    /// The MCP servers `tally serve --mcp-listen` serves through its gateway, by name
    /// (docs/MCP.md, "The HTTP gateway"). Default: none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub mcp: BTreeMap<String, crate::mcp_servers::McpServer>,
}

/// Attempts per logical operation, by effect class (defaults after RFC 9110 §9.2.2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Retries {
    /// Reads. Default 3.
    pub read: u64,
    /// Idempotent writes; beyond the first only with an idempotency key. Default 2.
    pub idempotent_write: u64,
    /// Non-idempotent writes. Default 1.
    pub non_idempotent_write: u64,
}

/// Loop breakers (docs/GATE.md). Polls answer to [`Polls`] instead.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Loops {
    /// Identical consecutive calls (same tool, same argument digest) allowed; the next
    /// is refused whatever the budget. Default 3 (the fourth is refused).
    pub identical_consecutive: u64,
    /// Identical calls allowed among the run's last `identical_window` calls. Default 5.
    pub identical_in_window: u64,
    /// The window for `identical_in_window`, in calls. Default 20.
    pub identical_window: u64,
    /// Calls to one tool allowed per run within `tool_window_ms`. Default 60.
    pub tool_calls: u64,
    /// The per-tool window, ms of run time. Default 60,000.
    pub tool_window_ms: u64,
    /// Calls alternating between two calls (A, B, A, B, ...) with no change of observed
    /// state allowed; the next is refused. Default 4.
    pub alternating: u64,
}

/// Polling (docs/GATE.md, how a budget is counted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Polls {
    /// The interval between polls of one operation when the upstream gave no
    /// Retry-After. Default 1,000 ms.
    pub interval_ms: u64,
    /// Scheduling tolerance: at least this many ms... Default 1,000.
    pub tolerance_ms: u64,
    /// ...or this percentage of the interval, whichever is larger. Default 10.
    pub tolerance_percent: u64,
    /// Polls of one remote operation in a row with no change of its observed state
    /// after which the next is refused (`poll_allowance_exhausted`): a job that never
    /// progresses. Default 0: off (polling that keeps its interval within its allowance
    /// is never a loop).
    pub stall_polls: u64,
}

/// A circuit breaker per downstream tool (closed, open, half-open).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Breaker {
    /// Consecutive failed outcomes (`error`, `timeout`) that open it. Default 5.
    pub failures: u64,
    /// How long it stays open, ms. Default 30,000.
    pub open_ms: u64,
    /// A half-open probe that has not reported within this many ms is taken as
    /// failed and the breaker opens again. Default 10,000.
    pub probe_timeout_ms: u64,
    /// Tools whose breaker opens after a number of failures of their own, by name
    /// (exact, or a prefix ending in `*`): an exact name wins, else the longest prefix
    /// that matches. 0 gives the tool no breaker: a tool with no shared downstream to
    /// protect (a coding agent's own shell, whose failing test runs are its work), whose
    /// failures only the run's retry and loop rules bound. Default: none.
    pub tools: BTreeMap<String, u64>,
}

impl Breaker {
    /// Consecutive failed outcomes that open `tool`'s breaker: its own
    /// (`[breaker.tools]`), else `failures`; `None` when the tool has no breaker.
    pub fn failures_for(&self, tool: &str) -> Option<u64> {
        let own = self.tools.get(tool).or_else(|| {
            self.tools
                .iter()
                .filter(|(pattern, _)| pattern.ends_with('*') && matches(pattern, tool))
                .max_by_key(|(pattern, _)| pattern.len())
                .map(|(_, n)| n)
        });
        match own.copied().unwrap_or(self.failures) {
            0 => None,
            n => Some(n),
        }
    }
}

/// Token buckets (rate per second, burst) and in-flight bounds. A rate of 0 disables
/// that bucket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Rate {
    /// Calls per second per run. Default 50.
    pub run_per_sec: u64,
    /// Burst per run. Default 100.
    pub run_burst: u64,
    /// Calls per second per credential. Default 0 (off).
    pub credential_per_sec: u64,
    /// Burst per credential. Default 0.
    pub credential_burst: u64,
    /// Calls per second per downstream tool, across every run. Default 200.
    pub tool_per_sec: u64,
    /// Burst per downstream tool. Default 400.
    pub tool_burst: u64,
    /// Calls in flight (allowed, no final outcome yet) per downstream tool. Default 64.
    pub tool_in_flight: u64,
    /// A call's longest time in flight when it gives none, ms. Default 60,000.
    pub call_timeout_ms: u64,
}

/// Scope: which tools and targets runs may reach.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScopeRules {
    /// If not empty, only these tools (exact names, or a prefix ending in `*`).
    pub tools: Vec<String>,
    /// Tools refused with `tool_blocked` (an approval can grant one).
    pub blocked: Vec<String>,
    /// If not empty, only these targets (hosts; exact, or `*.example.com`).
    pub targets: Vec<String>,
    /// Tools whose calls are recorded but use no attempt (retrieval, status reads).
    pub exempt: Vec<String>,
}

/// Approvals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Approvals {
    /// Approver name -> Ed25519 public key, 64 lowercase hex characters.
    pub approvers: BTreeMap<String, String>,
    /// Refusals answered `require_approval` (a human may lift them with a grant).
    /// Default: attempts_exhausted, reservation_insufficient, budget_exceeded,
    /// side_effect_limit_exceeded, tool_blocked, outcome_unknown_non_idempotent.
    pub ask_on: Vec<Reason>,
    /// The longest an approval may be valid, ms. Default 86,400,000 (a day).
    pub max_expiry_ms: u64,
    /// Continuations of a run stopped by a `stop`-action refusal that a chain of runs
    /// may make without a human: a budget is never refilled by restarting
    /// ([`crate::refill`]). Default 1.
    pub max_unapproved_continuations: u64,
}

/// One credential's limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "CredentialToml", into = "CredentialToml")]
pub struct Credential {
    /// Ceiling for runs started under it (replaces the policy's where given).
    pub ceiling: Budget,
    /// Spend across all its runs per period, nanodollars (a backstop behind run
    /// budgets), written `spend_usd_per_period` (exact dollars) or
    /// `spend_cents_per_period`.
    pub spend_nanos_per_period: Option<u64>,
    /// The period, ms. Default 86,400,000.
    pub period_ms: u64,
    /// If not empty, only these uids may start runs under the credential (a
    /// credential's ceiling is otherwise anyone's for the asking).
    pub uids: Vec<u32>,
}

/// A credential as the policy writes it (its spend in cents or exact dollars).
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
struct CredentialToml {
    #[serde(with = "crate::prices::budget")]
    ceiling: Budget,
    #[serde(skip_serializing_if = "Option::is_none")]
    spend_cents_per_period: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spend_usd_per_period: Option<crate::prices::Usd>,
    period_ms: u64,
    uids: Vec<u32>,
}

impl Default for CredentialToml {
    fn default() -> CredentialToml {
        Credential::default().into()
    }
}

impl TryFrom<CredentialToml> for Credential {
    type Error = String;

    fn try_from(t: CredentialToml) -> Result<Credential, String> {
        Ok(Credential {
            ceiling: t.ceiling,
            spend_nanos_per_period: crate::prices::period_spend(
                t.spend_cents_per_period,
                t.spend_usd_per_period,
            )?,
            period_ms: t.period_ms,
            uids: t.uids,
        })
    }
}

impl From<Credential> for CredentialToml {
    fn from(c: Credential) -> CredentialToml {
        CredentialToml {
            ceiling: c.ceiling,
            spend_cents_per_period: None,
            spend_usd_per_period: c
                .spend_nanos_per_period
                .map(|n| crate::prices::Usd(tally_record::money::Nanos(n))),
            period_ms: c.period_ms,
            uids: c.uids,
        }
    }
}

/// The most history a run keeps for its loop breakers, in calls.
pub const MAX_WINDOW: u64 = 256;

impl Policy {
    /// Parse and check a policy file's text. Every key is optional; unknown keys, wrong
    /// types and impossible values are errors that name the key.
    pub fn from_toml(text: &str) -> Result<Policy, PolicyError> {
        Policy::parse(text, true)
    }

    /// Parse a policy a ledger recorded: as [`Policy::from_toml`], except that a value
    /// that makes every run useless (a ceiling of 0 attempts, ...) but was accepted by
    /// earlier builds is taken as it was enforced, so an honest ledger still verifies.
    pub fn from_recorded(text: &str) -> Result<Policy, PolicyError> {
        Policy::parse(text, false)
    }

    fn parse(text: &str, new: bool) -> Result<Policy, PolicyError> {
        if text.len() > MAX_POLICY_BYTES {
            return Err(PolicyError::TooLong {
                len: text.len(),
                max: MAX_POLICY_BYTES,
            });
        }
        let de = toml::Deserializer::new(text);
        let mut policy: Policy = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let e = e.into_inner();
            let span = e.span().map(|s| (s.start, s.end));
            PolicyError::Toml {
                message: readable(e.message()),
                key: (path != "." && !path.is_empty()).then_some(path),
                line: span.map(|(start, _)| line_at(text, start)),
                span,
            }
        })?;
        // A `[ceiling]` that names some dimensions keeps the defaults of the others:
        // every dimension always has a ceiling (give a large number to lift one).
        let d = Policy::default().ceiling;
        let c = &mut policy.ceiling;
        c.attempts = c.attempts.or(d.attempts);
        c.deadline_ms = c.deadline_ms.or(d.deadline_ms);
        c.spend_nanos = c.spend_nanos.or(d.spend_nanos);
        c.side_effects = c.side_effects.or(d.side_effects);
        c.polls = c.polls.or(d.polls);
        c.depth = c.depth.or(d.depth);
        policy.prices = crate::upstreams::Prices::read(text)?;
        policy
            .check(new)
            .map_err(|(key, why)| PolicyError::Invalid {
                line: line_of(text, &key),
                key,
                why,
            })?;
        Ok(policy)
    }

    /// The model prices older than `max_price_age_days` on `today`, or with no
    /// `as_of` (none without a bound): what `tally policy check` warns of.
    pub fn stale_prices(&self, today: crate::dates::Date) -> Vec<crate::price_age::StalePrice> {
        crate::price_age::stale_prices(&self.prices, self.max_price_age_days, today)
    }

    /// The policy with every default filled in, as TOML (what `tally policy check` prints).
    pub fn to_toml(&self) -> String {
        // A struct of integers, strings, lists and maps always serializes.
        toml::to_string(self).unwrap_or_default()
    }

    /// Values that parse but cannot be enforced, or (`new`: a policy being put in force,
    /// not one a ledger recorded, see [`Policy::from_recorded`]) make every run useless:
    /// the key (a dotted path) and what to give instead.
    fn check(&self, new: bool) -> Result<(), (String, String)> {
        if new {
            self.check_useful()?;
        }
        self.check_rules()?;
        self.check_approvers()?;
        self.check_periods()?;
        self.check_upstreams(new)?;
        crate::mcp_servers::check(&self.mcp, new)?;
        if self.max_price_age_days == Some(0) {
            return Err((
                "max_price_age_days".into(),
                "must be at least 1 (days); leave it out for no warning".into(),
            ));
        }
        self.check_ask_on()
    }

    /// The loop, retry, breaker and rate rules: each can be met.
    fn check_rules(&self) -> Result<(), (String, String)> {
        let invalid = |key: &str, why: &str| Err((key.to_owned(), why.to_owned()));
        let l = &self.loops;
        let at_least_one = "must be at least 1";
        if l.identical_consecutive == 0 {
            return invalid("loops.identical_consecutive", at_least_one);
        }
        if l.alternating == 0 {
            return invalid("loops.alternating", at_least_one);
        }
        if l.identical_in_window == 0 {
            return invalid("loops.identical_in_window", at_least_one);
        }
        if l.identical_window > MAX_WINDOW {
            return invalid("loops.identical_window", "must be at most 256 calls");
        }
        for (key, n) in [
            ("retries.read", self.retries.read),
            ("retries.idempotent_write", self.retries.idempotent_write),
            (
                "retries.non_idempotent_write",
                self.retries.non_idempotent_write,
            ),
        ] {
            if n == 0 {
                return invalid(
                    key,
                    "is 0: no call of this class could be made; give at least 1 attempt",
                );
            }
        }
        if self.breaker.failures == 0 {
            return invalid("breaker.failures", at_least_one);
        }
        if self.breaker.tools.keys().any(|t| t.is_empty() || t == "*") {
            return invalid(
                "breaker.tools",
                "names a tool (exact, or a prefix ending in `*`): an empty name, or `*` alone, is none (set `breaker.failures` for every tool)",
            );
        }
        if self.rate.call_timeout_ms == 0 {
            return invalid("rate.call_timeout_ms", "must be at least 1 (ms)");
        }
        Ok(())
    }

    /// Each approver: a name and an Ed25519 public key.
    fn check_approvers(&self) -> Result<(), (String, String)> {
        let invalid = |key: &str, why: &str| Err((key.to_owned(), why.to_owned()));
        for (name, key) in &self.approvals.approvers {
            let ok = key.len() == 64
                && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
                && public_key(key).is_some();
            if !ok || name.is_empty() {
                return invalid(
                    &format!("approvals.approvers.{name}"),
                    "needs a name and an Ed25519 public key as 64 lowercase hex characters (the line `tally keygen --approver` prints)",
                );
            }
        }
        Ok(())
    }

    /// The credentials' and principals' budgets: a period each, principals named by uid.
    fn check_periods(&self) -> Result<(), (String, String)> {
        let invalid = |key: &str, why: &str| Err((key.to_owned(), why.to_owned()));
        for (name, c) in &self.credentials {
            if c.period_ms == 0 {
                return invalid(
                    &format!("credentials.{name}.period_ms"),
                    "must be at least 1 (ms)",
                );
            }
        }
        let named = self
            .principals
            .uid
            .iter()
            .map(|(k, l)| (format!("principals.uid.{k}"), Some(k), l));
        let default = self
            .principals
            .default
            .iter()
            .map(|l| ("principals.default".to_owned(), None, l));
        for (at, key, limits) in default.chain(named) {
            if key.is_some_and(|k| k.parse::<u32>().map(|u| u.to_string()) != Ok(k.clone())) {
                return invalid(
                    &at,
                    "is not a uid: name it in decimal (`[principals.uid.1000]`)",
                );
            }
            if limits.period_ms == 0 {
                return invalid(&format!("{at}.period_ms"), "must be at least 1 (ms)");
            }
        }
        Ok(())
    }

    /// The refusals a human is asked about: refusals, and ones a human can lift.
    fn check_ask_on(&self) -> Result<(), (String, String)> {
        let invalid = |key: &str, why: &str| Err((key.to_owned(), why.to_owned()));
        if self.approvals.ask_on.contains(&Reason::Completed) {
            return invalid("approvals.ask_on", "`completed` is not a refusal");
        }
        if self.approvals.ask_on.contains(&Reason::DeniedByApprover) {
            return invalid(
                "approvals.ask_on",
                "`denied_by_approver` is a human's answer already: asking again does not lift it",
            );
        }
        Ok(())
    }

    /// Upstreams and their prices: names that fit a URL path, valid URLs and lists, a
    /// price table for each model upstream's models and only for upstreams named (`new`:
    /// a policy being put in force, see [`crate::upstreams::Upstream::in_force_problem`]).
    fn check_upstreams(&self, new: bool) -> Result<(), (String, String)> {
        use crate::upstreams::UpstreamKind;
        for (name, u) in &self.upstreams {
            if !crate::upstreams::valid_name(name) {
                return Err((
                    format!("upstreams.{name}"),
                    "a name is one URL path segment: letters, digits, `_`, `-`, at most 64".into(),
                ));
            }
            if let Some((key, why)) = u.problem(new) {
                return Err((format!("upstreams.{name}.{key}"), why));
            }
            if let Some((d, m)) = u
                .deployments
                .iter()
                .find(|(_, m)| self.prices.model(name, m).is_none())
            {
                return Err((
                    format!("upstreams.{name}.deployments"),
                    format!("deployment `{d}` maps to model `{m}`, which has no [prices.{name}.\"{m}\"]: tally never forwards a call it cannot price"),
                ));
            }
        }
        for (name, p) in &self.prices.0 {
            let Some(u) = self.upstreams.get(name) else {
                return Err((
                    format!("prices.{name}"),
                    format!("prices an upstream the policy does not name: add [upstreams.{name}]"),
                ));
            };
            if u.kind == UpstreamKind::Http && !p.models.is_empty() {
                return Err((
                    format!("prices.{name}"),
                    "an `http` upstream is priced per route ([prices.NAME.routes.\"POST /path\"]) or by its cost_header, not per model".into(),
                ));
            }
            if u.kind != UpstreamKind::Http && !p.routes.is_empty() {
                return Err((
                    format!("prices.{name}.routes"),
                    "routes price `http` upstreams; a model upstream is priced per model".into(),
                ));
            }
        }
        Ok(())
    }

    /// Zero where nothing could run under it, refused in a policy being put in force: a
    /// ceiling of 0 attempts or a 0 ms deadline, no open runs, a per-tool bar of 0 calls,
    /// approvals valid for 0 ms (and, in [`Policy::check`], a class of 0 retries). Where
    /// zero means "none" (no side effects, polls, children or spend) or "off" (a rate, a
    /// stall count, an in-flight bound) it is a policy like any other.
    fn check_useful(&self) -> Result<(), (String, String)> {
        let invalid = |key: &str, why: &str| Err((key.to_owned(), why.to_owned()));
        let ceilings = std::iter::once(("ceiling".to_owned(), &self.ceiling)).chain(
            self.credentials
                .iter()
                .map(|(name, c)| (format!("credentials.{name}.ceiling"), &c.ceiling)),
        );
        for (at, ceiling) in ceilings {
            if ceiling.attempts == Some(0) {
                return invalid(
                    &format!("{at}.attempts"),
                    "is 0: a run could make no call at all; give at least 1",
                );
            }
            if ceiling.deadline_ms == Some(0) {
                return invalid(
                    &format!("{at}.deadline_ms"),
                    "is 0: every run would be over as it starts; give at least 1 (ms)",
                );
            }
        }
        if self.max_open_runs_per_uid == 0 {
            return invalid(
                "max_open_runs_per_uid",
                "is 0: no run could start; give at least 1",
            );
        }
        if self.loops.tool_calls == 0 {
            return invalid(
                "loops.tool_calls",
                "is 0: every call of every tool would be refused; give at least 1 (a large number lifts the per-tool bar)",
            );
        }
        if self.loops.tool_window_ms == 0 {
            return invalid("loops.tool_window_ms", "must be at least 1 (ms)");
        }
        if self.approvals.max_expiry_ms == 0 {
            return invalid(
                "approvals.max_expiry_ms",
                "is 0: no approval could be valid; give at least 1 (ms) (to stop asking, leave approvals.ask_on empty)",
            );
        }
        Ok(())
    }

    /// Attempts one logical operation may use between two `ok` outcomes.
    pub fn retries_for(&self, effect: Effect) -> u64 {
        match effect {
            Effect::Read => self.retries.read,
            Effect::IdempotentWrite => self.retries.idempotent_write,
            Effect::NonIdempotentWrite => self.retries.non_idempotent_write,
        }
    }

    /// The ceiling for a run under `credential`.
    pub fn ceiling_for(&self, credential: Option<&str>) -> Budget {
        let mut c = self.ceiling.clone();
        if let Some(cred) = credential.and_then(|n| self.credentials.get(n)) {
            let b = &cred.ceiling;
            c.attempts = b.attempts.or(c.attempts);
            c.deadline_ms = b.deadline_ms.or(c.deadline_ms);
            c.spend_nanos = b.spend_nanos.or(c.spend_nanos);
            c.side_effects = b.side_effects.or(c.side_effects);
            c.polls = b.polls.or(c.polls);
            c.depth = b.depth.or(c.depth);
        }
        c
    }

    /// The policy's price for one call of `tool` (`[tool_prices]`), if it names one.
    pub fn tool_price(&self, tool: &str) -> Option<tally_record::money::Nanos> {
        self.tool_prices.get(tool).map(|u| u.0)
    }

    /// What a call of `tool` reserves when its caller declares `declared` nanodollars:
    /// at least the tool's price, so declaring 0 is no way around a spend budget.
    pub fn reservation(&self, tool: &str, declared: u64) -> u64 {
        self.tool_price(tool)
            .map_or(declared, |p| declared.max(p.0))
    }

    /// The principal budget of `uid`: its own, else the default; `None` if the policy
    /// gives it none.
    pub fn principal(&self, uid: u32) -> Option<&PrincipalLimits> {
        self.principals
            .uid
            .get(&uid.to_string())
            .or(self.principals.default.as_ref())
    }

    /// Whether what `uid`'s runs may spend together is bounded: its principal budget
    /// caps their spend or the runs it may start (each run within the ceiling). A key
    /// starts a run per task, so a key is served only for a bounded principal
    /// (docs/KEYS.md).
    pub fn principal_bounded(&self, uid: u32) -> bool {
        self.principal(uid)
            .is_some_and(|p| p.spend_nanos.is_some() || p.runs.is_some())
    }

    /// Whether a human may lift a refusal with `reason` (it is in `approvals.ask_on`).
    pub fn asks(&self, reason: Reason) -> bool {
        self.approvals.ask_on.contains(&reason)
    }
}

/// A policy with the exact text it was read from: the text is what the ledger records
/// and what the digest covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The parsed policy.
    pub policy: Policy,
    /// Its exact text.
    pub text: String,
    /// BLAKE3 of the text, lowercase hex.
    pub digest: String,
}

impl Recorded {
    /// Parse `text`, keeping it.
    pub fn new(text: &str) -> Result<Recorded, PolicyError> {
        Ok(Recorded {
            policy: Policy::from_toml(text)?,
            text: text.to_owned(),
            digest: policy_digest(text),
        })
    }

    /// A policy text a ledger recorded ([`Policy::from_recorded`]), keeping it.
    pub fn from_ledger(text: &str) -> Result<Recorded, PolicyError> {
        Ok(Recorded {
            policy: Policy::from_recorded(text)?,
            text: text.to_owned(),
            digest: policy_digest(text),
        })
    }

    /// The built-in default policy (the empty text).
    pub fn default_policy() -> Recorded {
        Recorded {
            policy: Policy::default(),
            text: String::new(),
            digest: policy_digest(""),
        }
    }
}

/// Whether `name` matches a scope pattern: exact, or a prefix ending in `*`.
pub fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// Whether a target host matches: exact, or `*.domain` for any subdomain of it.
pub fn target_matches(pattern: &str, host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    let pattern = pattern.to_ascii_lowercase();
    match pattern.strip_prefix("*.") {
        Some(domain) => host
            .strip_suffix(domain)
            .is_some_and(|rest| rest.ends_with('.') && rest.len() > 1),
        None => host == pattern,
    }
}

/// The 1-based line of byte `at` in `text`.
fn line_at(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The line of the value at the dotted `key` in the policy's text, where it is written
/// there (a key left to its default has none).
fn line_of(text: &str, key: &str) -> Option<usize> {
    let doc = toml_edit::ImDocument::parse(text).ok()?;
    let mut item = doc.as_item();
    for part in key.split('.') {
        item = item.get(part)?;
    }
    item.span().map(|s| line_at(text, s.start))
}

/// The TOML parser's message in words a policy's author reads: integer types by name,
/// and for a quoted number, what to write instead.
fn readable(message: &str) -> String {
    let words = message
        .replace("expected u64", "expected a whole number")
        .replace("expected u32", "expected a whole number")
        .replace("expected i64", "expected a whole number");
    if words.starts_with("invalid type: string") && words.contains("expected a whole number") {
        format!("{words}: write the number without quotes")
    } else {
        words
    }
}

/// An Ed25519 public key from 64 hex characters (an approver's key, as the policy gives
/// it).
pub fn public_key(hex_key: &str) -> Option<VerifyingKey> {
    let bytes: [u8; 32] = hex::decode(hex_key).ok()?.try_into().ok()?;
    VerifyingKey::from_bytes(&bytes).ok()
}
