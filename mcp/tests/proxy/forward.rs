//! A TCP forwarder that counts the connections it accepts, put between the gateway and
//! a server behind it: how many connections the gateway opened to the server. While
//! holding, it holds back the end of each chunked answer (`0\r\n\r\n`) until the test
//! releases it: a body the gateway's client let go of before its end is then not read
//! to it by chance, whatever the timing. A closing forwarder plays a server that closes
//! its connection after each answer: it says so (`Connection: close`) and does.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A held end waits at most this long for its release (a failing test's bound).
const HELD_AT_MOST: Duration = Duration::from_secs(30);

/// Forwards every connection to its port on to `to` (127.0.0.1); lives as long as the
/// test process.
pub(crate) struct Forward {
    pub(crate) port: u16,
    accepted: Arc<AtomicUsize>,
    held: Arc<Held>,
}

/// Whether the connections are kept or closed after each answer.
#[derive(Clone, Copy, PartialEq)]
enum Answers {
    Kept,
    Closed,
}

/// Whether ends are held, and the releases not yet used.
#[derive(Default)]
struct Held {
    on: AtomicBool,
    releases: Mutex<usize>,
    released: Condvar,
}

impl Held {
    /// Wait for a release (bounded) and use it.
    fn wait(&self) {
        let releases = self.releases.lock().unwrap_or_else(|e| e.into_inner());
        let (mut releases, _) = self
            .released
            .wait_timeout_while(releases, HELD_AT_MOST, |r| *r == 0)
            .unwrap_or_else(|e| e.into_inner());
        *releases = releases.saturating_sub(1);
    }
}

impl Forward {
    pub(crate) fn to(to: u16) -> Forward {
        Forward::start(to, Answers::Kept)
    }

    /// A forwarder to `to` that closes each connection after its first answer's end,
    /// having said `Connection: close` in that answer's head.
    pub(crate) fn closing(to: u16) -> Forward {
        Forward::start(to, Answers::Closed)
    }

    fn start(to: u16, answers: Answers) -> Forward {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("an address").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(Held::default());
        let (counted, holds) = (Arc::clone(&accepted), Arc::clone(&held));
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                counted.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                pipe(&client, &server, None, Answers::Kept);
                pipe(&server, &client, Some(Arc::clone(&holds)), answers);
            }
        });
        Forward {
            port,
            accepted,
            held,
        }
    }

    /// The connections accepted so far.
    pub(crate) fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// From now on, each chunked answer's end waits for a [`Forward::release`].
    pub(crate) fn hold(&self) {
        self.held.on.store(true, Ordering::SeqCst);
    }

    /// One held end (the oldest waiting, or the next) passes.
    pub(crate) fn release(&self) {
        *self.held.releases.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.held.released.notify_all();
    }
}

/// Copy what `from` reads to `to` until `from` ends, then end `to`'s writing side; an
/// answer's end held back while `held` is on. [`Answers::Closed`]: the first answer's
/// head says `Connection: close`, and both ends are shut once its end is passed on.
fn pipe(from: &TcpStream, to: &TcpStream, held: Option<Arc<Held>>, answers: Answers) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut first = true;
        while let Ok(n @ 1..) = from.read(&mut buf) {
            let closing = answers == Answers::Closed;
            let said;
            let data = if closing && std::mem::take(&mut first) {
                said = saying_close(&buf[..n]);
                &said[..]
            } else {
                &buf[..n]
            };
            let ends = closing && chunked_end(data).is_some();
            let end = held
                .as_ref()
                .filter(|h| h.on.load(Ordering::SeqCst))
                .and_then(|h| chunked_end(data).map(|at| (h, at)));
            let sent = match end {
                Some((h, at)) => to
                    .write_all(&data[..at])
                    .map(|()| h.wait())
                    .and_then(|()| to.write_all(&data[at..])),
                None => to.write_all(data),
            };
            if sent.is_err() || ends {
                break;
            }
        }
        if answers == Answers::Closed {
            let _ = from.shutdown(std::net::Shutdown::Both);
            let _ = to.shutdown(std::net::Shutdown::Both);
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}

/// `data` (an answer's start) with `Connection: close` after its status line.
fn saying_close(data: &[u8]) -> Vec<u8> {
    let at = data
        .windows(2)
        .position(|w| w == b"\r\n")
        .map_or(data.len(), |at| at + 2);
    [&data[..at], b"Connection: close\r\n", &data[at..]].concat()
}

/// Where a chunked body's last chunk (`0\r\n\r\n`) starts in `data`, if it is there.
fn chunked_end(data: &[u8]) -> Option<usize> {
    const LAST: &[u8] = b"0\r\n\r\n";
    if data.starts_with(LAST) {
        return Some(0);
    }
    data.windows(LAST.len() + 2)
        .position(|w| w.starts_with(b"\r\n") && w.ends_with(LAST))
        .map(|at| at + 2)
}
