//! A call's arguments, exactly: their canonical JSON and the argument digest.
//!
//! Arguments are read from the raw JSON text, never through `f64`: two different values
//! (`18446744073709551616` and `18446744073709551617`, `0.1` and
//! `0.1000000000000000000001`) never share a canonical form, so never a digest. The same
//! value written two ways (`1.0` and `1`, `1e2` and `100`, `"\u0061"` and `"a"`) shares
//! one. The canonical form is specified, with test vectors, in `docs/FORMAT.md`
//! ("Argument digest"):
//!
//! * objects with their keys sorted by their UTF-8 bytes, each key once (a duplicate key
//!   is an error, at every depth); arrays in their order; no insignificant whitespace;
//! * strings as serde_json writes them (`"` and `\` escaped, controls as `\b \t \n \f \r`
//!   or `\u00xx`, everything else as raw UTF-8);
//! * `true`, `false`, `null` as themselves;
//! * numbers by their exact decimal value, written as ECMAScript writes a number from its
//!   digits (the form RFC 8785 uses), but with every significant digit kept.
//!
//! The text is read once ([`reader`]); [`Args::read`] also gives what a reader of the
//! arguments' members needs, from that one reading.

use std::borrow::Cow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::OnceLock;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::error::ArgsError;

#[cfg(test)]
mod differential;
#[cfg(test)]
mod oracle;
mod reader;

/// Deepest nesting of arrays and objects in `args` (serde_json's own limit).
pub const MAX_ARGS_DEPTH: usize = 128;
/// Largest exponent (in magnitude) a number in `args` may be written with.
pub const MAX_EXPONENT: u64 = 999_999_999_999_999_999;

/// A call's arguments in canonical JSON: input only, the ledger stores their digest.
#[derive(Clone)]
pub struct Args(String, OnceLock<String>);

// Equal arguments are equal canonical texts; the digest is only remembered.
impl PartialEq for Args {
    fn eq(&self, other: &Args) -> bool {
        self.0 == other.0
    }
}

impl Eq for Args {}

impl Hash for Args {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.hash(h)
    }
}

impl Args {
    /// Read arguments from JSON text, exactly: duplicate keys (at any depth), a bare
    /// `null`, nesting beyond [`MAX_ARGS_DEPTH`] and exponents beyond [`MAX_EXPONENT`]
    /// are errors; every number keeps all its digits.
    pub fn parse(text: &str) -> Result<Args, ArgsError> {
        reader::canonical(text, false).map(|c| Args(c.text, OnceLock::new()))
    }

    /// Read arguments as [`Args::parse`] does, and from the same one reading of the text,
    /// what a reader of their members needs: where each top-level member is in the
    /// canonical text, and the value serde_json reads from it.
    pub fn read(text: &str) -> Result<Read, ArgsError> {
        let c = reader::canonical(text, true)?;
        Ok(Read {
            args: Args(c.text, OnceLock::new()),
            members: c.members,
            value: c.value,
        })
    }

    /// Arguments built in code. A `Value` holds numbers as `u64`, `i64` or `f64`: use
    /// [`Args::parse`] for arguments that arrive as text, so that no digit is lost.
    pub fn from_value(value: &Value) -> Result<Args, ArgsError> {
        Args::parse(&value.to_string())
    }

    /// The canonical JSON text.
    pub fn canonical(&self) -> &str {
        &self.0
    }

    /// BLAKE3 over the canonical JSON, lowercase hex: the `args_digest` stored for them.
    /// Computed once (a proxied call's arguments are its whole body, and both the gate
    /// and the daemon's observer ask for it).
    pub fn digest(&self) -> String {
        self.1
            .get_or_init(|| blake3::hash(self.0.as_bytes()).to_hex().to_string())
            .clone()
    }
}

/// Arguments read once for a reader of their members: what [`Args::read`] gives.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Read {
    /// The arguments.
    pub args: Args,
    /// Where the arguments are one object: each member in key order, its key (decoded)
    /// and where its value's canonical text is in `args.canonical()`; else empty.
    pub members: Vec<(String, Range<usize>)>,
    /// The value serde_json reads from the canonical text; `None` where it reads none (a
    /// number beyond an `f64`, 128 arrays and objects nested).
    pub value: Option<Value>,
}

impl fmt::Debug for Args {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Args({})", self.0)
    }
}

impl Serialize for Args {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let raw = RawValue::from_string(self.0.clone()).map_err(serde::ser::Error::custom)?;
        raw.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Args {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Args, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        Args::parse(raw.get()).map_err(de::Error::custom)
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// `path.key`, or `path["key"]` for a key that is not a plain identifier.
pub(crate) fn push_key(path: &mut String, key: &str) {
    let plain = key
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        path.push('.');
        path.push_str(key);
    } else {
        path.push('[');
        path.push_str(&serde_json::Value::from(key).to_string());
        path.push(']');
    }
}

/// Write a JSON number (valid per RFC 8259: `-? int frac? exp?`) by its exact decimal
/// value: `None` if its exponent is beyond [`MAX_EXPONENT`].
///
/// The value is `± D × 10^e` with `D` the significant digits `d1..dk` (no leading or
/// trailing zero); with `n = k + e` (where the decimal point falls), it is written as
/// ECMAScript's Number::toString writes digits: `D` and `n - k` zeros if `k <= n <= 21`;
/// `d1..dn . d(n+1)..dk` if `0 < n <= 21`; `0.` , `-n` zeros and `D` if `-6 < n <= 0`;
/// else `d1[.d2..dk]e±(n-1)`. Zero (`-0`, `0.0`, `0e7`) is `0`.
pub(crate) fn canonical_number(raw: &str, out: &mut Vec<u8>) -> Option<()> {
    let (negative, rest) = match raw.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, raw),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let (int, frac) = match mantissa.find('.') {
        Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
        None => (mantissa, ""),
    };
    let all = int.bytes().chain(frac.bytes());
    let digits: Vec<u8> = all.skip_while(|&d| d == b'0').collect();
    let trailing = digits.iter().rev().take_while(|&&d| d == b'0').count();
    let digits = &digits[..digits.len() - trailing];
    if digits.is_empty() {
        out.push(b'0');
        return Some(());
    }
    let exp: i64 = match exponent {
        None => 0,
        Some(e) => {
            let (sign, magnitude) = match e.as_bytes().first() {
                Some(b'-') => (-1, &e[1..]),
                Some(b'+') => (1, &e[1..]),
                _ => (1, e),
            };
            let magnitude = magnitude.trim_start_matches('0');
            if magnitude.len() > 18 {
                return None;
            }
            sign * magnitude.parse::<i64>().unwrap_or(0)
        }
    };
    let k = digits.len() as i64;
    // The digits' point: value = 0.d1..dk × 10^n. Bounded: |exp| < 10^18, k < 2^48.
    let n = exp - frac.len() as i64 + trailing as i64 + k;
    if negative {
        out.push(b'-');
    }
    if k <= n && n <= 21 {
        out.extend_from_slice(digits);
        out.extend(std::iter::repeat_n(b'0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.extend_from_slice(&digits[..n as usize]);
        out.push(b'.');
        out.extend_from_slice(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.extend_from_slice(b"0.");
        out.extend(std::iter::repeat_n(b'0', (-n) as usize));
        out.extend_from_slice(digits);
    } else {
        out.push(digits[0]);
        if k > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        out.push(if n > 0 { b'+' } else { b'-' });
        out.extend_from_slice((n - 1).unsigned_abs().to_string().as_bytes());
    }
    Some(())
}

/// An object's members as written: keys decoded, values raw, duplicates kept.
pub(crate) struct Members<'a>(pub(crate) Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::new();
                while let Some(key) = map.next_key_seed(Key)? {
                    members.push((key, map.next_value()?));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(V)
    }
}

/// A key, borrowed from the text when it has no escape.
pub(crate) struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        Args::parse(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .canonical()
            .to_string()
    }

    #[test]
    fn numbers_are_written_by_their_exact_value() {
        for (input, want) in [
            ("0", "0"),
            ("-0", "0"),
            ("0.000", "0"),
            ("-0e-5", "0"),
            ("0e99999999999999999999999", "0"),
            ("1", "1"),
            ("1.0", "1"),
            ("1e2", "100"),
            ("1E+2", "100"),
            ("100e-2", "1"),
            ("-12.50", "-12.5"),
            ("18446744073709551615", "18446744073709551615"),
            ("18446744073709551616", "18446744073709551616"),
            ("-9223372036854775809", "-9223372036854775809"),
            ("123456789012345678901", "123456789012345678901"),
            ("1234567890123456789012", "1.234567890123456789012e+21"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("0.1", "0.1"),
            ("0.1000000000000000000001", "0.1000000000000000000001"),
            ("0.000001", "0.000001"),
            ("0.0000001", "1e-7"),
            ("1.5e-7", "1.5e-7"),
            ("-0.00000123", "-0.00000123"),
            ("1e400", "1e+400"),
            ("12.5e-400", "1.25e-399"),
            ("1e-999999999999999999", "1e-999999999999999999"),
        ] {
            let mut out = Vec::new();
            canonical_number(input, &mut out).unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), want, "{input}");
        }
        assert_eq!(
            canonical_number("1e1000000000000000000", &mut Vec::new()),
            None
        );
    }

    #[test]
    fn the_canonical_form_agrees_with_rfc_8785_on_doubles() {
        // RFC 8785 appendix B (ECMAScript's number serialization), where the input is
        // already written with the shortest digits of its double.
        for (input, want) in [
            ("4.50", "4.5"),
            ("2e-3", "0.002"),
            ("0.000001", "0.000001"),
            ("1e-7", "1e-7"),
            ("1e+21", "1e+21"),
            ("999999999999999900000", "999999999999999900000"),
            ("9007199254740991", "9007199254740991"),
            ("5e-324", "5e-324"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("295147905179352830000", "295147905179352830000"),
            ("333333333.3333333", "333333333.3333333"),
        ] {
            assert_eq!(canon(input), want, "{input}");
        }
    }

    #[test]
    fn objects_sort_keys_strings_decode_whitespace_goes() {
        assert_eq!(
            canon(" { \"b\" : [1 , 2.0, {\"d\":\"\\u0041\",\"c\":null}], \"a\":true } "),
            r#"{"a":true,"b":[1,2,{"c":null,"d":"A"}]}"#
        );
        assert_eq!(canon(r#""a\/b\u00e9\n""#), "\"a/bé\\n\"");
        assert_eq!(canon(r#"{"é":1,"z":2,"Z":3}"#), r#"{"Z":3,"z":2,"é":1}"#);
    }

    #[test]
    fn duplicates_are_named_at_their_depth() {
        for (text, path, key) in [
            (r#"{"a":1,"a":2}"#, "args", "a"),
            (r#"{"a":1,"\u0061":1}"#, "args", "a"),
            (r#"{"x":[0,{"b":0,"id":1,"id":2}]}"#, "args.x[1]", "id"),
            (r#"{"odd key":{"k":1,"k":1}}"#, "args[\"odd key\"]", "k"),
        ] {
            assert_eq!(
                Args::parse(text),
                Err(ArgsError::DuplicateKey {
                    path: path.into(),
                    key: key.into()
                }),
                "{text}"
            );
        }
    }

    use proptest::prelude::*;

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            ".{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
                prop::collection::btree_map(".{0,4}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A number's exact value as (negative, significant digits, exponent), normalized.
    fn spelling() -> impl Strategy<Value = (bool, String, i64, String)> {
        (
            any::<bool>(),
            "[1-9]([0-9]{0,30}[1-9])?",
            -400i64..400,
            0usize..4,
            0usize..4,
            any::<prop::sample::Index>(),
        )
            .prop_map(|(neg, digits, exp, zeros, lead, at)| {
                // The same value, written another way: the point moved, zeros added.
                let mut all = format!("{}{digits}{}", "0".repeat(lead), "0".repeat(zeros));
                let point = at.index(all.len() + 1);
                let frac = (all.len() - point) as i64;
                let e = exp + frac - zeros as i64;
                if point < all.len() {
                    all.insert(point, '.');
                    if point == 0 {
                        all.insert(0, '0');
                    }
                }
                let text = format!("{}{all}e{e}", if neg { "-" } else { "" });
                (neg, digits, exp, text)
            })
    }

    fn number(text: &str) -> String {
        let mut out = Vec::new();
        canonical_number(text, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn text_and_values_built_in_code_agree(v in value()) {
            let mut want = Vec::new();
            crate::decision::canonical_json(&v, &mut want);
            let want = String::from_utf8(want).unwrap();
            if v.is_null() {
                prop_assert_eq!(Args::parse(&v.to_string()), Err(ArgsError::Null));
            } else {
                prop_assert_eq!(canon(&v.to_string()), want.clone());
                prop_assert_eq!(canon(&serde_json::to_string_pretty(&v).unwrap()), want.clone());
                prop_assert_eq!(Args::from_value(&v).unwrap().digest(), crate::decision::args_digest(&v));
                // Canonical JSON is a fixed point, and reads back as the same value.
                prop_assert_eq!(canon(&want), want.clone());
            }
        }

        #[test]
        fn one_value_one_form_two_values_two_forms(
            a in spelling(),
            b in spelling(),
        ) {
            let (fa, fb) = (number(&a.3), number(&b.3));
            prop_assert_eq!(&number(&fa), &fa, "fixed point");
            let same = (a.0, &a.1, a.2) == (b.0, &b.1, b.2);
            prop_assert_eq!(fa == fb, same, "{} -> {}, {} -> {}", a.3, fa, b.3, fb);
            // Each spelling of one value: the normalized one too.
            let plain = format!("{}{}e{}", if a.0 { "-" } else { "" }, a.1, a.2);
            prop_assert_eq!(number(&plain), fa);
        }
    }

    #[test]
    fn nulls_depth_and_exponents_are_bounded() {
        assert_eq!(Args::parse(" null "), Err(ArgsError::Null));
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(matches!(Args::parse(&deep), Err(ArgsError::TooDeep { .. })));
        let ok = format!(
            "{}{}",
            "[".repeat(MAX_ARGS_DEPTH),
            "]".repeat(MAX_ARGS_DEPTH)
        );
        assert_eq!(canon(&ok), ok);
        assert!(matches!(
            Args::parse(r#"{"n":[1e1000000000000000000]}"#),
            Err(ArgsError::ExponentOutOfRange { path, .. }) if path == "args.n[0]"
        ));
        assert!(matches!(Args::parse("{"), Err(ArgsError::Json { .. })));
        assert!(matches!(
            Args::parse(r#""\ud800""#),
            Err(ArgsError::Json { .. })
        ));
        assert!(matches!(
            Args::parse("\"a\u{1}\""),
            Err(ArgsError::Json { .. })
        ));
        assert!(matches!(Args::parse("1 2"), Err(ArgsError::Json { .. })));
        assert!(matches!(Args::parse("01"), Err(ArgsError::Json { .. })));
    }

    #[test]
    fn the_digest_is_remembered_and_is_no_part_of_equality() {
        use std::hash::BuildHasher;
        let a = Args::parse(r#"{"b":[1.0],"a":"x"}"#).unwrap();
        let b = a.clone();
        let want = blake3::hash(br#"{"a":"x","b":[1]}"#).to_hex().to_string();
        assert_eq!(a.digest(), want);
        assert_eq!(a.digest(), want);
        // `a` remembers its digest, `b` does not yet: still equal, and hashed alike.
        assert_eq!(a, b);
        let state = std::collections::hash_map::RandomState::new();
        assert_eq!(state.hash_one(&a), state.hash_one(&b));
        assert_eq!(b.digest(), want);
        assert_ne!(a, Args::parse(r#"{"a":"y"}"#).unwrap());
    }

    #[test]
    fn args_travel_as_their_canonical_json() {
        let args = Args::parse(r#"{"n": 18446744073709551617, "a": 1.50}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&args).unwrap(),
            r#"{"a":1.5,"n":18446744073709551617}"#
        );
        // From a `Value` deserializer as from text (f64 and u64 only there).
        let v = serde_json::json!({"n": 3, "a": 1.5});
        let from_value: Args = serde_json::from_value(v).unwrap();
        assert_eq!(from_value.canonical(), r#"{"a":1.5,"n":3}"#);
    }
}
