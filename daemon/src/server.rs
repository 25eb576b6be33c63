//! Listeners, connections and the shutdown sequence.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tally_wire::ErrorCode;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tally_proxy::accept::Accept;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::error::{ApiError, DaemonError};
use crate::limit::Peer;
use crate::peers::{PeerConnections, WriteDeadline};

/// The Unix socket this daemon created, removed again on shutdown only if it is still
/// the same file.
pub(crate) struct Socket {
    pub listener: UnixListener,
    path: PathBuf,
    dev_ino: (u64, u64),
}

impl Socket {
    /// Bind `path` with `mode` (and group `gid`) applied before any client can connect:
    /// the socket is bound inside a private (0700) directory beside `path`, so no other
    /// user can reach it while its mode is still the umask's, then its mode is set and it
    /// is renamed into place.
    pub fn bind(path: &Path, mode: u32, gid: Option<u32>) -> Result<Socket, DaemonError> {
        use std::os::unix::fs::DirBuilderExt;
        clear_stale(path)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "tally.sock".into());
        let private = path.with_file_name(format!(".{name}.{}.d", std::process::id()));
        let _ = std::fs::remove_dir_all(&private);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&private)
            // Name the socket asked for, not the private directory beside it.
            .map_err(|e| DaemonError::io(path, e))?;
        let tmp = private.join(&name);
        let listener = match UnixListener::bind(&tmp) {
            Ok(l) => l,
            Err(source) => {
                let _ = std::fs::remove_dir_all(&private);
                return Err(DaemonError::Bind {
                    addr: path.display().to_string(),
                    error: source,
                });
            }
        };
        let placed = (|| {
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
            if gid.is_some() {
                std::os::unix::fs::chown(&tmp, None, gid)?;
            }
            std::fs::rename(&tmp, path)?;
            std::fs::symlink_metadata(path)
        })();
        let _ = std::fs::remove_dir_all(&private);
        match placed {
            Ok(meta) => Ok(Socket {
                listener,
                path: path.to_path_buf(),
                dev_ino: (meta.dev(), meta.ino()),
            }),
            Err(e) => Err(DaemonError::io(path, e)),
        }
    }

    /// The listener, and the file to remove once done with it.
    pub fn split(self) -> (UnixListener, Placed) {
        (
            self.listener,
            Placed {
                path: self.path,
                dev_ino: self.dev_ino,
            },
        )
    }

    /// Stop listening and remove the socket file if it is still ours.
    pub fn close(self) {
        drop(self.listener);
        if let Ok(meta) = std::fs::symlink_metadata(&self.path) {
            if (meta.dev(), meta.ino()) == self.dev_ino {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// A socket file this daemon placed.
pub(crate) struct Placed {
    path: PathBuf,
    dev_ino: (u64, u64),
}

impl Placed {
    /// Remove it if it is still ours.
    pub fn remove(self) {
        if let Ok(meta) = std::fs::symlink_metadata(&self.path) {
            if (meta.dev(), meta.ino()) == self.dev_ino {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// Refuse a socket path whose directory is missing, before anything is started or
/// written (the gate records its policy when it opens).
pub(crate) fn check_socket_dir(path: &Path) -> Result<(), DaemonError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(DaemonError::SocketDirMissing {
            dir: dir.to_path_buf(),
            socket: path.to_path_buf(),
        }),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            Err(DaemonError::SocketDirMissing {
                dir: dir.to_path_buf(),
                socket: path.to_path_buf(),
            })
        }
        Err(e) => Err(DaemonError::io(dir, e)),
    }
}

/// Remove a socket file left by a daemon that died; refuse a live socket or a non-socket.
fn clear_stale(path: &Path) -> Result<(), DaemonError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(DaemonError::io(path, e)),
    };
    if !meta.file_type().is_socket() {
        return Err(DaemonError::SocketPathTaken {
            path: path.to_path_buf(),
        });
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(DaemonError::SocketInUse {
            path: path.to_path_buf(),
        }),
        Err(_) => match std::fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(DaemonError::io(path, e)),
        },
    }
}

/// Bind the optional TCP listener; loopback only.
pub(crate) async fn bind_tcp(addr: Option<SocketAddr>) -> Result<Option<TcpListener>, DaemonError> {
    let Some(addr) = addr else { return Ok(None) };
    if !addr.ip().is_loopback() {
        return Err(DaemonError::NotLoopback { addr });
    }
    TcpListener::bind(addr)
        .await
        .map(Some)
        .map_err(|error| DaemonError::Bind {
            addr: addr.to_string(),
            error,
        })
}

/// How many connections, from whom, and how long each may stall.
pub(crate) struct ConnectionLimits {
    /// Open connections in all.
    pub max_connections: usize,
    /// Open connections of one peer (one uid; loopback TCP is one peer).
    pub per_peer: usize,
    /// Headers must arrive within it; idle keep-alive connections close after it.
    pub read_timeout: Duration,
    /// A write blocked this long (the client reads nothing) ends the connection.
    pub write_timeout: Duration,
}

/// Connections over their peer's cap being told so at once; more are just closed.
const MAX_REFUSING: usize = 32;

/// Accept connections until `shutdown` resolves, then stop accepting and let every open
/// connection finish the request it is in (idle keep-alive connections close at once).
pub(crate) async fn accept_loop(
    socket: &Socket,
    tcp: &Option<TcpListener>,
    router: Router,
    operator: Option<(&Socket, Router)>,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) -> (GracefulShutdown, JoinSet<()>) {
    let graceful = GracefulShutdown::new();
    let mut tasks = JoinSet::new();
    let connections = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    // The operator socket counts apart: agents of the daemon's own uid that fill their
    // share cannot keep the operator from pausing or killing a run.
    let peers = PeerConnections::new(limits.per_peer);
    let operator_peers = PeerConnections::new(limits.per_peer);
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // Slowloris: headers must arrive within the read timeout; this also closes idle
        // keep-alive connections after that long.
        .header_read_timeout(limits.read_timeout)
        .keep_alive(true);
    // A refused connection gets one reply, and little time to send the request for it.
    let mut refuse = http1::Builder::new();
    refuse
        .timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout.min(Duration::from_secs(2)))
        .keep_alive(false);
    let edge = Edge {
        builder: &builder,
        refuse: &refuse,
        graceful: &graceful,
        refusing: &refusing,
        write_timeout: limits.write_timeout,
    };
    let operator_listener = operator.as_ref().map(|o| &o.0.listener);
    tokio::pin!(shutdown);
    loop {
        // Reap finished connection tasks so the set does not grow.
        while tasks.try_join_next().is_some() {}
        // Bounded connections: at the limit, stop accepting; the kernel's backlog queues.
        let permit = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            p = Arc::clone(&connections).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        // Not biased: a flood of connections on one socket must not starve the others.
        // A failed accept has paused already (`tally_proxy::accept`).
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = socket.listener.accept_peer() => {
                if let Ok((stream, peer)) = accepted {
                    edge.serve(&mut tasks, &router, &peers, stream, peer, permit);
                }
            },
            accepted = operator_listener.accept_peer() => {
                if let (Ok((stream, peer)), Some((_, op_router))) = (accepted, &operator) {
                    edge.serve(&mut tasks, op_router, &operator_peers, stream, peer, permit);
                }
            },
            accepted = tcp.accept_peer() => {
                if let Ok((stream, peer)) = accepted {
                    edge.serve(&mut tasks, &router, &peers, stream, peer, permit);
                }
            },
        }
    }
    (graceful, tasks)
}

/// What every accepted connection goes through: its peer's cap, then hyper.
struct Edge<'a> {
    builder: &'a http1::Builder,
    refuse: &'a http1::Builder,
    graceful: &'a GracefulShutdown,
    refusing: &'a Arc<Semaphore>,
    write_timeout: Duration,
}

impl Edge<'_> {
    /// Serve `io` if its peer is under its cap; otherwise answer its first request with
    /// 429 and close it (or, when many are being refused already, close it at once).
    fn serve<I>(
        &self,
        tasks: &mut JoinSet<()>,
        router: &Router,
        peers: &Arc<PeerConnections>,
        io: I,
        peer: Peer,
        permit: OwnedSemaphorePermit,
    ) where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let io = WriteDeadline::new(io, self.write_timeout);
        match peers.try_open(peer) {
            Some(slot) => serve_connection(
                self.builder,
                self.graceful,
                tasks,
                router,
                io,
                peer,
                (permit, slot),
            ),
            None => {
                // A refused connection does not hold one of the connections others need.
                drop(permit);
                let Ok(refusing) = Arc::clone(self.refusing).try_acquire_owned() else {
                    return;
                };
                let refusal = too_many_connections(peer, peers.per_peer());
                serve_connection(
                    self.refuse,
                    self.graceful,
                    tasks,
                    &refusal,
                    io,
                    peer,
                    refusing,
                );
            }
        }
    }
}

/// A router that answers anything with `429 too_many_connections`.
fn too_many_connections(peer: Peer, cap: usize) -> Router {
    let who = match peer {
        Peer::Uid(uid) => format!("uid {uid}"),
        Peer::Tcp => "loopback TCP clients (together one peer)".to_string(),
        _ => "clients whose uid the kernel did not report".to_string(),
    };
    let message = format!(
        "{who} already hold {cap} connections to this daemon, the most one peer may; \
         reuse keep-alive connections, close idle ones, or start the daemon with a \
         larger --max-connections-per-peer"
    );
    Router::new().fallback(move || {
        let message = message.clone();
        async move {
            let mut e = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::TooManyConnections,
                message,
            )
            .close();
            e.retry_after_secs = Some(1);
            e
        }
    })
}

pub(crate) fn serve_connection<I>(
    builder: &http1::Builder,
    graceful: &GracefulShutdown,
    tasks: &mut JoinSet<()>,
    router: &Router,
    io: I,
    peer: Peer,
    hold: impl Send + 'static,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = router
        .clone()
        .map_request(move |mut request: Request<Incoming>| {
            request.extensions_mut().insert(peer);
            request
        });
    let connection = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
    let watched = graceful.watch(connection);
    tasks.spawn(async move {
        // A connection error (client went away, header timeout) ends only that connection.
        let _ = watched.await;
        // The connection's places (global, and its peer's) are free again.
        drop(hold);
    });
}
