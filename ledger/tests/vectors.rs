//! The test vectors of docs/FORMAT.md, rebuilt from their inputs byte for byte.

use tally_ledger::format::{entry_hash, ChainRule, Checkpoint, Entry, LedgerId};
use tally_ledger::keys::{verify_checkpoint, verify_signature, AuditorKey, EpochSecrets};
use tally_ledger::Decision;

pub struct Vectors {
    pub auditor_public: [u8; 32],
    pub ephemeral_public: [u8; 32],
    pub verifying_key: [u8; 32],
    pub genesis: Vec<u8>,
    pub decision: Vec<u8>,
    pub checkpoint: String,
}

const ID: LedgerId = LedgerId([0xaa; 16]);
const WALL: u64 = 1_700_000_000_000;
const PLAINTEXT: &str = r#"{"run":"r1","kind":"start","goal":"demo"}"#;

pub fn build() -> Vectors {
    let auditor = AuditorKey::from_bytes([0x11; 32]);
    let ephemeral_public = AuditorKey::from_bytes([0x22; 32]).public();
    let data = auditor.epoch_key(&ephemeral_public, ID, 0).unwrap();
    let signer = EpochSecrets::from_bytes(0, [0x33; 32], [0; 32]);
    let vk = signer.verifying_key();

    let genesis = signer.genesis_entry(ID, WALL, &auditor.public(), &ephemeral_public);

    let mut nonce = [0x44u8; 24];
    nonce[16..].copy_from_slice(&1u64.to_be_bytes());
    let decision = data.decision_entry(
        ID,
        1,
        0,
        WALL + 1,
        entry_hash(&genesis),
        nonce,
        PLAINTEXT.as_bytes(),
    );

    let head = entry_hash(&decision);
    let cp = signer.sign_checkpoint(ID, 2, head, WALL + 2);
    Vectors {
        auditor_public: auditor.public(),
        ephemeral_public,
        verifying_key: vk,
        genesis,
        decision,
        checkpoint: cp.to_text(),
    }
}

// The values in docs/FORMAT.md. If one changes, the format changed: bump the version.
const AUDITOR_PUBLIC: &str = "7b4e909bbe7ffe44c465a220037d608ee35897d31ef972f07f74892cb0f73f13";
const EPHEMERAL_PUBLIC: &str = "0faa684ed28867b97f4a6a2dee5df8ce974e76b7018e3f22a1c4cf2678570f20";
const VERIFYING_KEY: &str = "17cb79fb2b4120f2b1ec65e4198d6e08b28e813feb01e4a400839b85e18080ce";
const GENESIS: &str = "0100aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa0000000000000000000000000000018bcfe568000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000a017cb79fb2b4120f2b1ec65e4198d6e08b28e813feb01e4a400839b85e18080ce7b4e909bbe7ffe44c465a220037d608ee35897d31ef972f07f74892cb0f73f130faa684ed28867b97f4a6a2dee5df8ce974e76b7018e3f22a1c4cf2678570f2077068b6222ee14145fac1c45a2a2736f48cc77a0532686c4eb87e5a16408bfa65c3ca24f6a134c4ecfec6ad5916246cf61e2cb75c561eca2ede2f0be20ceb601";
const GENESIS_HASH: &str = "81e0d145711058e2374928091852b8a544723d60ee572b554be51ea929164644";
/// The same genesis under the rule of `tally export v1` (keyed BLAKE3 over its bytes).
const GENESIS_HASH_V1: &str = "d068fd911e6f4effbdfeb3e4f4cafcc0dd92513deaf9ef7c9d328cfeaf5f9666";
const DECISION: &str = "0101aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa0000000000000001000000000000018bcfe5680181e0d145711058e2374928091852b8a544723d60ee572b554be51ea9291646444444444444444444444444444444444400000000000000010000003964e0cb47955bc0ed4ba1fa48232e3e96282b69ff482cdf47a298587675eb382a1b84f403cdf39b4b4a40ecb73f1444c4488361d570e56a525e";
const DECISION_HASH: &str = "07fe0ae072d933f488a97a7cb8301b262c340161009dd4cecd4ce58908efddbd";
const CHECKPOINT: &str = concat!(
    "tally checkpoint v1\n",
    "ledger aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
    "size 2\n",
    "head 07fe0ae072d933f488a97a7cb8301b262c340161009dd4cecd4ce58908efddbd\n",
    "epoch 0\n",
    "time 1700000000002\n",
    "\n",
    "— a45d0e72 e53a92622869a35eb9a0ac7d6c37b1068dbcb8f552c8d085554e29fee3219ff23ceb99df92fed3b53d5295a0cfce34035c74a8692254f956a7743f10957acc0d\n",
);

/// Not a check: prints the values for docs/FORMAT.md after a deliberate format change.
/// `cargo test -p tally-ledger --test tests print_vectors -- --ignored --nocapture`
#[test]
#[ignore = "generator, not a check"]
fn print_vectors() {
    let v = build();
    println!("AUDITOR_PUBLIC {}", hex::encode(v.auditor_public));
    println!("EPHEMERAL_PUBLIC {}", hex::encode(v.ephemeral_public));
    println!("VERIFYING_KEY {}", hex::encode(v.verifying_key));
    println!("GENESIS {}", hex::encode(&v.genesis));
    println!("GENESIS_HASH {}", entry_hash(&v.genesis));
    println!("DECISION {}", hex::encode(&v.decision));
    println!("DECISION_HASH {}", entry_hash(&v.decision));
    println!("CHECKPOINT\n{}", v.checkpoint);
}

#[test]
fn vectors_match_docs() {
    let v = build();
    assert_eq!(hex::encode(v.auditor_public), AUDITOR_PUBLIC);
    assert_eq!(hex::encode(v.ephemeral_public), EPHEMERAL_PUBLIC);
    assert_eq!(hex::encode(v.verifying_key), VERIFYING_KEY);
    assert_eq!(hex::encode(&v.genesis), GENESIS);
    assert_eq!(entry_hash(&v.genesis).to_string(), GENESIS_HASH);
    assert_eq!(
        ChainRule::LeafHash.hash(&v.genesis).to_string(),
        GENESIS_HASH
    );
    assert_eq!(
        ChainRule::EntryBytes.hash(&v.genesis).to_string(),
        GENESIS_HASH_V1
    );
    assert_eq!(hex::encode(&v.decision), DECISION);
    assert_eq!(entry_hash(&v.decision).to_string(), DECISION_HASH);
    assert_eq!(v.checkpoint, CHECKPOINT);
}

#[test]
fn vectors_decode_verify_and_decrypt() {
    let genesis = hex::decode(GENESIS).unwrap();
    let g = Entry::decode(&genesis).unwrap();
    let body = g.genesis().unwrap();
    verify_signature(
        &body.verifying_key,
        &g.signed_message(),
        &body.signature,
        "genesis",
    )
    .unwrap();

    let decision = hex::decode(DECISION).unwrap();
    let d = Entry::decode(&decision).unwrap();
    assert_eq!(d.header.prev_hash, g.hash());
    let auditor = AuditorKey::from_bytes([0x11; 32]);
    let key = auditor
        .epoch_key(&body.ephemeral, d.header.ledger_id, 0)
        .unwrap();
    let plain = key
        .open(&d.header.nonce, d.header_bytes(), d.body())
        .unwrap();
    assert_eq!(plain, PLAINTEXT.as_bytes());
    assert_eq!(
        Decision::from_stored(&plain).unwrap().goal.as_deref(),
        Some("demo")
    );

    let cp = Checkpoint::from_text(CHECKPOINT.as_bytes()).unwrap();
    assert_eq!(cp.head, d.hash());
    verify_checkpoint(&cp, &body.verifying_key).unwrap();
    assert_eq!(
        cp.to_text(),
        CHECKPOINT,
        "checkpoint text round-trips exactly"
    );
}

/// The argument digest vectors of docs/FORMAT.md ("Argument digest"), read from the
/// document itself: input, canonical JSON, BLAKE3.
fn argument_vectors() -> Vec<[String; 3]> {
    let doc = include_str!("../../docs/FORMAT.md");
    let table = doc
        .split_once("| `args` as sent | canonical JSON | BLAKE3 |\n|---|---|---|\n")
        .expect("the argument digest table")
        .1;
    table
        .lines()
        .take_while(|l| l.starts_with('|'))
        .map(|row| {
            let cells: Vec<String> = row
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().trim_matches('`').to_string())
                .collect();
            [cells[0].clone(), cells[1].clone(), cells[2].clone()]
        })
        .collect()
}

#[test]
fn argument_digest_vectors_match_docs() {
    let vectors = argument_vectors();
    assert!(vectors.len() >= 7, "{vectors:?}");
    for [input, canonical, digest] in &vectors {
        let args = tally_ledger::decision::Args::parse(input).unwrap();
        assert_eq!(args.canonical(), canonical, "{input}");
        let want = blake3::hash(canonical.as_bytes()).to_hex().to_string();
        assert_eq!(&want, digest, "BLAKE3 of {canonical}");
        assert_eq!(args.digest(), want);
        // The same arguments inside a decision: the digest it is stored with.
        let mut d = Decision::from_json(&format!(
            r#"{{"run":"r","kind":"allow","tool":"t","args":{input}}}"#
        ))
        .unwrap();
        d.seal_args();
        assert_eq!(d.args_digest.as_deref(), Some(digest.as_str()));
    }
}

// docs/FORMAT.md, "Log segments": the headers of the vector ledger's first two segments,
// a state frame, and the whole of a segment 0 holding genesis and decision in one group.
const SEGMENT0_HEADER: &str = "74616c6c79207365676d656e7420330aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000";
const SEGMENT1_HEADER: &str = "74616c6c79207365676d656e7420330aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa0000000000000001000000000000000207fe0ae072d933f488a97a7cb8301b262c340161009dd4cecd4ce58908efddbd";
const STATE_FRAME: &str = "030000000d00000004632f72310000000101";
const SEGMENT0_LEN: usize = 833;
const SEGMENT0_BLAKE3: &str = "7567785ee473ef178f802efaf152a4d02fc8b6354e97da52d3d8e6dffb7e4489";

/// Segment 0 of the vector ledger: header, genesis, decision, a state frame
/// (`c/r1` = 01), and the checkpoint of size 2, as one group.
fn segment0(v: &Vectors) -> Vec<u8> {
    use tally_ledger::segment::{
        encode_state, push_frame, SegmentHeader, TAG_CHECKPOINT, TAG_ENTRY, TAG_STATE,
    };
    let mut out = SegmentHeader {
        ledger_id: ID,
        number: 0,
        first_seq: 0,
        prev_hash: tally_ledger::Hash::default(),
    }
    .encode()
    .to_vec();
    push_frame(&mut out, TAG_ENTRY, &v.genesis);
    push_frame(&mut out, TAG_ENTRY, &v.decision);
    push_frame(
        &mut out,
        TAG_STATE,
        &encode_state([(&b"c/r1"[..], &[1u8][..])]),
    );
    push_frame(&mut out, TAG_CHECKPOINT, v.checkpoint.as_bytes());
    out
}

#[test]
fn segment_vectors_match_docs() {
    use tally_ledger::segment::{SegmentHeader, StateFrame, StateValue};
    let v = build();
    let h0 = SegmentHeader {
        ledger_id: ID,
        number: 0,
        first_seq: 0,
        prev_hash: tally_ledger::Hash::default(),
    };
    assert_eq!(hex::encode(h0.encode()), SEGMENT0_HEADER);
    let h1 = SegmentHeader {
        ledger_id: ID,
        number: 1,
        first_seq: 2,
        prev_hash: entry_hash(&v.decision),
    };
    assert_eq!(hex::encode(h1.encode()), SEGMENT1_HEADER);
    assert_eq!(
        SegmentHeader::decode(&hex::decode(SEGMENT1_HEADER).unwrap()).unwrap(),
        h1
    );
    let state = hex::decode(STATE_FRAME).unwrap();
    assert_eq!(
        StateFrame::decode(state[0], &state[5..]).unwrap().pairs,
        [(b"c/r1".to_vec(), StateValue::Full(vec![1u8]))]
    );
    // Strict: a pair cut short, or no pair at all.
    assert!(StateFrame::decode(state[0], &state[5..state.len() - 1]).is_err());
    assert!(StateFrame::decode(state[0], &[]).is_err());
    let seg = segment0(&v);
    assert_eq!(seg.len(), SEGMENT0_LEN);
    assert_eq!(blake3::hash(&seg).to_hex().as_str(), SEGMENT0_BLAKE3);
    assert_eq!(
        &seg[seg.len() - CHECKPOINT.len() - 5 - state.len()..][..state.len()],
        &state[..]
    );
}

/// The previous value of `r/r1` in the delta frame vector.
const DELTA_BASE: &[u8] = b"\x01run r1: attempts 0007, recent 11 12 13 14 15 16 17";
/// Its next value, which the vector frame holds as a delta.
const DELTA_VALUE: &[u8] = b"\x01run r1: attempts 0008, recent 12 13 14 15 16 17 18";
const DELTA_FRAME: &str =
    "040000002883b91a160004632f72310001010004722f72310133120f3300021638330009300060203137203138";

#[test]
fn delta_state_frame_vector_matches_docs() {
    use tally_ledger::segment::{push_frame, StateFrame, StateValue, TAG_STATE_DELTA};
    let pairs = [(&b"c/r1"[..], &[1u8][..]), (&b"r/r1"[..], DELTA_VALUE)];
    let mut frame = Vec::new();
    push_frame(
        &mut frame,
        TAG_STATE_DELTA,
        &StateFrame::encode(&pairs, |k| (k == b"r/r1").then_some(DELTA_BASE)),
    );
    // What this build writes (another LZ4 encoder may choose other matches: the decoding
    // below is the format; this only says the vector came from the real encoder).
    assert_eq!(hex::encode(&frame), DELTA_FRAME);
    let vector = hex::decode(DELTA_FRAME).unwrap();
    let decoded = StateFrame::decode(vector[0], &vector[5..]).unwrap();
    assert_eq!(
        decoded.pairs[0],
        (b"c/r1".to_vec(), StateValue::Full(vec![1]))
    );
    assert!(matches!(decoded.pairs[1].1, StateValue::Delta { .. }));
    let base = |k: &[u8]| (k == b"r/r1").then_some(DELTA_BASE);
    assert_eq!(
        decoded.clone().resolve(base).unwrap(),
        [
            (b"c/r1".to_vec(), vec![1u8]),
            (b"r/r1".to_vec(), DELTA_VALUE.to_vec())
        ]
    );
    // A delta needs its previous value, and only that one decodes (one that differs
    // where the delta refers to it gives values the check refuses).
    assert!(decoded.clone().resolve(|_| None).is_err());
    let other: &[u8] = b"\x01run r2: attempts 0007, recent 11 12 13 14 15 16 17";
    assert!(decoded.resolve(|_| Some(other)).is_err());
    // Strict: cut short, an unknown kind, keys out of order or repeated, no pair, a
    // length not in its shortest form, a key prefix not the whole common prefix.
    let p = &vector[5..];
    for cut in 0..p.len() {
        let ok = StateFrame::decode(TAG_STATE_DELTA, &p[..cut])
            .and_then(|f| f.resolve(base))
            .is_ok();
        assert!(!ok, "a frame cut at {cut} of {} bytes", p.len());
    }
    let mut bad = p.to_vec();
    bad[10] = 2; // c/r1's kind
    assert!(StateFrame::decode(TAG_STATE_DELTA, &bad).is_err());
    let swapped = [pairs[1], pairs[0]];
    assert!(StateFrame::decode(TAG_STATE_DELTA, &StateFrame::encode(&swapped, |_| None)).is_err());
    let twice = [pairs[0], pairs[0]];
    assert!(StateFrame::decode(TAG_STATE_DELTA, &StateFrame::encode(&twice, |_| None)).is_err());
    // check ‖ shared 0 ‖ suffix_len 4 as `84 00` ‖ ...: the long form of 4.
    let mut long = p[..5].to_vec();
    long.extend_from_slice(&[0x84, 0x00]);
    long.extend_from_slice(&p[6..]);
    assert!(StateFrame::decode(TAG_STATE_DELTA, &long).is_err());
    // `c/r1` then `c/r2` sharing 2 bytes where they share 3.
    let mut short_prefix = StateFrame::encode(&[(&b"c/r1"[..], &[1u8][..])], |_| None);
    short_prefix.extend_from_slice(&[2, 2, b'r', b'2', 0, 1, 1]);
    assert!(StateFrame::decode(TAG_STATE_DELTA, &short_prefix).is_err());
    let mut right_prefix = StateFrame::encode(&[(&b"c/r1"[..], &[1u8][..])], |_| None);
    right_prefix.extend_from_slice(&[3, 1, b'2', 0, 1, 1]);
    assert!(StateFrame::decode(TAG_STATE_DELTA, &right_prefix).is_ok());
    assert!(StateFrame::decode(TAG_STATE_DELTA, &p[..4]).is_err());
}

/// The C2SP vectors of docs/FORMAT.md ("Merkle tree and C2SP checkpoints"), rebuilt from
/// the entries above: each must appear there verbatim.
fn tlog_vectors() -> Vec<(&'static str, String)> {
    use tally_ledger::export::SignedEnd;
    use tally_ledger::tlog::merkle::{leaf_hash, node_hash};
    use tally_ledger::tlog::note::{b64, cosign, Note, Vkey, TYPE_COSIGNATURE};
    use tally_ledger::tlog::proof::TlogProof;
    use tally_ledger::tlog::LogKey;
    let genesis = hex::decode(GENESIS).unwrap();
    let decision = hex::decode(DECISION).unwrap();
    let (l0, l1) = (leaf_hash(&genesis), leaf_hash(&decision));
    let root = node_hash(&l0, &l1);
    let key = LogKey::from_seed(ID, [0x55; 32]);
    let note = key.sign(2, root);
    let witness = ed25519_dalek::SigningKey::from_bytes(&[0x66; 32]);
    let wvkey = Vkey::new(
        "example.org/w1",
        TYPE_COSIGNATURE,
        witness.verifying_key().to_bytes(),
    )
    .unwrap();
    let mut cosigned = note.clone();
    cosigned.sigs.push(cosign(
        &witness,
        "example.org/w1",
        1_700_000_000,
        &note.text,
    ));
    let proof = TlogProof {
        extra: Some([decision.clone(), genesis.clone()].concat()),
        index: 1,
        proof: vec![l0],
        checkpoint: Note::clone(&cosigned),
    };
    let end = key.sign_raw(&SignedEnd::message(ID, 2, 1, &root));
    vec![
        ("leaf 0", hex::encode(l0)),
        ("leaf 1", hex::encode(l1)),
        ("root", b64(&root)),
        ("log vkey", key.vkey().to_text()),
        ("witness vkey", wvkey.to_text()),
        ("cosigned checkpoint", cosigned.to_text()),
        ("tlog-proof", proof.to_text()),
        ("signed end signature", hex::encode(end)),
    ]
}

#[test]
#[ignore = "prints the C2SP vectors for docs/FORMAT.md"]
fn print_tlog_vectors() {
    for (name, v) in tlog_vectors() {
        println!("== {name}\n{v}");
    }
}

#[test]
fn tlog_vectors_match_docs() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/FORMAT.md")).unwrap();
    for (name, v) in tlog_vectors() {
        assert!(
            doc.contains(v.trim_end()),
            "docs/FORMAT.md lacks the {name} vector:\n{v}"
        );
    }
}

/// The rows of the two-column table of docs/FORMAT.md under `header` (its header line
/// and rule): each decision as sent and as stored, backticks off.
fn sent_and_stored(header: &str) -> Vec<[String; 2]> {
    let doc = include_str!("../../docs/FORMAT.md");
    let table = doc
        .split_once(&format!("{header}\n|---|---|\n"))
        .unwrap_or_else(|| panic!("no table `{header}` in docs/FORMAT.md"))
        .1;
    table
        .lines()
        .take_while(|l| l.starts_with('|'))
        .map(|row| {
            let cells: Vec<String> = row
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().trim_matches('`').to_string())
                .collect();
            [cells[0].clone(), cells[1].clone()]
        })
        .collect()
}

/// `sent` appended as the second decision of run `r1` (after its start, so the ledger
/// links it at seq 1): its stored bytes, as the auditor reads them back.
fn stored_after_a_start(sent: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let (l, auditor) = crate::store::new_ledger(&dir.path().join("l"), Default::default());
    l.append(Decision::from_json(r#"{"run":"r1","kind":"start"}"#).unwrap())
        .unwrap();
    l.append(Decision::from_json(sent).unwrap()).unwrap();
    let back = crate::store::read_back(&l, &auditor);
    String::from_utf8(back.last().unwrap().to_canonical_json()).unwrap()
}

/// docs/FORMAT.md, "Trace ids": each decision as sent, and its stored bytes once the
/// ledger has linked it to the run's start at seq 1 (`prev_seq` stays the last field).
#[test]
fn trace_id_vectors_match_docs() {
    let rows =
        sent_and_stored("| decision as sent | stored (canonical, as the ledger writes it) |");
    assert!(!rows.is_empty());
    for [sent, stored] in &rows {
        assert_eq!(stored_after_a_start(sent), *stored);
        assert_eq!(
            Decision::from_stored(stored.as_bytes())
                .unwrap()
                .trace_id
                .as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
    }
}

/// docs/FORMAT.md, "Proxied calls": each decision as sent and its stored bytes; `false`
/// and the field on another kind are refused.
#[test]
fn proxied_vectors_match_docs() {
    let rows = sent_and_stored(
        "| proxied decision as sent | stored (canonical, as the ledger writes it) |",
    );
    assert_eq!(rows.len(), 2);
    for [sent, stored] in &rows {
        assert_eq!(stored_after_a_start(sent), *stored);
        assert_eq!(
            Decision::from_stored(stored.as_bytes()).unwrap().proxied,
            Some(true)
        );
    }
    for bad in [
        r#"{"run":"r1","kind":"allow","tool":"t","proxied":false}"#,
        r#"{"run":"r1","kind":"refund","of":1,"proxied":true}"#,
        r#"{"run":"r1","kind":"start","proxied":true}"#,
    ] {
        let d = Decision::from_json(bad).expect("parses");
        let err = d.validate().expect_err(bad).to_string();
        assert!(err.contains("proxied"), "{bad}: {err}");
    }
}

/// docs/FORMAT.md, "Overruns, refused usage and the operator's settlement": each outcome as sent and its
/// stored bytes; the forms the section refuses are refused, naming the field.
#[test]
fn settlement_vectors_match_docs() {
    let rows =
        sent_and_stored("| settlement as sent | stored (canonical, as the ledger writes it) |");
    assert_eq!(rows.len(), 3);
    for [sent, stored] in &rows {
        assert_eq!(stored_after_a_start(sent), *stored);
        let d = Decision::from_stored(stored.as_bytes()).unwrap();
        assert!(
            d.overrun_nanos == Some(500)
                || d.operator == Some(true)
                || d.usage_refused == Some(tally_ledger::UsageRefused::Implausible),
            "{stored}"
        );
    }
    for (bad, field) in [
        (
            r#"{"run":"r1","kind":"outcome","attempt":1,"status":"ok","overrun_nanos":0}"#,
            "overrun_nanos",
        ),
        (
            r#"{"run":"r1","kind":"allow","tool":"t","overrun_nanos":5}"#,
            "overrun_nanos",
        ),
        (
            r#"{"run":"r1","kind":"outcome","attempt":1,"status":"ok","settled_nanos":1,"operator":false}"#,
            "operator",
        ),
        (
            r#"{"run":"r1","kind":"outcome","attempt":1,"status":"unknown","operator":true}"#,
            "operator",
        ),
        (
            r#"{"run":"r1","kind":"outcome","attempt":1,"status":"ok","settled_nanos":1,"operator":true,"proxied":true}"#,
            "operator",
        ),
        (
            r#"{"run":"r1","kind":"stop","reason":"completed","operator":true}"#,
            "operator",
        ),
        (
            r#"{"run":"r1","kind":"outcome","attempt":1,"status":"ok","proxied":true,"usage_refused":"unpriced"}"#,
            "usage_refused",
        ),
        (
            r#"{"run":"r1","kind":"outcome","attempt":1,"status":"error","usage_refused":"implausible"}"#,
            "usage_refused",
        ),
    ] {
        let d = Decision::from_json(bad).expect("parses");
        let err = d.validate().expect_err(bad).to_string();
        assert!(err.contains(field), "{bad}: {err}");
    }
}

/// docs/FORMAT.md, "Usage: what the upstream reported": each outcome as sent and its
/// stored bytes (the counts in their one order); the forms the section refuses are
/// refused, naming `usage`.
#[test]
fn usage_vectors_match_docs() {
    let rows = sent_and_stored("| usage as sent | stored (canonical, as the ledger writes it) |");
    assert_eq!(rows.len(), 3);
    for [sent, stored] in &rows {
        assert_eq!(stored_after_a_start(sent), *stored);
        let d = Decision::from_stored(stored.as_bytes()).unwrap();
        assert!(d.usage.is_some_and(|u| !u.is_empty()), "{stored}");
    }
    for bad in [
        r#"{"run":"r1","kind":"outcome","attempt":1,"status":"ok","proxied":true,"usage":{"input_tokens":0}}"#,
        r#"{"run":"r1","kind":"outcome","attempt":1,"status":"ok","proxied":true,"usage":{}}"#,
        r#"{"run":"r1","kind":"outcome","attempt":1,"status":"ok","usage":{"input_tokens":1}}"#,
        r#"{"run":"r1","kind":"allow","tool":"t","proxied":true,"usage":{"input_tokens":1}}"#,
    ] {
        let d = Decision::from_json(bad).expect("parses");
        let err = d.validate().expect_err(bad).to_string();
        assert!(err.contains("usage"), "{bad}: {err}");
    }
    for unparsed in [
        r#"{"run":"r1","kind":"outcome","attempt":1,"status":"ok","proxied":true,"usage":{"input_tokens":1,"input_tokens":2}}"#,
        r#"{"run":"r1","kind":"outcome","attempt":1,"status":"ok","proxied":true,"usage":{"tokens":1}}"#,
        r#"{"run":"r1","kind":"outcome","attempt":1,"status":"ok","proxied":true,"usage":{"input_tokens":-1}}"#,
        r#"{"run":"r1","kind":"outcome","attempt":1,"status":"ok","proxied":true,"usage":{"input_tokens":1.5}}"#,
    ] {
        assert!(Decision::from_json(unparsed).is_err(), "{unparsed}");
    }
}

/// docs/FORMAT.md, "Approval requests": a `require_approval` deny with its request, as
/// sent and stored; the request on another reason or kind, or with a malformed id, is
/// refused.
#[test]
fn approval_request_vectors_match_docs() {
    let rows = sent_and_stored(
        "| approval request as sent | stored (canonical, as the ledger writes it) |",
    );
    assert_eq!(rows.len(), 1);
    for [sent, stored] in &rows {
        assert_eq!(stored_after_a_start(sent), *stored);
        let back = Decision::from_stored(stored.as_bytes()).unwrap();
        assert_eq!(back.request.unwrap().id, "779e96cd51871b36");
    }
    let request =
        r#"{"id":"779e96cd51871b36","cause":"attempts_exhausted","cost":{"attempts":1},"calls":1}"#;
    for bad in [
        format!(r#"{{"run":"r1","kind":"deny","tool":"t","reason":"attempts_exhausted","request":{request}}}"#),
        format!(r#"{{"run":"r1","kind":"allow","tool":"t","request":{request}}}"#),
        r#"{"run":"r1","kind":"deny","tool":"t","reason":"approval_required","request":{"id":"XYZ","cause":"attempts_exhausted","cost":{},"calls":1}}"#.to_owned(),
    ] {
        let d = Decision::from_json(&bad).expect("parses");
        let err = d.validate().expect_err(&bad).to_string();
        assert!(err.contains("request"), "{bad}: {err}");
    }
}

/// docs/FORMAT.md, "Denials": a denial (an override with reason `denied_by_approver`
/// naming the denied call), as sent and stored; a malformed argument digest is refused.
#[test]
fn denial_vectors_match_docs() {
    let rows = sent_and_stored("| denial as sent | stored (canonical, as the ledger writes it) |");
    assert_eq!(rows.len(), 1);
    for [sent, stored] in &rows {
        assert_eq!(stored_after_a_start(sent), *stored);
        let d = Decision::from_stored(stored.as_bytes()).unwrap();
        assert_eq!(d.reason, Some(tally_ledger::Reason::DeniedByApprover));
        assert_eq!(d.answers.as_deref(), Some("779e96cd51871b36"));
        assert_eq!(d.tool.as_deref(), Some("email.send"));
    }
    let bad = r#"{"run":"r1","kind":"override","reason":"denied_by_approver","tool":"t","args_digest":"NOT-HEX"}"#;
    let err = Decision::from_json(bad)
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("args_digest"), "{err}");
}

/// docs/FORMAT.md, "Continuation grants": an override whose scope names the new run, as
/// sent and stored (`new_run` after the scope's other fields).
#[test]
fn continuation_grant_vectors_match_docs() {
    let rows = sent_and_stored("| grant as sent | stored (canonical, as the ledger writes it) |");
    assert_eq!(rows.len(), 1);
    for [sent, stored] in &rows {
        assert_eq!(stored_after_a_start(sent), *stored);
        let d = Decision::from_stored(stored.as_bytes()).unwrap();
        assert_eq!(d.scope.and_then(|s| s.new_run).as_deref(), Some("r2"));
    }
}
