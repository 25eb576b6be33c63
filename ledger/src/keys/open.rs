//! Opening one sealed decision: XChaCha20-Poly1305 (draft-irtf-cfrg-xchacha, RFC 8439
//! §2.8) from RustCrypto's two parts, the XChaCha20 stream cipher and Poly1305, with the
//! keystream drawn in one call.
//!
//! `chacha20poly1305` draws the Poly1305 key's block and then each block of the text in
//! separate calls; on a decision of a few blocks its AVX2 backend computes four blocks
//! for every one it is asked for, so most of the keystream it computes is thrown away.
//! Here the key's block and the text share one call over one buffer. The result is the
//! same AEAD, byte for byte (`one_call_open_is_the_aead` holds it to `chacha20poly1305`
//! on random keys, nonces, headers and texts, whole and with any byte changed).

use chacha20::cipher::{KeyIvInit, StreamCipher};
use chacha20::XChaCha20;
use poly1305::universal_hash::{KeyInit, UniversalHash};
use poly1305::Poly1305;
use zeroize::{Zeroize, Zeroizing};

use crate::error::CryptoError;
use crate::format::TAG_LEN;

/// One ChaCha20 block: the first is the Poly1305 key's, the text starts at the second.
const BLOCK: usize = 64;

/// Open `body` (ciphertext, then the 16-byte tag) sealed under `key` and `nonce` with
/// `aad` as associated data into `out` (cleared first, its allocation reused). On any
/// failure `out` is left empty, and what it held of the text is zeroized.
pub(super) fn open_into(
    key: &Zeroizing<[u8; 32]>,
    nonce: &[u8; 24],
    aad: &[u8],
    body: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), CryptoError> {
    out.clear();
    let Some(split) = body.len().checked_sub(TAG_LEN) else {
        return Err(CryptoError::Decrypt);
    };
    let (text, tag) = body.split_at(split);
    // The AEAD's own bound: ChaCha20's 32-bit block counter (block 0 is the key's).
    if text.len() / BLOCK >= u32::MAX as usize {
        return Err(CryptoError::Decrypt);
    }
    out.resize(BLOCK, 0);
    out.extend_from_slice(text);
    let mut cipher = XChaCha20::new(key.as_ref().into(), nonce.into());
    cipher.apply_keystream(out);
    let mut mac = Poly1305::new(out[..32].into());
    mac.update_padded(aad);
    mac.update_padded(text);
    let mut lengths = poly1305::Block::default();
    lengths[..8].copy_from_slice(&(aad.len() as u64).to_le_bytes());
    lengths[8..].copy_from_slice(&(text.len() as u64).to_le_bytes());
    mac.update(&[lengths]);
    // Constant time (`subtle`), as the AEAD's own check.
    let verified = mac.verify(tag.into()).is_ok();
    out[..BLOCK].zeroize();
    if !verified {
        out.zeroize();
        out.clear();
        return Err(CryptoError::Decrypt);
    }
    out.copy_within(BLOCK.., 0);
    let len = text.len();
    out[len..].zeroize();
    out.truncate(len);
    Ok(())
}

#[cfg(test)]
mod tests;
