//! The cluster static pods in deploy/cluster/static-pod run as written:
//! this test renders the three members' manifests with render.sh, issues
//! their peer certificates with deploy/certs/issue-ephd-peer-certs.sh,
//! starts three ephd processes with exactly the flags of the manifests'
//! `command`, and checks that they form one cluster: every member turns
//! ready (its `/readyz` includes a quorum-confirmed read), and a write
//! through one member is read through another by `etcdctl` over TLS with a
//! client certificate, as kube-apiserver connects.
//!
//! Three "nodes" on one machine need three adaptations, and only these:
//! the node IPs are loopback addresses (127.0.2.10-12, edited into the
//! template the way step 3 of its header tells operators to), each
//! member's loopback listeners (`127.0.0.1:2479` and `:2481`) move to its
//! node IP, and the certificate and data paths point into a temporary
//! directory.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::tls::{issue, make_ca};

/// The manifests' node IPs and the loopback addresses standing in for them.
const NODES: [(&str, &str, &str); 3] = [
    ("cp-1", "192.0.2.10", "127.0.2.10"),
    ("cp-2", "192.0.2.11", "127.0.2.11"),
    ("cp-3", "192.0.2.12", "127.0.2.12"),
];

/// How long the three members may take to form a cluster and turn ready.
const FORM: Duration = Duration::from_secs(30);

/// A member process, killed when dropped.
struct Member(Child);

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `bash script args...` from the repository root; its stdout, or a panic
/// with its stderr.
fn bash(script: &Path, args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(script)
        .args(args)
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "{} {args:?} failed: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The flags of a rendered static pod: the `- --flag=value` items of its
/// container command.
fn command_flags(manifest: &str) -> Vec<String> {
    manifest
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("- --"))
        .map(|f| format!("--{f}"))
        .collect()
}

/// `GET path` on `ip:port`: the status line, or the connection error.
fn http_status(ip: &str, port: u16, path: &str) -> String {
    let Ok(mut s) = std::net::TcpStream::connect((ip, port)) else {
        return "connection refused".to_string();
    };
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.lines().next().unwrap_or_default().to_string()
}

/// etcdctl against `ip:2479` over TLS with the client certificate.
fn etcdctl(dir: &Path, ip: &str, args: &[&str]) -> std::process::Output {
    Command::new(crate::cli::etcdctl_path())
        .arg(format!("--endpoints=https://{ip}:2479"))
        .arg(format!("--cacert={}", dir.join("etcd-ca.crt").display()))
        .arg(format!("--cert={}", dir.join("client.crt").display()))
        .arg(format!("--key={}", dir.join("client.key").display()))
        .args(["--dial-timeout=3s", "--command-timeout=5s"])
        .args(args)
        .output()
        .expect("etcdctl runs")
}

#[test]
fn the_cluster_static_pods_form_one_cluster_with_their_own_flags() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();

    // The template, edited for this test's nodes, beside render.sh.
    let template = std::fs::read_to_string(root.join("deploy/cluster/static-pod/ephd-member.yaml"))
        .expect("the cluster static pod template");
    let mut edited = template.clone();
    for (_, manifest_ip, ip) in NODES {
        edited = edited.replace(manifest_ip, ip);
    }
    let render_dir = dir.join("static-pod");
    std::fs::create_dir(&render_dir).unwrap();
    std::fs::write(render_dir.join("ephd-member.yaml"), edited).unwrap();
    std::fs::copy(
        root.join("deploy/cluster/static-pod/render.sh"),
        render_dir.join("render.sh"),
    )
    .unwrap();

    // Certificates: the etcd CA with a client pair (the apiserver's) and a
    // serving pair per node, and the peer pairs from the deploy script.
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    make_ca(dir, "etcd-ca", "etcd-ca");
    issue(
        dir,
        "etcd-ca",
        "client",
        "client.ext",
        "kube-apiserver-etcd-client",
    );
    let peer_dir = dir.join("ephd-peer");
    let mut peer_args = vec!["--out".to_string(), peer_dir.display().to_string()];
    for (name, _, ip) in NODES {
        peer_args.push("--member".to_string());
        peer_args.push(format!("{name}={ip}"));
    }
    let peer_args: Vec<&str> = peer_args.iter().map(String::as_str).collect();
    bash(
        &root.join("deploy/certs/issue-ephd-peer-certs.sh"),
        &peer_args,
    );

    let mut members = Vec::new();
    for (name, _, ip) in NODES {
        std::fs::write(
            dir.join(format!("{name}.ext")),
            format!("subjectAltName=IP:{ip}\nextendedKeyUsage=serverAuth\n"),
        )
        .unwrap();
        issue(
            dir,
            "etcd-ca",
            &format!("{name}-server"),
            &format!("{name}.ext"),
            name,
        );
        let pki = dir.join(name);
        std::fs::create_dir(&pki).unwrap();
        for (from, to) in [
            (dir.join(format!("{name}-server.crt")), "server.crt"),
            (dir.join(format!("{name}-server.key")), "server.key"),
            (peer_dir.join(format!("{name}.crt")), "peer.crt"),
            (peer_dir.join(format!("{name}.key")), "peer.key"),
            (peer_dir.join("ca.crt"), "peer-ca.crt"),
        ] {
            std::fs::copy(&from, pki.join(to)).unwrap();
        }

        let manifest = bash(&render_dir.join("render.sh"), &[name, ip]);
        let flags: Vec<String> = command_flags(&manifest)
            .into_iter()
            .map(|f| {
                f.replace(",https://127.0.0.1:2479", "")
                    .replace("http://127.0.0.1:2481", &format!("http://{ip}:2481"))
                    .replace("/etc/kubernetes/pki/ephd", &pki.display().to_string())
                    .replace(
                        "/etc/kubernetes/pki/etcd/ca.crt",
                        &dir.join("etcd-ca.crt").display().to_string(),
                    )
                    .replace(
                        "--data-dir=/var/lib/ephd",
                        &format!("--data-dir={}", dir.join(format!("data-{name}")).display()),
                    )
            })
            .collect();
        assert!(
            flags.contains(&format!("--name={name}")),
            "render.sh named the member: {flags:?}"
        );
        assert!(
            flags
                .iter()
                .any(|f| f.starts_with("--peer-client-cert-auth=true")),
            "{flags:?}"
        );
        assert!(
            flags
                .iter()
                .any(|f| f.starts_with(&format!("--data-dir={}", dir.display()))),
            "the data directory moved into the test's: {flags:?}"
        );
        let child = Command::new(env!("CARGO_BIN_EXE_ephd"))
            .args(&flags)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ephd starts");
        members.push(Member(child));
    }

    // Every member turns ready: /readyz needs a quorum-confirmed read.
    let deadline = Instant::now() + FORM;
    for (name, _, ip) in NODES {
        loop {
            let status = http_status(ip, 2481, "/readyz");
            if status.contains(" 200 ") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name} not ready within {FORM:?}: {status}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    // A write through cp-1, a linearizable read through cp-3.
    let put = etcdctl(dir, NODES[0].2, &["put", "deploy-test", "three members"]);
    assert!(
        put.status.success(),
        "put: {}",
        String::from_utf8_lossy(&put.stderr)
    );
    let get = etcdctl(
        dir,
        NODES[2].2,
        &["get", "deploy-test", "--print-value-only"],
    );
    assert_eq!(
        String::from_utf8_lossy(&get.stdout).trim(),
        "three members",
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    let list = etcdctl(dir, NODES[1].2, &["member", "list"]);
    let list = String::from_utf8_lossy(&list.stdout);
    for (name, _, ip) in NODES {
        assert!(
            list.contains(name) && list.contains(&format!("https://{ip}:2480")),
            "{name} missing from the member list:\n{list}"
        );
    }
    drop(members);
}
