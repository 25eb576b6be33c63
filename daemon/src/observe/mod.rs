//! The operator's view (docs/OPERATOR.md): Prometheus metrics, a JSON line per decision,
//! trace ids on decisions, and the live page and its snapshot (`tally top` reads the same
//! snapshot). Read only: nothing here changes the gate or the ledger.
//!
//! How close a run is to a limit, and the order runs are shown in, come from the policy
//! core (`tally_policy::headroom`); nothing here counts a budget.

pub(crate) mod gated;
pub(crate) mod journal;
pub(crate) mod listen;
pub(crate) mod live;
pub(crate) mod metrics;
pub(crate) mod reader;
pub(crate) mod trace;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tally_wire::{
    BreakerState, LimitKey, ListedRun, LiveBreaker, LiveRefusals, LiveRun, LiveSnapshot, RunState,
};

use tally_gate::Standing;
use tally_ledger::money::Nanos;
use tally_policy::headroom::{closeness, order, Closeness};

/// How `tally serve` writes its log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogFormat {
    /// Lines for people: the start and stop lines, errors (no line per decision).
    #[default]
    Text,
    /// One JSON object per line: those, and one line per decision at `info` (run, tool,
    /// decision, reason, seq; never arguments).
    Json,
}

/// The process's log format: one daemon per process writes to its stderr, and the
/// errors logged where no handler state is at hand (the gate's unavailability) follow it.
static JSON_LOG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set the process's log format (`tally serve` does, once, before it listens).
pub(crate) fn set_log_format(format: LogFormat) {
    JSON_LOG.store(
        format == LogFormat::Json,
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// One line on stderr: as is, or as a JSON object `{ts_ms, level, msg}` when the log
/// format is JSON. A log that cannot be written (a full disk) is not an error.
pub(crate) fn log_line(level: &str, line: &str) {
    use std::io::Write;
    let mut out = if JSON_LOG.load(std::sync::atomic::Ordering::Relaxed) {
        serde_json::json!({"ts_ms": wall_ms(), "level": level, "msg": line}).to_string()
    } else {
        line.to_owned()
    };
    out.push('\n');
    let _ = std::io::stderr().write_all(out.as_bytes());
}

/// What the daemon observes, shared by the handlers.
pub(crate) struct Observer {
    pub metrics: metrics::Metrics,
    pub live: live::Live,
    pub log: LogFormat,
    /// Exports a span per check over OTLP (`serve --otlp-endpoint`).
    pub tracer: Option<trace::Exporter>,
    /// Bumped on every decision: the live page's stream sends a snapshot when it moved.
    pub changed: tokio::sync::watch::Sender<u64>,
    /// Set when the daemon stops: the live page's streams end, so draining the
    /// connections does not wait for a page that never closes.
    pub closing: tokio::sync::watch::Sender<bool>,
    /// Event streams open at once (the live page's), on every listener together: each
    /// holds a connection and builds a snapshot every few seconds, so they are bounded
    /// (`ServeOptions::max_live_streams`); one more is refused `503 too_many_streams`.
    pub streams: Arc<tokio::sync::Semaphore>,
    pub max_streams: usize,
    /// The operator socket's path, for the commands the live page shows next to each
    /// approval request.
    pub operator_socket: Option<String>,
    /// Approval events to the `serve --notify` receivers (off without any).
    pub notify: crate::notify::Notify,
}

/// Milliseconds since the Unix epoch.
pub(crate) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Observer {
    pub fn new(
        policy: &tally_policy::Policy,
        log: LogFormat,
        tracer: Option<trace::Exporter>,
        max_streams: usize,
        live: live::Live,
        operator_socket: Option<String>,
    ) -> Observer {
        Observer {
            metrics: metrics::Metrics::new(policy),
            live,
            log,
            tracer,
            changed: tokio::sync::watch::channel(0).0,
            closing: tokio::sync::watch::channel(false).0,
            streams: Arc::new(tokio::sync::Semaphore::new(max_streams.max(1))),
            max_streams: max_streams.max(1),
            operator_socket,
            notify: crate::notify::Notify::default(),
        }
    }

    /// With `notify` sending approval events, its delivery counted in `/metrics`.
    pub fn notifying(mut self, notify: crate::notify::Notify) -> Observer {
        if let Some(c) = notify.counters() {
            self.metrics.register_notify(c);
        }
        self.notify = notify;
        self
    }

    /// A decision was made: the page's streams may send.
    pub fn bump(&self) {
        self.changed.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// One JSON line on stderr, when the log format is JSON.
    pub fn log_json(&self, value: serde_json::Value) {
        if self.log == LogFormat::Json {
            use std::io::Write;
            let mut line = value.to_string();
            line.push('\n');
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

/// Whether `path` is one of the operator's read-only views (metrics, the live page).
pub(crate) fn operators_view(path: &str) -> bool {
    matches!(path, "/metrics" | "/live" | "/v1/live")
        || path.starts_with("/live/")
        || path.starts_with("/v1/live/")
}

/// Runs on one page of the live view.
pub(crate) const PER_PAGE: usize = 50;

/// One page of the live view (`GET /v1/live`, the page's `snapshot` event, `tally top`):
/// runs nearest to a limit first, the breakers not closed, refusals per minute and the
/// calls waiting for a human.
pub(crate) fn build(
    obs: &Observer,
    standings: Vec<Standing>,
    breakers: Vec<(String, tally_policy::Breaker)>,
    page: usize,
    now: u64,
) -> LiveSnapshot {
    let total_runs = standings.len();
    let open_runs = standings
        .iter()
        .filter(|s| s.state != RunState::Stopped)
        .count();
    let rows = ordered(obs, standings);
    let runs = rows
        .into_iter()
        .skip(page.saturating_mul(PER_PAGE))
        .take(PER_PAGE)
        .map(|(s, v, c)| LiveRun {
            run: s.run,
            state: s.state,
            stop_reason: s.stop_reason,
            closeness: c,
            spark: v.spark,
            last_refusal: v.last_refusal,
            depth: v.depth,
            held_nanos: s.held_nanos,
            settled_nanos: s.settled_nanos,
            held_usd: Nanos(s.held_nanos).to_string(),
            settled_usd: Nanos(s.settled_nanos).to_string(),
            at_ms: s.at_ms,
        })
        .collect();
    let breakers = breakers
        .into_iter()
        .filter_map(|(tool, b)| match b {
            tally_policy::Breaker::Closed { .. } => None,
            tally_policy::Breaker::Open { until_ms } => Some(LiveBreaker {
                tool,
                state: BreakerState::Open,
                half_opens_at_ms: Some(until_ms),
            }),
            tally_policy::Breaker::HalfOpen { .. } => Some(LiveBreaker {
                tool,
                state: BreakerState::HalfOpen,
                half_opens_at_ms: None,
            }),
        })
        .collect();
    let refusals = obs
        .live
        .refusals(now)
        .into_iter()
        .map(|(minute_ms, reason, count)| LiveRefusals {
            minute_ms,
            reason: reason.to_owned(),
            count,
        })
        .collect();
    LiveSnapshot {
        at_ms: now,
        page: page as u64,
        per_page: PER_PAGE as u64,
        total_runs: total_runs as u64,
        open_runs: open_runs as u64,
        runs,
        breakers,
        refusals,
        pending: obs.live.pending(),
    }
}

/// `standings` in the order every view shows runs (the page, `tally top`, `GET
/// /v1/runs`): open runs first, then the nearest to a limit (per mille of its nearest
/// limit, depth included as the run's last check saw it), then by name (names are
/// unique, so the order is total). Each with its live view and its closeness.
pub(crate) fn ordered(
    obs: &Observer,
    standings: Vec<Standing>,
) -> Vec<(Standing, live::RunView, Closeness)> {
    // Depth belongs to a call: the live state adds the depth its last check saw.
    let names: Vec<&str> = standings.iter().map(|s| s.run.as_str()).collect();
    let views = obs.live.views(&names);
    let mut rows: Vec<(Standing, live::RunView, Closeness)> = standings
        .into_iter()
        .zip(views)
        .map(|(s, mut v)| {
            v.now(&s.limits);
            let mut limits: BTreeMap<LimitKey, tally_ledger::decision::Limit> = s.limits.clone();
            if let Some(d) = &v.depth {
                limits.insert(LimitKey::Depth, *d);
            }
            let c = closeness(&limits);
            (s, v, c)
        })
        .collect();
    rows.sort_by(|a, b| {
        order(
            (&a.0.run, a.0.state != RunState::Stopped, &a.2),
            (&b.0.run, b.0.state != RunState::Stopped, &b.2),
        )
    });
    rows
}

/// `GET /v1/runs` (the wire's [`ListedRun`]s), in the order of [`ordered`].
pub(crate) fn listed(obs: &Observer, standings: Vec<Standing>) -> Vec<ListedRun> {
    ordered(obs, standings)
        .into_iter()
        .map(|(standing, v, closeness)| ListedRun {
            standing,
            closeness,
            last_refusal: v.last_refusal,
        })
        .collect()
}

/// Bytes of the files in the ledger's directory and its subdirectories (one level).
pub(crate) fn log_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    for e in entries.flatten() {
        let Ok(meta) = e.metadata() else { continue };
        // The live view's trajectories are not the ledger's.
        if e.file_name() == journal::FILE {
            continue;
        }
        if meta.is_file() {
            total += meta.len();
        } else if meta.is_dir() {
            if let Ok(inner) = std::fs::read_dir(e.path()) {
                total += inner
                    .flatten()
                    .filter_map(|f| f.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum::<u64>();
            }
        }
    }
    total
}

/// What a check asked, kept for its answer's metrics, log line and live state (never its
/// arguments: their digest only, for a call waiting for approval).
pub(crate) struct Seen {
    run: String,
    tool: String,
    args_digest: Option<String>,
    trace_id: Option<String>,
    /// A proxied call's upstream and model labels.
    call: Option<metrics::Call>,
}

impl Seen {
    pub fn of(req: &tally_gate::CheckRequest, call: Option<metrics::Call>) -> Seen {
        Seen {
            run: req.run.clone(),
            tool: req.tool.clone(),
            args_digest: req.args.as_ref().map(|a| a.digest()),
            trace_id: req.trace_id.clone(),
            call,
        }
    }
}

pub(crate) fn verdict(v: tally_policy::Verdict) -> &'static str {
    match v {
        tally_policy::Verdict::Allow => "allow",
        tally_policy::Verdict::Deny => "deny",
        tally_policy::Verdict::RequireApproval => "require_approval",
    }
}

impl Observer {
    /// A check was answered (once durable).
    pub fn checked(
        &self,
        seen: &Seen,
        answer: &tally_gate::CheckAnswer,
        took: std::time::Duration,
    ) {
        let decision = verdict(answer.decision);
        let reason = answer.reason.map_or("none", |r| r.as_str());
        self.metrics
            .check(decision, reason, &seen.tool, took.as_secs_f64());
        if answer.decision == tally_policy::Verdict::Allow {
            // What was reserved: the declared amount, or the tool's price if more.
            self.metrics.reserved(answer.reserve_nanos.unwrap_or(0));
        }
        if let Some(call) = &seen.call {
            let allowed = answer.decision == tally_policy::Verdict::Allow;
            self.metrics.upstream_check(
                call,
                decision,
                &seen.run,
                answer.attempt.filter(|_| allowed),
                answer.reserve_nanos.filter(|_| allowed),
            );
        }
        let refusal = match answer.decision {
            tally_policy::Verdict::Allow => None,
            _ => Some((reason, answer.action.map(|a| a.as_str()))),
        };
        let approval = answer.decision == tally_policy::Verdict::RequireApproval;
        let now = wall_ms();
        self.live.check(
            &seen.run,
            &seen.tool,
            refusal,
            approval,
            if approval {
                seen.args_digest.clone()
            } else {
                None
            },
            &answer.limits,
            answer.seq,
            now,
        );
        self.bump();
        if self.log == LogFormat::Json {
            self.log_json(serde_json::json!({
                "ts_ms": now,
                "level": "info",
                "msg": "decision",
                "kind": "check",
                "run": seen.run,
                "tool": seen.tool,
                "decision": decision,
                "reason": answer.reason.map(|r| r.as_str()),
                "seq": answer.seq,
                "trace_id": seen.trace_id,
                "upstream": seen.call.as_ref().map(|c| &c.upstream),
                "model": seen.call.as_ref().map(|c| &c.model),
            }));
        }
    }

    /// An outcome was recorded (`logged` its receipt: the run's limits after it).
    pub fn outcome(
        &self,
        run: &str,
        attempt: u64,
        s: tally_ledger::decision::Status,
        settled_nanos: Option<u64>,
        usage: Option<&tally_ledger::Usage>,
        logged: &tally_gate::Logged,
    ) {
        let seq = logged.seq;
        self.metrics
            .outcome(s.as_str(), settled_nanos, logged.overrun_nanos);
        self.metrics
            .upstream_outcome(run, attempt, settled_nanos, usage);
        // The trajectory moves when the spend settles, not only at the next check.
        self.live.settled(run, &logged.limits, wall_ms());
        self.bump();
        if self.log == LogFormat::Json {
            self.log_json(serde_json::json!({
                "ts_ms": wall_ms(),
                "level": "info",
                "msg": "decision",
                "kind": "outcome",
                "run": run,
                "status": s.as_str(),
                "seq": seq,
                "overrun_nanos": logged.overrun_nanos,
                "usage": usage,
            }));
        }
    }
}
