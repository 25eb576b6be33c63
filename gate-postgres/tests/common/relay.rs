//! A TCP relay between a gate and its PostgreSQL (the cluster's Unix socket) that can
//! lose one answer: armed, it passes the group commit's next `COMMIT` (a simple query
//! on a connection whose `application_name` ends `-group`) to the server, holds every
//! answer after it, and once the server has answered that `COMMIT` (the tag proves
//! what became of the transaction) closes both sides, the gate's unanswered. Or, armed
//! to lose the `COMMIT` itself, closes both sides instead of passing it on (the server
//! rolls the transaction back). Faults no test can cause otherwise: a server killed
//! between its commit and its reply cannot be timed without sleeping.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::SeqCst};
use std::sync::{mpsc, Arc};

/// The relay, listening on 127.0.0.1:`port`.
pub struct Relay {
    pub port: u16,
    armed: Arc<AtomicU8>,
    /// The tag the server answered each cut `COMMIT` with (`COMMIT`, or `ROLLBACK`), or
    /// `unsent` for a `COMMIT` never passed on.
    pub cut: mpsc::Receiver<String>,
}

impl Relay {
    /// A relay to the server listening on the Unix socket `socket`.
    pub fn start(socket: PathBuf) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        let armed = Arc::new(AtomicU8::new(NONE));
        let (tx, cut) = mpsc::channel();
        let a = Arc::clone(&armed);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = UnixStream::connect(&socket) else {
                    continue;
                };
                let (armed, tx) = (Arc::clone(&a), tx.clone());
                std::thread::spawn(move || pair(client, server, &armed, tx));
            }
        });
        Relay { port, armed, cut }
    }

    /// The next group commit's `COMMIT` loses its answer.
    pub fn arm(&self) {
        self.armed.store(ANSWER, SeqCst);
    }

    /// The next group commit's `COMMIT` never reaches the server.
    pub fn arm_unsent(&self) {
        self.armed.store(UNSENT, SeqCst);
    }
}

/// Nothing armed; a `COMMIT`'s answer to lose; a `COMMIT` not to pass on.
const NONE: u8 = 0;
const ANSWER: u8 = 1;
const UNSENT: u8 = 2;

/// One connection relayed both ways.
fn pair(client: TcpStream, server: UnixStream, armed: &AtomicU8, tx: mpsc::Sender<String>) {
    let hold = Arc::new(AtomicBool::new(false));
    let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let (h, t) = (Arc::clone(&hold), tx.clone());
    std::thread::spawn(move || answers(s, c, &h, &t));
    requests(client, server, armed, &hold, &tx);
}

/// One protocol message, its header included (`typed`: a type byte first; the startup
/// message has none).
fn message(r: &mut impl Read, typed: bool) -> Option<Vec<u8>> {
    let mut m = vec![0u8; if typed { 5 } else { 4 }];
    r.read_exact(&mut m).ok()?;
    let at = m.len() - 4;
    let len = u32::from_be_bytes(m[at..].try_into().ok()?) as usize;
    let mut body = vec![0u8; len.checked_sub(4)?];
    r.read_exact(&mut body).ok()?;
    m.extend(body);
    Some(m)
}

/// The gate's messages to the server; an armed group `COMMIT` holds the answers, or is
/// not passed on.
fn requests(
    mut client: TcpStream,
    mut server: UnixStream,
    armed: &AtomicU8,
    hold: &AtomicBool,
    tx: &mpsc::Sender<String>,
) {
    let Some(startup) = message(&mut client, false) else {
        return;
    };
    let group = startup.windows(7).any(|w| w == b"-group\0");
    if server.write_all(&startup).is_err() {
        return;
    }
    while let Some(m) = message(&mut client, true) {
        if group && m[0] == b'Q' && &m[5..] == b"COMMIT\0" {
            match armed.swap(NONE, SeqCst) {
                ANSWER => hold.store(true, SeqCst),
                UNSENT => {
                    let _ = client.shutdown(Shutdown::Both);
                    let _ = server.shutdown(Shutdown::Both);
                    let _ = tx.send("unsent".into());
                    return;
                }
                _ => {}
            }
        }
        if server.write_all(&m).is_err() {
            return;
        }
    }
    let _ = server.shutdown(Shutdown::Write);
}

/// The server's answers to the gate, until held: then read until the `COMMIT` is
/// answered, and both sides closed.
fn answers(
    mut server: UnixStream,
    mut client: TcpStream,
    hold: &AtomicBool,
    tx: &mpsc::Sender<String>,
) {
    while let Some(m) = message(&mut server, true) {
        if !hold.load(SeqCst) {
            if client.write_all(&m).is_err() {
                return;
            }
            continue;
        }
        let body = m.get(5..m.len().saturating_sub(1)).unwrap_or_default();
        let tag = String::from_utf8_lossy(body).into_owned();
        if m[0] == b'C' && (tag == "COMMIT" || tag == "ROLLBACK") {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
            let _ = tx.send(tag);
            return;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
}
