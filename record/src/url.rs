//! A URL as tally shows it: in every error, log line, metric label, CLI message and
//! record. The URLs tally is given (an MCP server's, a proxy upstream's, a witness's) may
//! carry a secret in their user info, path or query (a hosted MCP server's token in its
//! path): what is shown is the scheme, the host and the port, with every other part
//! elided as `…` ([`redacted`]). An error also names the server, upstream or witness
//! (and a policy error its line), which says which URL it is.

mod upstream;
pub use upstream::{Scheme, UpstreamUrl, UrlError};

/// What stands for an elided part.
const ELIDED: &str = "…";

/// `url` as it may be shown: `scheme://host[:port]`, then `/…` where a path other than
/// `/`, a query or a fragment followed, with `…@` before the host where user info did.
/// A part that is not what it should be (a scheme of other characters, a host that is no
/// host name or address, a port of other than digits) is `…` itself, and text that is no
/// URL is `…` whole: nothing of it is shown but what cannot be a secret's. A URL tally
/// sends to ([`UpstreamUrl::parse`] reads it) is shown as it is sent
/// ([`UpstreamUrl::shown`]: the host in lower case, the scheme's own port left out).
pub fn redacted(url: &str) -> String {
    if let Ok(u) = UpstreamUrl::parse(url) {
        return u.shown();
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return ELIDED.to_owned();
    };
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !scheme_ok {
        return ELIDED.to_owned();
    }
    let reading = Reading::of(rest);
    if reading.ambiguous() {
        // `https://alice:p/ss@h/x`: the authority (up to the first `/`) is no host and
        // port, and an `@` follows; whether `alice:p/ss` is user info or `alice` a host
        // is not told: nothing of it is shown.
        return format!("{}://{ELIDED}/{ELIDED}", scheme.to_ascii_lowercase());
    }
    let user = if reading.user.is_some() {
        format!("{ELIDED}@")
    } else {
        String::new()
    };
    let (host, port) = split_port(reading.hostport);
    let host = if host_like(host) { host } else { ELIDED };
    let port = match port {
        None => String::new(),
        Some(p) if port_like(p) => format!(":{p}"),
        Some(_) => format!(":{ELIDED}"),
    };
    let tail = reading.tail;
    let tail = if tail.is_empty() || tail == "/" {
        tail
    } else {
        "/…"
    };
    format!("{}://{user}{host}{port}{tail}", scheme.to_ascii_lowercase())
}

/// A URL's text after `://` in parts: its user info, host and port, and what follows.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Reading<'a> {
    user: Option<&'a str>,
    hostport: &'a str,
    tail: &'a str,
}

impl<'a> Reading<'a> {
    /// As RFC 3986 (and the `url` crate) reads it: the authority ends at the first `/`,
    /// `?` or `#`; its user info is what precedes its last `@`.
    fn of(rest: &'a str) -> Reading<'a> {
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (user, hostport) = match authority.rsplit_once('@') {
            Some((user, hostport)) => (Some(user), hostport),
            None => (None, authority),
        };
        Reading {
            user,
            hostport,
            tail,
        }
    }

    /// As a lax reader takes it: user info is what precedes the last `@` anywhere.
    fn lax(rest: &'a str) -> Reading<'a> {
        match rest.rsplit_once('@') {
            Some((user, after)) => Reading {
                user: Some(user),
                ..Reading::of(after)
            },
            None => Reading::of(rest),
        }
    }

    /// Whether an `@` follows an authority that is no host and port: the text may
    /// be meant as user info with a `/` in it.
    fn ambiguous(&self) -> bool {
        let (host, port) = split_port(self.hostport);
        self.tail.contains('@') && !(host_like(host) && port.is_none_or(port_like))
    }
}

/// Whether `port` reads as a port: 1 to 5 digits.
fn port_like(port: &str) -> bool {
    !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit())
}

/// The shortest path segment (or query part) replaced wherever it appears in a text
/// [`scrubbed`] of a URL: a token is longer; a shorter one (`mcp`, `v1`) would match the
/// words of the text.
pub const MIN_SECRET_SEGMENT: usize = 8;

/// `text` (an error a client of `url` gave, which may quote it) with `url` shown
/// [`redacted`]: each occurrence of the URL, of its user info (before an `@`), of what
/// follows its host and port (path, query, fragment) where it follows the host or is
/// [`MIN_SECRET_SEGMENT`] bytes or longer, and of each part of that path or query of
/// [`MIN_SECRET_SEGMENT`] bytes or longer on its own (a server may echo a token alone or
/// in another spelling: `\/t\/TOKEN`) is replaced.
pub fn scrubbed(text: &str, url: &str) -> String {
    let shown = redacted(url);
    let mut out = text.replace(url, &shown);
    let Some((_, rest)) = url.split_once("://") else {
        return out;
    };
    let reading = Reading::of(rest);
    let lax = Reading::lax(rest);
    // Where the reading is ambiguous, the text is scrubbed under both (the lax one,
    // whose user info is longer, first).
    let readings = if reading.ambiguous() && lax != reading {
        vec![lax, reading]
    } else {
        vec![reading]
    };
    for r in readings {
        out = scrubbed_as(out, &r, &shown.to_ascii_lowercase());
    }
    out
}

/// `text` with the user info and the path and query parts of `r` replaced, parts that
/// `shown` (the URL redacted, lowercased) holds left: they are shown anyway, and a part
/// inside the host (`https://searchapi.example/searchapi/mcp`) stays in it.
fn scrubbed_as(mut out: String, r: &Reading<'_>, shown: &str) -> String {
    // Its user info where a URL shows it, before an `@` (alone, a short one would
    // match words of the text).
    if let Some(user) = r.user {
        out = out.replace(&format!("{user}@"), &format!("{ELIDED}@"));
    }
    let tail = r.tail;
    if !tail.is_empty() && tail != "/" {
        out = tail_replaced(&out, r.hostport, tail);
    }
    let parts = r.user.into_iter().flat_map(|u| u.split([':', '/']));
    for part in parts.chain(tail.split(['/', '?', '#', '&', '=', ';', '@'])) {
        if part.len() >= MIN_SECRET_SEGMENT && !shown.contains(&part.to_ascii_lowercase()) {
            out = out.replace(part, ELIDED);
        }
    }
    out
}

/// `text` with `tail` (a URL's path, query and fragment) replaced by `/…` where it
/// follows the URL's host (`hostport`'s, any case, with or without its port) or is
/// [`MIN_SECRET_SEGMENT`] bytes or longer: a short one alone (`/mcp`) is left in the
/// words of the text.
fn tail_replaced(text: &str, hostport: &str, tail: &str) -> String {
    let long = tail.len() >= MIN_SECRET_SEGMENT;
    let host = split_port(hostport).0.to_ascii_lowercase();
    let hostport = hostport.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(tail) {
        let before = rest[..at].to_ascii_lowercase();
        let follows = before.ends_with(&hostport) || before.ends_with(&host) || {
            // A port the client wrote (a default one it added, or dropped).
            let digits = before.trim_end_matches(|c: char| c.is_ascii_digit());
            digits.len() < before.len() && digits.ends_with(&format!("{host}:"))
        };
        out.push_str(&rest[..at]);
        out.push_str(if long || follows { "/…" } else { tail });
        rest = &rest[at + tail.len()..];
    }
    out.push_str(rest);
    out
}

/// Where a URL's `localhost` is reached: 127.0.0.1 and ::1 (a client tries each: a
/// server may listen on either alone), never asked of the resolver. A policy takes
/// plain `http://` to `localhost` as loopback by its name, so every client of such a
/// URL (the proxy's upstreams, a witness, the MCP gateway's remote servers) connects
/// here: a resolver that answered otherwise (no hosts entry, and a search domain that
/// made it `localhost.corp.example`) would send a credential off the machine in the
/// clear.
pub const LOCALHOST: [std::net::IpAddr; 2] = [
    std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
    std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
];

/// The addresses `host` (a URL's host name, as a client resolves it) is pinned to
/// without the resolver: [`LOCALHOST`] for `localhost` (any case), `None` otherwise.
pub fn pinned(host: &str) -> Option<[std::net::IpAddr; 2]> {
    host.eq_ignore_ascii_case("localhost").then_some(LOCALHOST)
}

/// A host and its port, if one is written (`[::1]:8080`, `h:443`, `h`).
fn split_port(hostport: &str) -> (&str, Option<&str>) {
    if let Some(close) = hostport.find(']').filter(|_| hostport.starts_with('[')) {
        let (host, after) = hostport.split_at(close + 1);
        return match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            // Text after the brackets that is no port: no host either.
            None => (hostport, None),
        };
    }
    match hostport.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (hostport, None),
    }
}

/// Whether `host` reads as a host: a name or IPv4 address (letters, digits, `.`, `-`,
/// `_`), or an IPv6 address in brackets (hex digits, `:` and `.`), at most 255 bytes.
fn host_like(host: &str) -> bool {
    if host.is_empty() || host.len() > 255 {
        return false;
    }
    match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => {
            v6.contains(':')
                && v6
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'))
        }
        None => host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')),
    }
}

#[cfg(test)]
mod tests {
    use super::redacted;

    #[test]
    fn localhost_is_pinned_to_loopback_other_names_are_resolved() {
        use super::pinned;
        let both: Option<[std::net::IpAddr; 2]> =
            Some(["127.0.0.1".parse().expect("v4"), "::1".parse().expect("v6")]);
        assert_eq!(pinned("localhost"), both);
        assert_eq!(pinned("LocalHost"), both);
        assert_eq!(pinned("localhost.corp.example"), None);
        assert_eq!(pinned("api.openai.com"), None);
    }

    #[test]
    fn scheme_host_and_port_are_shown_the_rest_elided() {
        for (url, shown) in [
            ("https://api.openai.com", "https://api.openai.com"),
            ("https://api.openai.com/", "https://api.openai.com/"),
            ("https://api.openai.com/v1", "https://api.openai.com/…"),
            ("http://127.0.0.1:8000/mcp", "http://127.0.0.1:8000/…"),
            ("http://[::1]:8080/mcp", "http://[::1]:8080/…"),
            ("http://[::1]", "http://[::1]"),
            ("HTTPS://H.example", "https://H.example"),
            ("https://h/sk-SECRET/mcp", "https://h/…"),
            ("https://h?token=SECRET", "https://h/…"),
            ("https://h#SECRET", "https://h/…"),
            ("https://user:SECRET@h/x", "https://…@h/…"),
            ("https://SECRET@h", "https://…@h"),
            ("https://a@b:SECRET@h:1", "https://…@h:1"),
            ("https://alice:SE/CRET@h/x", "https://…/…"),
            ("https://alice:SECRET/x@h/y", "https://…/…"),
            ("https://gw.example/@team/v1", "https://gw.example/…"),
            (
                "https://gw.example/t/SECRET@team/v1",
                "https://gw.example/…",
            ),
            ("https://gw.example?x=@SECRET", "https://gw.example/…"),
            (
                "https://u:SECRET@gw.example/@team",
                "https://…@gw.example/…",
            ),
            ("https://h:SECRET/x", "https://h:…/…"),
            ("https://h:/x", "https://h:…/…"),
            ("https://SE CRET/x", "https://…/…"),
            ("https://[SECRET]/x", "https://…/…"),
            ("https://[::1]SECRET/x", "https://…/…"),
            ("https://[::1:SECRET/x", "https://…:…/…"),
            ("https://", "https://…"),
            ("SECRET", "…"),
            ("h/SECRET", "…"),
            ("se cret://h/x", "…"),
            ("", "…"),
        ] {
            assert_eq!(redacted(url), shown, "{url}");
            assert!(!redacted(url).contains("SECRET"), "{url}");
        }
    }

    /// What a client said of a URL, normalized or in parts, keeps none of its secrets.
    #[test]
    fn an_error_quoting_the_url_or_its_parts_is_scrubbed() {
        use super::scrubbed;
        let url = "https://me:SECRET1@H.example:8443/t/SECRET2/mcp?k=SECRET3";
        for said in [
            format!("error sending request for url ({url})"),
            "error sending request for url (https://me:SECRET1@h.example:8443/t/SECRET2/mcp?k=SECRET3)".to_owned(),
            "HTTP 404: no route /t/SECRET2/mcp?k=SECRET3".to_owned(),
            "to me:SECRET1@h.example, refused".to_owned(),
        ] {
            let out = scrubbed(&said, url);
            assert!(!out.contains("SECRET"), "{said} -> {out}");
        }
        assert_eq!(
            scrubbed(&format!("for url ({url}): refused"), url),
            "for url (https://…@H.example:8443/…): refused"
        );
        assert_eq!(scrubbed("connection refused", url), "connection refused");
        // A short user info is replaced where it is one, not in the words of the text.
        assert_eq!(
            scrubbed("a refused: https://a@h/x", "https://a@h/x"),
            "a refused: https://…@h/…"
        );
    }

    /// A server that echoes its token alone, or JSON-escaped, or the URL as the `url`
    /// crate prints it (host lowercased, default port dropped) does not show it; a
    /// short path is replaced only where it follows the host.
    #[test]
    fn a_token_echoed_alone_or_escaped_is_scrubbed_a_short_path_in_words_is_not() {
        use super::scrubbed;
        let url = "https://H.example:443/t/tok-SECRET-0123/mcp";
        for said in [
            "HTTP 404: no such token tok-SECRET-0123",
            r#"HTTP 404: {"path":"\/t\/tok-SECRET-0123\/mcp"}"#,
            "error sending request for url (https://h.example/t/tok-SECRET-0123/mcp)",
        ] {
            let out = scrubbed(said, url);
            assert!(!out.contains("SECRET"), "{said} -> {out}");
        }
        let url = "http://127.0.0.1:8000/mcp";
        assert_eq!(
            scrubbed(
                "the /mcp endpoint of http://127.0.0.1:8000/mcp refused",
                url
            ),
            "the /mcp endpoint of http://127.0.0.1:8000/… refused"
        );
        assert_eq!(
            scrubbed(
                "for url (http://127.0.0.1:8000/mcp)",
                "http://127.0.0.1/mcp"
            ),
            "for url (http://127.0.0.1:8000/…)"
        );
    }

    /// The authority ends at the first `/`, `?` or `#`: an `@` in the path is no user
    /// info's end; where the reading is ambiguous, the text is scrubbed under both.
    #[test]
    fn an_at_in_the_path_is_the_paths_an_ambiguous_url_is_scrubbed_both_ways() {
        use super::scrubbed;
        for (url, said, out) in [
            (
                "https://gw.example/@team/tok-SECRET-0123",
                "for url (https://gw.example/@team/tok-SECRET-0123): refused",
                "for url (https://gw.example/…): refused",
            ),
            (
                "https://gw.example/t/tok-SECRET-0123@team/v1",
                "no route tok-SECRET-0123@team",
                "no route …@team",
            ),
            (
                "https://alice:pa/ss-SECRET@h/tok-SECRET-0123",
                "for url (https://alice:pa/ss-SECRET@h/tok-SECRET-0123)",
                "for url (https://…/…)",
            ),
            (
                "https://alice:pa/ss-SECRET@h/tok-SECRET-0123",
                "no such token tok-SECRET-0123 for alice:pa/ss-SECRET@h",
                "no such token … for …@h",
            ),
            (
                "https://alice:pa/ss-SECRET@h/tok-SECRET-0123",
                "invalid port pa/ss-SECRET",
                "invalid port pa/…",
            ),
            // A path part the host holds is shown (it is, in the host).
            (
                "https://searchapi.example/searchapi/mcp",
                "for url (https://searchapi.example/searchapi/mcp)",
                "for url (https://searchapi.example/…)",
            ),
            (
                "https://searchapi.example/searchapi/mcp",
                "https://searchapi.example:443/searchapi/mcp refused",
                "https://searchapi.example:443/… refused",
            ),
        ] {
            assert_eq!(scrubbed(said, url), out, "{url}: {said}");
        }
    }
}
