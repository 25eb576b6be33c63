//! The MCP servers `tally serve --mcp-listen` puts its gateway in front of
//! (`[mcp.NAME]`, docs/MCP.md, "The HTTP gateway"): each one either a command the
//! gateway starts and speaks to on stdio, or the URL of a remote Streamable HTTP server
//! (or a file holding it, for a URL that carries a secret), with an optional credential
//! the gateway sends it in a header. A remote server is reached over `https://` (plain
//! `http://` to a loopback host only, so a credential never crosses a network
//! unencrypted), trusting the Mozilla roots and, for a server whose certificate a
//! private CA issued, the CA certificates of a `ca_file`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use tally_record::url::{redacted, Scheme, UpstreamUrl, UrlError};

/// The longest server name.
pub const MAX_NAME: usize = 32;

/// One `[mcp.NAME]` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpServer {
    /// The server's command and arguments (a stdio server the gateway starts).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The URL of a remote Streamable HTTP server: `https://`, or `http://` to a
    /// loopback host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A file whose content (trailing line end removed) is the remote server's URL, read
    /// when `tally serve` starts: for a URL that carries a secret (a token in its path),
    /// which the policy, recorded in the ledger as written, then does not hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url_file: Option<String>,
    /// A PEM file of CA certificates trusted for an `https://` server beside the Mozilla
    /// roots (for a certificate a private CA issued).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// The header the credential goes in (default `Authorization`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// A file whose content (trailing line end removed) is the header's whole value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential_file: Option<String>,
    /// An environment variable of `tally serve` whose value is the header's whole value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential_env: Option<String>,
}

/// Whether `name` can name a server: 1 to [`MAX_NAME`] lowercase letters, digits and
/// `-`. No `_`, so that the gateway's tool names `NAME__tool` split at the first `__`
/// with certainty.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Whether `name` is an HTTP header name (RFC 9110 token), not one the transport owns.
fn valid_header(name: &str) -> bool {
    const OWNED: &[&str] = &[
        "host",
        "content-type",
        "content-length",
        "accept",
        "mcp-session-id",
        "mcp-protocol-version",
        "transfer-encoding",
        "connection",
    ];
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        && !OWNED.contains(&name.to_ascii_lowercase().as_str())
}

/// What is wrong with a recorded server's URL, if anything: `http://` or `https://`, a
/// host, no user info before it, no fragment or spaces. It accepts what every build
/// accepted (a ledger written by an earlier build, which took plain `http://` to any
/// host, still reads its policy record) and every URL [`url_problem`] puts in force (an
/// `@` in the path), so that a ledger this build writes verifies.
fn recorded_url_problem(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    let ok = rest.is_some_and(|r| {
        let authority = r.split('/').next().unwrap_or(r);
        !authority.is_empty()
            && r.bytes().all(|b| b.is_ascii_graphic())
            && !r.contains('#')
            && !authority.contains('@')
    });
    (!ok).then(|| {
        format!(
            "`{}` is not a server URL (no user info, fragment or spaces)",
            redacted(url)
        )
    })
}

/// What is wrong with the URL of a server being put in force, if anything: a URL the
/// gateway sends to as written ([`UpstreamUrl::parse`], the one reading of a URL tally
/// sends to: `https://host[:port]/path`, no user info, query, fragment, spaces or path
/// the client would rewrite), plain `http://` to a loopback host only. The URL is shown
/// [`redacted`]: it may carry a secret.
fn url_problem(url: &str) -> Option<String> {
    let shown = redacted(url);
    let u = match UpstreamUrl::parse(url) {
        Ok(u) => u,
        Err(UrlError::Query) => return Some(format!(
            "`{shown}` has a query: give the server's credential in `credential_file` or `credential_env` (sent in a header)"
        )),
        Err(UrlError::UserInfo) => return Some(format!(
            "`{shown}`: no user info before the host: a credential goes in `credential_file` or `credential_env`"
        )),
        Err(e) => return Some(format!("`{shown}`: {e} (write `https://host[:port]/path`)")),
    };
    if u.scheme() == Scheme::Http && !u.is_loopback() {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        return Some(format!(
            "`{shown}` is plain http to a host that is not loopback: the credential and every call would cross the network unencrypted. Write `{}` (plain `http://` is for 127.0.0.1, ::1 and localhost only)",
            redacted(&format!("https://{rest}"))
        ));
    }
    None
}

impl McpServer {
    /// What is wrong with this entry, if anything: the key under `mcp.NAME` and why.
    /// `new`: a policy being put in force, whose `url` meets [`url_problem`]; a recorded
    /// one meets [`recorded_url_problem`].
    pub(crate) fn problem(&self, new: bool) -> Option<(&'static str, String)> {
        let remote = self.url.is_some() || self.url_file.is_some();
        match (self.command.is_empty(), &self.url, &self.url_file) {
            (true, None, None) => Some((
                "command",
                "give the server: `command = [\"program\", \"arg\"]` (a stdio server) or `url = \"https://host:port/mcp\"` (a Streamable HTTP server; `url_file` names a file holding it)".into(),
            )),
            (false, _, _) if remote => Some((
                if self.url.is_some() { "url" } else { "url_file" },
                "give `command` or a URL (`url`, `url_file`), not both".into(),
            )),
            (false, _, _) => self.command_problem(),
            (true, Some(_), Some(_)) => Some((
                "url_file",
                "give `url` or `url_file`, not both".into(),
            )),
            (true, None, Some(file)) => if file.is_empty() {
                Some(("url_file", "is empty: give a file's path".into()))
            } else {
                self.remote_problem(None)
            },
            (true, Some(url), None) => if new {
                url_problem(url)
            } else {
                recorded_url_problem(url)
            }
            .map(|why| ("url", why))
            .or_else(|| self.remote_problem(Some(url))),
        }
    }

    /// What keeps `url`, read from this entry's `url_file` when `tally serve` starts,
    /// from being put in force: the key (`url_file`) and why, the URL shown redacted.
    pub fn url_file_problem(&self, url: &str) -> Option<(&'static str, String)> {
        url_problem(url)
            .map(|why| ("url_file", why))
            .or_else(|| self.remote_problem(Some(url)))
    }

    /// What keeps this entry from being put in force, if anything (the rules of a new
    /// policy, whatever a ledger recorded): the key under `mcp.NAME` and why. The gateway
    /// asks before it starts a server.
    pub fn in_force_problem(&self) -> Option<(&'static str, String)> {
        self.problem(true)
    }

    /// What a stdio server has that it may not: an empty program, a remote server's keys.
    fn command_problem(&self) -> Option<(&'static str, String)> {
        if self.command[0].is_empty() {
            return Some(("command", "the program is empty".into()));
        }
        for (key, set) in [
            ("header", self.header.is_some()),
            ("credential_file", self.credential_file.is_some()),
            ("credential_env", self.credential_env.is_some()),
        ] {
            if set {
                return Some((key, "only a `url` server takes a credential".into()));
            }
        }
        if self.ca_file.is_some() {
            return Some((
                "ca_file",
                "only an `https://` server takes a `ca_file`".into(),
            ));
        }
        None
    }

    /// What is wrong with a remote server's CA file and credential (its `url` is valid;
    /// `None` while it is in a `url_file` not yet read).
    fn remote_problem(&self, url: Option<&str>) -> Option<(&'static str, String)> {
        match self.ca_file.as_deref() {
            Some("") => return Some(("ca_file", "is empty: give a PEM file's path".into())),
            Some(_) if url.is_some_and(|u| !u.starts_with("https://")) => {
                return Some((
                    "ca_file",
                    "is for an `https://` server: a plain `http://` one shows no certificate"
                        .into(),
                ))
            }
            _ => {}
        }
        if self.credential_file.is_some() && self.credential_env.is_some() {
            return Some((
                "credential_env",
                "give `credential_file` or `credential_env`, not both".into(),
            ));
        }
        if self.credential_file.as_deref() == Some("") {
            return Some(("credential_file", "is empty: give a file's path".into()));
        }
        if self
            .credential_env
            .as_deref()
            .is_some_and(|e| e.is_empty() || e.contains('=') || e.contains('\0'))
        {
            return Some(("credential_env", "must name an environment variable".into()));
        }
        if let Some(h) = &self.header {
            if self.credential_file.is_none() && self.credential_env.is_none() {
                return Some((
                    "header",
                    "names the credential's header, but no `credential_file` or `credential_env` gives it".into(),
                ));
            }
            if !valid_header(h) {
                return Some((
                    "header",
                    format!("`{h}` is not a header name the gateway may set (a token, not one of the transport's own headers)"),
                ));
            }
        }
        None
    }
}

/// Every `[mcp.NAME]`: valid names, each entry valid (`new`: a policy being put in force,
/// see [`McpServer::problem`]); the key of the first problem.
pub(crate) fn check(
    servers: &BTreeMap<String, McpServer>,
    new: bool,
) -> Result<(), (String, String)> {
    for (name, s) in servers {
        if !valid_name(name) {
            return Err((
                format!("mcp.{name}"),
                format!("a server name is 1 to {MAX_NAME} lowercase letters, digits and `-` (no `_`: tools are exposed as NAME__tool)"),
            ));
        }
        if let Some((key, why)) = s.problem(new) {
            return Err((format!("mcp.{name}.{key}"), why));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::{Policy, PolicyError};

    fn refused(text: &str) -> (String, String) {
        match Policy::from_toml(text) {
            Err(PolicyError::Invalid { key, why, .. }) => (key, why),
            Err(PolicyError::Toml { key, message, .. }) => (key.unwrap_or_default(), message),
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn a_command_or_a_url_server_parses() {
        let p = Policy::from_toml(
            "[mcp.files]\ncommand = [\"python3\", \"server.py\"]\n\n[mcp.search]\nurl = \"http://127.0.0.1:8000/mcp\"\ncredential_env = \"SEARCH_TOKEN\"\nheader = \"X-Api-Key\"\n",
        )
        .expect("a valid policy");
        assert_eq!(p.mcp["files"].command, ["python3", "server.py"]);
        assert_eq!(
            p.mcp["search"].url.as_deref(),
            Some("http://127.0.0.1:8000/mcp")
        );
        assert_eq!(p.mcp["search"].header.as_deref(), Some("X-Api-Key"));
    }

    #[test]
    fn each_mistake_is_refused_naming_its_key() {
        for (text, key) in [
            ("[mcp.files]\n", "mcp.files.command"),
            ("[mcp.files]\ncommand = [\"a\"]\nurl = \"https://h/mcp\"\n", "mcp.files.url"),
            ("[mcp.files]\ncommand = [\"\"]\n", "mcp.files.command"),
            ("[mcp.files]\ncommand = [\"a\"]\ncredential_env = \"T\"\n", "mcp.files.credential_env"),
            ("[mcp.files]\ncommand = [\"a\"]\nca_file = \"/ca.pem\"\n", "mcp.files.ca_file"),
            ("[mcp.web]\nurl = \"ftp://h/mcp\"\n", "mcp.web.url"),
            ("[mcp.web]\nurl = \"h/mcp\"\n", "mcp.web.url"),
            ("[mcp.web]\nurl = \"https:///mcp\"\n", "mcp.web.url"),
            ("[mcp.web]\nurl = \"https://h:port/mcp\"\n", "mcp.web.url"),
            ("[mcp.web]\nurl = \"https://u:p@h/mcp\"\n", "mcp.web.url"),
            ("[mcp.web]\nurl = \"https://h/mcp#x\"\n", "mcp.web.url"),
            ("[mcp.web]\nurl = \"https://h/mcp?key=x\"\n", "mcp.web.url"),
            ("[mcp.web]\nurl = \"https://h/m cp\"\n", "mcp.web.url"),
            ("[mcp.web]\nurl = \"http://127.0.0.1/mcp\"\nca_file = \"/ca.pem\"\n", "mcp.web.ca_file"),
            ("[mcp.web]\nurl = \"https://h/mcp\"\nca_file = \"\"\n", "mcp.web.ca_file"),
            ("[mcp.web]\nurl = \"https://h/mcp\"\nheader = \"X-Key\"\n", "mcp.web.header"),
            ("[mcp.web]\nurl = \"https://h/mcp\"\nheader = \"Mcp-Session-Id\"\ncredential_env = \"T\"\n", "mcp.web.header"),
            ("[mcp.web]\nurl = \"https://h/mcp\"\ncredential_env = \"T\"\ncredential_file = \"/f\"\n", "mcp.web.credential_env"),
            ("[mcp.my_files]\ncommand = [\"a\"]\n", "mcp.my_files"),
            ("[mcp.Files]\ncommand = [\"a\"]\n", "mcp.Files"),
            ("[mcp.web]\nurl = \"https://h/mcp\"\nurl_file = \"/u\"\n", "mcp.web.url_file"),
            ("[mcp.web]\ncommand = [\"a\"]\nurl_file = \"/u\"\n", "mcp.web.url_file"),
            ("[mcp.web]\nurl_file = \"\"\n", "mcp.web.url_file"),
        ] {
            let (k, why) = refused(text);
            assert_eq!(k, key, "{text}: {why}");
        }
        // An unknown key is the parser's refusal, naming it.
        let (k, why) = refused("[mcp.web]\nurl = \"https://h/mcp\"\ntoken = \"x\"\n");
        assert!(
            k.starts_with("mcp.web") && why.contains("token"),
            "{k}: {why}"
        );
    }

    /// An `https://` server takes a CA file; plain `http://` is for loopback hosts only,
    /// and its refusal says what to write instead.
    #[test]
    fn plain_http_reaches_loopback_hosts_only() {
        let p = Policy::from_toml(
            "[mcp.web]\nurl = \"https://mcp.example.com/mcp\"\nca_file = \"/etc/tally/ca.pem\"\ncredential_env = \"T\"\n",
        )
        .expect("an https server");
        assert_eq!(p.mcp["web"].ca_file.as_deref(), Some("/etc/tally/ca.pem"));
        for host in [
            "127.0.0.1:8000",
            "127.8.9.1",
            "[::1]:8080",
            "localhost",
            "LOCALHOST:1",
        ] {
            let text = format!("[mcp.web]\nurl = \"http://{host}/mcp\"\ncredential_env = \"T\"\n");
            Policy::from_toml(&text).unwrap_or_else(|e| panic!("{host}: {e}"));
        }
        for host in [
            "10.0.0.1",
            "mcp.example.com:80",
            "localhost.example.com",
            "127.0.0.1.example.com",
            "[::2]",
            "0.0.0.0",
        ] {
            let text = format!("[mcp.web]\nurl = \"http://{host}/mcp\"\n");
            let (k, why) = refused(&text);
            assert_eq!(k, "mcp.web.url", "{host}: {why}");
            assert!(
                why.contains(&format!("`https://{host}/…`")) && why.contains("loopback"),
                "{host}: {why}"
            );
        }
    }

    /// A URL's query would be shown in errors (to agents, in the log): refused in a
    /// policy put in force; a recorded one that has one (earlier builds took it) reads.
    #[test]
    fn a_query_is_refused_in_force_but_read_from_a_ledger() {
        let text = "[mcp.web]\nurl = \"https://h/mcp?key=x\"\n";
        let (k, why) = refused(text);
        assert!(
            k == "mcp.web.url" && why.contains("credential_env"),
            "{k}: {why}"
        );
        let p = Policy::from_recorded(text).expect("a recorded policy");
        assert_eq!(p.mcp["web"].url.as_deref(), Some("https://h/mcp?key=x"));
    }

    /// A refused server URL is shown redacted: a secret in its user info, path or query
    /// is not repeated in the refusal (on the terminal, in the log), in force or read
    /// from a ledger.
    #[test]
    fn a_refused_url_is_shown_without_its_secrets() {
        for url in [
            "http://mcp.example.com/t/SECRET/mcp",
            "https://u:SECRET@mcp.example.com/mcp",
            "https://mcp.example.com/mcp?key=SECRET",
            "https://mcp.example.com/SECRET#x",
            "https://mcp.example.com/SE CRET",
            "ftp://mcp.example.com/SECRET",
            "mcp.example.com/SECRET",
        ] {
            let text = format!("[mcp.web]\nurl = \"{url}\"\n");
            let (k, why) = refused(&text);
            assert_eq!(k, "mcp.web.url", "{url}: {why}");
            assert!(!why.contains("SECRET"), "{url}: {why}");
            if let Err(e) = Policy::from_recorded(&text) {
                assert!(!e.to_string().contains("SECRET"), "{url}: {e}");
            }
        }
    }

    /// A URL that carries a secret is given in a file, read when `tally serve` starts:
    /// the policy names the file only, and what is read is held to the rules of a URL
    /// put in force, shown redacted.
    #[test]
    fn a_url_file_names_the_file_and_its_url_is_checked_when_read() {
        let p = Policy::from_toml(
            "[mcp.web]\nurl_file = \"/etc/tally/web.url\"\ncredential_env = \"T\"\nca_file = \"/ca.pem\"\n",
        )
        .expect("a url_file server");
        let web = &p.mcp["web"];
        assert_eq!(web.url_file.as_deref(), Some("/etc/tally/web.url"));
        assert_eq!(web.url, None);
        assert_eq!(web.in_force_problem(), None);
        assert_eq!(web.url_file_problem("https://h/t/SECRET/mcp"), None);
        for url in [
            "http://mcp.example.com/t/SECRET/mcp",
            "https://u:SECRET@h/mcp",
            "https://h/mcp?k=SECRET",
            "SECRET",
        ] {
            let (key, why) = web.url_file_problem(url).expect("refused");
            assert_eq!(key, "url_file", "{url}: {why}");
            assert!(!why.contains("SECRET"), "{url}: {why}");
        }
        // Its `ca_file` is for an `https://` URL, which is known once the file is read.
        let (key, _) = web
            .url_file_problem("http://127.0.0.1:9/mcp")
            .expect("a ca_file for plain http");
        assert_eq!(key, "ca_file");
    }
}
