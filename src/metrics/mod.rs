//! Prometheus metrics under etcd's names, so existing etcd dashboards and
//! alerts (etcd's `contrib/mixin`) work against ephd. Counters are bumped
//! by the gRPC adapters and by the gRPC metrics layer ([`grpc`]), which
//! also logs the rate-limited warnings about rejected, shed and slow
//! requests ([`warnings`]) since it sees every call end anyway; gauges
//! are read from the store at scrape time. README.md, "Metrics", lists what
//! is served and which etcd metrics stay absent, and why.

pub mod grpc;
pub mod warnings;

use crate::mvcc::Store;
use prometheus::{Encoder, IntCounter, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// All metrics of one server.
pub struct Metrics {
    registry: Registry,
    /// Ranges served (`etcd_mvcc_range_total`).
    pub range_total: IntCounter,
    /// Puts applied (`etcd_mvcc_put_total`).
    pub put_total: IntCounter,
    /// Deletes applied (`etcd_mvcc_delete_total`).
    pub delete_total: IntCounter,
    /// Txns applied (`etcd_mvcc_txn_total`).
    pub txn_total: IntCounter,
    /// Open watch streams (`etcd_debugging_mvcc_watch_stream_total`).
    pub watch_streams: IntGauge,
    /// Active watchers (`etcd_debugging_mvcc_watcher_total`).
    pub watchers: IntGauge,
    /// Events sent to watchers (`etcd_debugging_mvcc_events_total`).
    pub events_total: IntCounter,
    /// Leases granted (`etcd_debugging_lease_granted_total`).
    pub lease_granted: IntCounter,
    /// Leases revoked by clients (`etcd_debugging_lease_revoked_total`).
    pub lease_revoked: IntCounter,
    /// Lease keep-alives (`etcd_debugging_lease_renewed_total`).
    pub lease_renewed: IntCounter,
    /// Leases expired (`etcd_server_lease_expired_total`).
    pub lease_expired: IntCounter,
    /// The space quota (`etcd_server_quota_backend_bytes`), set at startup;
    /// -1 when the quota is off.
    pub quota_backend_bytes: IntGauge,
    /// The stored data's memory bound (`ephd_store_memory_bound_bytes`), set
    /// at startup; -1 when off.
    pub memory_bound_bytes: IntGauge,
    /// `ephd_store_memory_bytes`: the accounted memory the bound limits.
    memory_bytes: IntGauge,
    /// Range requests shed with "too many requests"
    /// (`ephd_shed_requests_total`).
    pub shed_total: IntCounter,
    /// The gRPC server metrics and client traffic counters, shared with the
    /// layer that keeps them.
    pub grpc: Arc<grpc::GrpcMetrics>,
    /// Proposals that failed (`etcd_server_proposals_failed_total`). Stays
    /// 0: without consensus a write is applied or refused before it would
    /// have been proposed, which etcd does not count as a failed proposal.
    pub proposals_failed: IntCounter,
    /// Seconds each write-ahead log batch took to sync in `--wal fsync`
    /// mode (`etcd_disk_wal_fsync_duration_seconds`, etcd's buckets).
    pub wal_fsync_seconds: prometheus::Histogram,
    /// Bytes written to the write-ahead log
    /// (`etcd_disk_wal_write_bytes_total`).
    pub wal_write_bytes: IntCounter,
    /// `etcd_server_has_leader`: 1 on a single member (it leads itself).
    has_leader: IntGauge,
    /// `etcd_server_is_leader`: 1 on a single member.
    is_leader: IntGauge,
    /// `etcd_server_leader_changes_seen_total`.
    leader_changes: IntCounter,
    /// `etcd_server_is_learner`: 0 on a single member.
    is_learner: IntGauge,
    proposals_committed: IntGauge,
    proposals_applied: IntGauge,
    server_version: IntGaugeVec,
    /// `etcd_server_id{server_id}`: this member's ID in hex.
    server_id: IntGaugeVec,
    db_total: IntGauge,
    db_in_use: IntGauge,
    keys: IntGauge,
    current_rev: IntGauge,
    compact_rev: IntGauge,
    leases: IntGauge,
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    registered(registry, IntCounter::new(name, help).expect("valid metric"))
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    registered(registry, IntGauge::new(name, help).expect("valid metric"))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric at zero.
    pub fn new() -> Self {
        let r = Registry::new();
        #[cfg(target_os = "linux")]
        {
            let _ = r.register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ));
        }
        let has_leader = gauge(
            &r,
            "etcd_server_has_leader",
            "Whether or not a leader exists. 1 is existence, 0 is not.",
        );
        has_leader.set(1);
        let is_leader = gauge(
            &r,
            "etcd_server_is_leader",
            "Whether or not this member is a leader. 1 if is, 0 otherwise.",
        );
        is_leader.set(1);
        let is_learner = gauge(
            &r,
            "etcd_server_is_learner",
            "Whether or not this member is a learner. 1 if is, 0 otherwise.",
        );
        is_learner.set(0);
        // A single member became leader once, when it started.
        let leader_changes = counter(
            &r,
            "etcd_server_leader_changes_seen_total",
            "The number of leader changes seen.",
        );
        leader_changes.inc();
        gauge(
            &r,
            "etcd_server_proposals_pending",
            "The current number of pending proposals to commit (always 0: writes apply as they arrive).",
        );
        let version = IntGaugeVec::new(
            Opts::new(
                "etcd_server_version",
                "Which version is running. 1 for 'server_version' label with current version.",
            ),
            &["server_version"],
        )
        .expect("valid metric");
        r.register(Box::new(version.clone()))
            .expect("unique metric");
        let server_id = IntGaugeVec::new(
            Opts::new(
                "etcd_server_id",
                "Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.",
            ),
            &["server_id"],
        )
        .expect("valid metric");
        r.register(Box::new(server_id.clone()))
            .expect("unique metric");
        let grpc = Arc::new(grpc::GrpcMetrics::new(&r).expect("valid gRPC metrics"));
        let wal_fsync_seconds = registered(
            &r,
            prometheus::Histogram::with_opts(
                prometheus::HistogramOpts::new(
                    "etcd_disk_wal_fsync_duration_seconds",
                    "The latency distributions of fsync called by WAL.",
                )
                // etcd's: 1 ms doubling to about 8 s.
                .buckets(prometheus::exponential_buckets(0.001, 2.0, 14).expect("valid buckets")),
            )
            .expect("valid metric"),
        );
        let wal_write_bytes = counter(
            &r,
            "etcd_disk_wal_write_bytes_total",
            "Total number of bytes written in WAL.",
        );
        Metrics {
            wal_fsync_seconds,
            wal_write_bytes,
            has_leader,
            is_leader,
            is_learner,
            leader_changes,
            server_version: version,
            server_id,
            grpc,
            proposals_failed: counter(
                &r,
                "etcd_server_proposals_failed_total",
                "The total number of failed proposals seen.",
            ),
            proposals_committed: gauge(
                &r,
                "etcd_server_proposals_committed_total",
                "The total number of consensus proposals committed (writes applied).",
            ),
            proposals_applied: gauge(
                &r,
                "etcd_server_proposals_applied_total",
                "The total number of consensus proposals applied (writes applied).",
            ),
            range_total: counter(&r, "etcd_mvcc_range_total", "Total number of ranges seen."),
            put_total: counter(&r, "etcd_mvcc_put_total", "Total number of puts seen."),
            delete_total: counter(
                &r,
                "etcd_mvcc_delete_total",
                "Total number of deletes seen.",
            ),
            txn_total: counter(&r, "etcd_mvcc_txn_total", "Total number of txns seen."),
            watch_streams: gauge(
                &r,
                "etcd_debugging_mvcc_watch_stream_total",
                "Total number of watch streams.",
            ),
            watchers: gauge(
                &r,
                "etcd_debugging_mvcc_watcher_total",
                "Total number of watchers.",
            ),
            events_total: counter(
                &r,
                "etcd_debugging_mvcc_events_total",
                "Total number of events sent.",
            ),
            lease_granted: counter(
                &r,
                "etcd_debugging_lease_granted_total",
                "Number of granted leases.",
            ),
            lease_revoked: counter(
                &r,
                "etcd_debugging_lease_revoked_total",
                "Number of revoked leases.",
            ),
            lease_renewed: counter(
                &r,
                "etcd_debugging_lease_renewed_total",
                "Number of renewed leases.",
            ),
            lease_expired: counter(
                &r,
                "etcd_server_lease_expired_total",
                "Number of expired leases.",
            ),
            quota_backend_bytes: gauge(
                &r,
                "etcd_server_quota_backend_bytes",
                "Space quota in bytes of etcd's backend measure (-1: off).",
            ),
            memory_bound_bytes: gauge(
                &r,
                "ephd_store_memory_bound_bytes",
                "Memory bound of the stored data, in bytes of accounted memory (-1: off).",
            ),
            memory_bytes: gauge(
                &r,
                "ephd_store_memory_bytes",
                "Accounted memory of keys, values and versions held, with history.",
            ),
            shed_total: counter(
                &r,
                "ephd_shed_requests_total",
                "Range requests refused with \"too many requests\" under overload.",
            ),
            db_total: gauge(
                &r,
                "etcd_mvcc_db_total_size_in_bytes",
                "What the versions held, with history, would take in etcd's backend.",
            ),
            db_in_use: gauge(
                &r,
                "etcd_mvcc_db_total_size_in_use_in_bytes",
                "What the newest live versions would take in etcd's backend.",
            ),
            keys: gauge(
                &r,
                "etcd_debugging_mvcc_keys_total",
                "Total number of live keys.",
            ),
            current_rev: gauge(
                &r,
                "etcd_debugging_mvcc_current_revision",
                "The current revision of the store.",
            ),
            compact_rev: gauge(
                &r,
                "etcd_debugging_mvcc_compact_revision",
                "The revision of the last compaction.",
            ),
            leases: gauge(&r, "ephd_leases", "Number of granted leases."),
            registry: r,
        }
    }

    /// Sets `etcd_server_version{server_version=...}` to 1 for `version`,
    /// the etcd version the server reports (the api layer owns it; the
    /// metrics do not depend on the api layer).
    pub fn set_server_version(&self, version: &str) {
        self.server_version.reset();
        self.server_version.with_label_values(&[version]).set(1);
    }

    /// Sets `etcd_server_id{server_id=...}` to 1 for member `id`, written
    /// in hex as etcd writes member IDs, so dashboards can tell members
    /// apart by ID as with etcd (single member and cluster member alike).
    pub fn set_server_id(&self, id: u64) {
        self.server_id.reset();
        self.server_id
            .with_label_values(&[&format!("{id:x}")])
            .set(1);
    }

    /// A cluster member's role and the new leaders it has seen, set before
    /// each scrape (a single member keeps the values it starts with: it
    /// leads, is no learner, and saw one leader, itself).
    pub fn set_role(&self, has_leader: bool, is_leader: bool, is_learner: bool, changes: u64) {
        let seen = self.leader_changes.get();
        if changes > seen {
            self.leader_changes.inc_by(changes - seen);
        }
        self.has_leader.set(i64::from(has_leader));
        self.is_leader.set(i64::from(is_leader));
        self.is_learner.set(i64::from(is_learner));
    }

    /// Renders every metric in Prometheus' text format.
    pub fn render(&self, store: &Store) -> String {
        let stats = store.stats();
        self.db_total.set(stats.backend_bytes());
        self.db_in_use.set(stats.backend_in_use());
        self.memory_bytes.set(stats.memory_bytes());
        self.keys.set(stats.live_keys.load(Ordering::Relaxed));
        self.current_rev.set(store.current_revision());
        self.compact_rev.set(store.compacted_revision().max(0));
        self.leases.set(store.lease_count() as i64);
        let applied = stats.applied_index.load(Ordering::Relaxed) as i64;
        self.proposals_committed.set(applied);
        self.proposals_applied.set(applied);
        render(&self.registry)
    }
}

/// Every series of `registry` in Prometheus' text format (the server's
/// metrics, and a cluster member's peer metrics after them).
pub(crate) fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    let _ = TextEncoder::new().encode(&registry.gather(), &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}

/// `metric`, registered in `registry` (every name is registered once, so a
/// failure is a bug).
pub(crate) fn registered<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: M,
) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("unique metric");
    metric
}
