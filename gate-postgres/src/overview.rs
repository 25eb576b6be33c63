//! The operator's views (the live page, `tally top`, the metrics) read apart from the
//! decisions: on a connection and a runtime of their own, without the turn a decision
//! takes, in one read-only transaction (the runs and the breakers as of one moment). A
//! slow read (a big table, a lock, a stalled server process) waits here, bounded by the
//! same bound as every round trip, and never in front of a check.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tally_gate::backend::Overview;
use tally_gate::GateError;
use tally_policy::{RunState, ToolState};
use tokio_postgres::{Client, NoTls, Statement};

use crate::schema::decode;
use crate::Rt;

/// The `application_name` of the views' connection (seen in `pg_stat_activity`),
/// appended to the gate's own.
pub const VIEW_SUFFIX: &str = "-view";

struct ReaderConn {
    client: Client,
    task: tokio::task::JoinHandle<()>,
    runs: Statement,
    breakers: Statement,
}

/// The views' connection: one read at a time.
pub(crate) struct Reader {
    config: tokio_postgres::Config,
    target: String,
    timeout: Duration,
    rt: Rt,
    conn: Mutex<Option<ReaderConn>>,
    round_trips: Arc<AtomicU64>,
}

impl Reader {
    pub fn new(
        config: &tokio_postgres::Config,
        target: &str,
        timeout: Duration,
        round_trips: Arc<AtomicU64>,
    ) -> std::io::Result<Reader> {
        let mut config = config.clone();
        let name = format!(
            "{}{VIEW_SUFFIX}",
            config.get_application_name().unwrap_or("tally")
        );
        config.application_name(&name);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(Reader {
            config,
            target: target.to_owned(),
            timeout,
            rt: Rt(Some(rt)),
            conn: Mutex::new(None),
            round_trips,
        })
    }

    fn unavailable(&self, what: &str, why: &str) -> GateError {
        GateError::Unavailable(format!(
            "PostgreSQL at {} failed {what} for the operator's view: {why} (decisions are not affected; retry)",
            self.target
        ))
    }

    /// One step, bounded by the timeout.
    fn wait<T>(
        &self,
        what: &str,
        round_trips: u64,
        fut: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, GateError> {
        self.round_trips.fetch_add(round_trips, Ordering::Relaxed);
        self.rt
            .bounded(self.timeout, fut)
            .map_err(|why| self.unavailable(what, &why))
    }

    fn connect(&self) -> Result<ReaderConn, GateError> {
        let (client, connection) = self.wait("to connect", 1, self.config.connect(NoTls))?;
        let task = self.rt.spawn(async move {
            let _ = connection.await;
        });
        let ms = self.timeout.as_millis().max(1);
        let ready = (|| {
            self.wait(
                "to set its timeouts",
                1,
                client.batch_execute(&format!(
                    "SET statement_timeout = {ms}; SET lock_timeout = {ms}; SET idle_in_transaction_session_timeout = {}",
                    ms * 5
                )),
            )?;
            let runs = self.wait(
                "to prepare a statement",
                1,
                client.prepare(
                    "SELECT state FROM tally_runs WHERE open AND state IS NOT NULL ORDER BY name",
                ),
            )?;
            let breakers = self.wait(
                "to prepare a statement",
                1,
                client.prepare("SELECT name, state FROM tally_tools ORDER BY name"),
            )?;
            Ok::<_, GateError>((runs, breakers))
        })();
        match ready {
            Ok((runs, breakers)) => Ok(ReaderConn {
                client,
                task,
                runs,
                breakers,
            }),
            Err(e) => {
                drop(client);
                task.abort();
                let _ = self.rt.block_on(task);
                Err(e)
            }
        }
    }

    fn close(&self, conn: ReaderConn) {
        let ReaderConn { client, task, .. } = conn;
        drop(client);
        task.abort();
        let _ = self.rt.block_on(task);
    }

    /// The open runs and every tool's breaker, as of one moment.
    pub fn read(&self) -> Result<Overview, GateError> {
        let mut conn = self.conn.lock().map_err(|_| {
            GateError::Unavailable("the view's connection lock was poisoned".into())
        })?;
        if conn.as_ref().is_some_and(|c| c.client.is_closed()) {
            if let Some(c) = conn.take() {
                self.close(c);
            }
        }
        if conn.is_none() {
            *conn = Some(self.connect()?);
        }
        let c = conn
            .as_ref()
            .ok_or_else(|| self.unavailable("to connect", "no connection"))?;
        let read = self.wait("to read the runs and breakers", 4, async {
            c.client
                .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                .await?;
            let runs = c.client.query(&c.runs, &[]).await?;
            let tools = c.client.query(&c.breakers, &[]).await?;
            c.client.batch_execute("COMMIT").await?;
            Ok((runs, tools))
        });
        let (runs, tools) = match read {
            Ok(r) => r,
            Err(e) => {
                // Its transaction may be open: drop the connection (the server rolls back).
                if let Some(c) = conn.take() {
                    self.close(c);
                }
                return Err(e);
            }
        };
        drop(conn);
        let mut listed = Vec::with_capacity(runs.len());
        for row in &runs {
            listed.push(decode::<RunState>("a run", row.get::<_, &[u8]>(0))?);
        }
        let mut breakers = Vec::with_capacity(tools.len());
        for row in &tools {
            let tool: ToolState = decode("a tool", row.get::<_, &[u8]>(1))?;
            breakers.push((row.get::<_, String>(0), tool.breaker));
        }
        Ok((listed, breakers))
    }
}
