//! A key's own budget per UTC day (docs/KEYS.md, "A key's budget per day"): what every
//! run a key starts may spend together in one UTC day, and how many runs it may start.
//! The rule is here alone; the proxy keeps the counts and asks.
//!
//! A call fits if `settled + held + reserve <= spend limit`, where `held` is what the
//! key's calls of the day reserved and have not settled, `settled` what they settled
//! (an overrun, a settlement above its reservation, counted in full). A start fits if
//! the runs the key started that day are fewer than its limit. The day is the UTC day
//! of the time the caller passes in: a new day starts from nothing.

/// A UTC day's length, ms.
pub const DAY_MS: u64 = 86_400_000;

/// A key's limits per UTC day; `None`: no limit of that kind (its principal's budget
/// still bounds it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyDayLimits {
    /// What its runs may spend together per day, nanodollars.
    pub spend_nanos: Option<u64>,
    /// How many runs it may start per day.
    pub runs: Option<u64>,
}

/// What a key's runs used in one UTC day.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyDayUse {
    /// The UTC day (days since 1970-01-01) these counts are of.
    pub day: u64,
    /// Settled by its calls' outcomes, nanodollars.
    pub settled_nanos: u64,
    /// Reserved by its calls and not settled yet, nanodollars.
    pub held_nanos: u64,
    /// Runs started (or being started).
    pub runs: u64,
}

impl KeyDayUse {
    /// These counts as of `now_ms`: nothing on a later day; themselves within their day,
    /// and on an earlier one too (a clock stepped back across midnight keeps the day's
    /// counts: a new day only ever starts forward).
    pub fn at(self, now_ms: u64) -> KeyDayUse {
        let day = day_of(now_ms);
        if day <= self.day {
            self
        } else {
            KeyDayUse {
                day,
                ..KeyDayUse::default()
            }
        }
    }
}

/// The UTC day of `now_ms`, days since 1970-01-01.
pub fn day_of(now_ms: u64) -> u64 {
    now_ms / DAY_MS
}

/// Why a key's call or run does not fit its day.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyDayExceeded {
    /// The call's reservation does not fit the day's spend.
    #[error(
        "the key's budget per day is {limit_nanos} nanodollars: {settled_nanos} settled and \
         {held_nanos} held today, and the call reserves {needed_nanos}"
    )]
    Spend {
        /// The limit.
        limit_nanos: u64,
        /// Settled today.
        settled_nanos: u64,
        /// Held today.
        held_nanos: u64,
        /// What the call reserves.
        needed_nanos: u64,
    },
    /// The UTC day turned between the call naming its run (of `named_day`) and its hold
    /// (on `day`): held on neither, so that what a day's runs spend is what that day
    /// counts. Sent again, the call names the new day's run.
    #[error("the call's run is of UTC day {named_day} and the day is now {day}: send it again")]
    DayTurned {
        /// The day of the run the call named.
        named_day: u64,
        /// The day now.
        day: u64,
    },
    /// The key started its runs of the day.
    #[error("the key may start {limit} runs per day and started {started} today")]
    Runs {
        /// The limit.
        limit: u64,
        /// Started today.
        started: u64,
    },
}

/// The day a call whose run was named at `named_ms` is held on at `now_ms`: the run's
/// day, the one its name carries, or [`KeyDayExceeded::DayTurned`] if the day turned
/// between. One day for the name and the hold keeps a restart exact: the counts a day
/// is read back from are the runs named for it ([`KeyDayUse`]).
pub fn key_call_day(named_ms: u64, now_ms: u64) -> Result<u64, KeyDayExceeded> {
    let (named_day, day) = (day_of(named_ms), day_of(now_ms));
    if named_day == day {
        Ok(day)
    } else {
        Err(KeyDayExceeded::DayTurned { named_day, day })
    }
}

/// Whether a call reserving `reserve_nanos` fits the key's day `used` (counts of the
/// day the caller decides in, [`KeyDayUse::at`]).
pub fn key_call_fits(
    limits: &KeyDayLimits,
    used: &KeyDayUse,
    reserve_nanos: u64,
) -> Result<(), KeyDayExceeded> {
    let Some(limit) = limits.spend_nanos else {
        return Ok(());
    };
    let total = used
        .settled_nanos
        .checked_add(used.held_nanos)
        .and_then(|s| s.checked_add(reserve_nanos));
    match total {
        Some(t) if t <= limit => Ok(()),
        _ => Err(KeyDayExceeded::Spend {
            limit_nanos: limit,
            settled_nanos: used.settled_nanos,
            held_nanos: used.held_nanos,
            needed_nanos: reserve_nanos,
        }),
    }
}

/// Whether the key may start one more run on the day of `used`.
pub fn key_run_fits(limits: &KeyDayLimits, used: &KeyDayUse) -> Result<(), KeyDayExceeded> {
    match limits.runs {
        Some(limit) if used.runs >= limit => Err(KeyDayExceeded::Runs {
            limit,
            started: used.runs,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: KeyDayLimits = KeyDayLimits {
        spend_nanos: Some(1_000),
        runs: Some(2),
    };

    #[test]
    fn a_call_fits_while_settled_held_and_its_reservation_stay_within_the_day() {
        let mut used = KeyDayUse {
            day: 3,
            settled_nanos: 600,
            held_nanos: 300,
            runs: 0,
        };
        assert_eq!(key_call_fits(&LIMITS, &used, 100), Ok(()));
        assert_eq!(
            key_call_fits(&LIMITS, &used, 101),
            Err(KeyDayExceeded::Spend {
                limit_nanos: 1_000,
                settled_nanos: 600,
                held_nanos: 300,
                needed_nanos: 101
            })
        );
        // An overrun settled past the limit: nothing fits, not even a free call.
        used.settled_nanos = 1_200;
        used.held_nanos = 0;
        assert!(key_call_fits(&LIMITS, &used, 0).is_err());
        // Numbers that would wrap are refused, never wrapped.
        used.settled_nanos = u64::MAX;
        assert!(key_call_fits(&LIMITS, &used, 1).is_err());
        assert_eq!(key_call_fits(&KeyDayLimits::default(), &used, 1), Ok(()));
    }

    #[test]
    fn runs_fit_below_the_limit_and_the_day_turns_on_the_time_passed_in() {
        let used = KeyDayUse {
            day: day_of(5 * DAY_MS + 7),
            settled_nanos: 1_000,
            held_nanos: 5,
            runs: 2,
        };
        assert!(key_run_fits(&LIMITS, &used).is_err());
        // The day's last ms: the same counts; the next day's first: nothing.
        assert_eq!(used.at(6 * DAY_MS - 1), used);
        let next = used.at(6 * DAY_MS);
        assert_eq!(
            next,
            KeyDayUse {
                day: 6,
                ..KeyDayUse::default()
            }
        );
        assert_eq!(key_run_fits(&LIMITS, &next), Ok(()));
        assert_eq!(key_call_fits(&LIMITS, &next, 1_000), Ok(()));
    }

    #[test]
    fn a_call_is_held_on_the_day_its_run_is_named_for_or_not_at_all() {
        assert_eq!(key_call_day(5 * DAY_MS, 6 * DAY_MS - 1), Ok(5));
        assert_eq!(
            key_call_day(6 * DAY_MS - 1, 6 * DAY_MS),
            Err(KeyDayExceeded::DayTurned {
                named_day: 5,
                day: 6
            })
        );
    }

    #[test]
    fn a_clock_stepped_back_across_midnight_keeps_the_days_counts() {
        let used = KeyDayUse {
            day: 6,
            settled_nanos: 900,
            held_nanos: 100,
            runs: 2,
        };
        assert_eq!(used.at(6 * DAY_MS - 1), used);
        assert_eq!(used.at(0), used);
        assert!(key_call_fits(&LIMITS, &used.at(5 * DAY_MS), 1).is_err());
        assert!(key_run_fits(&LIMITS, &used.at(5 * DAY_MS)).is_err());
    }
}
