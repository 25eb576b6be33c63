//! Export framing (`ExportReader`, what `tally verify FILE.tally` reads from an untrusted
//! file): never panics, always ends (one error at most, then nothing), allocates no more
//! than a frame's bound, and reports offsets inside the file. A file it reads to the end
//! marker without error is in the one encoding the writer makes: writing its frames again
//! with `ExportWriter` gives back exactly the input bytes.
#![no_main]
use tally_ledger::export::{ExportError, ExportReader, ExportWriter};
use tally_ledger::format::MAX_FRAME_LEN;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(mut reader) = ExportReader::new(data) else {
        return;
    };
    let mut frames = Vec::new();
    let mut failed = None;
    for frame in reader.by_ref() {
        match frame {
            Ok(f) => frames.push(f),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    // After its end marker or its first error, the reader yields nothing more.
    assert!(reader.next().is_none());
    let len = data.len() as u64;
    match failed {
        Some(e) => {
            let at = match e {
                ExportError::Torn { offset, missing } => {
                    assert!(missing > 0);
                    offset
                }
                ExportError::CutClean { offset } => {
                    assert_eq!(offset, len);
                    offset
                }
                ExportError::BadTag { offset, .. }
                | ExportError::FrameTooLarge { offset, .. }
                | ExportError::CountMismatch { offset, .. }
                | ExportError::TrailingBytes { offset } => offset,
                ExportError::BadMagic | ExportError::Io { .. } => {
                    panic!("reading a slice after the magic: {e:?}")
                }
                _ => 0,
            };
            assert!(at <= len, "{e:?} past the end of a {len}-byte file");
        }
        None => {
            let mut w = ExportWriter::new(Vec::new()).expect("writing to a Vec");
            for f in &frames {
                let payload = match f {
                    tally_ledger::Frame::Entry(b)
                    | tally_ledger::Frame::Checkpoint(b)
                    | tally_ledger::Frame::Cosigned(b) => b,
                };
                assert!(payload.len() <= MAX_FRAME_LEN);
                w.frame(f).expect("writing to a Vec");
            }
            match reader.signed_end() {
                // A signed end cannot be made again without the log key: the frames
                // before it must be the input's, and the end its last 117 bytes.
                Some(end) => {
                    let mut out = w.finish().expect("writing to a Vec");
                    out.truncate(out.len() - 21);
                    assert_eq!(&data[..out.len()], &out[..]);
                    assert_eq!(data.len(), out.len() + 5 + 112);
                    assert_eq!(&data[out.len() + 5 + 16..out.len() + 5 + 48], &end.root[..]);
                }
                None => assert_eq!(w.finish().expect("writing to a Vec"), data),
            }
        }
    }
});
