//! A throwaway PKI for tests that need HTTPS: a fresh CA (rcgen) and a leaf it issued for
//! `127.0.0.1` and `localhost`, made at run time so no key material is checked in.

use std::path::{Path, PathBuf};

/// A test CA and one leaf certificate it issued.
pub struct TestPki {
    /// The CA's certificate (PEM): what a client is told to trust.
    pub ca_pem: String,
    /// The leaf's certificate (DER).
    pub leaf_der: Vec<u8>,
    /// The leaf's certificate (PEM).
    pub leaf_pem: String,
    /// The leaf's private key (PKCS #8 DER).
    pub leaf_key_der: Vec<u8>,
    /// The leaf's private key (PKCS #8 PEM).
    pub leaf_key_pem: String,
}

/// Where [`TestPki::write`] put the files.
pub struct PkiFiles {
    /// The CA certificate (PEM).
    pub ca: PathBuf,
    /// The leaf certificate (PEM).
    pub cert: PathBuf,
    /// The leaf key (PEM, mode 0600).
    pub key: PathBuf,
}

impl TestPki {
    /// A fresh CA and leaf.
    pub fn new() -> TestPki {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "tally test CA");
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf_key = KeyPair::generate().expect("leaf key");
        let leaf = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("leaf params")
            .signed_by(&leaf_key, &issuer)
            .expect("leaf certificate");
        TestPki {
            ca_pem: ca_cert.pem(),
            leaf_der: leaf.der().to_vec(),
            leaf_pem: leaf.pem(),
            leaf_key_der: leaf_key.serialize_der(),
            leaf_key_pem: leaf_key.serialize_pem(),
        }
    }

    /// Write `PREFIX-ca.pem`, `PREFIX-cert.pem` and `PREFIX-key.pem` (0600) into `dir`.
    pub fn write(&self, dir: &Path, prefix: &str) -> PkiFiles {
        use std::os::unix::fs::OpenOptionsExt;
        let files = PkiFiles {
            ca: dir.join(format!("{prefix}-ca.pem")),
            cert: dir.join(format!("{prefix}-cert.pem")),
            key: dir.join(format!("{prefix}-key.pem")),
        };
        std::fs::write(&files.ca, &self.ca_pem).expect("write CA");
        std::fs::write(&files.cert, &self.leaf_pem).expect("write certificate");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&files.key)
            .expect("key file");
        std::io::Write::write_all(&mut f, self.leaf_key_pem.as_bytes()).expect("write key");
        files
    }
}

impl Default for TestPki {
    fn default() -> TestPki {
        TestPki::new()
    }
}
