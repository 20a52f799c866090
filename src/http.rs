//! The plain-HTTP endpoints operators and probes use: `/health` (etcd's
//! JSON shape, so existing probes work), `/livez`, `/readyz`, `/metrics`
//! and `/version`.

use crate::api::{Shared, ETCD_VERSION};
use axum::routing::get;
use axum::Router;
use std::future::Future;
use tokio::net::TcpListener;

/// Serves the endpoints on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    shared: Shared,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let metrics_shared = shared.clone();
    let app = Router::new()
        .route(
            "/health",
            get(|| async {
                (
                    [("content-type", "application/json")],
                    r#"{"health":"true","reason":""}"#,
                )
            }),
        )
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .route(
            "/version",
            get(|| async {
                (
                    [("content-type", "application/json")],
                    format!(r#"{{"etcdserver":"{ETCD_VERSION}","etcdcluster":"3.6.0"}}"#),
                )
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let s = metrics_shared.clone();
                async move {
                    (
                        [("content-type", "text/plain; version=0.0.4")],
                        s.metrics.render(&s.store),
                    )
                }
            }),
        );
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::error!(error = %e, "HTTP endpoint failed");
    }
}
