//! A three-member stock etcd cluster on loopback, the reference that a
//! scenario run against an ephd cluster is compared with (same timing
//! flags, same client-side scenario). Each member has a throw-away data
//! dir; members are killed (SIGKILL) by [`StockEtcdCluster::kill`] or when
//! the handle drops. Members can be added while it runs
//! ([`StockEtcdCluster::join`], learners too), and a member that stops by
//! itself (removed from the cluster) is reaped with
//! [`StockEtcdCluster::exited`].

use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::MemberAddRequest;

use crate::harness::{free_port, Server, ServerProcess};

/// One member of a [`StockEtcdCluster`].
pub struct EtcdMember {
    client_port: u16,
    process: ServerProcess,
}

impl EtcdMember {
    /// The client port, which also serves etcd's `/metrics`.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The OS process id, for tests that signal a member.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

impl Server for EtcdMember {
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }
}

/// `n` stock etcd processes forming one cluster.
pub struct StockEtcdCluster {
    members: Vec<Option<EtcdMember>>,
    /// The etcd binary, and what a joining member is started with.
    etcd: PathBuf,
    /// Every member's `name=peerURL`, joined ones too.
    names: Vec<String>,
    token: String,
    extra_args: Vec<String>,
    // Dropped after `members` (declaration order): etcd dies first.
    _dirs: Vec<tempfile::TempDir>,
}

impl StockEtcdCluster {
    /// Starts `n` members named `e0`.. with `extra_args` each and waits
    /// until every one answers a linearizable read (a leader is elected).
    /// Panics when `etcd` is not installed: scripts/test.sh installs it.
    pub fn start(n: usize, extra_args: &[&str]) -> StockEtcdCluster {
        let etcd = crate::references::etcd();
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("e{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("it-etcd-{}-{}", std::process::id(), ports[0].0);
        let mut cluster = StockEtcdCluster {
            members: Vec::new(),
            etcd,
            names: initial.split(',').map(str::to_string).collect(),
            token,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            _dirs: Vec::new(),
        };
        for (i, (client, peer)) in ports.iter().enumerate() {
            let process = cluster.spawn(&format!("e{i}"), *client, *peer, "new");
            cluster.members.push(Some(EtcdMember {
                client_port: *client,
                process,
            }));
        }
        for m in cluster.members.iter_mut().flatten() {
            let endpoint = m.endpoint();
            if let Err(e) = m.process.wait_ready(&endpoint) {
                panic!("{e}\n{}", m.process.logs());
            }
        }
        cluster
    }

    /// Spawns member `name` with the current `--initial-cluster`.
    fn spawn(&mut self, name: &str, client: u16, peer: u16, state: &str) -> ServerProcess {
        let dir = tempfile::Builder::new()
            .prefix("ephd-it-etcd-cluster-")
            .tempdir()
            .expect("create etcd data dir");
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut cmd = Command::new(&self.etcd);
        cmd.arg(format!("--name={name}"))
            .arg("--data-dir")
            .arg(dir.path())
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &self.names.join(",")])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", state])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(["--log-level", "warn"])
            .args(&self.extra_args);
        self._dirs.push(dir);
        ServerProcess::spawn("stock etcd cluster member", cmd)
    }

    /// Adds a member (a learner when `learner`) with MemberAdd through
    /// member `via`, retrying while etcd finds the cluster unhealthy (it
    /// wants every voter connected for 5 s), starts it with
    /// `--initial-cluster-state existing` and waits until it serves.
    /// Returns its index and member ID.
    #[allow(dead_code)]
    pub async fn join(&mut self, via: usize, learner: bool) -> (usize, u64) {
        let (client, peer) = (free_port(), free_port());
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut c = self.members[via]
            .as_ref()
            .expect("via runs")
            .cluster()
            .await;
        let deadline = Instant::now() + Duration::from_secs(30);
        let id = loop {
            let req = MemberAddRequest {
                peer_ur_ls: vec![peer_url.clone()],
                is_learner: learner,
            };
            match c.member_add(req).await {
                Ok(r) => break r.into_inner().member.expect("the added member").id,
                Err(s) if s.message() == "etcdserver: unhealthy cluster" => {
                    assert!(Instant::now() < deadline, "stock etcd stays unhealthy");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(s) => panic!("stock etcd member add: {s:?}"),
            }
        };
        let name = format!("e{}", self.members.len());
        self.names.push(format!("{name}={peer_url}"));
        let mut process = self.spawn(&name, client, peer, "existing");
        let endpoint = format!("http://127.0.0.1:{client}");
        if let Err(e) = process.wait_ready(&endpoint) {
            panic!("{e}\n{}", process.logs());
        }
        self.members.push(Some(EtcdMember {
            client_port: client,
            process,
        }));
        (self.members.len() - 1, id)
    }

    /// Member `i`, unless it was killed or exited.
    #[allow(dead_code)]
    pub fn member(&self, i: usize) -> Option<&EtcdMember> {
        self.members[i].as_ref()
    }

    /// Waits up to `limit` for member `i` to exit by itself; its exit
    /// status and log, taking it out of the running members. `None` (and
    /// still running) if it did not exit.
    #[allow(dead_code)]
    pub fn exited(&mut self, i: usize, limit: Duration) -> Option<(ExitStatus, String)> {
        let m = self.members[i].as_mut().expect("member running");
        let status = m.process.wait_exit(limit)?;
        let logs = m.process.logs();
        self.members[i] = None;
        Some((status, logs))
    }

    /// The members still running, with their indexes.
    pub fn running(&self) -> Vec<(usize, &EtcdMember)> {
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

    /// Every running member's log tail, for failure messages.
    pub fn logs(&self) -> String {
        self.running()
            .iter()
            .map(|(i, m)| format!("----- e{i} -----\n{}", m.process.logs()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Runs `scenario` (given every member's client endpoint and process ID)
/// on a three-member stock etcd started with `timing`, then on a
/// three-member ephd with the same flags (and revisions starting at 1, as
/// etcd's); the two outcomes, etcd's first. Each cluster is stopped
/// before the next starts.
pub async fn on_stock_etcd_then_ephd<F, Fut, T>(timing: &[&str], scenario: F) -> (T, T)
where
    F: Fn(Vec<String>, Vec<u32>) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let etcd = {
        let stock = StockEtcdCluster::start(3, timing);
        let members = stock.running();
        let endpoints = members.iter().map(|(_, m)| m.endpoint()).collect();
        let pids = members.iter().map(|(_, m)| m.pid()).collect();
        scenario(endpoints, pids).await
    };
    let mut args = timing.to_vec();
    args.push("--revision-continuity=false");
    let cluster = crate::harness::EphdCluster::start(3, &args);
    let members = cluster.running();
    let endpoints = members.iter().map(|(_, m)| m.endpoint()).collect();
    let pids = members.iter().map(|(_, m)| m.pid()).collect();
    let ephd = scenario(endpoints, pids).await;
    (etcd, ephd)
}
