//! kube-apiserver 1.37 lists through etcd 3.7's `RangeStream` (its
//! `EtcdRangeStream` feature, on by default) and falls back to paginated
//! Ranges for ten minutes when a server answers Unimplemented. With ephd as
//! the override store its lists of Leases and Events stream from ephd.

use super::{ControlPlane, NEXT};

/// ephd's count of `RangeStream` calls answered with `code`.
fn range_streams(metrics: &str, code: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("grpc_server_handled_total{"))
        .filter(|l| l.contains("grpc_method=\"RangeStream\""))
        .filter(|l| l.contains(&format!("grpc_code=\"{code}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn apiserver_1_37_lists_leases_and_events_through_range_stream_on_ephd() {
    let plane = ControlPlane::start_with(NEXT, &[]);
    let before = range_streams(&plane.ephd_metrics(), "OK");

    let leases = plane.driver("leases", &["-nodes=20", "-renewals=2"]);
    assert_eq!(leases["renewed"], 40, "{leases}");
    assert_eq!(leases["listed"], 20, "{leases}");
    assert_eq!(leases["stale"], 0, "{leases}");
    let events = plane.driver("events", &["-events=30", "-page=0"]);
    assert_eq!(events["listed"], 30, "{events}");
    assert_eq!(events["watched"], 30, "{events}");

    let metrics = plane.ephd_metrics();
    assert!(
        range_streams(&metrics, "OK") > before,
        "no RangeStream reached ephd:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("RangeStream"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        range_streams(&metrics, "Unimplemented"),
        0.0,
        "the apiserver fell back to paginated lists"
    );
}
