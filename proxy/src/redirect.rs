//! Redirects from an upstream: never followed, and passed back to the agent only when
//! they stay on the upstream as the agent's client would read them (docs/PROXY.md,
//! "Security model").
//!
//! A `Location` is read the way a browser reads it, by the WHATWG URL Standard (the
//! `url` crate): resolved against the URL the request was sent to, where `\` is a `/`,
//! tabs and newlines are dropped, `//host`, `/\host` and `https:host` name another
//! host. It stays on the upstream only if the scheme, the host and the port it resolves
//! to are the upstream's, with no user or password. Before that, a `Location` that
//! parsers read differently is refused unread: one with a backslash, a space, a control
//! or a byte that is not ASCII (an RFC 3986 client takes `http://up\@evil` to evil,
//! WHATWG to up), one that is empty, and more than one.

use hyper::header::{HeaderMap, LOCATION};
use tally_record::Reason;
use url::Url;

use crate::dialect::Refusal;

/// The refusal of a redirect off the upstream that `sent_to` names (the URL the
/// request went to); `None` for one that stays on it, passed back as it is.
pub(crate) fn refused(sent_to: &str, headers: &HeaderMap) -> Option<Refusal> {
    let mut locations = headers.get_all(LOCATION).iter();
    let stays = match (locations.next(), locations.next()) {
        (Some(location), None) => Url::parse(sent_to)
            .map(|base| stays(&base, location.as_bytes()))
            .unwrap_or(false),
        _ => false,
    };
    (!stays).then(|| {
        Refusal::reason(
            Reason::ScopeViolation,
            None,
            "the upstream redirected to another host; tally never follows a redirect out of the upstream".into(),
        )
    })
}

/// The refusal of any redirect from an upstream whose URL is given by `url_file`: its
/// `Location` may echo the URL's secret, on the upstream or not.
pub(crate) fn withheld() -> Refusal {
    Refusal::reason(
        Reason::ScopeViolation,
        None,
        "the upstream redirected; tally passes back no redirect from an upstream whose URL is secret (url_file)".into(),
    )
}

/// Whether `location`, resolved against `base`, names `base`'s scheme, host and port
/// and no user.
fn stays(base: &Url, location: &[u8]) -> bool {
    // Visible ASCII only (no space, tab, newline, control or other byte), no backslash:
    // what every parser reads alike.
    if location.is_empty() || !location.iter().all(|&b| b.is_ascii_graphic() && b != b'\\') {
        return false;
    }
    let Ok(text) = std::str::from_utf8(location) else {
        return false;
    };
    let Ok(to) = base.join(text) else {
        return false;
    };
    to.scheme() == base.scheme()
        && to.host() == base.host()
        && to.port_or_known_default() == base.port_or_known_default()
        && to.username().is_empty()
        && to.password().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_location_stays_only_where_a_browser_would_stay() {
        let http = Url::parse("http://127.0.0.1:8080/v1/chat/completions").expect("url");
        let https = Url::parse("https://api.example.com/v1/messages").expect("url");
        let off: &[(&Url, &[u8])] = &[
            (&http, b"//evil.com/x"),
            (&http, b"///evil.com/x"),
            (&http, b"/\\evil.com/x"),
            (&http, b"\\\\evil.com"),
            (&http, b"\\/evil.com"),
            (&http, b"/\t/evil.com"),
            (&http, b"/\n/evil.com"),
            (&http, b"\t//evil.com"),
            (&http, b" //evil.com"),
            (&http, b"//evil.com "),
            (&http, b"http:\\\\evil.com"),
            (&http, b"https:evil.com"),
            (&http, b"https://evil.com"),
            (&http, b"http://evil.com/v1/chat/completions"),
            (&http, b"http://%65vil.com/"),
            (&http, b"http://127.0.0.1:8080@evil.com/"),
            (&http, b"http://127.0.0.1:8080\\@evil.com/"),
            (&http, b"http://user@127.0.0.1:8080/"),
            (&http, b"http://user:pw@127.0.0.1:8080/"),
            (&http, b"http://127.0.0.1:8081/"),
            (&http, b"http://127.0.0.1/"),
            (&http, b"https://127.0.0.1:8080/"),
            (&http, b"http://127.0.0.2:8080/"),
            (&http, b"http://localhost:8080/"),
            (&http, b"javascript:alert(1)"),
            (&http, b"data:text/plain,x"),
            (&http, b"file:///etc/passwd"),
            (&http, b"/caf\xc3\xa9"),
            (&http, b"/\x7f"),
            (&http, b""),
            (&https, b"http:evil.com"),
            (&https, b"http://api.example.com/v1/x"),
            (&https, b"https://api.example.com:8443/v1/x"),
            (&https, b"https://api.example.com./v1/x"),
            (&https, b"https://api.example.com.evil.com/"),
        ];
        for (base, location) in off {
            assert!(
                !stays(base, location),
                "{base} -> {:?}",
                String::from_utf8_lossy(location)
            );
        }
        let on: &[(&Url, &[u8])] = &[
            (&http, b"/v1/elsewhere"),
            (&http, b"elsewhere"),
            (&http, b"../x"),
            (&http, b"?page=2"),
            (&http, b"#top"),
            (&http, b"http://127.0.0.1:8080/v1/x"),
            // WHATWG reads the same address: 127.1 is 127.0.0.1.
            (&http, b"http://127.1:8080/v1/x"),
            // An encoded backslash is a byte of the path, never a separator.
            (&http, b"/%5Cevil.com"),
            (&http, b"/%2F%2Fevil.com"),
            // The same scheme with no `//` is a relative reference (WHATWG).
            (&http, b"http:elsewhere"),
            (&https, b"https:evil.com"),
            (&https, b"https://API.example.com/v1/x"),
            (&https, b"https://api.example.com:443/v1/x"),
        ];
        for (base, location) in on {
            assert!(
                stays(base, location),
                "{base} -> {:?}",
                String::from_utf8_lossy(location)
            );
        }
    }

    #[test]
    fn no_location_or_two_are_refused() {
        let sent_to = "http://127.0.0.1:8080/v1/chat/completions";
        let mut h = HeaderMap::new();
        assert!(refused(sent_to, &h).is_some(), "none");
        h.append(LOCATION, "/v1/elsewhere".parse().expect("value"));
        assert!(refused(sent_to, &h).is_none(), "one on the upstream");
        h.append(LOCATION, "/v1/other".parse().expect("value"));
        assert!(refused(sent_to, &h).is_some(), "two");
    }
}
