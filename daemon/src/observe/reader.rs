//! Where the operator's views read the gate's runs and breakers. The embedded store
//! answers from memory on the caller's worker. A networked backend that reads them
//! apart from the decisions (`Gatekeeper::overview_apart`: PostgreSQL, on a connection
//! of its own) is called on this thread of its own, never on the decision thread, so a
//! snapshot that waits on the database delays no check. Bounded: at most [`QUEUE`]
//! reads wait for it; one more is refused as unavailable at once.

use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;

use tally_gate::{GateError, Gatekeeper, Standing};
use tokio::sync::oneshot;

/// The runs and breakers, as the views read them.
pub(crate) type Read = (Vec<Standing>, Vec<(String, tally_policy::Breaker)>);

/// Reads that may wait for the view thread.
pub(crate) const QUEUE: usize = 16;

type Job = Box<dyn FnOnce() + Send>;

/// The view thread (started only for a backend that reads apart).
pub(crate) struct Reader {
    jobs: Option<SyncSender<Job>>,
}

impl Reader {
    /// Start the thread if `gate` reads its overview apart from the decisions.
    pub fn start(gate: &Arc<dyn Gatekeeper>) -> std::io::Result<Reader> {
        if !gate.overview_apart() {
            return Ok(Reader { jobs: None });
        }
        let (jobs, queue) = sync_channel::<Job>(QUEUE);
        std::thread::Builder::new()
            .name("tally-view".into())
            .spawn(move || {
                while let Ok(job) = queue.recv() {
                    job();
                }
            })?;
        Ok(Reader { jobs: Some(jobs) })
    }

    /// The runs and breakers of `gate`.
    pub async fn read(&self, gate: &Arc<dyn Gatekeeper>) -> Result<Read, GateError> {
        let Some(jobs) = &self.jobs else {
            // Memory and a lock: answered here.
            return gate.overview();
        };
        let (tx, rx) = oneshot::channel();
        let g = Arc::clone(gate);
        let job: Job = Box::new(move || {
            let _ = tx.send(g.overview());
        });
        match jobs.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(GateError::Unavailable(format!(
                "{QUEUE} reads of the operator's view are waiting for the database already; retry"
            )))
            }
            Err(TrySendError::Disconnected(_)) => {
                return Err(GateError::Unavailable(
                    "the operator's view thread has stopped".into(),
                ))
            }
        }
        rx.await.unwrap_or_else(|_| {
            Err(GateError::Unavailable(
                "the operator's view dropped a read".into(),
            ))
        })
    }
}
