//! What a kube-apiserver stores in its override store: node Leases renewed
//! as kubelets renew them, Events created, paged and watched, the readiness
//! and liveness checks of the override, and the apiserver's compactor; and
//! what it does not: custom resources, which stay in etcd whatever the
//! overrides say.

use std::time::Duration;

use super::ControlPlane;

#[test]
fn apiserver_keeps_leases_and_events_in_ephd_and_compacts_it() {
    let plane = ControlPlane::start(&[]);

    let ready = plane.driver("ready", &[]);
    for (endpoint, checks) in [
        (
            "readyz",
            ["[+]etcd-override-0 ok", "[+]etcd-override-readiness-0 ok"].as_slice(),
        ),
        ("livez", ["[+]etcd-override-0 ok"].as_slice()),
    ] {
        let got: Vec<&str> = ready[endpoint]
            .as_array()
            .expect("checks")
            .iter()
            .filter_map(|c| c.as_str())
            .collect();
        for check in checks {
            assert!(
                got.contains(check),
                "/{endpoint}?verbose lacks {check:?}: {got:?}"
            );
        }
    }

    let leases = plane.driver("leases", &["-nodes=20", "-renewals=3"]);
    assert_eq!(leases["renewed"], 60, "{leases}");
    assert!(leases["failed"].is_null(), "{leases}");
    assert_eq!(leases["listed"], 20, "{leases}");
    assert_eq!(leases["stale"], 0, "a list missed a renewal: {leases}");

    let events = plane.driver("events", &["-events=50", "-page=7"]);
    assert_eq!(events["listed"], 50, "{events}");
    assert_eq!(events["pages"], 8, "{events}");
    assert_eq!(events["watched"], 50, "{events}");
    assert_eq!(events["watch_error"], "", "{events}");

    // A custom resource named in the overrides: kube-apiserver keeps its
    // objects in --etcd-servers anyway (custom resources get a storage
    // factory without overrides), so ephd must not see them.
    let widgets = plane.driver("crd", &["-events=5"]);
    assert_eq!(
        (widgets["created"].as_i64(), widgets["listed"].as_i64()),
        (Some(5), Some(5)),
        "{widgets}"
    );
    assert_eq!(
        plane.keys(false, "/registry/ephd.example/widgets/").len(),
        5
    );
    assert!(plane.keys(true, "/registry/ephd.example/").is_empty());

    // Everything the overrides name is in ephd, nothing of it in etcd.
    let node_leases = plane.keys(true, "/registry/leases/kube-node-lease/");
    assert_eq!(node_leases.len(), 20, "{node_leases:?}");
    assert!(plane.keys(true, "/registry/events/default/").len() >= 50);
    assert!(plane.keys(false, "/registry/leases/").is_empty());
    assert!(plane.keys(false, "/registry/events/").is_empty());
    // And the rest stays in etcd.
    assert!(!plane.keys(false, "/registry/namespaces/").is_empty());
    assert!(plane.keys(true, "/registry/namespaces/").is_empty());

    // The apiserver's compactor runs against ephd too: compact_rev_key
    // counts its cycles, and history before the last compaction is gone.
    plane.wait_compactions(2, Duration::from_secs(40));
    let out = plane.etcdctl(true, &["get", "compact_rev_key", "--print-value-only"]);
    let compacted: i64 = out
        .trim()
        .parse()
        .expect("compact_rev_key holds a revision");
    assert!(compacted > 0, "{out}");
}
