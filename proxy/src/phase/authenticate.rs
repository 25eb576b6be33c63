//! The authenticate phase: the run the agent's token names, if it may spend. A token
//! that is missing, forged or twice different is a 401; a run that has stopped or is
//! past its deadline a 403 with its reason. Nothing is recorded: there is no run to
//! record in, or it has ended. A key (`tlk_`, docs/KEYS.md) in place of a run token
//! names its run through [`super::keyed`], which starts it if it is new.

use hyper::header::HeaderMap;
use tally_gate::{Caller, GateError};
use tally_record::Reason;

use crate::dialect::Refusal;
use crate::proxy::Proxy;
use crate::refuse::{unavailable, Caught, KeyCall};

/// The run the request's token names, if it may spend.
pub(super) async fn authenticate(proxy: &Proxy, headers: &HeaderMap) -> Result<Caught, Refusal> {
    let token = token(headers)?;
    let (run, key) = if crate::keys::looks_like_key(token) {
        let (run, key) = super::keyed::run_of_key(proxy, headers, token).await?;
        (run, Some(key))
    } else {
        let run = proxy
            .key
            .run_of(token)
            .ok_or_else(|| Refusal::token("this is not a run token of this tally"))?;
        (run, None)
    };
    standing(proxy, run, key).await
}

/// The run `run` and its standing, if it may spend.
async fn standing(proxy: &Proxy, run: String, key: Option<KeyCall>) -> Result<Caught, Refusal> {
    let operator = Caller {
        uid: None,
        operator: true,
        proxied: false,
    };
    let lookup = run.clone();
    let standing = proxy
        .at_once(move |gate| gate.run(operator, &lookup))
        .await
        .map_err(|e| match e {
            GateError::Unavailable(_) => unavailable(),
            _ => Refusal::token("the run of this token is not known to the gate"),
        })?;
    // A real token of a run that may not spend any more: 403 with the reason, its
    // action `stop`, so a client shows why and stops (a 401 reads as a bad key, which
    // agents retry or send the user to log in again). Nothing is recorded: the run
    // has ended, or its deadline has (the next check would stop it).
    if standing.state == tally_wire::RunState::Stopped {
        let reason = standing.stop_reason.unwrap_or(Reason::Completed);
        return Err(Refusal::ended(
            reason,
            format!(
                "the run of this token has stopped ({}): a new task is a new run, with its own token",
                reason.as_str()
            ),
        ));
    }
    if tally_policy::past_deadline(&standing.budget, standing.at_ms) {
        return Err(Refusal::ended(
            Reason::RunDeadlineExhausted,
            "the run of this token is past its deadline: a new task is a new run, with its own token"
                .into(),
        ));
    }
    Ok(Caught { run, standing, key })
}

/// The headers an SDK sends its API key in: `Authorization: Bearer` (OpenAI), then
/// `x-api-key` (Anthropic), `x-goog-api-key` (Gemini), `api-key` (Azure OpenAI).
const KEY_HEADERS: [&str; 3] = ["x-api-key", "x-goog-api-key", "api-key"];

/// The run token the agent sent as its API key (in any of the headers SDKs send a key
/// in; in several only if the same in each).
fn token(headers: &HeaderMap) -> Result<&str, Refusal> {
    // A field's value without the whitespace around it (RFC 9110 5.5: it is HTTP's,
    // not the value's); the token itself must then be spelt exactly as minted.
    let value = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim_matches([' ', '\t']))
    };
    let bearer = value("authorization").and_then(crate::token::bearer);
    let mut sent = bearer
        .into_iter()
        .chain(KEY_HEADERS.iter().filter_map(|h| value(h)));
    let Some(first) = sent.next() else {
        if value("authorization").is_some_and(|a| a.starts_with("AWS4-HMAC-SHA256")) {
            // An AWS SDK that signed with AWS credentials: the proxy signs for Bedrock.
            return Err(Refusal::token(
                "an AWS signature is not a run token: give the run's token as the Bedrock API key (AWS_BEARER_TOKEN_BEDROCK), and no AWS credential",
            ));
        }
        return Err(Refusal::token(
            "no run token: use the token of your run (the `token` of POST /v1/runs) as the API key",
        ));
    };
    if sent.any(|t| t != first) {
        return Err(Refusal::token(
            "two different keys (in Authorization, x-api-key, x-goog-api-key or api-key): send the run token once",
        ));
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn the_token_is_read_from_each_sdks_key_header_and_must_agree() {
        for h in [
            headers(&[("authorization", "Bearer tly_a")]),
            headers(&[("x-api-key", "tly_a")]),
            headers(&[("x-goog-api-key", "tly_a")]),
            headers(&[("api-key", " tly_a ")]),
            headers(&[("authorization", "Bearer tly_a"), ("api-key", "tly_a")]),
        ] {
            assert_eq!(token(&h).ok(), Some("tly_a"), "{h:?}");
        }
        for h in [
            headers(&[]),
            headers(&[("x-goog-api-key", "tly_a"), ("api-key", "tly_b")]),
            headers(&[
                ("authorization", "Bearer tly_a"),
                ("x-goog-api-key", "tly_b"),
            ]),
            headers(&[("x-api-key", "tly_a"), ("x-goog-api-key", "")]),
        ] {
            assert!(token(&h).is_err(), "{h:?}");
        }
        let signed = headers(&[(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=AKIA/20250101/us-east-1/bedrock/aws4_request",
        )]);
        let refused = token(&signed).expect_err("refused");
        assert!(
            refused.message.contains("AWS_BEARER_TOKEN_BEDROCK"),
            "{refused:?}"
        );
    }
}
