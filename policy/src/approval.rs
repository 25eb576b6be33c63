//! Approvals: a human's signed grant of a bounded extra allocation for one run, bound to a
//! digest of exactly what is approved (docs/GATE.md). The gate checks them before recording,
//! and `tally verify` checks them again offline from the ledger alone.
//!
//! The digest is BLAKE3 over `tally approval v1\n` followed by the canonical JSON of
//! `{"approver", "expires_ms", "run", "scope"}`, with `"answers"` (the approval request's
//! id) when it answers one; the approver signs the 32 digest bytes with Ed25519.
//!
//! A denial (an `override` with reason `denied_by_approver`) grants nothing: it names
//! the request it answers and the call that request is, and the approver's note. Its
//! digest is BLAKE3 over `tally denial v1\n` followed by the canonical JSON of
//! `{"answers", "approver", "note", "run", "tool"}`, with `"operation"` and
//! `"args_digest"` when the call has them: a domain of its own, so an approval's
//! signature is never a denial's, nor the reverse.

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier};
use serde_json::json;
use tally_record::decision::{canonical_json, Scope};
use tally_record::{Decision, Reason};

pub use crate::config::public_key;
use crate::config::Policy;
use crate::error::ApprovalError;

const DOMAIN: &[u8] = b"tally approval v1\n";

const DENIAL_DOMAIN: &[u8] = b"tally denial v1\n";

/// The longest note a denial carries, in bytes: the agent is told it.
pub const MAX_DENIAL_NOTE: usize = 500;

/// The digest of an approval, lowercase hex.
pub fn digest(run: &str, approver: &str, scope: &Scope, expires_ms: u64) -> String {
    answer_digest(run, approver, scope, expires_ms, None)
}

/// The digest of an approval that answers the approval request `answers` (none: a grant
/// without a request, as [`digest`]), lowercase hex.
pub fn answer_digest(
    run: &str,
    approver: &str,
    scope: &Scope,
    expires_ms: u64,
    answers: Option<&str>,
) -> String {
    let mut value = json!({
        "approver": approver,
        "expires_ms": expires_ms,
        "run": run,
        "scope": scope,
    });
    if let (Some(id), Some(map)) = (answers, value.as_object_mut()) {
        map.insert("answers".to_owned(), json!(id));
    }
    let mut bytes = DOMAIN.to_vec();
    canonical_json(&value, &mut bytes);
    blake3::hash(&bytes).to_hex().to_string()
}

/// The call a denial refuses: the denied request's tool, operation and argument digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeniedCall<'a> {
    /// The tool.
    pub tool: &'a str,
    /// The logical operation, if the call named one.
    pub operation: Option<&'a str>,
    /// The digest of its arguments, if it gave them.
    pub args_digest: Option<&'a str>,
}

/// The digest of a denial of request `answers` (the call `call`) of `run` by `approver`
/// with `note`, lowercase hex.
pub fn denial_digest(
    run: &str,
    approver: &str,
    answers: &str,
    call: DeniedCall<'_>,
    note: &str,
) -> String {
    let mut value = json!({
        "answers": answers,
        "approver": approver,
        "note": note,
        "run": run,
        "tool": call.tool,
    });
    if let Some(map) = value.as_object_mut() {
        if let Some(op) = call.operation {
            map.insert("operation".to_owned(), json!(op));
        }
        if let Some(args) = call.args_digest {
            map.insert("args_digest".to_owned(), json!(args));
        }
    }
    let mut bytes = DENIAL_DOMAIN.to_vec();
    canonical_json(&value, &mut bytes);
    blake3::hash(&bytes).to_hex().to_string()
}

/// Whether an `override` record is a denial (reason `denied_by_approver`) rather than an
/// approval.
pub fn is_denial(record: &Decision) -> bool {
    record.reason == Some(Reason::DeniedByApprover)
}

/// Sign an approval digest (hex) with the approver's key: the signature, lowercase hex.
pub fn sign(key: &SigningKey, digest_hex: &str) -> String {
    let bytes = hex::decode(digest_hex).unwrap_or_default();
    hex::encode(key.sign(&bytes).to_bytes())
}

/// Check an override record against the policy: a listed approver, a digest that covers
/// exactly its run, scope, approver and expiry, and a valid signature over it. A
/// continuation grant (its scope names `new_run`) gives attempts or spend to a new run
/// of another name, never a tool or an operation.
pub fn check(policy: &Policy, record: &Decision) -> Result<(), ApprovalError> {
    if is_denial(record) {
        return check_denial(policy, record);
    }
    let approver = record
        .approver
        .as_deref()
        .ok_or(ApprovalError::Missing("approver"))?;
    let scope = record
        .scope
        .as_ref()
        .ok_or(ApprovalError::Missing("scope"))?;
    if scope.attempts.is_none()
        && scope.spend().is_none()
        && scope.tool.is_none()
        && scope.operation.is_none()
    {
        return Err(ApprovalError::Empty);
    }
    if let Some(new_run) = &scope.new_run {
        continuation_scope(&record.run, new_run, scope)?;
    }
    let expires = record
        .expires_ms
        .ok_or(ApprovalError::Missing("expires_ms"))?;
    let given = record
        .digest
        .as_deref()
        .ok_or(ApprovalError::Missing("digest"))?;
    let signature = record
        .signature
        .as_deref()
        .ok_or(ApprovalError::Missing("signature"))?;
    let key_hex = policy
        .approvals
        .approvers
        .get(approver)
        .ok_or_else(|| ApprovalError::UnknownApprover(approver.to_owned()))?;
    if answer_digest(
        &record.run,
        approver,
        scope,
        expires,
        record.answers.as_deref(),
    ) != given
    {
        return Err(ApprovalError::Digest);
    }
    verify(approver, key_hex, given, signature)
}

/// Check a denial against the policy: it grants nothing, answers a request, names the
/// call with a note of at most [`MAX_DENIAL_NOTE`] bytes, and is signed by a listed
/// approver over a digest of exactly those ([`denial_digest`]).
fn check_denial(policy: &Policy, record: &Decision) -> Result<(), ApprovalError> {
    if record.scope.is_some() || record.expires_ms.is_some() {
        return Err(ApprovalError::Denial(
            "it grants nothing: no scope, no expiry",
        ));
    }
    let approver = required(record.approver.as_deref(), "approver")?;
    let answers = required(record.answers.as_deref(), "answers")?;
    let tool = required(record.tool.as_deref(), "tool")?;
    let note = required(record.note.as_deref(), "note")?;
    if note.trim().is_empty() || note.len() > MAX_DENIAL_NOTE {
        return Err(ApprovalError::Denial(
            "its note says why, in 1 to 500 bytes: the agent is told it",
        ));
    }
    let given = required(record.digest.as_deref(), "digest")?;
    let signature = required(record.signature.as_deref(), "signature")?;
    let key_hex = policy
        .approvals
        .approvers
        .get(approver)
        .ok_or_else(|| ApprovalError::UnknownApprover(approver.to_owned()))?;
    let call = DeniedCall {
        tool,
        operation: record.operation.as_deref(),
        args_digest: record.args_digest.as_deref(),
    };
    if denial_digest(&record.run, approver, answers, call, note) != given {
        return Err(ApprovalError::Digest);
    }
    verify(approver, key_hex, given, signature)
}

/// A field a denial needs.
fn required<'a>(value: Option<&'a str>, name: &'static str) -> Result<&'a str, ApprovalError> {
    value.ok_or(ApprovalError::Missing(name))
}

/// Whether `signature` (hex) is `approver`'s (key `key_hex`) over digest `given` (hex).
fn verify(
    approver: &str,
    key_hex: &str,
    given: &str,
    signature: &str,
) -> Result<(), ApprovalError> {
    let bad = || ApprovalError::Signature {
        approver: approver.to_owned(),
    };
    let key = public_key(key_hex).ok_or_else(bad)?;
    let sig: [u8; 64] = hex::decode(signature)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(bad)?;
    let message = hex::decode(given).map_err(|_| ApprovalError::Digest)?;
    key.verify(&message, &Signature::from_bytes(&sig))
        .map_err(|_| bad())
}

/// Whether a continuation grant's scope is one: an allocation (attempts or spend) for a
/// new run other than the approved one; a tool or an operation belongs to an ordinary
/// approval.
fn continuation_scope(run: &str, new_run: &str, scope: &Scope) -> Result<(), ApprovalError> {
    let why = if new_run.is_empty() || new_run == run {
        "its new run must be named, and differ from the run it continues"
    } else if scope.tool.is_some() || scope.operation.is_some() {
        "it grants attempts or spend to the new run, not a tool or an operation"
    } else if scope.attempts.is_none() && scope.spend().is_none() {
        "it grants the new run nothing: give attempts or spend"
    } else {
        return Ok(());
    };
    Err(ApprovalError::Continuation(why))
}

#[cfg(test)]
mod tests {
    use tally_record::Kind;

    use super::*;

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[9u8; 32])
    }

    fn policy() -> Policy {
        let mut p = Policy::default();
        p.approvals
            .approvers
            .insert("ana".into(), hex::encode(key().verifying_key().to_bytes()));
        p
    }

    /// An override on `run` granting `scope`, signed by ana.
    fn signed(run: &str, scope: Scope) -> Decision {
        let d = digest(run, "ana", &scope, 1_000);
        Decision {
            run: run.into(),
            kind: Some(Kind::Override),
            approver: Some("ana".into()),
            signature: Some(sign(&key(), &d)),
            digest: Some(d),
            scope: Some(Box::new(scope)),
            expires_ms: Some(1_000),
            ..Decision::default()
        }
    }

    fn allocation(new_run: Option<&str>) -> Scope {
        Scope {
            attempts: Some(5),
            new_run: new_run.map(str::to_owned),
            ..Scope::default()
        }
    }

    /// docs/FORMAT.md, "Denials": the denial digest of its example, written there.
    #[test]
    fn the_denial_digest_vector_matches_docs() {
        let args = tally_record::decision::args_digest(&json!({"to": "x@example.com"}));
        let d = denial_digest(
            "r1",
            "ana",
            "779e96cd51871b36",
            DeniedCall {
                tool: "email.send",
                operation: Some("send:42"),
                args_digest: Some(&args),
            },
            "not to this address",
        );
        let doc = include_str!("../../docs/FORMAT.md");
        let written = doc
            .split_once("the denial digest is `")
            .and_then(|(_, rest)| rest.split_once('`'))
            .map(|(hex, _)| hex);
        assert_eq!(written, Some(d.as_str()), "args digest {args}");
    }

    #[test]
    fn a_continuation_grant_is_bound_to_its_new_run_and_allocation() {
        let p = policy();
        let grant = signed("a", allocation(Some("b")));
        assert_eq!(check(&p, &grant), Ok(()));
        // Read as an ordinary approval (its new run dropped), or as one for another new
        // run, or with its allocation changed after signing: the digest no longer covers it.
        for tamper in [
            allocation(None),
            allocation(Some("c")),
            Scope {
                attempts: Some(50),
                ..allocation(Some("b"))
            },
        ] {
            let mut t = grant.clone();
            t.scope = Some(Box::new(tamper));
            assert_eq!(check(&p, &t), Err(ApprovalError::Digest));
        }
        // An ordinary approval given a new run after signing is none either.
        let mut ordinary = signed("a", allocation(None));
        ordinary.scope = Some(Box::new(allocation(Some("b"))));
        assert_eq!(check(&p, &ordinary), Err(ApprovalError::Digest));
    }

    #[test]
    fn a_continuation_grant_gives_a_new_run_attempts_or_spend_only() {
        let p = policy();
        let tool = Scope {
            tool: Some("t".into()),
            ..allocation(Some("b"))
        };
        let nothing = Scope {
            tool: Some("t".into()),
            new_run: Some("b".into()),
            ..Scope::default()
        };
        for bad in [
            signed("a", tool),
            signed("a", nothing),
            signed("a", allocation(Some("a"))),
            signed("a", allocation(Some(""))),
        ] {
            assert!(
                matches!(check(&p, &bad), Err(ApprovalError::Continuation(_))),
                "{bad:?}"
            );
        }
        let spend = Scope {
            nanos: Some(10),
            new_run: Some("b".into()),
            ..Scope::default()
        };
        assert_eq!(check(&p, &signed("a", spend)), Ok(()));
    }
}
