//! A three-member stock etcd cluster on loopback, the reference that a
//! scenario run against an ephd cluster is compared with (same timing
//! flags, same client-side scenario). Each member has a throw-away data
//! dir; members are killed (SIGKILL) by [`StockEtcdCluster::kill`] or when
//! the handle drops.

use std::process::Command;

use crate::harness::{find_on_path, free_port, Server, ServerProcess};

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
    // Dropped after `members` (declaration order): etcd dies first.
    _dirs: Vec<tempfile::TempDir>,
}

impl StockEtcdCluster {
    /// Starts `n` members named `e0`.. with `extra_args` each and waits
    /// until every one answers a linearizable read (a leader is elected).
    /// Panics when `etcd` is not installed: scripts/test.sh installs it.
    pub fn start(n: usize, extra_args: &[&str]) -> StockEtcdCluster {
        let etcd = find_on_path("etcd").unwrap_or_else(|| {
            panic!("stock etcd not found: run scripts/test.sh which installs etcd-server")
        });
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("e{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("it-etcd-{}-{}", std::process::id(), ports[0].0);
        let mut members = Vec::new();
        let mut dirs = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let dir = tempfile::Builder::new()
                .prefix("ephd-it-etcd-cluster-")
                .tempdir()
                .expect("create etcd data dir");
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let mut cmd = Command::new(&etcd);
            cmd.arg(format!("--name=e{i}"))
                .arg("--data-dir")
                .arg(dir.path())
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-token", &token])
                .args(["--initial-cluster-state", "new"])
                .args(["--logger", "zap", "--log-outputs", "stderr"])
                .args(["--log-level", "warn"])
                .args(extra_args);
            members.push(EtcdMember {
                client_port: *client,
                process: ServerProcess::spawn("stock etcd cluster member", cmd),
            });
            dirs.push(dir);
        }
        for m in &mut members {
            let endpoint = m.endpoint();
            if let Err(e) = m.process.wait_ready(&endpoint) {
                panic!("{e}\n{}", m.process.logs());
            }
        }
        StockEtcdCluster {
            members: members.into_iter().map(Some).collect(),
            _dirs: dirs,
        }
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
