//! A Bedrock ConverseStream answer as AWS event-stream frames
//! (`application/vnd.amazon.eventstream`): each frame decoded, its prelude and message
//! CRC32s checked, by smithy-rs's decoder (`aws-smithy-eventstream`), never by hand
//! (the prelude's CRC also as soon as its 12 bytes are in, with `crc32fast`, so that a
//! flipped length is corrupt at once and never a wait); then classified strictly
//! ([`Framed`]). A frame that fails its CRC, cannot be decoded
//! or classified, or grows past the bound, is an error: the relay then cuts the stream
//! and its outcome stays unknown, its reservation held.

use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_types::event_stream::Message;
use bytes::{Bytes, BytesMut};

/// The events a ConverseStream answer sends (`:event-type`).
const EVENTS: &[&str] = &[
    "messageStart",
    "contentBlockStart",
    "contentBlockDelta",
    "contentBlockStop",
    "messageStop",
    "metadata",
];

/// A frame's prelude: its total length, its headers' length, their CRC32.
const PRELUDE: usize = 12;

/// One frame, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Framed {
    /// An event of the stream: its `:event-type` (one of ConverseStream's) and its JSON
    /// payload.
    Event {
        /// The `:event-type`.
        kind: &'static str,
        /// The payload's bytes.
        payload: Bytes,
    },
    /// An exception the upstream sent in the stream (`:message-type` `exception`, or
    /// `error`): its type or code. The answer has no usage after it.
    Exception(String),
}

/// Why a stream's frames cannot be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Not a frame: a CRC that does not match, a length that cannot be.
    #[error("an event-stream frame that cannot be decoded: {0}")]
    Corrupt(#[source] Corrupt),
    /// A frame whose headers say nothing tally reads.
    #[error("an event-stream frame tally cannot classify: {0}")]
    Unclassified(#[source] Unclassified),
    /// Bytes of one frame past the bound, not yet whole.
    #[error("an event-stream frame past {0} bytes")]
    TooLarge(usize),
}

/// Why bytes are not a frame.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Corrupt {
    /// Its prelude (total and header lengths) fails the prelude's CRC32.
    #[error("its prelude fails its CRC")]
    Prelude,
    /// smithy's decoder refused it (a message CRC, a length or a header that cannot be).
    #[error(transparent)]
    Decode(#[from] aws_smithy_eventstream::error::Error),
}

/// Why a whole frame is not one tally reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unclassified {
    /// An event whose `:event-type` ConverseStream does not send (the type it said).
    #[error("an event of type `{0}`")]
    Event(String),
    /// An event whose payload is not JSON.
    #[error("a `{0}` event whose payload is not JSON")]
    NotJson(&'static str),
    /// A frame whose `:message-type` is neither an event nor an exception (what it said).
    #[error("a frame with :message-type {0:?}")]
    MessageType(Option<String>),
}

/// A stream's frames, read chunk by chunk.
#[derive(Debug, Default)]
pub struct Frames {
    decoder: MessageFrameDecoder,
    buf: BytesMut,
    /// Whether the decoder holds a frame's prelude whose frame is not yet whole.
    started: bool,
}

impl Frames {
    /// Nothing read yet.
    pub fn new() -> Frames {
        Frames::default()
    }

    /// The frames `chunk` completes, classified; at most `bound` bytes of a frame wait
    /// for the rest of it.
    pub fn feed(&mut self, chunk: &[u8], bound: usize) -> Result<Vec<Framed>, FrameError> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        loop {
            self.check_prelude()?;
            let before = self.buf.len();
            match self.decoder.decode_frame(&mut self.buf) {
                Ok(DecodedFrame::Complete(m)) => {
                    self.started = false;
                    out.push(classify(&m)?);
                }
                Ok(DecodedFrame::Incomplete) => {
                    self.started |= self.buf.len() < before;
                    break;
                }
                Err(e) => return Err(FrameError::Corrupt(Corrupt::Decode(e))),
            }
        }
        if self.buf.len() > bound {
            return Err(FrameError::TooLarge(bound));
        }
        Ok(out)
    }

    /// A frame's prelude (its total and header lengths, then their CRC32) checked as soon
    /// as its 12 bytes are in, before the decoder takes them: a prelude that fails its CRC
    /// (a flipped length) is corrupt at once, never a wait for bytes that are not coming.
    fn check_prelude(&self) -> Result<(), FrameError> {
        if self.started || self.buf.len() < PRELUDE {
            return Ok(());
        }
        let crc = u32::from_be_bytes([self.buf[8], self.buf[9], self.buf[10], self.buf[11]]);
        if crc32fast::hash(&self.buf[..8]) != crc {
            return Err(FrameError::Corrupt(Corrupt::Prelude));
        }
        Ok(())
    }

    /// Whether a frame was begun and not finished (the stream ended inside it).
    pub fn partial(&self) -> bool {
        self.started || !self.buf.is_empty()
    }
}

/// A string header of `m`, if it has one by that name.
fn header<'m>(m: &'m Message, name: &str) -> Option<&'m str> {
    m.headers()
        .iter()
        .find(|h| h.name().as_str() == name)
        .and_then(|h| h.value().as_string().ok())
        .map(|s| s.as_str())
}

/// What a whole frame is: an event of ConverseStream's with a JSON payload, or an
/// exception; anything else is unclassified.
fn classify(m: &Message) -> Result<Framed, FrameError> {
    match header(m, ":message-type") {
        Some("event") => {
            let sent = header(m, ":event-type").unwrap_or("");
            let Some(kind) = EVENTS.iter().find(|e| **e == sent) else {
                return Err(FrameError::Unclassified(Unclassified::Event(
                    sent.to_owned(),
                )));
            };
            if header(m, ":content-type").is_some_and(|c| c != "application/json") {
                return Err(FrameError::Unclassified(Unclassified::NotJson(kind)));
            }
            Ok(Framed::Event {
                kind,
                payload: m.payload().clone(),
            })
        }
        Some("exception") => Ok(Framed::Exception(
            header(m, ":exception-type")
                .unwrap_or("exception")
                .to_owned(),
        )),
        Some("error") => Ok(Framed::Exception(
            header(m, ":error-code").unwrap_or("error").to_owned(),
        )),
        other => Err(FrameError::Unclassified(Unclassified::MessageType(
            other.map(str::to_owned),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_eventstream::frame::write_message_to;
    use aws_smithy_types::event_stream::{Header, HeaderValue};

    fn frame(kind: &str, event: &str, payload: &str) -> Vec<u8> {
        let m = Message::new(Bytes::from(payload.to_owned()))
            .add_header(Header::new(
                ":message-type",
                HeaderValue::String(kind.to_owned().into()),
            ))
            .add_header(Header::new(
                ":event-type",
                HeaderValue::String(event.to_owned().into()),
            ))
            .add_header(Header::new(
                ":content-type",
                HeaderValue::String("application/json".into()),
            ));
        let mut out = Vec::new();
        write_message_to(&m, &mut out).expect("frame");
        out
    }

    #[test]
    fn frames_are_read_across_chunks_and_classified() {
        let mut bytes = frame("event", "messageStart", r#"{"role":"assistant"}"#);
        bytes.extend(frame("event", "metadata", r#"{"usage":{}}"#));
        let mut f = Frames::new();
        let mut got = Vec::new();
        for chunk in bytes.chunks(7) {
            got.extend(f.feed(chunk, 1 << 20).expect("frames"));
        }
        assert!(!f.partial());
        assert_eq!(got.len(), 2);
        assert!(
            matches!(&got[1], Framed::Event { kind: "metadata", payload } if payload.as_ref() == br#"{"usage":{}}"#)
        );
        // Cut inside a frame.
        let mut f = Frames::new();
        f.feed(&bytes[..20], 1 << 20).expect("incomplete");
        assert!(f.partial());
    }

    #[test]
    fn a_bad_crc_or_an_unknown_frame_is_an_error() {
        let mut bytes = frame("event", "metadata", r#"{"usage":{}}"#);
        let n = bytes.len();
        bytes[n - 6] ^= 1;
        assert!(matches!(
            Frames::new().feed(&bytes, 1 << 20),
            Err(FrameError::Corrupt(_))
        ));
        let mut bytes = frame("event", "metadata", r#"{}"#);
        bytes[9] ^= 1; // the prelude's CRC
        assert!(matches!(
            Frames::new().feed(&bytes, 1 << 20),
            Err(FrameError::Corrupt(Corrupt::Prelude))
        ));
        assert!(matches!(
            Frames::new().feed(&frame("event", "surprise", "{}"), 1 << 20),
            Err(FrameError::Unclassified(Unclassified::Event(e))) if e == "surprise"
        ));
        assert!(matches!(
            Frames::new().feed(&frame("weird", "metadata", "{}"), 1 << 20),
            Err(FrameError::Unclassified(Unclassified::MessageType(Some(t)))) if t == "weird"
        ));
        assert_eq!(
            Frames::new()
                .feed(&frame("exception", "x", "{}"), 1 << 20)
                .expect("an exception"),
            vec![Framed::Exception("exception".into())]
        );
        // A prelude that announces more than the bound.
        let big = frame("event", "metadata", &"x".repeat(2000));
        assert!(matches!(
            Frames::new().feed(&big[..1500], 1000),
            Err(FrameError::TooLarge(1000))
        ));
    }

    #[test]
    fn a_flipped_length_is_corrupt_at_once_not_a_wait() {
        // The total length's low byte flipped: without its prelude CRC checked, the
        // decoder would wait for bytes the stream never sends.
        for at in [1, 3, 5, 7] {
            let mut bytes = frame("event", "metadata", r#"{"usage":{}}"#);
            bytes[at] ^= 0x10;
            let mut f = Frames::new();
            assert!(
                matches!(
                    f.feed(&bytes[..12], 1 << 20),
                    Err(FrameError::Corrupt(Corrupt::Prelude))
                ),
                "byte {at}"
            );
        }
        // A second frame's prelude, checked once the first is read.
        let mut bytes = frame("event", "messageStart", "{}");
        let n = bytes.len();
        bytes.extend(frame("event", "metadata", "{}"));
        bytes[n + 3] ^= 0x40;
        let mut f = Frames::new();
        assert!(matches!(
            f.feed(&bytes[..n + 12], 1 << 20),
            Err(FrameError::Corrupt(Corrupt::Prelude))
        ));
        // A whole prelude of a good frame waits for the rest.
        let good = frame("event", "metadata", "{}");
        assert!(Frames::new()
            .feed(&good[..12], 1 << 20)
            .expect("a prelude")
            .is_empty());
    }
}
