//! A TCP forwarder that counts the connections it accepts, put between the gateway and
//! a server behind it: how many connections the gateway opened to the server. While
//! holding, it holds back the end of each chunked answer (`0\r\n\r\n`) until the test
//! releases it: a body the gateway's client let go of before its end is then not read
//! to it by chance, whatever the timing.

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
                pipe(&client, &server, None);
                pipe(&server, &client, Some(Arc::clone(&holds)));
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
/// answer's end held back while `held` is on.
fn pipe(from: &TcpStream, to: &TcpStream, held: Option<Arc<Held>>) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            let data = &buf[..n];
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
            if sent.is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
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
