//! The gateway's HTTP front: the credential of every request first (401, nothing else
//! done, without one that names a run), then each POST body classified by
//! [`crate::classify`] (a refused one is answered with a JSON-RPC error and never passed
//! on), then rmcp's Streamable HTTP service for what passed. A session is bound to the
//! run of the credential that opened it: another credential cannot drive it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;

use super::servers::Backend;
use super::session::{Classified, RunOf, Session, Shared};
use super::{Authorize, GatewayOptions};
use crate::call::Asker;
use crate::classify::{self, Message, Why};

/// The largest request body read (the classifier's line limit).
const MAX_BODY: usize = classify::MAX_LINE;
/// MCP's session header.
const SESSION: &str = "mcp-session-id";

type Body = BoxBody<Bytes, Infallible>;

/// What the front keeps of a session.
struct Bound {
    run: String,
    refused: u64,
    last: std::time::Instant,
}

struct Front {
    authorize: Authorize,
    service: StreamableHttpService<Session, LocalSessionManager>,
    /// Each session's run, the messages refused in it so far, and its last request.
    sessions: Mutex<HashMap<String, Bound>>,
    /// A session idle this long is closed by rmcp; its entry here is dropped then too.
    idle: std::time::Duration,
}

pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    options: GatewayOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let hidden_env: Arc<[String]> = options.hidden_env.into();
    let shared = Arc::new(Shared {
        backends: options
            .servers
            .into_iter()
            .map(|s| Backend::new(s, Arc::clone(&hidden_env)))
            .collect(),
        asker: Asker {
            worker: options.worker,
            credential: None,
        },
    });
    let mut manager = LocalSessionManager::default();
    manager.session_config.keep_alive = Some(options.idle);
    let cancel = tokio_util::sync::CancellationToken::new();
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(true)
        .with_cancellation_token(cancel.child_token());
    let service = StreamableHttpService::new(
        move || Ok(Session::new(Arc::clone(&shared))),
        Arc::new(manager),
        config,
    );
    let front = Arc::new(Front {
        authorize: options.authorize,
        service,
        sessions: Mutex::new(HashMap::new()),
        idle: options.idle,
    });
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    crate::log(&format!("gateway: accept failed: {e}"));
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // An answer is written in several pieces (headers, SSE events): without this,
        // Nagle's algorithm holds the last one for the client's delayed ACK (~40 ms).
        let _ = stream.set_nodelay(true);
        let front = Arc::clone(&front);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let front = Arc::clone(&front);
                async move { Ok::<_, Infallible>(front.handle(req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
    cancel.cancel();
    Ok(())
}

fn answer(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn unauthorized(why: &str) -> Response<Body> {
    let mut r = answer(
        StatusCode::UNAUTHORIZED,
        json!({"error": format!("tally's MCP gateway: {why}")}).to_string(),
    );
    r.headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

impl Front {
    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Bound>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let authorized = match (self.authorize)(req.headers().clone()).await {
            Ok(a) => a,
            Err(why) => return unauthorized(&why),
        };
        let run = authorized.run.clone();
        let session = req
            .headers()
            .get(SESSION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if session
            .as_deref()
            .is_some_and(|s| self.held_by_another(s, &run))
        {
            return answer(
                StatusCode::FORBIDDEN,
                json!({"error": "tally's MCP gateway: this session belongs to another run's credential"}).to_string(),
            );
        }
        let (mut parts, body) = req.into_parts();
        parts.extensions.insert(RunOf(authorized));
        let bytes = if parts.method == Method::POST {
            match self.classified(session.as_deref(), body, &mut parts).await {
                Ok(b) => b,
                Err(refused) => return refused,
            }
        } else {
            Bytes::new()
        };
        let deleting = parts.method == Method::DELETE;
        let mut response = self
            .service
            .handle(Request::from_parts(parts, Full::new(bytes)))
            .await;
        if deleting && response.status() == StatusCode::ACCEPTED {
            // The session is gone: 200, what MCP's clients read as a completed DELETE.
            *response.status_mut() = StatusCode::OK;
        }
        self.track(session.as_deref(), deleting, &response, run);
        response
    }

    /// Whether session `s` was opened by a credential of another run (and mark it used).
    fn held_by_another(&self, s: &str, run: &str) -> bool {
        self.sessions().get_mut(s).is_some_and(|b| {
            b.last = std::time::Instant::now();
            b.run != run
        })
    }

    /// A POST's body, read and classified: what passes (a call's reading put in
    /// `parts` for the session), or the answer refusing it.
    async fn classified(
        &self,
        session: Option<&str>,
        body: Incoming,
        parts: &mut hyper::http::request::Parts,
    ) -> Result<Bytes, Response<Body>> {
        let bytes = match Limited::new(body, MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return Err(answer(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    json!({"error": format!("tally's MCP gateway: a message is at most {MAX_BODY} bytes")}).to_string(),
                ))
            }
        };
        match classify::classify(&bytes) {
            Ok(c) => match c.message {
                Message::Call { call, .. } => {
                    parts.extensions.insert(Classified(call));
                }
                // The gateway asks clients nothing (no sampling, elicitation or roots):
                // an answer answers no request of its own.
                Message::Response { .. } => {
                    let refused = classify::Refused {
                        why: Why::UnexpectedAnswer,
                        answer: Vec::new(),
                    };
                    return Err(self.refuse(session, refused));
                }
                _ => {}
            },
            Err(refused) => return Err(self.refuse(session, refused)),
        }
        Ok(bytes)
    }

    /// Keep the sessions' runs: a new session's, a deleted one's gone.
    fn track(&self, session: Option<&str>, deleting: bool, response: &Response<Body>, run: String) {
        match (session, response.headers().get(SESSION)) {
            (Some(s), _) if deleting && response.status().is_success() => {
                self.sessions().remove(s);
            }
            (None, Some(new)) => {
                if let Ok(new) = new.to_str() {
                    let mut sessions = self.sessions();
                    // Sessions rmcp closed for idleness leave no entry behind.
                    let idle = self.idle;
                    sessions.retain(|_, b| b.last.elapsed() <= idle);
                    let last = std::time::Instant::now();
                    let bound = Bound {
                        run,
                        refused: 0,
                        last,
                    };
                    sessions.insert(new.to_owned(), bound);
                }
            }
            _ => {}
        }
    }

    /// A message the classifier refused: a JSON-RPC error under its id (200, so that a
    /// client reads it as the answer to its request), or 400 when it has no usable id.
    fn refuse(&self, session: Option<&str>, refused: classify::Refused) -> Response<Body> {
        let count = session
            .and_then(|s| {
                self.sessions().get_mut(s).map(|b| {
                    b.refused += 1;
                    b.refused
                })
            })
            .unwrap_or(1);
        crate::log(&format!(
            "gateway: refused a message from a client, not passed on ({count} refused so far in its session): {}",
            refused.why
        ));
        match refused.answer.as_slice() {
            [id] => answer(
                StatusCode::OK,
                crate::reply::refused(id, &refused.why, count),
            ),
            _ => answer(StatusCode::BAD_REQUEST, no_id(&refused.why, count)),
        }
    }
}

/// The error for a refused message with no id to answer under (a notification, an
/// answer, a message with no usable id, a batch).
fn no_id(why: &Why, count: u64) -> String {
    crate::reply::error(
        &serde_json::Value::Null,
        why.rpc_code(),
        &format!("tally's MCP gateway refused this message and did not pass it on: {why}"),
        Some(json!({"tally/refused": {"reason": why.code(), "count": count}})),
    )
}
