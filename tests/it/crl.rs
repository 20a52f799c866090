//! Certificate revocation lists, `--client-crl-file` and `--peer-crl-file`
//! (etcd's flags): a client or member presenting a certificate the list
//! revokes is refused while another certificate of the same CA is served;
//! a list changed on disk takes effect at the next reload without a
//! restart; a file that is no list stops the start, naming flag and path.
//! Version 1 lists (no `crlnumber` in the `openssl ca` configuration)
//! work as version 2 ones do, as in etcd (etcd 3.4.23 checked by hand with
//! a version 1 list made so: the revoked client refused, another served).
//!
//! Stock etcd 3.4, given the same certificates and lists, refuses and
//! serves the same clients (checked by hand; `server/revocation.rs` says
//! where the two differ: when the list is read, what a bad file does, and
//! that etcd's transport lets a revoked member take part anyway).

use crate::cluster::{agreed_leader, linearizable_get, put, same_everywhere, TIMING};
use crate::harness::{free_port, EphdCluster, Server, ServerProcess};
use crate::tls::{https_ephd, issue, make_certs, openssl, tls_client};
use ephd::proto::etcdserverpb::PutRequest;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// How long a change may take to show: many reload intervals, with room
/// for a loaded machine.
const PICKUP: Duration = Duration::from_secs(15);

/// Writes `{out}`, a version 2 CRL of CA `{ca}` revoking exactly the
/// certificates `{name}.crt` of `revoked`, as `openssl ca -gencrl` writes
/// one (its own database, so each list names only what it is given).
fn write_crl(dir: &Path, ca: &str, revoked: &[&str], out: &str) {
    write_crl_version(dir, ca, revoked, out, 2);
}

/// [`write_crl`] of the given version: 1 is what `openssl ca -gencrl`
/// writes when its configuration names no `crlnumber` file (and what
/// etcd accepts, so ephd must too), 2 when it names one.
fn write_crl_version(dir: &Path, ca: &str, revoked: &[&str], out: &str, version: u8) {
    let db = format!("{out}.index");
    std::fs::write(dir.join(&db), "").unwrap();
    let number = if version == 2 {
        std::fs::write(dir.join(format!("{out}.number")), "01\n").unwrap();
        format!("crlnumber = {out}.number\n")
    } else {
        String::new()
    };
    let conf = format!("{out}.cnf");
    std::fs::write(
        dir.join(&conf),
        format!(
            "[ca]\ndefault_ca = d\n[d]\ndatabase = {db}\n{number}\
             default_md = sha256\ndefault_crl_days = 2\n"
        ),
    )
    .unwrap();
    let signer = [
        "-config",
        &conf,
        "-keyfile",
        &format!("{ca}.key"),
        "-cert",
        &format!("{ca}.crt"),
    ];
    for name in revoked {
        let cert = format!("{name}.crt");
        let mut args = vec!["ca"];
        args.extend(signer);
        args.extend(["-revoke", &cert]);
        openssl(dir, &args);
    }
    let mut args = vec!["ca"];
    args.extend(signer);
    args.extend(["-gencrl", "-out", out]);
    openssl(dir, &args);
    let text = Command::new("openssl")
        .current_dir(dir)
        .args(["crl", "-noout", "-text", "-in", out])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("Version {version} ")),
        "{out} is not version {version}:\n{text}"
    );
}

/// Replaces `to` with `from` in one rename, as tools that write
/// certificates do.
fn replace(dir: &Path, from: &str, to: &str) {
    let tmp = dir.join(format!("{to}.tmp"));
    std::fs::copy(dir.join(from), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join(to)).unwrap();
}

/// A TLS ephd with client certificate authentication and `crl` as
/// `--client-crl-file`, reloading every 200 ms; waits until it listens.
fn start(dir: &Path, crl: &str) -> (ServerProcess, u16) {
    let port = free_port();
    let mut cmd = https_ephd(port);
    cmd.arg(format!("--cert-file={}", dir.join("server.crt").display()))
        .arg(format!("--key-file={}", dir.join("server.key").display()))
        .arg(format!(
            "--trusted-ca-file={}",
            dir.join("ca.crt").display()
        ))
        .arg("--client-cert-auth")
        .arg(format!("--client-crl-file={}", dir.join(crl).display()))
        .arg("--tls-reload-interval=200ms");
    let process = ServerProcess::spawn("ephd", cmd);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "TLS ephd never listened:\n{}",
            process.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (process, port)
}

/// A put over a fresh TLS connection presenting client certificate
/// `{who}.crt` (the real etcd client); the error text if it fails.
async fn put_as(dir: &Path, port: u16, who: &str) -> Result<(), String> {
    let mut client = tls_client(dir, port, Some(who)).await?;
    client
        .put(format!("by-{who}"), "v", None)
        .await
        .map(drop)
        .map_err(|e| format!("put: {e}"))
}

/// Waits until `put_as(who)` gives `served`; panics with `logs` if it does
/// not within [`PICKUP`].
async fn until(dir: &Path, port: u16, who: &str, served: bool, logs: impl Fn() -> String) {
    let deadline = Instant::now() + PICKUP;
    loop {
        let got = put_as(dir, port, who).await;
        if got.is_ok() == served {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{who}: still {got:?}, expected served={served}\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A CA with a server certificate and two client certificates, `good` and
/// `revoked`; `revoked.crl` revokes `revoked`, `empty.crl` nothing, both
/// lists of the given `version`.
fn certs_and_lists(dir: &Path, version: u8) {
    make_certs(dir);
    issue(dir, "ca", "good", "client.ext", "good-client");
    issue(dir, "ca", "revoked", "client.ext", "revoked-client");
    write_crl_version(dir, "ca", &["revoked"], "revoked.crl", version);
    write_crl_version(dir, "ca", &[], "empty.crl", version);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_client_certificate_is_refused_and_another_of_the_same_ca_served() {
    refused_and_served(2).await;
}

/// A version 1 list (which rustls does not read; ephd does, as etcd
/// does) refuses and serves the same clients, and logs the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_list_refuses_its_revoked_client_and_serves_another_of_the_same_ca() {
    refused_and_served(1).await;
}

async fn refused_and_served(version: u8) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    certs_and_lists(dir, version);
    let (server, port) = start(dir, "revoked.crl");
    let logs = || server.logs();
    put_as(dir, port, "good")
        .await
        .unwrap_or_else(|e| panic!("the valid certificate was refused: {e}\n{}", logs()));
    let refused = put_as(dir, port, "revoked").await;
    assert!(refused.is_err(), "a revoked certificate was served");
    // The refusal is logged with the certificate it refused.
    let deadline = Instant::now() + PICKUP;
    while !logs().contains("CN=revoked-client") {
        assert!(Instant::now() < deadline, "no refusal logged:\n{}", logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(logs().contains("is revoked"), "{}", logs());
    assert!(logs().contains("\"crls\":1"), "{}", logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_changed_on_disk_takes_effect_at_the_reload_and_a_bad_one_keeps_the_last() {
    reloaded(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_list_changed_on_disk_takes_effect_at_the_reload_and_a_bad_one_keeps_it() {
    reloaded(1).await;
}

async fn reloaded(version: u8) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    certs_and_lists(dir, version);
    replace(dir, "empty.crl", "live.crl");
    let (server, port) = start(dir, "live.crl");
    let logs = || server.logs();
    put_as(dir, port, "revoked")
        .await
        .unwrap_or_else(|e| panic!("nothing is revoked yet: {e}\n{}", logs()));

    // Revoked on disk: refused from the next reload on, no restart.
    replace(dir, "revoked.crl", "live.crl");
    until(dir, port, "revoked", false, logs).await;
    put_as(dir, port, "good")
        .await
        .unwrap_or_else(|e| panic!("the valid certificate was refused: {e}\n{}", logs()));
    assert!(
        logs().contains("reloaded TLS certificates (files changed)"),
        "{}",
        logs()
    );

    // A file that is no list: the last list stays, with a WARN.
    std::fs::write(dir.join("live.crl.tmp"), "not a list\n").unwrap();
    std::fs::rename(dir.join("live.crl.tmp"), dir.join("live.crl")).unwrap();
    let deadline = Instant::now() + PICKUP;
    while !logs().contains("cannot reload TLS certificates") {
        assert!(Instant::now() < deadline, "no reload warning:\n{}", logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(logs().contains("--client-crl-file"), "{}", logs());
    assert!(
        put_as(dir, port, "revoked").await.is_err(),
        "revocation lost"
    );
    put_as(dir, port, "good")
        .await
        .unwrap_or_else(|e| panic!("the valid certificate was refused: {e}\n{}", logs()));

    // Lifted: served again after the next reload.
    replace(dir, "empty.crl", "live.crl");
    until(dir, port, "revoked", true, logs).await;
}

#[test]
fn a_file_that_is_no_list_stops_the_start_naming_flag_and_path() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_certs(dir);
    std::fs::write(dir.join("garbage.crl"), "garbage\n").unwrap();
    for (flag, file) in [
        ("--client-crl-file", "garbage.crl"),
        ("--client-crl-file", "missing.crl"),
    ] {
        let path = dir.join(file);
        let url = format!("https://127.0.0.1:{}", free_port());
        let out = Command::new(env!("CARGO_BIN_EXE_ephd"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .arg(format!("--cert-file={}", dir.join("server.crt").display()))
            .arg(format!("--key-file={}", dir.join("server.key").display()))
            .arg(format!(
                "--trusted-ca-file={}",
                dir.join("ca.crt").display()
            ))
            .arg(format!("{flag}={}", path.display()))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{file}: started\n{stderr}");
        let named = format!("{flag} {}", path.display());
        assert!(stderr.contains(&named), "{file}: {stderr}");
    }
}

/// Cluster mode: three members, each with a peer certificate of its own
/// (`m0.crt`..); `--peer-crl-file` revokes m2's. m0 and m1 form the
/// cluster and refuse m2's connections, so nothing m2 sends arrives and a
/// write through it fails; once the list on disk no longer names m2, it
/// takes part at the next reload, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_a_revoked_peer_certificate_cannot_take_part_until_the_list_lifts_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("peer.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    crate::tls::make_ca(dir, "peer-ca", "ephd-test-peer-ca");
    for m in ["m0", "m1", "m2"] {
        issue(dir, "peer-ca", m, "peer.ext", &format!("member-{m}"));
    }
    write_crl(dir, "peer-ca", &["m2"], "m2-revoked.crl");
    write_crl(dir, "peer-ca", &[], "empty.crl");
    replace(dir, "m2-revoked.crl", "peer.crl");
    let path = |f: &str| dir.join(f).display().to_string();
    let flags = [
        format!("--peer-cert-file={}", path("{name}.crt")),
        format!("--peer-key-file={}", path("{name}.key")),
        format!("--peer-trusted-ca-file={}", path("peer-ca.crt")),
        "--peer-client-cert-auth=true".to_string(),
        format!("--peer-crl-file={}", path("peer.crl")),
        "--tls-reload-interval=200ms".to_string(),
    ];
    let mut args: Vec<&str> = TIMING.to_vec();
    args.extend(flags.iter().map(String::as_str));
    let cluster = EphdCluster::spawn(3, &args, "https");
    let (m0, m1, m2) = (
        cluster.member(0).unwrap(),
        cluster.member(1).unwrap(),
        cluster.member(2).unwrap(),
    );

    for m in [m0, m1, m2] {
        let addr = m.endpoint().trim_start_matches("http://").to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "{addr} never listened");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // m0 and m1 are a quorum: they elect a leader and replicate.
    let rev = put(m0, "formed", "without m2").await;
    let (_, kv) = linearizable_get(m1, "formed").await;
    assert_eq!(kv.map(|kv| kv.mod_revision), Some(rev));
    // m2's connections are refused, which the others log.
    let deadline = Instant::now() + PICKUP;
    while !cluster.logs().contains("CN=member-m2") {
        assert!(
            Instant::now() < deadline,
            "no refusal logged:\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A write through m2 must reach the leader over m2's own connection:
    // refused, so it never succeeds.
    let mut kv = m2.kv().await;
    let req = PutRequest {
        key: b"through-m2".to_vec().into(),
        value: b"v".to_vec().into(),
        ..Default::default()
    };
    let through = tokio::time::timeout(Duration::from_secs(5), kv.put(req.clone())).await;
    assert!(
        !matches!(through, Ok(Ok(_))),
        "a write through the revoked member succeeded"
    );

    // The list lifted on disk: m2 takes part after the next reload. A
    // write it forwarded while its connections were being refused times
    // out (as in etcd); a client retries.
    replace(dir, "empty.crl", "peer.crl");
    // Each write refused on the way times out after the request timeout
    // (7 s), and m2's connections come back one by one: more than PICKUP
    // on a loaded machine.
    let deadline = Instant::now() + 3 * PICKUP;
    let rev = loop {
        let sent = tokio::time::timeout(Duration::from_secs(10), kv.put(req.clone())).await;
        match sent {
            Ok(Ok(r)) => break r.into_inner().header.expect("header").revision,
            other => assert!(
                Instant::now() < deadline,
                "m2 never took part: {other:?}\n{}",
                cluster.logs()
            ),
        }
    };
    agreed_leader(&cluster, None).await;
    assert_eq!(same_everywhere(&cluster, rev).await.len(), 2);
}
