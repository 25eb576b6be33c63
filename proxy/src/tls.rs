//! The one HTTPS client tally builds, for the model proxy's upstreams, `tally serve`'s
//! witnesses and the MCP gateway's remote servers alike: rustls with the ring provider,
//! TLS 1.2 and 1.3, the Mozilla roots compiled in, plus the CA certificates of a PEM file
//! for a peer whose certificate a private CA issued. The gateway's client is rmcp's, over
//! reqwest: it is handed this configuration ([`client_config`]), not a second one. Plain
//! `http://` is the caller's to allow or refuse; `localhost`, which a policy takes as
//! loopback by its name, is reached at 127.0.0.1 and ::1 without asking the resolver
//! ([`Pinned`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::dns::{GaiResolver, Name};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// An HTTPS (or HTTP) client with bodies in memory.
pub type HttpsClient = Client<HttpsConnector<HttpConnector<Pinned>>, Full<Bytes>>;

/// The clients' resolver: `localhost` is `tally_record::url::pinned`'s address (the one
/// rule, which the MCP gateway's client follows too), never the system resolver's answer
/// (with no hosts entry and a search domain it could be `localhost.corp.example`, and a
/// credential sent there in the clear); every other name is the system resolver's.
#[derive(Clone, Debug)]
pub struct Pinned(GaiResolver);

impl Default for Pinned {
    fn default() -> Pinned {
        Pinned(GaiResolver::new())
    }
}

/// What [`Pinned`] resolves a name to.
type Addrs = std::vec::IntoIter<std::net::SocketAddr>;

impl tower::Service<Name> for Pinned {
    type Response = Addrs;
    type Error = std::io::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Addrs, std::io::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), std::io::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, name: Name) -> Self::Future {
        if let Some(ips) = tally_record::url::pinned(name.as_str()) {
            // The port is the URL's: the connector sets it (and tries each address).
            let addrs: Vec<_> = ips.map(|ip| std::net::SocketAddr::new(ip, 0)).into();
            let addrs = addrs.into_iter();
            return Box::pin(std::future::ready(Ok(addrs)));
        }
        let asked = self.0.call(name);
        Box::pin(async move { Ok(asked.await?.collect::<Vec<_>>().into_iter()) })
    }
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsError {
    /// The CA file could not be read, holds something that is not a certificate, or
    /// holds none.
    #[error("{why}")]
    CaFile {
        /// What is wrong with it.
        why: String,
    },
    /// rustls refused the configuration.
    #[error("TLS: {0}")]
    Config(String),
}

/// The crypto provider every TLS client and server of tally uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The Mozilla roots, and the certificates of the PEM file `ca_file` if given (at least
/// one, every block a certificate).
pub fn roots(ca_file: Option<&Path>) -> Result<rustls::RootCertStore, TlsError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let Some(file) = ca_file else {
        return Ok(roots);
    };
    let bad = |why: String| TlsError::CaFile { why };
    let mut n = 0;
    for cert in CertificateDer::pem_file_iter(file).map_err(|e| bad(e.to_string()))? {
        let cert = cert.map_err(|e| bad(e.to_string()))?;
        roots.add(cert).map_err(|e| bad(e.to_string()))?;
        n += 1;
    }
    if n == 0 {
        return Err(bad("holds no PEM certificate".into()));
    }
    Ok(roots)
}

/// The TLS configuration of every client: TLS 1.2 and 1.3 with [`provider`], trusting
/// [`roots`] of `ca_file`, no client certificate.
pub fn client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, TlsError> {
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots(ca_file)?)
        .with_no_client_auth())
}

/// A client of [`client_config`], HTTP/1.1, idle connections kept 30 s.
pub fn https_client(ca_file: Option<&Path>) -> Result<HttpsClient, TlsError> {
    let config = client_config(ca_file)?;
    let mut http = HttpConnector::new_with_resolver(Pinned::default());
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `localhost` is reached at 127.0.0.1 and ::1 whatever the system resolver would say;
    /// another name is asked of it.
    #[tokio::test]
    async fn the_clients_resolver_pins_localhost_to_loopback() {
        use tower::Service;
        let mut resolver = Pinned::default();
        for name in ["localhost", "LOCALHOST"] {
            let name: Name = name.parse().expect("name");
            let addrs: Vec<_> = resolver.call(name).await.expect("resolved").collect();
            let both: [std::net::SocketAddr; 2] = [
                "127.0.0.1:0".parse().expect("v4"),
                "[::1]:0".parse().expect("v6"),
            ];
            assert_eq!(addrs, both, "{addrs:?}");
        }
        let other: Name = "127.0.0.2".parse().expect("name");
        let addrs: Vec<_> = resolver.call(other).await.expect("resolved").collect();
        assert_eq!(addrs, ["127.0.0.2:0".parse().expect("addr")]);
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let e = roots(Some(&empty)).expect_err("no certificate");
        assert_eq!(
            e,
            TlsError::CaFile {
                why: "holds no PEM certificate".into()
            }
        );
        let missing = dir.path().join("missing.pem");
        assert!(matches!(
            roots(Some(&missing)),
            Err(TlsError::CaFile { .. })
        ));
        let mozilla = roots(None).expect("roots").len();
        assert!(mozilla > 100, "{mozilla}");
    }
}
