//! The reading as an attacker meets it: crafted URLs, each with its typed verdict, and
//! whatever it accepts printed by the `url` crate (reqwest's `Url`) as its canonical form.

use proptest::prelude::*;

use super::{Scheme, UpstreamUrl, UrlError};

#[test]
fn crafted_urls_each_get_their_verdict() {
    use UrlError::*;
    for (text, verdict) in [
        ("https://api.openai.com", Ok("https://api.openai.com/")),
        (
            "https://api.openai.com/v1/",
            Ok("https://api.openai.com/v1/"),
        ),
        ("https://API.OpenAI.com/v1", Ok("https://api.openai.com/v1")),
        ("https://h:443/v1", Ok("https://h/v1")),
        ("http://h:80", Ok("http://h/")),
        ("http://127.0.0.1:8000/mcp", Ok("http://127.0.0.1:8000/mcp")),
        ("http://[::1]:8080/t/@team", Ok("http://[::1]:8080/t/@team")),
        (
            "https://gw.example/t/tok-SECRET/v1",
            Ok("https://gw.example/t/tok-SECRET/v1"),
        ),
        (
            "https://h/a|b^c[d]!$&'()*+,;=:~_-",
            Ok("https://h/a|b^c[d]!$&'()*+,;=:~_-"),
        ),
        ("https://h//v1", Ok("https://h//v1")),
        ("h/v1", Err(NotAUrl)),
        ("https:/h", Err(NotAUrl)),
        ("HTTPS://h", Err(Scheme)),
        ("ftp://h", Err(Scheme)),
        (" https://h", Err(Scheme)),
        ("https://u:SECRET@h/v1", Err(UserInfo)),
        ("https://SECRET@h", Err(UserInfo)),
        ("https://", Err(EmptyHost)),
        ("https:///v1", Err(EmptyHost)),
        ("https://:443/v1", Err(EmptyHost)),
        ("https://h?key=SECRET", Err(Query)),
        ("https://h/v1?key=SECRET", Err(Query)),
        ("https://h#SECRET", Err(Fragment)),
        ("https://h/v1#x", Err(Fragment)),
        ("https://h/v 1", Err(NotVisible)),
        ("https://h/v1\t", Err(NotVisible)),
        ("https://h/v1\n", Err(NotVisible)),
        ("https://h/é", Err(NotVisible)),
        ("https://hé/v1", Err(NotVisible)),
        ("https://h/%2e%2e/t", Err(Percent)),
        ("https://h/t/%53ECRET", Err(Percent)),
        ("https://h/a\\b", Err(Backslash)),
        ("https://h/a/../t/SECRET", Err(DotSegment)),
        ("https://h/./t", Err(DotSegment)),
        ("https://h/t/..", Err(DotSegment)),
        ("https://h/{x}", Err(Encoded('{'))),
        ("https://h/x}", Err(Encoded('}'))),
        ("https://h/\"x", Err(Encoded('"'))),
        ("https://h/<x>", Err(Encoded('<'))),
        ("https://h/`x", Err(Encoded('`'))),
        ("https://my_host/v1", Err(Host)),
        ("https://h..example/v1", Err(Host)),
        ("https://h.example./v1", Err(Host)),
        ("https://xn--bcher-kva.example", Err(Host)),
        ("https://h!/v1", Err(Host)),
        ("https://[::1/v1", Err(Host)),
        ("https://[::1]x/v1", Err(Host)),
        ("https://h]/v1", Err(Host)),
        ("http://127.1/v1", Err(Ipv4)),
        ("http://0x7f.0.0.1/v1", Err(Ipv4)),
        ("http://010.0.0.1/v1", Err(Ipv4)),
        ("http://1.2.3.256/v1", Err(Ipv4)),
        ("http://h.123/v1", Err(Ipv4)),
        ("http://h.0x1f/v1", Err(Ipv4)),
        ("http://[0:0:0:0:0:0:0:1]/v1", Err(Ipv6)),
        ("http://[::FFFF]/v1", Err(Ipv6)),
        ("http://[::ffff:127.0.0.1]/v1", Err(Ipv6)),
        ("http://[::1%eth0]/v1", Err(Host)),
        ("http://[zz]/v1", Err(Ipv6)),
        ("https://h:/v1", Err(Port)),
        ("https://h:0/v1", Err(Port)),
        ("https://h:0443/v1", Err(Port)),
        ("https://h:65536/v1", Err(Port)),
        ("https://h:SECRET/v1", Err(Port)),
        ("https://h:1:2/v1", Err(Port)),
    ] {
        let got = UpstreamUrl::parse(text).map(|u| u.as_str());
        assert_eq!(got, verdict.map(str::to_owned), "{text:?}");
        if let Err(e) = UpstreamUrl::parse(text) {
            assert!(!e.to_string().contains("SECRET"), "{text:?}: {e}");
        }
    }
}

/// A URL's parts, its base and how it is shown; its `Debug` is redacted.
#[test]
fn a_urls_parts_are_read_and_it_is_shown_redacted() {
    let u = UpstreamUrl::parse("https://GW.example:8443/t/SECRET/v1/").expect("a URL");
    assert_eq!(u.scheme(), Scheme::Https);
    assert_eq!(u.host(), "gw.example");
    assert_eq!(u.port(), Some(8443));
    assert_eq!(u.authority(), "gw.example:8443");
    assert_eq!(u.base(), "/t/SECRET/v1");
    assert_eq!(u.shown(), "https://gw.example:8443/…");
    assert!(!format!("{u:?}").contains("SECRET"));
    let u = UpstreamUrl::parse("http://[::1]").expect("a URL");
    assert_eq!((u.path(), u.base(), u.port_or_default()), ("/", "", 80));
    assert_eq!(u.shown(), "http://[::1]");
    for (text, loopback) in [
        ("http://localhost:1", true),
        ("http://LOCALHOST", true),
        ("http://127.9.9.9", true),
        ("http://[::1]", true),
        ("http://localhost.corp.example", false),
        ("http://10.0.0.7", false),
        ("http://[::2]", false),
        ("http://0.0.0.0", false),
        ("http://0.0.0.0:8080/v1", false),
        ("http://[::]", false),
        ("http://127.0.0.1.example.org", false),
        ("http://example.org", false),
    ] {
        let u = UpstreamUrl::parse(text).expect("a URL");
        assert_eq!(u.is_loopback(), loopback, "{text}");
    }
    // An unclosed bracket is no host at all: never read as `::1`.
    for text in [
        "http://[::1",
        "http://[::1/v1",
        "http://[::1:80",
        "http://::1",
    ] {
        assert!(UpstreamUrl::parse(text).is_err(), "{text}");
    }
}

/// What every build refused stays refused in a recorded policy: a URL whose shape is
/// fine but whose host, port or path the strict reading refuses still reads.
#[test]
fn a_recorded_urls_shape_is_what_every_build_checked() {
    for text in [
        "https://h:port/v1",
        "https://:443",
        "https://h..x/{v1}",
        "https://[zz]/v1",
    ] {
        assert!(UpstreamUrl::parse(text).is_err(), "{text}");
        assert_eq!(UpstreamUrl::shape(text), Ok(()), "{text}");
    }
    for text in [
        "https://u@h",
        "https://h?x",
        "https://h/%41",
        "https://h/../x",
        "https://my_h/x",
        "HTTP://h",
    ] {
        assert!(UpstreamUrl::shape(text).is_err(), "{text}");
    }
}

/// Text built of the pieces an attacker would try.
fn crafted() -> impl Strategy<Value = String> {
    let scheme = prop::sample::select(vec!["http", "https", "HTTP", "ftp", "http:", ""]);
    let user = prop::sample::select(vec!["", "", "", "u@", "u:p@", "@"]);
    let host = prop_oneof![
        "[a-zA-Z0-9._-]{0,10}",
        "(0x)?[0-9a-f]{1,3}(\\.[0-9]{1,4}){0,4}",
        "\\[[0-9a-fA-F:.%]{0,12}\\]",
        Just("localhost".to_owned()),
        Just("[::1]".to_owned()),
    ];
    let port = prop_oneof![Just(String::new()), ":[0-9a-z]{0,6}"];
    let path = "(/[a-zA-Z0-9.%\\\\{}<>\"'`@!$&()*+,;=:~_|^\\[\\] ?#-]{0,5}){0,4}";
    (scheme, user, host, port, path).prop_map(|(s, u, h, p, path)| format!("{s}://{u}{h}{p}{path}"))
}

/// A receiver's webhook may take its token in a query: read where asked for, shown as
/// `/…`, refused where it holds what the client would rewrite.
#[test]
fn a_query_is_read_only_where_asked_for() {
    let text = "https://chat.example/v1/spaces/S/messages?key=K&token=T%3D";
    assert_eq!(UpstreamUrl::parse(text), Err(UrlError::Query));
    let u = UpstreamUrl::parse_with_query(text).expect("a query");
    assert_eq!(u.as_str(), text);
    assert_eq!(u.shown(), "https://chat.example/…");
    assert_eq!(
        UpstreamUrl::parse_with_query("https://h?t=1").map(|u| u.shown()),
        Ok("https://h/…".to_owned())
    );
    for (text, e) in [
        ("https://h/?a=<b>", UrlError::Encoded('<')),
        ("https://h/?a='b'", UrlError::Encoded('\'')),
        ("https://h/?a=\"b", UrlError::Encoded('"')),
        ("https://h/?a=b#c", UrlError::Fragment),
        ("https://h/?a b", UrlError::NotVisible),
        ("https://u@h/?a", UrlError::UserInfo),
        ("https://h/%41?a", UrlError::Percent),
    ] {
        assert_eq!(UpstreamUrl::parse_with_query(text), Err(e), "{text}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// The same of a URL read with its query.
    #[test]
    fn what_is_accepted_with_a_query_is_sent_as_its_canonical_form(
        text in crafted(),
        query in prop::option::of("[a-zA-Z0-9.%{}<>\"'`@!$&()*+,;=:~_|^/?# -]{0,8}"),
    ) {
        let text = match query {
            Some(q) => format!("{text}?{q}"),
            None => text,
        };
        if let Ok(u) = UpstreamUrl::parse_with_query(&text) {
            let sent = url::Url::parse(&text).map(|s| s.as_str().to_owned());
            prop_assert_eq!(sent, Ok(u.as_str()), "{}", text);
        }
    }

    /// Whatever the reading accepts, the `url` crate (reqwest's `Url`) reads too and
    /// prints as its canonical form: what it accepts is what is sent.
    #[test]
    fn what_is_accepted_is_sent_as_its_canonical_form(text in crafted()) {
        if let Ok(u) = UpstreamUrl::parse(&text) {
            let sent = url::Url::parse(&text).map(|s| s.as_str().to_owned());
            prop_assert_eq!(sent, Ok(u.as_str()), "{}", text);
            prop_assert_eq!(UpstreamUrl::shape(&text), Ok(()));
        }
    }
}

/// URLs of the forms the reading takes, so that the property above is not met by
/// refusing everything: each is accepted, and sent as its canonical form.
fn well_formed() -> impl Strategy<Value = String> {
    let host = prop_oneof![
        "[a-zA-Z][a-zA-Z0-9-]{0,6}(\\.[a-zA-Z0-9-]{1,6}){0,2}\\.[a-zA-Z]{1,4}",
        "((1[0-9]{2}|[1-9]?[0-9])\\.){3}[1-9][0-9]?",
        Just("[::1]".to_owned()),
        Just("[2001:db8::7]".to_owned()),
    ]
    // A label `xn--` (any case) is punycode, refused by the reading: not well formed here.
    .prop_filter("no punycode label", |h| {
        !h.split('.')
            .any(|l| l.to_ascii_lowercase().starts_with("xn--"))
    });
    let port = prop::option::of(1u16..=65535);
    let path = "(/[a-zA-Z0-9@!$&()*+,;=:~_|^'-]{1,6}){0,4}/?";
    (prop::bool::ANY, host, port, path).prop_map(|(tls, h, p, path)| {
        let scheme = if tls { "https" } else { "http" };
        let port = p.map(|p| format!(":{p}")).unwrap_or_default();
        format!("{scheme}://{h}{port}{path}")
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn a_well_formed_url_is_accepted_and_sent_as_its_canonical_form(text in well_formed()) {
        let u = UpstreamUrl::parse(&text);
        prop_assert!(u.is_ok(), "{}: {:?}", text, u);
        let sent = url::Url::parse(&text).map(|s| s.as_str().to_owned());
        prop_assert_eq!(sent, Ok(u.expect("accepted").as_str()), "{}", text);
    }
}
