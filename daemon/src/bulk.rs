//! The threads that parse big request bodies.
//!
//! Bodies over 32 KiB are parsed off the async workers, by a few threads of the daemon's
//! own that run ten nice steps below the rest of it. With NDJSON batches the ledger's
//! commit stage is the serial part (every decision passes through its one thread) while
//! parsing spreads over threads, so when the cores are short the committer should run
//! first: on two cores, 64 clients sending batches of 100 gained 6 % on average, side by
//! side (docs/PERFORMANCE.md). A thread may lower its own priority without privileges;
//! raising the committer's would need `CAP_SYS_NICE`. The threads are the daemon's own,
//! not tokio's blocking pool, so a lowered thread never runs anything else.

use std::panic::AssertUnwindSafe;
use std::sync::{mpsc, Arc, Mutex};

use tokio::sync::oneshot;

/// How many nice steps below the daemon the parse threads run.
const LOWER_BY: i32 = 10;

type Job = Box<dyn FnOnce() + Send>;

/// A fixed set of parse threads fed from one queue. Dropping it lets them finish what
/// they hold and exit.
pub(crate) struct BulkParsers {
    jobs: mpsc::Sender<Job>,
}

impl BulkParsers {
    /// Start `threads` parse threads (`tally-parse-N`).
    pub fn start(threads: usize) -> std::io::Result<BulkParsers> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..threads.max(1) {
            let queue = Arc::clone(&queue);
            std::thread::Builder::new()
                .name(format!("tally-parse-{i}"))
                .spawn(move || {
                    lower_priority();
                    loop {
                        // The lock is held only while waiting for the next job.
                        let job = match queue.lock().unwrap_or_else(|e| e.into_inner()).recv() {
                            Ok(job) => job,
                            Err(_) => return,
                        };
                        // A panicking job drops its answer (the request gets an internal
                        // error); the thread stays.
                        let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                    }
                })?;
        }
        Ok(BulkParsers { jobs })
    }

    /// Run `work` on a parse thread. It runs to its end even if the returned receiver is
    /// dropped (the client hung up), so whatever it owns, such as the request's permits,
    /// is held until then; the receiver answers with an error if `work` panicked.
    pub fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> oneshot::Receiver<T> {
        let (answer, receiver) = oneshot::channel();
        // The threads live as long as the sender; a failed send drops the job, and with
        // it the answer, which the receiver reports.
        let _ = self.jobs.send(Box::new(move || {
            let _ = answer.send(work());
        }));
        receiver
    }
}

/// Lower the calling thread's priority by [`LOWER_BY`] nice steps (to at most 19). On
/// Linux the nice value is per thread and `None` names the calling thread; elsewhere it
/// would name the whole process, so there this does nothing. Best effort: where the call
/// is refused, the thread keeps its priority.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    if let Ok(nice) = rustix::process::getpriority_process(None) {
        let _ = rustix::process::setpriority_process(None, (nice + LOWER_BY).min(19));
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use rustix::process::{getpriority_process, setpriority_process};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    fn nice() -> i32 {
        getpriority_process(None).expect("getpriority")
    }

    /// Parse threads run ten steps below the thread that started them (relative, not an
    /// absolute nice 10), and no other thread is lowered.
    #[test]
    fn parse_threads_run_ten_steps_below_the_daemon() {
        std::thread::spawn(|| {
            // Three steps down first where there is room, so an absolute nice 10 would
            // show; lowering needs no privilege wherever the tests run.
            let base = if nice() <= 6 { nice() + 3 } else { nice() };
            setpriority_process(None, base).expect("lower own priority");
            if base == 19 {
                eprintln!("skipped: the tests already run at nice 19");
                return;
            }
            let parsers = BulkParsers::start(2).expect("start");
            let inside = parsers.run(|| {
                let name = std::thread::current().name().map(str::to_string);
                (nice(), name)
            });
            let (inside, name) = inside.blocking_recv().expect("answer");
            assert_eq!(inside, (base + LOWER_BY).min(19));
            assert!(name.is_some_and(|n| n.starts_with("tally-parse-")));
            assert_eq!(nice(), base, "the starting thread keeps its priority");
        })
        .join()
        .expect("test thread");
    }

    /// A job whose receiver is gone still runs to its end (it holds the request's
    /// permits), and a panicking job answers with an error without killing its thread.
    #[test]
    fn jobs_run_to_the_end_and_survive_panics() {
        let parsers = BulkParsers::start(1).expect("start");
        let finished = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&finished);
        drop(parsers.run(move || {
            std::thread::sleep(Duration::from_millis(50));
            flag.store(true, Ordering::SeqCst);
        }));
        let panicked = parsers.run(|| -> u32 { panic!("a bug in a parse") });
        assert!(panicked.blocking_recv().is_err());
        assert!(
            finished.load(Ordering::SeqCst),
            "the abandoned job ran first, to its end"
        );
        assert_eq!(parsers.run(|| 7).blocking_recv().expect("thread alive"), 7);
    }
}
