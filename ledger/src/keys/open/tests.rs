//! The one-call open is `chacha20poly1305`'s XChaCha20-Poly1305, byte for byte.

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use proptest::prelude::*;
use zeroize::Zeroizing;

use super::open_into;

fn seal(key: &[u8; 32], nonce: &[u8; 24], aad: &[u8], text: &[u8]) -> Vec<u8> {
    let mut body = text.to_vec();
    let tag = XChaCha20Poly1305::new(key.into())
        .encrypt_in_place_detached(XNonce::from_slice(nonce), aad, &mut body)
        .expect("seal");
    body.extend_from_slice(&tag);
    body
}

/// What `chacha20poly1305` opens `body` to, if it opens.
fn aead_open(key: &[u8; 32], nonce: &[u8; 24], aad: &[u8], body: &[u8]) -> Option<Vec<u8>> {
    let split = body.len().checked_sub(16)?;
    let mut text = body[..split].to_vec();
    XChaCha20Poly1305::new(key.into())
        .decrypt_in_place_detached(
            XNonce::from_slice(nonce),
            aad,
            &mut text,
            body[split..].into(),
        )
        .ok()
        .map(|()| text)
}

fn one_call(key: &[u8; 32], nonce: &[u8; 24], aad: &[u8], body: &[u8]) -> Option<Vec<u8>> {
    // A used buffer, as the verifier's workers reuse theirs.
    let mut out = vec![0xa5; 300];
    let opened = open_into(&Zeroizing::new(*key), nonce, aad, body, &mut out);
    match opened {
        Ok(()) => Some(out),
        Err(_) => {
            assert!(out.is_empty(), "a refused body leaves nothing behind");
            None
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Sealed texts of every length around the block boundaries open to themselves, as
    /// the AEAD opens them; any one byte changed (header, text or tag), a wrong key, a
    /// wrong nonce, or a body cut short is refused by both.
    #[test]
    fn one_call_open_is_the_aead(
        key in any::<[u8; 32]>(),
        nonce in any::<[u8; 24]>(),
        aad in proptest::collection::vec(any::<u8>(), 0..140),
        text in proptest::collection::vec(any::<u8>(), 0..700),
        at in any::<usize>(),
        bit in 0u8..8,
        cut in 0usize..20,
    ) {
        let body = seal(&key, &nonce, &aad, &text);
        prop_assert_eq!(one_call(&key, &nonce, &aad, &body), Some(text.clone()));

        let mut bad = body.clone();
        let i = at % bad.len();
        bad[i] ^= 1 << bit;
        prop_assert_eq!(aead_open(&key, &nonce, &aad, &bad), None);
        prop_assert_eq!(one_call(&key, &nonce, &aad, &bad), None);

        if !aad.is_empty() {
            let mut bad_aad = aad.clone();
            let j = at % bad_aad.len();
            bad_aad[j] ^= 1 << bit;
            prop_assert_eq!(one_call(&key, &nonce, &bad_aad, &body), None);
        }
        let mut other_key = key;
        other_key[at % 32] ^= 1 << bit;
        prop_assert_eq!(one_call(&other_key, &nonce, &aad, &body), None);
        let mut other_nonce = nonce;
        other_nonce[at % 24] ^= 1 << bit;
        prop_assert_eq!(one_call(&key, &other_nonce, &aad, &body), None);

        let short = &body[..body.len().saturating_sub(cut + 1)];
        prop_assert_eq!(one_call(&key, &nonce, &aad, short), aead_open(&key, &nonce, &aad, short));
    }

    /// Bytes nobody sealed: both refuse them alike (and neither opens them).
    #[test]
    fn unsealed_bytes_are_refused_alike(
        key in any::<[u8; 32]>(),
        nonce in any::<[u8; 24]>(),
        aad in proptest::collection::vec(any::<u8>(), 0..64),
        body in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        prop_assert_eq!(one_call(&key, &nonce, &aad, &body), aead_open(&key, &nonce, &aad, &body));
    }
}

/// RFC draft-irtf-cfrg-xchacha-03, A.3.1: the AEAD_XChaCha20_Poly1305 test vector.
#[test]
fn opens_the_draft_test_vector() {
    let hex = |s: &str| hex::decode(s.split_whitespace().collect::<String>()).expect("hex");
    let text = hex(
        "4c616469657320616e642047656e746c656d656e206f662074686520636c6173\
        73206f66202739393a204966204920636f756c64206f6666657220796f75206f\
        6e6c79206f6e652074697020666f7220746865206675747572652c2073756e73\
        637265656e20776f756c642062652069742e",
    );
    let aad = hex("50515253c0c1c2c3c4c5c6c7");
    let key: [u8; 32] = hex("808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f")
        .try_into()
        .expect("32");
    let nonce: [u8; 24] = hex("404142434445464748494a4b4c4d4e4f5051525354555657")
        .try_into()
        .expect("24");
    let mut body = hex(
        "bd6d179d3e83d43b9576579493c0e939572a1700252bfaccbed2902c21396cbb\
        731c7f1b0b4aa6440bf3a82f4eda7e39ae64c6708c54c216cb96b72e1213b452\
        2f8c9ba40db5d945b11b69b982c1bb9e3f3fac2bc369488f76b2383565d3fff9\
        21f9664c97637da9768812f615c68b13b52e",
    );
    body.extend(hex("c0875924c1c7987947deafd8780acf49"));
    assert_eq!(one_call(&key, &nonce, &aad, &body), Some(text));
}
