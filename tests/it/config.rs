//! etcd's configuration surface (issue #11, item 7): the real ephd binary
//! started from an etcd env file, from etcd's YAML configuration file and
//! with kubeadm's etcd static-pod flags serves etcdctl and logs one warning
//! per etcd flag it ignores; a flag setting something ephd does not
//! implement, and a cluster of other members, are refused. The env file and
//! the configuration file are also given to stock etcd, which must read
//! them the same way (same member name, same request size limit).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cli;
use crate::harness::free_port;
use crate::tls::make_certs;

/// How long a server may take to listen, or a refused one to exit.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// A server process killed when dropped; its stdout and stderr go to `log`.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Spawns `cmd` with a clean environment plus `env`, logging to `log`.
    fn spawn(mut cmd: Command, env: &[(String, String)], log: &Path) -> Proc {
        let out = File::create(log).expect("create log file");
        let err = out.try_clone().expect("clone log file");
        cmd.env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        Proc {
            child,
            log: log.to_path_buf(),
        }
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `port` accepts connections; panics with the log if the
    /// process exits or never listens.
    fn wait_listening(&mut self, port: u16) {
        let deadline = Instant::now() + START_TIMEOUT;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("server exited with {status}:\n{}", self.logs());
            }
            assert!(
                Instant::now() < deadline,
                "server never listened on {port}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the process to exit by itself; panics (after killing it)
    /// if it keeps running.
    fn wait_exit(&mut self) -> i32 {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code().unwrap_or(-1);
            }
            if Instant::now() > deadline {
                panic!("server did not exit (it should refuse):\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("----- server log -----\n{}\n-----", self.logs());
        }
    }
}

fn ephd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ephd"))
}

/// etcd 3.4: these cases compare ephd's log lines with 3.4's text logs.
fn etcd() -> Command {
    Command::new(crate::references::debian_etcd_34())
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Runs etcdctl until a put succeeds (a fresh etcd may still be electing
/// itself), then checks get, the member name and the request size limit.
fn check_serves(endpoint: &str, member: &str, max_request_bytes: usize) {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let put = cli::run(endpoint, &strings(&["put", "cfg-key", "cfg-value"]), None);
        if put.code == Some(0) {
            break;
        }
        assert!(Instant::now() < deadline, "put never succeeded: {put:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let get = cli::run(endpoint, &strings(&["get", "cfg-key"]), None);
    assert_eq!(get.stdout, "cfg-key\ncfg-value\n", "{get:?}");
    let members = cli::run(endpoint, &strings(&["member", "list"]), None);
    assert!(
        members.stdout.contains(&format!(", {member}, ")),
        "{members:?}"
    );
    let big = "x".repeat(max_request_bytes + 1);
    let too_big = cli::run(endpoint, &["put".into(), "big".into(), big], None);
    assert!(
        too_big.stderr.contains("etcdserver: request is too large"),
        "{too_big:?}"
    );
}

/// An etcd env file's variables for a single member listening on
/// `client`/`peer`, with data in `data`.
fn env_file(client: u16, peer: u16, data: &Path) -> Vec<(String, String)> {
    let c = format!("http://127.0.0.1:{client}");
    let p = format!("http://127.0.0.1:{peer}");
    [
        ("ETCD_NAME", "envnode".to_string()),
        ("ETCD_DATA_DIR", data.display().to_string()),
        ("ETCD_LISTEN_CLIENT_URLS", c.clone()),
        ("ETCD_ADVERTISE_CLIENT_URLS", c),
        ("ETCD_LISTEN_PEER_URLS", p.clone()),
        ("ETCD_INITIAL_ADVERTISE_PEER_URLS", p.clone()),
        ("ETCD_INITIAL_CLUSTER", format!("envnode={p}")),
        ("ETCD_INITIAL_CLUSTER_STATE", "new".into()),
        ("ETCD_INITIAL_CLUSTER_TOKEN", "cfg-test".into()),
        ("ETCD_SNAPSHOT_COUNT", "10000".into()),
        ("ETCD_HEARTBEAT_INTERVAL", "100".into()),
        ("ETCD_ELECTION_TIMEOUT", "1000".into()),
        ("ETCD_MAX_REQUEST_BYTES", "4096".into()),
        ("ETCD_LOGGER", "zap".into()),
        ("ETCD_LOG_OUTPUTS", "stderr".into()),
        ("ETCD_NOT_A_FLAG", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

#[test]
fn an_etcd_env_file_configures_ephd_as_it_configures_etcd() {
    let dir = tempfile::tempdir().unwrap();
    for (server, name) in [(etcd(), "etcd"), (ephd(), "ephd")] {
        let (client, peer) = (free_port(), free_port());
        let data = dir.path().join(format!("{name}-data"));
        let env = env_file(client, peer, &data);
        let mut p = Proc::spawn(server, &env, &dir.path().join(format!("{name}.log")));
        p.wait_listening(client);
        check_serves(&format!("http://127.0.0.1:{client}"), "envnode", 4096);
        let logs = p.logs();
        assert!(
            logs.contains("unrecognized environment variable ETCD_NOT_A_FLAG=1"),
            "{name}: {logs}"
        );
        if name == "ephd" {
            for expected in [
                "recognized and used environment variable ETCD_NAME=envnode",
                "flag --snapshot-count is accepted for etcd compatibility and ignored: ",
                "flag --heartbeat-interval is accepted for etcd compatibility and ignored: ",
                "flag --listen-peer-urls is accepted for etcd compatibility and ignored: ",
                "flag --initial-cluster is accepted for etcd compatibility and ignored: ",
                "recognized and used environment variable ETCD_LOGGER=zap",
            ] {
                assert!(logs.contains(expected), "missing {expected:?} in\n{logs}");
            }
            assert!(data.is_dir(), "ETCD_DATA_DIR was not used");
        }
    }
}

#[test]
fn ephd_env_names_keep_working_and_must_agree_with_etcd_ones() {
    let dir = tempfile::tempdir().unwrap();
    let client = free_port();
    let url = format!("http://127.0.0.1:{client}");
    let env = |vars: &[(&str, &str)]| -> Vec<(String, String)> {
        vars.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let mut p = Proc::spawn(
        ephd(),
        &env(&[
            ("EPHD_NAME", "ephdname"),
            ("EPHD_LISTEN_CLIENT_URLS", &url),
            ("ETCD_MAX_REQUEST_BYTES", "2048"),
        ]),
        &dir.path().join("ok.log"),
    );
    p.wait_listening(client);
    check_serves(&url, "ephdname", 2048);
    drop(p);

    let mut p = Proc::spawn(
        ephd(),
        &env(&[("EPHD_NAME", "a"), ("ETCD_NAME", "b")]),
        &dir.path().join("conflict.log"),
    );
    assert_eq!(p.wait_exit(), 2);
    assert!(
        p.logs()
            .contains("conflicting environment variables ETCD_NAME=b and EPHD_NAME=a"),
        "{}",
        p.logs()
    );
}

#[test]
fn a_flag_and_its_etcd_env_var_together_are_refused_as_by_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let env = vec![("ETCD_NAME".to_string(), "from-env".to_string())];
    let shadowed =
        "conflicting environment variable \"ETCD_NAME\" is shadowed by corresponding command-line flag";
    for (mut server, name) in [(etcd(), "etcd"), (ephd(), "ephd")] {
        server.args(["--name", "from-flag"]);
        let mut p = Proc::spawn(server, &env, &dir.path().join(format!("{name}.log")));
        assert_ne!(p.wait_exit(), 0, "{name}");
        assert!(p.logs().contains(shadowed), "{name}: {}", p.logs());
    }
}

/// etcd's YAML configuration for a single member, in etcd 3.4's own value
/// types (durations in nanoseconds, URL lists as comma-separated strings).
fn yaml_file(client: u16, peer: u16, data: &Path) -> String {
    format!(
        "# etcd.conf.yml\n\
         name: 'yamlnode'\n\
         data-dir: {data}\n\
         wal-dir:\n\
         snapshot-count: 10000\n\
         heartbeat-interval: 100\n\
         election-timeout: 1000\n\
         quota-backend-bytes: 0\n\
         max-request-bytes: 3000\n\
         listen-peer-urls: http://127.0.0.1:{peer}\n\
         listen-client-urls: http://127.0.0.1:{client}\n\
         initial-advertise-peer-urls: http://127.0.0.1:{peer}\n\
         advertise-client-urls: http://127.0.0.1:{client}\n\
         initial-cluster: yamlnode=http://127.0.0.1:{peer}\n\
         initial-cluster-token: 'etcd-cluster'\n\
         initial-cluster-state: 'new'\n\
         strict-reconfig-check: false\n\
         enable-pprof: false\n\
         proxy: 'off'\n\
         experimental-watch-progress-notify-interval: 5000000000\n\
         client-transport-security:\n\
         \x20 cert-file:\n\
         \x20 key-file:\n\
         \x20 client-cert-auth: false\n\
         \x20 trusted-ca-file:\n\
         \x20 auto-tls: false\n\
         peer-transport-security:\n\
         \x20 client-cert-auth: false\n\
         \x20 auto-tls: false\n\
         log-level: info\n\
         logger: zap\n\
         log-outputs: [stderr]\n\
         force-new-cluster: false\n\
         auto-compaction-mode: periodic\n\
         auto-compaction-retention: \"1\"\n",
        data = data.display()
    )
}

#[test]
fn an_etcd_config_file_configures_ephd_as_it_configures_etcd() {
    let dir = tempfile::tempdir().unwrap();
    for (mut server, name) in [(etcd(), "etcd"), (ephd(), "ephd")] {
        let (client, peer) = (free_port(), free_port());
        let data = dir.path().join(format!("{name}-data"));
        let file = dir.path().join(format!("{name}.conf.yml"));
        std::fs::write(&file, yaml_file(client, peer, &data)).unwrap();
        // With a configuration file, other flags and ETCD_* are ignored.
        server
            .arg("--config-file")
            .arg(&file)
            .args(["--name=ignored-flag", "--max-request-bytes=99999"]);
        let env = vec![("ETCD_NAME".to_string(), "ignored-env".to_string())];
        let mut p = Proc::spawn(server, &env, &dir.path().join(format!("{name}.log")));
        p.wait_listening(client);
        check_serves(&format!("http://127.0.0.1:{client}"), "yamlnode", 3000);
        if name == "ephd" {
            let logs = p.logs();
            for expected in [
                "loading server configuration from",
                "other configuration command line flags and environment variables are ignored",
                "flag --snapshot-count is accepted for etcd compatibility and ignored: ",
                "flag --peer-client-cert-auth is accepted for etcd compatibility and ignored: ",
                "flag --initial-cluster is accepted for etcd compatibility and ignored: ",
            ] {
                assert!(logs.contains(expected), "missing {expected:?} in\n{logs}");
            }
        }
    }
}

/// etcdctl over TLS with the client certificate.
fn etcdctl_tls(dir: &Path, port: u16, args: &[&str]) -> std::process::Output {
    Command::new(crate::references::etcdctl())
        .arg(format!("--endpoints=https://127.0.0.1:{port}"))
        .arg(format!("--cacert={}", dir.join("ca.crt").display()))
        .arg(format!("--cert={}", dir.join("client.crt").display()))
        .arg(format!("--key={}", dir.join("client.key").display()))
        .args(["--dial-timeout=3s", "--command-timeout=3s"])
        .args(args)
        .output()
        .expect("etcdctl must be installed (scripts/test.sh installs it)")
}

/// One HTTP/1.1 GET, returning the whole response.
fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// kubeadm's etcd manifest flags (v1.29+), with this test's ports and files.
fn kubeadm_flags(d: &Path, client: u16, peer: u16, metrics: u16) -> Vec<String> {
    let file = |n: &str| d.join(n).display().to_string();
    vec![
        format!("--advertise-client-urls=https://127.0.0.1:{client}"),
        format!("--cert-file={}", file("server.crt")),
        "--client-cert-auth=true".into(),
        format!("--data-dir={}", file(&format!("data-{client}"))),
        "--experimental-initial-corrupt-check=true".into(),
        "--experimental-watch-progress-notify-interval=5s".into(),
        format!("--initial-advertise-peer-urls=https://127.0.0.1:{peer}"),
        format!("--initial-cluster=node1=https://127.0.0.1:{peer}"),
        format!("--key-file={}", file("server.key")),
        format!("--listen-client-urls=https://127.0.0.1:{client}"),
        format!("--listen-metrics-urls=http://127.0.0.1:{metrics}"),
        format!("--listen-peer-urls=https://127.0.0.1:{peer}"),
        "--name=node1".into(),
        format!("--peer-cert-file={}", file("server.crt")),
        "--peer-client-cert-auth=true".into(),
        format!("--peer-key-file={}", file("server.key")),
        format!("--peer-trusted-ca-file={}", file("ca.crt")),
        "--snapshot-count=10000".into(),
        format!("--trusted-ca-file={}", file("ca.crt")),
    ]
}

#[test]
fn kubeadm_etcd_static_pod_flags_serve_over_tls_as_on_etcd() {
    serve_kubeadm_flags(|flags| flags);
}

/// Older manifests and systemd units write etcd's flags as Go's flag
/// package also reads them: one dash, the value after `=` or as the next
/// argument. Both servers start from the same command line.
#[test]
fn kubeadm_flags_with_single_dashes_serve_as_on_etcd() {
    serve_kubeadm_flags(|flags| {
        flags
            .into_iter()
            .enumerate()
            .flat_map(|(i, flag)| {
                let flag = flag.strip_prefix("--").unwrap().to_string();
                // A boolean flag takes no separate value in Go.
                match flag.split_once('=') {
                    Some((name, value)) if i % 2 == 0 && value != "true" => {
                        vec![format!("-{name}"), value.to_string()]
                    }
                    _ => vec![format!("-{flag}")],
                }
            })
            .collect()
    });
}

/// Starts etcd and ephd with kubeadm's etcd flags, as `rewrite` writes
/// them, and checks that both serve etcdctl over TLS; ephd must report each
/// etcd flag it ignores once and no other.
fn serve_kubeadm_flags(rewrite: fn(Vec<String>) -> Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_certs(d);
    for (mut server, name) in [(etcd(), "etcd"), (ephd(), "ephd")] {
        let (client, peer, metrics) = (free_port(), free_port(), free_port());
        server.args(rewrite(kubeadm_flags(d, client, peer, metrics)));
        let mut p = Proc::spawn(server, &[], &d.join(format!("{name}.log")));
        p.wait_listening(client);
        p.wait_listening(metrics);

        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let put = etcdctl_tls(d, client, &["put", "/registry/events/x", "v"]);
            if put.status.success() {
                break;
            }
            assert!(Instant::now() < deadline, "{name}: {put:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let get = etcdctl_tls(
            d,
            client,
            &["get", "/registry/events/x", "--print-value-only"],
        );
        assert_eq!(
            String::from_utf8_lossy(&get.stdout),
            "v\n",
            "{name}: {get:?}"
        );
        let members = etcdctl_tls(d, client, &["member", "list"]);
        assert!(
            String::from_utf8_lossy(&members.stdout).contains(", node1, "),
            "{name}: {members:?}"
        );
        let health = http_get(metrics, "/health");
        assert!(health.starts_with("HTTP/1.1 200"), "{name}: {health}");
        if name == "etcd" {
            continue;
        }

        let logs = p.logs();
        let ignored = [
            "experimental-initial-corrupt-check",
            "initial-advertise-peer-urls",
            "initial-cluster",
            "listen-peer-urls",
            "peer-cert-file",
            "peer-client-cert-auth",
            "peer-key-file",
            "peer-trusted-ca-file",
            "snapshot-count",
        ];
        for flag in ignored {
            let line = format!("flag --{flag} is accepted for etcd compatibility and ignored: ");
            assert_eq!(logs.matches(&line).count(), 1, "{line:?} in\n{logs}");
        }
        assert_eq!(
            logs.matches("accepted for etcd compatibility and ignored")
                .count(),
            ignored.len(),
            "implemented flags must not be reported as ignored:\n{logs}"
        );
    }
}

/// Starts ephd with `args` and expects it to refuse them: exit code 2 and
/// `message` on stderr.
fn assert_refused(args: &[&str], message: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = ephd();
    cmd.arg(format!(
        "--listen-client-urls=http://127.0.0.1:{}",
        free_port()
    ))
    .args(args);
    let mut p = Proc::spawn(cmd, &[], &dir.path().join("ephd.log"));
    assert_eq!(p.wait_exit(), 2, "{args:?}:\n{}", p.logs());
    let logs = p.logs();
    assert!(logs.contains(message), "{args:?}: {logs}");
}

#[test]
fn limits_ephd_does_not_implement_are_refused() {
    assert_refused(
        &["--grpc-keepalive-min-time=10s"],
        "ephd: flag --grpc-keepalive-min-time=10s is refused: ephd's HTTP/2 server does not \
         enforce a minimum client ping interval",
    );
    assert_refused(
        &["--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"],
        "ephd: flag --cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 is refused: ",
    );
}

#[test]
fn a_cluster_configuration_is_checked_as_etcd_checks_it() {
    // With other members named, cluster mode reads the clustering flags:
    // this member's advertised peer URLs (etcd's default
    // http://localhost:2380) must be the ones --initial-cluster gives it.
    assert_refused(
        &[
            "--name=infra0",
            "--initial-cluster=infra0=http://10.0.1.10:2380,infra1=http://10.0.1.11:2380,infra2=http://10.0.1.12:2380",
            "--initial-cluster-state=new",
        ],
        "--initial-cluster has infra0=http://10.0.1.10:2380 but missing from \
         --initial-advertise-peer-urls=http://localhost:2380",
    );
    assert_refused(
        &[
            "--name=infra0",
            "--initial-cluster=infra0=http://10.0.1.10:2380,infra1=http://10.0.1.11:2380",
            "--initial-advertise-peer-urls=http://10.0.1.10:2380",
            "--force-new-cluster=true",
            "--initial-cluster-state=existing",
        ],
        "--force-new-cluster starts a new one-member cluster: it cannot be combined with \
         --initial-cluster-state existing",
    );
    assert_refused(
        &["--discovery=https://discovery.etcd.io/3e86b59982e49066c5d813af1c2e2579cbf573de"],
        "flag --discovery=https://discovery.etcd.io/3e86b59982e49066c5d813af1c2e2579cbf573de \
         is refused: ephd's cluster mode bootstraps from --initial-cluster only",
    );
}

#[test]
fn log_outputs_can_add_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let client = free_port();
    let file = dir.path().join("ephd-file.log");
    let mut cmd = ephd();
    cmd.arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
        .arg(format!("--log-outputs=stderr,{}", file.display()))
        .arg("--logger=capnslog")
        .arg("--snapshot-count=5");
    let mut p = Proc::spawn(cmd, &[], &dir.path().join("stderr.log"));
    p.wait_listening(client);
    let line = "flag --snapshot-count is accepted for etcd compatibility and ignored: ";
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(written.contains(line), "{written}");
    assert!(
        !written.contains('\x1b'),
        "ANSI colours in a log file: {written}"
    );
    assert!(p.logs().contains(line), "{}", p.logs());
}
