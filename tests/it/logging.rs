//! Logs as the real binary writes them to a pipe (the harness reads
//! ephd's stdout and stderr through pipes): `--logger=zap` lines are JSON
//! objects with etcd's field names, the startup line carries the versions
//! and the effective configuration, rejected and shed requests produce one
//! rate-limited WARN line each, and text lines carry no terminal colours.

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{kv_client::KvClient, PutRequest, RangeRequest};
use futures::future::join_all;
use serde_json::Value;

use crate::harness::{connect_channel, Ephd, Server};
use crate::support::within;

/// Every line ephd logged, each parsed as one JSON object.
fn json_lines(ephd: &Ephd) -> Vec<Value> {
    let logs = ephd.logs();
    logs.lines()
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(v) if v.is_object() => v,
            other => panic!("not a JSON object: {l:?} ({other:?}) in\n{logs}"),
        })
        .collect()
}

/// The lines whose `msg` starts with `msg`.
fn with_msg(lines: &[Value], msg: &str) -> Vec<Value> {
    lines
        .iter()
        .filter(|l| l["msg"].as_str().is_some_and(|m| m.starts_with(msg)))
        .cloned()
        .collect()
}

/// Waits (bounded) until ephd has logged `n` lines whose `msg` starts with
/// `msg`, then a little longer so a line too many would show, and returns
/// them.
async fn wait_for(ephd: &Ephd, msg: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while with_msg(&json_lines(ephd), msg).len() < n {
        assert!(
            Instant::now() < deadline,
            "fewer than {n} {msg:?} lines:\n{}",
            ephd.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    with_msg(&json_lines(ephd), msg)
}

#[test]
fn the_startup_line_is_json_with_the_versions_and_the_configuration() {
    let ephd = Ephd::start(&[
        "--logger=zap",
        "--name=logging-node",
        "--max-txn-ops=77",
        "--snapshot-interval=45s",
        "--key-file=/etc/ephd/not-read.key",
    ]);
    let lines = json_lines(&ephd);
    let first = &lines[0];
    assert_eq!(first["msg"], "starting ephd", "the first line: {first}");
    assert_eq!(first["level"], "info");
    assert!(
        first["ts"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{first}"
    );
    assert!(
        first["caller"].as_str().is_some_and(|c| c.contains(".rs:")),
        "{first}"
    );
    assert_eq!(first["ephd-version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(first["etcd-version"], ephd::api::ETCD_VERSION);
    let config = &first["config"];
    assert_eq!(config["name"], "logging-node");
    assert_eq!(config["max-txn-ops"], 77);
    assert_eq!(config["snapshot-interval"], "45s");
    assert_eq!(config["logger"], "zap");
    assert_eq!(config["listen-client-urls"][0], ephd.endpoint());
    assert_eq!(config["experimental-warning-apply-duration"], "100ms");
    // A key file's path is shown, never its contents (it is not even read
    // without an https:// listener).
    assert_eq!(config["key-file"], "/etc/ephd/not-read.key");
    // The other lines are JSON too, with etcd's keys.
    let serving = with_msg(&lines, "serving etcd v3 gRPC");
    assert_eq!(serving.len(), 1, "{}", ephd.logs());
    for key in ["level", "ts", "caller", "msg"] {
        assert!(serving[0].get(key).is_some(), "{key} in {}", serving[0]);
    }
}

/// A rejected request logs one WARN line with what an operator needs; the
/// next ones within the period are held back and counted in the next line.
#[tokio::test]
async fn rejected_requests_log_one_warn_line_per_period() {
    let ephd = Ephd::start(&["--logger=zap", "--max-request-bytes=1024"]);
    let mut kv = KvClient::new(connect_channel(&ephd.endpoint()).await);
    let too_large = || PutRequest {
        key: b"big".to_vec().into(),
        value: vec![b'x'; 4096].into(),
        ..Default::default()
    };
    for _ in 0..3 {
        let err = within("put", kv.put(too_large())).await.unwrap_err();
        assert_eq!(err.message(), "etcdserver: request is too large");
    }
    let lines = wait_for(&ephd, "request rejected", 1).await;
    assert_eq!(lines.len(), 1, "{}", ephd.logs());
    let w = &lines[0];
    assert_eq!(w["level"], "warn");
    assert_eq!(w["method"], "/etcdserverpb.KV/Put");
    assert_eq!(w["code"], "InvalidArgument");
    assert_eq!(w["error"], "etcdserver: request is too large");
    assert!(
        w["remote"]
            .as_str()
            .is_some_and(|r| r.starts_with("127.0.0.1:")),
        "{w}"
    );
    assert!(w["took"].as_str().is_some_and(|t| t.ends_with('s')), "{w}");
    assert_eq!(w["suppressed"], 0);

    // After the period, the next rejection is logged with the two held back.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let err = within("put", kv.put(too_large())).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let lines = wait_for(&ephd, "request rejected", 2).await;
    assert_eq!(lines.len(), 2, "{}", ephd.logs());
    assert_eq!(lines[1]["suppressed"], 2, "{}", lines[1]);
}

/// Lists shed under overload log one WARN line, however many are shed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shed_requests_log_one_warn_line() {
    let ephd = Ephd::start(&[
        "--max-response-bytes-in-flight",
        "1024",
        "--overload-queue-timeout",
        "1ms",
    ]);
    let endpoint = ephd.endpoint();
    let mut c = KvClient::new(connect_channel(&endpoint).await);
    for i in 0..200 {
        c.put(PutRequest {
            key: format!("/list/{i:04}").into_bytes().into(),
            value: vec![b'v'; 4096].into(),
            ..Default::default()
        })
        .await
        .expect("preload");
    }
    let list = RangeRequest {
        key: b"/list/".to_vec().into(),
        range_end: b"/list0".to_vec().into(),
        ..Default::default()
    };
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(
            KvClient::new(connect_channel(&endpoint).await).max_decoding_message_size(usize::MAX),
        );
    }
    let results = within(
        "lists",
        join_all((0..24).map(|i| {
            let mut c = clients[i % 4].clone();
            let list = list.clone();
            async move { c.range(list).await }
        })),
    )
    .await;
    let shed = results
        .iter()
        .filter(|r| {
            r.as_ref()
                .is_err_and(|s| s.message() == "etcdserver: too many requests")
        })
        .count();
    assert!(shed > 1, "lists were shed: {shed}");
    let lines = wait_for(&ephd, "request shed", 1).await;
    assert_eq!(lines.len(), 1, "{shed} shed:\n{}", ephd.logs());
    assert_eq!(lines[0]["method"], "/etcdserverpb.KV/Range");
    assert_eq!(lines[0]["code"], "ResourceExhausted");
    assert_eq!(lines[0]["error"], "etcdserver: too many requests");
    assert_eq!(lines[0]["level"], "warn");
}

/// Text lines to a pipe (as under systemd, docker or kubectl logs) carry no
/// ESC byte, WARN lines included; JSON lines neither.
#[tokio::test]
async fn logs_to_a_pipe_carry_no_escape_codes() {
    for logger in ["--logger=capnslog", "--logger=zap"] {
        let ephd = Ephd::start(&[logger, "--max-request-bytes=1024"]);
        let mut c = ephd.client().await;
        c.put("k", "v", None).await.expect("put");
        let big = "x".repeat(4096);
        c.put("big", big, None).await.expect_err("too large");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ephd.logs().contains("request rejected") {
            assert!(Instant::now() < deadline, "no warning:\n{}", ephd.logs());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let logs = ephd.logs();
        assert!(!logs.contains('\x1b'), "{logger}: ESC in\n{logs:?}");
        if logger == "--logger=capnslog" {
            assert!(logs.contains(" WARN ") && logs.contains(" INFO "), "{logs}");
            assert!(logs.lines().all(|l| !l.starts_with('{')), "{logs}");
        } else {
            json_lines(&ephd);
        }
    }
}
