//! The ephd process the soak owns: started on a loopback port with its own
//! `--data-dir`, killed with SIGKILL or stopped with SIGTERM, restarted on
//! the same port, its memory sampled and its log files scanned for panics.
//! Also the data directory's snapshot generations, which the restart
//! checks read and the damaged-snapshot fault corrupts.
//!
//! Only this process is ever signalled: the soak never looks for servers by
//! name, and the child dies with the soak (`PR_SET_PDEATHSIG`) even if the
//! soak itself is killed.

use std::fs::{self, File};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a started server may take to answer its first request.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a SIGTERM'd server may take to exit (it waits up to 5 s for
/// in-flight requests, then writes its final snapshot).
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start the server.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// The ephd binary.
    pub bin: PathBuf,
    /// `--data-dir`.
    pub data_dir: PathBuf,
    /// Where each incarnation's log (`server-N.log`) goes.
    pub log_dir: PathBuf,
    /// Flags added to the soak's own.
    pub args: Vec<String>,
}

/// A running (or just stopped) ephd process.
pub struct ServerProc {
    spec: ServerSpec,
    child: Option<Child>,
    /// The gRPC address (fixed across restarts when the port stays free).
    pub addr: SocketAddr,
    /// The `/metrics` address.
    pub metrics: SocketAddr,
    /// 0 for the first start, +1 per restart.
    pub incarnation: u32,
    logs: Vec<PathBuf>,
    /// Highest RSS sampled, in KiB, over every incarnation.
    peak_rss_kb: Arc<AtomicU64>,
    sampler: Option<tokio::task::JoinHandle<()>>,
}

/// A loopback port that was free a moment ago.
fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// Resident set size (VmRSS) or its peak (VmHWM) of `pid`, in KiB.
pub fn rss_kb(pid: u32, field: &str) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

impl ServerProc {
    /// Starts the first incarnation on fresh ports and waits until it serves.
    pub async fn start(spec: ServerSpec) -> Result<ServerProc, String> {
        fs::create_dir_all(&spec.data_dir)
            .map_err(|e| format!("cannot create {}: {e}", spec.data_dir.display()))?;
        fs::create_dir_all(&spec.log_dir)
            .map_err(|e| format!("cannot create {}: {e}", spec.log_dir.display()))?;
        let mut p = ServerProc {
            spec,
            child: None,
            addr: SocketAddr::from(([127, 0, 0, 1], free_port()?)),
            metrics: SocketAddr::from(([127, 0, 0, 1], free_port()?)),
            incarnation: 0,
            logs: Vec::new(),
            peak_rss_kb: Arc::new(AtomicU64::new(0)),
            sampler: None,
        };
        p.spawn_and_wait().await?;
        Ok(p)
    }

    /// The process id of the running incarnation.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The `http://host:port` endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The highest RSS seen so far (sampled every 100 ms, and each
    /// incarnation's VmHWM when it stops), in MiB.
    pub fn peak_rss_mb(&self) -> f64 {
        self.sample_hwm();
        self.peak_rss_kb.load(Ordering::Relaxed) as f64 / 1024.0
    }

    fn sample_hwm(&self) {
        if let Some(kb) = self.pid().and_then(|p| rss_kb(p, "VmHWM:")) {
            self.peak_rss_kb.fetch_max(kb, Ordering::Relaxed);
        }
    }

    /// Spawns an incarnation and waits for it to answer; retries on fresh
    /// ports if another process took ours meanwhile.
    async fn spawn_and_wait(&mut self) -> Result<(), String> {
        let mut last = String::new();
        for attempt in 0..3 {
            if attempt > 0 {
                self.addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
                self.metrics = SocketAddr::from(([127, 0, 0, 1], free_port()?));
            }
            self.spawn()?;
            match self.wait_ready().await {
                Ok(()) => {
                    self.start_sampler();
                    return Ok(());
                }
                Err(e) => {
                    last = e;
                    self.kill_now();
                }
            }
        }
        Err(format!(
            "ephd did not start: {last}; log: {}",
            self.logs
                .last()
                .map_or(String::new(), |p| p.display().to_string())
        ))
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = self
            .spec
            .log_dir
            .join(format!("server-{}.log", self.logs.len()));
        let out =
            File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let url = format!("http://{}", self.addr);
        let mut cmd = Command::new(&self.spec.bin);
        cmd.args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .arg("--listen-metrics-urls")
        .arg(format!("http://{}", self.metrics))
        .arg("--data-dir")
        .arg(&self.spec.data_dir)
        // The SIGKILL and damaged-snapshot faults check what snapshots
        // alone restore (the restored generation, exactly, and revisions
        // above it); the write-ahead log keeps more than that, and its
        // crashes are tested by the server's suite (`tests/it/restart/wal.rs`).
        .args(["--wal", "none"])
        .args(&self.spec.args)
        // Plain log lines, so they can be searched.
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
        // SAFETY: prctl is async-signal-safe and touches only this child.
        // The child gets SIGKILL when the thread that spawned it ends, so a
        // soak that dies (or is killed) never leaves a server behind; it is
        // spawned from the runtime's own threads, which live as long as the
        // soak.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.spec.bin.display()))?;
        self.child = Some(child);
        self.logs.push(log);
        Ok(())
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last = String::from("no attempt");
        while Instant::now() < deadline {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                return Err(format!("ephd exited at start with {status}"));
            }
            match probe(self.addr).await {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!("not serving within {START_TIMEOUT:?}: {last}"))
    }

    fn start_sampler(&mut self) {
        if let Some(s) = self.sampler.take() {
            s.abort();
        }
        let Some(pid) = self.pid() else { return };
        let peak = self.peak_rss_kb.clone();
        self.sampler = Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                match rss_kb(pid, "VmRSS:") {
                    Some(kb) => {
                        peak.fetch_max(kb, Ordering::Relaxed);
                    }
                    None => return,
                }
            }
        }));
    }

    fn stop_sampler(&mut self) {
        self.sample_hwm();
        if let Some(s) = self.sampler.take() {
            s.abort();
        }
    }

    fn kill_now(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILL, then reaps the process.
    pub fn kill(&mut self) {
        self.stop_sampler();
        self.kill_now();
    }

    /// SIGTERM, then waits (bounded) for the exit; SIGKILL if it hangs.
    pub async fn terminate(&mut self) -> Result<ExitStatus, String> {
        self.stop_sampler();
        let Some(mut child) = self.child.take() else {
            return Err("no server running".into());
        };
        // SAFETY: kill(2) on our own child's pid, which we have not reaped.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "ephd did not exit within {STOP_TIMEOUT:?} of SIGTERM"
                    ));
                }
            }
        }
    }

    /// Starts the next incarnation on the same ports and data directory.
    pub async fn restart(&mut self) -> Result<(), String> {
        self.kill_now();
        self.incarnation += 1;
        self.spawn_and_wait().await
    }

    /// Lines of every log that report a panic, with their file.
    pub fn panics(&self) -> Vec<String> {
        let mut out = Vec::new();
        for path in &self.logs {
            let Ok(text) = fs::read(path) else { continue };
            for line in String::from_utf8_lossy(&text).lines() {
                if line.contains("panicked") {
                    out.push(format!("{}: {}", path.display(), line.trim()));
                }
            }
        }
        out
    }

    /// ERROR lines over every log (damaged snapshots log some on purpose).
    pub fn error_lines(&self) -> u64 {
        self.logs
            .iter()
            .filter_map(|p| fs::read(p).ok())
            .map(|t| {
                String::from_utf8_lossy(&t)
                    .lines()
                    .filter(|l| l.contains(" ERROR "))
                    .count() as u64
            })
            .sum()
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        if let Some(s) = self.sampler.take() {
            s.abort();
        }
        self.kill_now();
    }
}

/// One readiness probe: a count-only Range over the lean client.
async fn probe(addr: SocketAddr) -> Result<(), String> {
    use crate::h2rpc::{Channel, Client};
    use ephd::proto::etcdserverpb::{RangeRequest, RangeResponse};
    let ch = Channel::connect(addr, Duration::from_millis(500)).await?;
    let mut c = Client::new(&ch);
    let uri = ch.method("/etcdserverpb.KV/Range");
    let req = RangeRequest {
        key: bytes::Bytes::from_static(b"soak-readiness-probe"),
        count_only: true,
        ..Default::default()
    };
    tokio::time::timeout(
        Duration::from_secs(2),
        c.unary::<_, RangeResponse>(&uri, req),
    )
    .await
    .map_err(|_| "probe timed out".to_string())?
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// The snapshot generations in `dir`, newest first: (revision, path).
pub fn generations(dir: &Path) -> Vec<(i64, PathBuf)> {
    ephd::persist::list(dir).unwrap_or_default()
}

/// Files moved aside as damaged (`*.corrupt-*`) in `dir`.
pub fn corrupt_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains(".corrupt-"))
        })
        .collect();
    out.sort();
    out
}

/// Flips one bit of the byte at `offset` (clamped into the file).
pub fn flip_byte(path: &Path, offset: u64) -> Result<u64, String> {
    let mut bytes = fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    let at = (offset as usize).min(bytes.len() - 1);
    bytes[at] ^= 0x10;
    fs::write(path, &bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(at as u64)
}
