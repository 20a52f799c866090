//! TLS: https:// listeners with etcd's flag names, ALPN `h2` (grpc-go 1.67+
//! clients, i.e. kube-apiserver 1.33+, refuse servers without it), and
//! client certificates (required whenever `--trusted-ca-file` is given, as
//! in etcd; `tls_ca_required.rs` compares that with stock etcd).

use crate::harness::free_port;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_rustls::rustls;

/// Runs openssl, panicking with its output on failure.
pub(crate) fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl must be installed to generate test certificates");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed CA: `{name}.crt` and `{name}.key` in `dir`.
pub(crate) fn make_ca(dir: &Path, name: &str, cn: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-subj",
            &format!("/CN={cn}"),
        ],
    );
}

/// `{name}.crt` and `{name}.key`, signed by the CA `{ca}.crt`/`{ca}.key`,
/// with the extensions in the file `ext` (`san.ext` for servers,
/// `client.ext` for clients, both written by [`make_certs`]).
pub(crate) fn issue(dir: &Path, ca: &str, name: &str, ext: &str, cn: &str) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={cn}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-extfile",
            ext,
        ],
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate.
/// A rustls client configuration trusting the CA certificates of `ca`
/// (PEM file), presenting `identity` (certificate and key files) if given,
/// speaking `versions` of TLS; no ALPN.
pub(crate) fn rustls_client(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> rustls::ClientConfig {
    use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap()
    .with_root_certificates(roots);
    match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_file(cert).unwrap()],
                PrivateKeyDer::from_pem_file(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    }
}

/// The real etcd client over TLS to `https://127.0.0.1:{port}`, trusting
/// `ca.crt` in `dir` and presenting `{who}.crt`/`{who}.key` when `who` is
/// given, with 3 s timeouts; the error text if it cannot connect.
pub(crate) async fn tls_client(
    dir: &Path,
    port: u16,
    who: Option<&str>,
) -> Result<etcd_client::Client, String> {
    let read = |f: String| std::fs::read(dir.join(f)).unwrap();
    let mut tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read("ca.crt".into())))
        .domain_name("localhost");
    if let Some(who) = who {
        tls = tls.identity(etcd_client::Identity::from_pem(
            read(format!("{who}.crt")),
            read(format!("{who}.key")),
        ));
    }
    let opts = etcd_client::ConnectOptions::new()
        .with_tls(tls)
        .with_connect_timeout(Duration::from_secs(3))
        .with_timeout(Duration::from_secs(3));
    etcd_client::Client::connect([format!("https://127.0.0.1:{port}")], Some(opts))
        .await
        .map_err(|e| format!("connect: {e}"))
}

pub(crate) fn make_certs(dir: &Path) {
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    make_ca(dir, "ca", "ephd-test-ca");
    issue(dir, "ca", "server", "san.ext", "server");
    issue(dir, "ca", "client", "client.ext", "client");
}

pub(crate) struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What [`start_tls_ephd`] asks of clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientCerts {
    /// No `--trusted-ca-file`: TLS without client certificates.
    NotAsked,
    /// `--trusted-ca-file` and `--client-cert-auth`: a certificate `ca.crt`
    /// signed is required (as with the CA alone), and its CN is the user of
    /// requests without a token.
    CnIsUser,
}

/// The ephd command listening for (and advertising) clients on
/// `https://127.0.0.1:{port}`; the caller adds its TLS flags.
pub(crate) fn https_ephd(port: u16) -> Command {
    let url = format!("https://127.0.0.1:{port}");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ephd"));
    cmd.args([
        "--listen-client-urls",
        &url,
        "--advertise-client-urls",
        &url,
    ]);
    cmd
}

/// ephd serving TLS on a free loopback port with `dir`'s `server.crt`,
/// asking `certs` of its clients; waits until it listens.
pub(crate) fn start_tls_ephd(dir: &Path, certs: ClientCerts) -> (Killed, u16) {
    let port = free_port();
    let child = https_ephd(port)
        .arg("--cert-file")
        .arg(dir.join("server.crt"))
        .arg("--key-file")
        .arg(dir.join("server.key"))
        .args(match certs {
            ClientCerts::NotAsked => vec![],
            ClientCerts::CnIsUser => vec![
                format!("--trusted-ca-file={}", dir.join("ca.crt").display()),
                "--client-cert-auth=true".to_string(),
            ],
        })
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ephd");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "TLS ephd never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    (Killed(child), port)
}

fn etcdctl(dir: &Path, port: u16, with_client_cert: bool, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(crate::references::etcdctl());
    cmd.arg(format!("--endpoints=https://127.0.0.1:{port}"))
        .arg(format!("--cacert={}", dir.join("ca.crt").display()))
        .arg("--dial-timeout=3s")
        .arg("--command-timeout=3s");
    if with_client_cert {
        cmd.arg(format!("--cert={}", dir.join("client.crt").display()))
            .arg(format!("--key={}", dir.join("client.key").display()));
    }
    cmd.args(args)
        .output()
        .expect("etcdctl must be installed (scripts/test.sh installs it)")
}

#[tokio::test]
async fn tls_serves_alpn_h2_and_real_clients() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    // No CA: TLS without client certificates (with one, they are required;
    // see tls_ca_required.rs).
    let (_server, port) = start_tls_ephd(dir.path(), ClientCerts::NotAsked);

    // ALPN: the server must select h2.
    let out = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-alpn",
            "h2",
            "-CAfile",
        ])
        .arg(dir.path().join("ca.crt"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("ALPN protocol: h2"),
        "server did not negotiate h2:\n{text}"
    );

    // etcdctl over TLS.
    let put = etcdctl(dir.path(), port, false, &["put", "tls-key", "tls-value"]);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let get = etcdctl(
        dir.path(),
        port,
        false,
        &["get", "tls-key", "--print-value-only"],
    );
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "tls-value");

    // The Rust etcd-client over TLS (rustls, which insists on ALPN h2).
    let ca = std::fs::read(dir.path().join("ca.crt")).unwrap();
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(ca))
        .domain_name("localhost");
    let opts = etcd_client::ConnectOptions::new()
        .with_tls(tls)
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(5));
    let mut client =
        etcd_client::Client::connect([format!("https://127.0.0.1:{port}")], Some(opts))
            .await
            .expect("TLS connect");
    let resp = client.get("tls-key", None).await.expect("TLS get");
    assert_eq!(resp.kvs()[0].value(), b"tls-value");
}

#[tokio::test]
async fn client_cert_auth_rejects_clients_without_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let (_server, port) = start_tls_ephd(dir.path(), ClientCerts::CnIsUser);
    let denied = etcdctl(dir.path(), port, false, &["put", "k", "v"]);
    assert!(
        !denied.status.success(),
        "a client without a certificate was served"
    );
    let allowed = etcdctl(dir.path(), port, true, &["put", "k", "v"]);
    assert!(
        allowed.status.success(),
        "{}",
        String::from_utf8_lossy(&allowed.stderr)
    );
}
