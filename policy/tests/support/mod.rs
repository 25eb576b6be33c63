//! A small simulator: runs and tools folded through `apply`, calls asked through `decide`,
//! with every decision checked for purity, determinism and a valid record.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use tally_policy::{
    apply, decide, Call, Decided, Inconsistency, Now, Policy, RunState, ToolState, Verdict, View,
    ViewMut,
};
use tally_record::decision::{args_digest, policy_digest};
use tally_record::{Decision, Effect, Kind, Reason};

/// A policy that answers every refusal with its own reason (no `require_approval`).
pub const NO_ASK: &str = "[approvals]\nask_on = []\n";

/// The time of a decision at run time `at_ms` (the corpus and the tests use one clock).
pub fn now(at_ms: u64) -> Now {
    Now {
        wall_ms: 1_000_000u64.saturating_add(at_ms),
        at_ms: Some(at_ms),
    }
}

/// A decision from JSON, as the ledger would take it: parsed strictly and validated.
pub fn record(v: &Value) -> Decision {
    let d = Decision::from_json(&v.to_string())
        .unwrap_or_else(|e| panic!("test record does not parse: {e}: {v}"));
    d.validate()
        .unwrap_or_else(|e| panic!("test record is not valid: {e}: {v}"));
    d
}

/// A call of run `r1`.
pub fn call(tool: &str, effect: Effect, args: Value) -> Call {
    Call {
        run: "r1".into(),
        tool: tool.into(),
        effect: Some(effect),
        args_digest: Some(args_digest(&args)),
        ..Call::default()
    }
}

/// A call of run `r1` naming its logical operation.
pub fn op_call(tool: &str, operation: &str, effect: Effect, args: Value) -> Call {
    Call {
        operation: Some(operation.into()),
        ..call(tool, effect, args)
    }
}

/// Runs, tools and the policy they are decided under.
pub struct Sim {
    pub policy: Policy,
    pub digest: String,
    pub runs: BTreeMap<String, RunState>,
    pub tools: BTreeMap<String, ToolState>,
}

impl Sim {
    /// A simulator under the policy `toml` (checked as `tally policy check` would).
    pub fn new(toml: &str) -> Sim {
        Sim {
            policy: Policy::from_toml(toml).unwrap_or_else(|e| panic!("test policy: {e}")),
            digest: policy_digest(toml),
            runs: BTreeMap::new(),
            tools: BTreeMap::new(),
        }
    }

    /// A simulator with run `r1` started at 0 with `budget`.
    pub fn with_run(toml: &str, budget: Value) -> Sim {
        let mut sim = Sim::new(toml);
        sim.start("r1", budget);
        sim
    }

    /// Start `run` at 0 with `budget`.
    pub fn start(&mut self, run: &str, budget: Value) {
        let found =
            self.apply_json(json!({"run": run, "kind": "start", "at_ms": 0, "budget": budget}));
        assert_eq!(found, vec![], "start of {run}");
    }

    /// The state of `run`.
    pub fn run(&self, run: &str) -> &RunState {
        self.runs.get(run).unwrap_or_else(|| panic!("no run {run}"))
    }

    /// Fold one decision (its `at_ms` gives the time) into its run and tool.
    pub fn apply(&mut self, d: &Decision) -> Vec<Inconsistency> {
        let at = d.at_ms.expect("test records give at_ms");
        let run = self
            .runs
            .entry(d.run.clone())
            .or_insert_with(|| RunState::new(&d.run));
        let tool_name = match d.kind() {
            Kind::Outcome => d.attempt.and_then(|a| run.tool_of(a)).map(str::to_owned),
            Kind::Allow | Kind::Deny => d.tool.clone(),
            _ => None,
        };
        let tool = tool_name.map(|t| self.tools.entry(t).or_default());
        apply(
            &self.policy,
            ViewMut {
                run,
                tool,
                credential: None,
                parent: None,
                continued: None,
                principal: None,
            },
            d,
            now(at),
        )
    }

    /// Fold one decision given as JSON.
    pub fn apply_json(&mut self, v: Value) -> Vec<Inconsistency> {
        let d = record(&v);
        self.apply(&d)
    }

    /// Decide `call` at run time `at`, without changing anything. Checks on the way that
    /// `decide` is pure and deterministic and that its record is a valid decision.
    pub fn decide(&self, call: &Call, at: u64) -> Decided {
        let run = self.run(&call.run);
        let tool = self.tools.get(&call.tool);
        let (run_before, tool_before) = (run.clone(), tool.cloned());
        let view = View {
            run,
            tool,
            credential: None,
            family: Default::default(),
            principal: None,
        };
        let first = decide(&self.policy, &self.digest, view, call, now(at));
        let second = decide(&self.policy, &self.digest, view, call, now(at));
        assert_eq!(first, second, "decide is not deterministic");
        assert_eq!(run, &run_before, "decide changed the run");
        assert_eq!(tool.cloned(), tool_before, "decide changed the tool");
        first
            .record
            .validate()
            .unwrap_or_else(|e| panic!("decide's record is not valid: {e}: {:?}", first.record));
        let want = match first.verdict {
            Verdict::Allow => Kind::Allow,
            Verdict::Deny | Verdict::RequireApproval => Kind::Deny,
        };
        assert_eq!(
            first.record.kind,
            Some(want),
            "record kind of {:?}",
            first.verdict
        );
        assert_eq!(first.record.at_ms, Some(at));
        first
    }

    /// Decide `call` at `at` and append (apply) the record, as the gate does.
    pub fn ask(&mut self, call: &Call, at: u64) -> Decided {
        let decided = self.decide(call, at);
        let found = self.apply(&decided.record);
        assert_eq!(
            found,
            vec![],
            "applying the gate's own decision {:?}",
            decided.record
        );
        decided
    }

    /// Ask, require an allow, and return its attempt number.
    pub fn allow(&mut self, call: &Call, at: u64) -> u64 {
        let decided = self.ask(call, at);
        assert_eq!(
            decided.verdict,
            Verdict::Allow,
            "expected an allow at {at}, got {:?} ({:?})",
            decided.reason(),
            decided.record.retry_after_ms
        );
        decided.record.attempt.expect("an allow names its attempt")
    }

    /// Ask and require a refusal with `reason` (the record's own reason).
    pub fn refused(&mut self, call: &Call, at: u64, reason: Reason) -> Decided {
        let decided = self.decide(call, at);
        assert_ne!(
            decided.verdict,
            Verdict::Allow,
            "expected {reason} at {at}, got an allow"
        );
        assert_eq!(decided.reason(), Some(reason), "refusal at {at}");
        assert_eq!(decided.record.attempt, None, "a refusal uses no attempt");
        let found = self.apply(&decided.record);
        assert_eq!(found, vec![]);
        decided
    }

    /// Report an outcome for `attempt` of `run` at `at`; `extra` adds fields.
    pub fn outcome(
        &mut self,
        run: &str,
        attempt: u64,
        status: &str,
        at: u64,
        extra: Value,
    ) -> Vec<Inconsistency> {
        let mut v = json!({"run": run, "kind": "outcome", "at_ms": at, "attempt": attempt, "status": status});
        if let (Value::Object(m), Value::Object(e)) = (&mut v, extra) {
            m.extend(e);
        }
        self.apply_json(v)
    }
}
