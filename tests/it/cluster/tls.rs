//! Cluster mode with peer TLS: three members whose peer URLs are https://,
//! with `--peer-cert-file`, `--peer-key-file`, `--peer-trusted-ca-file` and
//! `--peer-client-cert-auth`, form a cluster and replicate writes; the peer
//! port turns away anything without a certificate signed by the peer CA
//! (plaintext, TLS without a client certificate, a certificate of another
//! CA) before a single Raft message is read.

use std::path::Path;
use std::time::Duration;

use ephd::proto::ephd::internal::{raft_transport_client::RaftTransportClient, RaftBatch};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::cluster::{
    agreed_leader, linearizable_get, put, same_everywhere, status, SETTLE, TIMING,
};
use crate::harness::{EphdCluster, Server as _};
use crate::tls::{issue, make_ca};

/// A peer CA with one certificate every member uses both ways (server and
/// client, as etcd's peer certificates are), and a rogue CA with a
/// certificate of the same shape (CN `rogue-member`).
fn peer_certs(dir: &Path) {
    peer_certs_with_rogue(dir, "rogue-member");
}

/// [`peer_certs`], the rogue certificate's CN being `rogue_cn`.
pub(crate) fn peer_certs_with_rogue(dir: &Path, rogue_cn: &str) {
    std::fs::write(
        dir.join("peer.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    make_ca(dir, "peer-ca", "ephd-test-peer-ca");
    issue(dir, "peer-ca", "peer", "peer.ext", "ephd-member");
    make_ca(dir, "rogue-ca", "rogue-ca");
    issue(dir, "rogue-ca", "rogue", "peer.ext", rogue_cn);
}

/// The peer TLS flags of a member with the files [`peer_certs`] wrote in
/// `dir`: its certificate both ways, the peer CA, client certificates
/// required.
pub(crate) fn peer_tls_flags(dir: &Path) -> Vec<String> {
    let path = |f: &str| dir.join(f).display().to_string();
    vec![
        format!("--peer-cert-file={}", path("peer.crt")),
        format!("--peer-key-file={}", path("peer.key")),
        format!("--peer-trusted-ca-file={}", path("peer-ca.crt")),
        "--peer-client-cert-auth=true".to_string(),
    ]
}

/// Sends an empty batch of Raft messages to `url` as a peer would, with
/// the peer CA trusted and `identity` presented (if any).
async fn send_empty_batch(url: &str, dir: &Path, identity: Option<&str>) -> Result<(), String> {
    let mut endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5));
    if url.starts_with("https://") {
        let ca = std::fs::read(dir.join("peer-ca.crt")).unwrap();
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if let Some(name) = identity {
            let cert = std::fs::read(dir.join(format!("{name}.crt"))).unwrap();
            let key = std::fs::read(dir.join(format!("{name}.key"))).unwrap();
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        endpoint = endpoint.tls_config(tls).map_err(|e| e.to_string())?;
    }
    let channel: Channel = endpoint.connect().await.map_err(|e| format!("{e:?}"))?;
    RaftTransportClient::new(channel)
        .send(RaftBatch::default())
        .await
        .map(|_| ())
        .map_err(|e| format!("{e:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_replicate_over_peer_tls_and_turn_away_untrusted_peers() {
    let dir = tempfile::tempdir().unwrap();
    peer_certs(dir.path());
    let files = peer_tls_flags(dir.path());
    let mut args: Vec<&str> = TIMING.to_vec();
    args.extend(files.iter().map(String::as_str));
    let cluster = EphdCluster::start_with_peer_scheme(3, &args, "https");

    // A leader is elected over TLS, and writes through every member reach
    // every member.
    let (leader, _) = agreed_leader(&cluster, None).await;
    let mut last = 0;
    for i in 0..3 {
        let m = cluster.member(i).unwrap();
        let rev = put(m, &format!("tls-{i}"), "over peer TLS").await;
        assert!(rev > last, "revisions go up: {rev} after {last}");
        last = rev;
        for (j, other) in cluster.running() {
            let (_, kv) = linearizable_get(other, &format!("tls-{i}")).await;
            assert_eq!(kv.map(|kv| kv.mod_revision), Some(rev), "m{j}");
        }
    }
    assert_eq!(same_everywhere(&cluster, last).await.len(), 3);

    // The peer port: only a certificate of the peer CA gets in.
    let port = cluster.member(leader).unwrap().peer_port();
    let https = format!("https://127.0.0.1:{port}");
    let http = format!("http://127.0.0.1:{port}");
    let plaintext = send_empty_batch(&http, dir.path(), None).await;
    assert!(plaintext.is_err(), "plaintext was served: {plaintext:?}");
    let anonymous = send_empty_batch(&https, dir.path(), None).await;
    assert!(anonymous.is_err(), "no client certificate was served");
    let rogue = send_empty_batch(&https, dir.path(), Some("rogue")).await;
    assert!(rogue.is_err(), "a rogue CA's certificate was served");
    send_empty_batch(&https, dir.path(), Some("peer"))
        .await
        .expect("a member's certificate is served");

    // None of that disturbed the cluster: it still writes everywhere.
    let rev = put(cluster.member((leader + 1) % 3).unwrap(), "after", "probes").await;
    assert!(rev > last);
    assert_eq!(same_everywhere(&cluster, rev).await.len(), 4);
}

/// `--peer-cert-allowed-cn` and `--peer-cert-allowed-hostname`: a cluster
/// whose members' certificates name what is allowed forms and replicates,
/// and the peer port turns away a certificate of the same CA that names
/// something else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_cn_or_host_name_turns_away_other_certificates_of_the_peer_ca() {
    let dir = tempfile::tempdir().unwrap();
    peer_certs(dir.path());
    // Same CA, same usages, another CN and host name.
    std::fs::write(
        dir.path().join("other.ext"),
        "subjectAltName=DNS:other.example\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    issue(dir.path(), "peer-ca", "other", "other.ext", "other-member");
    let path = |f: &str| dir.path().join(f).display().to_string();
    for allowed in [
        "--peer-cert-allowed-cn=ephd-member",
        "--peer-cert-allowed-hostname=localhost",
    ] {
        let files = [
            format!("--peer-cert-file={}", path("peer.crt")),
            format!("--peer-key-file={}", path("peer.key")),
            format!("--peer-trusted-ca-file={}", path("peer-ca.crt")),
            "--peer-client-cert-auth=true".to_string(),
            allowed.to_string(),
        ];
        let mut args: Vec<&str> = TIMING.to_vec();
        args.extend(files.iter().map(String::as_str));
        let cluster = EphdCluster::start_with_peer_scheme(3, &args, "https");
        let (leader, _) = agreed_leader(&cluster, None).await;
        let rev = put(cluster.member(leader).unwrap(), "allowed", "yes").await;
        same_everywhere(&cluster, rev).await;

        let port = cluster.member(leader).unwrap().peer_port();
        let https = format!("https://127.0.0.1:{port}");
        let other = send_empty_batch(&https, dir.path(), Some("other")).await;
        assert!(other.is_err(), "{allowed}: another name got in: {other:?}");
        send_empty_batch(&https, dir.path(), Some("peer"))
            .await
            .unwrap_or_else(|e| panic!("{allowed}: the allowed name refused: {e}"));
        // Logged by the leader's listener; its log reaches the file a
        // moment after the handshake failed.
        wait_for_log(
            &cluster,
            leader,
            &["peer connection refused: its certificate"],
        )
        .await;
    }
}

/// Member `i`'s part of the cluster's logs.
fn member_log(cluster: &EphdCluster, i: usize) -> String {
    let all = cluster.logs();
    let head = format!("----- m{i} -----\n");
    let Some(at) = all.find(&head) else {
        return String::new();
    };
    let rest = &all[at + head.len()..];
    rest[..rest.find("\n----- m").unwrap_or(rest.len())].to_string()
}

/// Waits until a line of member `i`'s log contains every one of `parts`.
async fn wait_for_log(cluster: &EphdCluster, i: usize, parts: &[&str]) {
    let deadline = std::time::Instant::now() + SETTLE;
    loop {
        let log = member_log(cluster, i);
        if log.lines().any(|l| parts.iter().all(|p| l.contains(p))) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "m{i} never logged {parts:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every member of `cluster` accepts connections on its
/// client port (it may not know a leader yet).
async fn wait_listening(cluster: &EphdCluster) {
    let deadline = std::time::Instant::now() + SETTLE;
    for (i, m) in cluster.running() {
        let endpoint = m.endpoint();
        let addr = endpoint.trim_start_matches("http://").to_string();
        while tokio::net::TcpStream::connect(&addr).await.is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "m{i} never listened on {addr}\n{}",
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Waits until members `among` agree on a leader that is one of them;
/// returns its index.
async fn leader_among(cluster: &EphdCluster, among: &[usize]) -> usize {
    wait_listening(cluster).await;
    let deadline = std::time::Instant::now() + SETTLE;
    loop {
        let mut seen = Vec::new();
        for &i in among {
            seen.push(status(cluster.member(i).unwrap()).await);
        }
        let leader = seen[0].map_or(0, |s| s.1);
        if leader != 0 && seen.iter().all(|s| s.map(|s| s.1) == Some(leader)) {
            if let Some(k) = seen.iter().position(|s| s.is_some_and(|s| s.0 == leader)) {
                return among[k];
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no leader among {among:?}: {seen:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Three members with `--peer-cert-allowed-cn=ephd-member`, each with
/// certificate files of its own (`m0.crt`, ...): m0 and m1 the allowed
/// name, m2 a certificate of the same CA, valid for 127.0.0.1 like the
/// others, whose CN is `stranger-member`. `more` is added to each.
fn stranger_cluster(dir: &Path, more: &[&str]) -> EphdCluster {
    peer_certs(dir);
    issue(dir, "peer-ca", "stranger", "peer.ext", "stranger-member");
    for (member, cert) in [("m0", "peer"), ("m1", "peer"), ("m2", "stranger")] {
        for ext in ["crt", "key"] {
            std::fs::copy(
                dir.join(format!("{cert}.{ext}")),
                dir.join(format!("{member}.{ext}")),
            )
            .unwrap();
        }
    }
    let path = |f: &str| dir.join(f).display().to_string();
    let files = [
        format!("--peer-cert-file={}", path("{name}.crt")),
        format!("--peer-key-file={}", path("{name}.key")),
        format!("--peer-trusted-ca-file={}", path("peer-ca.crt")),
        "--peer-client-cert-auth=true".to_string(),
        "--peer-cert-allowed-cn=ephd-member".to_string(),
    ];
    let mut args: Vec<&str> = TIMING.to_vec();
    args.extend(files.iter().map(String::as_str));
    args.extend(more);
    // Not waiting for every member to serve linearizable reads: m2 may
    // never hear of a leader.
    EphdCluster::spawn(3, &args, "https")
}

/// etcd applies `--peer-cert-allowed-cn` to the certificates of the members
/// it dials too, and so does ephd: m2 accepts m0 and m1 (they carry the
/// name it allows), but they do not dial it, since the certificate m2
/// serves lacks the name. So m2 never hears of their leader, though
/// nothing but the dialling check stands between the leader and m2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_does_not_dial_a_peer_whose_certificate_lacks_the_allowed_cn() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = stranger_cluster(dir.path(), &[]);
    let leader = leader_among(&cluster, &[0, 1]).await;
    let rev = put(cluster.member(leader).unwrap(), "dialled", "not m2").await;
    assert!(rev > 0);
    wait_for_log(
        &cluster,
        leader,
        &[
            "dialled peer refused: the certificate it serves",
            "stranger-member",
            "is not the allowed",
        ],
    )
    .await;
    // The leader's heartbeats would have told m2 who leads.
    let m2 = status(cluster.member(2).unwrap()).await;
    assert_eq!(m2.map(|s| s.1), Some(0), "m2 heard from the leader");
    // And m2 refused nobody: the dialling side alone turned it away.
    let log = member_log(&cluster, 2);
    assert!(!log.contains("peer connection refused"), "{log}");
    assert!(!log.contains("dialled peer refused"), "{log}");
}

/// A rotated peer certificate reaches the connections a member opens, not
/// only the ones it accepts, without a restart: m2's certificate lacks the
/// allowed name until its files are replaced with one that carries it;
/// after the reload interval m2 catches up, which needs its answers to
/// reach the leader over connections m2 dials (with its old certificate
/// the leader's listener refuses them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_peer_certificate_reaches_outgoing_connections_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = stranger_cluster(dir.path(), &["--tls-reload-interval=1s"]);
    let leader = leader_among(&cluster, &[0, 1]).await;
    let rev = put(cluster.member(leader).unwrap(), "rotated", "later").await;
    wait_for_log(
        &cluster,
        leader,
        &["peer connection refused: its certificate"],
    )
    .await;

    for ext in ["crt", "key"] {
        let staged = dir.path().join(format!("m2.{ext}.new"));
        std::fs::copy(dir.path().join(format!("peer.{ext}")), &staged).unwrap();
        std::fs::rename(&staged, dir.path().join(format!("m2.{ext}"))).unwrap();
    }
    wait_for_log(
        &cluster,
        2,
        &["reloaded peer TLS certificates for outgoing peer connections"],
    )
    .await;
    assert_eq!(same_everywhere(&cluster, rev).await.len(), 1);
}
