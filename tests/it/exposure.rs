//! Secure by default, as the container image runs it: the ephd binary
//! refuses plaintext on a non-loopback address (with a message naming the
//! flags and `EPHD_*` variables of both ways out) and starts only when the
//! operator opts in, with a WARN; an `https://` URL whose certificate is not
//! mounted is refused with the same directions. Configured through `EPHD_*`
//! variables, as the image's `ENV` and a `docker run -e` do.

use crate::harness::free_port;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Spawns the ephd binary with `env` set and its stderr in `dir/stderr`.
fn spawn(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Child {
    let stderr = std::fs::File::create(dir.join("stderr")).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ephd"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn ephd")
}

/// Waits (bounded) for `child` to exit by itself.
fn exit_status(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ephd did not exit within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn plaintext_on_all_interfaces_is_refused_before_anything_is_restored_or_bound() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let port = free_port();
    let url = format!("http://0.0.0.0:{port}");
    let mut child = spawn(
        dir.path(),
        &[
            ("EPHD_LISTEN_CLIENT_URLS", &url),
            ("EPHD_DATA_DIR", data.to_str().unwrap()),
        ],
        &[],
    );
    let status = exit_status(&mut child);
    let stderr = std::fs::read_to_string(dir.path().join("stderr")).unwrap();
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "refusing to serve unauthenticated plaintext gRPC on {url}"
        )),
        "{stderr}"
    );
    for named in [
        &format!("--listen-client-urls=https://0.0.0.0:{port}") as &str,
        "--client-cert-auth=true",
        "EPHD_CERT_FILE",
        &format!("http://127.0.0.1:{port}"),
        "EPHD_ALLOW_INSECURE_PLAINTEXT=true",
    ] {
        assert!(stderr.contains(named), "{named} missing from: {stderr}");
    }
    // Refused before the data directory was touched (no state file, no
    // snapshot) and before the port was bound.
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0);
    assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
}

// The opt-in itself (`--allow-insecure-plaintext`: served, with a WARN) is
// covered by `config::exposure`'s unit tests rather than here: serving it
// for real means listening on a non-loopback address, and these tests stay
// on loopback.

#[test]
fn https_without_its_certificate_is_refused_with_directions() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cert = dir.path().join("tls/tls.crt");
    let key = dir.path().join("tls/tls.key");
    // The image's defaults with nothing mounted at the certificate path.
    let mut child = spawn(
        dir.path(),
        &[
            (
                "EPHD_LISTEN_CLIENT_URLS",
                &format!("https://0.0.0.0:{port}"),
            ),
            ("EPHD_CERT_FILE", cert.to_str().unwrap()),
            ("EPHD_KEY_FILE", key.to_str().unwrap()),
            ("EPHD_CLIENT_CERT_AUTH", "true"),
        ],
        &[],
    );
    let status = exit_status(&mut child);
    let stderr = std::fs::read_to_string(dir.path().join("stderr")).unwrap();
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--cert-file (EPHD_CERT_FILE) {} does not exist",
            cert.display()
        )),
        "{stderr}"
    );
    for named in [
        "/etc/ephd/tls/tls.crt",
        "EPHD_ALLOW_INSECURE_PLAINTEXT=true",
    ] {
        assert!(stderr.contains(named), "{named} missing from: {stderr}");
    }
}
