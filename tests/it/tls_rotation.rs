//! Certificates rotate without a restart: ephd re-reads `--cert-file`,
//! `--key-file` and `--trusted-ca-file` when they change (every
//! `--tls-reload-interval`) and on SIGHUP. New connections get the new
//! certificates, established ones keep going, and files that do not load
//! leave the old certificates in place with a WARN.
//!
//! Each test runs the real binary on a loopback port and looks at the
//! certificate a fresh TLS handshake presents (rustls client), and at what
//! real clients (tonic over one TLS connection, etcdctl) can do.

use crate::harness::free_port;
use crate::tls::{issue, make_ca, make_certs, rustls_client};
use ephd::proto::etcdserverpb::{kv_client::KvClient, PutRequest};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_rustls::rustls::{
    self,
    pki_types::{pem::PemObject, CertificateDer, ServerName},
    ClientConfig,
};
use tokio_rustls::TlsConnector;

/// How long a change may take to show: several reload intervals, with room
/// for a loaded machine.
const PICKUP: Duration = Duration::from_secs(15);

/// An ephd child process serving TLS, logging to a file.
struct Ephd {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Ephd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Ephd {
    fn start(
        dir: &Path,
        files: (&Path, &Path, &Path),
        client_cert_auth: bool,
        reload_interval: &str,
    ) -> Ephd {
        let port = free_port();
        let url = format!("https://127.0.0.1:{port}");
        let log = dir.join(format!("ephd-{port}.log"));
        let stderr = std::fs::File::create(dir.join(format!("ephd-{port}.stderr"))).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ephd"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .arg("--cert-file")
            .arg(files.0)
            .arg("--key-file")
            .arg(files.1)
            .arg("--trusted-ca-file")
            .arg(files.2)
            .arg(format!("--client-cert-auth={client_cert_auth}"))
            .arg(format!("--tls-reload-interval={reload_interval}"))
            .arg("--log-outputs")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn ephd");
        Ephd { child, port, log }
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    async fn wait_for_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + PICKUP;
        loop {
            let log = self.log();
            if log.contains(needle) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "the log never said {needle:?}:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The certificate a new connection is served, or why the handshake
    /// failed. The client presents no certificate: under TLS 1.3 (what
    /// rustls negotiates with ephd) its side of the handshake ends before
    /// the server judges the client, so this sees the server certificate
    /// of a server that requires client certificates too.
    async fn served(&self, ca: &Path) -> Result<Vec<u8>, String> {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let tls = TlsConnector::from(Arc::new(client_config(ca, None)))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let (_, session) = tls.get_ref();
        assert_eq!(session.alpn_protocol(), Some(&b"h2"[..]), "ALPN h2");
        Ok(session.peer_certificates().expect("a certificate")[0].to_vec())
    }

    /// Waits until new connections are served `cert` (verified with `ca`).
    async fn wait_served(&self, ca: &Path, cert: &Path) {
        let want = der(cert);
        let deadline = Instant::now() + PICKUP;
        loop {
            let got = self.served(ca).await;
            if got.as_ref() == Ok(&want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} was never served (last: {:?})\n{}",
                cert.display(),
                got.map(|_| "another certificate"),
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn etcdctl(&self, ca: &Path, client: Option<(&Path, &Path)>, args: &[&str]) -> Output {
        let mut cmd = Command::new(crate::references::etcdctl());
        cmd.arg(format!("--endpoints=https://127.0.0.1:{}", self.port))
            .arg(format!("--cacert={}", ca.display()))
            .arg("--dial-timeout=3s")
            .arg("--command-timeout=3s");
        if let Some((cert, key)) = client {
            cmd.arg(format!("--cert={}", cert.display()))
                .arg(format!("--key={}", key.display()));
        }
        cmd.args(args)
            .output()
            .expect("etcdctl must be installed (scripts/test.sh installs it)")
    }
}

fn der(pem: &Path) -> Vec<u8> {
    CertificateDer::from_pem_file(pem)
        .unwrap_or_else(|e| panic!("{}: {e}", pem.display()))
        .to_vec()
}

/// A rustls client trusting `ca`, with the client certificate and key
/// `client` if given, asking for ALPN h2 as gRPC clients do.
fn client_config(ca: &Path, client: Option<(&Path, &Path)>) -> ClientConfig {
    let mut config = rustls_client(ca, client, rustls::DEFAULT_VERSIONS);
    config.alpn_protocols = vec![b"h2".to_vec()];
    config
}

/// A gRPC channel to `port` whose every dial is counted in `dials`: with
/// one dial, every request went over the same TLS connection.
async fn counted_channel(
    port: u16,
    tls: ClientConfig,
    dials: Arc<AtomicUsize>,
) -> tonic::transport::Channel {
    let connector = TlsConnector::from(Arc::new(tls));
    // http://: tonic adds no TLS of its own; the connector does it.
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::codegen::http::Uri| {
            dials.fetch_add(1, Ordering::SeqCst);
            let connector = connector.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
                let tls = connector
                    .connect(ServerName::try_from("localhost").unwrap(), tcp)
                    .await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
        .expect("gRPC over TLS")
}

/// Replaces `to` with a copy of `from` in one rename, as most tools that
/// write certificates do.
fn replace(from: &Path, to: &Path) {
    let tmp = to.with_extension("tmp");
    std::fs::copy(from, &tmp).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

/// Copies the server's and the CA's certificates into `dir/live/`, where
/// the tests change them, and returns those paths.
fn live_files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let live = dir.join("live");
    std::fs::create_dir(&live).unwrap();
    let files = (
        live.join("server.crt"),
        live.join("server.key"),
        live.join("ca.crt"),
    );
    std::fs::copy(dir.join("server.crt"), &files.0).unwrap();
    std::fs::copy(dir.join("server.key"), &files.1).unwrap();
    std::fs::copy(dir.join("ca.crt"), &files.2).unwrap();
    files
}

/// One version of a Kubernetes secret volume: a directory holding the
/// files under the names the secret gives them.
fn secret_version(volume: &Path, version: &str, dir: &Path, server: &str) {
    let v = volume.join(version);
    std::fs::create_dir_all(&v).unwrap();
    std::fs::copy(dir.join(format!("{server}.crt")), v.join("tls.crt")).unwrap();
    std::fs::copy(dir.join(format!("{server}.key")), v.join("tls.key")).unwrap();
    std::fs::copy(dir.join("ca.crt"), v.join("ca.crt")).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_mid_traffic_keeps_the_connection_and_serves_the_new_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_certs(dir);
    issue(dir, "ca", "server2", "san.ext", "server-2");
    // A Kubernetes secret volume: each name is a symlink through `..data`
    // to a versioned directory; an update writes a new directory and
    // swaps `..data` with one rename, so the paths ephd was given never
    // change, only what they resolve to.
    let volume = dir.join("secret");
    secret_version(&volume, "..v1", dir, "server");
    std::os::unix::fs::symlink("..v1", volume.join("..data")).unwrap();
    for name in ["tls.crt", "tls.key", "ca.crt"] {
        std::os::unix::fs::symlink(format!("..data/{name}"), volume.join(name)).unwrap();
    }
    let server = Ephd::start(
        dir,
        (
            &volume.join("tls.crt"),
            &volume.join("tls.key"),
            &volume.join("ca.crt"),
        ),
        true,
        "200ms",
    );
    let ca = dir.join("ca.crt");
    server.wait_served(&ca, &dir.join("server.crt")).await;

    // A client writes over one TLS connection, without pause.
    let dials = Arc::new(AtomicUsize::new(0));
    let tls = client_config(
        &ca,
        Some((&dir.join("client.crt"), &dir.join("client.key"))),
    );
    let mut kv = KvClient::new(counted_channel(server.port, tls, dials.clone()).await);
    let written = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writer = tokio::spawn({
        let (written, stop) = (written.clone(), stop.clone());
        async move {
            let mut i = 0usize;
            while !stop.load(Ordering::SeqCst) {
                kv.put(PutRequest {
                    key: b"/rotation".to_vec().into(),
                    value: i.to_string().into_bytes().into(),
                    ..Default::default()
                })
                .await
                .map_err(|e| format!("write {i} failed: {e}"))?;
                i += 1;
                written.store(i, Ordering::SeqCst);
            }
            Ok::<usize, String>(i)
        }
    });
    let wait_writes = |n: usize| {
        let written = written.clone();
        async move {
            let deadline = Instant::now() + PICKUP;
            while written.load(Ordering::SeqCst) < n {
                assert!(Instant::now() < deadline, "the writer stalled");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    tokio::select! {
        _ = wait_writes(50) => {}
        r = &mut writer => panic!("the writer ended before the rotation: {r:?}"),
    }
    let before = written.load(Ordering::SeqCst);

    // The secret is updated: new version directory, `..data` swapped.
    secret_version(&volume, "..v2", dir, "server2");
    std::os::unix::fs::symlink("..v2", volume.join("..data_tmp")).unwrap();
    std::fs::rename(volume.join("..data_tmp"), volume.join("..data")).unwrap();

    // New connections get the new certificate...
    server.wait_served(&ca, &dir.join("server2.crt")).await;
    // ...while the old connection keeps writing.
    let rotated = written.load(Ordering::SeqCst);
    tokio::select! {
        _ = wait_writes(rotated + 50) => {}
        r = &mut writer => panic!("the writer ended after the rotation: {r:?}\n{}", server.log()),
    }
    stop.store(true, Ordering::SeqCst);
    let total = writer
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    assert!(total >= rotated + 50 && rotated >= before);
    assert_eq!(
        dials.load(Ordering::SeqCst),
        1,
        "every write went over the connection made before the rotation"
    );

    // A real client on a new connection, with the same client certificate
    // (same CA), reads the last write.
    let get = server.etcdctl(
        &ca,
        Some((&dir.join("client.crt"), &dir.join("client.key"))),
        &["get", "/rotation", "--print-value-only"],
    );
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&get.stdout).trim(),
        (total - 1).to_string()
    );
    let log = server.log();
    assert!(
        log.contains("reloaded TLS certificates") && log.contains("CN=server-2"),
        "the reload is logged with the new subject:\n{log}"
    );
}

#[tokio::test]
async fn a_new_ca_bundle_refuses_old_client_certificates_and_admits_new_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_certs(dir);
    make_ca(dir, "ca2", "ephd-test-ca-2");
    issue(dir, "ca2", "server2", "san.ext", "server-2");
    issue(dir, "ca2", "client2", "client.ext", "client-2");
    let (cert, key, ca) = live_files(dir);
    let server = Ephd::start(dir, (&cert, &key, &ca), true, "200ms");
    server.wait_served(&dir.join("ca.crt"), &cert).await;
    let old_client = (dir.join("client.crt"), dir.join("client.key"));
    let put = server.etcdctl(
        &dir.join("ca.crt"),
        Some((&old_client.0, &old_client.1)),
        &["put", "k", "before"],
    );
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );

    // Everything moves to the new CA, one file after the other.
    replace(&dir.join("ca2.crt"), &ca);
    replace(&dir.join("server2.crt"), &cert);
    replace(&dir.join("server2.key"), &key);
    let ca2 = dir.join("ca2.crt");
    server.wait_served(&ca2, &dir.join("server2.crt")).await;

    let refused = server.etcdctl(
        &ca2,
        Some((&old_client.0, &old_client.1)),
        &["put", "k", "old-client"],
    );
    assert!(
        !refused.status.success(),
        "a client certificate of the removed CA was accepted"
    );
    let admitted = server.etcdctl(
        &ca2,
        Some((&dir.join("client2.crt"), &dir.join("client2.key"))),
        &["put", "k", "new-client"],
    );
    assert!(
        admitted.status.success(),
        "{}",
        String::from_utf8_lossy(&admitted.stderr)
    );
    let get = server.etcdctl(
        &ca2,
        Some((&dir.join("client2.crt"), &dir.join("client2.key"))),
        &["get", "k", "--print-value-only"],
    );
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "new-client");
}

#[tokio::test]
async fn a_half_written_pair_keeps_the_old_certificate_and_warns() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_certs(dir);
    issue(dir, "ca", "server2", "san.ext", "server-2");
    let (cert, key, ca) = live_files(dir);
    let server = Ephd::start(dir, (&cert, &key, &ca), false, "100ms");
    // With a trusted CA every client presents a certificate (as in etcd).
    let client = (dir.join("client.crt"), dir.join("client.key"));
    server.wait_served(&ca, &dir.join("server.crt")).await;

    // The new certificate is written in place; its key is not yet.
    std::fs::copy(dir.join("server2.crt"), &cert).unwrap();
    let needle = "cannot reload TLS certificates; keeping the previous ones";
    let log = server.wait_for_log(needle).await;
    // The default logger writes JSON lines (`"level":"warn"`).
    let line = log
        .lines()
        .find(|l| l.contains(needle))
        .expect("the line just found");
    assert!(
        line.contains(r#""level":"warn""#),
        "logged as a warning:\n{line}"
    );
    assert_eq!(server.served(&ca).await, Ok(der(&dir.join("server.crt"))));
    let put = server.etcdctl(&ca, Some((&client.0, &client.1)), &["put", "k", "v"]);
    assert!(
        put.status.success(),
        "the old certificate still serves: {}",
        String::from_utf8_lossy(&put.stderr)
    );

    // The key arrives cut off half way: still the old pair.
    let new_key = std::fs::read(dir.join("server2.key")).unwrap();
    std::fs::write(&key, &new_key[..new_key.len() / 2]).unwrap();
    server
        .wait_for_log("cannot reload TLS certificates; keeping the previous ones")
        .await;
    assert_eq!(server.served(&ca).await, Ok(der(&dir.join("server.crt"))));

    // The whole key: the new pair goes live.
    std::fs::write(&key, &new_key).unwrap();
    server.wait_served(&ca, &dir.join("server2.crt")).await;
    server.wait_for_log("reloaded TLS certificates").await;
}

#[tokio::test]
async fn sighup_reloads_the_certificates() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_certs(dir);
    issue(dir, "ca", "server2", "san.ext", "server-2");
    let (cert, key, ca) = live_files(dir);
    // Polling off: only SIGHUP reloads.
    let mut server = Ephd::start(dir, (&cert, &key, &ca), false, "0");
    // With a trusted CA every client presents a certificate (as in etcd).
    let client = (dir.join("client.crt"), dir.join("client.key"));
    server.wait_served(&ca, &dir.join("server.crt")).await;

    replace(&dir.join("server2.crt"), &cert);
    replace(&dir.join("server2.key"), &key);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        server.served(&ca).await,
        Ok(der(&dir.join("server.crt"))),
        "nothing reloads without polling until SIGHUP"
    );

    let pid = server.child.id() as libc::pid_t;
    // SAFETY: kill(2) with the pid of a child this test started and has
    // not yet reaped.
    let rc = unsafe { libc::kill(pid, libc::SIGHUP) };
    assert_eq!(rc, 0, "kill(SIGHUP)");
    server.wait_served(&ca, &dir.join("server2.crt")).await;
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "SIGHUP must not end the server"
    );
    server.wait_for_log("(SIGHUP)").await;
    let put = server.etcdctl(&ca, Some((&client.0, &client.1)), &["put", "k", "v"]);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
}
