//! Real clients of the HTTP side of the client port: the curl recipes of
//! etcd's documentation, the etcd3gw library from PyPI, etcdctl's
//! `check datascale` (which reads /metrics there), and TLS with ALPN.

use super::{curl, post, Answer};
use crate::harness::Server;
use crate::support::ephd;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The lines a streaming POST answers within `secs` seconds (curl stops
/// at its time limit; a stream that ends sooner returns sooner).
pub(crate) fn stream_lines(url: &str, body: &str, secs: u32) -> Vec<String> {
    let out = Command::new("curl")
        .args([
            "-s",
            "-N",
            "--max-time",
            &secs.to_string(),
            "-X",
            "POST",
            url,
            "-d",
            body,
        ])
        .output()
        .expect("curl must be installed");
    String::from_utf8(out.stdout)
        .expect("UTF-8")
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// A streaming POST whose lines arrive on the returned channel as they are
/// written; the curl process is killed when the guard drops.
struct Streaming {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl Streaming {
    fn start(url: &str, body: &str) -> Streaming {
        let mut child = Command::new("curl")
            .args(["-s", "-N", "-X", "POST", url, "-d", body])
            .stdout(Stdio::piped())
            .spawn()
            .expect("curl must be installed");
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Streaming { child, lines }
    }

    fn next(&self) -> serde_json::Value {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(10))
            .expect("a stream line within 10 s");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn health_version_and_metrics_answer_on_the_client_port_beside_grpc() {
    let server = ephd(&[]);
    let base = server.endpoint();
    let health = curl(&[&format!("{base}/health")]);
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["health"], "true");
    let version = curl(&[&format!("{base}/version")]).json();
    assert!(
        version["etcdserver"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.")),
        "{version}"
    );
    for probe in ["/livez", "/readyz"] {
        let answer = curl(&[&format!("{base}{probe}")]);
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (200, "ok"),
            "{probe}"
        );
    }
    let metrics = curl(&[&format!("{base}/metrics")]);
    assert_eq!(metrics.status, 200);
    assert!(
        metrics.body.contains("etcd_server_has_leader 1"),
        "{}",
        metrics.body
    );
    // gRPC on the same port, and the gateway sees its writes.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut client = server.client().await;
        client.put("from-grpc", "1", None).await.expect("gRPC put");
    });
    let range = post(&base, "/v3/kv/range", r#"{"key":"ZnJvbS1ncnBj"}"#).json();
    assert_eq!(range["kvs"][0]["value"], "MQ==", "{range}");
    // JSON over HTTP/2 (prior knowledge) is routed to the gateway too.
    let h2 = curl(&[
        "--http2-prior-knowledge",
        "-X",
        "POST",
        &format!("{base}/v3/kv/range"),
        "-d",
        r#"{"key":"ZnJvbS1ncnBj"}"#,
    ]);
    assert_eq!(h2.json()["count"], "1", "{h2:?}");
}

#[test]
fn curl_recipes_from_etcds_documentation_work() {
    let server = ephd(&[]);
    let base = server.endpoint();
    // Put and range with base64 keys and values.
    let put = post(&base, "/v3/kv/put", r#"{"key": "Zm9v", "value": "YmFy"}"#);
    assert_eq!(put.status, 200, "{put:?}");
    let range = post(&base, "/v3/kv/range", r#"{"key": "Zm9v"}"#).json();
    assert_eq!(range["kvs"][0]["key"], "Zm9v");
    assert_eq!(range["kvs"][0]["value"], "YmFy");
    assert_eq!(range["count"], "1");
    // Prefix range (`foo` to `fop`).
    let prefix = post(
        &base,
        "/v3/kv/range",
        r#"{"key": "Zm9v", "range_end": "Zm9w"}"#,
    )
    .json();
    assert_eq!(prefix["count"], "1");
    // Watch: the stream stays open and delivers a later put.
    let watch = Streaming::start(
        &format!("{base}/v3/watch"),
        r#"{"create_request": {"key":"Zm9v"} }"#,
    );
    let created = watch.next();
    assert_eq!(created["result"]["created"], true, "{created}");
    post(&base, "/v3/kv/put", r#"{"key": "Zm9v", "value": "YmF6"}"#);
    let event = watch.next();
    assert_eq!(
        event["result"]["events"][0]["kv"]["value"], "YmF6",
        "{event}"
    );
    // The watch ends with the client's connection: no stream is left over.
    let streams = || {
        let metrics = curl(&[&format!("{base}/metrics")]).body;
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watch_stream_total "))
            .map(str::to_string)
    };
    assert_eq!(streams().as_deref(), Some("1"));
    drop(watch);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while streams().as_deref() != Some("0") {
        assert!(
            std::time::Instant::now() < deadline,
            "the gateway's watch stream outlived its client"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Malformed JSON: a clear 400 with etcd's error body, nothing written.
    let bad = post(&base, "/v3/kv/put", r#"{"key": "Zm9v", "value": "#);
    assert_eq!(bad.status, 400, "{bad:?}");
    assert_eq!(bad.json()["code"], 3, "{bad:?}");
    // An unknown enum name is ignored (the field keeps its default), as
    // etcd 3.6's gateway reads JSON: this compare is "version = 0", false
    // for the existing key, so the put does not run.
    let unknown_enum = post(
        &base,
        "/v3/kv/txn",
        r#"{"compare":[{"target":"NOPE","key":"Zm9v"}],"success":[{"request_put":{"key":"Zm9v","value":"eA=="}}]}"#,
    );
    assert_eq!(unknown_enum.status, 200, "{unknown_enum:?}");
    assert!(
        unknown_enum.json().get("succeeded").is_none(),
        "{unknown_enum:?}"
    );
    let after = post(&base, "/v3/kv/range", r#"{"key": "Zm9v"}"#).json();
    assert_eq!(after["kvs"][0]["value"], "YmF6", "{after}");
    // Transaction: compare the value, then put.
    let txn = post(
        &base,
        "/v3/kv/txn",
        r#"{"compare":[{"target":"VALUE","result":"EQUAL","key":"Zm9v","value":"YmF6"}],"success":[{"requestPut":{"key":"Zm9v","value":"YmFy"}}]}"#,
    )
    .json();
    assert_eq!(txn["succeeded"], true, "{txn}");
    // Lease grant, then keepalive, which answers the granted TTL.
    let grant = post(&base, "/v3/lease/grant", r#"{"TTL": 30}"#).json();
    let id = grant["ID"].as_str().expect("ID as a string").to_string();
    assert_eq!(grant["TTL"], "30");
    let keepalive = post(&base, "/v3/lease/keepalive", &format!(r#"{{"ID":{id}}}"#));
    let line: serde_json::Value = serde_json::from_str(keepalive.body.trim()).unwrap();
    assert_eq!(line["result"]["ID"], id.as_str());
    assert_eq!(line["result"]["TTL"], "30");
    let ttl = post(
        &base,
        "/v3/lease/timetolive",
        &format!(r#"{{"ID":{id},"keys":true}}"#),
    )
    .json();
    assert_eq!(ttl["grantedTTL"], "30", "{ttl}");
    // Each message of the body is one keepalive.
    let twice = stream_lines(
        &format!("{base}/v3/lease/keepalive"),
        &format!(r#"{{"ID":"{id}"}} {{"ID":"{id}"}}"#),
        5,
    );
    assert_eq!(twice.len(), 2, "{twice:?}");
}

/// The virtualenv scripts/install-etcd3gw.sh installs etcd3gw into.
fn etcd3gw_python() -> PathBuf {
    let venv = std::env::var_os("EPHD_ETCD3GW_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/ephd/etcd3gw-venv")
        });
    let python = venv.join("bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run scripts/install-etcd3gw.sh (scripts/test.sh does)",
        python.display()
    );
    python
}

#[test]
fn etcd3gw_from_pypi_works_against_ephd() {
    let python = etcd3gw_python();
    let server = ephd(&[]);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/it/gateway/etcd3gw_client.py"
    );
    let out = Command::new(python)
        .arg(script)
        .arg("127.0.0.1")
        .arg(server.port().to_string())
        .output()
        .expect("run the etcd3gw script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("etcd3gw: all ok"),
        "etcd3gw failed:\n{stdout}\n{}\nephd log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.logs()
    );
}

#[test]
fn etcdctl_check_datascale_reads_metrics_on_the_client_port() {
    let server = ephd(&[]);
    let out = Command::new(crate::references::etcdctl())
        .args([
            "--endpoints",
            &server.endpoint(),
            "check",
            "datascale",
            "--load=s",
        ])
        .output()
        .expect("etcdctl must be installed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("PASS"),
        "check datascale failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn lock_election_and_auth_routes_reach_their_grpc_services() {
    let server = ephd(&[]);
    let base = server.endpoint();
    // Whatever each service answers, the answer is the gRPC call's: JSON,
    // either a message or etcd's error body, never the 404 of an unmapped
    // path.
    for (path, body) in [
        ("/v3/lock/lock", r#"{"name":"bG9jaw=="}"#),
        ("/v3/lock/unlock", r#"{"key":"bG9jaw=="}"#),
        ("/v3/election/leader", r#"{"name":"ZWxlY3Q="}"#),
        ("/v3/election/resign", r#"{}"#),
        ("/v3/auth/authenticate", r#"{"name":"root","password":"x"}"#),
        ("/v3/auth/user/list", r#"{}"#),
        ("/v3beta/auth/role/list", r#"{}"#),
    ] {
        let answer: Answer = post(&base, path, body);
        assert_ne!(answer.status, 404, "{path}: {answer:?}");
        let json = answer.json();
        if answer.status != 200 {
            assert!(
                json["code"].is_number() && json["message"].is_string(),
                "{path}: {json}"
            );
        }
    }
}

#[test]
fn tls_serves_http1_and_json_over_http2_beside_grpc() {
    let dir = tempfile::tempdir().unwrap();
    crate::tls::make_certs(dir.path());
    let (_ephd, port) = crate::tls::start_tls_ephd(dir.path(), crate::tls::ClientCerts::NotAsked);
    let base = format!("https://127.0.0.1:{port}");
    let ca = dir.path().join("ca.crt");
    let ca = ca.to_str().unwrap();
    let health = curl(&["--cacert", ca, "--http1.1", &format!("{base}/health")]);
    assert_eq!(health.json()["health"], "true", "{health:?}");
    // curl's default offers h2 and http/1.1; JSON over h2 is served too.
    let put = curl(&[
        "--cacert",
        ca,
        "-X",
        "POST",
        &format!("{base}/v3/kv/put"),
        "-d",
        r#"{"key":"dGxz","value":"MQ=="}"#,
    ]);
    assert_eq!(put.status, 200, "{put:?}");
    let range = curl(&[
        "--cacert",
        ca,
        "--http1.1",
        "-X",
        "POST",
        &format!("{base}/v3/kv/range"),
        "-d",
        r#"{"key":"dGxz"}"#,
    ]);
    assert_eq!(range.json()["kvs"][0]["value"], "MQ==", "{range:?}");
    // gRPC over the same TLS port still works.
    let out = Command::new(crate::references::etcdctl())
        .args([
            "--endpoints",
            &base,
            "--cacert",
            ca,
            "get",
            "tls",
            "--print-value-only",
        ])
        .output()
        .expect("etcdctl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1\n", "{out:?}");
}
