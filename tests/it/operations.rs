//! Operator-facing behaviour: auto-compaction, and the HTTP endpoints that
//! probes and Prometheus use.

use crate::harness::{free_port, Ephd, Server};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// Plain HTTP/1.1 GET with a bounded wait; returns (status line, body).
pub(crate) fn http_get(port: u16, path: &str) -> (String, String) {
    let mut stream =
        std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to the metrics port");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let status = text.lines().next().unwrap_or_default().to_string();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn periodic_auto_compaction_compacts_old_history() {
    let ephd = Ephd::start(&[
        "--revision-continuity=false",
        "--auto-compaction-mode",
        "periodic",
        "--auto-compaction-retention",
        "1s",
    ]);
    let mut client = ephd.client().await;
    let first = client
        .put("k", "v1", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    client.put("k", "v2", None).await.unwrap();
    // Keep writing so later samples move past `first`; the revision from one
    // retention ago is compacted within a few seconds.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        client.put("tick", "x", None).await.unwrap();
        let old = client
            .get(
                "k",
                Some(etcd_client::GetOptions::new().with_revision(first)),
            )
            .await;
        if let Err(e) = old {
            assert!(
                e.to_string()
                    .contains("required revision has been compacted"),
                "unexpected error: {e}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "history was never auto-compacted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The newest version survives compaction.
    let now = client.get("k", None).await.unwrap();
    assert_eq!(now.kvs()[0].value(), b"v2");
}

#[tokio::test]
async fn health_version_and_metrics_endpoints() {
    let metrics_port = free_port();
    let url = format!("http://127.0.0.1:{metrics_port}");
    let ephd = Ephd::start(&["--listen-metrics-urls", &url]);
    let mut client = ephd.client().await;
    client.put("a", "1", None).await.unwrap();
    client.get("a", None).await.unwrap();

    let (status, body) = http_get(metrics_port, "/health");
    assert!(status.contains("200"), "{status}");
    assert_eq!(body.trim(), r#"{"health":"true","reason":""}"#);
    for probe in ["/livez", "/readyz"] {
        let (status, _) = http_get(metrics_port, probe);
        assert!(status.contains("200"), "{probe}: {status}");
    }
    let (_, version) = http_get(metrics_port, "/version");
    assert!(version.contains(r#""etcdserver":"3.6.5""#), "{version}");

    let (status, metrics) = http_get(metrics_port, "/metrics");
    assert!(status.contains("200"), "{status}");
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("metric {name} missing:\n{metrics}"))
    };
    assert!(value("etcd_mvcc_put_total") >= 1.0);
    assert!(value("etcd_mvcc_range_total") >= 1.0);
    assert_eq!(value("etcd_server_has_leader"), 1.0);
    assert!(value("etcd_debugging_mvcc_keys_total") >= 1.0);
    assert!(value("etcd_mvcc_db_total_size_in_bytes") > 0.0);
    assert!(value("etcd_debugging_mvcc_current_revision") > 1.0);
}

/// CPU seconds (user + system) a process has used, from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc stat");
    // Fields after the command name, which is in parentheses.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0 // USER_HZ is 100 on Linux
}

/// With its file descriptors used up, ephd backs off instead of spinning on
/// accept errors, says why in its log (once, not per attempt), and serves
/// again once descriptors are freed.
#[tokio::test]
async fn accept_backs_off_when_file_descriptors_run_out() {
    let ephd = Ephd::start_with_nofile(64, &[]);
    let pid = ephd.pid();
    // Every accepted connection costs ephd a descriptor; the rest queue up
    // in the listen backlog, where each accept attempt fails.
    let held: Vec<std::net::TcpStream> = (0..120)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", ephd.port())).expect("connect"))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ephd.logs().contains("cannot accept client connections") {
        assert!(Instant::now() < deadline, "no warning:\n{}", ephd.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = cpu_seconds(pid);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = cpu_seconds(pid) - before;
    assert!(
        used < 0.5,
        "ephd used {used:.2} s of CPU in 2 s while it could not accept (a spinning loop uses ~2 s)"
    );
    let warnings = ephd
        .logs()
        .matches("cannot accept client connections")
        .count();
    assert!(warnings <= 2, "rate-limited warning, got {warnings}");

    drop(held);
    let endpoint = ephd.endpoint();
    crate::support::within_for(
        Duration::from_secs(15),
        "a put once descriptors are free",
        async {
            let mut c = crate::harness::connect_client(&endpoint).await;
            c.put("after", "ok", None).await.expect("put");
        },
    )
    .await;
    assert!(ephd.logs().contains("accepting client connections again"));
}

/// Raises or clears `alarm` for the member `client` is connected to, as
/// `etcdctl alarm` does.
async fn set_alarm(
    client: &mut etcd_client::Client,
    action: etcd_client::AlarmAction,
    alarm: etcd_client::AlarmType,
) {
    let member = client.status().await.unwrap().header().unwrap().member_id();
    let mut opts = etcd_client::AlarmOptions::new();
    opts.with_member(member);
    client.alarm(action, alarm, Some(opts)).await.unwrap();
}

/// `/health` follows the alarms: unhealthy (503, etcd's reason) while
/// NOSPACE is raised, healthy with `?exclude=NOSPACE`, and healthy again
/// once the alarm is cleared, as on etcd 3.5+.
#[tokio::test]
async fn health_reports_raised_alarms() {
    use etcd_client::{AlarmAction, AlarmType};
    let metrics_port = free_port();
    let url = format!("http://127.0.0.1:{metrics_port}");
    let ephd = Ephd::start(&["--listen-metrics-urls", &url]);
    let mut client = ephd.client().await;
    set_alarm(&mut client, AlarmAction::Activate, AlarmType::Nospace).await;
    let (status, body) = http_get(metrics_port, "/health");
    assert!(status.contains("503"), "{status}");
    assert_eq!(
        body.trim(),
        r#"{"health":"false","reason":"ALARM NOSPACE"}"#
    );
    let (status, _) = http_get(metrics_port, "/health?exclude=NOSPACE");
    assert!(status.contains("200"), "{status}");
    set_alarm(&mut client, AlarmAction::Deactivate, AlarmType::Nospace).await;
    let (status, body) = http_get(metrics_port, "/health");
    assert!(status.contains("200"), "{status}");
    assert_eq!(body.trim(), r#"{"health":"true","reason":""}"#);
}

/// Every startup and liveness probe in `deploy/` (and the image's
/// HEALTHCHECK) passes while NOSPACE is raised: a full store must stay up
/// to be compacted and disarmed, so a probe that restarted it would keep it
/// down (kubeadm's etcd manifest excludes NOSPACE for the same reason).
#[tokio::test]
async fn the_deploy_probes_pass_while_nospace_is_raised() {
    use etcd_client::{AlarmAction, AlarmType};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = Vec::new();
    let mut files = vec![root.join("deploy")];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            for doc in yaml_rust2::YamlLoader::load_from_str(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            {
                probe_paths(&doc, &mut paths);
            }
        }
    }
    let script = std::fs::read_to_string(root.join("deploy/docker/healthcheck.sh")).unwrap();
    let default = script
        .split("EPHD_HEALTHCHECK_PATH:-")
        .nth(1)
        .and_then(|rest| rest.split('}').next())
        .expect("healthcheck.sh names its default path");
    paths.push(default.to_string());
    paths.sort();
    paths.dedup();
    // The single member's and the cluster member's startup paths, /livez.
    assert!(paths.len() >= 3, "{paths:?}");

    let metrics_port = free_port();
    let url = format!("http://127.0.0.1:{metrics_port}");
    let ephd = Ephd::start(&["--listen-metrics-urls", &url]);
    let mut client = ephd.client().await;
    set_alarm(&mut client, AlarmAction::Activate, AlarmType::Nospace).await;
    assert!(http_get(metrics_port, "/health").0.contains("503"));
    for path in &paths {
        let (status, body) = http_get(metrics_port, path);
        assert!(status.contains("200"), "{path}: {status} {body}");
    }
}

/// The `httpGet.path` of every `startupProbe` and `livenessProbe` in `doc`.
fn probe_paths(doc: &yaml_rust2::Yaml, out: &mut Vec<String>) {
    use yaml_rust2::Yaml;
    match doc {
        Yaml::Hash(map) => {
            for (key, value) in map {
                if matches!(key.as_str(), Some("startupProbe" | "livenessProbe")) {
                    let path = value["httpGet"]["path"].as_str();
                    out.push(path.expect("an httpGet probe").to_string());
                }
                probe_paths(value, out);
            }
        }
        Yaml::Array(items) => items.iter().for_each(|item| probe_paths(item, out)),
        _ => {}
    }
}

/// `/livez` checks only ephd's own process, `/readyz` also refuses while
/// the CORRUPT alarm is raised (as etcd 3.6 names its checks), and the gRPC
/// health service agrees with `/readyz`: NOT_SERVING while it fails,
/// SERVING again once the alarm is cleared.
#[tokio::test]
async fn readiness_follows_the_corrupt_alarm_and_grpc_health_agrees() {
    use etcd_client::{AlarmAction, AlarmType};
    use tonic_health::pb::{
        health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
    };
    let metrics_port = free_port();
    let url = format!("http://127.0.0.1:{metrics_port}");
    let ephd = Ephd::start(&["--listen-metrics-urls", &url]);
    let endpoint = ephd.endpoint();
    let grpc_status = || async {
        let channel = crate::harness::connect_channel(&endpoint).await;
        HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health check")
            .into_inner()
            .status
    };
    let wait_for = |want: ServingStatus| async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = grpc_status().await;
            if got == want as i32 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "gRPC health stayed {got}, want {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };

    let (status, body) = http_get(metrics_port, "/readyz?verbose");
    assert!(status.contains("200"), "{status}");
    for check in ["data_corruption", "serializable_read", "linearizable_read"] {
        assert!(body.contains(&format!("[+]{check} ok")), "{body}");
    }
    let (_, body) = http_get(metrics_port, "/livez");
    assert_eq!(body.trim(), "ok");
    wait_for(ServingStatus::Serving).await;

    let mut client = ephd.client().await;
    set_alarm(&mut client, AlarmAction::Activate, AlarmType::Corrupt).await;
    let (status, body) = http_get(metrics_port, "/readyz");
    assert!(status.contains("503"), "{status}");
    assert!(
        body.contains("[-]data_corruption failed: the CORRUPT alarm is raised"),
        "{body}"
    );
    assert!(body.contains("readyz check failed"), "{body}");
    let (status, _) = http_get(metrics_port, "/readyz?exclude=data_corruption");
    assert!(status.contains("200"), "{status}");
    let (status, body) = http_get(metrics_port, "/livez");
    assert!(
        status.contains("200"),
        "liveness ignores alarms: {status} {body}"
    );
    wait_for(ServingStatus::NotServing).await;

    set_alarm(&mut client, AlarmAction::Deactivate, AlarmType::Corrupt).await;
    let (status, _) = http_get(metrics_port, "/readyz");
    assert!(status.contains("200"), "{status}");
    wait_for(ServingStatus::Serving).await;
}

/// `grpc.health.v1.Health/List` as grpc-go reads it.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthListResponse {
    #[prost(map = "string, message", tag = "1")]
    statuses: std::collections::HashMap<String, tonic_health::pb::HealthCheckResponse>,
}

/// `grpc.health.v1.Health/List` (served by etcd 3.6's grpc-go, not by
/// tonic-health): the same statuses from ephd and etcd. (The bytes differ
/// harmlessly: Go writes a map entry's empty key, prost leaves it out.)
#[test]
fn grpc_health_list_answers_as_stock_etcd() {
    use crate::authority::raw_h2::{self, Outcome};
    use crate::authority::{field, grpc_fields, grpc_message};
    use prost::Message;
    let etcd = crate::harness::StockEtcd::start();
    let ours = Ephd::start(&[]);
    let list = |port: u16| {
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let authority = addr.to_string();
        let fields = grpc_fields("/grpc.health.v1.Health/List", &authority);
        match raw_h2::exchange(addr, &fields, &grpc_message(&[])) {
            Outcome::Answered { body, trailers, .. } => {
                let status = field(&trailers, "grpc-status").map(str::to_string);
                let message = body.get(5..).map(HealthListResponse::decode);
                (status, message.map(|m| m.expect("a HealthListResponse")))
            }
            other => panic!("List on port {port}: {other:?}"),
        }
    };
    let want = list(etcd.port());
    assert_eq!(want.0.as_deref(), Some("0"), "etcd: {want:?}");
    assert!(
        want.1.as_ref().is_some_and(|m| !m.statuses.is_empty()),
        "etcd lists no status: {want:?}"
    );
    assert_eq!(list(ours.port()), want);
}
