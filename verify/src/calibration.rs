//! Calibration: the band normal work falls in, next to the limits in force. For each goal
//! family, the completed runs' attempts, settled spend and duration (median and 95th
//! percentile), and for attempts and spend a judgement of the limit: inside the band (it
//! stops normal work), decorative (more than [`DECORATIVE_FACTOR`] times the band's 95th
//! percentile), or fitting. `tally stats` prints it beside its table (docs/REPORTS.md,
//! "calibration"); the thresholds are here only.

use std::collections::BTreeMap;

use serde::Serialize;
use tally_ledger::money::Nanos;
use tally_ledger::Reason;

use crate::analysis::Handoff;
use crate::text::shown;

/// A limit more than this many times the band's 95th percentile is decorative: a run that
/// loops does ten times the work of any normal run before it is stopped, and operators
/// learn that the number never matters. Two to four times leaves room for a bad day's
/// retries; ten is the point past which the limit no longer bounds anything normal work
/// could tell from runaway work.
pub const DECORATIVE_FACTOR: u64 = 10;

/// Characters of a goal that name its family; the rest is cut.
const FAMILY_CHARS: usize = 60;

/// Families listed; the rest are counted.
pub const MAX_FAMILIES: usize = 50;

/// What a limit is, against the band.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Judgement {
    /// No limit in force.
    NoLimit,
    /// At or below the 95th percentile: it stops normal work.
    InsideBand,
    /// Above the band, within [`DECORATIVE_FACTOR`] of it.
    Fits,
    /// More than [`DECORATIVE_FACTOR`] times the 95th percentile.
    Decorative,
}

/// Judge `limit` against a band whose 95th percentile is `p95`: the one place the
/// thresholds are applied.
pub fn judge(limit: Option<u64>, p95: u64) -> Judgement {
    match limit {
        None => Judgement::NoLimit,
        Some(l) if l <= p95 => Judgement::InsideBand,
        Some(l) if l > p95.max(1).saturating_mul(DECORATIVE_FACTOR) => Judgement::Decorative,
        Some(_) => Judgement::Fits,
    }
}

/// A measured band.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Band {
    /// The median.
    pub p50: u64,
    /// The 95th percentile (nearest rank).
    pub p95: u64,
}

impl Band {
    /// The band of `values` (nearest-rank percentiles).
    pub fn of(mut values: Vec<u64>) -> Band {
        values.sort_unstable();
        let rank = |p: usize| {
            let n = values.len();
            let i = (p * n).div_ceil(100).clamp(1, n.max(1)) - 1;
            values.get(i).copied().unwrap_or(0)
        };
        Band {
            p50: rank(50),
            p95: rank(95),
        }
    }
}

/// One dimension of a family: its band, the limit in force and the judgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Dimension {
    /// The completed runs' band.
    pub band: Band,
    /// The limit in force for the family's latest run (`null`: none).
    pub limit: Option<u64>,
    /// The limit against the band.
    pub judgement: Judgement,
}

impl Dimension {
    fn of(values: Vec<u64>, limit: Option<u64>) -> Dimension {
        let band = Band::of(values);
        Dimension {
            band,
            limit,
            judgement: judge(limit, band.p95),
        }
    }
}

/// One goal family.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Family {
    /// The family: the goal with each run of digits as `#`, at most 60 characters.
    pub family: String,
    /// Its completed runs (those measured).
    pub completed: u64,
    /// Attempts used.
    pub attempts: Dimension,
    /// Settled spend, nanodollars.
    pub spend_nanos: Dimension,
    /// Time from start to the stop, ms (no limit is judged: the deadline is not in the
    /// handoff).
    pub duration_ms: Band,
}

/// The family of a goal: digits folded (`export 41` and `export 42` are one family).
pub fn family(goal: Option<&str>) -> String {
    let mut out = String::new();
    for c in goal.unwrap_or("").chars().take(FAMILY_CHARS) {
        if c.is_ascii_digit() {
            if !out.ends_with('#') {
                out.push('#');
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The calibration of the completed runs among `handoffs`, by family (in name order, at
/// most [`MAX_FAMILIES`] with the most runs).
pub fn calibrate<'a>(handoffs: impl IntoIterator<Item = &'a Handoff>) -> Vec<Family> {
    let mut by: BTreeMap<String, Vec<&Handoff>> = BTreeMap::new();
    for h in handoffs {
        if h.stop.reason == Some(Reason::Completed) {
            by.entry(family(h.goal.as_deref())).or_default().push(h);
        }
    }
    let mut families: Vec<Family> = by
        .into_iter()
        .map(|(name, runs)| {
            let last = runs.last().map(|h| (h.attempts.limit, h.spend.limit_nanos));
            let (attempts, spend) = last.unwrap_or_default();
            Family {
                family: name,
                completed: runs.len() as u64,
                attempts: Dimension::of(runs.iter().map(|h| h.attempts.used).collect(), attempts),
                spend_nanos: Dimension::of(
                    runs.iter().map(|h| h.spend.settled_nanos).collect(),
                    spend,
                ),
                duration_ms: Band::of(
                    runs.iter()
                        .map(|h| h.stop.at.map_or(0, |w| w.run_ms))
                        .collect(),
                ),
            }
        })
        .collect();
    families.sort_by(|a, b| b.completed.cmp(&a.completed).then(a.family.cmp(&b.family)));
    families.truncate(MAX_FAMILIES);
    families.sort_by(|a, b| a.family.cmp(&b.family));
    families
}

fn judged(j: Judgement) -> &'static str {
    match j {
        Judgement::NoLimit => "no limit",
        Judgement::InsideBand => "INSIDE the band: stops normal work",
        Judgement::Fits => "fits",
        Judgement::Decorative => "decorative (over 10x p95)",
    }
}

/// The calibration as text (nothing if no run completed).
pub fn to_text(families: &[Family]) -> String {
    if families.is_empty() {
        return String::new();
    }
    let mut out = String::from("\nCalibration (completed runs; median / p95, and the limit):\n");
    for f in families {
        let (a, s, d) = (&f.attempts, &f.spend_nanos, &f.duration_ms);
        let limit = |l: Option<u64>, show: &dyn Fn(u64) -> String| l.map_or("-".into(), show);
        out.push_str(&format!(
            "  {:?} ({} runs)\n    attempts {} / {}, limit {}: {}\n    spend {} / {}, limit {}: {}\n    duration {} / {}\n",
            shown(&f.family),
            f.completed,
            a.band.p50,
            a.band.p95,
            limit(a.limit, &|l| l.to_string()),
            judged(a.judgement),
            Nanos(s.band.p50),
            Nanos(s.band.p95),
            limit(s.limit, &|l| Nanos(l).to_string()),
            judged(s.judgement),
            crate::text::duration(d.p50),
            crate::text::duration(d.p95),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_is_judged_against_the_band_in_one_place() {
        assert_eq!(judge(None, 5), Judgement::NoLimit);
        assert_eq!(judge(Some(5), 5), Judgement::InsideBand);
        assert_eq!(judge(Some(6), 5), Judgement::Fits);
        assert_eq!(judge(Some(50), 5), Judgement::Fits);
        assert_eq!(judge(Some(51), 5), Judgement::Decorative);
        assert_eq!(judge(Some(11), 0), Judgement::Decorative);
    }

    #[test]
    fn the_band_is_nearest_rank() {
        let b = Band::of((1..=20).collect());
        assert_eq!((b.p50, b.p95), (10, 19));
        assert_eq!(Band::of(vec![]), Band::default());
        assert_eq!(Band::of(vec![7]), Band { p50: 7, p95: 7 });
        assert_eq!(family(Some("export 41 of 2026")), "export # of #");
    }
}
