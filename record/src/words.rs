//! Numbers as a person reads them, for every human text (reports, CLI messages, refusal
//! texts): durations (`10 min 03 s`, never `603701 ms`), times on a run's clock (`10 min
//! 03 s after the run started`), wall times (`2026-12-02 00:33:13 UTC`) and counts with
//! their noun in the right number (`1 entry`, `2 entries`). JSON keeps milliseconds.

/// A duration: `850 ms`, `12.5 s`, `3 min 05 s`, `2 h 03 min`, `3 d 04 h`.
pub fn duration(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms} ms"),
        1_000..=59_999 => format!("{}.{} s", ms / 1000, ms % 1000 / 100),
        60_000..=3_599_999 => format!("{} min {:02} s", ms / 60_000, ms % 60_000 / 1000),
        3_600_000..=172_799_999 => {
            format!("{} h {:02} min", ms / 3_600_000, ms % 3_600_000 / 60_000)
        }
        _ => format!("{} d {:02} h", ms / 86_400_000, ms % 86_400_000 / 3_600_000),
    }
}

/// A moment on a run's own clock (ms since the run started): `10 min 03 s after the run
/// started`, or `as the run started`.
pub fn after_start(ms: u64) -> String {
    if ms == 0 {
        "as the run started".to_owned()
    } else {
        format!("{} after the run started", duration(ms))
    }
}

/// `n` and its noun in the right number: `1 entry`, `0 entries`, `2 entries`.
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Wall time (ms since the Unix epoch) as UTC for people: `2026-12-02 00:33:13 UTC`
/// (milliseconds are in the JSON).
pub fn utc(ms: u64) -> String {
    let (date, in_day) = civil(ms);
    format!(
        "{date} {:02}:{:02}:{:02} UTC",
        in_day / 3_600_000,
        in_day % 3_600_000 / 60_000,
        in_day % 60_000 / 1000,
    )
}

/// Wall time as RFC 3339 UTC with milliseconds: `2026-12-02T00:33:13.462Z`.
pub fn rfc3339(ms: u64) -> String {
    let (date, in_day) = civil(ms);
    format!(
        "{date}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day % 3_600_000 / 60_000,
        in_day % 60_000 / 1000,
        in_day % 1000
    )
}

/// `YYYY-MM-DD` of `ms`, and the ms into that day.
fn civil(ms: u64) -> (String, u64) {
    let days = (ms / 86_400_000) as i64;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (format!("{year:04}-{month:02}-{day:02}"), ms % 86_400_000)
}

/// Whether `c` changes how a reader sees text it does not belong to: a bidi control
/// (embeddings, overrides, isolates, and the marks LRM, RLM and ALM) or a Unicode line or
/// paragraph separator. Agent text shown to a human escapes these as it escapes control
/// characters.
pub fn is_bidi(c: char) -> bool {
    matches!(
        c,
        '\u{200e}' | '\u{200f}' | '\u{061c}' | '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_say_them() {
        for (ms, text) in [
            (0, "0 ms"),
            (850, "850 ms"),
            (12_500, "12.5 s"),
            (603_701, "10 min 03 s"),
            (7_380_000, "2 h 03 min"),
            (86_400_000, "24 h 00 min"),
            (273_600_000, "3 d 04 h"),
        ] {
            assert_eq!(duration(ms), text);
        }
        assert_eq!(after_start(603_701), "10 min 03 s after the run started");
        assert_eq!(after_start(0), "as the run started");
        assert_eq!(plural(1, "entry", "entries"), "1 entry");
        assert_eq!(plural(0, "entry", "entries"), "0 entries");
    }

    #[test]
    fn wall_times_are_utc() {
        assert_eq!(utc(1_700_000_000_040), "2023-11-14 22:13:20 UTC");
        assert_eq!(rfc3339(1_700_000_000_040), "2023-11-14T22:13:20.040Z");
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
    }
}
