//! A network of its own for a cluster under test: every member in a
//! network namespace of its own, each joined by a veth pair to a router
//! namespace, and the test process joined to the router too, so clients
//! reach every member. A partition is a routing rule in the router: a
//! `blackhole` rule for packets from one member to another drops them
//! silently, as a cut cable or a firewall would, one direction at a time.
//! Everything lives in namespaces this test creates (and the host end of
//! one veth pair); dropping the [`Net`] deletes them, which also removes
//! the host's route and link.

use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};

/// The namespaces' name prefix, with the test process's ID after it.
const PREFIX: &str = "ephd-it-";

/// Second octets of the subnets handed out (10.N.0.0/16), one per network
/// this process builds.
const FIRST_SUBNET: u8 = 100;
const LAST_SUBNET: u8 = 199;

/// Runs `ip` with `args`; its error output when it fails.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e} (iproute2 is needed)", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// [`ip`], panicking with what it said: the network is the test's ground.
fn must(args: &[&str]) {
    if let Err(e) = ip(args) {
        panic!(
            "building the test network failed (these tests need root and network namespaces): {e}"
        );
    }
}

/// Deletes the namespaces that test processes which no longer run left
/// behind (a test binary killed before it could clean up).
fn reap_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// The network: member `i` is at `10.N.(i+1).2`, the test process at
/// `10.N.0.2`, the router between them.
pub struct Net {
    prefix: String,
    subnet: u8,
    members: usize,
}

impl Net {
    /// Builds a network for `members` members.
    pub fn new(members: usize) -> Net {
        static NEXT: AtomicU8 = AtomicU8::new(FIRST_SUBNET);
        reap_stale();
        let subnet = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(subnet <= LAST_SUBNET, "out of test subnets");
        let pid = std::process::id();
        let net = Net {
            prefix: format!("{PREFIX}{pid}-{subnet}"),
            subnet,
            members,
        };
        let router = net.router();
        must(&["netns", "add", &router]);
        must(&["-n", &router, "link", "set", "lo", "up"]);
        must(&[
            "netns",
            "exec",
            &router,
            "sysctl",
            "-q",
            "-w",
            "net.ipv4.ip_forward=1",
        ]);
        for i in 0..members {
            let ns = net.namespace(i);
            let port = format!("m{i}");
            must(&["netns", "add", &ns]);
            must(&[
                "link", "add", "name", &port, "netns", &router, "type", "veth", "peer", "name",
                "eth0", "netns", &ns,
            ]);
            must(&[
                "-n",
                &router,
                "addr",
                "add",
                &net.gateway(i + 1),
                "dev",
                &port,
            ]);
            must(&["-n", &router, "link", "set", &port, "up"]);
            must(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", net.member(i)),
                "dev",
                "eth0",
            ]);
            must(&["-n", &ns, "link", "set", "eth0", "up"]);
            must(&["-n", &ns, "link", "set", "lo", "up"]);
            let via = format!("10.{subnet}.{}.1", i + 1);
            must(&["-n", &ns, "route", "add", "default", "via", &via]);
        }
        // The test process's own link: its end stays in the host's
        // namespace (named after this process), the other in the router.
        let host = net.host_link();
        must(&[
            "link", "add", "name", &host, "type", "veth", "peer", "name", "host", "netns", &router,
        ]);
        must(&["-n", &router, "addr", "add", &net.gateway(0), "dev", "host"]);
        must(&["-n", &router, "link", "set", "host", "up"]);
        must(&["addr", "add", &format!("10.{subnet}.0.2/24"), "dev", &host]);
        must(&["link", "set", &host, "up"]);
        must(&[
            "route",
            "add",
            &format!("10.{subnet}.0.0/16"),
            "via",
            &format!("10.{subnet}.0.1"),
        ]);
        net
    }

    fn router(&self) -> String {
        format!("{}-r", self.prefix)
    }

    /// Member `i`'s namespace, for `ip netns exec`.
    pub fn namespace(&self, i: usize) -> String {
        format!("{}-m{i}", self.prefix)
    }

    /// The router's address on link `n` (0: the test process's).
    fn gateway(&self, n: usize) -> String {
        format!("10.{}.{n}.1/24", self.subnet)
    }

    fn host_link(&self) -> String {
        // Interface names have at most 15 bytes.
        format!("ephd{}x{}", std::process::id() % 100_000, self.subnet)
    }

    /// Member `i`'s address.
    pub fn member(&self, i: usize) -> String {
        format!("10.{}.{}.2", self.subnet, i + 1)
    }

    /// How many members the network joins.
    pub fn members(&self) -> usize {
        self.members
    }

    /// Drops every packet from member `from` to member `to` (one way).
    pub fn cut(&self, from: usize, to: usize) {
        self.rule("add", from, to);
    }

    /// Lets packets from `from` to `to` through again.
    pub fn mend(&self, from: usize, to: usize) {
        self.rule("del", from, to);
    }

    fn rule(&self, verb: &str, from: usize, to: usize) {
        let (from, to) = (self.member(from), self.member(to));
        must(&[
            "-n",
            &self.router(),
            "rule",
            verb,
            "from",
            &from,
            "to",
            &to,
            "blackhole",
        ]);
    }

    /// Cuts both ways between every member of `a` and every member of `b`.
    pub fn split(&self, a: &[usize], b: &[usize]) {
        for &x in a {
            for &y in b {
                self.cut(x, y);
                self.cut(y, x);
            }
        }
    }

    /// Mends what [`Net::split`] cut.
    pub fn join(&self, a: &[usize], b: &[usize]) {
        for &x in a {
            for &y in b {
                self.mend(x, y);
                self.mend(y, x);
            }
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for i in 0..self.members {
            let _ = ip(&["netns", "del", &self.namespace(i)]);
        }
        // Deleting the router's namespace deletes the host link's other
        // end, and with it the host link and its route.
        let _ = ip(&["netns", "del", &self.router()]);
    }
}
