//! `[upstreams.NAME]` and `[prices...]`: read exactly, unknown keys and bad values refused
//! with the key and line.

use tally_policy::{Policy, PolicyError, UpstreamKind};
use tally_record::money::Nanos;

const GOOD: &str = r#"
[upstreams.openai]
url = "https://api.openai.com"
kind = "openai"
credential = "openai"
paths = ["/v1/chat/completions"]

[upstreams.search]
url = "http://127.0.0.1:9/base/"
kind = "http"
credential = "search"
methods = ["POST", "GET"]
paths = ["/v1/search"]
cost_header = "x-cost-usd"

[prices.openai."gpt-4o-mini"]
input_per_mtok = 0.15
cached_input_per_mtok = "0.075"
output_per_mtok = "0.60"
max_output_tokens = 16384

[prices.openai."gpt-4.1"]
input_per_mtok = 2
output_per_mtok = 8.000000001

[prices.openai."claude-ish"]
input_per_mtok = 3
cache_write_per_mtok = "3.75"
cache_write_1h_per_mtok = 6
output_per_mtok = 15

[prices.search.routes."POST /v1/search"]
per_call = "0.002"
"#;

#[test]
fn prices_are_read_exactly_from_their_text() {
    let p = Policy::from_toml(GOOD).expect("parses");
    let u = &p.upstreams["openai"];
    assert_eq!(u.kind, UpstreamKind::Openai);
    assert_eq!(u.methods, ["POST"]);
    assert_eq!(u.max_request_bytes, 1024 * 1024);
    assert_eq!(u.timeout_ms, 120_000);
    let m = p.prices.model("openai", "gpt-4o-mini").expect("priced");
    assert_eq!(m.input_per_mtok, Nanos(150_000_000));
    assert_eq!(m.cached_input_per_mtok, Nanos(75_000_000));
    assert_eq!(m.output_per_mtok, Nanos(600_000_000));
    assert_eq!(m.max_output_tokens, 16_384);
    let m = p
        .prices
        .model("openai", "gpt-4.1")
        .expect("dotted model name");
    // A float would round 8.000000001; the literal text does not.
    assert_eq!(m.output_per_mtok, Nanos(8_000_000_001));
    assert_eq!(m.cached_input_per_mtok, Nanos(2_000_000_000));
    assert_eq!(m.max_output_tokens, 4_096);
    // Cache writes have no default price: none is guessed.
    assert_eq!(m.cache_write_per_mtok, None);
    assert_eq!(m.cache_write_1h_per_mtok, None);
    let m = p.prices.model("openai", "claude-ish").expect("priced");
    assert_eq!(m.cache_write_per_mtok, Some(Nanos(3_750_000_000)));
    assert_eq!(m.cache_write_1h_per_mtok, Some(Nanos(6_000_000_000)));
    assert_eq!(m.input_worst_per_mtok(), Nanos(6_000_000_000));
    assert_eq!(
        p.prices
            .route("search", "POST /v1/search")
            .map(|r| r.per_call),
        Some(Nanos(2_000_000))
    );
    // What `tally policy check` prints parses back to the same policy.
    let again = Policy::from_toml(&p.to_toml()).expect("round trip");
    assert_eq!(again, p);
}

fn refused(text: &str) -> PolicyError {
    Policy::from_toml(text).expect_err("must be refused")
}

#[test]
fn bad_upstreams_and_prices_are_refused_with_key_and_line() {
    let upstream = "[upstreams.openai]\nurl = \"https://api.openai.com\"\nkind = \"openai\"\ncredential = \"openai\"\n";
    for (extra, key, line) in [
        (
            "[prices.openai.m]\ninput_per_mtok = 1e-3\noutput_per_mtok = 1\n",
            "prices.openai.m.input_per_mtok",
            7,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = -1.0\noutput_per_mtok = 1\n",
            "prices.openai.m.input_per_mtok",
            7,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 0.0000000001\noutput_per_mtok = 1\n",
            "prices.openai.m.input_per_mtok",
            7,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = \"1,5\"\noutput_per_mtok = 1\n",
            "prices.openai.m.input_per_mtok",
            7,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 1\n",
            "prices.openai.m.output_per_mtok",
            6,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 1\noutput_per_mtok = 1\nunknown = 1\n",
            "prices.openai.m.unknown",
            9,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 1\noutput_per_mtok = 1\nmax_output_tokens = 0\n",
            "prices.openai.m.max_output_tokens",
            9,
        ),
        (
            "[prices.other.m]\ninput_per_mtok = 1\noutput_per_mtok = 1\n",
            "prices.other",
            0,
        ),
        (
            "[prices.openai.routes.\"POST /x\"]\nper_call = 1\n",
            "prices.openai.routes",
            0,
        ),
    ] {
        match refused(&format!("{upstream}\n{extra}")) {
            PolicyError::Invalid {
                key: k, line: l, ..
            } => {
                assert_eq!(k, key, "{extra}");
                if line > 0 {
                    assert_eq!(l, Some(line), "{extra}");
                }
            }
            other => panic!("{extra}: {other:?}"),
        }
    }
    for (text, key) in [
        ("[upstreams.a]\nurl = \"ftp://x\"\nkind = \"openai\"\ncredential = \"c\"\n", "upstreams.a.url"),
        ("[upstreams.a]\nurl = \"https://u:p@x\"\nkind = \"openai\"\ncredential = \"c\"\n", "upstreams.a.url"),
        ("[upstreams.a]\nurl = \"https://x\"\nkind = \"openai\"\ncredential = \"\"\n", "upstreams.a.credential"),
        ("[upstreams.a]\nurl = \"https://x\"\nkind = \"openai\"\ncredential = \"c\"\npaths = [\"v1\"]\n", "upstreams.a.paths"),
        ("[upstreams.a]\nurl = \"https://x\"\nkind = \"openai\"\ncredential = \"c\"\npaths = [\"/v1/../admin\"]\n", "upstreams.a.paths"),
        ("[upstreams.a]\nurl = \"https://x\"\nkind = \"openai\"\ncredential = \"c\"\nmethods = [\"post\"]\n", "upstreams.a.methods"),
        ("[upstreams.a]\nurl = \"https://x\"\nkind = \"openai\"\ncredential = \"c\"\nmax_request_bytes = 0\n", "upstreams.a.max_request_bytes"),
        ("[upstreams.a]\nurl = \"https://x\"\nkind = \"openai\"\ncredential = \"c\"\ncost_header = \"x-cost\"\n", "upstreams.a.cost_header"),
        ("[upstreams.\"a/b\"]\nurl = \"https://x\"\nkind = \"openai\"\ncredential = \"c\"\n", "upstreams.a/b"),
    ] {
        match refused(text) {
            PolicyError::Invalid { key: k, .. } => assert_eq!(k, key, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
    // Unknown keys and kinds: the typed parse names them.
    for text in [
        "[upstreams.a]\nurl = \"https://x\"\nkind = \"openai\"\ncredential = \"c\"\nretries = 3\n",
        "[upstreams.a]\nurl = \"https://x\"\nkind = \"grpc\"\ncredential = \"c\"\n",
        "[upstreams.a]\nkind = \"openai\"\ncredential = \"c\"\n",
    ] {
        match refused(text) {
            PolicyError::Toml { line, .. } => assert!(line.is_some(), "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
}
