//! The space quota over the wire, side by side with stock etcd: the same
//! etcdctl session against both, from the write that does not fit to the
//! disarmed alarm.

use crate::cli::run;
use crate::harness::{Server, StockEtcd};
use crate::support;

/// Runs `etcdctl ARGS` and renders its outcome with member IDs, revisions
/// and counts that legitimately differ between servers masked.
/// etcdctl's own JSON log lines (with timestamps and client IDs) are left
/// out; its `Error:` line carries the server's message.
fn ctl(endpoint: &str, args: &[&str]) -> String {
    ctl_in(endpoint, args, None)
}

fn ctl_in(endpoint: &str, args: &[&str], stdin: Option<&str>) -> String {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = run(endpoint, &args, stdin);
    let text = format!("{}{}", out.stdout, out.stderr);
    let masked: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with('{'))
        // etcdctl 3.6 says how long a defragmentation took.
        .map(|l| l.split(" took ").next().unwrap_or(l))
        .map(|l| {
            l.split_whitespace()
                .map(|w| {
                    if let Some(id) = w.strip_prefix("memberID:") {
                        assert!(id.parse::<u64>().is_ok(), "member ID in {l:?}");
                        "memberID:ID".to_string()
                    } else if w.starts_with("member[127.0.0.1:") {
                        "member[ENDPOINT]".to_string()
                    } else if w.chars().all(|c| c.is_ascii_digit()) {
                        "N".to_string()
                    } else {
                        w.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    format!("{:?} {}", out.code, masked.join(" | "))
}

/// The session: fill until the quota refuses a put, then check what still
/// works, free space, defragment, disarm, and write again.
fn session(endpoint: &str) -> Vec<String> {
    let value = "v".repeat(20_000);
    let mut out = Vec::new();
    let mut fitted = 0;
    loop {
        let r = ctl(endpoint, &["put", &format!("/fill/{fitted:04}"), &value]);
        if !r.starts_with("Some(0) OK") {
            out.push(format!("refused put: {r}"));
            break;
        }
        fitted += 1;
        assert!(fitted < 1000, "the quota never refused a put");
    }
    assert!(fitted >= 5, "only {fitted} puts fitted");
    for step in [
        &["alarm", "list"][..],
        &["put", "small", "v"],
        &["lease", "grant", "60"],
        &[
            "get",
            "/fill/0000",
            "--print-value-only=false",
            "--keys-only",
        ],
        &["del", "/fill/", "--prefix"],
    ] {
        out.push(format!("{step:?}: {}", ctl(endpoint, step)));
    }
    // A txn that puts in its success branch takes space; one that only
    // deletes does not.
    for ops in ["\nput small v\n\n\n", "\ndel small\n\n\n"] {
        out.push(format!(
            "txn {ops:?}: {}",
            ctl_in(endpoint, &["txn", "--interactive=false"], Some(ops))
        ));
    }
    // Compact at the current revision (etcdctl needs a number).
    let status = run(
        endpoint,
        &[
            "endpoint".into(),
            "status".into(),
            "-w".into(),
            "json".into(),
        ],
        None,
    );
    let rev: i64 = status
        .stdout
        .split("\"revision\":")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no revision in {status:?}"));
    out.push(format!(
        "compact: {}",
        ctl(endpoint, &["compact", &rev.to_string()])
    ));
    for step in [
        &["defrag"][..],
        &["alarm", "disarm"],
        &["alarm", "list"],
        &["put", "small", "v"],
    ] {
        out.push(format!("{step:?}: {}", ctl(endpoint, step)));
    }
    out
}

#[test]
fn quota_refuses_writes_and_alarms_like_stock_etcd() {
    // About 2 MB for each: etcd counts its bbolt file, ephd its accounted
    // memory; the number of puts that fit differs, what follows must not.
    let etcd = StockEtcd::start_with(&["--quota-backend-bytes", "2000000"]);
    let ephd = support::ephd(&["--quota-backend-bytes", "2000000"]);
    let want = session(&etcd.endpoint());
    let got = session(&ephd.endpoint());
    assert!(
        want[0].contains("database space exceeded"),
        "etcd's refusal: {want:?}"
    );
    assert_eq!(got, want);
}

/// Puts values of `size` bytes under keys `/registry/events/ns/ev-N`
/// through 8 concurrent clients until the quota refuses one; returns how
/// many were acknowledged.
async fn admitted(endpoint: &str, size: usize) -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let value = vec![b'v'; size];
    let next = std::sync::Arc::new(AtomicUsize::new(0));
    let acked = std::sync::Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut c = crate::harness::connect_client(endpoint).await;
        let (value, next, acked) = (value.clone(), next.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                assert!(n < 1_000_000, "the quota never refused a put");
                let key = format!("/registry/events/ns/ev-{n:08}");
                match c.put(key, value.clone(), None).await {
                    Ok(_) => {
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) if e.to_string().contains("database space exceeded") => return,
                    Err(e) => panic!("put {n}: {e}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
    acked.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_quota_admits_about_as_many_revisions_as_in_etcd() {
    // etcd counts its bbolt file, ephd the same measure estimated per
    // version (src/mvcc/backend_size.rs): within 25% for small, medium and
    // large values.
    const QUOTA: &str = "8388608";
    let mut report = Vec::new();
    for size in [100, 1024, 10 * 1024] {
        let etcd = StockEtcd::start_with(&["--quota-backend-bytes", QUOTA]);
        let want = admitted(&etcd.endpoint(), size).await;
        drop(etcd);
        let ephd = support::ephd(&["--quota-backend-bytes", QUOTA]);
        let got = admitted(&ephd.endpoint(), size).await;
        report.push(format!("{size} B values: etcd {want}, ephd {got}"));
        let ratio = got as f64 / want as f64;
        assert!(
            (0.75..=1.25).contains(&ratio),
            "{QUOTA} bytes: {} (ratio {ratio:.2})",
            report.join("; ")
        );
    }
    eprintln!("{}", report.join("; "));
}
