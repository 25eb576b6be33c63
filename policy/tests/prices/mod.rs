//! Money in the policy: spend limits in exact dollars or cents, credentials' period
//! spend, and `[tool_prices]`: read exactly, never through a float, errors with key and
//! line.

use tally_policy::Policy;
use tally_record::money::Nanos;

#[test]
fn budgets_read_dollars_or_cents_exactly_and_never_both() {
    let p = Policy::from_toml("[ceiling]\nspend_usd = \"12.50\"\n").unwrap();
    assert_eq!(p.ceiling.spend_nanos, Some(12_500_000_000));
    assert_eq!(p.ceiling.spend_cents, None);
    let p = Policy::from_toml("[ceiling]\nspend_cents = 1250\n").unwrap();
    assert_eq!(p.ceiling.spend_nanos, Some(12_500_000_000));
    let p = Policy::from_toml("[ceiling]\nspend_usd = \"0.000000001\"\n").unwrap();
    assert_eq!(p.ceiling.spend_nanos, Some(1));
    for (text, says) in [
        (
            "[ceiling]\nspend_usd = \"1\"\nspend_cents = 100\n",
            "two units",
        ),
        ("[ceiling]\nspend_usd = 12.5\n", "quoted decimal"),
        ("[ceiling]\nspend_usd = 12\n", "quoted decimal"),
        ("[ceiling]\nspend_usd = \"1e3\"\n", "not a decimal"),
        ("[ceiling]\nspend_usd = \"-1\"\n", "not a decimal"),
        ("[ceiling]\nspend_usd = \"0.0000000001\"\n", "9 digits"),
        ("[ceiling]\nspend_cents = 1844674407371\n", "too large"),
        ("[ceiling]\nspend_cents = -1\n", "whole number"),
        ("[ceiling]\nspend_cents = 1.5\n", "whole number"),
        ("[ceiling]\nspend_nanos = 5\n", "unknown field"),
        ("[tool_prices]\nsearch = 0.01\n", "quoted decimal"),
        ("[tool_prices]\nsearch = \"0.01$\"\n", "not a decimal"),
        (
            "[credentials.c]\nspend_usd_per_period = \"1\"\nspend_cents_per_period = 1\n",
            "two units",
        ),
    ] {
        let e = Policy::from_toml(text).unwrap_err().to_string();
        assert!(e.contains(says), "{text:?}: {e}");
        assert!(e.contains("line"), "{text:?} names no line: {e}");
    }
}

#[test]
fn tool_prices_set_the_least_reservation() {
    let p = Policy::from_toml("[tool_prices]\nsearch = \"0.000150\"\n").unwrap();
    assert_eq!(p.tool_price("search"), Some(Nanos(150_000)));
    assert_eq!(p.reservation("search", 0), 150_000);
    assert_eq!(p.reservation("search", 200_000), 200_000);
    assert_eq!(p.reservation("other", 7), 7);
    // What `tally policy check` prints reads back to the same policy.
    let again = Policy::from_toml(&p.to_toml()).unwrap();
    assert_eq!(again, p);
    let c = Policy::from_toml("[credentials.c]\nspend_usd_per_period = \"2.5\"\n").unwrap();
    assert_eq!(
        c.credentials["c"].spend_nanos_per_period,
        Some(2_500_000_000)
    );
    assert_eq!(Policy::from_toml(&c.to_toml()).unwrap(), c);
}
