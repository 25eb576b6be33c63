//! The fake Bedrock's signature check can refuse: a call with no signature, or with one
//! botocore does not compute the same (another body, another secret), is answered 403
//! `InvalidSignatureException` as Bedrock answers it, and kept as not carrying the real key; one botocore itself signed with the fake's
//! credential is answered.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use tally_testkit::upstream::{FakeOptions, FakeUpstream, AWS_CREDENTIAL, AWS_REGION};

/// Signs a POST of `body` to `url` with botocore, with `credential`; the headers.
fn botocore_signed(url: &str, body: &str, credential: &str) -> Vec<(String, String)> {
    let script = r#"
import json, sys
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
url, body, cred, region = sys.argv[1:5]
k, s, t = cred.split(":")
r = AWSRequest(method="POST", url=url, data=body.encode(), headers={"content-type": "application/json"})
SigV4Auth(Credentials(k, s, t), "bedrock", region).add_auth(r)
print(json.dumps([[n, v] for n, v in r.headers.items()]))
"#;
    let out = Command::new("python3")
        .args(["-c", script, url, body, credential, AWS_REGION])
        .stdin(Stdio::null())
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("headers")
}

/// A POST to the fake with `headers`; its status.
fn post(fake: &FakeUpstream, path: &str, headers: &[(String, String)], body: &str) -> u16 {
    let mut c = std::net::TcpStream::connect(fake.addr()).expect("connect");
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nhost: {}\r\nconnection: close\r\ncontent-length: {}\r\n",
        fake.addr(),
        body.len()
    );
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    c.write_all(req.as_bytes()).expect("send");
    let mut out = String::new();
    c.read_to_string(&mut out).expect("answer");
    out.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[test]
fn the_fake_bedrock_answers_only_what_botocore_signs_the_same() {
    if !tally_testkit::have(
        "python3",
        &["-c", "import botocore"],
        "python3 -m pip install botocore==1.43.11",
    ) {
        return;
    }
    let fake = FakeUpstream::start(FakeOptions::default());
    let path = "/model/fake-ok/converse";
    let url = format!("{}{path}", fake.url());
    let body = r#"{"messages":[{"role":"user","content":[{"text":"hi"}]}]}"#;
    let signed = botocore_signed(&url, body, AWS_CREDENTIAL);
    assert_eq!(post(&fake, path, &signed, body), 200);
    // Another body under the same signature.
    assert_eq!(post(&fake, path, &signed, &body.replace("hi", "ho")), 403);
    // Another secret.
    let other = AWS_CREDENTIAL.replacen(":fake/", ":fakf/", 1);
    assert_eq!(
        post(&fake, path, &botocore_signed(&url, body, &other), body),
        403
    );
    // No signature; a bearer key.
    let json = vec![("content-type".to_owned(), "application/json".to_owned())];
    assert_eq!(post(&fake, path, &json, body), 403);
    let mut bearer = json.clone();
    bearer.push(("authorization".into(), "Bearer sk-real".into()));
    assert_eq!(post(&fake, path, &bearer, body), 403);
    let real: Vec<bool> = fake.seen().iter().map(|s| s.real_key).collect();
    assert_eq!(real, [true, false, false, false, false]);
}
