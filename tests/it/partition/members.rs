//! A cluster of ephd or stock etcd members, each in its own namespace of
//! a [`Net`], all on the standard ports (2379 for clients, 2380 for
//! peers): the same command lines for both servers but the binary.

use std::process::Command;

use super::net::Net;
use crate::harness::ServerProcess;

/// Which server the members run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Etcd,
    Ephd,
}

/// The members, then their data directories, then the network: dropped in
/// that order, so no process outlives its namespace.
pub struct NetCluster {
    members: Vec<ServerProcess>,
    _dirs: Vec<tempfile::TempDir>,
    pub net: Net,
}

impl NetCluster {
    /// Starts `n` members with `extra_args` each and waits until every one
    /// serves a linearizable read.
    pub fn start(kind: Kind, n: usize, extra_args: &[&str]) -> NetCluster {
        let net = Net::new(n);
        let initial = (0..n)
            .map(|i| format!("m{i}=http://{}:2380", net.member(i)))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("partition-{}-{}", std::process::id(), net.member(0));
        let mut members = Vec::new();
        let mut dirs = Vec::new();
        for i in 0..n {
            let dir = tempfile::Builder::new()
                .prefix("ephd-it-partition-")
                .tempdir()
                .expect("data dir");
            let addr = net.member(i);
            let client = format!("http://{addr}:2379");
            let peer = format!("http://{addr}:2380");
            let binary = match kind {
                Kind::Etcd => crate::references::etcd(),
                Kind::Ephd => env!("CARGO_BIN_EXE_ephd").into(),
            };
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &net.namespace(i)])
                .arg(binary)
                .arg(format!("--name=m{i}"))
                .arg("--data-dir")
                .arg(dir.path())
                .args(["--listen-client-urls", &client])
                .args(["--advertise-client-urls", &client])
                .args(["--listen-peer-urls", &peer])
                .args(["--initial-advertise-peer-urls", &peer])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-token", &token])
                .args(["--initial-cluster-state", "new"])
                .args(extra_args);
            match kind {
                Kind::Etcd => {
                    cmd.args(["--logger", "zap", "--log-outputs", "stderr"])
                        .args(["--log-level", "warn"]);
                }
                // A private network of the test's own, not loopback.
                Kind::Ephd => {
                    cmd.arg("--allow-insecure-plaintext");
                }
            }
            let what = match kind {
                Kind::Etcd => "stock etcd member in a namespace",
                Kind::Ephd => "ephd member in a namespace",
            };
            members.push(ServerProcess::spawn(what, cmd));
            dirs.push(dir);
        }
        let mut cluster = NetCluster {
            members,
            _dirs: dirs,
            net,
        };
        for i in 0..n {
            let endpoint = cluster.endpoint(i);
            if let Err(e) = cluster.members[i].wait_ready(&endpoint) {
                panic!("{e}\n{}", cluster.members[i].logs());
            }
        }
        cluster
    }

    /// Member `i`'s client URL.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://{}:2379", self.net.member(i))
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Every member's log tail, for failure messages.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .enumerate()
            .map(|(i, m)| format!("----- m{i} ({}) -----\n{}", m.what(), m.logs()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}
