//! A real terminal for `tally top`: a tmux server of the test's own (its socket in the
//! test's directory), sessions started at a given size, panes read until they show what
//! the test waits for.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A tmux server on a socket of its own.
pub struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    /// The server whose socket is `dir/tmux.sock` (started by the first session).
    pub fn new(dir: &Path) -> Tmux {
        Tmux {
            socket: dir.join("tmux.sock"),
        }
    }

    /// `tmux ARGS` on this server.
    pub fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux")
    }

    /// A detached session `name` of `columns` x 40 running `command`.
    pub fn start(&self, name: &str, columns: u16, command: &str) {
        let columns = columns.to_string();
        let o = self.run(&[
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            &columns,
            "-y",
            "40",
            command,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }

    /// Type `keys` into session `name`.
    pub fn keys(&self, name: &str, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", name];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    /// Session `name`'s screen once `want` holds of it (20 s at most).
    pub fn pane(&self, name: &str, want: &dyn Fn(&str) -> bool) -> String {
        let started = Instant::now();
        loop {
            let o = self.run(&["capture-pane", "-p", "-t", name]);
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            if want(&text) {
                return text;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "tally top never showed it:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
