//! A stock etcd cluster of several members, beside the single-member
//! [`StockEtcd`](super::StockEtcd) of the parent module.

use super::{find_on_path, free_port, stock_etcd_command, ServerProcess};

/// Stock etcd members of one cluster (`--initial-cluster` naming each),
/// with throw-away data dirs: the reference for cluster behaviour
/// (MoveLeader's answers, leader changes).
#[allow(dead_code)]
pub struct StockEtcdCluster {
    members: Vec<(u16, ServerProcess)>,
    _data_dirs: Vec<tempfile::TempDir>,
}

#[allow(dead_code)]
impl StockEtcdCluster {
    /// Starts `n` members on free loopback ports and waits until each
    /// serves a linearizable read (a leader is elected). Panics when `etcd`
    /// is not installed.
    pub fn start(n: usize) -> StockEtcdCluster {
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
                .prefix("ephd-it-etcd-")
                .tempdir()
                .expect("create etcd data dir");
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let mut cmd = stock_etcd_command(&etcd, dir.path(), &client_url, &peer_url);
            // The last --name and --initial-cluster win (etcd's flag parser).
            cmd.args(["--name", &format!("e{i}")])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-token", &token])
                .args(["--initial-cluster-state", "new"]);
            members.push((*client, ServerProcess::spawn("stock etcd member", cmd)));
            dirs.push(dir);
        }
        for (client, p) in &mut members {
            if let Err(e) = p.wait_ready(&format!("http://127.0.0.1:{client}")) {
                panic!("{e}\n{}", p.logs());
            }
        }
        StockEtcdCluster {
            members,
            _data_dirs: dirs,
        }
    }

    /// Client URLs of every member, in order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|(port, _)| format!("http://127.0.0.1:{port}"))
            .collect()
    }
}
