//! What a bench run measured, as a line of text or JSON.

use std::time::Duration;

use crate::plan::Mode;

pub(crate) struct Report {
    pub(crate) mode: Mode,
    pub(crate) clients: usize,
    pub(crate) batch: usize,
    pub(crate) offered: Option<f64>,
    pub(crate) even: bool,
    pub(crate) requests: u64,
    pub(crate) decisions: u64,
    pub(crate) elapsed: Duration,
    /// Sorted acknowledgement latencies, microseconds.
    pub(crate) latencies: Vec<u64>,
}

impl Report {
    fn pct(&self, p: f64) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        let i =
            ((self.latencies.len() as f64 * p).ceil() as usize).clamp(1, self.latencies.len()) - 1;
        self.latencies[i] as f64 / 1000.0
    }

    fn rate(&self) -> f64 {
        self.decisions as f64 / self.elapsed.as_secs_f64()
    }

    pub(crate) fn text(&self) -> String {
        if self.mode != Mode::Append {
            let what = if self.mode == Mode::Check {
                "gate calls (check + outcome)"
            } else {
                "appended pairs (allow + outcome)"
            };
            return format!(
                "clients {:>3}  {what:<32}  {:>8.0} calls/s  {:>8.0} req/s  p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms  ({} calls in {:.1} s)",
                self.clients,
                self.rate(),
                2.0 * self.rate(),
                self.pct(0.50),
                self.pct(0.99),
                self.pct(1.0),
                self.requests,
                self.elapsed.as_secs_f64(),
            );
        }
        let mode = match self.offered {
            Some(r) if self.even => format!("offered {r:.0}/s even"),
            Some(r) => format!("offered {r:.0}/s"),
            None => "closed loop".into(),
        };
        format!(
            "clients {:>3}  batch {:>3}  {mode:<21}  {:>9.0} decisions/s  {:>8.0} req/s  p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms  ({} requests in {:.1} s)",
            self.clients,
            self.batch,
            self.rate(),
            self.requests as f64 / self.elapsed.as_secs_f64(),
            self.pct(0.50),
            self.pct(0.99),
            self.pct(1.0),
            self.requests,
            self.elapsed.as_secs_f64(),
        )
    }

    pub(crate) fn json(&self) -> String {
        serde_json::json!({
            "clients": self.clients,
            "batch": self.batch,
            "offered_per_sec": self.offered,
            "even": self.even,
            "requests": self.requests,
            "decisions": self.decisions,
            "seconds": self.elapsed.as_secs_f64(),
            "decisions_per_sec": self.rate(),
            "p50_ms": self.pct(0.50),
            "p99_ms": self.pct(0.99),
            "max_ms": self.pct(1.0),
        })
        .to_string()
    }
}
