//! The plain-HTTP endpoints operators and probes use: `/health` (etcd's
//! JSON shape and rules, so existing probes work), `/livez`, `/readyz`,
//! `/metrics` and `/version`.

use crate::api::{Shared, ETCD_VERSION};
use crate::backend::Backend;
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
    if let Err(e) = axum::serve(listener, router(shared))
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::error!(error = %e, "HTTP endpoint failed");
    }
}

/// The endpoints' routes, served here on the metrics listener and by
/// [`crate::gateway`] on the client listener.
pub fn router(shared: Shared) -> Router {
    let metrics_shared = shared.clone();
    let health_shared = shared.clone();
    Router::new()
        .route(
            "/health",
            get(move |RawQuery(query): RawQuery| {
                let alarms = health_shared.store.alarms();
                let no_leader = leaderless(&health_shared);
                async move { health(&alarms, no_leader, query.as_deref().unwrap_or("")) }
            }),
        )
        .route(
            "/livez",
            get({
                let shared = shared.clone();
                move |RawQuery(query): RawQuery| async move {
                    probe("livez", LIVEZ, &shared, query.as_deref().unwrap_or("")).await
                }
            }),
        )
        .route(
            "/readyz",
            get({
                let shared = shared.clone();
                move |RawQuery(query): RawQuery| async move {
                    probe("readyz", READYZ, &shared, query.as_deref().unwrap_or("")).await
                }
            }),
        )
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
                    let text = s.backend.metrics_text(&s.metrics);
                    ([("content-type", "text/plain; version=0.0.4")], text)
                }
            }),
        )
}

/// The checks of `/livez`: only ephd's own process (its store answers a
/// read), never anything outside it, so a liveness probe restarts ephd only
/// when ephd itself is wedged.
const LIVEZ: &[Check] = &[Check::SerializableRead];

/// The checks of `/readyz`, as etcd 3.6 names them: no CORRUPT alarm, and
/// the store answers reads (a single member's linearizable read is its
/// serializable read; cluster mode will confirm the leader's index).
const READYZ: &[Check] = &[
    Check::DataCorruption,
    Check::SerializableRead,
    Check::LinearizableRead,
];

/// How long a read check may take before the store counts as wedged.
const READ_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// One named check of `/livez` or `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// A CORRUPT alarm is raised.
    DataCorruption,
    /// A local read of one key completes within [`READ_CHECK_TIMEOUT`].
    SerializableRead,
    /// A linearizable read completes within [`READ_CHECK_TIMEOUT`].
    LinearizableRead,
}

impl Check {
    fn name(self) -> &'static str {
        match self {
            Check::DataCorruption => "data_corruption",
            Check::SerializableRead => "serializable_read",
            Check::LinearizableRead => "linearizable_read",
        }
    }

    /// `Ok` or why the check failed.
    async fn run(self, shared: &Shared) -> Result<(), String> {
        match self {
            Check::DataCorruption => {
                if shared
                    .store
                    .alarms()
                    .iter()
                    .any(|a| a.alarm == ALARM_CORRUPT)
                {
                    Err("the CORRUPT alarm is raised".to_string())
                } else {
                    Ok(())
                }
            }
            Check::SerializableRead | Check::LinearizableRead => {
                if let Check::LinearizableRead = self {
                    // Cluster mode: the leader confirms its index with a
                    // quorum and this member catches up to it first.
                    let read_index = shared.backend.read_index();
                    match tokio::time::timeout(READ_CHECK_TIMEOUT, read_index).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => return Err(e.to_string()),
                        Err(_) => {
                            return Err(format!("no read index within {READ_CHECK_TIMEOUT:?}"))
                        }
                    }
                }
                let store = shared.store.clone();
                let read = tokio::task::spawn_blocking(move || {
                    store.range(&crate::mvcc::RangeRequest {
                        key: bytes::Bytes::from_static(b"health"),
                        ..Default::default()
                    })
                });
                match tokio::time::timeout(READ_CHECK_TIMEOUT, read).await {
                    Ok(Ok(Ok(_))) => Ok(()),
                    Ok(Ok(Err(e))) => Err(e.to_string()),
                    Ok(Err(_)) => Err("the read panicked".to_string()),
                    Err(_) => Err(format!("no answer within {READ_CHECK_TIMEOUT:?}")),
                }
            }
        }
    }
}

/// Whether every check of `/readyz` passes: what the gRPC health service
/// reports as SERVING.
pub async fn ready(shared: &Shared) -> bool {
    for check in READYZ {
        if check.run(shared).await.is_err() {
            return false;
        }
    }
    true
}

/// `/livez` and `/readyz` in the Kubernetes style etcd 3.6 uses: `ok` (200)
/// when every check passes, else 503 naming the failed checks;
/// `?verbose` lists every check, `?exclude=<name>` (repeatable) skips one.
async fn probe(what: &str, checks: &[Check], shared: &Shared, query: &str) -> Response {
    let params: Vec<&str> = query.split('&').collect();
    let verbose = params
        .iter()
        .any(|p| *p == "verbose" || p.starts_with("verbose="));
    let excluded: Vec<&str> = params
        .iter()
        .filter_map(|p| p.strip_prefix("exclude="))
        .collect();
    let mut lines = Vec::new();
    let mut failed = false;
    for check in checks {
        let name = check.name();
        if excluded.contains(&name) {
            lines.push(format!("[+]{name} excluded: ok"));
            continue;
        }
        match check.run(shared).await {
            Ok(()) => lines.push(format!("[+]{name} ok")),
            Err(reason) => {
                failed = true;
                lines.push(format!("[-]{name} failed: {reason}"));
            }
        }
    }
    let text = |s: String| ([("content-type", "text/plain; charset=utf-8")], s);
    if failed {
        let failed_only: Vec<&String> = lines.iter().filter(|l| l.starts_with("[-]")).collect();
        let shown: Vec<&String> = if verbose {
            lines.iter().collect()
        } else {
            failed_only
        };
        let body = format!(
            "{}\n{what} check failed\n",
            shown
                .iter()
                .map(|l| l.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        );
        return (StatusCode::SERVICE_UNAVAILABLE, text(body)).into_response();
    }
    if verbose {
        return text(format!("{}\n{what} check passed\n", lines.join("\n"))).into_response();
    }
    text("ok".to_string()).into_response()
}

/// Whether this is a cluster member that knows no leader (a single member
/// always leads itself).
fn leaderless(shared: &Shared) -> bool {
    !shared.backend.has_leader()
}

/// etcd's `/health` (3.5 and later): unhealthy (503) while an alarm is
/// raised, naming the first one, unless the query excludes its type
/// (`?exclude=NOSPACE`, repeatable); then, unless `?serializable=true`,
/// unhealthy on a cluster member without a leader (`RAFT NO LEADER`), as
/// etcd checks it.
fn health(alarms: &[AlarmMember], no_leader: bool, query: &str) -> Response {
    let excluded: Vec<&str> = query
        .split('&')
        .filter_map(|kv| kv.strip_prefix("exclude="))
        .collect();
    let serializable = query.split('&').any(|kv| kv == "serializable=true");
    let raised = alarms.iter().find_map(|a| {
        // The name `?exclude=` matches, and the reason etcd gives.
        let (name, reason) = match a.alarm {
            ALARM_NOSPACE => ("NOSPACE", "ALARM NOSPACE"),
            ALARM_CORRUPT => ("CORRUPT", "ALARM CORRUPT"),
            _ => ("NONE", "ALARM UNKNOWN"),
        };
        (!excluded.contains(&name)).then_some(reason)
    });
    let raised = raised.or((no_leader && !serializable).then_some("RAFT NO LEADER"));
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
            body_of(health(&[], false, "")),
            (
                StatusCode::OK,
                r#"{"health":"true","reason":""}"#.to_string()
            )
        );
        assert_eq!(
            body_of(health(&[nospace], false, "serializable=true")),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "{\"health\":\"false\",\"reason\":\"ALARM NOSPACE\"}\n".to_string()
            )
        );
        assert_eq!(
            body_of(health(&[nospace], false, "exclude=NOSPACE")).0,
            StatusCode::OK
        );
        let (status, body) = body_of(health(&[nospace, corrupt], false, "exclude=NOSPACE"));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("ALARM CORRUPT"), "{body}");
        let leaderless = body_of(health(&[], true, ""));
        assert_eq!(
            leaderless,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "{\"health\":\"false\",\"reason\":\"RAFT NO LEADER\"}\n".to_string()
            )
        );
        assert_eq!(
            body_of(health(&[], true, "serializable=true")).0,
            StatusCode::OK,
            "a serializable check does not need a leader"
        );
        let both = "exclude=NOSPACE&exclude=CORRUPT";
        assert_eq!(
            body_of(health(&[nospace, corrupt], false, both)).0,
            StatusCode::OK
        );
    }
}
