//! Cluster mode's settings, from etcd's clustering flags: used only when
//! `--initial-cluster` names another member than this one. Without that,
//! the same flags are accepted and ignored (`etcd.rs`), and ephd runs its
//! single-member path.
//!
//! Member IDs are derived from the initial cluster alone, as etcd derives
//! them: every member computes the same ID for every member without
//! talking to it. etcd hashes a member's sorted peer URLs and the cluster
//! token with SHA-1; ephd uses FNV-1a 64 over the same inputs (so the IDs
//! differ from etcd's, the rule is the same). The cluster ID hashes the
//! sorted member IDs and the token.

use std::path::PathBuf;
use std::time::Duration;

/// etcd's default `--listen-peer-urls` and `--initial-advertise-peer-urls`.
pub const DEFAULT_PEER_URL: &str = "http://localhost:2380";
/// `--snapshot-count` when not given: entries applied between two
/// compactions of the in-memory log.
pub const DEFAULT_SNAPSHOT_COUNT: u64 = 10_000;
/// `--experimental-snapshot-catchup-entries` when not given: entries kept
/// for slow followers after a compaction (etcd's `SnapshotCatchUpEntries`).
pub const DEFAULT_CATCHUP_ENTRIES: u64 = 5_000;
/// etcd's default `--initial-cluster-token`.
pub const DEFAULT_TOKEN: &str = "etcd-cluster";
/// etcd's default `--heartbeat-interval`, in milliseconds.
pub const DEFAULT_HEARTBEAT_MS: u64 = 100;
/// etcd's default `--election-timeout`, in milliseconds.
pub const DEFAULT_ELECTION_MS: u64 = 1000;
/// etcd's largest `--election-timeout`, in milliseconds.
const MAX_ELECTION_MS: u64 = 50_000;

/// One member of the initial cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its `--name`.
    pub name: String,
    /// Its peer URLs, as `--initial-cluster` lists them.
    pub peer_urls: Vec<String>,
    /// Its member ID (also its Raft ID), derived by [`member_id`].
    pub id: u64,
}

/// The settings of a member of a multi-member cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// This member's name (`--name`).
    pub name: String,
    /// Every member of the initial cluster, this one included, in the order
    /// `--initial-cluster` first names them.
    pub members: Vec<Member>,
    /// `--initial-cluster-token`.
    pub token: String,
    /// `--listen-peer-urls`: where this member serves its peers.
    pub listen_peer_urls: Vec<String>,
    /// `--initial-advertise-peer-urls`: where its peers reach it.
    pub advertise_peer_urls: Vec<String>,
    /// `--heartbeat-interval`: one Raft tick.
    pub heartbeat: Duration,
    /// `--election-timeout`.
    pub election: Duration,
    /// `--initial-cluster-state existing`: join a running cluster that
    /// added this member with MemberAdd, instead of forming a new one.
    pub existing: bool,
    /// `--snapshot-count`: entries applied between two compactions of the
    /// in-memory Raft log.
    pub snapshot_count: u64,
    /// `--experimental-snapshot-catchup-entries`: entries a compaction
    /// keeps for slow followers; one further behind gets a snapshot.
    pub catchup_entries: u64,
    /// Peer TLS (`--peer-cert-file` and friends), when the peer URLs are
    /// `https://`.
    pub peer_tls: Option<PeerTls>,
    /// `--force-new-cluster`: start as a one-member cluster (the same
    /// member and cluster IDs, every other member removed) even when the
    /// other members say a cluster ran before (`cluster/force.rs`).
    pub force_new_cluster: bool,
}

/// The files of peer TLS. One certificate serves both ways, as etcd's
/// does: it is the peer listener's server certificate and the client
/// certificate this member presents to the others, so it needs both the
/// serverAuth and clientAuth extended key usages.
///
/// `--peer-client-cert-auth` has no field: https:// peer URLs always come
/// with `--peer-trusted-ca-file`, and with a trusted CA a connecting member
/// must present a certificate it signed, with or without the flag, as in
/// etcd (the flag is still parsed and checked, as etcd takes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTls {
    /// `--peer-cert-file`.
    pub cert: PathBuf,
    /// `--peer-key-file`.
    pub key: PathBuf,
    /// `--peer-trusted-ca-file`: the CA that signs the other members'
    /// certificates, verified both when dialling them (as servers) and when
    /// they connect (as clients: only members presenting a certificate it
    /// signed may send Raft messages).
    pub ca: PathBuf,
    /// `--peer-cert-allowed-cn` or `--peer-cert-allowed-hostname`: what a
    /// connecting member's certificate must also name.
    pub allowed: Option<PeerAllowed>,
    /// `--peer-crl-file`: revocation lists; a connecting member whose
    /// certificate they revoke is refused (etcd checks them on its peer
    /// listener only, as ephd does; the dialling side does not).
    pub crl: Option<PathBuf>,
}

/// A further condition on the peer certificates of other members, beyond a
/// chain to the peer CA: the one a member connecting to the peer port
/// presents, and the one a dialled member serves (etcd's flags of the same
/// names, applied both ways as etcd does; one or the other, as etcd 3.5
/// requires).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerAllowed {
    /// `--peer-cert-allowed-cn`: its subject's common name is exactly this.
    Cn(String),
    /// `--peer-cert-allowed-hostname`: it is valid for this host name (a
    /// DNS or IP subject alternative name, wildcards as TLS allows).
    Hostname(String),
}

impl ClusterConfig {
    /// This member's ID.
    pub fn member_id(&self) -> u64 {
        self.members
            .iter()
            .find(|m| m.name == self.name)
            .map_or(0, |m| m.id)
    }

    /// The cluster ID: the same on every member of the initial cluster.
    pub fn cluster_id(&self) -> u64 {
        let mut ids: Vec<u64> = self.members.iter().map(|m| m.id).collect();
        ids.sort_unstable();
        let mut text: String = ids.iter().map(|id| format!("{id:x},")).collect();
        text.push_str(&self.token);
        nonzero(fnv64(text.as_bytes()))
    }

    /// Raft ticks in an election timeout (one tick per heartbeat).
    pub fn election_ticks(&self) -> usize {
        (self.election.as_millis() / self.heartbeat.as_millis().max(1)) as usize
    }
}

/// The member ID of a member with `peer_urls` in a cluster with `token`
/// (never 0, which Raft reserves).
pub fn member_id(peer_urls: &[String], token: &str) -> u64 {
    let mut urls = peer_urls.to_vec();
    urls.sort();
    let mut text = urls.join(",");
    text.push('|');
    text.push_str(token);
    nonzero(fnv64(text.as_bytes()))
}

fn nonzero(h: u64) -> u64 {
    if h == 0 {
        1
    } else {
        h
    }
}

fn fnv64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `--initial-cluster`'s members (`name=peerURL,...`, a name may repeat
/// with more URLs), in the order first named.
pub(super) fn parse_members(value: &str) -> Result<Vec<(String, Vec<String>)>, String> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, url)) = entry.split_once('=') else {
            return Err(format!(
                "--initial-cluster {value:?}: {entry:?} is not name=peerURL"
            ));
        };
        let url = url.trim();
        if url.is_empty() {
            return Err(format!(
                "--initial-cluster {value:?}: {entry:?} has no peer URL"
            ));
        }
        match out.iter_mut().find(|(n, _)| n == name) {
            Some((_, urls)) => urls.push(url.to_string()),
            None => out.push((name.to_string(), vec![url.to_string()])),
        }
    }
    Ok(out)
}

/// The flag values cluster mode reads, as given (`None`: not given).
#[derive(Debug, Default)]
pub(super) struct Flags<'a> {
    pub initial_cluster_state: Option<&'a str>,
    pub token: Option<&'a str>,
    pub listen_peer_urls: Option<&'a str>,
    pub advertise_peer_urls: Option<&'a str>,
    pub heartbeat_ms: Option<&'a str>,
    pub election_ms: Option<&'a str>,
    pub force_new_cluster: Option<&'a str>,
    pub snapshot_count: Option<&'a str>,
    pub catchup_entries: Option<&'a str>,
    pub peer_cert_file: Option<&'a str>,
    pub peer_key_file: Option<&'a str>,
    pub peer_trusted_ca_file: Option<&'a str>,
    pub peer_client_cert_auth: Option<&'a str>,
    pub peer_cert_allowed_cn: Option<&'a str>,
    pub peer_cert_allowed_hostname: Option<&'a str>,
    pub peer_crl_file: Option<&'a str>,
}

/// Peer TLS from its flags, checked against the peer URLs: every peer URL
/// (listened on, advertised, or another member's) is `https://` with the
/// peer certificate, key and trusted CA given, or every one is `http://`
/// with none of them. A mix would send Raft traffic in plain text by
/// surprise, or fail every connection at runtime instead of at startup.
fn peer_tls(flags: &Flags<'_>, urls: &[&String]) -> Result<Option<PeerTls>, String> {
    let path = |v: Option<&str>| {
        v.map(str::trim)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let cert = path(flags.peer_cert_file);
    let key = path(flags.peer_key_file);
    let ca = path(flags.peer_trusted_ca_file);
    let crl = path(flags.peer_crl_file);
    let client_cert_auth = match flags.peer_client_cert_auth {
        None => false,
        Some(v) if v.trim().is_empty() => false,
        Some(v) => super::parse_bool(v)
            .map_err(|_| format!("--peer-client-cert-auth {v:?} is not true or false"))?,
    };
    for url in urls {
        if !url.starts_with("http://") && !url.starts_with("https://") {
            return Err(format!(
                "peer URL {url:?} must start with http:// or https://"
            ));
        }
    }
    let https = urls.iter().filter(|u| u.starts_with("https://")).count();
    if https == 0 {
        let named = |v: Option<&str>| v.is_some_and(|v| !v.trim().is_empty());
        let allowed = named(flags.peer_cert_allowed_cn) || named(flags.peer_cert_allowed_hostname);
        let any = cert.is_some() || key.is_some() || ca.is_some() || crl.is_some();
        if any || client_cert_auth || allowed {
            return Err(
                "--peer-cert-file, --peer-key-file, --peer-trusted-ca-file, \
                 --peer-client-cert-auth, --peer-crl-file and --peer-cert-allowed-cn/-hostname \
                 need https:// \
                 peer URLs (--listen-peer-urls, --initial-advertise-peer-urls and every member \
                 in --initial-cluster)"
                    .to_string(),
            );
        }
        return Ok(None);
    }
    if https != urls.len() {
        let plain = urls
            .iter()
            .find(|u| u.starts_with("http://"))
            .map_or("", |u| u.as_str());
        return Err(format!(
            "peer URL {plain:?} is http:// while others are https://: every peer URL \
             (--listen-peer-urls, --initial-advertise-peer-urls, --initial-cluster) must use \
             the same scheme"
        ));
    }
    let allowed = allowed(flags)?;
    match (cert, key, ca) {
        (Some(cert), Some(key), Some(ca)) => Ok(Some(PeerTls {
            cert,
            key,
            ca,
            allowed,
            crl,
        })),
        _ => Err(
            "https:// peer URLs need --peer-cert-file, --peer-key-file and \
             --peer-trusted-ca-file (the CA that signs every member's peer certificate)"
                .to_string(),
        ),
    }
}

/// `--peer-cert-allowed-cn` / `--peer-cert-allowed-hostname`: one or the
/// other. Taken without `--peer-client-cert-auth` too, as etcd 3.4 takes
/// them: connecting members present certificates whenever the peer CA is
/// given, which https:// peer URLs always need.
fn allowed(flags: &Flags<'_>) -> Result<Option<PeerAllowed>, String> {
    let text = |v: Option<&str>| v.map(str::trim).filter(|v| !v.is_empty()).map(String::from);
    let allowed = match (
        text(flags.peer_cert_allowed_cn),
        text(flags.peer_cert_allowed_hostname),
    ) {
        (None, None) => return Ok(None),
        (Some(cn), Some(hostname)) => {
            return Err(format!(
                "--peer-cert-allowed-cn {cn:?} and --peer-cert-allowed-hostname {hostname:?} \
                 are mutually exclusive (as in etcd 3.5): give one"
            ))
        }
        (Some(cn), None) => PeerAllowed::Cn(cn),
        (None, Some(hostname)) => PeerAllowed::Hostname(hostname),
    };
    Ok(Some(allowed))
}

/// The peer URLs `--initial-advertise-peer-urls` gives (etcd's default
/// when not given).
pub(super) fn advertised_peer_urls(v: Option<&str>) -> Vec<String> {
    urls(v)
}

fn urls(v: Option<&str>) -> Vec<String> {
    v.unwrap_or(DEFAULT_PEER_URL)
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .collect()
}

fn millis(v: Option<&str>, default: u64, flag: &str) -> Result<u64, String> {
    match v {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("--{flag} {v:?} is not a number of milliseconds")),
    }
}

/// Cluster mode's settings for member `name`, checked as etcd checks them
/// (and refusing what ephd does not build yet).
pub(super) fn build(
    name: &str,
    members: Vec<(String, Vec<String>)>,
    flags: &Flags<'_>,
) -> Result<ClusterConfig, String> {
    let existing = match flags.initial_cluster_state.unwrap_or("new") {
        "new" => false,
        "existing" => true,
        other => {
            return Err(format!(
                "unexpected value {other:?} for --initial-cluster-state: \
                 valid values are \"new\" or \"existing\""
            ))
        }
    };
    let force_new_cluster = match flags.force_new_cluster.map(str::trim) {
        None | Some("") => false,
        Some(v) => super::parse_bool(v)
            .map_err(|_| format!("--force-new-cluster {v:?} is not true or false"))?,
    };
    if force_new_cluster && existing {
        return Err(
            "--force-new-cluster starts a new one-member cluster: it cannot be combined \
             with --initial-cluster-state existing"
                .to_string(),
        );
    }
    let token = flags.token.unwrap_or(DEFAULT_TOKEN).to_string();
    let listen_peer_urls = urls(flags.listen_peer_urls);
    let advertise_peer_urls = urls(flags.advertise_peer_urls);
    let heartbeat = millis(
        flags.heartbeat_ms,
        DEFAULT_HEARTBEAT_MS,
        "heartbeat-interval",
    )?;
    let election = millis(flags.election_ms, DEFAULT_ELECTION_MS, "election-timeout")?;
    if heartbeat == 0 {
        return Err("--heartbeat-interval must be above 0".to_string());
    }
    if election < 5 * heartbeat {
        return Err(format!(
            "--election-timeout[{election}ms] should be at least as 5 times as \
             --heartbeat-interval[{heartbeat}ms]"
        ));
    }
    if election > MAX_ELECTION_MS {
        return Err(format!(
            "--election-timeout[{election}ms] is too long, and should be set less than \
             {MAX_ELECTION_MS}ms"
        ));
    }
    let count = |v: Option<&str>, default: u64, flag: &str| match v {
        None => Ok(default),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("--{flag} {v:?} must be a number above 0")),
        },
    };
    let snapshot_count = count(
        flags.snapshot_count,
        DEFAULT_SNAPSHOT_COUNT,
        "snapshot-count",
    )?;
    let catchup_entries = count(
        flags.catchup_entries,
        DEFAULT_CATCHUP_ENTRIES,
        "snapshot-catchup-entries",
    )?;
    let Some((_, own_urls)) = members.iter().find(|(n, _)| n == name) else {
        return Err(format!(
            "couldn't find local name {name:?} in the initial cluster configuration"
        ));
    };
    let (mut a, mut b) = (own_urls.clone(), advertise_peer_urls.clone());
    a.sort();
    b.sort();
    if a != b {
        return Err(format!(
            "--initial-cluster has {name}={} but missing from --initial-advertise-peer-urls={} \
             (the peer URLs of this member must be the same in both)",
            own_urls.join(","),
            advertise_peer_urls.join(",")
        ));
    }
    let members: Vec<Member> = members
        .into_iter()
        .map(|(name, peer_urls)| Member {
            id: member_id(&peer_urls, &token),
            name,
            peer_urls,
        })
        .collect();
    for (i, m) in members.iter().enumerate() {
        if let Some(o) = members[..i].iter().find(|o| o.id == m.id) {
            return Err(format!(
                "--initial-cluster: members {:?} and {:?} have the same peer URLs",
                o.name, m.name
            ));
        }
    }
    let all_peer_urls: Vec<&String> = listen_peer_urls
        .iter()
        .chain(&advertise_peer_urls)
        .chain(members.iter().flat_map(|m| &m.peer_urls))
        .collect();
    let peer_tls = peer_tls(flags, &all_peer_urls)?;
    Ok(ClusterConfig {
        name: name.to_string(),
        members,
        token,
        listen_peer_urls,
        advertise_peer_urls,
        heartbeat: Duration::from_millis(heartbeat),
        election: Duration::from_millis(election),
        peer_tls,
        snapshot_count,
        catchup_entries,
        existing,
        force_new_cluster,
    })
}

#[cfg(test)]
impl ClusterConfig {
    /// For unit tests elsewhere: members `names` at
    /// `http://10.0.0.<i>:2380` (token `tok`, etcd's timings), as member
    /// `me` starts.
    pub fn for_tests(names: &[&str], me: &str) -> ClusterConfig {
        let members: Vec<Member> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let urls = vec![format!("http://10.0.0.{i}:2380")];
                Member {
                    name: n.to_string(),
                    id: member_id(&urls, "tok"),
                    peer_urls: urls,
                }
            })
            .collect();
        let own = members
            .iter()
            .find(|m| m.name == me)
            .unwrap()
            .peer_urls
            .clone();
        ClusterConfig {
            name: me.into(),
            token: "tok".into(),
            listen_peer_urls: own.clone(),
            advertise_peer_urls: own,
            members,
            heartbeat: std::time::Duration::from_millis(100),
            election: std::time::Duration::from_secs(1),
            existing: false,
            snapshot_count: 10,
            catchup_entries: 5,
            peer_tls: None,
            force_new_cluster: false,
        }
    }
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
