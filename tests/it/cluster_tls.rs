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

use crate::cluster::{agreed_leader, linearizable_get, put, same_everywhere, TIMING};
use crate::harness::EphdCluster;
use crate::tls::{issue, make_ca};

/// A peer CA with one certificate every member uses both ways (server and
/// client, as etcd's peer certificates are), and a rogue CA with a
/// certificate of the same shape.
fn peer_certs(dir: &Path) {
    std::fs::write(
        dir.join("peer.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    make_ca(dir, "peer-ca", "ephd-test-peer-ca");
    issue(dir, "peer-ca", "peer", "peer.ext", "ephd-member");
    make_ca(dir, "rogue-ca", "rogue-ca");
    issue(dir, "rogue-ca", "rogue", "peer.ext", "rogue-member");
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
    let path = |f: &str| dir.path().join(f).display().to_string();
    let files = [
        format!("--peer-cert-file={}", path("peer.crt")),
        format!("--peer-key-file={}", path("peer.key")),
        format!("--peer-trusted-ca-file={}", path("peer-ca.crt")),
        "--peer-client-cert-auth=true".to_string(),
    ];
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
        let logs = cluster.logs();
        assert!(
            logs.contains("peer connection refused: its certificate"),
            "{allowed}: {logs}"
        );
    }
}
