//! Framed Raft lanes (`src/cluster/transport/frames.rs`) beside a member that serves
//! none, as an older build during a rolling upgrade (here a member with
//! `EPHD_PEER_TRANSPORT=grpc`, which neither serves nor dials them): the
//! others find out on their first connection to it (in plaintext from its
//! answer to the hello, under TLS from the ALPN protocol it selects), use
//! its gRPC stream, and the cluster replicates every write through every
//! member as before. The members that serve framed lanes use them with
//! each other: neither falls back for the other.

use std::process::Command;

use crate::cluster::tls::{peer_certs_with_rogue, peer_tls_flags};
use crate::cluster::{agreed_leader, linearizable_get, put, same_everywhere, TIMING};
use crate::harness::{ClusterMember, EphdCluster};

/// What a member logs when a peer serves no framed lanes.
const FELL_BACK: &str = "the peer serves no framed raft lanes";

/// The peers `m` fell back to gRPC for, from its log.
fn fell_back_for(m: &ClusterMember) -> Vec<String> {
    let mut peers: Vec<String> = m
        .logs()
        .lines()
        .filter(|l| l.contains(FELL_BACK))
        .filter_map(|l| {
            // A JSON line, as etcd logs: `"peer":"m2"`.
            let at = l.find("\"peer\":\"")? + "\"peer\":\"".len();
            Some(l[at..].split('"').next()?.to_string())
        })
        .collect();
    peers.sort();
    peers.dedup();
    peers
}

/// Starts three members, m2 with framed lanes turned off, and checks that
/// writes through each reach every member and who fell back for whom.
async fn mixed_cluster_replicates(scheme: &str, extra: &[String]) {
    let mut args: Vec<&str> = TIMING.to_vec();
    args.extend(extra.iter().map(String::as_str));
    let grpc_only = |i: usize, cmd: &mut Command| {
        if i == 2 {
            cmd.env("EPHD_PEER_TRANSPORT", "grpc");
        }
    };
    let cluster = EphdCluster::start_each(3, &args, scheme, &grpc_only);
    agreed_leader(&cluster, None).await;
    let mut last = 0;
    for round in 0..3 {
        for i in 0..3 {
            let m = cluster.member(i).unwrap();
            let key = format!("mixed-{round}-{i}");
            let rev = put(m, &key, "through a mixed cluster").await;
            assert!(rev > last, "revisions go up: {rev} after {last}");
            last = rev;
            for (j, other) in cluster.running() {
                let (_, kv) = linearizable_get(other, &key).await;
                assert_eq!(kv.map(|kv| kv.mod_revision), Some(rev), "{key} on m{j}");
            }
        }
    }
    assert_eq!(same_everywhere(&cluster, last).await.len(), 9);
    for i in 0..2 {
        let m = cluster.member(i).unwrap();
        assert_eq!(
            fell_back_for(m),
            ["m2"],
            "m{i} uses framed lanes with the other framed member and gRPC with m2\n{}",
            cluster.logs()
        );
    }
    let m2 = cluster.member(2).unwrap();
    assert!(
        fell_back_for(m2).is_empty(),
        "m2 never dials framed lanes, so never falls back"
    );
    assert!(
        m2.logs().contains("EPHD_PEER_TRANSPORT=grpc"),
        "{}",
        m2.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framed_members_fall_back_to_grpc_for_a_member_without_framed_lanes() {
    mixed_cluster_replicates("http", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_peer_tls_the_alpn_protocol_tells_framed_members_apart() {
    let dir = tempfile::tempdir().unwrap();
    peer_certs_with_rogue(dir.path(), "rogue-member");
    let files = peer_tls_flags(dir.path());
    mixed_cluster_replicates("https", &files).await;
}

/// Opens a framed lane to `port` as a member would (TLS offering the
/// framed ALPN protocol, the peer CA trusted, `identity`'s certificate
/// presented if any) and says hello; whether the listener answered it.
async fn framed_hello(dir: &std::path::Path, port: u16, identity: Option<&str>) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls::{self, pki_types::pem::PemObject, pki_types::*};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(dir.join("peer-ca.crt")).unwrap();
    for c in CertificateDer::pem_slice_iter(&ca) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(name) => {
            let cert = std::fs::read(dir.join(format!("{name}.crt"))).unwrap();
            let key = std::fs::read(dir.join(format!("{name}.key"))).unwrap();
            let chain = CertificateDer::pem_slice_iter(&cert)
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(&key).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"ephd-raft/1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = connector.connect(name, tcp).await.ok()?;
        tls.write_all(b"EPHDRAFT\0\0\0\x01").await.ok()?;
        let mut answer = [0u8; 12];
        tls.read_exact(&mut answer).await.ok()?;
        Some(&answer == b"EPHDRAFT\0\0\0\x01")
    };
    let answered = tokio::time::timeout(std::time::Duration::from_secs(5), attempt).await;
    matches!(answered, Ok(Some(true)))
}

/// The framed lanes pass the same TLS handshake as every peer connection:
/// no hello is answered without a certificate of the peer CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_framed_lane_needs_a_certificate_of_the_peer_ca() {
    let dir = tempfile::tempdir().unwrap();
    peer_certs_with_rogue(dir.path(), "rogue-member");
    let files = peer_tls_flags(dir.path());
    let mut args: Vec<&str> = TIMING.to_vec();
    args.extend(files.iter().map(String::as_str));
    let cluster = EphdCluster::start_each(3, &args, "https", &|_, _| {});
    agreed_leader(&cluster, None).await;
    let port = cluster.member(0).unwrap().peer_port();
    assert!(
        !framed_hello(dir.path(), port, None).await,
        "no certificate"
    );
    assert!(
        !framed_hello(dir.path(), port, Some("rogue")).await,
        "a rogue CA's certificate"
    );
    assert!(
        framed_hello(dir.path(), port, Some("peer")).await,
        "a member's certificate opens a framed lane"
    );
    // The cluster is undisturbed.
    let rev = put(cluster.member(1).unwrap(), "after", "hellos").await;
    assert_eq!(same_everywhere(&cluster, rev).await.len(), 1);
}
