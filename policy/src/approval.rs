//! Approvals: a human's signed grant of a bounded extra allocation for one run, bound to a
//! digest of exactly what is approved (docs/GATE.md). The gate checks them before recording,
//! and `tally verify` checks them again offline from the ledger alone.
//!
//! The digest is BLAKE3 over `tally approval v1\n` followed by the canonical JSON of
//! `{"approver", "expires_ms", "run", "scope"}`, with `"answers"` (the approval request's
//! id) when it answers one; the approver signs the 32 digest bytes with Ed25519.

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier};
use serde_json::json;
use tally_record::decision::{canonical_json, Scope};
use tally_record::Decision;

pub use crate::config::public_key;
use crate::config::Policy;
use crate::error::ApprovalError;

const DOMAIN: &[u8] = b"tally approval v1\n";

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

/// Sign an approval digest (hex) with the approver's key: the signature, lowercase hex.
pub fn sign(key: &SigningKey, digest_hex: &str) -> String {
    let bytes = hex::decode(digest_hex).unwrap_or_default();
    hex::encode(key.sign(&bytes).to_bytes())
}

/// Check an override record against the policy: a listed approver, a digest that covers
/// exactly its run, scope, approver and expiry, and a valid signature over it.
pub fn check(policy: &Policy, record: &Decision) -> Result<(), ApprovalError> {
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
