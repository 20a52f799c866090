//! Process harness shared by every integration test: spawns an `ephd` or a
//! stock `etcd` on free loopback ports, waits (bounded) until it serves gRPC,
//! hands out clients, and kills the process when the handle is dropped.
//!
//! Every server is per test, so tests can run in parallel threads: ports come
//! from a process-wide counter over a random base (outside the kernel's
//! ephemeral range) and each candidate is checked by binding it first.

use std::collections::VecDeque;
use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{
    cluster_client::ClusterClient, kv_client::KvClient, lease_client::LeaseClient,
    maintenance_client::MaintenanceClient, watch_client::WatchClient,
};
use tonic::transport::Channel;

/// How long a freshly spawned server may take to answer its first request.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// What a cluster member logs when the other members hold its start.
pub const HELD_LOG: &str = "start held:";

/// Upper bound for any single gRPC round trip made by the harness itself.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(5);

/// How many bytes of a server's log are kept (and printed when a test fails).
const LOG_TAIL_BYTES: usize = 64 * 1024;

/// How many times a server start is retried with fresh ports when the
/// process dies early (e.g. another process grabbed the port meanwhile).
const START_ATTEMPTS: usize = 3;

/// Returns a loopback TCP port that nobody was listening on a moment ago and
/// that this test process has never handed out before, so parallel tests
/// never pick the same port for their servers.
pub fn free_port() -> u16 {
    // Ports 20000..32000 sit below Linux' default ephemeral range
    // (32768..60999), so outgoing client connections cannot steal them.
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let next = NEXT.get_or_init(|| AtomicU32::new(rand::random_range(0..SPAN)));
    for _ in 0..SPAN {
        let port = (LOW + next.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {LOW}..{}", LOW + SPAN);
}

/// A spawned server process whose stdout+stderr are captured (last
/// `LOG_TAIL_BYTES`) so a failing test can show what the server said.
pub(crate) struct ServerProcess {
    what: &'static str,
    child: Child,
    log: Arc<Mutex<VecDeque<u8>>>,
    /// The threads copying stdout and stderr into `log` (done at EOF).
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl ServerProcess {
    /// OS process id, for tests that signal the server.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn spawn(what: &'static str, mut cmd: Command) -> ServerProcess {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("failed to spawn {what} ({cmd:?}): {e}"));
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let readers = vec![
            spawn_log_reader(stdout, log.clone()),
            spawn_log_reader(stderr, log.clone()),
        ];
        ServerProcess {
            what,
            child,
            log,
            readers,
        }
    }

    /// What the process is, as failure messages name it.
    pub(crate) fn what(&self) -> &'static str {
        self.what
    }

    /// Whether the process has not exited yet.
    pub(crate) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops the process with SIGTERM, as a service manager does, and waits
    /// (at most `limit`, then SIGKILL) until it exited.
    pub(crate) fn terminate(&mut self, limit: Duration) {
        // SAFETY: kill(2) on our own child's pid has no memory effects.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + limit;
        while self.running() {
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!("{} did not exit within {limit:?} of SIGTERM", self.what);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn logs(&self) -> String {
        let log = self.log.lock().unwrap();
        let (a, b) = log.as_slices();
        let mut bytes = a.to_vec();
        bytes.extend_from_slice(b);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Polls until `endpoint` answers a Status and a linearizable Range (i.e.
    /// it serves and, for etcd, has elected itself leader). Returns the error
    /// text if the process exited or `START_TIMEOUT` passed.
    pub(crate) fn wait_ready(&mut self, endpoint: &str) -> Result<(), String> {
        self.wait_ready_within(endpoint, START_TIMEOUT, true)
    }

    /// [`ServerProcess::wait_ready`] for up to `limit`; a held start ends
    /// the wait only if `held_fails`.
    pub(crate) fn wait_ready_within(
        &mut self,
        endpoint: &str,
        limit: Duration,
        held_fails: bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let mut last_err = String::from("no attempt made");
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("{} exited early with {status}", self.what));
            }
            // A cluster member whose start the others hold (it waits for
            // them, serving only its reason) counts as not started.
            if held_fails && self.logs().contains(HELD_LOG) {
                return Err(format!("{} holds its start", self.what));
            }
            match probe_ready(endpoint) {
                Ok(()) => return Ok(()),
                Err(e) => last_err = e,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "{} at {endpoint} not ready within {limit:?}: {last_err}",
            self.what
        ))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "----- {} (pid {}) log tail -----\n{}\n----- end of {} log -----",
                self.what,
                self.child.id(),
                self.logs(),
                self.what
            );
        }
    }
}

fn spawn_log_reader(
    mut src: impl Read + Send + 'static,
    log: Arc<Mutex<VecDeque<u8>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = src.read(&mut buf) {
            if n == 0 {
                break;
            }
            let mut log = log.lock().unwrap();
            log.extend(&buf[..n]);
            let excess = log.len().saturating_sub(LOG_TAIL_BYTES);
            log.drain(..excess);
        }
    })
}

/// One readiness probe, run on a private thread with its own runtime so the
/// (synchronous) start functions also work from inside `#[tokio::test]`.
fn probe_ready(endpoint: &str) -> Result<(), String> {
    let endpoint = endpoint.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let probe = async {
                let opts = etcd_client::ConnectOptions::new()
                    .with_connect_timeout(Duration::from_millis(500))
                    .with_timeout(Duration::from_secs(1));
                let mut client = etcd_client::Client::connect([endpoint], Some(opts))
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                // Auth enabled (restored from a snapshot): an answer too.
                let answered = |e: &etcd_client::Error| {
                    matches!(e, etcd_client::Error::GRpcStatus(s)
                        if s.message() == "etcdserver: user name is empty")
                };
                match client.status().await {
                    Err(e) if !answered(&e) => return Err(format!("status: {e}")),
                    _ => {}
                }
                match client.get("harness-readiness-probe", None).await {
                    Ok(_) => Ok(()),
                    // Auth enabled (restored from a snapshot): it answered.
                    Err(etcd_client::Error::GRpcStatus(s))
                        if s.message() == "etcdserver: user name is empty" =>
                    {
                        Ok(())
                    }
                    // A learner refuses linearizable reads: it serves, and
                    // knows it is a learner, so it has replayed its own add.
                    Err(e) if e.to_string().contains(LEARNER_REFUSAL) => Ok(()),
                    Err(e) => Err(format!("range: {e}")),
                }
            };
            tokio::time::timeout(Duration::from_secs(2), probe)
                .await
                .map_err(|_| "probe timed out".to_string())?
        })
    })
    .join()
    .map_err(|_| "probe thread panicked".to_string())?
}

/// Anything that serves the etcd v3 API on a loopback endpoint; gives every
/// server kind the same client constructors.
pub trait Server {
    /// Client URL, `http://127.0.0.1:PORT`.
    fn endpoint(&self) -> String;

    /// A high-level `etcd_client` connected to this server, for tests that
    /// care about behaviour rather than exact wire messages.
    async fn client(&self) -> etcd_client::Client {
        connect_client(&self.endpoint()).await
    }

    /// A raw tonic channel, for the generated `ephd::proto` clients that let
    /// tests compare whole responses field by field.
    async fn channel(&self) -> Channel {
        connect_channel(&self.endpoint()).await
    }

    /// Raw generated KV client (Range/Put/DeleteRange/Txn/Compact).
    async fn kv(&self) -> KvClient<Channel> {
        KvClient::new(self.channel().await)
    }

    /// Raw generated Watch client.
    async fn watch(&self) -> WatchClient<Channel> {
        WatchClient::new(self.channel().await)
    }

    /// Raw generated Lease client.
    async fn lease(&self) -> LeaseClient<Channel> {
        LeaseClient::new(self.channel().await)
    }

    /// Raw generated Maintenance client.
    async fn maintenance(&self) -> MaintenanceClient<Channel> {
        MaintenanceClient::new(self.channel().await)
    }

    /// Raw generated Cluster client.
    async fn cluster(&self) -> ClusterClient<Channel> {
        ClusterClient::new(self.channel().await)
    }
}

/// Connects an `etcd_client::Client` to `endpoint`, panicking after
/// `RPC_TIMEOUT` so a dead server cannot hang a test.
pub async fn connect_client(endpoint: &str) -> etcd_client::Client {
    let opts = etcd_client::ConnectOptions::new()
        .with_connect_timeout(RPC_TIMEOUT)
        .with_timeout(RPC_TIMEOUT);
    tokio::time::timeout(
        RPC_TIMEOUT,
        etcd_client::Client::connect([endpoint], Some(opts)),
    )
    .await
    .unwrap_or_else(|_| panic!("connecting etcd_client to {endpoint} timed out"))
    .unwrap_or_else(|e| panic!("connecting etcd_client to {endpoint}: {e}"))
}

/// Opens a tonic channel to `endpoint` (bounded connect), for raw clients.
pub async fn connect_channel(endpoint: &str) -> Channel {
    let ep = tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .expect("valid endpoint URL")
        .connect_timeout(RPC_TIMEOUT);
    tokio::time::timeout(RPC_TIMEOUT, ep.connect())
        .await
        .unwrap_or_else(|_| panic!("connecting channel to {endpoint} timed out"))
        .unwrap_or_else(|e| panic!("connecting channel to {endpoint}: {e}"))
}

/// A running `ephd` binary (the one cargo built for this test run).
pub struct Ephd {
    port: u16,
    process: ServerProcess,
}

impl Ephd {
    /// Spawns ephd on a free loopback port with `extra_args` appended and
    /// waits until it answers gRPC; panics (with its log) if it never does.
    pub fn start(extra_args: &[&str]) -> Ephd {
        Self::start_limited(None, extra_args)
    }

    /// Like [`Ephd::start`], with the process' file-descriptor limit
    /// (`RLIMIT_NOFILE`) set to `nofile` through the shell's `ulimit`.
    #[allow(dead_code)]
    pub fn start_with_nofile(nofile: u32, extra_args: &[&str]) -> Ephd {
        Self::start_limited(Some(nofile), extra_args)
    }

    fn start_limited(nofile: Option<u32>, extra_args: &[&str]) -> Ephd {
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port();
            let url = format!("http://127.0.0.1:{port}");
            let mut cmd = match nofile {
                None => Command::new(env!("CARGO_BIN_EXE_ephd")),
                Some(n) => {
                    // `exec` keeps the PID, so the handle still owns ephd.
                    let mut sh = Command::new("sh");
                    sh.args(["-c", &format!("ulimit -n {n} && exec \"$0\" \"$@\"")])
                        .arg(env!("CARGO_BIN_EXE_ephd"));
                    sh
                }
            };
            cmd.args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(extra_args);
            let mut process = ServerProcess::spawn("ephd", cmd);
            match process.wait_ready(&url) {
                Ok(()) => return Ephd { port, process },
                Err(e) => failures.push(format!("{e}\n{}", process.logs())),
            }
        }
        panic!("ephd did not start:\n{}", failures.join("\n---\n"));
    }

    /// The client port ephd listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// OS process id, for tests that signal the server.
    pub fn pid(&self) -> u32 {
        self.process.child.id()
    }

    /// Everything ephd has logged so far (tail), for assertions on logs.
    #[allow(dead_code)]
    pub fn logs(&self) -> String {
        self.process.logs()
    }
}

impl Server for Ephd {
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

#[path = "harness_members.rs"]
mod members;
pub use members::LEARNER_REFUSAL;

/// An ephd cluster: `n` ephd processes on loopback forming one cluster
/// (`--initial-cluster` naming every member), started together. A member
/// is killed (SIGKILL) by [`EphdCluster::kill`] or when the handle drops.
pub struct EphdCluster {
    members: Vec<Option<ClusterMember>>,
    /// Its `--initial-cluster-token`.
    token: String,
    /// Every member's `name=peerURL`, in start order (joined ones too).
    names: Vec<String>,
    extra_args: Vec<String>,
    /// The peer URLs' scheme (`http` or `https`).
    scheme: String,
}

/// One member of an [`EphdCluster`].
pub struct ClusterMember {
    client_port: u16,
    peer_port: u16,
    metrics_port: u16,
    process: ServerProcess,
}

impl ClusterMember {
    /// The port of this member's etcd API (gRPC, and HTTP/1.1 beside it).
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The port of this member's HTTP endpoints (`/health`, `/readyz`, ...).
    pub fn metrics_port(&self) -> u16 {
        self.metrics_port
    }

    /// The port this member serves its Raft peers on.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// OS process id, for fault tests that pause (SIGSTOP) the member.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Its peer URL.
    pub fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }
}

impl Server for ClusterMember {
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }
}

impl EphdCluster {
    /// Starts `n` members named `m0`.. with `extra_args` each, and waits
    /// until every one serves gRPC (not until a leader is elected).
    pub fn start(n: usize, extra_args: &[&str]) -> EphdCluster {
        EphdCluster::start_with_peer_scheme(n, extra_args, "http")
    }

    /// [`EphdCluster::start`] with peer URLs of `scheme` (`https` needs the
    /// peer TLS flags in `extra_args`).
    pub fn start_with_peer_scheme(n: usize, extra_args: &[&str], scheme: &str) -> EphdCluster {
        EphdCluster::start_each(n, extra_args, scheme, &|_, _| {})
    }

    /// [`EphdCluster::start_with_peer_scheme`] without waiting for
    /// anything: the processes are started, nothing more (tests of what a
    /// cluster answers from its first instant).
    pub fn spawn(n: usize, extra_args: &[&str], scheme: &str) -> EphdCluster {
        EphdCluster::spawn_each(n, extra_args, scheme, &|_, _| {})
    }

    /// Member `i`, unless it was killed.
    pub fn member(&self, i: usize) -> Option<&ClusterMember> {
        self.members[i].as_ref()
    }

    /// The members still running, with their indexes.
    pub fn running(&self) -> Vec<(usize, &ClusterMember)> {
        self.members
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.as_ref().map(|m| (i, m)))
            .collect()
    }

    /// Kills member `i` with SIGKILL and waits for it to exit.
    pub fn kill(&mut self, i: usize) {
        drop(self.members[i].take());
    }

    /// Sends member `i` SIGTERM (what a kubelet or systemd sends) without
    /// waiting; [`EphdCluster::reap`] waits for the exit.
    #[allow(dead_code)]
    pub fn terminate(&mut self, i: usize) {
        let m = self.members[i].as_ref().expect("member running");
        let rc = unsafe { libc::kill(m.process.child.id() as i32, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill(SIGTERM)");
    }

    /// Waits up to `limit` for member `i` to exit (after
    /// [`EphdCluster::terminate`]); true when it exited cleanly. It is
    /// removed from the running members either way (killed if it hung).
    #[allow(dead_code)]
    pub fn reap(&mut self, i: usize, limit: Duration) -> bool {
        let mut m = self.members[i].take().expect("member running");
        m.process.wait_exit(limit).is_some_and(|s| s.success())
    }

    /// Every running member's log tail, for failure messages.
    pub fn logs(&self) -> String {
        self.running()
            .iter()
            .map(|(i, m)| format!("----- m{i} -----\n{}", m.process.logs()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A stock single-member etcd with a throw-away data dir: the reference
/// implementation that ephd's responses are compared against.
pub struct StockEtcd {
    client_port: u16,
    process: ServerProcess,
    // Dropped after `process` (declaration order) so etcd is dead before
    // its data dir is removed.
    _data_dir: tempfile::TempDir,
}

impl StockEtcd {
    /// Starts stock etcd on fresh client/peer ports and waits until it is
    /// leader. Panics when `etcd` is not installed: tests must never skip
    /// silently, and `scripts/test.sh` installs it.
    pub fn start() -> StockEtcd {
        Self::start_with(&[])
    }

    /// [`StockEtcd::start`] with extra etcd flags.
    pub fn start_with(extra_args: &[&str]) -> StockEtcd {
        StockEtcd::start_release(crate::references::ETCD, extra_args)
    }

    /// [`StockEtcd::start_with`] on another reference release (for example
    /// `etcd-3.7`).
    pub fn start_release(release: &str, extra_args: &[&str]) -> StockEtcd {
        Self::start_binary(&crate::references::binary(release), extra_args)
    }

    /// [`StockEtcd::start_with`] with the etcd binary at `etcd` (Debian's
    /// 3.4, say).
    pub fn start_binary(etcd: &Path, extra_args: &[&str]) -> StockEtcd {
        Self::start_prepared(etcd, extra_args, |_, _| {})
    }

    /// Stock etcd on a data dir that `etcdutl snapshot restore` made from
    /// `snapshot` (the way an operator restores an etcd backup).
    #[allow(dead_code)]
    pub fn start_from_snapshot(snapshot: &Path) -> StockEtcd {
        let etcd = crate::references::binary(crate::references::ETCD);
        Self::start_prepared(&etcd, &[], |data_dir, peer| {
            let out = Command::new(crate::references::binary("etcdutl-3.6"))
                .arg("snapshot")
                .arg("restore")
                .arg(snapshot)
                .arg("--data-dir")
                .arg(data_dir)
                .args(["--name", "default", "--initial-advertise-peer-urls", peer])
                .arg(format!("--initial-cluster=default={peer}"))
                .output()
                .expect("run etcdutl");
            assert!(
                out.status.success(),
                "etcdutl snapshot restore {}: {}",
                snapshot.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        })
    }

    /// Starts etcd after `prepare(data_dir, peer_url)` has made its data
    /// dir, or found nothing to do (etcd then creates it).
    fn start_prepared(
        etcd: &Path,
        extra_args: &[&str],
        prepare: impl Fn(&Path, &str),
    ) -> StockEtcd {
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            let data_dir = tempfile::Builder::new()
                .prefix("ephd-it-etcd-")
                .tempdir()
                .expect("create etcd data dir");
            let client_port = free_port();
            let peer_port = free_port();
            let client = format!("http://127.0.0.1:{client_port}");
            let peer = format!("http://127.0.0.1:{peer_port}");
            // A directory etcd (or `prepare`) creates.
            let data = data_dir.path().join("etcd");
            prepare(&data, &peer);
            let mut cmd = stock_etcd_command(etcd, &data, &client, &peer);
            cmd.args(extra_args);
            let mut process = ServerProcess::spawn("stock etcd", cmd);
            match process.wait_ready(&client) {
                Ok(()) => {
                    return StockEtcd {
                        client_port,
                        process,
                        _data_dir: data_dir,
                    }
                }
                Err(e) => failures.push(format!("{e}\n{}", process.logs())),
            }
        }
        panic!("stock etcd did not start:\n{}", failures.join("\n---\n"));
    }

    /// The client port etcd listens on.
    #[allow(dead_code)]
    pub fn port(&self) -> u16 {
        self.client_port
    }

    /// Stops etcd (SIGTERM, as an operator stops it) and returns its data
    /// dir, which stays until `self` is dropped.
    #[allow(dead_code)]
    pub fn stop(&mut self) -> std::path::PathBuf {
        // SAFETY: signalling a child this harness spawned.
        unsafe { libc::kill(self.process.child.id() as i32, libc::SIGTERM) };
        assert!(
            self.process.wait_exit(Duration::from_secs(20)).is_some(),
            "etcd did not stop on SIGTERM"
        );
        self._data_dir.path().join("etcd")
    }

    /// OS process id of the etcd server.
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.process.child.id()
    }
}

impl Server for StockEtcd {
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }
}

fn stock_etcd_command(etcd: &Path, data_dir: &Path, client: &str, peer: &str) -> Command {
    let mut cmd = Command::new(etcd);
    cmd.arg("--name")
        .arg("default")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen-client-urls", client])
        .args(["--advertise-client-urls", client])
        .args(["--listen-peer-urls", peer])
        .args(["--initial-advertise-peer-urls", peer])
        .arg("--initial-cluster")
        .arg(format!("default={peer}"))
        .args(["--logger", "zap", "--log-outputs", "stderr"])
        .args(["--log-level", "warn"]);
    cmd
}
