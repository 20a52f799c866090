//! Unit tests of the gRPC metrics layer (`src/metrics/grpc.rs`).

use super::*;

fn frame(len: u32) -> Vec<u8> {
    let mut v = vec![0u8];
    v.extend_from_slice(&len.to_be_bytes());
    v.extend(std::iter::repeat_n(7u8, len as usize));
    v
}

#[test]
fn frames_are_counted_across_any_chunking() {
    let mut stream = frame(3);
    stream.extend(frame(0));
    stream.extend(frame(300));
    stream.extend(frame(70_000));
    for chunk in [1, 2, 4, 5, 6, 7, 64, 1000, stream.len()] {
        let mut f = Frames::default();
        let (mut m, mut b) = (0, 0);
        for part in stream.chunks(chunk) {
            let (pm, pb) = f.feed(part);
            m += pm;
            b += pb;
        }
        assert_eq!((m, b), (4, 70_303), "chunks of {chunk}");
    }
}

#[test]
fn codes_are_grpc_gos_and_unknown_numbers_are_unknown() {
    let mut h = http::HeaderMap::new();
    assert_eq!(code_of(&h), None);
    for (n, name) in [(0, "OK"), (8, "ResourceExhausted"), (14, "Unavailable")] {
        h.insert("grpc-status", n.to_string().parse().unwrap());
        assert_eq!(CODES[code_of(&h).unwrap()], name);
    }
    h.insert("grpc-status", "99".parse().unwrap());
    assert_eq!(CODES[code_of(&h).unwrap()], "Unknown");
    h.insert("grpc-status", "x".parse().unwrap());
    assert_eq!(CODES[code_of(&h).unwrap()], "Unknown");
}

fn value(r: &Registry, family: &str, method: &str, code: Option<&str>) -> u64 {
    r.gather()
        .iter()
        .filter(|f| f.name() == family)
        .flat_map(|f| f.get_metric().iter())
        .filter(|m| {
            let l = m.get_label();
            l.iter()
                .any(|p| p.name() == "grpc_method" && p.value() == method)
                && code.is_none_or(|c| l.iter().any(|p| p.name() == "grpc_code" && p.value() == c))
        })
        .map(|m| {
            if m.get_histogram().is_some() {
                m.get_histogram().get_sample_count()
            } else {
                m.get_counter().value() as u64
            }
        })
        .sum()
}

async fn drain(body: MetricsBody<tonic::body::Body>) {
    use http_body_util::BodyExt;
    let _ = body.collect().await;
}

/// Unary OK (message then trailers), a trailers-only error, and a call
/// abandoned before its answer: handled OK, with the error's code, and
/// Canceled; messages counted as frames pass.
#[tokio::test]
async fn calls_are_handled_with_the_code_they_end_with() {
    use tower::{Layer, Service, ServiceExt};
    let r = Registry::new();
    let g = Arc::new(GrpcMetrics::new(&r).unwrap());
    let inner = tower::service_fn(|req: http::Request<tonic::body::Body>| async move {
        match req.uri().path() {
            "/etcdserverpb.KV/Put" => {
                let frames = futures::stream::iter(vec![
                    Ok::<_, tonic::Status>(http_body::Frame::data(Bytes::from_static(&[
                        0, 0, 0, 0, 2, 1, 2,
                    ]))),
                    Ok(http_body::Frame::trailers({
                        let mut t = http::HeaderMap::new();
                        t.insert("grpc-status", "0".parse().unwrap());
                        t
                    })),
                ]);
                Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::new(
                    http_body_util::StreamBody::new(frames),
                )))
            }
            "/etcdserverpb.KV/Range" => {
                Ok(tonic::Status::resource_exhausted("full").into_http::<tonic::body::Body>())
            }
            _ => std::future::pending().await,
        }
    });
    let mut svc = GrpcMetricsLayer(g.clone()).layer(inner);
    let req = |path: &str| {
        http::Request::builder()
            .uri(path)
            .body(tonic::body::Body::empty())
            .unwrap()
    };
    let put = svc
        .ready()
        .await
        .unwrap()
        .call(req("/etcdserverpb.KV/Put"))
        .await;
    drain(put.unwrap().into_body()).await;
    let range = svc
        .ready()
        .await
        .unwrap()
        .call(req("/etcdserverpb.KV/Range"))
        .await;
    drain(range.unwrap().into_body()).await;
    let txn = svc.ready().await.unwrap().call(req("/etcdserverpb.KV/Txn"));
    let timed_out = tokio::time::timeout(std::time::Duration::from_millis(10), txn).await;
    assert!(timed_out.is_err());
    // An unknown method is passed through and not counted.
    let unknown = svc
        .ready()
        .await
        .unwrap()
        .call(req("/etcdserverpb.KV/Nope"));
    drop(unknown);

    assert_eq!(value(&r, "grpc_server_started_total", "Put", None), 1);
    assert_eq!(value(&r, "grpc_server_handled_total", "Put", Some("OK")), 1);
    assert_eq!(value(&r, "grpc_server_msg_sent_total", "Put", None), 1);
    assert_eq!(g.sent_bytes.get(), 2);
    assert_eq!(
        value(
            &r,
            "grpc_server_handled_total",
            "Range",
            Some("ResourceExhausted")
        ),
        1
    );
    // Counted as sent though it failed, as etcd 3.6 counts it.
    assert_eq!(value(&r, "grpc_server_msg_sent_total", "Range", None), 1);
    assert_eq!(
        value(&r, "grpc_server_handled_total", "Txn", Some("Canceled")),
        1
    );
    assert_eq!(value(&r, "grpc_server_handling_seconds", "Txn", None), 1);
    assert_eq!(value(&r, "grpc_server_started_total", "Nope", None), 0);
}

/// Makes sure the warnings' shed and slow lines reach this thread's
/// capture, and returns how many probe lines that took.
///
/// A callsite's interest is cached process-wide. Other tests in this
/// binary log through the same callsites on threads with no subscriber;
/// one that registers a callsite while this thread installs its capture
/// can leave it cached as "never": while no thread has ever set a
/// subscriber of its own, tracing-core works a new callsite's interest
/// out from the registering thread's subscriber alone, without the lock
/// that installing one takes, so that answer can land after the rebuild
/// the install does. So this logs probes from fresh warnings and works
/// the interest out again until both probes show.
fn warnings_are_captured(logs: &crate::logging::capture::Captured) -> usize {
    use crate::metrics::warnings::{Finished, RequestWarnings};
    let call = |code: usize, message| Finished {
        service: "probe",
        method: "Probe",
        unary: true,
        code_name: CODES[code],
        code,
        message,
        remote: None,
        took: std::time::Duration::from_secs(1),
    };
    let shed = call(8, Some("etcdserver: too many requests"));
    let slow = call(OK, None);
    for _ in 0..1000 {
        tracing::callsite::rebuild_interest_cache();
        let before = logs.text().lines().count();
        let w = RequestWarnings::new(
            std::time::Duration::from_millis(1),
            std::time::Duration::from_secs(60),
        );
        w.report(&shed);
        w.report(&slow);
        let text = logs.text();
        let probes: Vec<&str> = text.lines().skip(before).collect();
        if probes.len() == 2 {
            return text.lines().count();
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    panic!(
        "the warnings' log lines never reached the capture: {}",
        logs.text()
    );
}

/// The layer hands shed and slow calls to the warnings with what it
/// saw of them: two shed Ranges log one line (the second is held back),
/// a slow Put one line, and a watch stream's end nothing (streams are
/// never slow).
#[tokio::test]
async fn shed_and_slow_calls_are_logged_once_per_period() {
    use tower::{Layer, Service, ServiceExt};
    let r = Registry::new();
    let g = Arc::new(GrpcMetrics::new(&r).unwrap());
    // Every unary call that takes any time at all is slow.
    g.warnings.set_slow(std::time::Duration::from_nanos(1));
    let (logs, _guard) = crate::logging::capture::capture(true);
    let probed = warnings_are_captured(&logs);
    let inner = tower::service_fn(|req: http::Request<tonic::body::Body>| async move {
        let resp = match req.uri().path() {
            "/etcdserverpb.KV/Range" => {
                tonic::Status::resource_exhausted("etcdserver: too many requests")
                    .into_http::<tonic::body::Body>()
            }
            _ => {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                let ok = futures::stream::iter(vec![Ok::<_, tonic::Status>(
                    http_body::Frame::trailers({
                        let mut t = http::HeaderMap::new();
                        t.insert("grpc-status", "0".parse().unwrap());
                        t
                    }),
                )]);
                http::Response::new(tonic::body::Body::new(http_body_util::StreamBody::new(ok)))
            }
        };
        Ok::<_, std::convert::Infallible>(resp)
    });
    let mut svc = GrpcMetricsLayer(g.clone()).layer(inner);
    let remote: SocketAddr = "192.0.2.1:40000".parse().unwrap();
    for path in [
        "/etcdserverpb.KV/Range",
        "/etcdserverpb.KV/Range",
        "/etcdserverpb.KV/Put",
        "/etcdserverpb.Watch/Watch",
    ] {
        let mut req = http::Request::builder()
            .uri(path)
            .body(tonic::body::Body::empty())
            .unwrap();
        req.extensions_mut()
            .insert(tonic::transport::server::TcpConnectInfo {
                local_addr: None,
                remote_addr: Some(remote),
            });
        let resp = svc.ready().await.unwrap().call(req).await.unwrap();
        drain(resp.into_body()).await;
    }
    let text = logs.text();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .skip(probed)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    let shed = &lines[0];
    assert_eq!(shed["level"], "warn");
    assert!(
        shed["msg"].as_str().unwrap().starts_with("request shed"),
        "{text}"
    );
    assert_eq!(shed["method"], "/etcdserverpb.KV/Range");
    assert_eq!(shed["code"], "ResourceExhausted");
    assert_eq!(shed["error"], "etcdserver: too many requests");
    assert_eq!(shed["remote"], "192.0.2.1:40000");
    assert_eq!(shed["suppressed"], 0);
    assert!(shed["took"].as_str().unwrap().ends_with('s'), "{text}");
    let slow = &lines[1];
    assert_eq!(slow["msg"], "request took too long");
    assert_eq!(slow["method"], "/etcdserverpb.KV/Put");
    assert_eq!(slow["code"], "OK");
    assert!(slow.get("error").is_none(), "{text}");
    assert_eq!(slow["expected-duration"], "1ns");
    assert_eq!(
        value(
            &r,
            "grpc_server_handled_total",
            "Range",
            Some("ResourceExhausted")
        ),
        2,
        "both counted, one logged"
    );
}

#[test]
fn every_method_has_every_code_from_zero() {
    let r = Registry::new();
    let g = GrpcMetrics::new(&r).unwrap();
    assert_eq!(g.lookup("/etcdserverpb.KV/Range"), Some(0));
    assert_eq!(g.lookup("/etcdserverpb.KV/Nope"), None);
    let families = r.gather();
    let handled = families
        .iter()
        .find(|f| f.name() == "grpc_server_handled_total")
        .unwrap();
    assert_eq!(handled.get_metric().len(), METHODS.len() * CODES.len());
}
