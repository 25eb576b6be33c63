//! A URL as tally shows it: in every error, log line, metric label, CLI message and
//! record. The URLs tally is given (an MCP server's, a proxy upstream's, a witness's) may
//! carry a secret in their user info, path or query (a hosted MCP server's token in its
//! path): what is shown is the scheme, the host and the port, with every other part
//! elided as `…` ([`redacted`]). An error also names the server, upstream or witness
//! (and a policy error its line), which says which URL it is.

/// What stands for an elided part.
const ELIDED: &str = "…";

/// `url` as it may be shown: `scheme://host[:port]`, then `/…` where a path other than
/// `/`, a query or a fragment followed, with `…@` before the host where user info did.
/// A part that is not what it should be (a scheme of other characters, a host that is no
/// host name or address, a port of other than digits) is `…` itself, and text that is no
/// URL is `…` whole: nothing of it is shown but what cannot be a secret's.
pub fn redacted(url: &str) -> String {
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
    // User info is whatever precedes the last `@` (`https://alice:p/ss@h` is user info
    // with a `/` in it, not the host `alice`): nothing before it is shown.
    let (user, rest) = match rest.rsplit_once('@') {
        Some((_, after)) => (format!("{ELIDED}@"), after),
        None => (String::new(), rest),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (hostport, tail) = rest.split_at(end);
    let (host, port) = split_port(hostport);
    let host = if host_like(host) { host } else { ELIDED };
    let port = match port {
        None => String::new(),
        Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
            format!(":{p}")
        }
        Some(_) => format!(":{ELIDED}"),
    };
    let tail = if tail.is_empty() || tail == "/" {
        tail
    } else {
        "/…"
    };
    format!("{}://{user}{host}{port}{tail}", scheme.to_ascii_lowercase())
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
    let mut out = text.replace(url, &redacted(url));
    let Some((_, rest)) = url.split_once("://") else {
        return out;
    };
    let (user, rest) = match rest.rsplit_once('@') {
        Some((user, after)) => (Some(user), after),
        None => (None, rest),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (hostport, tail) = rest.split_at(end);
    // Its user info where a URL shows it, before an `@` (alone, a short one would
    // match words of the text).
    if let Some(user) = user {
        out = out.replace(&format!("{user}@"), &format!("{ELIDED}@"));
    }
    if !tail.is_empty() && tail != "/" {
        out = tail_replaced(&out, hostport, tail);
    }
    for part in tail.split(['/', '?', '#', '&', '=', ';']) {
        if part.len() >= MIN_SECRET_SEGMENT {
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

/// Where a URL's `localhost` is reached: 127.0.0.1, never asked of the resolver. A
/// policy takes plain `http://` to `localhost` as loopback by its name, so every client
/// of such a URL (the proxy's upstreams, a witness, the MCP gateway's remote servers)
/// connects here: a resolver that answered otherwise (no hosts entry, and a search
/// domain that made it `localhost.corp.example`) would send a credential off the machine
/// in the clear.
pub const LOCALHOST: std::net::Ipv4Addr = std::net::Ipv4Addr::LOCALHOST;

/// The address `host` (a URL's host name, as a client resolves it) is pinned to
/// without the resolver: [`LOCALHOST`] for `localhost` (any case), `None` otherwise.
pub fn pinned(host: &str) -> Option<std::net::IpAddr> {
    host.eq_ignore_ascii_case("localhost")
        .then_some(std::net::IpAddr::V4(LOCALHOST))
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
        let v4 = Some(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        assert_eq!(pinned("localhost"), v4);
        assert_eq!(pinned("LocalHost"), v4);
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
            ("https://alice:SE/CRET@h/x", "https://…@h/…"),
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
}
