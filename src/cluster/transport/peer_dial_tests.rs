//! The dialling side's verifier and reload, against the unit-test
//! certificates of `tls/testdata` (a CA and two certificates it signed,
//! `CN=server-a` and `CN=server-b`, both valid for 127.0.0.1 and
//! localhost).

use super::*;

const CA: &str = include_str!("../../tls/testdata/ca.crt");
const CERT_A: &str = include_str!("../../tls/testdata/server-a.crt");
const KEY_A: &str = include_str!("../../tls/testdata/server-a.key");
const CERT_B: &str = include_str!("../../tls/testdata/server-b.crt");
const KEY_B: &str = include_str!("../../tls/testdata/server-b.key");

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

fn verifier(allowed: PeerAllowed) -> AllowedServer {
    let mut roots = RootCertStore::empty();
    roots.add(der(CA)).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let inner = WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
        .build()
        .unwrap();
    AllowedServer::new(inner, allowed)
}

fn verify(v: &AllowedServer, cert: &str, host: &str) -> Result<ServerCertVerified, Error> {
    let name = ServerName::try_from(host.to_string()).unwrap();
    v.verify_server_cert(&der(cert), &[], &name, &[], UnixTime::now())
}

#[test]
fn a_dialled_member_must_serve_the_allowed_common_name() {
    let v = verifier(PeerAllowed::Cn("server-a".into()));
    assert!(verify(&v, CERT_A, "127.0.0.1").is_ok());
    assert_eq!(
        verify(&v, CERT_B, "127.0.0.1").unwrap_err(),
        Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure)
    );
}

#[test]
fn a_dialled_member_must_serve_a_certificate_valid_for_the_allowed_host_name() {
    let v = verifier(PeerAllowed::Hostname("localhost".into()));
    assert!(verify(&v, CERT_B, "127.0.0.1").is_ok());
    let v = verifier(PeerAllowed::Hostname("other.example".into()));
    assert!(verify(&v, CERT_A, "127.0.0.1").is_err());
}

#[test]
fn the_chain_and_the_dialled_host_are_checked_before_the_allowed_name() {
    let v = verifier(PeerAllowed::Cn("server-a".into()));
    // The allowed name, but not valid for the host dialled.
    assert!(matches!(
        verify(&v, CERT_A, "peer.example"),
        Err(Error::InvalidCertificate(
            CertificateError::NotValidForNameContext { .. }
        ))
    ));
    // The allowed name, but not signed by the peer CA (the CA itself,
    // self-signed, stands in for a certificate of another CA).
    let v = verifier(PeerAllowed::Cn("ephd-unit-test-ca".into()));
    assert!(verify(&v, CA, "127.0.0.1").is_err());
}

/// Files for a dialler in a fresh directory: the CA, and `cert`/`key`.
fn files(dir: &Path, cert: &str, key: &str) -> PeerTls {
    std::fs::write(dir.join("ca.crt"), CA).unwrap();
    std::fs::write(dir.join("peer.crt"), cert).unwrap();
    std::fs::write(dir.join("peer.key"), key).unwrap();
    PeerTls {
        cert: dir.join("peer.crt"),
        key: dir.join("peer.key"),
        ca: dir.join("ca.crt"),
        allowed: None,
        crl: None,
    }
}

/// Asks for the settings until the files have been read again.
fn read_again(dialer: &Dialer) {
    let before = dialer.state.lock().checked;
    let deadline = Instant::now() + Duration::from_secs(5);
    while dialer.state.lock().checked == before {
        assert!(Instant::now() < deadline, "the files were never read again");
        dialer.current();
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn rotated_files_are_used_once_the_reload_interval_has_passed() {
    let dir = tempfile::tempdir().unwrap();
    let peer = files(dir.path(), CERT_A, KEY_A);
    let dialer = Dialer::load(&peer, Duration::from_millis(20)).unwrap();
    let first = dialer.current();
    // Unchanged files: the same settings once they are read again.
    read_again(&dialer);
    assert!(Arc::ptr_eq(&first, &dialer.current()));
    // A broken rotation (a key that does not match) keeps them too.
    std::fs::write(dir.path().join("peer.key"), KEY_B).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while dialer.state.lock().failure.is_none() {
        assert!(
            Instant::now() < deadline,
            "the broken files were never read"
        );
        assert!(Arc::ptr_eq(&first, &dialer.current()));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(Arc::ptr_eq(&first, &dialer.current()));
    // A complete one replaces them at the next check.
    std::fs::write(dir.path().join("peer.crt"), CERT_B).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Arc::ptr_eq(&first, &dialer.current()) {
        assert!(
            Instant::now() < deadline,
            "the rotated files were never loaded"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn without_a_reload_interval_the_files_are_read_once() {
    let dir = tempfile::tempdir().unwrap();
    let peer = files(dir.path(), CERT_A, KEY_A);
    let dialer = Dialer::load(&peer, Duration::ZERO).unwrap();
    let first = dialer.current();
    std::fs::write(dir.path().join("peer.crt"), CERT_B).unwrap();
    std::fs::write(dir.path().join("peer.key"), KEY_B).unwrap();
    assert!(Arc::ptr_eq(&first, &dialer.current()));
}

#[test]
fn files_that_do_not_load_fail_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let peer = files(dir.path(), CERT_A, KEY_B);
    assert!(Dialer::load(&peer, Duration::ZERO).is_err());
    let peer = files(dir.path(), "", KEY_A);
    let err = Dialer::load(&peer, Duration::ZERO).err().unwrap();
    assert!(err.contains("holds no PEM certificate"), "{err}");
}
