//! The operator's AWS credential and the SigV4 signature of each call to a `bedrock`
//! upstream, made by AWS's own signer (`aws-sigv4`), never by hand. The credential is
//! read from the upstream's credential file as one line,
//! `ACCESS_KEY_ID:SECRET_ACCESS_KEY` or `ACCESS_KEY_ID:SECRET_ACCESS_KEY:SESSION_TOKEN`
//! (docs/PROXY.md, "Amazon Bedrock"); its parts are held zeroized
//! (`aws_credential_types::Credentials`) and never logged (its `Debug` redacts them).

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};

/// The service name Bedrock's runtime is signed for.
const SERVICE: &str = "bedrock";

/// Why a credential cannot sign for Bedrock.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AwsCredentialError {
    /// Not `ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]`.
    #[error("a bedrock upstream's credential file holds ACCESS_KEY_ID:SECRET_ACCESS_KEY or ACCESS_KEY_ID:SECRET_ACCESS_KEY:SESSION_TOKEN on one line")]
    Shape,
    /// The access key id is not one (upper-case letters and digits, 16 to 128).
    #[error("the access key id (before the first `:`) must be 16 to 128 upper-case letters and digits, like AKIA...")]
    KeyId,
}

/// Why a request cannot be signed: what refused it, its own error the source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignError {
    /// The signing parameters (credential, region, time) cannot be built.
    #[error("the signing parameters cannot be built")]
    Params(#[from] v4::signing_params::BuildError),
    /// A header sent is not visible ASCII, so cannot be signed.
    #[error("a header that cannot be signed")]
    Header(#[from] hyper::header::ToStrError),
    /// AWS's signer refused the request (its URI, its headers).
    #[error("the signer refused the request")]
    Signer(#[from] aws_sigv4::http_request::SigningError),
    /// A header of the signature that cannot be sent.
    #[error("a signature header that cannot be sent")]
    Signature(#[from] hyper::header::InvalidHeaderValue),
}

/// What signs a `bedrock` upstream's calls: the credential and the region.
#[derive(Clone)]
pub struct AwsSigner {
    credentials: Credentials,
    region: String,
}

impl std::fmt::Debug for AwsSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsSigner")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl AwsSigner {
    /// The signer for `region` with the credential `secret` (the credential file's
    /// line: `ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]`).
    pub fn new(secret: &str, region: &str) -> Result<AwsSigner, AwsCredentialError> {
        let mut parts = secret.split(':');
        let (Some(id), Some(key)) = (parts.next(), parts.next()) else {
            return Err(AwsCredentialError::Shape);
        };
        let token = parts.next();
        if key.is_empty() || token.is_some_and(str::is_empty) || parts.next().is_some() {
            return Err(AwsCredentialError::Shape);
        }
        if !(16..=128).contains(&id.len())
            || !id
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        {
            return Err(AwsCredentialError::KeyId);
        }
        Ok(AwsSigner {
            credentials: Credentials::new(id, key, token.map(str::to_owned), None, "tally"),
            region: region.to_owned(),
        })
    }

    /// The headers that sign a `POST` of `body` to `uri` (absolute, its path already
    /// encoded as sent) with `headers` (every header sent, `host` among them):
    /// `authorization`, `x-amz-date` and, with a session token, `x-amz-security-token`,
    /// each sensitive where it holds a secret. Signed at `now`.
    pub fn sign(
        &self,
        uri: &str,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<Vec<(HeaderName, HeaderValue)>, SignError> {
        let identity = self.credentials.clone().into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(SERVICE)
            .time(now)
            .settings(SigningSettings::default())
            .build()?
            .into();
        let mut pairs = Vec::with_capacity(headers.len());
        for (n, v) in headers {
            pairs.push((n.as_str(), v.to_str()?));
        }
        let signable =
            SignableRequest::new("POST", uri, pairs.into_iter(), SignableBody::Bytes(body))?;
        let (instructions, _) = sign(signable, &params)?.into_parts();
        let (signed, _) = instructions.into_parts();
        let mut out = Vec::with_capacity(signed.len());
        for h in signed {
            let name = HeaderName::from_static(h.name());
            let mut value = HeaderValue::from_str(h.value())?;
            value.set_sensitive(h.sensitive() || name == "authorization");
            out.push((name, value));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_credential_line_is_read_strictly() {
        for ok in [
            "AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "ASIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG:FwoGZXIvYXdzEJr//////////wEaDA+=",
        ] {
            assert!(AwsSigner::new(ok, "us-east-1").is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("AKIAIOSFODNN7EXAMPLE", AwsCredentialError::Shape),
            ("AKIAIOSFODNN7EXAMPLE:", AwsCredentialError::Shape),
            ("AKIAIOSFODNN7EXAMPLE:k:", AwsCredentialError::Shape),
            ("AKIAIOSFODNN7EXAMPLE:k:t:x", AwsCredentialError::Shape),
            ("akiaiosfodnn7example:k", AwsCredentialError::KeyId),
            ("AKIA:k", AwsCredentialError::KeyId),
        ] {
            assert_eq!(AwsSigner::new(bad, "us-east-1").err(), Some(why), "{bad}");
        }
        let s = AwsSigner::new("AKIAIOSFODNN7EXAMPLE:topsecret:tok", "us-east-1").expect("ok");
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("topsecret") && !shown.contains("tok\""),
            "{shown}"
        );
    }

    #[test]
    fn a_call_is_signed_with_the_credential_for_its_region() {
        let s = AwsSigner::new("AKIAIOSFODNN7EXAMPLE:secret:token", "eu-west-1").expect("ok");
        let mut h = HeaderMap::new();
        h.insert(
            "host",
            HeaderValue::from_static("bedrock-runtime.eu-west-1.amazonaws.com"),
        );
        h.insert("content-type", HeaderValue::from_static("application/json"));
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let out = s
            .sign(
                "https://bedrock-runtime.eu-west-1.amazonaws.com/model/x%3A0/converse",
                &h,
                b"{}",
                at,
            )
            .expect("signed");
        let get = |n: &str| {
            out.iter()
                .find(|(k, _)| k == n)
                .and_then(|(_, v)| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let auth = get("authorization");
        assert!(
            auth.starts_with(
                "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20231114/eu-west-1/bedrock/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-security-token, Signature="
            ),
            "{auth}"
        );
        assert_eq!(get("x-amz-date"), "20231114T221320Z");
        assert_eq!(get("x-amz-security-token"), "token");
        assert!(out
            .iter()
            .all(|(k, v)| k == "x-amz-date" || v.is_sensitive()));
        // A header that is not visible ASCII cannot be signed: a typed error, no signature.
        h.insert(
            "x-odd",
            HeaderValue::from_bytes(b"caf\xe9").expect("opaque"),
        );
        assert!(matches!(
            s.sign(
                "https://bedrock-runtime.eu-west-1.amazonaws.com/model/x/converse",
                &h,
                b"{}",
                at
            ),
            Err(SignError::Header(_))
        ));
    }
}
