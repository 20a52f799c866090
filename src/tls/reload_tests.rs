//! The reloader against real files and real rustls handshakes (over an
//! in-memory pipe). The certificates in `testdata/` are P-256 test
//! certificates valid for 100 years, made once with `openssl req`/`openssl
//! x509`: a CA (`CN=ephd-unit-test-ca`, whose key was thrown away) and two
//! server certificates it signed, `server-a` and `server-b`; a client CA
//! (`crl-v1-ca.crt`, made for the revocation tests) and client certificates
//! it signed (`crl-v1-served`, `crl-v1-revoked`).

use super::*;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

const CA: &str = include_str!("testdata/ca.crt");
const CERT_A: &str = include_str!("testdata/server-a.crt");
const KEY_A: &str = include_str!("testdata/server-a.key");
const CERT_B: &str = include_str!("testdata/server-b.crt");
const KEY_B: &str = include_str!("testdata/server-b.key");
/// The `--trusted-ca-file` of the fixtures: it signed [`CLIENT_CERT`].
const CLIENT_CA: &str = include_str!("testdata/crl-v1-ca.crt");
const CLIENT_CERT: &str = include_str!("testdata/crl-v1-served.crt");
const CLIENT_KEY: &str = include_str!("testdata/crl-v1-served.key");

/// Files in a temporary directory and a reloader over them. A trusted CA
/// is given, so clients must present a certificate it signed (as in etcd,
/// whatever `--client-cert-auth` says); the clients of these tests present
/// [`CLIENT_CERT`].
struct Fixture {
    dir: tempfile::TempDir,
    reloader: Reloader,
}

impl Fixture {
    fn new(client_cert_auth: bool) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tls.crt"), CERT_A).unwrap();
        std::fs::write(dir.path().join("tls.key"), KEY_A).unwrap();
        std::fs::write(dir.path().join("ca.crt"), CLIENT_CA).unwrap();
        let mut config = Config::defaults();
        config.cert_file = Some(dir.path().join("tls.crt"));
        config.key_file = Some(dir.path().join("tls.key"));
        config.trusted_ca_file = Some(dir.path().join("ca.crt"));
        config.client_cert_auth = client_cert_auth;
        let reloader = Reloader::new(&config).expect("the initial files load");
        Fixture { dir, reloader }
    }

    fn write(&self, name: &str, content: &str) {
        std::fs::write(self.dir.path().join(name), content).unwrap();
    }

    /// The certificate a client sees when it connects now.
    async fn served(&self) -> Vec<u8> {
        served(&self.reloader.live()).await
    }
}

/// A client that trusts [`CA`] (the servers' CA) and presents
/// [`CLIENT_CERT`].
fn client_config() -> rustls::ClientConfig {
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(CA.as_bytes()) {
        roots.add(ca.unwrap()).unwrap();
    }
    let chain = vec![CertificateDer::from_pem_slice(CLIENT_CERT.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(CLIENT_KEY.as_bytes()).unwrap();
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap()
}

/// The certificate a client sees when it connects with `live` now.
async fn served(live: &Live) -> Vec<u8> {
    let mut client = client_config();
    client.alpn_protocols = vec![ALPN_H2.to_vec()];
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let acceptor = TlsAcceptor::from(live.current());
    let server = tokio::spawn(async move { acceptor.accept(server_io).await.map(|_| ()) });
    let tls = TlsConnector::from(Arc::new(client))
        .connect(ServerName::try_from("localhost").unwrap(), client_io)
        .await
        .expect("handshake");
    server.await.unwrap().expect("server side of the handshake");
    let (_, session) = tls.get_ref();
    assert_eq!(session.alpn_protocol(), Some(ALPN_H2), "ALPN h2 is kept");
    session.peer_certificates().unwrap()[0].to_vec()
}

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

#[tokio::test]
async fn unchanged_files_are_not_reloaded() {
    let mut f = Fixture::new(false);
    let before = f.reloader.live().current();
    assert!(!f.reloader.reload(Trigger::Poll));
    assert!(Arc::ptr_eq(&before, &f.reloader.live().current()));
    assert_eq!(f.served().await, der(CERT_A));
}

#[tokio::test]
async fn a_new_pair_is_served_to_new_connections() {
    let mut f = Fixture::new(false);
    f.write("tls.crt", CERT_B);
    f.write("tls.key", KEY_B);
    assert!(f.reloader.reload(Trigger::Poll));
    assert_eq!(f.served().await, der(CERT_B));
    // Nothing changed since: the next poll leaves it alone.
    assert!(!f.reloader.reload(Trigger::Poll));
}

#[tokio::test]
async fn a_half_written_pair_keeps_the_old_certificate() {
    let mut f = Fixture::new(false);
    let before = f.reloader.live().current();
    // The certificate is new, the key still the old one.
    f.write("tls.crt", CERT_B);
    assert!(!f.reloader.reload(Trigger::Poll));
    assert!(f.reloader.failure.is_some(), "the failure is remembered");
    assert!(Arc::ptr_eq(&before, &f.reloader.live().current()));
    assert_eq!(f.served().await, der(CERT_A));
    // The certificate cut off half way.
    f.write("tls.crt", &CERT_B[..CERT_B.len() / 2]);
    f.write("tls.key", KEY_B);
    assert!(!f.reloader.reload(Trigger::Poll));
    assert_eq!(f.served().await, der(CERT_A));
    // A missing file (a rename in progress) is not fatal either.
    std::fs::remove_file(f.dir.path().join("tls.crt")).unwrap();
    assert!(!f.reloader.reload(Trigger::Poll));
    assert_eq!(f.served().await, der(CERT_A));
    // Once the pair is whole, it goes live.
    f.write("tls.crt", CERT_B);
    assert!(f.reloader.reload(Trigger::Poll));
    assert!(f.reloader.failure.is_none());
    assert_eq!(f.served().await, der(CERT_B));
}

#[tokio::test]
async fn a_broken_ca_bundle_keeps_the_old_configuration() {
    let mut f = Fixture::new(true);
    let before = f.reloader.live().current();
    f.write("ca.crt", "-----BEGIN CERTIFICATE-----\nnot base64!\n");
    assert!(!f.reloader.reload(Trigger::Poll));
    f.write("ca.crt", "");
    assert!(!f.reloader.reload(Trigger::Poll));
    assert!(Arc::ptr_eq(&before, &f.reloader.live().current()));
    // Undoing the change is not a reload, and clears the failure.
    f.write("ca.crt", CLIENT_CA);
    assert!(!f.reloader.reload(Trigger::Poll));
    assert!(f.reloader.failure.is_none());
    assert!(Arc::ptr_eq(&before, &f.reloader.live().current()));
}

#[tokio::test]
async fn sighup_reloads_even_unchanged_files() {
    let mut f = Fixture::new(false);
    let before = f.reloader.live().current();
    assert!(f.reloader.reload(Trigger::Hangup));
    assert!(!Arc::ptr_eq(&before, &f.reloader.live().current()));
    assert_eq!(f.served().await, der(CERT_A));
}

#[tokio::test]
async fn the_reloader_polls_the_files() {
    let f = Fixture::new(false);
    let live = f.reloader.live();
    let (stop_tx, stop_rx) = watch::channel(false);
    let dir = f.dir;
    let task = tokio::spawn(f.reloader.run(Duration::from_millis(20), stop_rx));
    std::fs::write(dir.path().join("tls.crt"), CERT_B).unwrap();
    std::fs::write(dir.path().join("tls.key"), KEY_B).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while served(&live).await != der(CERT_B) {
        assert!(
            Instant::now() < deadline,
            "the new pair was never picked up"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the reloader stops with the server")
        .unwrap();
}

#[test]
fn startup_errors_stay_fatal() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), CERT_B).unwrap();
    std::fs::write(dir.path().join("tls.key"), KEY_A).unwrap();
    let mut config = Config::defaults();
    config.cert_file = Some(dir.path().join("tls.crt"));
    config.key_file = Some(dir.path().join("tls.key"));
    let err = Reloader::new(&config).err().expect("a mismatched pair");
    assert!(
        err.contains("--key-file") && err.contains("the key does not belong to the certificate"),
        "{err}"
    );
    config.client_cert_auth = true;
    let err = Reloader::new(&config).err().expect("no CA");
    assert!(err.contains("--trusted-ca-file"), "{err}");
    config.client_cert_auth = false;
    config.cert_file = None;
    let err = Reloader::new(&config).err().expect("no certificate");
    assert!(err.contains("--cert-file"), "{err}");
}

#[test]
fn the_summary_names_the_certificate() {
    let s = super::certificate::summarize(&der(CERT_A)).unwrap();
    assert_eq!(s.subject, "CN=server-a");
    assert_eq!(s.serial, "4A2961370B09AC31279AEC5341231BB94EBB88");
    assert_eq!(s.not_after, "2126-11-07T02:13:16Z");
}

#[tokio::test]
async fn a_silent_peer_holds_up_no_one_and_is_dropped_after_the_timeout() {
    use tokio::io::AsyncReadExt;
    let f = Fixture::new(false);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let timeout = Duration::from_secs(2);
    let mut accepted = Box::pin(handshaken(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        f.reloader.live(),
        timeout,
    ));
    // Connects and never says a word.
    let started = Instant::now();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    // A client behind it completes its handshake and is handed on.
    let client = client_config();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (handshake, served) = tokio::join!(
        TlsConnector::from(Arc::new(client))
            .connect(ServerName::try_from("localhost").unwrap(), tcp),
        accepted.next(),
    );
    handshake.expect("client handshake");
    served
        .expect("the stream goes on")
        .expect("the second client is served while the first stays silent");
    assert!(
        started.elapsed() < timeout,
        "the second handshake did not wait for the first"
    );
    // The silent one is closed once the handshake timeout passes.
    let mut buf = [0u8; 1];
    let read = tokio::select! {
        r = silent.read(&mut buf) => r,
        _ = accepted.next() => panic!("the silent peer was handed on"),
    };
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "closed, not answered: {read:?}"
    );
    assert!(
        started.elapsed() >= timeout,
        "closed by the timeout, not at once"
    );
}

/// A peer listener's reloader (`--peer-*` files in a temporary directory)
/// whose members are certified by `crl-v1-ca.crt` and whose
/// `--peer-crl-file` starts as the version 1 list `crl-v1-revoking.pem`,
/// revoking `crl-v1-revoked.crt` but not `crl-v1-served.crt`.
fn peer_fixture() -> (tempfile::TempDir, Reloader) {
    let dir = tempfile::tempdir().unwrap();
    let write =
        |name: &str, content: &[u8]| std::fs::write(dir.path().join(name), content).unwrap();
    write("peer.crt", CERT_A.as_bytes());
    write("peer.key", KEY_A.as_bytes());
    write("peer-ca.crt", include_bytes!("testdata/crl-v1-ca.crt"));
    write("peer.crl", include_bytes!("testdata/crl-v1-revoking.pem"));
    let peer = PeerTls {
        cert: dir.path().join("peer.crt"),
        key: dir.path().join("peer.key"),
        ca: dir.path().join("peer-ca.crt"),
        allowed: None,
        crl: Some(dir.path().join("peer.crl")),
    };
    let reloader = Reloader::for_peers(&peer, None).expect("a version 1 list loads");
    (dir, reloader)
}

/// Whether the listener `live` accepts a member presenting `cert`/`key`
/// (PEM): the server side's verdict on the handshake.
async fn accepts_member(live: &Live, cert: &[u8], key: &[u8]) -> bool {
    accepts(live, Some((cert, key))).await
}

/// Whether the listener `live` completes a handshake with a client that
/// presents `identity` (certificate and key, PEM) or no certificate: the
/// server side's verdict.
async fn accepts(live: &Live, identity: Option<(&[u8], &[u8])>) -> bool {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(CA.as_bytes()).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let client = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(cert).unwrap()],
                PrivateKeyDer::from_pem_slice(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let acceptor = TlsAcceptor::from(live.current());
    let server = tokio::spawn(async move { acceptor.accept(server_io).await.map(|_| ()) });
    let client = TlsConnector::from(Arc::new(client))
        .connect(ServerName::try_from("localhost").unwrap(), client_io);
    // TLS 1.3: the client may finish before the server judges its
    // certificate; the server's side is the verdict. Keep the client alive
    // until the server has decided.
    let (_client, server) = tokio::join!(client, server);
    server.unwrap().is_ok()
}

#[tokio::test]
async fn a_version_1_peer_list_refuses_its_member_and_reloads_like_a_version_2_one() {
    const REVOKED: (&[u8], &[u8]) = (
        include_bytes!("testdata/crl-v1-revoked.crt"),
        include_bytes!("testdata/crl-v1-revoked.key"),
    );
    const SERVED: (&[u8], &[u8]) = (
        include_bytes!("testdata/crl-v1-served.crt"),
        include_bytes!("testdata/crl-v1-served.key"),
    );
    let (dir, mut reloader) = peer_fixture();
    let live = reloader.live();
    assert!(
        !accepts_member(&live, REVOKED.0, REVOKED.1).await,
        "revoked"
    );
    assert!(
        accepts_member(&live, SERVED.0, SERVED.1).await,
        "same CA, not listed"
    );

    // A file that is no list keeps the version 1 list in force.
    std::fs::write(dir.path().join("peer.crl"), "garbage\n").unwrap();
    assert!(!reloader.reload(Trigger::Poll));
    let failure = reloader.failure.as_ref().map(|(e, _)| e.clone());
    assert!(failure.is_some_and(|e| e.contains("--peer-crl-file")));
    assert!(
        !accepts_member(&live, REVOKED.0, REVOKED.1).await,
        "still revoked"
    );

    // A version 1 list revoking nothing lifts it at the reload.
    std::fs::write(
        dir.path().join("peer.crl"),
        include_bytes!("testdata/crl-v1.pem"),
    )
    .unwrap();
    assert!(reloader.reload(Trigger::Poll));
    assert!(accepts_member(&live, REVOKED.0, REVOKED.1).await, "lifted");
}

/// Whether the listener `live` completes a handshake with a client that
/// presents no certificate: the server side's verdict.
async fn accepts_anonymous(live: &Live) -> bool {
    accepts(live, None).await
}

#[tokio::test]
async fn a_trusted_ca_requires_a_client_certificate_without_client_cert_auth() {
    // etcd asks for and verifies a client certificate whenever a CA is
    // given; --client-cert-auth only names the user by its CN.
    for client_cert_auth in [false, true] {
        let f = Fixture::new(client_cert_auth);
        let live = f.reloader.live();
        assert!(
            !accepts_anonymous(&live).await,
            "client_cert_auth={client_cert_auth}: a client without a certificate was served"
        );
        assert!(
            accepts_member(&live, CLIENT_CERT.as_bytes(), CLIENT_KEY.as_bytes()).await,
            "client_cert_auth={client_cert_auth}: a certificate the CA signed was refused"
        );
        // One some other CA signed is no better than none.
        assert!(
            !accepts_member(&live, CERT_B.as_bytes(), KEY_B.as_bytes()).await,
            "client_cert_auth={client_cert_auth}: a certificate of another CA was served"
        );
        // A reload keeps the requirement.
        let mut f = f;
        assert!(f.reloader.reload(Trigger::Hangup));
        assert!(
            !accepts_anonymous(&f.reloader.live()).await,
            "after a reload"
        );
    }
}

#[tokio::test]
async fn without_a_trusted_ca_no_client_certificate_is_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), CERT_A).unwrap();
    std::fs::write(dir.path().join("tls.key"), KEY_A).unwrap();
    let mut config = Config::defaults();
    config.cert_file = Some(dir.path().join("tls.crt"));
    config.key_file = Some(dir.path().join("tls.key"));
    let reloader = Reloader::new(&config).expect("the files load");
    assert!(accepts_anonymous(&reloader.live()).await);
    let contents = reloader.files.read().unwrap();
    let (_, loaded) = reloader.files.build(&contents).unwrap();
    assert_eq!(loaded.client_certificates(), "not asked for");
    let f = Fixture::new(false);
    let (_, loaded) = f.reloader.files.build(&f.reloader.loaded).unwrap();
    assert_eq!(loaded.client_certificates(), "required");
}

#[tokio::test]
async fn the_peer_listener_requires_a_member_certificate() {
    // peer_fixture gives --peer-trusted-ca-file and no
    // --peer-client-cert-auth (PeerTls has no such switch): a connecting
    // member must present a certificate the peer CA signed.
    let (_dir, reloader) = peer_fixture();
    let live = reloader.live();
    assert!(!accepts_anonymous(&live).await, "no certificate");
    assert!(
        accepts_member(&live, CLIENT_CERT.as_bytes(), CLIENT_KEY.as_bytes()).await,
        "signed by the peer CA, not revoked"
    );
}
