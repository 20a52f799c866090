//! The plain-HTTP endpoints operators and probes use: `/health` (etcd's
//! JSON shape and rules, so existing probes work), `/livez`, `/readyz`,
//! `/metrics` and `/version`.

use crate::api::{Shared, ETCD_VERSION};
use crate::mvcc::{AlarmMember, ALARM_CORRUPT, ALARM_NOSPACE};
use axum::extract::RawQuery;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
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
    let health_shared = shared.clone();
    let app = Router::new()
        .route(
            "/health",
            get(move |RawQuery(query): RawQuery| {
                let alarms = health_shared.store.alarms();
                async move { health(&alarms, query.as_deref().unwrap_or("")) }
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

/// etcd's `/health` (3.5 and later): unhealthy (503) while an alarm is
/// raised, naming the first one, unless the query excludes its type
/// (`?exclude=NOSPACE`, repeatable). `?serializable=true` skips etcd's
/// leader and read checks, which a single member always passes.
fn health(alarms: &[AlarmMember], query: &str) -> Response {
    let excluded: Vec<&str> = query
        .split('&')
        .filter_map(|kv| kv.strip_prefix("exclude="))
        .collect();
    let raised = alarms.iter().find_map(|a| {
        // The name `?exclude=` matches, and the reason etcd gives.
        let (name, reason) = match a.alarm {
            ALARM_NOSPACE => ("NOSPACE", "ALARM NOSPACE"),
            ALARM_CORRUPT => ("CORRUPT", "ALARM CORRUPT"),
            _ => ("NONE", "ALARM UNKNOWN"),
        };
        (!excluded.contains(&name)).then_some(reason)
    });
    match raised {
        None => (
            [("content-type", "application/json")],
            r#"{"health":"true","reason":""}"#,
        )
            .into_response(),
        // etcd answers with Go's http.Error: text/plain, a trailing newline.
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [("content-type", "text/plain; charset=utf-8")],
            format!("{{\"health\":\"false\",\"reason\":\"{reason}\"}}\n"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_of(r: Response) -> (StatusCode, String) {
        let status = r.status();
        let bytes = futures::executor::block_on(axum::body::to_bytes(r.into_body(), 1 << 16))
            .expect("body");
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[test]
    fn alarms_make_health_false_unless_excluded() {
        let nospace = AlarmMember {
            member_id: 1,
            alarm: ALARM_NOSPACE,
        };
        let corrupt = AlarmMember {
            member_id: 1,
            alarm: ALARM_CORRUPT,
        };
        assert_eq!(
            body_of(health(&[], "")),
            (
                StatusCode::OK,
                r#"{"health":"true","reason":""}"#.to_string()
            )
        );
        assert_eq!(
            body_of(health(&[nospace], "serializable=true")),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "{\"health\":\"false\",\"reason\":\"ALARM NOSPACE\"}\n".to_string()
            )
        );
        assert_eq!(
            body_of(health(&[nospace], "exclude=NOSPACE")).0,
            StatusCode::OK
        );
        let (status, body) = body_of(health(&[nospace, corrupt], "exclude=NOSPACE"));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("ALARM CORRUPT"), "{body}");
        let both = "exclude=NOSPACE&exclude=CORRUPT";
        assert_eq!(body_of(health(&[nospace, corrupt], both)).0, StatusCode::OK);
    }
}
