//! What `tally-load bench` is asked to do: where to connect, how many clients, what each
//! iteration sends, and at what pace.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tally_api::client::{Client, ClientError};

use crate::args::Args;

#[derive(Clone)]
pub(crate) enum Target {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl Target {
    pub(crate) async fn connect(&self) -> Result<Client, ClientError> {
        match self {
            Target::Unix(p) => Client::unix(p).await,
            Target::Tcp(a) => Client::tcp(*a).await,
        }
    }
}

pub(crate) struct Plan {
    pub(crate) target: Target,
    pub(crate) clients: usize,
    pub(crate) batch: usize,
    pub(crate) duration: Duration,
    pub(crate) offered: Option<f64>,
    /// Open loop with due times from a pacer thread (`--even`).
    pub(crate) even: bool,
    pub(crate) mode: Mode,
    /// With `--check`: every this many calls (0: none) names the tool `ask.me`, which a
    /// policy blocking it refuses `require_approval` (an approval request, no outcome).
    pub(crate) ask_every: u64,
    /// With `--check`: where each client's run is started (`--start-on`, client `id`
    /// through `start_on[id % len]`); empty: through the bench's own target. A fleet
    /// bench uses it to decide runs on daemons other than the one that started them.
    pub(crate) start_on: Vec<Target>,
}

impl Plan {
    /// Whether call number `n` is one the gate is to refuse with a request.
    pub(crate) fn asks(&self, n: u64) -> bool {
        self.ask_every > 0 && n % self.ask_every == self.ask_every - 1
    }
}

/// What one iteration sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// One allow decision appended (`POST /v1/decisions`).
    Append,
    /// A call through the gate: `POST /v1/check`, then `POST /v1/outcome` (agent socket).
    Check,
    /// The same two decisions appended raw, one request each (operator socket).
    Pairs,
}

impl Plan {
    /// The plan `bench`'s flags give; a combination it cannot run is refused.
    pub(crate) fn from_args(args: &mut Args) -> Result<Plan, String> {
        let target = match (args.value("socket")?, args.value("tcp")?) {
            (Some(s), None) => Target::Unix(s),
            (None, Some(a)) => Target::Tcp(a),
            _ => return Err("give one of --socket PATH or --tcp ADDR".into()),
        };
        let clients: usize = args.value("clients")?.unwrap_or(1);
        let batch: usize = args.value("batch")?.unwrap_or(1);
        if clients == 0 || batch == 0 {
            return Err("--clients and --batch are at least 1".into());
        }
        let seconds: f64 = args.value("seconds")?.unwrap_or(5.0);
        let duration = Duration::try_from_secs_f64(seconds)
            .map_err(|_| format!("--seconds: {seconds} is not a duration"))?;
        let offered: Option<f64> = args.value("offered")?;
        if let Some(rate) = offered {
            // Each connection needs at least a microsecond between its due times.
            let interval = Duration::try_from_secs_f64(batch as f64 / rate).ok();
            if interval.is_none_or(|i| i < Duration::from_micros(1)) {
                return Err(format!(
                    "--offered: `{rate}` is not a rate this tool can pace: give decisions/s above zero, at most a million requests/s"
                ));
            }
        }
        let even = args.take("even").is_some();
        let mode = match (args.take("check").is_some(), args.take("pairs").is_some()) {
            (true, true) => return Err("give one of --check and --pairs".into()),
            (true, false) => Mode::Check,
            (false, true) => Mode::Pairs,
            (false, false) => Mode::Append,
        };
        if mode != Mode::Append && (batch != 1 || offered.is_some()) {
            return Err(
                "--check and --pairs run a closed loop of single calls: no --batch, no --offered"
                    .into(),
            );
        }
        let ask_every: u64 = args.value("ask-every")?.unwrap_or(0);
        if ask_every > 0 && mode != Mode::Check {
            return Err("--ask-every mixes refusals into --check: give --check too".into());
        }
        let start_on: Vec<Target> = match args.take("start-on").flatten() {
            None => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|p| Target::Unix(PathBuf::from(p)))
                .collect(),
        };
        if !start_on.is_empty() && mode != Mode::Check {
            return Err("--start-on starts the runs of --check: give --check too".into());
        }
        if even && offered.is_none() {
            return Err("--even paces an open loop: give --offered too".into());
        }
        Ok(Plan {
            target,
            clients,
            batch,
            duration,
            offered,
            even,
            mode,
            ask_every,
            start_on,
        })
    }
}
