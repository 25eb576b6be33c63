//! The daemon's tasks beside its sockets, each started from the options and stopped in
//! turn when the daemon stops: the model proxy, the witness pusher, the read-only view
//! on loopback TCP and the approval notifier.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::app::App;
use crate::error::DaemonError;
use crate::{observe, page, proxy_admit, server, witness, ServeOptions};

/// A task's stop signal: a receiver that resolves once the sender says stop.
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// The model proxy's listeners, on the gate's decision thread like every other gate call.
pub(crate) struct Proxies {
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
    socket: Option<server::Placed>,
}

impl Proxies {
    /// The proxy on its TCP listener and its socket, if the options serve one.
    pub(crate) fn start(
        app: &Arc<App>,
        options: &ServeOptions,
        tcp: Option<tokio::net::TcpListener>,
    ) -> Result<Proxies, DaemonError> {
        let (stop, stop_rx) = watch::channel(false);
        let mut proxies = Proxies {
            stop,
            tasks: JoinSet::new(),
            socket: None,
        };
        let Some(p) = &options.proxy else {
            return Ok(proxies);
        };
        let token_key = app
            .token_key
            .as_ref()
            .ok_or_else(|| DaemonError::Gate("the run token key is missing".into()))?;
        let urls = crate::url_files::upstream_urls(&app.gate.policy().policy)?;
        let mut proxy_options =
            tally_proxy::ProxyOptions::new(p.credentials.clone(), Arc::clone(token_key))
                .with_urls(urls);
        if let Some(t) = &app.observer.tracer {
            proxy_options = proxy_options.with_tracer(t.boxed());
        }
        if let Some(keys) = &app.keys {
            proxy_options = proxy_options.with_keys(Arc::clone(keys));
        }
        let read_timeout = if p.read_timeout.is_zero() {
            tally_proxy::DEFAULT_READ_TIMEOUT
        } else {
            p.read_timeout
        };
        let proxy = Arc::new(tally_proxy::Proxy::new(
            &app.gate.policy().policy,
            proxy_options
                .admitting(proxy_admit(p.max_connections_per_peer))
                .reading_within(read_timeout),
            Arc::clone(&app.gate),
            app.stage.submitter(),
        )?);
        if let Some(listener) = tcp {
            let serve = Arc::clone(&proxy).serve_tcp(listener, stopped(stop_rx.clone()));
            proxies.tasks.spawn(serve);
        }
        if let Some(path) = &p.socket {
            let socket = server::Socket::bind(path, options.socket_mode, options.socket_gid)?;
            let (listener, placed) = socket.split();
            let serve = Arc::clone(&proxy).serve_unix(listener, stopped(stop_rx.clone()));
            proxies.tasks.spawn(serve);
            proxies.socket = Some(placed);
        }
        Ok(proxies)
    }

    /// Stop accepting; the requests in flight finish (each bounded by its deadline), but
    /// the daemon waits at most 5 s for them. The socket file is removed.
    pub(crate) async fn stop(mut self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if let Some(placed) = self.socket {
            placed.remove();
        }
    }
}

/// The witness pusher: pushed to every interval, and once more after the last request.
pub(crate) struct Pusher {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Pusher {
    /// The pusher, if the options name a witness policy.
    pub(crate) fn start(
        app: &Arc<App>,
        options: &ServeOptions,
    ) -> Result<Option<Pusher>, DaemonError> {
        let Some(policy) = options.witness.policy.clone() else {
            return Ok(None);
        };
        let (stop, stop_rx) = watch::channel(false);
        let p = witness::Pusher::new(
            Arc::clone(&app.ledger),
            app.ledger.dir().to_path_buf(),
            policy,
            &options.witness.ca_files,
        )
        .map_err(DaemonError::Witness)?;
        let task = tokio::spawn(p.run(options.witness.interval, stop_rx));
        Ok(Some(Pusher { stop, task }))
    }

    /// The last push, then the task's end.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// The read-only view (the page and `/metrics`) on loopback TCP.
pub(crate) struct View {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl View {
    /// The view on `listener`, if `serve --metrics-listen` gave one.
    pub(crate) fn start(
        app: &Arc<App>,
        options: &ServeOptions,
        listener: Option<tokio::net::TcpListener>,
    ) -> Option<View> {
        let listener = listener?;
        let (stop, stop_rx) = watch::channel(false);
        let limits = observe::listen::ViewLimits {
            max_connections: options.observe.metrics_max_connections,
            read_timeout: options.limits.read_timeout,
            write_timeout: options.limits.write_timeout,
        };
        let router = page::listener_router(Arc::clone(app));
        let task = tokio::spawn(observe::listen::serve(
            listener,
            router,
            limits,
            stopped(stop_rx),
        ));
        Some(View { stop, task })
    }

    /// Its event streams end with it; a connection still open is cut after a second.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(3), self.task).await;
    }
}

/// The approval notifier's tasks (`serve --notify`), reading the requests as
/// `GET /v1/approvals` does.
pub(crate) fn notifier(app: &Arc<App>) -> crate::notify::Running {
    let reader = Arc::clone(app);
    let list: crate::notify::Lister = Arc::new(move || {
        let app = Arc::clone(&reader);
        Box::pin(async move {
            let gate = Arc::clone(&app.gate);
            app.at_once(move || gate.approval_requests())
                .await
                .map_err(|e| e.to_string())
        })
    });
    crate::notify::Running::start(&app.observer.notify, list)
}
