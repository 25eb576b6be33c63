//! The URLs policy entries give in a `url_file` (for a URL that carries a secret, which
//! the policy recorded in the ledger then does not hold): a proxy upstream's, read when
//! `tally serve` starts and held to the rules of a URL put in force, and every
//! `url_file` of a policy checked by `tally policy check`.

use std::collections::BTreeMap;

use tally_record::url::UpstreamUrl;

use crate::error::DaemonError;
use crate::secret_file::read_file;

/// Why an upstream's `url_file` gave no URL put in force, the text naming the upstream
/// and the file, the URL redacted.
enum Fault {
    /// The file could not be read.
    Unread(String),
    /// Its URL is not one put in force.
    Refused(String),
}

/// The URL in the `url_file` of upstream `name`, where it gives one: read
/// ([`read_file`]) and held to the rules of a URL put in force
/// (`tally_policy::upstreams::url_in_force`).
fn upstream_url(name: &str, u: &tally_policy::Upstream) -> Option<Result<UpstreamUrl, Fault>> {
    let (None, Some(file)) = (&u.url, &u.url_file) else {
        return None;
    };
    let named = |why: String| format!("[upstreams.{name}] url_file {file}: {why}");
    Some(match read_file(file) {
        Err(why) => Err(Fault::Unread(named(why))),
        Ok(url) => {
            tally_policy::upstreams::url_in_force(&url).map_err(|why| Fault::Refused(named(why)))
        }
    })
}

/// The URL of each `[upstreams.NAME]` given by `url_file` ([`upstream_url`]), by
/// upstream name; an error names the upstream and the file and shows the URL redacted.
pub(crate) fn upstream_urls(
    policy: &tally_policy::Policy,
) -> Result<BTreeMap<String, UpstreamUrl>, DaemonError> {
    let mut urls = BTreeMap::new();
    for (name, u) in &policy.upstreams {
        match upstream_url(name, u) {
            None => {}
            Some(Ok(url)) => {
                urls.insert(name.clone(), url);
            }
            Some(Err(Fault::Unread(why) | Fault::Refused(why))) => {
                return Err(DaemonError::UpstreamUrlFile(why))
            }
        }
    }
    Ok(urls)
}

/// Whether each `url_file` of `policy`'s MCP servers and proxy upstreams holds a URL
/// `tally serve` would put in force (`tally policy check` asks; `tally serve` refuses
/// before it starts): the first whose URL does not, the error naming its entry and file,
/// the URL redacted. A file that cannot be read here (a policy checked in CI, away from
/// its secrets) is no error: it is one of the warnings returned.
pub fn check_url_files(policy: &tally_policy::Policy) -> Result<Vec<String>, DaemonError> {
    let mut unread = crate::mcp_gateway::unread_url_files(policy)?;
    for (name, u) in &policy.upstreams {
        match upstream_url(name, u) {
            None | Some(Ok(_)) => {}
            Some(Err(Fault::Refused(why))) => return Err(DaemonError::UpstreamUrlFile(why)),
            Some(Err(Fault::Unread(why))) => {
                unread.push(format!("{why} (not checked here; tally serve reads it)"))
            }
        }
    }
    Ok(unread)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream's URL given in a `url_file` is read at start and held to the rules
    /// of a URL put in force; a refusal names the upstream and file and shows the URL
    /// redacted; `tally policy check` warns of a file it cannot read.
    #[test]
    fn an_upstreams_url_file_is_read_at_start_and_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("gw.url");
        let text = format!(
            "[upstreams.gw]\nurl_file = {:?}\nkind = \"openai\"\ncredential = \"gw\"\npaths = [\"/v1/\"]\n",
            file.display().to_string()
        );
        let policy = tally_policy::Policy::from_toml(&text).expect("a url_file upstream");
        let warnings = check_url_files(&policy).expect("a missing file is no error");
        assert!(
            matches!(warnings.as_slice(), [w] if w.contains("[upstreams.gw] url_file") && w.contains("not checked here")),
            "{warnings:?}"
        );
        assert!(upstream_urls(&policy).is_err());
        std::fs::write(&file, "https://GW.example:8443/t/SECRET/v1\n").expect("write");
        let urls = upstream_urls(&policy).expect("read");
        assert_eq!(urls["gw"].as_str(), "https://gw.example:8443/t/SECRET/v1");
        assert_eq!(
            check_url_files(&policy).expect("a good URL"),
            Vec::<String>::new()
        );
        for bad in [
            "http://10.0.0.7/t/SECRET/v1",
            "https://u:SECRET@gw.example/v1",
            "https://gw.example/a/../t/SECRET",
            "https://gw.example/t/%53ECRET",
            "https://gw.example/v1?key=SECRET",
        ] {
            std::fs::write(&file, bad).expect("write");
            for e in [
                upstream_urls(&policy).map(drop),
                check_url_files(&policy).map(drop),
            ] {
                match e {
                    Err(DaemonError::UpstreamUrlFile(why)) => {
                        assert!(why.contains("[upstreams.gw] url_file"), "{why}");
                        assert!(!why.contains("SECRET"), "{bad}: {why}");
                    }
                    other => panic!("{bad}: {other:?}"),
                }
            }
        }
    }
}
