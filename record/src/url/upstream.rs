//! The one reading of a URL tally sends to: a model proxy's upstream, an MCP server, a
//! witness. [`UpstreamUrl::parse`] accepts exactly the URLs the HTTP client sends as
//! written (its canonical form, [`UpstreamUrl::as_str`], is what the `url` crate prints):
//! nothing it would rewrite (`%`, `\`, a dot segment, a character it percent-encodes, a
//! host that is a number in another spelling, a non-canonical IPv6 address), no user
//! info, query or fragment. A URL it rewrote would be quoted in its errors in a form the
//! redaction of the URL as written does not find.
//!
//! The reading is in two steps: [`UpstreamUrl::shape`], what every build refused in a
//! proxy upstream's URL (a ledger's recorded policy is held to it alone, so that a policy
//! an earlier build recorded still reads), then the exact host, port and path.

use std::fmt;

/// What is wrong with a URL. It never quotes the URL (which may carry a secret): a
/// caller names where the URL is, and shows it [`super::redacted`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// No `scheme://`.
    #[error("is not a URL: write https://host[:port][/path]")]
    NotAUrl,
    /// A scheme other than `https` or `http` (in lower case).
    #[error("the scheme must be https:// (or http://), in lower case")]
    Scheme,
    /// User info (`user:password@`) before the host.
    #[error(
        "has a user name or password before the host: give the credential apart, never in the URL"
    )]
    UserInfo,
    /// No host.
    #[error("has no host")]
    EmptyHost,
    /// A host that is no host name (letters, digits and `-` in labels joined by `.`), no
    /// IPv4 address in dotted decimal, no IPv6 address in brackets.
    #[error("the host is no host name (letters, digits, `-`, in labels joined by `.`), IPv4 address or [IPv6] address")]
    Host,
    /// A number host in another spelling than dotted decimal (`127.1`, `0x7f.0.0.1`,
    /// `010.0.0.1`), which the client would rewrite.
    #[error("the host is an IPv4 address not in dotted decimal (four numbers 0 to 255, no leading zeros)")]
    Ipv4,
    /// An IPv6 address not in its canonical form (lower case, the longest run of zeros
    /// as `::`), with a zone (`%eth0`) or an IPv4 part.
    #[error("the host is an IPv6 address not in canonical form (lower case, zeros compressed, no zone, no IPv4 part)")]
    Ipv6,
    /// A port that is not 1 to 65535 in digits without a leading zero.
    #[error("the port must be 1 to 65535, digits, no leading zero")]
    Port,
    /// A query (`?`).
    #[error("has a query: give the credential apart (sent in a header), never in the URL")]
    Query,
    /// A fragment (`#`).
    #[error("has a fragment (`#`)")]
    Fragment,
    /// A space, control character or non-ASCII character.
    #[error("holds a space, control or non-ASCII character")]
    NotVisible,
    /// A `%`: the client would decode or re-encode it.
    #[error("the path holds `%`: write the path as it is sent")]
    Percent,
    /// A `\`: the client sends it as `/`.
    #[error("the path holds `\\`: write the path as it is sent")]
    Backslash,
    /// A `.` or `..` segment: the client removes it.
    #[error("the path holds a `.` or `..` segment: write the path as it is sent")]
    DotSegment,
    /// A character the client percent-encodes in a path (`{ } " < >` and the backtick).
    #[error("the path holds `{0}`, which is sent percent-encoded: write the path as it is sent")]
    Encoded(char),
}

/// The scheme of an [`UpstreamUrl`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Scheme {
    /// `http`.
    Http,
    /// `https`.
    Https,
}

impl Scheme {
    /// `http` or `https`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    /// The port the client leaves out.
    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// A URL tally sends to, read strictly ([`UpstreamUrl::parse`]). Its `Debug` shows it
/// redacted: the path may carry a secret.
#[derive(Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    scheme: Scheme,
    /// Lower case; an IPv6 address in brackets.
    host: String,
    /// As written; `None` where none was, or the scheme's own.
    port: Option<u16>,
    /// `""` where none was written, else starting with `/`.
    path: String,
    /// After `?`, where [`UpstreamUrl::parse_with_query`] read one.
    query: Option<String>,
}

/// The parts of a URL's text whose shape every build checked ([`UpstreamUrl::shape`]).
struct Shape<'a> {
    scheme: Scheme,
    authority: &'a str,
    path: &'a str,
}

impl UpstreamUrl {
    /// `text` read as a URL tally sends to, or what is wrong with it.
    pub fn parse(text: &str) -> Result<UpstreamUrl, UrlError> {
        let shape = shape_of(text)?;
        let (host, port) = split_authority(shape.authority)?;
        let host = checked_host(host)?;
        let port = checked_port(port)?.filter(|p| *p != shape.scheme.default_port());
        if let Some(c) = shape.path.chars().find(|c| "{}\"<>`".contains(*c)) {
            return Err(UrlError::Encoded(c));
        }
        Ok(UpstreamUrl {
            scheme: shape.scheme,
            host,
            port,
            path: shape.path.to_owned(),
            query: None,
        })
    }

    /// `text` read as [`UpstreamUrl::parse`] reads it, but for a query after the path
    /// (a notification receiver's webhook may take its token in one): visible ASCII, no
    /// `#` and none of the characters the client percent-encodes in a query (`" < > '`).
    pub fn parse_with_query(text: &str) -> Result<UpstreamUrl, UrlError> {
        let Some((url, query)) = text.split_once('?') else {
            return UpstreamUrl::parse(text);
        };
        let mut read = UpstreamUrl::parse(url)?;
        if !query.chars().all(|c| c.is_ascii_graphic()) {
            return Err(UrlError::NotVisible);
        }
        if query.contains('#') {
            return Err(UrlError::Fragment);
        }
        if let Some(c) = query.chars().find(|c| "\"<>'".contains(*c)) {
            return Err(UrlError::Encoded(c));
        }
        read.query = Some(query.to_owned());
        Ok(read)
    }

    /// What every build refused in a proxy upstream's URL: no `scheme://` of `http` or
    /// `https`, an authority empty or with other than letters, digits, `.`, `-`, `:`,
    /// `[`, `]` (so no user info, query or fragment there), a path with other than
    /// visible ASCII, or with `?`, `#`, `%`, `\` or a dot segment. A policy a ledger
    /// recorded is held to this alone; one put in force, to [`UpstreamUrl::parse`].
    pub fn shape(text: &str) -> Result<(), UrlError> {
        shape_of(text).map(drop)
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The host, lower case (an IPv6 address in brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port, where one other than the scheme's own was written.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The port connected to: the one written, or the scheme's own.
    pub fn port_or_default(&self) -> u16 {
        self.port.unwrap_or(self.scheme.default_port())
    }

    /// `host[:port]`, as sent in a `Host` header.
    pub fn authority(&self) -> String {
        match self.port {
            Some(p) => format!("{}:{p}", self.host),
            None => self.host.clone(),
        }
    }

    /// The path, `/` where none was written.
    pub fn path(&self) -> &str {
        if self.path.is_empty() {
            "/"
        } else {
            &self.path
        }
    }

    /// The path as a base other paths are appended to: `""` or without a trailing `/`.
    pub fn base(&self) -> &str {
        self.path.trim_end_matches('/')
    }

    /// Whether the host is loopback: `localhost`, 127.0.0.0/8 or `::1` (where plain
    /// `http://` may go).
    pub fn is_loopback(&self) -> bool {
        let bare = self.host.trim_start_matches('[').trim_end_matches(']');
        self.host == "localhost"
            || bare
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    /// The URL as it may be shown: `scheme://host[:port]`, then `/…` where a path other
    /// than `/` or a query followed ([`super::redacted`]).
    pub fn shown(&self) -> String {
        let tail = match self.path.as_str() {
            _ if self.query.is_some() => "/…",
            "" => "",
            "/" => "/",
            _ => "/…",
        };
        format!("{}://{}{tail}", self.scheme.as_str(), self.authority())
    }

    /// The canonical form: what the client sends, and the `url` crate prints.
    pub fn as_str(&self) -> String {
        let query = self
            .query
            .as_ref()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        format!(
            "{}://{}{}{query}",
            self.scheme.as_str(),
            self.authority(),
            self.path()
        )
    }
}

impl fmt::Debug for UpstreamUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("UpstreamUrl").field(&self.shown()).finish()
    }
}

/// The scheme, authority and path of `text`, held to [`UpstreamUrl::shape`].
fn shape_of(text: &str) -> Result<Shape<'_>, UrlError> {
    let (scheme, rest) = text.split_once("://").ok_or(UrlError::NotAUrl)?;
    let scheme = match scheme {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        _ => return Err(UrlError::Scheme),
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    authority_shape(authority)?;
    path_shape(path)?;
    Ok(Shape {
        scheme,
        authority,
        path,
    })
}

/// An authority's shape: not empty, letters, digits, `.`, `-`, `:`, `[` and `]`.
fn authority_shape(authority: &str) -> Result<(), UrlError> {
    if authority.is_empty() {
        return Err(UrlError::EmptyHost);
    }
    for c in authority.chars() {
        match c {
            c if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']') => {}
            '@' => return Err(UrlError::UserInfo),
            '?' => return Err(UrlError::Query),
            '#' => return Err(UrlError::Fragment),
            c if !c.is_ascii_graphic() => return Err(UrlError::NotVisible),
            _ => return Err(UrlError::Host),
        }
    }
    Ok(())
}

/// A path's shape: `""` or from `/`, visible ASCII, no `?`, `#`, `%`, `\` or dot
/// segment.
fn path_shape(path: &str) -> Result<(), UrlError> {
    if !path.chars().all(|c| c.is_ascii_graphic()) {
        return Err(UrlError::NotVisible);
    }
    for (c, e) in [
        ('?', UrlError::Query),
        ('#', UrlError::Fragment),
        ('%', UrlError::Percent),
        ('\\', UrlError::Backslash),
    ] {
        if path.contains(c) {
            return Err(e);
        }
    }
    if path.split('/').any(|s| s == "." || s == "..") {
        return Err(UrlError::DotSegment);
    }
    Ok(())
}

/// An authority's host and port text (`[::1]:8080`, `h:443`, `h`).
fn split_authority(authority: &str) -> Result<(&str, Option<&str>), UrlError> {
    if authority.starts_with('[') {
        let close = authority.find(']').ok_or(UrlError::Host)?;
        let (host, after) = authority.split_at(close + 1);
        return match after.strip_prefix(':') {
            Some(port) => Ok((host, Some(port))),
            None if after.is_empty() => Ok((host, None)),
            None => Err(UrlError::Host),
        };
    }
    if authority.contains(['[', ']']) {
        return Err(UrlError::Host);
    }
    Ok(match authority.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    })
}

/// A port's text as a port: 1 to 65535, digits, no leading zero.
fn checked_port(port: Option<&str>) -> Result<Option<u16>, UrlError> {
    let Some(port) = port else { return Ok(None) };
    if port.is_empty() || port.starts_with('0') || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(UrlError::Port);
    }
    port.parse::<u16>().map(Some).map_err(|_| UrlError::Port)
}

/// A host as the client sends it, lower case: an IPv6 address in brackets in its
/// canonical form, an IPv4 address in dotted decimal, or a host name.
fn checked_host(host: &str) -> Result<String, UrlError> {
    if host.is_empty() {
        return Err(UrlError::EmptyHost);
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        let addr: std::net::Ipv6Addr = v6.parse().map_err(|_| UrlError::Ipv6)?;
        let canonical = addr.to_string();
        return if canonical == v6 && !canonical.contains('.') {
            Ok(host.to_owned())
        } else {
            Err(UrlError::Ipv6)
        };
    }
    let host = host.to_ascii_lowercase();
    let labels: Vec<&str> = host.split('.').collect();
    if labels
        .iter()
        .any(|l| l.is_empty() || !l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    {
        return Err(UrlError::Host);
    }
    if labels.iter().any(|l| l.starts_with("xn--")) {
        // A punycode label the client decodes to check, and may refuse.
        return Err(UrlError::Host);
    }
    if labels.last().is_some_and(|l| numeric(l)) && !dotted_decimal(&labels) {
        return Err(UrlError::Ipv4);
    }
    Ok(host)
}

/// Whether a host's last label makes the client read it as an IPv4 address: digits,
/// or `0x` and hex digits.
fn numeric(label: &str) -> bool {
    label.bytes().all(|b| b.is_ascii_digit())
        || label
            .strip_prefix("0x")
            .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Whether `labels` are four numbers 0 to 255 with no leading zero.
fn dotted_decimal(labels: &[&str]) -> bool {
    labels.len() == 4
        && labels.iter().all(|l| {
            l.bytes().all(|b| b.is_ascii_digit())
                && (*l == "0" || !l.starts_with('0'))
                && l.parse::<u8>().is_ok()
        })
}

#[cfg(test)]
mod tests;
