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
    // The input's worst case follows the body's cache markers: the input price
    // without any, a cache-write price only where one is marked.
    use tally_policy::CacheMark;
    assert_eq!(m.input_rate(CacheMark::None), Some(Nanos(3_000_000_000)));
    assert_eq!(
        m.input_rate(CacheMark::FiveMinutes),
        Some(Nanos(3_750_000_000))
    );
    assert_eq!(m.input_rate(CacheMark::OneHour), Some(Nanos(6_000_000_000)));
    let m = p.prices.model("openai", "gpt-4.1").expect("priced");
    assert_eq!(m.input_rate(CacheMark::FiveMinutes), None, "no write price");
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
            "[prices.openai.m]\ninput_per_mtok = 1\ncached_input_per_mtok = 2\noutput_per_mtok = 1\n",
            "prices.openai.m.cached_input_per_mtok",
            8,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 1\noutput_per_mtok = 1\ncontext_tokens = 0\n",
            "prices.openai.m.context_tokens",
            9,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 1\noutput_per_mtok = 1\ntool_prompt_tokens = -1\n",
            "prices.openai.m.tool_prompt_tokens",
            9,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 1\noutput_per_mtok = 1\nmax_tokens_field = \"max_output_tokens\"\n",
            "prices.openai.m.max_tokens_field",
            9,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 1\noutput_per_mtok = 1\naliases = \"m2\"\n",
            "prices.openai.m.aliases",
            9,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 1\noutput_per_mtok = 1\nweb_search_per_use = \"x\"\n",
            "prices.openai.m.web_search_per_use",
            9,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 1\noutput_per_mtok = 1\naliases = [\"n\"]\n[prices.openai.n]\ninput_per_mtok = 1\noutput_per_mtok = 1\n",
            "prices.openai.n.aliases",
            0,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 1\noutput_per_mtok = 1\naliases = [\"x\"]\n[prices.openai.n]\ninput_per_mtok = 1\noutput_per_mtok = 1\naliases = [\"x\"]\n",
            "prices.openai.n.aliases",
            0,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 1\noutput_per_mtok = 1\nimage_tokens = 0\n",
            "prices.openai.m.image_tokens",
            9,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 1\noutput_per_mtok = 1\nservice_tiers = [\"flex\"]\n",
            "prices.openai.m.service_tiers",
            9,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 1\noutput_per_mtok = 1\n[prices.openai.m.tiers.flex]\ninput_per_mtok = 1\n",
            "prices.openai.m.tiers.flex.output_per_mtok",
            9,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 1\noutput_per_mtok = 1\n[prices.openai.m.tiers.default]\ninput_per_mtok = 1\noutput_per_mtok = 1\n",
            "prices.openai.m.tiers.default",
            9,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 1\noutput_per_mtok = 1\n[prices.openai.m.tiers.flex]\ninput_per_mtok = 1\ncached_input_per_mtok = 2\noutput_per_mtok = 1\n",
            "prices.openai.m.tiers.flex.cached_input_per_mtok",
            11,
        ),
        (
            "[prices.openai.m]\ninput_per_mtok = 1\noutput_per_mtok = 1\n[prices.openai.m.tiers.flex]\ninput_per_mtok = 1\noutput_per_mtok = 1\nweb_search_per_use = 1\n",
            "prices.openai.m.tiers.flex.web_search_per_use",
            12,
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
        ("[upstreams.a]\nkind = \"openai\"\ncredential = \"c\"\n", "upstreams.a.url"),
        ("[upstreams.a]\nurl = \"https://x\"\nurl_file = \"/u\"\nkind = \"openai\"\ncredential = \"c\"\n", "upstreams.a.url_file"),
        ("[upstreams.a]\nurl_file = \"\"\nkind = \"openai\"\ncredential = \"c\"\n", "upstreams.a.url_file"),
        ("[upstreams.a]\nurl = \"https://x:99999/v1\"\nkind = \"openai\"\ncredential = \"c\"\n", "upstreams.a.url"),
        ("[upstreams.a]\nurl = \"https://x/{v1}\"\nkind = \"openai\"\ncredential = \"c\"\n", "upstreams.a.url"),
        ("[upstreams.a]\nurl = \"https://x\"\nkind = \"openai\"\ncredential = \"\"\n", "upstreams.a.credential"),
        ("[upstreams.a]\nurl = \"https://x\"\nkind = \"openai\"\ncredential = \"c\"\npaths = [\"v1\"]\n", "upstreams.a.paths"),
        ("[upstreams.a]\nurl = \"https://x\"\nkind = \"openai\"\ncredential = \"c\"\npaths = [\"/v1/../admin\"]\n", "upstreams.a.paths"),
        ("[upstreams.a]\nurl = \"https://x\"\nkind = \"openai\"\ncredential = \"c\"\nmethods = [\"post\"]\n", "upstreams.a.methods"),
        ("[upstreams.a]\nurl = \"https://x\"\nkind = \"openai\"\ncredential = \"c\"\nmax_request_bytes = 0\n", "upstreams.a.max_request_bytes"),
        ("[upstreams.a]\nurl = \"https://x\"\nkind = \"openai\"\ncredential = \"c\"\ncost_header = \"x-cost\"\n", "upstreams.a.cost_header"),
        ("[upstreams.a]\nurl = \"https://x\"\nkind = \"openai\"\ncredential = \"c\"\nanthropic_beta = [\"b\"]\n", "upstreams.a.anthropic_beta"),
        ("[upstreams.a]\nurl = \"https://x\"\nkind = \"anthropic\"\ncredential = \"c\"\nanthropic_beta = [\"a,b\"]\n", "upstreams.a.anthropic_beta"),
        ("[upstreams.a]\nurl = \"https://x\"\nkind = \"http\"\ncredential = \"c\"\nclamp_max_tokens = true\n", "upstreams.a.clamp_max_tokens"),
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
    ] {
        match refused(text) {
            PolicyError::Toml { line, .. } => assert!(line.is_some(), "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
}

const MODELS: &str = r#"
[upstreams.anthropic]
url = "https://api.anthropic.com"
kind = "anthropic"
credential = "anthropic"
paths = ["/v1/messages"]
clamp_max_tokens = true
anthropic_beta = ["context-management-2025-06-27"]

[prices.anthropic."claude-haiku-4-5"]
input_per_mtok = 1
output_per_mtok = 5
aliases = ["claude-haiku-4-5-20251001", "haiku"]
tool_prompt_tokens = 346
web_search_per_use = "0.01"
web_search_tokens_per_use = 4000
context_tokens = 200000
image_tokens = 1600

[prices.anthropic."claude-haiku-4-5".tiers.priority]
input_per_mtok = "1.25"
cached_input_per_mtok = "0.125"
output_per_mtok = "6.25"

[prices.anthropic."claude-sonnet-4-5"]
input_per_mtok = 3
output_per_mtok = 15

[prices.anthropic."claude-sonnet-4-5-20250101"]
input_per_mtok = 4
output_per_mtok = 16

[upstreams.openai]
url = "https://api.openai.com"
kind = "openai"
credential = "openai"
paths = ["/v1/responses"]

[prices.openai."o4-mini"]
input_per_mtok = "1.10"
output_per_mtok = "4.40"
max_tokens_field = "max_completion_tokens"
"#;

#[test]
fn prices_name_the_ids_they_cover_and_the_overheads_they_add() {
    use tally_policy::MaxTokensField;
    let p = Policy::from_toml(MODELS).expect("parses");
    let u = &p.upstreams["anthropic"];
    assert!(u.clamp_max_tokens);
    assert_eq!(u.anthropic_beta, ["context-management-2025-06-27"]);
    assert!(!p.upstreams["openai"].clamp_max_tokens, "off by default");
    let haiku = p
        .prices
        .model("anthropic", "claude-haiku-4-5")
        .expect("priced");
    assert_eq!(haiku.tool_prompt_tokens, 346);
    assert_eq!(haiku.web_search_per_use, Some(Nanos(10_000_000)));
    assert_eq!(haiku.web_search_tokens_per_use, 4000);
    assert_eq!(haiku.context_tokens, 200_000);
    assert_eq!(haiku.image_tokens, Some(1600));
    let priority = haiku.at_tier("priority").expect("a tier of its own");
    assert_eq!(
        (
            priority.input_per_mtok,
            priority.cached_input_per_mtok,
            priority.output_per_mtok,
            priority.cache_write_per_mtok,
            priority.tool_prompt_tokens,
        ),
        (
            Nanos(1_250_000_000),
            Nanos(125_000_000),
            Nanos(6_250_000_000),
            None,
            346
        ),
        "the tier's rates, the model's other keys"
    );
    assert_eq!(haiku.at_tier("flex"), None);
    for id in [
        "claude-haiku-4-5-20251001",
        "haiku",
        "claude-haiku-4-5-20990101",
    ] {
        assert_eq!(p.prices.model("anthropic", id), Some(haiku), "{id}");
    }
    let sonnet = p
        .prices
        .model("anthropic", "claude-sonnet-4-5")
        .expect("priced");
    assert_eq!(sonnet.context_tokens, 2_000_000, "the default");
    assert_eq!(sonnet.tool_prompt_tokens, 0);
    assert_eq!(sonnet.max_tokens_field, MaxTokensField::MaxTokens);
    assert_eq!(
        p.prices.model("anthropic", "claude-sonnet-4-5-20250929"),
        Some(sonnet)
    );
    // A snapshot priced by its own name is its own price, not the dated rule's.
    assert_eq!(
        p.prices
            .model("anthropic", "claude-sonnet-4-5-20250101")
            .map(|m| m.input_per_mtok),
        Some(Nanos(4_000_000_000))
    );
    // The rule is a dash and exactly 8 digits, nothing else.
    for id in [
        "claude-sonnet-4-5-2025092",
        "claude-sonnet-4-5-202509290",
        "claude-sonnet-4-5-2025-09-29",
        "claude-sonnet-4-5-latest",
        "claude-sonnet-4-5x20250929",
        "claude-sonnet-4-5-20250929-20250929",
        "claude-sonnet-4-5-2025092a",
    ] {
        assert_eq!(p.prices.model("anthropic", id), None, "{id}");
    }
    assert_eq!(
        p.prices
            .model("openai", "o4-mini")
            .map(|m| m.max_tokens_field),
        Some(MaxTokensField::MaxCompletionTokens)
    );
    let covers = p.prices.coverage(|u| p.upstreams.get(u).map(|u| u.kind));
    assert!(covers.contains(&(
        "anthropic".into(),
        "claude-haiku-4-5".into(),
        vec![
            "claude-haiku-4-5".into(),
            "claude-haiku-4-5-20251001".into(),
            "haiku".into(),
            "claude-haiku-4-5-YYYYMMDD".into()
        ]
    )));
    let again = Policy::from_toml(&p.to_toml()).expect("round trip");
    assert_eq!(again, p);
}

/// Azure OpenAI's `deployments` and `api_versions`: its own, both required, each name
/// one Azure allows, each deployment mapped to a model priced on that upstream; the
/// Gemini kind reads like any model upstream.
#[test]
fn azure_deployments_map_to_priced_models_and_versions_are_listed() {
    let azure = "[upstreams.az]\nurl = \"https://x.openai.azure.com\"\nkind = \"azure_openai\"\ncredential = \"c\"\npaths = [\"/openai/deployments\"]\n";
    let priced = "[prices.az.\"gpt-4o\"]\ninput_per_mtok = 1\noutput_per_mtok = 2\n";
    let ok = format!("{azure}deployments = {{ \"prod-4o\" = \"gpt-4o\" }}\napi_versions = [\"2024-10-21\"]\n{priced}");
    let p = Policy::from_toml(&ok).expect("an azure upstream");
    let u = &p.upstreams["az"];
    assert_eq!(u.kind, tally_policy::UpstreamKind::AzureOpenai);
    assert_eq!(u.deployments["prod-4o"], "gpt-4o");
    assert_eq!(u.api_versions, ["2024-10-21"]);
    let g_head = "[upstreams.g]\nurl = \"https://generativelanguage.googleapis.com\"\nkind = \"gemini\"\ncredential = \"c\"\npaths = [\"/v1beta/models\"]\n";
    let g_price =
        "[prices.g.\"gemini-2.5-flash\"]\ninput_per_mtok = \"0.30\"\noutput_per_mtok = \"2.50\"\n";
    let gemini = &format!("{g_head}{g_price}");
    assert_eq!(
        Policy::from_toml(gemini)
            .expect("a gemini upstream")
            .upstreams["g"]
            .kind,
        tally_policy::UpstreamKind::Gemini
    );
    for (text, key) in [
        (format!("{azure}api_versions = [\"2024-10-21\"]\n{priced}"), "upstreams.az.deployments"),
        (format!("{azure}deployments = {{ \"prod-4o\" = \"gpt-4o\" }}\n{priced}"), "upstreams.az.api_versions"),
        (format!("{azure}deployments = {{ \"prod-4o\" = \"gpt-5\" }}\napi_versions = [\"v\"]\n{priced}"), "upstreams.az.deployments"),
        (format!("{azure}deployments = {{ \"a/b\" = \"gpt-4o\" }}\napi_versions = [\"v\"]\n{priced}"), "upstreams.az.deployments"),
        (format!("{azure}deployments = {{ \".x\" = \"gpt-4o\" }}\napi_versions = [\"v\"]\n{priced}"), "upstreams.az.deployments"),
        (format!("{azure}deployments = {{ \"x\" = \"gpt-4o\" }}\napi_versions = [\"a&b=c\"]\n{priced}"), "upstreams.az.api_versions"),
        (format!("{g_head}deployments = {{ \"x\" = \"gemini-2.5-flash\" }}\n{g_price}"), "upstreams.g.deployments"),
        (format!("{g_head}api_versions = [\"v1\"]\n{g_price}"), "upstreams.g.api_versions"),
    ] {
        match refused(&text) {
            PolicyError::Invalid { key: k, .. } => assert_eq!(k, key, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
}

/// Bedrock's `aws_region`: its own and required there, a region's name; a Bedrock id is
/// priced with and without its version suffix and its geographic prefix, most specific
/// first, each under the dated-suffix rule.
#[test]
fn bedrock_needs_its_region_and_prices_ids_by_version_and_geography() {
    let head = "[upstreams.b]\nurl = \"https://bedrock-runtime.us-east-1.amazonaws.com\"\nkind = \"bedrock\"\ncredential = \"aws\"\npaths = [\"/model\"]\n";
    let priced =
        "[prices.b.\"amazon.nova-pro\"]\ninput_per_mtok = \"0.80\"\noutput_per_mtok = \"3.20\"\n";
    let ok = format!("{head}aws_region = \"us-east-1\"\n{priced}");
    let p = Policy::from_toml(&ok).expect("a bedrock upstream");
    assert_eq!(p.upstreams["b"].kind, tally_policy::UpstreamKind::Bedrock);
    assert_eq!(p.upstreams["b"].aws_region.as_deref(), Some("us-east-1"));
    assert_eq!(Policy::from_toml(&p.to_toml()).expect("round trip"), p);
    for (text, key) in [
        (format!("{head}{priced}"), "upstreams.b.aws_region"),
        (
            format!("{head}aws_region = \"US East 1\"\n{priced}"),
            "upstreams.b.aws_region",
        ),
        (
            "[upstreams.o]\nurl = \"https://api.openai.com\"\nkind = \"openai\"\ncredential = \"c\"\naws_region = \"us-east-1\"\n".to_owned(),
            "upstreams.o.aws_region",
        ),
        // Signed as a POST: no other method.
        (
            format!("{head}aws_region = \"us-east-1\"\nmethods = [\"POST\", \"GET\"]\n{priced}"),
            "upstreams.b.methods",
        ),
        (
            format!("{head}aws_region = \"us-east-1\"\nmethods = [\"PUT\"]\n{priced}"),
            "upstreams.b.methods",
        ),
    ] {
        match refused(&text) {
            PolicyError::Invalid { key: k, .. } => assert_eq!(k, key, "{text}"),
            e => panic!("{text}: {e}"),
        }
    }
    for id in [
        "amazon.nova-pro",
        "amazon.nova-pro-v1:0",
        "us.amazon.nova-pro-v1:0",
        "apac.amazon.nova-pro-v1",
    ] {
        assert!(p.prices.bedrock_model("b", id).is_some(), "{id}");
    }
    // The one rule the proxy, the metrics and `tally policy check` use: by the id's class.
    let bedrock = tally_policy::UpstreamKind::Bedrock;
    for id in [
        "us.amazon.nova-pro-v1:0",
        "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-pro-v1:0",
        "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-pro-v1:0",
    ] {
        assert!(p.prices.priced(bedrock, "b", id).is_some(), "{id}");
    }
    for id in [
        "Amazon.nova-pro",
        "arn:aws:bedrock:us-east-1:123456789012:provisioned-model/amazon.nova-pro",
        "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/x1",
    ] {
        assert!(p.prices.priced(bedrock, "b", id).is_none(), "{id}");
    }
    // Another kind's ids are as priced, no Bedrock rule.
    let openai = tally_policy::UpstreamKind::Openai;
    assert!(p
        .prices
        .priced(openai, "b", "us.amazon.nova-pro-v1:0")
        .is_none());
    let covers = p.prices.coverage(|u| p.upstreams.get(u).map(|u| u.kind));
    assert!(
        covers[0]
            .2
            .contains(&"[GEO.]amazon.nova-pro[-YYYYMMDD][-vN[:M]]".to_owned()),
        "{covers:?}"
    );
    assert!(p.prices.coverage(|_| Some(openai))[0].2.len() == 2);
    for id in [
        "amazon.nova-pro-v1:0:300k",
        "xx.amazon.nova-pro-v1:0",
        "amazon.nova-pro-vx",
    ] {
        assert!(p.prices.bedrock_model("b", id).is_none(), "{id}");
    }
    // The common rule alone does not know Bedrock's suffix.
    assert!(p.prices.model("b", "amazon.nova-pro-v1:0").is_none());
    assert_eq!(
        tally_policy::upstreams::bedrock_ids("us.amazon.nova-pro-v1:0"),
        [
            "us.amazon.nova-pro-v1:0",
            "us.amazon.nova-pro",
            "amazon.nova-pro-v1:0",
            "amazon.nova-pro"
        ]
    );
}

/// docs/PROXY.md: the proxy injects the upstream's credential, so a policy put in force
/// reaches an upstream over `https://`, plain `http://` to a loopback host only. The
/// refusal names the upstream's key and line, says what to write, and shows the URL
/// redacted (its path may hold a secret). A ledger recorded under an earlier build's
/// policy with such an upstream still reads its policy record, but the proxy is never
/// built over it.
#[test]
fn plain_http_upstreams_reach_loopback_hosts_only_in_a_policy_put_in_force() {
    use tally_policy::Recorded;
    let upstream = |url: &str| {
        format!("[upstreams.gw]\nurl = \"{url}\"\nkind = \"openai\"\ncredential = \"c\"\n")
    };
    for url in [
        "http://127.0.0.1:8080",
        "http://127.9.9.9/v1",
        "http://[::1]:4000/base",
        "http://localhost:4000",
        "http://LOCALHOST",
        "https://gateway.example.com/v1",
        "https://10.0.0.7:8443",
    ] {
        Policy::from_toml(&upstream(url)).unwrap_or_else(|e| panic!("{url}: {e}"));
    }
    for (url, host) in [
        ("http://10.0.0.7:8000/t/SECRET/v1", "10.0.0.7:8000"),
        ("http://gateway.example.com/SECRET", "gateway.example.com"),
        ("http://localhost.example.com", "localhost.example.com"),
        (
            "http://127.0.0.1.example.com/SECRET",
            "127.0.0.1.example.com",
        ),
        ("http://[::2]:80/SECRET", "[::2]:80"),
        ("http://0.0.0.0:8080", "0.0.0.0:8080"),
    ] {
        let text = format!("# a gateway\n\n{}", upstream(url));
        match Policy::from_toml(&text) {
            Err(e @ PolicyError::Invalid { .. }) => {
                let PolicyError::Invalid { key, why, line } = &e else {
                    unreachable!()
                };
                assert_eq!(
                    (key.as_str(), *line),
                    ("upstreams.gw.url", Some(4)),
                    "{url}"
                );
                assert!(
                    why.contains("not loopback")
                        && why.contains(&format!("`https://{host}`"))
                        && why.contains("127.0.0.1"),
                    "{url}: {why}"
                );
                let said = e.to_string();
                assert!(
                    said.starts_with("policy: line 4: `upstreams.gw.url`"),
                    "{said}"
                );
                assert!(!said.contains("SECRET"), "{said}");
            }
            other => panic!("{url}: {other:?}"),
        }
        assert!(Recorded::new(&text).is_err(), "{url}");
        let recorded = Recorded::from_ledger(&text).expect("a recorded policy reads");
        let u = &recorded.policy.upstreams["gw"];
        assert_eq!(u.url.as_deref(), Some(url));
        assert!(u.in_force_problem().is_some(), "{url}");
    }
}

/// A URL the policy refuses is shown redacted in the refusal: a secret in its user info
/// or path is not repeated (to the terminal, `tally policy check`'s output, the log).
#[test]
fn a_refused_upstream_url_is_shown_without_its_secrets() {
    for url in [
        "https://user:SECRET@gateway.example.com/v1",
        "https://SECRET@gateway.example.com",
        "https://gateway.example.com/SECRET?x=1",
        "https://gateway.example.com/SECRET/../v1",
        "ftp://gateway.example.com/SECRET",
        "gateway.example.com/SECRET",
    ] {
        let text =
            format!("[upstreams.gw]\nurl = \"{url}\"\nkind = \"openai\"\ncredential = \"c\"\n");
        let e = refused(&text);
        let said = e.to_string();
        assert!(said.contains("upstreams.gw.url"), "{url}: {said}");
        assert!(!said.contains("SECRET"), "{url}: {said}");
    }
}

/// A URL every earlier build took in a proxy upstream, which the one strict reading now
/// refuses in force (a port out of range, a path the client would percent-encode, a host
/// that is no host name), still reads from a ledger's recorded policy; what every build
/// refused stays refused there too.
#[test]
fn a_recorded_upstream_url_of_the_old_shape_reads_but_is_not_put_in_force() {
    use tally_policy::Recorded;
    let upstream = |url: &str| {
        format!("[upstreams.gw]\nurl = \"{url}\"\nkind = \"openai\"\ncredential = \"c\"\n")
    };
    for url in [
        "https://x:99999/v1",
        "https://x/{v1}",
        "https://x..y/v1",
        "https://127.1/v1",
    ] {
        let text = upstream(url);
        assert!(Policy::from_toml(&text).is_err(), "{url}");
        let recorded = Recorded::from_ledger(&text).expect("a recorded policy reads");
        let u = &recorded.policy.upstreams["gw"];
        assert!(u.in_force_problem().is_some(), "{url}");
    }
    for url in [
        "https://u:p@x/v1",
        "https://x/v1?k=v",
        "https://x/%41",
        "https://x/../v1",
    ] {
        assert!(Recorded::from_ledger(&upstream(url)).is_err(), "{url}");
    }
}

/// An upstream's URL given in a `url_file`: the policy names the file only (recorded in
/// the ledger as written, it holds no URL); the file is read when `tally serve` starts.
#[test]
fn an_upstream_url_file_names_the_file_only() {
    let text = "[upstreams.gw]\nurl_file = \"/etc/tally/gw.url\"\nkind = \"openai\"\ncredential = \"gw\"\n";
    let p = Policy::from_toml(text).expect("a url_file upstream");
    let gw = &p.upstreams["gw"];
    assert_eq!(
        (gw.url.as_deref(), gw.url_file.as_deref()),
        (None, Some("/etc/tally/gw.url"))
    );
    assert_eq!(gw.in_force_problem(), None);
    assert!(tally_policy::upstreams::url_in_force("https://gw.example/t/SECRET/v1").is_ok());
    for url in [
        "http://10.0.0.7/t/SECRET",
        "https://gw.example/t/SECRET?k=1",
        "SECRET",
    ] {
        let why = tally_policy::upstreams::url_in_force(url).expect_err(url);
        assert!(!why.contains("SECRET"), "{url}: {why}");
    }
}

/// Text built of the pieces an attacker would try in a URL.
fn crafted_url() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let scheme = prop::sample::select(vec!["http", "https", "HTTP", "ftp", ""]);
    let user = prop::sample::select(vec!["", "", "", "u@", "u:p@", "@"]);
    let host = prop_oneof![
        "[a-zA-Z0-9._-]{0,10}",
        "[0-9]{1,3}(\\.[0-9]{1,4}){0,4}",
        Just("localhost".to_owned()),
        Just("[::1]".to_owned()),
    ];
    let port = prop_oneof![Just(String::new()), ":[0-9a-z]{0,6}"];
    let path = "(/[a-zA-Z0-9.%\\\\{}<>\"'`@!$&()*+,;=:~_|^\\[\\] ?#-]{0,5}){0,4}";
    (scheme, user, host, port, path).prop_map(|(s, u, h, p, path)| format!("{s}://{u}{h}{p}{path}"))
}

/// `text` as a TOML basic string's content.
fn toml_escaped(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]

    /// Whatever URL a policy puts in force (the one strict reading accepts it, `@` in the
    /// path included), its recorded policy reads back from the ledger, for a proxy
    /// upstream as for an MCP server: an honest ledger always verifies.
    #[test]
    fn a_url_put_in_force_reads_back_from_the_ledger(url in crafted_url()) {
        use tally_policy::Recorded;
        if tally_record::url::UpstreamUrl::parse(&url).is_ok() {
            let url = toml_escaped(&url);
            for text in [
                format!("[upstreams.gw]\nurl = \"{url}\"\nkind = \"openai\"\ncredential = \"c\"\n"),
                format!("[mcp.web]\nurl = \"{url}\"\n"),
            ] {
                let read = Recorded::from_ledger(&text);
                proptest::prop_assert!(read.is_ok(), "{}: {:?}", text, read.err());
            }
        }
    }
}

/// An `@` in a URL's path (a team's handle) is put in force and reads back from the
/// ledger; an `@` before the host (user info) is refused in both.
#[test]
fn an_at_sign_in_the_path_reads_back_but_user_info_does_not() {
    use tally_policy::Recorded;
    for text in [
        "[mcp.x]\nurl = \"https://mcp.example/u/@me/mcp\"\n",
        "[upstreams.gw]\nurl = \"https://gw.example/t/@team/v1\"\nkind = \"openai\"\ncredential = \"c\"\n",
    ] {
        Policy::from_toml(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        Recorded::from_ledger(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    }
    for text in [
        "[mcp.x]\nurl = \"https://me@mcp.example/mcp\"\n",
        "[mcp.x]\nurl = \"https://u:p@mcp.example/u/@me\"\n",
    ] {
        assert!(Recorded::from_ledger(text).is_err(), "{text}");
    }
}
