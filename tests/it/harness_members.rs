//! Starting cluster members one by one: a member restarted in place, or a
//! new member joining with `--initial-cluster-state existing` (the
//! membership tests, `cluster_members.rs`); and waiting for a member that
//! stops by itself (a removed one, `cluster_removal.rs`).

use super::{free_port, ClusterMember, EphdCluster, Server as _, ServerProcess};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

/// What etcd (and ephd) answer on a learner to the calls it does not serve.
pub const LEARNER_REFUSAL: &str = "etcdserver: rpc not supported for learner";

impl ServerProcess {
    /// Waits up to `limit` for the process to exit by itself; its exit
    /// status (once everything it wrote is in [`ServerProcess::logs`]), or
    /// `None` if it still runs.
    pub(crate) fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                for reader in self.readers.drain(..) {
                    let _ = reader.join();
                }
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

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
        // `{name}` in an argument is this member's name (a data directory
        // of its own: `--data-dir=/tmp/x/{name}`).
        .args(extra_args.iter().map(|a| a.replace("{name}", name)));
    cmd
}

impl EphdCluster {
    /// [`EphdCluster::start_with_peer_scheme`], each member's command
    /// changed by `each` (see [`EphdCluster::spawn_each`]).
    pub fn start_each(
        n: usize,
        extra_args: &[&str],
        scheme: &str,
        each: &dyn Fn(usize, &mut Command),
    ) -> EphdCluster {
        let mut cluster = EphdCluster::spawn_each(n, extra_args, scheme, each);
        for m in cluster.members.iter_mut().flatten() {
            let endpoint = m.endpoint();
            if let Err(e) = m.process.wait_ready(&endpoint) {
                panic!("{e}\n{}", m.process.logs());
            }
        }
        cluster
    }

    /// [`EphdCluster::spawn`], each member's command changed by `each`
    /// (given the member's index) before it starts: a member that behaves
    /// as another build would (its environment).
    pub fn spawn_each(
        n: usize,
        extra_args: &[&str],
        scheme: &str,
        each: &dyn Fn(usize, &mut Command),
    ) -> EphdCluster {
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let metrics: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}={scheme}://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        // A token of this run only, so no stray member of another test can
        // ever be taken for one of these.
        let token = format!("it-{}-{}", std::process::id(), ports[0].0);
        let extra_args: Vec<String> = extra_args.iter().map(|a| a.to_string()).collect();
        let mut members = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let ports = (*client, *peer, metrics[i]);
            let mut cmd = member_command(
                &format!("m{i}"),
                ports,
                &initial,
                &token,
                "new",
                &extra_args,
                scheme,
            );
            each(i, &mut cmd);
            members.push(ClusterMember {
                client_port: *client,
                peer_port: *peer,
                metrics_port: metrics[i],
                process: ServerProcess::spawn("ephd cluster member", cmd),
            });
        }
        EphdCluster {
            members: members.into_iter().map(Some).collect(),
            names: initial.split(',').map(str::to_string).collect(),
            token,
            extra_args,
            scheme: scheme.to_string(),
        }
    }

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

    /// Restarts member `name` in slot `i` (in place, as
    /// [`EphdCluster::start_member`]) and waits until the other members
    /// hold its start ([`super::HELD_LOG`] in its log); it stays in its
    /// slot, running but not serving. Its log if it served or ended
    /// instead.
    pub fn start_member_held(&mut self, name: &str, i: usize) -> Result<(), String> {
        assert!(self.members[i].is_none(), "member {i} is still running");
        let peer = self.peer_port(i);
        let (client, metrics) = (free_port(), free_port());
        let cmd = member_command(
            name,
            (client, peer, metrics),
            &self.names.join(","),
            &self.token,
            "new",
            &self.extra_args,
            &self.scheme,
        );
        let mut process = ServerProcess::spawn("ephd cluster member", cmd);
        let deadline = Instant::now() + super::START_TIMEOUT;
        while !process.logs().contains(super::HELD_LOG) {
            if Instant::now() >= deadline || process.wait_exit(Duration::from_millis(50)).is_some()
            {
                return Err(format!("{name}: no held start\n{}", process.logs()));
            }
        }
        self.members[i] = Some(ClusterMember {
            client_port: client,
            metrics_port: metrics,
            peer_port: peer,
            process,
        });
        Ok(())
    }

    /// Waits up to `limit` until member `i`, whose start was held, serves.
    pub fn wait_started(&mut self, i: usize, limit: Duration) -> Result<(), String> {
        let m = self.members[i].as_mut().expect("member running");
        let endpoint = m.endpoint();
        m.process
            .wait_ready_within(&endpoint, limit, false)
            .map_err(|e| format!("{e}\n{}", m.process.logs()))
    }

    /// Starts a new member `name` that MemberAdd added with peer URL
    /// `http://127.0.0.1:{peer}`, with `--initial-cluster-state existing`
    /// (see [`EphdCluster::start_member`]).
    pub fn start_joining(&mut self, name: &str, peer: u16) -> Result<usize, String> {
        self.spawn_member(name, "existing", None, peer, &[])
    }

    /// Waits up to `limit` for member `i` to exit by itself (a member
    /// removed from the cluster stops); its exit status and log, taking it
    /// out of the running members. `None` (and still running) if it did
    /// not exit.
    pub fn exited(&mut self, i: usize, limit: Duration) -> Option<(ExitStatus, String)> {
        let m = self.members[i].as_mut().expect("member running");
        let status = m.process.wait_exit(limit)?;
        let logs = m.process.logs();
        self.members[i] = None;
        Some((status, logs))
    }

    /// Restarts members `slots` in place (`--initial-cluster-state new`,
    /// their ports and `--initial-cluster` unchanged) all at once, then
    /// waits until each serves: a whole cluster coming back, whose members
    /// may wait for each other before serving.
    pub fn restart_together(&mut self, slots: &[usize]) -> Result<(), String> {
        let initial = self.names.join(",");
        let mut started = Vec::new();
        for &i in slots {
            assert!(self.members[i].is_none(), "member {i} is still running");
            let name = self.names[i].split('=').next().unwrap().to_string();
            let (client, metrics, peer) = (free_port(), free_port(), self.peer_port(i));
            let cmd = member_command(
                &name,
                (client, peer, metrics),
                &initial,
                &self.token,
                "new",
                &self.extra_args,
                &self.scheme,
            );
            let process = ServerProcess::spawn("ephd cluster member", cmd);
            started.push((i, client, metrics, peer, process));
        }
        let mut ready = Vec::new();
        for (i, client, metrics_port, peer_port, mut process) in started {
            process
                .wait_ready(&format!("http://127.0.0.1:{client}"))
                .map_err(|e| format!("m{i}: {e}\n{}", process.logs()))?;
            ready.push((
                i,
                ClusterMember {
                    client_port: client,
                    metrics_port,
                    peer_port,
                    process,
                },
            ));
        }
        for (i, m) in ready {
            self.members[i] = Some(m);
        }
        Ok(())
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

impl super::Ephd {
    /// Sends SIGTERM and waits up to `limit` for ephd to exit (it writes
    /// its last `--data-dir` snapshot first); true if it exited cleanly.
    pub fn terminate(&mut self, limit: Duration) -> bool {
        // SAFETY: kill(2) on the child process this handle owns.
        unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) };
        self.process.wait_exit(limit).is_some_and(|s| s.success())
    }
}

impl ClusterMember {
    /// What the member's process wrote so far.
    pub fn logs(&self) -> String {
        self.process.logs()
    }
}
