//! With `--client-cert-auth`, a request without a token is made by the
//! user its client certificate names (the subject common name), as etcd
//! does: tried with etcdctl and certificates for `root` and for `u1`.

use crate::harness::free_port;
use crate::tls::{issue, make_ca};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn etcdctl(dir: &Path, port: u16, cert: &str, args: &[&str]) -> Output {
    Command::new(crate::references::etcdctl())
        .arg(format!("--endpoints=https://127.0.0.1:{port}"))
        .arg(format!("--cacert={}", dir.join("ca.crt").display()))
        .arg(format!(
            "--cert={}",
            dir.join(format!("{cert}.crt")).display()
        ))
        .arg(format!(
            "--key={}",
            dir.join(format!("{cert}.key")).display()
        ))
        .args(["--dial-timeout=3s", "--command-timeout=5s"])
        .args(args)
        .output()
        .expect("etcdctl must be installed (scripts/test.sh installs it)")
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_certificate_common_name_is_the_user_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    std::fs::write(d.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    make_ca(d, "ca", "ephd-auth-ca");
    issue(d, "ca", "server", "san.ext", "server");
    issue(d, "ca", "root", "client.ext", "root");
    issue(d, "ca", "u1", "client.ext", "u1");
    let port = free_port();
    let url = format!("https://127.0.0.1:{port}");
    let _ephd = Killed(
        Command::new(env!("CARGO_BIN_EXE_ephd"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .arg("--cert-file")
            .arg(d.join("server.crt"))
            .arg("--key-file")
            .arg(d.join("server.key"))
            .arg("--trusted-ca-file")
            .arg(d.join("ca.crt"))
            .args(["--client-cert-auth", "--bcrypt-cost", "4"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ephd"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "TLS ephd never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    for args in [
        &["user", "add", "root", "--new-user-password=pw"][..],
        &["user", "grant-role", "root", "root"],
        &["user", "add", "u1", "--new-user-password=p"],
        &["role", "add", "app"],
        &[
            "role",
            "grant-permission",
            "app",
            "readwrite",
            "/app/",
            "--prefix",
        ],
        &["user", "grant-role", "u1", "app"],
        &["auth", "enable"],
    ] {
        ok(etcdctl(d, port, "root", args));
    }
    // u1's certificate: its permissions, no more.
    assert_eq!(ok(etcdctl(d, port, "u1", &["put", "/app/x", "1"])), "OK\n");
    let denied = etcdctl(d, port, "u1", &["put", "/b", "1"]);
    assert!(!denied.status.success());
    assert!(
        String::from_utf8_lossy(&denied.stderr).contains("etcdserver: permission denied"),
        "{denied:?}"
    );
    let denied = etcdctl(d, port, "u1", &["user", "list"]);
    assert!(String::from_utf8_lossy(&denied.stderr).contains("permission denied"));
    // root's certificate: everything.
    assert_eq!(ok(etcdctl(d, port, "root", &["put", "/b", "1"])), "OK\n");
    assert_eq!(
        ok(etcdctl(d, port, "root", &["user", "list"])),
        "root\nu1\n"
    );
    // A token still wins over the certificate: u1's password, root's cert.
    let as_u1 = etcdctl(d, port, "root", &["--user", "u1:p", "put", "/c", "1"]);
    assert!(String::from_utf8_lossy(&as_u1.stderr).contains("permission denied"));
}
