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

use std::time::Duration;

/// etcd's default `--listen-peer-urls` and `--initial-advertise-peer-urls`.
pub const DEFAULT_PEER_URL: &str = "http://localhost:2380";
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
    if let Some(v) = flags.force_new_cluster {
        if super::parse_bool(v) == Ok(true) {
            return Err(
                "--force-new-cluster is refused: ephd's cluster mode does not have it yet"
                    .to_string(),
            );
        }
    }
    let token = flags.token.unwrap_or(DEFAULT_TOKEN).to_string();
    let listen_peer_urls = urls(flags.listen_peer_urls);
    let advertise_peer_urls = urls(flags.advertise_peer_urls);
    for url in listen_peer_urls.iter().chain(&advertise_peer_urls) {
        if !url.starts_with("http://") {
            return Err(format!(
                "peer URL {url:?} is refused: ephd's cluster mode has no peer TLS yet, so \
                 peer URLs must be http:// (on a private network)"
            ));
        }
    }
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
    Ok(ClusterConfig {
        name: name.to_string(),
        members,
        token,
        listen_peer_urls,
        advertise_peer_urls,
        heartbeat: Duration::from_millis(heartbeat),
        election: Duration::from_millis(election),
        existing,
    })
}

#[cfg(test)]
mod tests {
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
        let tls = Flags {
            listen_peer_urls: Some("https://0.0.0.0:2380"),
            ..flags("http://10.0.0.1:2380")
        };
        assert!(build("a", m(), &tls).unwrap_err().contains("peer TLS"));
        assert!(parse_members("a").is_err());
        assert!(parse_members("a=").is_err());
        let two_urls = parse_members("a=http://x:1,b=http://y:1,a=http://x:2").unwrap();
        assert_eq!(two_urls[0].1, ["http://x:1", "http://x:2"]);
    }
}
