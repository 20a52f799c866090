//! A trusted CA file means client certificates are required, as in etcd:
//! stock etcd 3.4 and ephd, started with the same TLS flags and WITHOUT
//! `--client-cert-auth` (or `--peer-client-cert-auth`), both refuse a
//! client that presents no certificate and both serve one presenting a
//! certificate the CA signed, on the client listener and on the peer
//! listener. An operator copying an etcd command line must not get an open
//! server where etcd was closed.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_rustls::rustls::{self, pki_types::ServerName};
use tokio_rustls::TlsConnector;

use crate::cluster::{agreed_leader, put, same_everywhere, TIMING};
use crate::harness::{free_port, EphdCluster, ServerProcess};
use crate::tls::{https_ephd, make_certs, rustls_client, tls_client};

/// How long a server may take to serve its first request.
const READY: Duration = Duration::from_secs(30);

/// A stock etcd and its throw-away data dir (dropped after the process,
/// in declaration order, so etcd is gone before its data).
struct StockEtcd {
    process: ServerProcess,
    _data: tempfile::TempDir,
}

/// Starts stock etcd, single member, with the client URL `client_url`,
/// the peer URL `{peer_scheme}://127.0.0.1:{peer}` and `flags` (the TLS
/// flags under test).
fn stock_etcd(client_url: &str, peer_scheme: &str, peer: u16, flags: &[String]) -> StockEtcd {
    let etcd = crate::references::etcd();
    let data = tempfile::Builder::new()
        .prefix("ephd-it-etcd-")
        .tempdir()
        .unwrap();
    let peer_url = format!("{peer_scheme}://127.0.0.1:{peer}");
    let mut cmd = Command::new(etcd);
    cmd.args(["--name", "default"])
        .arg("--data-dir")
        .arg(data.path())
        .args(["--listen-client-urls", client_url])
        .args(["--advertise-client-urls", client_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .arg(format!("--initial-cluster=default={peer_url}"))
        .args(["--logger", "zap", "--log-outputs", "stderr"])
        .args(flags);
    StockEtcd {
        process: ServerProcess::spawn("stock etcd", cmd),
        _data: data,
    }
}

/// etcdctl against `https://127.0.0.1:{port}`, trusting `ca.crt`, with
/// `client.crt` presented when `with_cert`.
fn etcdctl(dir: &Path, port: u16, with_cert: bool, args: &[&str]) -> Output {
    let mut cmd = Command::new(crate::references::etcdctl());
    cmd.arg(format!("--endpoints=https://127.0.0.1:{port}"))
        .arg(format!("--cacert={}", dir.join("ca.crt").display()))
        .args(["--dial-timeout=3s", "--command-timeout=3s"]);
    if with_cert {
        cmd.arg(format!("--cert={}", dir.join("client.crt").display()))
            .arg(format!("--key={}", dir.join("client.key").display()));
    }
    cmd.args(args).output().expect("etcdctl (scripts/test.sh)")
}

/// Waits until `port` serves a put from a client with a certificate.
fn wait_served(dir: &Path, port: u16, process: &ServerProcess) {
    let deadline = Instant::now() + READY;
    loop {
        let out = etcdctl(dir, port, true, &["put", "ready", "1"]);
        if out.status.success() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never served a client with a certificate: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            process.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A put then a get through the real etcd client, presenting `client.crt`
/// when `with_cert`; the error text if either fails.
async fn put_and_get(dir: &Path, port: u16, with_cert: bool) -> Result<(), String> {
    let mut client = tls_client(dir, port, with_cert.then_some("client")).await?;
    client
        .put("crate-key", "crate-value", None)
        .await
        .map_err(|e| format!("put: {e}"))?;
    let got = client
        .get("crate-key", None)
        .await
        .map_err(|e| format!("get: {e}"))?;
    match got.kvs().first().map(|kv| kv.value()) {
        Some(b"crate-value") => Ok(()),
        other => Err(format!("get answered {other:?}")),
    }
}

/// What the client listener at `port` does with etcdctl and the etcd
/// client, without and with a client certificate: refused, served.
async fn client_verdicts(dir: &Path, port: u16, who: &str) {
    let anonymous = etcdctl(dir, port, false, &["put", "k", "anonymous"]);
    assert!(
        !anonymous.status.success(),
        "{who}: etcdctl without a certificate was served"
    );
    let stderr = String::from_utf8_lossy(&anonymous.stderr);
    assert!(
        stderr.contains("context deadline exceeded"),
        "{who}: etcdctl without a certificate fails as against etcd: {stderr}"
    );
    let put = etcdctl(dir, port, true, &["put", "k", "certified"]);
    assert!(
        put.status.success(),
        "{who}: {}",
        String::from_utf8_lossy(&put.stderr)
    );
    let get = etcdctl(dir, port, true, &["get", "k", "--print-value-only"]);
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "certified");
    let crate_anonymous = put_and_get(dir, port, false).await;
    assert!(
        crate_anonymous.is_err(),
        "{who}: the etcd client without a certificate was served"
    );
    put_and_get(dir, port, true)
        .await
        .unwrap_or_else(|e| panic!("{who}: the etcd client with a certificate: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_ca_without_client_cert_auth_requires_client_certificates_as_etcd_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_certs(dir);
    // The same TLS flags for both: a CA, no --client-cert-auth.
    let tls = [
        format!("--cert-file={}", dir.join("server.crt").display()),
        format!("--key-file={}", dir.join("server.key").display()),
        format!("--trusted-ca-file={}", dir.join("ca.crt").display()),
    ];

    // Stock etcd, the reference.
    let port = free_port();
    let etcd = stock_etcd(
        &format!("https://127.0.0.1:{port}"),
        "http",
        free_port(),
        &tls,
    );
    wait_served(dir, port, &etcd.process);
    client_verdicts(dir, port, "stock etcd").await;

    let port = free_port();
    let mut cmd = https_ephd(port);
    cmd.args(&tls);
    let ephd = ServerProcess::spawn("ephd", cmd);
    wait_served(dir, port, &ephd);
    client_verdicts(dir, port, "ephd").await;
    let logs = ephd.logs();
    assert!(
        logs.contains(r#""client_certificates":"required""#),
        "the TLS summary says client certificates are required:\n{logs}"
    );
}

/// A TLS 1.2 handshake with `127.0.0.1:{port}`, trusting `ca`, presenting
/// `identity` (certificate and key files) if given. TLS 1.2, as with
/// `openssl s_client -tls1_2`: the server judges the client's certificate
/// before it finishes the handshake, so a refusal fails the handshake
/// itself (under TLS 1.3 it would come as an alert after the client's
/// side had finished).
async fn handshake(port: u16, ca: &Path, identity: Option<(&Path, &Path)>) -> Result<(), String> {
    let config = rustls_client(ca, identity, &[&rustls::version::TLS12]);
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let connect = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp);
    match tokio::time::timeout(Duration::from_secs(5), connect).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the handshake timed out".to_string()),
    }
}

/// What the peer listener at `port` does with a TLS client: without a
/// certificate refused, with a certificate of the peer CA served, with one
/// of another CA refused. Waits first until the certified one gets in.
async fn peer_verdicts(dir: &Path, port: u16, who: &str, logs: impl Fn() -> String) {
    let ca = dir.join("peer-ca.crt");
    let member = (dir.join("peer.crt"), dir.join("peer.key"));
    let deadline = Instant::now() + READY;
    while let Err(e) = handshake(port, &ca, Some((&member.0, &member.1))).await {
        assert!(
            Instant::now() < deadline,
            "{who}: a member's certificate never got in: {e}\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let anonymous = handshake(port, &ca, None).await;
    assert!(
        anonymous.is_err(),
        "{who}: a handshake without a client certificate completed"
    );
    let rogue = (dir.join("rogue.crt"), dir.join("rogue.key"));
    let rogue = handshake(port, &ca, Some((&rogue.0, &rogue.1))).await;
    assert!(
        rogue.is_err(),
        "{who}: a certificate of another CA completed the handshake"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_ca_without_peer_client_cert_auth_requires_member_certificates_as_etcd_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // The rogue certificate names the allowed CN: only the CA tells it apart.
    crate::cluster::tls::peer_certs_with_rogue(dir, "ephd-member");
    let path = |f: &str| dir.join(f).display().to_string();
    // The same peer TLS flags for both, with --peer-cert-allowed-cn, which
    // etcd 3.4 takes without --peer-client-cert-auth too.
    let flags = vec![
        format!("--peer-cert-file={}", path("peer.crt")),
        format!("--peer-key-file={}", path("peer.key")),
        format!("--peer-trusted-ca-file={}", path("peer-ca.crt")),
        "--peer-cert-allowed-cn=ephd-member".to_string(),
    ];

    let peer = free_port();
    let client = format!("http://127.0.0.1:{}", free_port());
    let etcd = stock_etcd(&client, "https", peer, &flags);
    peer_verdicts(dir, peer, "stock etcd", || etcd.process.logs()).await;

    // ephd serves peers in cluster mode only, so three members: they
    // form a cluster and replicate with these flags (each presents its
    // certificate as etcd's members do), and every peer port turns away
    // a client without one.
    let mut args: Vec<&str> = TIMING.to_vec();
    args.extend(flags.iter().map(String::as_str));
    let cluster = EphdCluster::start_with_peer_scheme(3, &args, "https");
    let (leader, _) = agreed_leader(&cluster, None).await;
    let rev = put(cluster.member(leader).unwrap(), "over", "peer TLS").await;
    assert_eq!(same_everywhere(&cluster, rev).await.len(), 1, "the one key");
    for (i, member) in cluster.running() {
        let who = format!("ephd m{i}");
        peer_verdicts(dir, member.peer_port(), &who, || cluster.logs()).await;
    }
}
