//! A real kube-apiserver (built from `k8s.io/kubernetes` by
//! scripts/install-references.sh) with stock etcd (3.6 with kube-apiserver
//! 1.35, 3.7 with 1.37) for everything and
//! ephd as the `--etcd-servers-overrides` store of Events and
//! coordination.k8s.io Leases, both over mutual TLS as a control plane runs
//! them; driven by client-go (tests/go/kube-driver) as kubelets and
//! controllers drive it.

mod leader_kill;
mod override_store;
mod range_stream;
mod restarts;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::go_client::Driver;
use crate::harness::{free_port, ServerProcess};
use crate::references;
use crate::tls::{make_certs, openssl};

/// The releases of a control plane: kube-apiserver and its durable etcd.
#[derive(Clone, Copy)]
pub struct Releases {
    pub apiserver: &'static str,
    pub etcd: &'static str,
}

/// The newest 1.35 apiserver on etcd 3.6, what most clusters run.
pub const CURRENT: Releases = Releases {
    apiserver: "kube-apiserver-1.35",
    etcd: "etcd-3.6",
};

/// kube-apiserver 1.37 (lists through etcd's RangeStream) on etcd 3.7.
pub const NEXT: Releases = Releases {
    apiserver: "kube-apiserver-1.37",
    etcd: "etcd-3.7",
};

/// The static token of the test's admin user (group system:masters).
const TOKEN: &str = "ephd-test-admin";

/// How often the apiserver compacts each store (its default is 5 minutes).
const COMPACTION_INTERVAL: &str = "5s";

/// How long the apiserver may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// Where the apiserver sends Events and Leases, as an operator writes it:
/// overrides are separated by commas, the servers of one override by
/// semicolons.
/// The last 60 lines of a server's output.
fn tail(logs: &str) -> String {
    let lines: Vec<&str> = logs.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

pub fn overrides_flag(ephd_url: &str) -> String {
    format!("--etcd-servers-overrides=/events#{ephd_url},coordination.k8s.io/leases#{ephd_url}")
}

/// etcd 3.6 + ephd + kube-apiserver, all on loopback with one test CA.
pub struct ControlPlane {
    releases: Releases,
    metrics_port: u16,
    // Fields drop in order: the apiserver first, then the stores, then the
    // directory with their certificates and data.
    apiserver: Option<ServerProcess>,
    apiserver_port: u16,
    ephd: Option<ServerProcess>,
    ephd_port: u16,
    ephd_args: Vec<String>,
    // Other servers as the override store (a cluster the test runs), in
    // the form the flag takes them; then no ephd of its own is started.
    override_servers: Option<String>,
    _etcd: ServerProcess,
    etcd_port: u16,
    dir: tempfile::TempDir,
}

impl ControlPlane {
    /// Starts the three with `ephd_args` added to ephd's TLS flags and waits
    /// until the apiserver's /readyz passes.
    pub fn start(ephd_args: &[&str]) -> ControlPlane {
        ControlPlane::start_with(CURRENT, ephd_args)
    }

    /// [`ControlPlane::start`] with other releases.
    pub fn start_with(releases: Releases, ephd_args: &[&str]) -> ControlPlane {
        ControlPlane::start_inner(releases, ephd_args, None)
    }

    /// A control plane whose Events and Leases go to `servers` (the
    /// override's servers, `;`-separated), which the caller runs.
    pub fn start_with_override(servers: &str) -> ControlPlane {
        ControlPlane::start_inner(CURRENT, &[], Some(servers.to_string()))
    }

    fn start_inner(
        releases: Releases,
        ephd_args: &[&str],
        override_servers: Option<String>,
    ) -> ControlPlane {
        let dir = tempfile::Builder::new()
            .prefix("ephd-it-kube-")
            .tempdir()
            .expect("temp dir");
        make_pki(dir.path());
        let etcd_port = free_port();
        let etcd = start_etcd(releases.etcd, dir.path(), etcd_port);
        let mut plane = ControlPlane {
            releases,
            metrics_port: free_port(),
            ephd_port: free_port(),
            ephd_args: ephd_args.iter().map(|s| s.to_string()).collect(),
            override_servers,
            ephd: None,
            apiserver: None,
            apiserver_port: free_port(),
            _etcd: etcd,
            etcd_port,
            dir,
        };
        if plane.override_servers.is_none() {
            plane.start_ephd();
        }
        plane.start_apiserver();
        plane
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// ephd's client URL, as the apiserver dials it.
    pub fn ephd_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.ephd_port)
    }

    fn etcd_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.etcd_port)
    }

    /// Starts ephd on its port (again, after [`ControlPlane::stop_ephd`])
    /// and waits until it accepts connections.
    pub fn start_ephd(&mut self) {
        let url = self.ephd_url();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ephd"));
        cmd.args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .arg("--cert-file")
        .arg(self.path("server.crt"))
        .arg("--key-file")
        .arg(self.path("server.key"))
        .arg("--trusted-ca-file")
        .arg(self.path("ca.crt"))
        .arg("--client-cert-auth")
        .arg(format!(
            "--listen-metrics-urls=http://127.0.0.1:{}",
            self.metrics_port
        ))
        .args(&self.ephd_args);
        let mut ephd = ServerProcess::spawn("ephd", cmd);
        wait_listening(&mut ephd, self.ephd_port);
        self.ephd = Some(ephd);
    }

    /// Stops ephd with SIGTERM, as a pod is stopped, and waits until it
    /// exited.
    pub fn stop_ephd(&mut self) {
        let mut ephd = self.ephd.take().expect("ephd running");
        ephd.terminate(Duration::from_secs(15));
    }

    fn start_apiserver(&mut self) {
        let mut cmd = Command::new(references::binary(self.releases.apiserver));
        let d = |name: &str| self.path(name).display().to_string();
        cmd.arg(format!("--etcd-servers={}", self.etcd_url()))
            .arg(overrides_flag(
                self.override_servers.as_deref().unwrap_or(&self.ephd_url()),
            ))
            .arg(format!("--etcd-cafile={}", d("ca.crt")))
            .arg(format!("--etcd-certfile={}", d("client.crt")))
            .arg(format!("--etcd-keyfile={}", d("client.key")))
            .arg(format!("--etcd-compaction-interval={COMPACTION_INTERVAL}"))
            .arg(format!("--secure-port={}", self.apiserver_port))
            .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
            // A loopback address cannot be the kubernetes Service's endpoint.
            .arg("--endpoint-reconciler-type=none")
            .arg(format!("--cert-dir={}", d("apiserver-certs")))
            .arg(format!("--token-auth-file={}", d("tokens.csv")))
            .arg("--authorization-mode=AlwaysAllow")
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!("--service-account-key-file={}", d("sa.key")))
            .arg(format!(
                "--service-account-signing-key-file={}",
                d("sa.key")
            ))
            .arg("--service-cluster-ip-range=10.0.0.0/24");
        self.apiserver = Some(ServerProcess::spawn("kube-apiserver", cmd));
        let ready = self.driver(
            "ready",
            &[&format!("-timeout={}s", READY_TIMEOUT.as_secs())],
        );
        assert!(ready["readyz"].is_array(), "readyz: {ready}");
    }

    /// Stops the apiserver (SIGTERM), waits until it has exited, and starts
    /// it again on the same stores.
    pub fn restart_apiserver(&mut self) {
        let mut apiserver = self.apiserver.take().expect("apiserver running");
        apiserver.terminate(Duration::from_secs(70));
        drop(apiserver);
        self.start_apiserver();
    }

    /// The last lines the apiserver and ephd wrote, for failure messages.
    pub fn server_logs(&self) -> String {
        let of =
            |p: &Option<ServerProcess>| p.as_ref().map(|p| tail(&p.logs())).unwrap_or_default();
        format!(
            "\n----- kube-apiserver -----\n{}\n----- ephd -----\n{}",
            of(&self.apiserver),
            of(&self.ephd)
        )
    }

    fn driver_command(&self, scenario: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(references::binary("kube-driver"));
        cmd.arg(format!("-server=https://127.0.0.1:{}", self.apiserver_port))
            .arg(format!("-token={TOKEN}"))
            .arg(format!("-scenario={scenario}"))
            .args(args);
        cmd
    }

    /// Runs a kube-driver scenario to its end and returns its result line
    /// (the one whose step is the scenario's name).
    pub fn driver(&self, scenario: &str, args: &[&str]) -> Value {
        let mut driver = Driver::spawn(self.driver_command(scenario, args));
        let result = driver.step(scenario, READY_TIMEOUT + Duration::from_secs(30));
        driver.step("done", Duration::from_secs(30));
        result
    }

    /// A long-running kube-driver scenario (informers), driven by lines.
    pub fn driver_running(&self, scenario: &str, args: &[&str]) -> Driver {
        Driver::spawn(self.driver_command(scenario, args))
    }

    /// The apiserver's samples of metric `name` whose labels contain
    /// `labels` (a `key="value"` fragment), summed.
    pub fn metric(&self, name: &str, labels: &str) -> f64 {
        let m = self.driver("metrics", &[&format!("-metrics={name}")]);
        m["samples"]
            .as_object()
            .map(|s| {
                s.iter()
                    .filter(|(k, _)| k.contains(labels))
                    .filter_map(|(_, v)| v.as_f64())
                    .sum()
            })
            .unwrap_or(0.0)
    }

    /// Runs stock etcdctl 3.6 with the apiserver's client certificate
    /// against ephd (`on_ephd`) or etcd; returns stdout, panics on failure.
    pub fn etcdctl(&self, on_ephd: bool, args: &[&str]) -> String {
        let url = if on_ephd {
            self.ephd_url()
        } else {
            self.etcd_url()
        };
        let out = Command::new(references::etcdctl())
            .arg(format!("--endpoints={url}"))
            .arg(format!("--cacert={}", self.path("ca.crt").display()))
            .arg(format!("--cert={}", self.path("client.crt").display()))
            .arg(format!("--key={}", self.path("client.key").display()))
            .args(["--dial-timeout=3s", "--command-timeout=5s"])
            .args(args)
            .output()
            .expect("run etcdctl");
        assert!(
            out.status.success(),
            "etcdctl {args:?} on {url}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// ephd's own metrics (Prometheus text), from its metrics port.
    pub fn ephd_metrics(&self) -> String {
        crate::metrics::scrape_text(self.metrics_port)
    }

    /// The keys under `prefix` in ephd (`on_ephd`) or etcd.
    pub fn keys(&self, on_ephd: bool, prefix: &str) -> Vec<String> {
        self.etcdctl(on_ephd, &["get", "--prefix", "--keys-only", prefix])
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The version of the apiserver compactor's `compact_rev_key` in ephd
    /// (0 while it does not exist); it grows by one per compaction cycle.
    pub fn compactor_cycles(&self) -> i64 {
        let out = self.etcdctl(true, &["get", "compact_rev_key", "-w", "json"]);
        let v: Value = serde_json::from_str(&out).expect("etcdctl json");
        v["kvs"][0]["version"].as_i64().unwrap_or(0)
    }

    /// Waits (at most `limit`) until the apiserver's compactor has run
    /// `cycles` more times on ephd than now.
    pub fn wait_compactions(&self, cycles: i64, limit: Duration) {
        let start = self.compactor_cycles();
        let deadline = Instant::now() + limit;
        while self.compactor_cycles() < start + cycles {
            assert!(
                Instant::now() < deadline,
                "the apiserver's compactor did not run {cycles} times on ephd within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// One CA for the stores' server certificates and the apiserver's client
/// certificate, the service-account key and the static token file.
fn make_pki(dir: &Path) {
    // The server certificate has no extended key usage, so etcd can also
    // dial itself with it (its gRPC gateway does).
    make_certs(dir);
    openssl(dir, &["genrsa", "-out", "sa.key", "2048"]);
    std::fs::write(
        dir.join("tokens.csv"),
        format!("{TOKEN},admin,admin,system:masters\n"),
    )
    .unwrap();
}

fn start_etcd(release: &str, dir: &Path, port: u16) -> ServerProcess {
    let client = format!("https://127.0.0.1:{port}");
    let peer = format!("http://127.0.0.1:{}", free_port());
    let mut cmd = Command::new(references::binary(release));
    cmd.arg("--data-dir")
        .arg(dir.join("etcd"))
        .args(["--listen-client-urls", &client])
        .args(["--advertise-client-urls", &client])
        .args(["--listen-peer-urls", &peer])
        .args(["--initial-advertise-peer-urls", &peer])
        .arg(format!("--initial-cluster=default={peer}"))
        .arg("--cert-file")
        .arg(dir.join("server.crt"))
        .arg("--key-file")
        .arg(dir.join("server.key"))
        .arg("--trusted-ca-file")
        .arg(dir.join("ca.crt"))
        .arg("--client-cert-auth")
        .args(["--log-level", "warn"]);
    let mut etcd = ServerProcess::spawn("stock etcd", cmd);
    wait_listening(&mut etcd, port);
    etcd
}

/// Waits until `port` accepts TCP connections (the apiserver's own
/// readiness check then waits for the store to answer).
fn wait_listening(process: &mut ServerProcess, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            process.running(),
            "{} exited:\n{}",
            process.what(),
            process.logs()
        );
        assert!(
            Instant::now() < deadline,
            "nothing listens on port {port}:\n{}",
            process.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
