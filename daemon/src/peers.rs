//! Per-peer connection limits, and a write deadline on every connection: so that one
//! client (one uid) cannot hold the connections every other client needs.
//!
//! A peer is what the kernel says about the connection ([`Peer`]): the Unix socket
//! peer's uid from `SO_PEERCRED`, or "loopback TCP" as one class. A peer may hold at most
//! `per_peer` connections at once; the daemon answers one more with `429
//! too_many_connections` and closes it. A connection whose client stops reading its
//! responses is closed once a write has made no progress for the write timeout.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::limit::Peer;

/// Open connections per peer, each bounded by the same cap.
pub(crate) struct PeerConnections {
    per_peer: usize,
    open: Mutex<HashMap<Peer, usize>>,
}

/// One connection counted against its peer; gives its place back when dropped.
pub(crate) struct PeerSlot {
    peers: Arc<PeerConnections>,
    peer: Peer,
}

impl PeerConnections {
    pub fn new(per_peer: usize) -> Arc<PeerConnections> {
        Arc::new(PeerConnections {
            per_peer: per_peer.max(1),
            open: Mutex::new(HashMap::new()),
        })
    }

    /// The most connections one peer may hold.
    pub fn per_peer(&self) -> usize {
        self.per_peer
    }

    /// A place for one more connection of `peer`, or `None` if it holds its cap already.
    pub fn try_open(self: &Arc<Self>, peer: Peer) -> Option<PeerSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(peer).or_insert(0);
        if *count >= self.per_peer {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            peers: Arc::clone(self),
            peer,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

/// A connection whose writes must make progress: a write (or flush) that stays blocked
/// for `limit`, because the client stopped reading, fails with `TimedOut`, which ends
/// the connection. Progress of any size resets the clock, so a slow reader is not cut
/// off; reads pass through untouched (hyper's header read timeout bounds those).
pub(crate) struct WriteDeadline<I> {
    io: I,
    limit: Duration,
    blocked: Option<Pin<Box<Sleep>>>,
}

impl<I> WriteDeadline<I> {
    pub fn new(io: I, limit: Duration) -> WriteDeadline<I> {
        WriteDeadline {
            io,
            limit,
            blocked: None,
        }
    }

    /// Start (or keep) the clock while the write side is blocked; fail once it runs out.
    fn blocked<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let clock = self
            .blocked
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match clock.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client read none of its responses for {} (the write timeout)",
                    tally_ledger::words::duration(limit.as_millis() as u64)
                ),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progressed<T>(
        &mut self,
        result: Poll<io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<T>> {
        match result {
            Poll::Ready(r) => {
                self.blocked = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.blocked(cx),
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for WriteDeadline<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let result = Pin::new(&mut this.io).poll_write(cx, buf);
        this.progressed(result, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let result = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.progressed(result, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Pending => this.blocked(cx),
            // A flush that returns at once says nothing about whether the client reads.
            ready => ready,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.io).poll_shutdown(cx) {
            Poll::Pending => this.blocked(cx),
            ready => ready,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gets_its_cap_and_its_places_back() {
        let peers = PeerConnections::new(2);
        let a = peers.try_open(Peer::Uid(7)).expect("first");
        let _b = peers.try_open(Peer::Uid(7)).expect("second");
        assert!(peers.try_open(Peer::Uid(7)).is_none(), "third over the cap");
        assert!(
            peers.try_open(Peer::Uid(8)).is_some(),
            "another uid is not affected"
        );
        drop(a);
        assert!(
            peers.try_open(Peer::Uid(7)).is_some(),
            "a closed one frees a place"
        );
    }
}
