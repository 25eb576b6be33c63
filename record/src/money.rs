//! Money, counted exactly: an integer number of **nanodollars** (10⁻⁹ US dollar).
//!
//! One token of a cheap model costs a small fraction of a cent (at $0.02 per million
//! tokens, 20 nanodollars), so cents cannot count a model call's cost; a nanodollar
//! can, and a `u64` of them still holds $18.4 billion. Every amount is an integer:
//! no floating point touches money, and every conversion is exact or refused.
//!
//! * Cents, the unit of records written before this one, convert exactly:
//!   1 cent = 10,000,000 nanodollars ([`Nanos::from_cents`], refused on overflow).
//! * Prices are decimal US dollars as an operator writes them (`0.15`), read exactly
//!   ([`parse_usd`]): at most nine digits after the point, nothing else.
//! * A price per million tokens is itself a count of nanodollars per million tokens;
//!   the cost of `n` tokens is `ceil(n × price / 1,000,000)` ([`per_million`]): rounded
//!   up to the next nanodollar, so a reservation is never below what the call may cost.
//!
//! docs/FORMAT.md, section "Money", specifies the unit with test vectors.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Nanodollars in one cent.
pub const NANOS_PER_CENT: u64 = 10_000_000;
/// Nanodollars in one US dollar.
pub const NANOS_PER_DOLLAR: u64 = 1_000_000_000;

/// An exact amount of money in nanodollars (10⁻⁹ USD).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Nanos(pub u64);

impl Nanos {
    /// Nothing.
    pub const ZERO: Nanos = Nanos(0);
    /// The most a `u64` of nanodollars holds.
    pub const MAX: Nanos = Nanos(u64::MAX);

    /// `cents` exactly, or `None` if that many cents do not fit.
    pub fn from_cents(cents: u64) -> Option<Nanos> {
        cents.checked_mul(NANOS_PER_CENT).map(Nanos)
    }

    /// The amount in whole cents, if it is a whole number of cents.
    pub fn whole_cents(self) -> Option<u64> {
        self.0
            .is_multiple_of(NANOS_PER_CENT)
            .then_some(self.0 / NANOS_PER_CENT)
    }

    /// The amount in cents, rounded up.
    pub fn cents_ceil(self) -> u64 {
        self.0.div_ceil(NANOS_PER_CENT)
    }

    /// `self + other`, or `None` on overflow.
    pub fn checked_add(self, other: Nanos) -> Option<Nanos> {
        self.0.checked_add(other.0).map(Nanos)
    }

    /// `self - other`, or `None` if `other` is larger.
    pub fn checked_sub(self, other: Nanos) -> Option<Nanos> {
        self.0.checked_sub(other.0).map(Nanos)
    }

    /// `self - other`, or zero if `other` is larger.
    pub fn saturating_sub(self, other: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(other.0))
    }
}

/// US dollars with as many decimals as the amount needs and never fewer than two:
/// `$0.00`, `$1.25`, `$0.000000150`. Exact: parsing the digits after `$` with
/// [`parse_usd`] gives the amount back.
impl fmt::Display for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / NANOS_PER_DOLLAR;
        let frac = self.0 % NANOS_PER_DOLLAR;
        let digits = format!("{frac:09}");
        let trimmed = digits.trim_end_matches('0');
        let shown = if trimmed.len() < 2 {
            &digits[..2]
        } else {
            trimmed
        };
        write!(f, "${whole}.{shown}")
    }
}

/// Why a text is not an exact amount of US dollars.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MoneyError {
    /// Not of the form `DIGITS` or `DIGITS.DIGITS`.
    #[error("`{text}` is not a decimal amount of US dollars: write digits with an optional point, like 0.15 or 12")]
    NotDecimal {
        /// The text read.
        text: String,
    },
    /// More than nine digits after the point: finer than a nanodollar.
    #[error("`{text}` has more than 9 digits after the point: amounts are counted in nanodollars (10^-9 USD)")]
    TooPrecise {
        /// The text read.
        text: String,
    },
    /// Larger than a `u64` of nanodollars holds.
    #[error("`{text}` is too large: at most 18446744073.709551615 US dollars")]
    TooLarge {
        /// The text read.
        text: String,
    },
}

/// Reads a decimal amount of US dollars exactly: `12`, `0.15`, `1.000000001`. No sign,
/// no exponent, no `$`, no separators, no leading `.` or trailing `.`; at most nine digits
/// after the point (trailing zeros included, so `0.1000000000` is refused).
pub fn parse_usd(text: &str) -> Result<Nanos, MoneyError> {
    let bad = || MoneyError::NotDecimal {
        text: text.to_owned(),
    };
    let (whole, frac) = match text.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (text, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || frac.is_some_and(|f| !digits(f)) {
        return Err(bad());
    }
    let frac = frac.unwrap_or("");
    if frac.len() > 9 {
        return Err(MoneyError::TooPrecise {
            text: text.to_owned(),
        });
    }
    let large = || MoneyError::TooLarge {
        text: text.to_owned(),
    };
    let whole: u64 = whole.parse().map_err(|_| large())?;
    let frac_nanos: u64 = if frac.is_empty() {
        0
    } else {
        frac.parse::<u64>().map_err(|_| bad())? * 10u64.pow(9 - frac.len() as u32)
    };
    whole
        .checked_mul(NANOS_PER_DOLLAR)
        .and_then(|n| n.checked_add(frac_nanos))
        .map(Nanos)
        .ok_or_else(large)
}

/// The cost of `units` at `price` per million units (a model's price per million
/// tokens), rounded up to the next nanodollar; `None` if it does not fit.
pub fn per_million(units: u64, price: Nanos) -> Option<Nanos> {
    let exact = u128::from(units) * u128::from(price.0);
    u64::try_from(exact.div_ceil(1_000_000)).ok().map(Nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cents_convert_exactly_and_overflow_is_refused() {
        assert_eq!(Nanos::from_cents(1), Some(Nanos(10_000_000)));
        assert_eq!(
            Nanos::from_cents(1_844_674_407_370),
            Some(Nanos(18_446_744_073_700_000_000))
        );
        assert_eq!(Nanos::from_cents(1_844_674_407_371), None);
        assert_eq!(Nanos(25 * NANOS_PER_CENT).whole_cents(), Some(25));
        assert_eq!(Nanos(25 * NANOS_PER_CENT + 1).whole_cents(), None);
        assert_eq!(Nanos(25 * NANOS_PER_CENT + 1).cents_ceil(), 26);
    }

    #[test]
    fn dollars_are_read_exactly() {
        for (text, nanos) in [
            ("0", 0),
            ("12", 12_000_000_000),
            ("0.15", 150_000_000),
            ("0.000000001", 1),
            ("1.5", 1_500_000_000),
            ("18446744073.709551615", u64::MAX),
            ("007.10", 7_100_000_000),
        ] {
            assert_eq!(parse_usd(text), Ok(Nanos(nanos)), "{text}");
        }
        for text in [
            "", ".", "1.", ".5", "-1", "+1", "1e3", "$1", "1,000", " 1", "1 ", "0x10", "1.2.3", "١",
        ] {
            assert!(
                matches!(parse_usd(text), Err(MoneyError::NotDecimal { .. })),
                "{text:?}"
            );
        }
        assert!(matches!(
            parse_usd("0.0000000001"),
            Err(MoneyError::TooPrecise { .. })
        ));
        assert!(matches!(
            parse_usd("18446744073.709551616"),
            Err(MoneyError::TooLarge { .. })
        ));
        assert!(matches!(
            parse_usd("99999999999999999999999"),
            Err(MoneyError::TooLarge { .. })
        ));
    }

    #[test]
    fn display_round_trips() {
        for (nanos, shown) in [
            (0, "$0.00"),
            (10_000_000, "$0.01"),
            (1_250_000_000, "$1.25"),
            (1_200_000_000, "$1.20"),
            (150, "$0.00000015"),
            (1, "$0.000000001"),
            (u64::MAX, "$18446744073.709551615"),
        ] {
            assert_eq!(Nanos(nanos).to_string(), shown);
            assert_eq!(parse_usd(&shown[1..]), Ok(Nanos(nanos)));
        }
    }

    #[test]
    fn per_million_rounds_up_and_never_wraps() {
        // $0.15 per million tokens: 1,000 tokens cost 150,000 nanodollars exactly.
        assert_eq!(per_million(1_000, Nanos(150_000_000)), Some(Nanos(150_000)));
        // $0.0375 per million: one token costs 37.5 nanodollars, charged 38.
        assert_eq!(per_million(1, Nanos(37_500_000)), Some(Nanos(38)));
        assert_eq!(per_million(0, Nanos(u64::MAX)), Some(Nanos(0)));
        assert_eq!(
            per_million(u64::MAX, Nanos(1_000_000)),
            Some(Nanos(u64::MAX))
        );
        assert_eq!(per_million(u64::MAX, Nanos(1_000_001)), None);
    }
}
