//! Starting cluster members one by one: a member restarted in place, or a
//! new member joining with `--initial-cluster-state existing` (the
//! membership tests, `cluster_members.rs`).

use super::{free_port, ClusterMember, EphdCluster, ServerProcess};
use std::process::Command;

/// The command line of a cluster member.
pub(super) fn member_command(
    name: &str,
    (client, peer, metrics): (u16, u16, u16),
    initial: &str,
    token: &str,
    state: &str,
    extra_args: &[String],
    scheme: &str,
) -> Command {
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("{scheme}://127.0.0.1:{peer}");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ephd"));
    cmd.arg(format!("--name={name}"))
        .args(["--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", initial])
        .args(["--initial-cluster-token", token])
        .args(["--initial-cluster-state", state])
        .arg(format!("--listen-metrics-urls=http://127.0.0.1:{metrics}"))
        .args(extra_args);
    cmd
}

impl EphdCluster {
    /// Starts member process `name` with `--initial-cluster-state state`,
    /// on the ports of member `i` when given (a restart in place, its
    /// `--initial-cluster` unchanged) or on new ones (a new member, named
    /// after every member started so far), and waits until it serves. On
    /// success it takes slot `i` (or a new slot, whose index is returned);
    /// otherwise returns why it did not start, with its log.
    pub fn start_member(
        &mut self,
        name: &str,
        state: &str,
        i: Option<usize>,
    ) -> Result<usize, String> {
        self.start_member_with(name, state, i, &[])
    }

    /// [`EphdCluster::start_member`] with `more` arguments for this start
    /// only (`--force-new-cluster`).
    pub fn start_member_with(
        &mut self,
        name: &str,
        state: &str,
        i: Option<usize>,
        more: &[&str],
    ) -> Result<usize, String> {
        let peer = match i {
            Some(i) => {
                assert!(self.members[i].is_none(), "member {i} is still running");
                self.peer_port(i)
            }
            None => free_port(),
        };
        self.spawn_member(name, state, i, peer, more)
    }

    /// Starts a new member `name` that MemberAdd added with peer URL
    /// `http://127.0.0.1:{peer}`, with `--initial-cluster-state existing`
    /// (see [`EphdCluster::start_member`]).
    pub fn start_joining(&mut self, name: &str, peer: u16) -> Result<usize, String> {
        self.spawn_member(name, "existing", None, peer, &[])
    }

    /// The peer port of member `i` (running or not).
    pub fn peer_port(&self, i: usize) -> u16 {
        self.names[i].rsplit(':').next().unwrap().parse().unwrap()
    }

    fn spawn_member(
        &mut self,
        name: &str,
        state: &str,
        i: Option<usize>,
        peer: u16,
        more: &[&str],
    ) -> Result<usize, String> {
        let (client, metrics) = (free_port(), free_port());
        if i.is_none() {
            self.names
                .push(format!("{name}={}://127.0.0.1:{peer}", self.scheme));
        }
        let initial = self.names.join(",");
        let mut cmd = member_command(
            name,
            (client, peer, metrics),
            &initial,
            &self.token,
            state,
            &self.extra_args,
            &self.scheme,
        );
        cmd.args(more);
        let mut process = ServerProcess::spawn("ephd cluster member", cmd);
        let endpoint = format!("http://127.0.0.1:{client}");
        if let Err(e) = process.wait_ready(&endpoint) {
            if i.is_none() {
                self.names.pop();
            }
            return Err(format!("{e}\n{}", process.logs()));
        }
        let member = ClusterMember {
            client_port: client,
            metrics_port: metrics,
            peer_port: peer,
            process,
        };
        match i {
            Some(i) => {
                self.members[i] = Some(member);
                Ok(i)
            }
            None => {
                self.members.push(Some(member));
                Ok(self.members.len() - 1)
            }
        }
    }
}
