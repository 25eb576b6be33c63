//! A counting relay between an agent and the proxy: every byte passed on as it came,
//! and the requests counted by their request line. What the proxy answers without
//! recording (a stopped run's token) leaves nothing in the ledger; the relay still sees
//! each time the agent sent it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A relay on a loopback port of its own to `to`; its threads end with the test
/// process (each connection's when either side closes).
pub struct Relay {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
}

impl Relay {
    /// Relay to `to`, counting requests whose request line starts with `line` (such as
    /// `POST /anthropic/v1/messages`).
    pub fn start(to: SocketAddr, line: &'static str) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let addr = listener.local_addr().expect("address");
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&requests);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(to) else {
                    continue;
                };
                let counted = Arc::clone(&counted);
                let (c2, s2) = match (client.try_clone(), server.try_clone()) {
                    (Ok(c), Ok(s)) => (c, s),
                    _ => continue,
                };
                std::thread::spawn(move || pipe(client, server, Some((line, counted))));
                std::thread::spawn(move || pipe(s2, c2, None));
            }
        });
        Relay { addr, requests }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The requests counted so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Copy `from` to `to` until either ends; with `count`, count each occurrence of its
/// request line's prefix. On a kept-alive connection a request follows the last one's
/// body with no line break between, so the prefix is counted wherever it is: the tests'
/// conversations never hold its text.
fn pipe(mut from: TcpStream, mut to: TcpStream, count: Option<(&str, Arc<AtomicUsize>)>) {
    let mut buf = [0u8; 16 * 1024];
    // The stream's last bytes before this read: a request line split across two
    // reads is still seen once.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some((line, counted)) = &count {
            let needle = line.as_bytes();
            let mut seen = tail.clone();
            seen.extend_from_slice(&buf[..n]);
            let found = seen.windows(needle.len()).filter(|w| *w == needle).count();
            counted.fetch_add(found, Ordering::SeqCst);
            let keep = needle.len().saturating_sub(1).min(seen.len());
            tail = seen[seen.len() - keep..].to_vec();
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}
