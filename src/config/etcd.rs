//! etcd 3.4's server flags that ephd does not implement as settings of its
//! own: each is either accepted with a one-line warning saying why it does
//! not apply to an in-memory single member, or refused when its value asks
//! for something ephd does not do (a limit, a check, a cluster). Nothing is
//! dropped silently, so an etcd command line, env file or kubeadm manifest
//! either runs with the same meaning or stops with a clear message.
//!
//! The flags ephd implements (`--name`, `--listen-client-urls`,
//! `--quota-backend-bytes`, `--max-request-bytes`, TLS, `--logger` and the
//! other logging flags, ...) are
//! fields of [`Config`](super::Config) instead.

use super::cluster::{self, ClusterConfig};
use super::parse_duration;
use clap::{Arg, ArgMatches, Command};

/// The syntax of a flag's value, checked as etcd's Go flag parser would, so
/// a typo is refused even for a flag whose value is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Go `strconv.ParseBool`; the bare flag means `true`.
    Bool,
    /// A non-negative integer.
    Uint,
    /// Go duration syntax (`100ms`, `5s`).
    Duration,
    /// Any text.
    Text,
    /// One of these words.
    OneOf(&'static [&'static str]),
}

/// What ephd does with a flag.
#[derive(Debug, Clone, Copy)]
pub(super) enum Effect {
    /// Accepted at any value, with a warning giving this reason.
    Ignored(&'static str),
    /// Accepted (with a warning giving `ignored`) while `accepts` holds for
    /// the value, i.e. while it asks for nothing ephd would have to do;
    /// refused with `refused` otherwise.
    Only {
        accepts: fn(&str) -> bool,
        ignored: &'static str,
        refused: &'static str,
    },
}

/// One etcd flag that ephd accepts without a setting of its own.
#[derive(Debug, Clone, Copy)]
pub(super) struct Compat {
    /// The long flag name, without dashes, as etcd spells it.
    pub name: &'static str,
    pub kind: Kind,
    pub effect: Effect,
}

const NO_RAFT: &str =
    "ephd runs a single member without raft (cluster mode: --initial-cluster naming other members)";
const NO_PEERS: &str =
    "ephd runs a single member without peers (cluster mode: --initial-cluster naming other members)";
const LISTED_PEER_URLS: &str = "a single member listens on no peer URL; MemberList shows these \
     (cluster mode: --initial-cluster naming other members)";
const NO_BACKEND: &str = "ephd has no bbolt backend: writes apply in memory at once";
const NO_WAL: &str =
    "ephd keeps its write-ahead log in --data-dir (--wal), in segments it removes itself";
const NO_PROXY: &str = "ephd has no v2 proxy";
const NO_V2: &str = "ephd serves only the v3 API";
const NO_DISCOVERY: &str =
    "ephd's cluster mode bootstraps from --initial-cluster only, not by discovery";

fn is_empty(v: &str) -> bool {
    v.trim().is_empty()
}

fn is_false(v: &str) -> bool {
    go_bool(v) == Ok(false)
}

/// etcd 3.4's flags that are not [`Config`](super::Config) fields, plus
/// three later ones that etcd's sample configuration file and kubeadm use
/// (`--feature-gates`, `--tls-min-version`, `--tls-max-version`,
/// `--self-signed-cert-validity`).
pub(super) const COMPAT: &[Compat] = &[
    // Raft, WAL and backend tuning: nothing of it exists in ephd.
    c("wal-dir", Kind::Text, Effect::Ignored(NO_WAL)),
    c(
        "snapshot-count",
        Kind::Uint,
        Effect::Ignored(
            "ephd writes snapshots on a timer (--snapshot-interval, with --data-dir), not after a number of transactions",
        ),
    ),
    c(
        "experimental-snapshot-catchup-entries",
        Kind::Uint,
        Effect::Ignored(NO_RAFT),
    ),
    // etcd 3.6's name for the flag above.
    c("snapshot-catchup-entries", Kind::Uint, Effect::Ignored(NO_RAFT)),
    c(
        "max-snapshots",
        Kind::Uint,
        Effect::Ignored("ephd keeps its two newest snapshots"),
    ),
    c("max-wals", Kind::Uint, Effect::Ignored(NO_WAL)),
    c("heartbeat-interval", Kind::Uint, Effect::Ignored(NO_RAFT)),
    c("election-timeout", Kind::Uint, Effect::Ignored(NO_RAFT)),
    c("initial-election-tick-advance", Kind::Bool, Effect::Ignored(NO_RAFT)),
    c("pre-vote", Kind::Bool, Effect::Ignored(NO_RAFT)),
    c(
        "strict-reconfig-check",
        Kind::Bool,
        Effect::Ignored("ephd serves no membership changes"),
    ),
    c("backend-batch-interval", Kind::Duration, Effect::Ignored(NO_BACKEND)),
    c("backend-batch-limit", Kind::Uint, Effect::Ignored(NO_BACKEND)),
    c(
        "experimental-backend-bbolt-freelist-type",
        Kind::OneOf(&["array", "map"]),
        Effect::Ignored(NO_BACKEND),
    ),
    c(
        "experimental-compaction-batch-limit",
        Kind::Uint,
        Effect::Ignored("ephd's compaction frees memory, it deletes no bbolt keys in batches"),
    ),
    c(
        "experimental-initial-corrupt-check",
        Kind::Bool,
        Effect::Ignored(
            "there is no on-disk database to check (snapshots carry checksums, checked when loaded)",
        ),
    ),
    c(
        "experimental-corrupt-check-time",
        Kind::Duration,
        Effect::Ignored("a single member has no peers to compare hashes with"),
    ),
    c(
        "experimental-enable-lease-checkpoint",
        Kind::Bool,
        Effect::Ignored("leases live in one process: there is no leader change to survive"),
    ),
    // Clustering: ignored for a single member; cluster mode reads them
    // (`judge`, `cluster.rs`). --initial-cluster is added by `add_compat_args`.
    c("listen-peer-urls", Kind::Text, Effect::Ignored(NO_PEERS)),
    c(
        "initial-advertise-peer-urls",
        Kind::Text,
        Effect::Ignored(LISTED_PEER_URLS),
    ),
    c(
        "initial-cluster-state",
        Kind::OneOf(&["new", "existing"]),
        Effect::Ignored(NO_PEERS),
    ),
    c(
        "initial-cluster-token",
        Kind::Text,
        Effect::Ignored(NO_PEERS),
    ),
    c(
        "force-new-cluster",
        Kind::Bool,
        Effect::Ignored(
            "a single member is a one-member cluster already, which is what the flag makes of \
             etcd's data (with --data-dir ephd keeps its snapshots as etcd keeps its data)",
        ),
    ),
    c(
        "discovery",
        Kind::Text,
        Effect::Only {
            accepts: is_empty,
            ignored: "it is empty",
            refused: NO_DISCOVERY,
        },
    ),
    c(
        "discovery-srv",
        Kind::Text,
        Effect::Only {
            accepts: is_empty,
            ignored: "it is empty",
            refused: NO_DISCOVERY,
        },
    ),
    c("discovery-srv-name", Kind::Text, Effect::Ignored(NO_DISCOVERY)),
    c(
        "discovery-fallback",
        Kind::OneOf(&["exit", "proxy"]),
        Effect::Ignored(NO_DISCOVERY),
    ),
    c("discovery-proxy", Kind::Text, Effect::Ignored(NO_DISCOVERY)),
    c("peer-cert-file", Kind::Text, Effect::Ignored(NO_PEERS)),
    c("peer-key-file", Kind::Text, Effect::Ignored(NO_PEERS)),
    c("peer-client-cert-auth", Kind::Bool, Effect::Ignored(NO_PEERS)),
    c("peer-trusted-ca-file", Kind::Text, Effect::Ignored(NO_PEERS)),
    c("peer-cert-allowed-cn", Kind::Text, Effect::Ignored(NO_PEERS)),
    c("peer-cert-allowed-hostname", Kind::Text, Effect::Ignored(NO_PEERS)),
    c("peer-auto-tls", Kind::Bool, Effect::Ignored(NO_PEERS)),
    c("peer-crl-file", Kind::Text, Effect::Ignored(NO_PEERS)),
    c(
        "experimental-peer-skip-client-san-verification",
        Kind::Bool,
        Effect::Ignored(NO_PEERS),
    ),
    // gRPC: --max-concurrent-streams and the keepalive ping are implemented.
    c(
        "grpc-keepalive-min-time",
        Kind::Duration,
        Effect::Only {
            accepts: |v| parse_duration(v) == Ok(std::time::Duration::from_secs(5)),
            ignored: "5s is etcd's default, and ephd's HTTP/2 server enforces no minimum client ping interval",
            refused: "ephd's HTTP/2 server does not enforce a minimum client ping interval",
        },
    ),
    // Client security: restrictions ephd does not check are refused.
    c(
        "auto-tls",
        Kind::Bool,
        Effect::Only {
            accepts: is_false,
            ignored: "it is false",
            refused: "ephd does not generate certificates: give --cert-file and --key-file",
        },
    ),
    c(
        "client-cert-allowed-hostname",
        Kind::Text,
        Effect::Only {
            accepts: is_empty,
            ignored: "it is empty",
            refused: "ephd does not check the hostnames of client certificates",
        },
    ),
    c(
        "cipher-suites",
        Kind::Text,
        Effect::Only {
            accepts: is_empty,
            ignored: "it is empty",
            refused: "ephd cannot restrict its TLS cipher suites (it offers rustls' ECDHE suites with AEAD ciphers only)",
        },
    ),
    c(
        "tls-min-version",
        Kind::Text,
        Effect::Only {
            accepts: |v| is_empty(v) || v.trim() == "TLS1.2",
            ignored: "ephd offers TLS 1.2 and 1.3",
            refused: "ephd always offers TLS 1.2 and 1.3 and cannot raise the minimum",
        },
    ),
    c(
        "tls-max-version",
        Kind::Text,
        Effect::Only {
            accepts: |v| is_empty(v) || v.trim() == "TLS1.3",
            ignored: "ephd offers TLS 1.2 and 1.3",
            refused: "ephd always offers TLS 1.2 and 1.3 and cannot lower the maximum",
        },
    ),
    c(
        "self-signed-cert-validity",
        Kind::Uint,
        Effect::Ignored("ephd does not generate certificates"),
    ),
    c(
        "cors",
        Kind::Text,
        Effect::Ignored("ephd serves no HTTP API to browsers (no v2 API, no gRPC gateway)"),
    ),
    c(
        "host-whitelist",
        Kind::Text,
        Effect::Ignored("ephd serves no HTTP API to browsers (no v2 API, no gRPC gateway)"),
    ),
    // Auth is never enabled, so its settings never apply.
    // v2 API and proxy: not served, so turning them on is refused.
    c(
        "enable-v2",
        Kind::Bool,
        Effect::Only {
            accepts: is_false,
            ignored: NO_V2,
            refused: NO_V2,
        },
    ),
    c(
        "experimental-enable-v2v3",
        Kind::Text,
        Effect::Only {
            accepts: is_empty,
            ignored: NO_V2,
            refused: NO_V2,
        },
    ),
    c(
        "proxy",
        Kind::OneOf(&["off", "readonly", "on"]),
        Effect::Only {
            accepts: |v| v == "off",
            ignored: NO_PROXY,
            refused: NO_PROXY,
        },
    ),
    c("proxy-failure-wait", Kind::Uint, Effect::Ignored(NO_PROXY)),
    c("proxy-refresh-interval", Kind::Uint, Effect::Ignored(NO_PROXY)),
    c("proxy-dial-timeout", Kind::Uint, Effect::Ignored(NO_PROXY)),
    c("proxy-write-timeout", Kind::Uint, Effect::Ignored(NO_PROXY)),
    c("proxy-read-timeout", Kind::Uint, Effect::Ignored(NO_PROXY)),
    // Monitoring and logging.
    c(
        "enable-pprof",
        Kind::Bool,
        Effect::Ignored("ephd is not a Go program and has no pprof endpoint"),
    ),
    c(
        "metrics",
        Kind::OneOf(&["basic", "extensive"]),
        Effect::Ignored("ephd exports one set of metrics"),
    ),
    c(
        "log-package-levels",
        Kind::Text,
        Effect::Ignored("use --log-level's per-module directives"),
    ),
    c(
        "feature-gates",
        Kind::Text,
        Effect::Ignored("etcd's feature gates switch etcd features; none changes ephd"),
    ),
];

const fn c(name: &'static str, kind: Kind, effect: Effect) -> Compat {
    Compat { name, kind, effect }
}

/// The compat entry named `name`, if any.
pub(super) fn find(name: &str) -> Option<&'static Compat> {
    COMPAT.iter().find(|c| c.name == name)
}

/// Go's `strconv.ParseBool`, which etcd's boolean flags use.
pub(super) fn go_bool(v: &str) -> Result<bool, String> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("invalid boolean value {v:?}")),
    }
}

/// Checks a value's syntax for `kind`; the value itself is kept as text.
fn check_kind(kind: Kind, v: &str) -> Result<(), String> {
    match kind {
        Kind::Bool => go_bool(v).map(drop),
        Kind::Uint => v
            .parse::<u64>()
            .map(drop)
            .map_err(|_| format!("invalid value {v:?}: not a non-negative integer")),
        Kind::Duration => parse_duration(v).map(drop),
        Kind::Text => Ok(()),
        Kind::OneOf(words) => {
            if words.contains(&v) {
                Ok(())
            } else {
                Err(format!(
                    "invalid value {v:?}: use one of {}",
                    words.join(", ")
                ))
            }
        }
    }
}

/// The `--help` heading of the flags cluster mode reads.
pub(super) const CLUSTER_HEADING: &str =
    "Cluster mode (when --initial-cluster names other members than this one)";

/// What `--help` says of each flag cluster mode reads.
const CLUSTER_HELP: &[(&str, &str)] = &[
    (
        "initial-cluster",
        "Every member at bootstrap, name=peerURL,... (a name may repeat for \
         several URLs). Naming another member than --name turns on cluster mode",
    ),
    (
        "listen-peer-urls",
        "Comma-separated URLs to serve the other members on",
    ),
    (
        "initial-advertise-peer-urls",
        "Comma-separated peer URLs the other members reach this one at",
    ),
    (
        "initial-cluster-state",
        "new: form a new cluster; existing: join a running cluster that added \
         this member with MemberAdd [default: new]",
    ),
    (
        "initial-cluster-token",
        "Token of the cluster at bootstrap: members with different tokens never \
         form one cluster [default: etcd-cluster]",
    ),
    (
        "heartbeat-interval",
        "Raft heartbeat interval, milliseconds [default: 100]",
    ),
    (
        "election-timeout",
        "Raft election timeout, milliseconds [default: 1000]",
    ),
    (
        "force-new-cluster",
        "Start as a one-member cluster with this member's data and IDs, every \
         other member removed (RELIABILITY.md says what may be lost)",
    ),
    (
        "snapshot-count",
        "Entries applied between two compactions of the Raft log",
    ),
    (
        "snapshot-catchup-entries",
        "Entries a Raft log compaction keeps for slow followers; one further \
         behind is sent a snapshot",
    ),
    (
        "experimental-snapshot-catchup-entries",
        "etcd 3.5's name of --snapshot-catchup-entries",
    ),
    (
        "peer-cert-file",
        "Certificate this member serves to, and presents to, the other members \
         (https:// peer URLs)",
    ),
    ("peer-key-file", "Key of --peer-cert-file"),
    (
        "peer-trusted-ca-file",
        "CA that signs every member's peer certificate, checked both ways",
    ),
    (
        "peer-client-cert-auth",
        "Require a certificate of connecting members (always so with \
         --peer-trusted-ca-file, as in etcd)",
    ),
    (
        "peer-cert-allowed-cn",
        "Common name every other member's peer certificate must have",
    ),
    (
        "peer-cert-allowed-hostname",
        "Host name every other member's peer certificate must be valid for",
    ),
    (
        "peer-crl-file",
        "Revocation lists: a connecting member whose certificate they revoke is \
         refused",
    ),
];

/// `cmd` with every compat flag and `--initial-cluster` added. The flags
/// cluster mode reads are listed under their own heading; the others are
/// hidden from `--help` (README lists them) so the help stays about what
/// ephd does.
pub(super) fn add_compat_args(mut cmd: Command) -> Command {
    let shown = |arg: Arg, name: &str| match CLUSTER_HELP.iter().find(|(n, _)| *n == name) {
        Some((_, help)) => arg.help(*help).help_heading(CLUSTER_HEADING),
        None => arg.hide(true),
    };
    for compat in COMPAT {
        let kind = compat.kind;
        let arg = Arg::new(compat.name)
            .long(compat.name)
            .value_parser(move |v: &str| check_kind(kind, v).map(|()| v.to_string()));
        let mut arg = shown(arg, compat.name);
        if kind == Kind::Bool {
            // Go's boolean flags take `--flag` or `--flag=false`, never
            // `--flag false`.
            arg = arg
                .num_args(0..=1)
                .require_equals(true)
                .default_missing_value("true");
        }
        cmd = cmd.arg(arg);
    }
    let initial = Arg::new("initial-cluster")
        .long("initial-cluster")
        .value_parser(clap::builder::NonEmptyStringValueParser::new());
    cmd.arg(shown(initial, "initial-cluster"))
}

/// The value a compat flag was given, if it was.
fn given<'m>(matches: &'m ArgMatches, name: &str) -> Option<&'m String> {
    matches.try_get_one::<String>(name).ok().flatten()
}

/// The flags cluster mode reads when `--initial-cluster` names other
/// members: then they are settings, not ignored.
const CLUSTER_FLAGS: &[&str] = &[
    "listen-peer-urls",
    "initial-advertise-peer-urls",
    "initial-cluster-state",
    "initial-cluster-token",
    "heartbeat-interval",
    "election-timeout",
    "force-new-cluster",
    "snapshot-count",
    "experimental-snapshot-catchup-entries",
    "snapshot-catchup-entries",
    "peer-cert-file",
    "peer-key-file",
    "peer-client-cert-auth",
    "peer-trusted-ca-file",
    "peer-cert-allowed-cn",
    "peer-cert-allowed-hostname",
    "peer-crl-file",
];

/// Peer TLS flags cluster mode does not build: in cluster mode, asking for
/// them is refused rather than ignored, so a peer check the operator asked
/// for is never silently missing.
const PEER_TLS_FLAGS: &[&str] = &["peer-auto-tls"];

/// Judges every compat flag that was given: the warnings to log, or the
/// first refusal; and cluster mode's settings when `--initial-cluster`
/// names another member than `member`.
pub(super) fn judge(
    matches: &ArgMatches,
    member: &str,
) -> Result<(Vec<String>, Option<ClusterConfig>), String> {
    let members = match given(matches, "initial-cluster") {
        Some(v) => cluster::parse_members(v)?,
        None => Vec::new(),
    };
    let clustered = members.iter().any(|(name, _)| name != member);
    let mut warnings = Vec::new();
    for compat in COMPAT {
        let Some(value) = given(matches, compat.name) else {
            continue;
        };
        let name = compat.name;
        if clustered && CLUSTER_FLAGS.contains(&name) {
            continue;
        }
        if clustered && PEER_TLS_FLAGS.contains(&name) && !(is_empty(value) || is_false(value)) {
            return Err(format!(
                "flag --{name}={value} is refused: ephd's cluster mode does not have it yet"
            ));
        }
        match compat.effect {
            Effect::Ignored(reason) => warnings.push(ignored(name, reason)),
            Effect::Only {
                accepts,
                ignored: reason,
                refused,
            } => {
                if accepts(value) {
                    warnings.push(ignored(name, reason));
                } else {
                    return Err(format!("flag --{name}={value} is refused: {refused}"));
                }
            }
        }
    }
    if !clustered {
        if !members.is_empty() {
            warnings.push(ignored(
                "initial-cluster",
                "it names only this member, and ephd runs it as a one-member cluster",
            ));
        }
        return Ok((warnings, None));
    }
    let flag = |name: &'static str| given(matches, name).map(String::as_str);
    let flags = cluster::Flags {
        initial_cluster_state: flag("initial-cluster-state"),
        token: flag("initial-cluster-token"),
        listen_peer_urls: flag("listen-peer-urls"),
        advertise_peer_urls: flag("initial-advertise-peer-urls"),
        heartbeat_ms: flag("heartbeat-interval"),
        election_ms: flag("election-timeout"),
        force_new_cluster: flag("force-new-cluster"),
        peer_cert_file: flag("peer-cert-file"),
        peer_key_file: flag("peer-key-file"),
        peer_trusted_ca_file: flag("peer-trusted-ca-file"),
        peer_client_cert_auth: flag("peer-client-cert-auth"),
        peer_cert_allowed_cn: flag("peer-cert-allowed-cn"),
        peer_cert_allowed_hostname: flag("peer-cert-allowed-hostname"),
        peer_crl_file: flag("peer-crl-file"),
        snapshot_count: flag("snapshot-count"),
        catchup_entries: flag("snapshot-catchup-entries")
            .or(flag("experimental-snapshot-catchup-entries")),
    };
    let config = cluster::build(member, members, &flags)?;
    Ok((warnings, Some(config)))
}

/// The peer URLs a single member shows in MemberList: those it was told
/// to advertise (sorted, as etcd lists them), or etcd's default.
pub(super) fn single_member_peer_urls(matches: &ArgMatches) -> Vec<String> {
    let mut urls = cluster::advertised_peer_urls(
        given(matches, "initial-advertise-peer-urls").map(String::as_str),
    );
    urls.sort();
    urls
}

/// The one-line warning for an accepted, ignored flag.
fn ignored(name: &str, reason: &str) -> String {
    format!("flag --{name} is accepted for etcd compatibility and ignored: {reason}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_booleans_parse_like_strconv() {
        for t in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(go_bool(t), Ok(true));
        }
        for f in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(go_bool(f), Ok(false));
        }
        assert!(go_bool("yes").is_err());
    }

    #[test]
    fn compat_names_are_unique_and_not_config_fields() {
        use clap::CommandFactory;
        let cmd = super::super::Config::command();
        for (i, c) in COMPAT.iter().enumerate() {
            assert!(
                COMPAT[..i].iter().all(|o| o.name != c.name),
                "{} twice",
                c.name
            );
            assert!(
                cmd.get_arguments().all(|a| a.get_long() != Some(c.name)),
                "{} is also a Config field",
                c.name
            );
        }
    }
}
