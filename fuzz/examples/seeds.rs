//! Writes seed inputs for every fuzz target from real data: the frames of an export that
//! `tally demo` made, the decisions of the differential corpus (`corpus/*.ndjson`), and
//! the policies of the corpus, docs/GATE.md and the default policy printed in full.
//!
//! ```text
//! cargo run -q -p tally-cli -- demo --dir /tmp/demo          # at the repository root
//! cd fuzz && cargo run --release --example seeds -- /tmp/demo/ledger.tally /tmp/seeds
//! ```
//!
//! Then `cargo fuzz cmin` each target with its seed folder (fuzz/README.md).

use std::fs;
use std::path::{Path, PathBuf};

use tally_ledger::export::{ExportReader, ExportWriter};
use tally_ledger::{Decision, Frame};
use tally_policy::Policy;

/// Seeds larger than this are not written: libFuzzer's inputs stay small and fast.
const MAX_SEED: usize = 16 * 1024;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [export, out] = &args[..] else {
        eprintln!("usage: seeds EXPORT.tally OUT_DIR");
        std::process::exit(2);
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = PathBuf::from(out);
    let put = |target: &str, name: String, bytes: &[u8]| {
        if bytes.len() > MAX_SEED {
            return;
        }
        let dir = out.join(target);
        fs::create_dir_all(&dir).expect("seed dir");
        fs::write(dir.join(name), bytes).expect("seed file");
    };

    // Entries and checkpoints: every frame of a real export.
    let file = fs::File::open(export).expect("open export");
    let frames: Vec<Frame> = ExportReader::new(file)
        .expect("export magic")
        .map(|f| f.expect("a valid export"))
        .collect();
    for (i, f) in frames.iter().enumerate() {
        match f {
            Frame::Entry(b) => put("entry", format!("frame-{i:04}"), b),
            Frame::Checkpoint(b) => put("checkpoint", format!("frame-{i:04}"), b),
            Frame::Cosigned(b) => put("note", format!("frame-{i:04}"), b),
        }
    }
    // Exports: every prefix of the real one that ends at a checkpoint, with its end
    // marker, while small; and the same prefixes cut (no end marker) and torn.
    let mut exports = 0;
    for (i, f) in frames.iter().enumerate() {
        if !matches!(f, Frame::Checkpoint(_)) {
            continue;
        }
        let mut w = ExportWriter::new(Vec::new()).expect("vec");
        for f in &frames[..=i] {
            w.frame(f).expect("vec");
        }
        let whole = w.finish().expect("vec");
        if whole.len() > MAX_SEED || exports == 12 {
            break;
        }
        exports += 1;
        put("export", format!("prefix-{i:04}"), &whole);
        put("export", format!("cut-{i:04}"), &whole[..whole.len() - 21]);
        put("export", format!("torn-{i:04}"), &whole[..whole.len() - 30]);
    }

    // Decisions: every corpus line that is one valid decision, as agents send it
    // (decision_json) and as it is stored (decision: canonical JSON, args sealed).
    let mut policies = vec![
        ("default-full".to_owned(), Policy::default().to_toml()),
        ("empty".to_owned(), String::new()),
        ("gate-md".to_owned(), toml_block(&root.join("docs/GATE.md"))),
        (
            "replay".to_owned(),
            "[ceiling]\nattempts = 2\n[approvals]\nask_on = []\n".to_owned(),
        ),
        (
            "credentials".to_owned(),
            concat!(
                "[scope]\ntools = [\"http\", \"maps.*\"]\ntargets = [\"*.example.com\"]\n",
                "[credentials.team-a]\nspend_cents_per_period = 5000\nperiod_ms = 3600000\n",
                "uids = [1000, 1001]\n[credentials.team-a.ceiling]\nattempts = 10\n",
                "[credentials.\"quoted key\"]\nceiling = { spend_cents = 7 }\n",
            )
            .to_owned(),
        ),
    ];
    let mut names: Vec<PathBuf> = fs::read_dir(root.join("corpus"))
        .expect("corpus dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "ndjson"))
        .collect();
    names.sort();
    for path in names {
        let stem = path.file_stem().expect("name").to_string_lossy().into_owned();
        let text = fs::read_to_string(&path).expect("corpus file");
        for (n, line) in text.lines().enumerate() {
            let value: serde_json::Value = serde_json::from_str(line).expect("json line");
            if let Some(p) = value.get("policy").and_then(|p| p.as_str()) {
                policies.push((stem.clone(), p.to_owned()));
                continue;
            }
            let Ok(mut d) = Decision::from_json(line) else {
                continue;
            };
            if d.validate().is_err() {
                continue;
            }
            put("decision_json", format!("{stem}-{n:02}"), line.as_bytes());
            d.seal_args();
            put("decision", format!("{stem}-{n:02}"), &d.to_canonical_json());
        }
    }
    for (name, text) in policies {
        Policy::from_toml(&text).unwrap_or_else(|e| panic!("seed policy {name}: {e}"));
        put("policy", name, text.as_bytes());
    }
}

/// The first ```toml block of a Markdown file.
fn toml_block(path: &Path) -> String {
    let text = fs::read_to_string(path).expect("markdown file");
    let start = text.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let len = text[start..].find("```").expect("block end");
    text[start..start + len].to_owned()
}
