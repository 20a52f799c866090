//! A cluster member whose start is held ([`crate::cluster::NotStarted::Held`]):
//! the other members answer without a leader and too few of them hold
//! what was committed, so starting now could lose acknowledged writes.
//! Instead of ending, the process stays up and says so where operators
//! look, until members return and its start goes on by itself:
//!
//! * `/health`: 503, `{"health":"false","reason":"START HELD"}`; `/readyz`
//!   fails with the reason; `/livez` passes (the process is not wedged,
//!   and a restart would change nothing);
//! * `/metrics`: `ephd_server_start_held 1` (the series an alert rule
//!   pages on, README "Metrics"), `etcd_server_has_leader 0` (what etcd's
//!   own `etcdNoLeader` alert watches), and the process metrics;
//! * gRPC calls on the client URLs: Unavailable, `etcdserver: no leader`,
//!   which clients take as "try another member"; JSON gateway calls get
//!   the same status as JSON.
//!
//! It serves on duplicates of the client and metrics listeners (the same
//! sockets, so nothing is bound twice and the server keeps them
//! afterwards), until [`HeldStart::stop`].

use super::accept;
use super::listeners::Bound;
use crate::cluster::member::saved_state::Saved;
use crate::cluster::{Boot, NotStarted};
use crate::config::{ClusterConfig, Config};
use crate::tls;
use axum::http::{header::CONTENT_TYPE, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use parking_lot::RwLock;
use prometheus::{IntGauge, Registry};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The `/health` reason of a held start.
pub const HEALTH_REASON: &str = "START HELD";
/// The metric that is 1 while the start is held.
pub const HELD_METRIC: &str = "ephd_server_start_held";
/// What gRPC calls are answered while the start is held: etcd's message
/// for a member without a leader, which clients recognise.
const CALL_REFUSAL: &str = "etcdserver: no leader";

/// How long a held start waits before asking the other members again
/// (each attempt itself waits for an election or a resume under way).
const ASK_AGAIN: Duration = Duration::from_secs(2);
/// How often an unchanged reason is logged again.
const REMIND: Duration = Duration::from_secs(60);

/// Starts cluster member `cluster` of `config`: asks the other members
/// ([`crate::cluster::bootstrap`]) until they allow it. While their
/// answers hold the start, the reason is logged (at once, then when it
/// changes or every [`REMIND`]) and served by the [`HeldStart`] `hold`
/// makes. Ends with the member's boot, or with why it must not start.
pub(super) async fn start_when_allowed(
    cluster: &ClusterConfig,
    config: &Config,
    (saved, forced_tail): (&mut Option<Saved>, &[raft::prelude::Entry]),
    hold: impl Fn(String) -> Result<HeldStart, String>,
) -> Result<Boot, String> {
    let mut held: Option<HeldStart> = None;
    let mut said: Option<(String, tokio::time::Instant)> = None;
    let outcome = loop {
        // The seed of a whole-cluster resume may replace `saved` with a
        // newer member's (`cluster/node/newest_saved_state.rs`).
        let urls = config.advertised_urls();
        match crate::cluster::bootstrap(cluster, urls, saved, forced_tail).await {
            Ok(boot) => break Ok(boot),
            Err(NotStarted::Refused(why)) => break Err(why),
            Err(NotStarted::Held(why)) => {
                let now = tokio::time::Instant::now();
                let repeat = said
                    .as_ref()
                    .is_some_and(|(last, at)| *last == why && now < *at + REMIND);
                if !repeat {
                    tracing::error!(
                        reason = %why,
                        "{HELD_LOG}: this member starts by itself once the other members \
                         answer with a leader or enough of them return"
                    );
                    said = Some((why.clone(), now));
                }
                match &held {
                    Some(h) => h.update(why),
                    None => held = Some(hold(why)?),
                }
                tokio::time::sleep(ASK_AGAIN).await;
            }
        }
    };
    if let Some(h) = held {
        h.stop().await;
        if outcome.is_ok() {
            tracing::info!("the start is no longer held: the other members allow it");
        }
    }
    outcome
}

/// The words that begin the log line of a held start.
pub const HELD_LOG: &str = "start held";

/// What the endpoints of a held start say.
struct State {
    reason: RwLock<String>,
    registry: Registry,
}

/// The servers of a held start.
pub(super) struct HeldStart {
    state: Arc<State>,
    stop: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
}

impl HeldStart {
    /// Serves the held state on `client` and `metrics` (duplicated: the
    /// caller keeps its listeners), with client TLS from `tls`.
    pub(super) fn serve(
        client: &[Bound],
        metrics: &[Bound],
        tls: Option<tls::Live>,
        reason: String,
    ) -> Result<HeldStart, String> {
        let state = Arc::new(State {
            reason: RwLock::new(reason),
            registry: registry()?,
        });
        let (stop, stopped) = watch::channel(false);
        let mut servers = Vec::new();
        let mut listeners = Vec::new();
        for b in client.iter().chain(metrics) {
            listeners.push((duplicate(&b.listener)?, b.tls));
        }
        for (listener, with_tls) in listeners {
            let routes = tonic::service::Routes::from(router(state.clone()));
            let server = tonic::transport::Server::builder()
                .accept_http1(true)
                .add_routes(routes);
            let mut stopped = stopped.clone();
            let shutdown = async move { crate::api::stopped(&mut stopped).await };
            let incoming = accept::incoming(listener);
            servers.push(match (&tls, with_tls) {
                (Some(live), true) => {
                    let incoming = tls::incoming(incoming, live.clone());
                    tokio::spawn(async move {
                        let _ = server
                            .serve_with_incoming_shutdown(incoming, shutdown)
                            .await;
                    })
                }
                (None, true) => return Err("an https:// client URL without TLS set up".into()),
                _ => tokio::spawn(async move {
                    let _ = server
                        .serve_with_incoming_shutdown(incoming, shutdown)
                        .await;
                }),
            });
        }
        Ok(HeldStart {
            state,
            stop,
            servers,
        })
    }

    /// Says `reason` from now on.
    pub(super) fn update(&self, reason: String) {
        *self.state.reason.write() = reason;
    }

    /// Stops serving and closes the duplicated listeners.
    pub(super) async fn stop(self) {
        let _ = self.stop.send(true);
        for s in self.servers {
            let abort = s.abort_handle();
            if tokio::time::timeout(Duration::from_millis(500), s)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }
}

/// Another handle on `listener`'s socket: connections either accepts are
/// the same queue's.
fn duplicate(listener: &TcpListener) -> Result<TcpListener, String> {
    let fd = listener
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| format!("cannot share a listener: {e}"))?;
    let std = std::net::TcpListener::from(fd);
    std.set_nonblocking(true)
        .and_then(|()| TcpListener::from_std(std))
        .map_err(|e| format!("cannot share a listener: {e}"))
}

/// The held state's metrics: the process, no leader, start held.
fn registry() -> Result<Registry, String> {
    let registry = Registry::new();
    #[cfg(target_os = "linux")]
    {
        let _ = registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ));
    }
    for (name, help, value) in [
        (
            HELD_METRIC,
            "1 while this member holds its start because the members that answer have no \
             leader and may not hold every committed write (its log says why).",
            1,
        ),
        (
            "etcd_server_has_leader",
            "Whether or not a leader exists. 1 is existence, 0 is not.",
            0,
        ),
        (
            "etcd_server_is_leader",
            "Whether or not this member is a leader. 1 if is, 0 otherwise.",
            0,
        ),
    ] {
        let gauge = IntGauge::new(name, help).map_err(|e| e.to_string())?;
        gauge.set(value);
        registry
            .register(Box::new(gauge))
            .map_err(|e| e.to_string())?;
    }
    Ok(registry)
}

fn router(state: Arc<State>) -> Router {
    let readyz = state.clone();
    let metrics = state;
    Router::new()
        .route(
            "/health",
            get(|| async {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(CONTENT_TYPE, "application/json")],
                    format!("{{\"health\":\"false\",\"reason\":\"{HEALTH_REASON}\"}}\n"),
                )
            }),
        )
        .route("/livez", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || async move {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "[-]start_held failed: {}\nreadyz check failed\n",
                        readyz.reason.read()
                    ),
                )
            }),
        )
        .route(
            "/metrics",
            get(move || async move {
                (
                    [(CONTENT_TYPE, "text/plain; version=0.0.4")],
                    crate::metrics::render(&metrics.registry),
                )
            }),
        )
        .fallback(|headers: HeaderMap| async move { refused_call(&headers) })
}

/// A call made while the start is held: a gRPC Unavailable (trailers
/// only), or the same status as the JSON gateway writes it.
fn refused_call(headers: &HeaderMap) -> Response {
    let status = tonic::Status::unavailable(CALL_REFUSAL);
    let grpc = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if grpc {
        return status.into_http::<axum::body::Body>();
    }
    let body = serde_json::json!({ "code": status.code() as i32, "message": status.message() });
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
