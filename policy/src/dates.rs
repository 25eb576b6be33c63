//! Calendar dates in the policy (a price's `as_of`): `YYYY-MM-DD`, proleptic Gregorian,
//! UTC, kept as days since 1970-01-01.

use std::fmt;

use serde::{Serialize, Serializer};

/// Milliseconds in a day.
const DAY_MS: u64 = 86_400_000;

/// A calendar date, days since 1970-01-01 (UTC).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Date(pub u32);

impl Date {
    /// Read `YYYY-MM-DD` exactly: four digits, a dash, two, a dash, two; a real day
    /// from 1970-01-01 to 9999-12-31. Anything else is `None`.
    pub fn parse(text: &str) -> Option<Date> {
        let b = text.as_bytes();
        let digits = |r: std::ops::Range<usize>| -> Option<u32> {
            let s = b.get(r)?;
            s.iter()
                .all(u8::is_ascii_digit)
                .then(|| s.iter().fold(0u32, |n, d| n * 10 + u32::from(d - b'0')))
        };
        if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
            return None;
        }
        let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
        if year < 1970 || !(1..=12).contains(&month) || day == 0 || day > month_len(year, month) {
            return None;
        }
        Some(Date(days_from_civil(year, month, day)))
    }

    /// The date `ms` (since the Unix epoch) falls on, in UTC.
    pub fn of_ms(ms: u64) -> Date {
        Date(u32::try_from(ms / DAY_MS).unwrap_or(u32::MAX))
    }

    /// Whole days from `self` to `later` (0 when `later` is not after it).
    pub fn days_until(self, later: Date) -> u32 {
        later.0.saturating_sub(self.0)
    }
}

impl fmt::Display for Date {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (y, m, d) = civil_from_days(self.0);
        write!(f, "{y:04}-{m:02}-{d:02}")
    }
}

impl Serialize for Date {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Days in `month` of `year`.
fn month_len(year: u32, month: u32) -> u32 {
    match month {
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => {
            29
        }
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a date from 1970 on (Howard Hinnant's days_from_civil).
fn days_from_civil(year: u32, month: u32, day: u32) -> u32 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of `days` since 1970-01-01 (Howard Hinnant's civil_from_days).
fn civil_from_days(days: u32) -> (u32, u32, u32) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + u32::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_read_and_print_back() {
        for text in [
            "1970-01-01",
            "2024-02-29",
            "2026-12-07",
            "2000-03-01",
            "9999-12-31",
        ] {
            let d = Date::parse(text).expect(text);
            assert_eq!(d.to_string(), text);
        }
        assert_eq!(Date::parse("1970-01-02"), Some(Date(1)));
        assert_eq!(Date::parse("2026-12-07").map(|d| d.0), Some(20_794));
        assert_eq!(Date::of_ms(20_794 * DAY_MS + DAY_MS - 1), Date(20_794));
    }

    #[test]
    fn anything_but_a_real_day_is_refused() {
        for text in [
            "",
            "2026-1-07",
            "2026-13-01",
            "2026-00-10",
            "2025-02-29",
            "2026-04-31",
            "1969-12-31",
            "2026/12/07",
            "2026-12-07T00",
            "+026-12-07",
            "２026-12-07",
            "2026-12-0a",
        ] {
            assert_eq!(Date::parse(text), None, "{text}");
        }
    }

    #[test]
    fn ages_count_whole_days_and_never_go_negative() {
        let a = Date::parse("2026-09-08").expect("a date");
        let b = Date::parse("2026-12-07").expect("a date");
        assert_eq!(a.days_until(b), 90);
        assert_eq!(b.days_until(a), 0);
    }
}
