//! Cluster flags: parsing, checks and refusals.

use super::*;

const THREE: &str = "a=http://10.0.0.1:2380,b=http://10.0.0.2:2380,c=http://10.0.0.3:2380";

fn flags(advertise: &'static str) -> Flags<'static> {
    Flags {
        advertise_peer_urls: Some(advertise),
        listen_peer_urls: Some("http://0.0.0.0:2380"),
        ..Default::default()
    }
}

#[test]
fn every_member_derives_the_same_ids() {
    let members = parse_members(THREE).unwrap();
    let a = build("a", members.clone(), &flags("http://10.0.0.1:2380")).unwrap();
    let c = build("c", members, &flags("http://10.0.0.3:2380")).unwrap();
    assert_eq!(a.members, c.members);
    assert_eq!(a.cluster_id(), c.cluster_id());
    assert_ne!(a.member_id(), c.member_id());
    assert_eq!(
        a.member_id(),
        member_id(&["http://10.0.0.1:2380".into()], "etcd-cluster")
    );
    // The token separates clusters with the same URLs.
    let other = Flags {
        token: Some("other"),
        ..flags("http://10.0.0.1:2380")
    };
    let a2 = build("a", parse_members(THREE).unwrap(), &other).unwrap();
    assert_ne!(a.member_id(), a2.member_id());
    assert_ne!(a.cluster_id(), a2.cluster_id());
    assert_eq!(
        (a.heartbeat, a.election),
        (Duration::from_millis(100), Duration::from_secs(1))
    );
    assert_eq!(a.election_ticks(), 10);
}

#[test]
fn peer_tls_needs_https_everywhere_and_its_files() {
    const TLS3: &str = "a=https://10.0.0.1:2380,b=https://10.0.0.2:2380,c=https://10.0.0.3:2380";
    let m = || parse_members(TLS3).unwrap();
    let base = Flags {
        advertise_peer_urls: Some("https://10.0.0.1:2380"),
        listen_peer_urls: Some("https://0.0.0.0:2380"),
        ..Default::default()
    };
    assert!(build("a", m(), &base)
        .unwrap_err()
        .contains("--peer-cert-file"));
    let files = Flags {
        peer_cert_file: Some("/p/peer.crt"),
        peer_key_file: Some("/p/peer.key"),
        peer_trusted_ca_file: Some("/p/ca.crt"),
        peer_client_cert_auth: Some("true"),
        ..base
    };
    let tls = build("a", m(), &files).unwrap().peer_tls.unwrap();
    assert_eq!(tls.cert, PathBuf::from("/p/peer.crt"));
    assert_eq!(tls.allowed, None);
    // An allowed CN or host name: one or the other.
    let cn = Flags {
        peer_cert_allowed_cn: Some("ephd-member"),
        ..files
    };
    let tls = build("a", m(), &cn).unwrap().peer_tls.unwrap();
    assert_eq!(tls.allowed, Some(PeerAllowed::Cn("ephd-member".into())));
    let host = Flags {
        peer_cert_allowed_hostname: Some("peer.example"),
        ..files
    };
    let tls = build("a", m(), &host).unwrap().peer_tls.unwrap();
    assert_eq!(
        tls.allowed,
        Some(PeerAllowed::Hostname("peer.example".into()))
    );
    let both = Flags {
        peer_cert_allowed_cn: Some("ephd-member"),
        ..host
    };
    assert!(build("a", m(), &both)
        .unwrap_err()
        .contains("mutually exclusive"));
    // Without --peer-client-cert-auth too, as stock etcd 3.4 starts with
    // it: the peer CA already makes connecting members present a
    // certificate, which the allowed CN is checked against.
    for off in [Some("false"), None] {
        let unflagged = Flags {
            peer_client_cert_auth: off,
            ..cn
        };
        let tls = build("a", m(), &unflagged).unwrap().peer_tls.unwrap();
        assert_eq!(tls.allowed, Some(PeerAllowed::Cn("ephd-member".into())));
    }
    let bad = Flags {
        peer_client_cert_auth: Some("maybe"),
        ..files
    };
    assert!(build("a", m(), &bad)
        .unwrap_err()
        .contains("--peer-client-cert-auth \"maybe\" is not true or false"));
    // One plaintext member among TLS ones is refused.
    let mixed =
        parse_members("a=https://10.0.0.1:2380,b=http://10.0.0.2:2380,c=https://10.0.0.3:2380")
            .unwrap();
    let files = Flags {
        peer_cert_file: Some("/p/peer.crt"),
        peer_key_file: Some("/p/peer.key"),
        peer_trusted_ca_file: Some("/p/ca.crt"),
        advertise_peer_urls: Some("https://10.0.0.1:2380"),
        listen_peer_urls: Some("https://0.0.0.0:2380"),
        ..Default::default()
    };
    assert!(build("a", mixed, &files)
        .unwrap_err()
        .contains("same scheme"));
    // Peer TLS files with plaintext URLs are refused, not ignored.
    let plain = Flags {
        peer_cert_file: Some("/p/peer.crt"),
        ..flags("http://10.0.0.1:2380")
    };
    assert!(build("a", parse_members(THREE).unwrap(), &plain)
        .unwrap_err()
        .contains("need https://"));
    assert_eq!(
        build(
            "a",
            parse_members(THREE).unwrap(),
            &flags("http://10.0.0.1:2380")
        )
        .unwrap()
        .peer_tls,
        None
    );
}

#[test]
fn etcds_checks_apply() {
    let m = || parse_members(THREE).unwrap();
    let e = build("x", m(), &flags("http://10.0.0.1:2380")).unwrap_err();
    assert!(e.contains("couldn't find local name"), "{e}");
    let e = build("a", m(), &flags("http://10.0.0.9:2380")).unwrap_err();
    assert!(e.contains("--initial-advertise-peer-urls"), "{e}");
    let e = build("a", m(), &Flags::default()).unwrap_err();
    assert!(
        e.contains("http://localhost:2380"),
        "the default URL is etcd's: {e}"
    );
    let short = Flags {
        election_ms: Some("400"),
        ..flags("http://10.0.0.1:2380")
    };
    assert!(build("a", m(), &short).unwrap_err().contains("5 times"));
    let existing = Flags {
        initial_cluster_state: Some("existing"),
        ..flags("http://10.0.0.1:2380")
    };
    assert!(build("a", m(), &existing).unwrap().existing);
    let odd = Flags {
        initial_cluster_state: Some("joining"),
        ..flags("http://10.0.0.1:2380")
    };
    assert!(build("a", m(), &odd).unwrap_err().contains("valid values"));
    let force = |v: &'static str, state: &'static str| Flags {
        force_new_cluster: Some(v),
        initial_cluster_state: Some(state),
        ..flags("http://10.0.0.1:2380")
    };
    assert!(
        build("a", m(), &force("true", "new"))
            .unwrap()
            .force_new_cluster
    );
    assert!(
        !build("a", m(), &force("false", "new"))
            .unwrap()
            .force_new_cluster
    );
    assert!(build("a", m(), &force("yes", "new"))
        .unwrap_err()
        .contains("not true or false"));
    assert!(build("a", m(), &force("true", "existing"))
        .unwrap_err()
        .contains("cannot be combined"));
    let tls = Flags {
        listen_peer_urls: Some("https://0.0.0.0:2380"),
        ..flags("http://10.0.0.1:2380")
    };
    assert!(build("a", m(), &tls).unwrap_err().contains("same scheme"));
    assert!(parse_members("a").is_err());
    assert!(parse_members("a=").is_err());
    let two_urls = parse_members("a=http://x:1,b=http://y:1,a=http://x:2").unwrap();
    assert_eq!(two_urls[0].1, ["http://x:1", "http://x:2"]);
}
