//! The MCP servers `tally serve --mcp-listen` puts its gateway in front of
//! (`[mcp.NAME]`, docs/MCP.md, "The HTTP gateway"): each one either a command the
//! gateway starts and speaks to on stdio, or the URL of a remote Streamable HTTP server,
//! with an optional credential the gateway sends it in a header.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The longest server name.
pub const MAX_NAME: usize = 32;

/// One `[mcp.NAME]` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpServer {
    /// The server's command and arguments (a stdio server the gateway starts).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The URL of a remote Streamable HTTP server (`http://` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
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

impl McpServer {
    /// What is wrong with this entry, if anything: the key under `mcp.NAME` and why.
    pub(crate) fn problem(&self) -> Option<(&'static str, String)> {
        match (self.command.is_empty(), &self.url) {
            (true, None) => {
                return Some((
                    "command",
                    "give the server: `command = [\"program\", \"arg\"]` (a stdio server) or `url = \"http://host:port/mcp\"` (a Streamable HTTP server)".into(),
                ))
            }
            (false, Some(_)) => {
                return Some((
                    "url",
                    "give `command` or `url`, not both".into(),
                ))
            }
            (false, None) => {
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
                return None;
            }
            (true, Some(url)) => {
                let rest = url.strip_prefix("http://");
                let ok = rest.is_some_and(|r| {
                    !r.is_empty()
                        && !r.starts_with('/')
                        && r.bytes().all(|b| b.is_ascii_graphic())
                        && !r.contains('#')
                        && !r.contains('@')
                });
                if !ok {
                    return Some((
                        "url",
                        "must be `http://host:port/path` (no user info, fragment or spaces; `https` is not served yet)".into(),
                    ));
                }
            }
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

/// Every `[mcp.NAME]`: valid names, each entry valid; the key of the first problem.
pub(crate) fn check(servers: &BTreeMap<String, McpServer>) -> Result<(), (String, String)> {
    for (name, s) in servers {
        if !valid_name(name) {
            return Err((
                format!("mcp.{name}"),
                format!("a server name is 1 to {MAX_NAME} lowercase letters, digits and `-` (no `_`: tools are exposed as NAME__tool)"),
            ));
        }
        if let Some((key, why)) = s.problem() {
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
            ("[mcp.files]\ncommand = [\"a\"]\nurl = \"http://h/mcp\"\n", "mcp.files.url"),
            ("[mcp.files]\ncommand = [\"\"]\n", "mcp.files.command"),
            ("[mcp.files]\ncommand = [\"a\"]\ncredential_env = \"T\"\n", "mcp.files.credential_env"),
            ("[mcp.web]\nurl = \"https://h/mcp\"\n", "mcp.web.url"),
            ("[mcp.web]\nurl = \"http://u:p@h/mcp\"\n", "mcp.web.url"),
            ("[mcp.web]\nurl = \"http://h/mcp\"\nheader = \"X-Key\"\n", "mcp.web.header"),
            ("[mcp.web]\nurl = \"http://h/mcp\"\nheader = \"Mcp-Session-Id\"\ncredential_env = \"T\"\n", "mcp.web.header"),
            ("[mcp.web]\nurl = \"http://h/mcp\"\ncredential_env = \"T\"\ncredential_file = \"/f\"\n", "mcp.web.credential_env"),
            ("[mcp.my_files]\ncommand = [\"a\"]\n", "mcp.my_files"),
            ("[mcp.Files]\ncommand = [\"a\"]\n", "mcp.Files"),
        ] {
            let (k, why) = refused(text);
            assert_eq!(k, key, "{text}: {why}");
        }
        // An unknown key is the parser's refusal, naming it.
        let (k, why) = refused("[mcp.web]\nurl = \"http://h/mcp\"\ntoken = \"x\"\n");
        assert!(
            k.starts_with("mcp.web") && why.contains("token"),
            "{k}: {why}"
        );
    }
}
