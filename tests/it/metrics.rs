//! etcd's metrics on ephd's /metrics: the gRPC server metrics under
//! go-grpc-prometheus' exact names and labels (compared with stock etcd's
//! own /metrics), and etcd's alert rules (from etcd's `contrib/mixin`)
//! evaluated against real scrapes with Prometheus' own rule tester,
//! `promtool test rules`, including the failed-request alert firing when
//! requests fail.

use crate::harness::{free_port, Ephd, Server, StockEtcd};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::Command;

/// One scrape: series (name with its labels, as written) to value, and
/// each metric family's type.
struct Scrape {
    values: BTreeMap<String, f64>,
    types: HashMap<String, String>,
}

fn parse(text: &str) -> Scrape {
    let mut values = BTreeMap::new();
    let mut types = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE line");
            types.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample line");
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("value in {line}"));
        values.insert(series.to_string(), value);
    }
    Scrape { values, types }
}

/// GETs /metrics over HTTP/1.0, so neither server answers chunked.
fn scrape(port: u16) -> Scrape {
    parse(&scrape_text(port))
}

/// The body of `GET /metrics` on `port` (HTTP/1.0, so neither ephd nor
/// etcd answers chunked); panics unless the answer is 200.
pub(crate) fn scrape_text(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("HTTP response");
    assert!(
        head.lines().next().unwrap_or_default().contains("200"),
        "{head}"
    );
    body.to_string()
}

/// The metric name of a series, and its family (histogram samples belong
/// to the family without `_bucket`/`_sum`/`_count`).
fn family<'a>(series: &'a str, types: &HashMap<String, String>) -> (&'a str, String) {
    let name = series.split('{').next().unwrap_or(series);
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if types.get(base).is_some_and(|t| t == "histogram") {
                return (name, "counter".to_string());
            }
        }
    }
    (
        name,
        types.get(name).cloned().unwrap_or_else(|| "untyped".into()),
    )
}

/// `promtool` must be there: this test never skips silently.
fn promtool() -> &'static str {
    match Command::new("promtool").arg("--version").output() {
        Ok(out) if out.status.success() => "promtool",
        _ => panic!(
            "promtool not found: run scripts/test.sh, which installs it \
             (scripts/install-promtool.sh, Debian package `prometheus`)"
        ),
    }
}

/// Has promtool evaluate the alert rules in `rule_files` over a timeline
/// in which every series of one real scrape (`text`) holds its value for
/// `minutes` (with the labels a Prometheus scrape adds, and `up` 1), and
/// asserts that at the end exactly `firing` alerts fire among `checked`,
/// each with the `severity` given.
pub(crate) fn assert_alerts_on_steady_scrape(
    text: &str,
    rule_files: &[&str],
    minutes: usize,
    checked: &[&str],
    firing: &[(&str, &str)],
) {
    let promtool = promtool();
    let scrape = parse(text);
    let files: String = rule_files.iter().map(|f| format!("  - '{f}'\n")).collect();
    let mut test = format!(
        "rule_files:\n{files}evaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n"
    );
    let steady = |series: &str, value: f64| {
        let labelled = scraped(series);
        format!("      - series: '{labelled}'\n        values: '{value}+0x{minutes}'\n")
    };
    for (series, &value) in &scrape.values {
        test.push_str(&steady(series, value));
    }
    test.push_str(&steady("up", 1.0));
    test.push_str("    alert_rule_test:\n");
    for alert in checked {
        test.push_str(&format!(
            "      - eval_time: {minutes}m\n        alertname: {alert}\n        exp_alerts:"
        ));
        match firing.iter().find(|(name, _)| name == alert) {
            Some((_, severity)) => {
                test.push_str(&format!(
                    "\n          - exp_labels: {{severity: {severity}, job: etcd, instance: ephd}}\n"
                ));
                let annotations = annotations_of(rule_files, alert);
                if !annotations.is_empty() {
                    test.push_str(&format!("            exp_annotations: {{{annotations}}}\n"));
                }
            }
            None => test.push_str(" []\n"),
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("alerts-test.yml");
    std::fs::write(&path, &test).unwrap();
    let out = Command::new(promtool)
        .args(["test", "rules"])
        .arg(&path)
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool test rules failed:\n{}\n{}\n{test}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The annotations of `alert` in `rule_files` as they read when it fires
/// on the series of [`assert_alerts_on_steady_scrape`] (`$labels.instance`
/// is `ephd`), written as the inside of a YAML flow mapping.
fn annotations_of(rule_files: &[&str], alert: &str) -> String {
    use yaml_rust2::YamlLoader;
    for file in rule_files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
        let docs = YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        for group in docs[0]["groups"].as_vec().into_iter().flatten() {
            for rule in group["rules"].as_vec().into_iter().flatten() {
                if rule["alert"].as_str() != Some(alert) {
                    continue;
                }
                let mut out = Vec::new();
                for (k, v) in rule["annotations"].as_hash().into_iter().flatten() {
                    let text = v
                        .as_str()
                        .unwrap_or_default()
                        .replace("{{ $labels.instance }}", "ephd");
                    out.push(format!(
                        "{}: {}",
                        k.as_str().unwrap_or_default(),
                        serde_json::Value::String(text)
                    ));
                }
                return out.join(", ");
            }
        }
    }
    String::new()
}

/// `series` with the labels a Prometheus scrape adds (`job`, `instance`).
fn scraped(series: &str) -> String {
    match series.split_once('{') {
        Some((name, rest)) => format!("{name}{{job=\"etcd\",instance=\"ephd\",{rest}"),
        None => format!("{series}{{job=\"etcd\",instance=\"ephd\"}}"),
    }
}

/// Minutes of each phase in the synthetic timeline given to promtool.
const HEALTHY_MINUTES: usize = 20;
const FAILING_MINUTES: usize = 25;

/// Turns three real scrapes (at start, after healthy traffic, after
/// failing traffic) into promtool `input_series`, one sample a minute: a
/// counter grows each minute of a phase by what it grew in that phase of
/// the real run, so rates in the timeline have the real run's ratios; a
/// gauge holds the value scraped at the end of the phase. Every series gets
/// the labels a Prometheus scrape would add (`job`, `instance`), and `up` is
/// added as Prometheus records it for a successful scrape.
fn input_series(start: &Scrape, healthy: &Scrape, failing: &Scrape) -> String {
    let mut out = String::from("    input_series:\n");
    let mut push = |series: &str, values: Vec<f64>| {
        let labelled = scraped(series);
        let values: Vec<String> = values.iter().map(|v| format!("{v}")).collect();
        out.push_str(&format!(
            "      - series: '{labelled}'\n        values: '{}'\n",
            values.join(" ")
        ));
    };
    for (series, &end) in &failing.values {
        let (_, kind) = family(series, &failing.types);
        let s0 = start.values.get(series).copied().unwrap_or(0.0);
        let mid = healthy.values.get(series).copied().unwrap_or(s0);
        let mut values = Vec::new();
        for t in 0..HEALTHY_MINUTES + FAILING_MINUTES {
            values.push(if kind == "counter" {
                if t < HEALTHY_MINUTES {
                    s0 + (mid - s0) * t as f64
                } else {
                    s0 + (mid - s0) * HEALTHY_MINUTES as f64
                        + (end - mid) * (t - HEALTHY_MINUTES) as f64
                }
            } else if t < HEALTHY_MINUTES {
                mid
            } else {
                end
            });
        }
        push(series, values);
    }
    push("up", vec![1.0; HEALTHY_MINUTES + FAILING_MINUTES]);
    out
}

/// Whether a unary request (Defragment aside, as in the alert) took over
/// 100 ms between two scrapes.
fn slow_requests(before: &Scrape, after: &Scrape) -> bool {
    after.values.iter().any(|(series, &n)| {
        if !series.starts_with("grpc_server_handling_seconds_bucket{")
            || !series.contains("grpc_type=\"unary\"")
            || series.contains("Defragment")
            || !series.contains("le=\"+Inf\"")
        {
            return false;
        }
        let fast = series.replace("le=\"+Inf\"", "le=\"0.1\"");
        let delta = |s: &str| {
            after.values.get(s).copied().unwrap_or(0.0)
                - before.values.get(s).copied().unwrap_or(0.0)
        };
        n > 0.0 && delta(series) > delta(&fast)
    })
}

/// `name` is `expected` in `scrape`.
fn assert_value(scrape: &Scrape, series: &str, expected: f64) {
    let got = scrape.values.get(series).copied();
    assert_eq!(got, Some(expected), "{series}");
}

fn labels(kind: &str, service: &str, method: &str) -> String {
    format!("grpc_method=\"{method}\",grpc_service=\"{service}\",grpc_type=\"{kind}\"")
}

fn handled(kind: &str, service: &str, method: &str, code: &str) -> String {
    format!(
        "grpc_server_handled_total{{grpc_code=\"{code}\",{}}}",
        labels(kind, service, method)
    )
}

/// Drives real requests, healthy then failing, scrapes /metrics after
/// each phase, checks the gRPC counters against the requests made, then
/// has promtool evaluate etcd's alert rules over the scrapes: nothing fires
/// while requests succeed (failures etcd does not count as failures, such
/// as reads of compacted revisions and bad input, included), and
/// etcdHighNumberOfFailedGRPCRequests fires, warning and critical, for Put
/// once puts fail with ResourceExhausted.
#[tokio::test]
async fn etcd_alert_rules_evaluate_on_ephds_metrics() {
    let promtool = promtool();
    let metrics_port = free_port();
    let url = format!("http://127.0.0.1:{metrics_port}");
    // A small request limit, so an oversized put fails as grpc-go fails it.
    let ephd = Ephd::start(&[
        "--listen-metrics-urls",
        &url,
        "--max-request-bytes",
        "1024",
        "--revision-continuity=false",
    ]);
    let start = scrape(metrics_port);
    let mut client = ephd.client().await;

    // Healthy phase: puts, reads, a watch stream, lease keep-alives, and
    // errors that etcd's alert does not count (OutOfRange, InvalidArgument).
    for i in 0..20 {
        client.put(format!("k{i}"), "v", None).await.unwrap();
        client.get(format!("k{i}"), None).await.unwrap();
    }
    let mut watch = client.watch("k", None).await.unwrap();
    let id = watch.message().await.unwrap().unwrap().watch_id(); // created
    client.put("k", "1", None).await.unwrap();
    watch.message().await.unwrap().unwrap(); // the put
    watch.cancel(id).await.unwrap();
    watch.message().await.unwrap().unwrap(); // canceled
    drop(watch);
    let lease = client.lease_grant(60, None).await.unwrap().id();
    let (mut keeper, mut acks) = client.lease_keep_alive(lease).await.unwrap();
    for _ in 0..3 {
        keeper.keep_alive().await.unwrap();
        acks.message().await.unwrap().unwrap();
    }
    drop(keeper);
    drop(acks);
    let rev = client
        .put("k", "2", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    client.compact(rev, None).await.unwrap();
    let compacted = client
        .get("k", Some(etcd_client::GetOptions::new().with_revision(1)))
        .await
        .unwrap_err();
    assert!(compacted.to_string().contains("compacted"), "{compacted}");
    let empty_key = client.put("", "v", None).await.unwrap_err();
    assert!(
        empty_key.to_string().contains("key is not provided"),
        "{empty_key}"
    );
    // Streams are handled once the server has seen them end.
    let kv = "etcdserverpb.KV";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let healthy = loop {
        let s = scrape(metrics_port);
        let ended = |service: &str, method: &str| -> f64 {
            let of = format!("grpc_method=\"{method}\",grpc_service=\"{service}\"");
            s.values
                .iter()
                .filter(|(k, _)| k.starts_with("grpc_server_handled_total{") && k.contains(&of))
                .map(|(_, v)| v)
                .sum()
        };
        if ended("etcdserverpb.Watch", "Watch") >= 1.0
            && ended("etcdserverpb.Lease", "LeaseKeepAlive") >= 1.0
        {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "streams never counted as handled:\n{:#?}",
            s.values
                .iter()
                .filter(|(k, v)| k.starts_with("grpc_server_") && **v > 0.0)
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let unary = |m: &str| labels("unary", kv, m);
    assert_value(
        &healthy,
        &format!("grpc_server_started_total{{{}}}", unary("Put")),
        23.0,
    );
    assert_value(&healthy, &handled("unary", kv, "Put", "OK"), 22.0);
    assert_value(
        &healthy,
        &handled("unary", kv, "Put", "InvalidArgument"),
        1.0,
    );
    assert_value(&healthy, &handled("unary", kv, "Range", "OutOfRange"), 1.0);
    // A unary call that fails counts its message as sent too, as etcd 3.6
    // counts it.
    assert_value(
        &healthy,
        &format!("grpc_server_msg_received_total{{{}}}", unary("Put")),
        23.0,
    );
    assert_value(
        &healthy,
        &format!("grpc_server_msg_sent_total{{{}}}", unary("Put")),
        23.0,
    );
    let keepalive = labels("bidi_stream", "etcdserverpb.Lease", "LeaseKeepAlive");
    assert_value(
        &healthy,
        &format!("grpc_server_started_total{{{keepalive}}}"),
        1.0,
    );
    // etcd_client sends one keep-alive when it opens the stream.
    assert_value(
        &healthy,
        &format!("grpc_server_msg_received_total{{{keepalive}}}"),
        4.0,
    );
    assert_value(
        &healthy,
        &format!("grpc_server_msg_sent_total{{{keepalive}}}"),
        4.0,
    );
    let watch = labels("bidi_stream", "etcdserverpb.Watch", "Watch");
    assert_value(
        &healthy,
        &format!("grpc_server_started_total{{{watch}}}"),
        1.0,
    );
    assert_value(
        &healthy,
        &format!("grpc_server_msg_received_total{{{watch}}}"),
        2.0,
    );
    assert_value(
        &healthy,
        &format!("grpc_server_msg_sent_total{{{watch}}}"),
        3.0,
    );
    assert_value(
        &healthy,
        &format!("grpc_server_handling_seconds_count{{{}}}", unary("Put")),
        23.0,
    );
    assert!(healthy.values["etcd_network_client_grpc_received_bytes_total"] > 0.0);
    assert!(healthy.values["etcd_network_client_grpc_sent_bytes_total"] > 0.0);
    // 22 puts, the lease grant and the compaction; keep-alives are no
    // proposals in etcd either.
    assert_value(&healthy, "etcd_server_proposals_committed_total", 24.0);
    assert_value(&healthy, "etcd_server_leader_changes_seen_total", 1.0);
    assert_value(
        &healthy,
        "etcd_server_version{server_version=\"3.6.5\"}",
        1.0,
    );

    // Failing phase: half the puts are larger than the server takes.
    let big = "x".repeat(600 * 1024);
    for i in 0..10 {
        client.put(format!("f{i}"), "v", None).await.unwrap();
        let err = client
            .put(format!("f{i}"), big.as_str(), None)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("received message larger than max"),
            "{err}"
        );
    }
    let failing = scrape(metrics_port);
    assert_value(
        &failing,
        &handled("unary", kv, "Put", "ResourceExhausted"),
        10.0,
    );

    let dir = tempfile::tempdir().unwrap();
    let rules = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/it/metrics/etcd-alerts.yml"
    );
    let mut test = format!(
        "rule_files:\n  - '{rules}'\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n{}",
        input_series(&start, &healthy, &failing)
    );
    test.push_str("    alert_rule_test:\n");
    let every_alert = [
        "etcdMembersDown",
        "etcdInsufficientMembers",
        "etcdNoLeader",
        "etcdHighNumberOfLeaderChanges",
        "etcdHighNumberOfFailedGRPCRequests",
        "etcdGRPCRequestsSlow",
        "etcdMemberCommunicationSlow",
        "etcdHighNumberOfFailedProposals",
        "etcdHighFsyncDurations",
        "etcdHighCommitDurations",
        "etcdDatabaseQuotaLowSpace",
        "etcdExcessiveDatabaseGrowth",
        "etcdDatabaseHighFragmentationRatio",
    ];
    let end = format!("{}m", HEALTHY_MINUTES + FAILING_MINUTES - 1);
    // etcdGRPCRequestsSlow rightly fires if a real request of this run took
    // over 100 ms (a very loaded test machine); then it is not asserted for
    // that phase, rather than the test failing on the machine's speed.
    let slow = [
        slow_requests(&start, &healthy),
        slow_requests(&healthy, &failing),
    ];
    for alert in every_alert {
        if alert == "etcdGRPCRequestsSlow" && (slow[0] || slow[1]) {
            eprintln!("a request took over 100 ms; not asserting {alert}");
            continue;
        }
        // Quiet while requests succeed...
        test.push_str(&format!(
            "      - eval_time: {}m\n        alertname: {alert}\n        exp_alerts: []\n",
            HEALTHY_MINUTES - 1
        ));
        // ...and only the failed-request alert fires once puts fail.
        if alert == "etcdHighNumberOfFailedGRPCRequests" {
            test.push_str(&format!(
                "      - eval_time: {end}\n        alertname: {alert}\n        exp_alerts:\n"
            ));
            for severity in ["warning", "critical"] {
                test.push_str(&format!(
                    "          - exp_labels: {{severity: {severity}, job: etcd, instance: ephd, \
                     grpc_service: etcdserverpb.KV, grpc_method: Put}}\n"
                ));
            }
        } else {
            test.push_str(&format!(
                "      - eval_time: {end}\n        alertname: {alert}\n        exp_alerts: []\n"
            ));
        }
    }
    let path = dir.path().join("etcd-alerts-test.yml");
    std::fs::write(&path, &test).unwrap();
    let out = Command::new(promtool)
        .args(["test", "rules"])
        .arg(&path)
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool test rules failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The alert rules are valid as promtool reads them.
    let check = Command::new(promtool)
        .args(["check", "rules", rules])
        .output()
        .expect("run promtool");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
}

/// Every gRPC metric series stock etcd serves for its services (names,
/// types, label sets, histogram buckets) is served by ephd too, and the
/// same requests count the same on both.
#[tokio::test]
async fn grpc_metrics_have_stock_etcds_names_and_labels() {
    let etcd = StockEtcd::start_with(&["--metrics", "extensive"]);
    let metrics_port = free_port();
    let ephd = Ephd::start(&[
        "--listen-metrics-urls",
        &format!("http://127.0.0.1:{metrics_port}"),
    ]);
    let mut scrapes = Vec::new();
    for (server, port) in [
        (&etcd as &dyn Endpoint, etcd.port()),
        (&ephd as &dyn Endpoint, metrics_port),
    ] {
        let mut client = crate::harness::connect_client(&server.url()).await;
        client.put("a", "1", None).await.unwrap();
        client.get("a", None).await.unwrap();
        client
            .get(
                "a",
                Some(etcd_client::GetOptions::new().with_revision(1_000)),
            )
            .await
            .unwrap_err();
        client.lease_grant(10, None).await.unwrap();
        scrapes.push(scrape(port));
    }
    let (theirs, ours) = (&scrapes[0], &scrapes[1]);
    let grpc = |s: &Scrape| -> BTreeSet<String> {
        s.values
            .keys()
            .filter(|k| k.starts_with("grpc_server_"))
            .cloned()
            .collect()
    };
    let missing: Vec<_> = grpc(theirs).difference(&grpc(ours)).cloned().collect();
    assert!(
        missing.is_empty(),
        "served by etcd, not by ephd: {missing:#?}"
    );
    for name in [
        "grpc_server_started_total",
        "grpc_server_handled_total",
        "grpc_server_handling_seconds",
        "grpc_server_msg_received_total",
        "grpc_server_msg_sent_total",
        "etcd_network_client_grpc_received_bytes_total",
        "etcd_network_client_grpc_sent_bytes_total",
        "etcd_server_proposals_committed_total",
        "etcd_server_proposals_applied_total",
        "etcd_server_proposals_pending",
        "etcd_server_proposals_failed_total",
        "etcd_server_leader_changes_seen_total",
        "etcd_server_quota_backend_bytes",
        "etcd_server_version",
        "etcd_server_has_leader",
    ] {
        assert_eq!(
            ours.types.get(name),
            theirs.types.get(name),
            "type of {name}"
        );
    }
    for series in [
        format!(
            "grpc_server_started_total{{{}}}",
            labels("unary", "etcdserverpb.KV", "Range")
        ),
        handled("unary", "etcdserverpb.KV", "Range", "OK"),
        handled("unary", "etcdserverpb.KV", "Range", "OutOfRange"),
        handled("unary", "etcdserverpb.KV", "Put", "OK"),
        handled("unary", "etcdserverpb.Lease", "LeaseGrant", "OK"),
        format!(
            "grpc_server_msg_sent_total{{{}}}",
            labels("unary", "etcdserverpb.KV", "Range")
        ),
        format!(
            "grpc_server_msg_received_total{{{}}}",
            labels("unary", "etcdserverpb.KV", "Range")
        ),
        // Same requests, same messages: the same client traffic.
        "etcd_network_client_grpc_received_bytes_total".to_string(),
    ] {
        assert_eq!(
            ours.values.get(&series),
            theirs.values.get(&series),
            "{series}"
        );
    }
}

/// A server's client URL, for both kinds of server in one loop.
trait Endpoint {
    fn url(&self) -> String;
}

impl<T: Server> Endpoint for T {
    fn url(&self) -> String {
        self.endpoint()
    }
}
