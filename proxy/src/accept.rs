//! Accepting connections, once for every listener of tally: the agent and operator
//! sockets, the proxy's, the metrics listener and the witness. Each accepted stream
//! comes with its [`Peer`] as the kernel reports it; an accept that fails (out of file
//! descriptors, a connection reset before it was accepted) is not fatal and pauses
//! [`BACKOFF`] so the loop does not spin.

use std::future::Future;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// Who a connection comes from, as the kernel says: the Unix socket peer's uid
/// (`SO_PEERCRED`), or loopback TCP (one class: a loopback client's address is its own
/// choice).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Peer {
    /// A Unix socket peer's uid.
    Uid(u32),
    /// Any loopback TCP client.
    Tcp,
    /// A Unix socket peer whose credentials could not be read.
    Unknown,
}

/// The pause after a failed accept.
pub const BACKOFF: Duration = Duration::from_millis(20);

/// A listener whose connections come with their peer.
pub trait Accept {
    /// A connection.
    type Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;

    /// The next connection and its peer; an error after [`BACKOFF`] has passed.
    fn accept_peer(&self) -> impl Future<Output = std::io::Result<(Self::Stream, Peer)>> + Send;
}

impl Accept for TcpListener {
    type Stream = TcpStream;

    /// Every loopback TCP client is one peer ([`Peer::Tcp`]): any of 127.0.0.0/8 reaches
    /// tally, so a budget per address could be multiplied. Nagle is off.
    async fn accept_peer(&self) -> std::io::Result<(TcpStream, Peer)> {
        match self.accept().await {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                Ok((stream, Peer::Tcp))
            }
            Err(e) => Err(backoff(e).await),
        }
    }
}

impl Accept for UnixListener {
    type Stream = UnixStream;

    /// The peer's uid (`SO_PEERCRED`), or [`Peer::Unknown`] if it cannot be read.
    async fn accept_peer(&self) -> std::io::Result<(UnixStream, Peer)> {
        match self.accept().await {
            Ok((stream, _)) => {
                let peer = stream
                    .peer_cred()
                    .map_or(Peer::Unknown, |c| Peer::Uid(c.uid()));
                Ok((stream, peer))
            }
            Err(e) => Err(backoff(e).await),
        }
    }
}

impl<L: Accept + Sync> Accept for &L {
    type Stream = L::Stream;

    fn accept_peer(&self) -> impl Future<Output = std::io::Result<(L::Stream, Peer)>> + Send {
        (**self).accept_peer()
    }
}

/// A listener that may be absent: accepts nothing, forever, when it is.
impl<L: Accept + Sync> Accept for Option<L> {
    type Stream = L::Stream;

    async fn accept_peer(&self) -> std::io::Result<(L::Stream, Peer)> {
        match self {
            Some(l) => l.accept_peer().await,
            None => std::future::pending().await,
        }
    }
}

async fn backoff(e: std::io::Error) -> std::io::Error {
    tokio::time::sleep(BACKOFF).await;
    e
}

/// Hand each connection of `listener` to `each` until `shutdown` resolves (checked
/// first, so a shutdown is never delayed by a flood of connections).
pub async fn until<L: Accept>(
    listener: &L,
    shutdown: impl Future<Output = ()>,
    mut each: impl FnMut(L::Stream, Peer),
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept_peer() => {
                if let Ok((stream, peer)) = accepted {
                    each(stream, peer);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_connection_comes_with_its_peer_until_shutdown() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("s.sock");
        let unix = UnixListener::bind(&path).expect("bind");
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let _a = UnixStream::connect(&path).await.expect("connect");
        let _b = TcpStream::connect(addr).await.expect("connect");
        let (_, peer) = unix.accept_peer().await.expect("unix");
        assert_eq!(peer, Peer::Uid(own_uid()));
        let (_, peer) = tcp.accept_peer().await.expect("tcp");
        assert_eq!(peer, Peer::Tcp);
        // Three connections, then a shutdown once the third was handed over: three
        // handed over, and the loop ends.
        let held: Vec<TcpStream> = vec![
            TcpStream::connect(addr).await.expect("connect"),
            TcpStream::connect(addr).await.expect("connect"),
            TcpStream::connect(addr).await.expect("connect"),
        ];
        let third = tokio::sync::Notify::new();
        let mut seen = Vec::new();
        until(&tcp, third.notified(), |_, peer| {
            seen.push(peer);
            if seen.len() == 3 {
                third.notify_one();
            }
        })
        .await;
        drop(held);
        assert_eq!(seen, vec![Peer::Tcp; 3]);
        let none: Option<TcpListener> = None;
        let waited = tokio::time::timeout(Duration::from_millis(20), none.accept_peer()).await;
        assert!(waited.is_err(), "an absent listener accepts nothing");
    }

    /// This process's own uid: the peer of a socket it connects to itself.
    fn own_uid() -> u32 {
        std::fs::metadata("/proc/self").map_or(0, |m| std::os::unix::fs::MetadataExt::uid(&m))
    }
}
