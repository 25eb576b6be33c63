//! The ledger as a C2SP tlog-tiles log on the operator socket, read only. The
//! tiles served rebuild the signed checkpoint's root, and `tlog_tiles` (an independent
//! implementation) proves an entry from them; the agent socket serves none of it.

use axum::http::StatusCode;
use base64::Engine as _;
use tally_ledger::tlog::merkle::{leaf_hash, range_root, TreeHash};
use tally_ledger::tlog::note::{Note, TreeHead};

use crate::common::{allow, get, Daemon};

#[tokio::test]
async fn tiles_and_entry_bundles_rebuild_the_signed_root() {
    let mut daemon = Daemon::start(|_| {}).await;
    let mut c = daemon.client().await;
    // 299 decisions + genesis: one full level-0 tile and a partial one of 44.
    for chunk in (0..299u64).collect::<Vec<_>>().chunks(100) {
        let lines: Vec<String> = chunk
            .iter()
            .map(|i| allow(&format!("raw-{}", i % 7), "w", *i))
            .collect();
        c.append_ndjson(lines.join("\n")).await.expect("append");
    }
    let reply = get(&mut c, "/v1/log/checkpoint").await;
    assert_eq!(reply.status, StatusCode::OK);
    let note = Note::parse(&reply.body).expect("a signed note");
    let head = TreeHead::parse(&note.text).expect("a checkpoint");
    assert_eq!(head.size, 300);
    let public =
        tally_ledger::LedgerPublic::read(&daemon.ledger_dir.join("ledger.pub")).expect("pub");
    public
        .log_key
        .expect("v2")
        .verify(&note)
        .expect("signed by the log key");

    let full = get(&mut c, "/v1/log/tile/0/000").await;
    assert_eq!(full.status, StatusCode::OK);
    assert_eq!(full.body.len(), 256 * 32);
    let partial = get(&mut c, "/v1/log/tile/0/001.p/44").await;
    assert_eq!(partial.body.len(), 44 * 32);
    let level1 = get(&mut c, "/v1/log/tile/1/000.p/1").await;
    assert_eq!(level1.body.len(), 32);
    let hashes: Vec<TreeHash> = full
        .body
        .chunks(32)
        .chain(partial.body.chunks(32))
        .map(|h| h.try_into().expect("32 bytes"))
        .collect();
    assert_eq!(
        range_root(&hashes),
        head.root,
        "the tiles rebuild the signed root"
    );
    assert_eq!(range_root(&hashes[..256]).as_slice(), &level1.body[..]);
    // An entry bundle holds the stored entries whose leaf hashes the tile holds.
    let bundle = get(&mut c, "/v1/log/tile/entries/001.p/44").await;
    let mut at = 0;
    let mut n = 0;
    while at < bundle.body.len() {
        let len = u16::from_be_bytes([bundle.body[at], bundle.body[at + 1]]) as usize;
        let entry = &bundle.body[at + 2..at + 2 + len];
        assert_eq!(leaf_hash(entry), hashes[256 + n]);
        at += 2 + len;
        n += 1;
    }
    assert_eq!(n, 44);
    // An independent implementation proves an entry from the tiles served.
    struct Tiles(Vec<TreeHash>);
    impl tlog_tiles::HashReader for Tiles {
        fn read_hashes(&self, idx: &[u64]) -> Result<Vec<tlog_tiles::Hash>, tlog_tiles::Error> {
            Ok(idx
                .iter()
                .map(|&i| {
                    let (l, k) = tlog_tiles::split_stored_hash_index(i);
                    let lo = (k << l) as usize;
                    tlog_tiles::Hash(range_root(&self.0[lo..lo + (1 << l)]))
                })
                .collect())
        }
    }
    let r = Tiles(hashes.clone());
    let proof = tlog_tiles::prove_record(300, 123, &r).expect("prove");
    tlog_tiles::check_record(
        &proof,
        300,
        tlog_tiles::Hash(head.root),
        123,
        tlog_tiles::Hash(hashes[123]),
    )
    .expect("their check of our tree");
    let b64 = base64::engine::general_purpose::STANDARD.encode(head.root);
    assert!(note.text.contains(&b64));
    // Tiles the tree does not have, paths in a second encoding, and the agent socket: 404.
    for path in [
        "/v1/log/tile/0/001",
        "/v1/log/tile/0/1",
        "/v1/log/tile/0/x000/000",
        "/v1/log/tile/0/001.p/45",
        "/v1/log/tile/entries/002",
    ] {
        assert_eq!(
            get(&mut c, path).await.status,
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
    let mut agent = daemon.agent().await;
    assert_eq!(
        get(&mut agent, "/v1/log/checkpoint").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&mut agent, "/v1/log/tile/0/000").await.status,
        StatusCode::NOT_FOUND
    );
    daemon.shutdown().await.expect("clean shutdown");
}
