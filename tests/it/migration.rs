//! The migration guide's live path (docs/migration.md): `etcdctl
//! make-mirror` of the override resources from a stock etcd into ephd and
//! back, while writes go on at the source; the destination ends up with
//! every key and value of the mirrored prefix and nothing else. (The
//! guide's snapshot path is `etcd_snapshot.rs`.)

use crate::harness::{connect_client, Ephd, Server, StockEtcd};
use etcd_client::{Client, GetOptions};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LEASES: &str = "/registry/leases/";

/// A running `etcdctl make-mirror`, ended when dropped.
struct Mirror(Child);

impl Mirror {
    /// The guide's command: mirror `LEASES` from `source` to `dest`.
    fn start(source: &str, dest: &str) -> Mirror {
        let strip = |e: &str| e.trim_start_matches("http://").to_string();
        let child = Command::new(crate::cli::etcdctl_path())
            .arg(format!("--endpoints={}", strip(source)))
            .args(["make-mirror", &format!("--prefix={LEASES}")])
            .arg(strip(dest))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn etcdctl make-mirror");
        Mirror(child)
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn under(c: &mut Client, prefix: &str) -> Vec<(String, String)> {
    c.get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Writes lease objects (and another resource) at `source`, mirrors,
/// writes more while the mirror runs, and waits until `dest` has the same
/// lease objects.
async fn mirror_and_compare(source: &str, dest: &str) {
    let mut src = connect_client(source).await;
    let mut dst = connect_client(dest).await;
    for i in 0..50 {
        src.put(format!("{LEASES}kube-node-lease/node-{i}"), "v0", None)
            .await
            .unwrap();
    }
    src.put("/registry/pods/default/p", "not mirrored", None)
        .await
        .unwrap();
    let _mirror = Mirror::start(source, dest);
    // Renewals, a new lease and a deletion while it runs.
    for round in 1..=3 {
        for i in 0..50 {
            src.put(
                format!("{LEASES}kube-node-lease/node-{i}"),
                format!("v{round}"),
                None,
            )
            .await
            .unwrap();
        }
    }
    src.put(
        format!("{LEASES}kube-system/kube-scheduler"),
        "holder",
        None,
    )
    .await
    .unwrap();
    src.delete(format!("{LEASES}kube-node-lease/node-7"), None)
        .await
        .unwrap();
    let want = under(&mut src, LEASES).await;
    assert_eq!(want.len(), 50);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = under(&mut dst, LEASES).await;
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the mirror never caught up: {} of {} keys",
            got.len(),
            want.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        under(&mut dst, "/registry/pods/").await.is_empty(),
        "only the mirrored prefix"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_mirror_moves_the_override_resources_from_etcd_to_ephd() {
    let etcd = StockEtcd::start();
    let ephd = Ephd::start(&[]);
    mirror_and_compare(&etcd.endpoint(), &ephd.endpoint()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_mirror_moves_them_back_from_ephd_to_etcd() {
    let ephd = Ephd::start(&[]);
    let etcd = StockEtcd::start();
    mirror_and_compare(&ephd.endpoint(), &etcd.endpoint()).await;
}
