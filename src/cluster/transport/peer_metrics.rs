//! etcd's peer network metrics for a cluster member, under etcd 3.4's
//! names, types, label names and label values, so the "peer traffic"
//! panels of etcd's dashboards show ephd clusters too:
//!
//! * `etcd_network_peer_sent_bytes_total{To}` and
//!   `etcd_network_peer_received_bytes_total{From}`: the bytes of the
//!   encoded Raft messages of each batch (and each snapshot's data)
//!   delivered to / taken from a peer. etcd counts
//!   the size of each Raft message it writes or reads; transport framing
//!   (gRPC, HTTP/2, TLS) is not counted by either. An idle link's probe
//!   (an empty batch) counts the few bytes of its encoded batch, as etcd
//!   counts the empty message it sends as its idle links' heartbeat: so
//!   two followers, which have no Raft messages for each other, show
//!   traffic with each other in both, as etcd's dashboards expect.
//! * `etcd_network_peer_sent_failures_total{To}`: Raft messages that did
//!   not reach the peer: those of a batch that could not be sent (or
//!   handed to the peer's stream), a snapshot not delivered, and those
//!   dropped because the peer's queue was full. etcd counts dropped
//!   messages the same way (a full send buffer, a failed post).
//! * `etcd_network_peer_received_failures_total{From}`: a batch with a
//!   message that does not parse, a chunked snapshot that failed after
//!   its header named the sender (etcd counts a body it cannot read or
//!   decode, and a failed snapshot). A peer's stream that breaks is not
//!   one, as etcd does not count its broken streams.
//! * `etcd_network_peer_round_trip_time_seconds{To}`: the round trip of
//!   the acks on the control lane (`peer_stream.rs`), on the same
//!   connection as the Raft traffic: small batches (heartbeats and their
//!   answers, votes, idle probes) that the peer answers once it has handed
//!   them to Raft. etcd's prober times a request on the peer port that its
//!   peer answers without Raft, every few seconds; ours also holds the
//!   peer's in-memory Raft step of those few messages (when the receiving
//!   task runs the Raft round itself), so it reads somewhat higher under
//!   load, never lower. The bulk lane's acks wait behind megabytes of
//!   appends and are left out.
//! * `etcd_network_active_peers{Local,Remote}`: 1 while the peer answers
//!   (`PeerHealth`), 0 after it stopped answering;
//!   `etcd_network_disconnected_peers_total{Local,Remote}` counts those
//!   stops.
//!
//! Every ID label is the member ID in lowercase hex, as etcd writes it.
//! As in etcd, a series appears with its first event: a healthy cluster
//! shows no failure series, and a single member none at all (it has no
//! peers). The hot path (every batch) adds to counters resolved once per
//! peer: no label lookup, no allocation.

use crate::metrics::registered;
use crate::proto::ephd::internal::RaftBatch;
use parking_lot::RwLock;
use prometheus::{
    exponential_buckets, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGaugeVec, Opts, Registry,
};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The bytes a batch counts for: `messages`, the encoded Raft messages'
/// bytes; for an empty batch (an idle probe), its encoded size.
pub(in crate::cluster) fn batch_bytes(batch: &RaftBatch, messages: usize) -> usize {
    if batch.messages.is_empty() {
        prost::Message::encoded_len(batch)
    } else {
        messages
    }
}

/// A member ID as etcd writes it in labels: lowercase hex, no padding.
pub(in crate::cluster) fn id_label(id: u64) -> String {
    format!("{id:x}")
}

/// One direction of one peer's traffic: bytes and failures, each series
/// created on first use and kept.
pub(in crate::cluster) struct Traffic {
    peer: String,
    bytes_vec: IntCounterVec,
    failures_vec: IntCounterVec,
    bytes: OnceLock<IntCounter>,
    failures: OnceLock<IntCounter>,
}

impl Traffic {
    fn new(peer: u64, bytes_vec: &IntCounterVec, failures_vec: &IntCounterVec) -> Traffic {
        Traffic {
            peer: id_label(peer),
            bytes_vec: bytes_vec.clone(),
            failures_vec: failures_vec.clone(),
            bytes: OnceLock::new(),
            failures: OnceLock::new(),
        }
    }

    /// `n` bytes of Raft messages went through (nothing for an empty
    /// probe, which creates no series).
    pub(in crate::cluster) fn bytes(&self, n: usize) {
        if n > 0 {
            self.bytes
                .get_or_init(|| self.bytes_vec.with_label_values(&[&self.peer]))
                .inc_by(n as u64);
        }
    }

    /// `n` messages (or broken streams) failed.
    pub(in crate::cluster) fn failed(&self, n: usize) {
        if n > 0 {
            self.failures
                .get_or_init(|| self.failures_vec.with_label_values(&[&self.peer]))
                .inc_by(n as u64);
        }
    }

    /// A batch of `messages` encoded into `bytes`, `delivered` or not.
    pub(in crate::cluster) fn batch(&self, bytes: usize, messages: usize, delivered: bool) {
        if delivered {
            self.bytes(bytes);
        } else {
            self.failed(messages);
        }
    }
}

/// The sending side of one peer link: its traffic and round trips.
pub(in crate::cluster) struct Outgoing {
    /// Bytes and failures to the peer.
    pub(in crate::cluster) sent: Traffic,
    rtt_vec: HistogramVec,
    rtt: OnceLock<Histogram>,
}

impl Outgoing {
    /// A control-lane ack came `took` after it was asked for.
    pub(in crate::cluster) fn round_trip(&self, took: Duration) {
        let to = &self.sent.peer;
        self.rtt
            .get_or_init(|| self.rtt_vec.with_label_values(&[to]))
            .observe(took.as_secs_f64());
    }
}

/// A cluster member's peer metrics, in a registry of their own that the
/// `/metrics` handler renders after the server's.
pub struct PeerMetrics {
    registry: Registry,
    local: String,
    sent_bytes: IntCounterVec,
    sent_failures: IntCounterVec,
    received_bytes: IntCounterVec,
    received_failures: IntCounterVec,
    rtt: HistogramVec,
    active: IntGaugeVec,
    disconnected: IntCounterVec,
    outgoing: RwLock<HashMap<u64, Arc<Outgoing>>>,
    incoming: RwLock<HashMap<u64, Arc<Traffic>>>,
}

fn counters(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    registered(
        r,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

/// `id`'s entry of `map`, made by `make` on first use: a read lock on the
/// hot path, the write lock once per peer.
fn resolve<T>(map: &RwLock<HashMap<u64, Arc<T>>>, id: u64, make: impl FnOnce() -> T) -> Arc<T> {
    if let Some(v) = map.read().get(&id) {
        return v.clone();
    }
    map.write()
        .entry(id)
        .or_insert_with(|| Arc::new(make()))
        .clone()
}

impl PeerMetrics {
    /// The metrics of member `local`, every series absent until its first
    /// event.
    pub(in crate::cluster) fn new(local: u64) -> PeerMetrics {
        let r = Registry::new();
        let to = &["To"];
        let from = &["From"];
        let link = &["Local", "Remote"];
        let sent_bytes = counters(
            &r,
            "etcd_network_peer_sent_bytes_total",
            "The total number of bytes sent to peers.",
            to,
        );
        let sent_failures = counters(
            &r,
            "etcd_network_peer_sent_failures_total",
            "The total number of send failures from peers.",
            to,
        );
        let received_bytes = counters(
            &r,
            "etcd_network_peer_received_bytes_total",
            "The total number of bytes received from peers.",
            from,
        );
        let received_failures = counters(
            &r,
            "etcd_network_peer_received_failures_total",
            "The total number of receive failures from peers.",
            from,
        );
        // etcd's buckets: 0.1 ms doubling 16 times, up to 3.2768 s.
        let rtt = registered(
            &r,
            HistogramVec::new(
                HistogramOpts::new(
                    "etcd_network_peer_round_trip_time_seconds",
                    "Round-Trip-Time histogram between peers",
                )
                .buckets(exponential_buckets(0.0001, 2.0, 16).expect("valid buckets")),
                to,
            )
            .expect("valid metric"),
        );
        let active = registered(
            &r,
            IntGaugeVec::new(
                Opts::new(
                    "etcd_network_active_peers",
                    "The current number of active peer connections.",
                ),
                link,
            )
            .expect("valid metric"),
        );
        let disconnected = counters(
            &r,
            "etcd_network_disconnected_peers_total",
            "The total number of disconnected peers.",
            link,
        );
        PeerMetrics {
            registry: r,
            local: id_label(local),
            sent_bytes,
            sent_failures,
            received_bytes,
            received_failures,
            rtt,
            active,
            disconnected,
            outgoing: RwLock::default(),
            incoming: RwLock::default(),
        }
    }

    /// The sending side's counters for peer `id`, resolved once per peer
    /// (a peer's lanes and queue keep them).
    pub(in crate::cluster) fn outgoing(&self, id: u64) -> Arc<Outgoing> {
        resolve(&self.outgoing, id, || Outgoing {
            sent: Traffic::new(id, &self.sent_bytes, &self.sent_failures),
            rtt_vec: self.rtt.clone(),
            rtt: OnceLock::new(),
        })
    }

    /// The receiving side's counters for batches from member `id`: a map
    /// lookup under a read lock per batch, no allocation after the first.
    pub(in crate::cluster) fn incoming(&self, id: u64) -> Arc<Traffic> {
        resolve(&self.incoming, id, || {
            Traffic::new(id, &self.received_bytes, &self.received_failures)
        })
    }

    /// Peer `id` answers again (or for the first time).
    pub(in crate::cluster) fn connected(&self, id: u64) {
        self.active
            .with_label_values(&[&self.local, &id_label(id)])
            .set(1);
    }

    /// Peer `id` stopped answering.
    pub(in crate::cluster) fn disconnected(&self, id: u64) {
        let remote = id_label(id);
        self.active
            .with_label_values(&[&self.local, &remote])
            .set(0);
        self.disconnected
            .with_label_values(&[&self.local, &remote])
            .inc();
    }

    /// Member `id` left the cluster: it is no peer any more, active or
    /// not (its traffic counters stay, as counters do).
    pub(in crate::cluster) fn removed(&self, id: u64) {
        let _ = self
            .active
            .remove_label_values(&[&self.local, &id_label(id)]);
    }

    /// Every series in Prometheus' text format.
    pub fn render(&self) -> String {
        crate::metrics::render(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_series_before_the_first_event() {
        let m = PeerMetrics::new(0xd1);
        let out = m.outgoing(0x78);
        out.sent.bytes(0);
        out.sent.failed(0);
        m.incoming(0x78).bytes(0);
        assert_eq!(m.render(), "");
    }

    #[test]
    fn labels_carry_hex_member_ids_as_etcd_writes_them() {
        let m = PeerMetrics::new(0xd1811f3e552da6ad);
        let out = m.outgoing(0x78bebaf33a1c78ed);
        out.sent.batch(100, 2, true);
        out.sent.batch(50, 3, false);
        out.round_trip(Duration::from_micros(150));
        m.incoming(0xc88a6f329c09858a).bytes(7);
        m.connected(0x78bebaf33a1c78ed);
        let text = m.render();
        for line in [
            r#"etcd_network_peer_sent_bytes_total{To="78bebaf33a1c78ed"} 100"#,
            r#"etcd_network_peer_sent_failures_total{To="78bebaf33a1c78ed"} 3"#,
            r#"etcd_network_peer_received_bytes_total{From="c88a6f329c09858a"} 7"#,
            r#"etcd_network_peer_round_trip_time_seconds_bucket{To="78bebaf33a1c78ed",le="0.0001"} 0"#,
            r#"etcd_network_peer_round_trip_time_seconds_bucket{To="78bebaf33a1c78ed",le="0.0002"} 1"#,
            r#"etcd_network_peer_round_trip_time_seconds_bucket{To="78bebaf33a1c78ed",le="3.2768"} 1"#,
            r#"etcd_network_active_peers{Local="d1811f3e552da6ad",Remote="78bebaf33a1c78ed"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert!(!text.contains("received_failures"), "{text}");
        assert!(!text.contains("disconnected"), "{text}");
    }

    #[test]
    fn a_disconnection_is_counted_and_a_removed_peer_is_no_longer_listed() {
        let m = PeerMetrics::new(1);
        m.connected(2);
        m.disconnected(2);
        m.connected(2);
        m.disconnected(2);
        let text = m.render();
        assert!(text.contains(r#"etcd_network_active_peers{Local="1",Remote="2"} 0"#));
        assert!(text.contains(r#"etcd_network_disconnected_peers_total{Local="1",Remote="2"} 2"#));
        m.removed(2);
        assert!(!m.render().contains("etcd_network_active_peers{"));
    }

    #[test]
    fn a_probe_counts_its_envelope_and_a_batch_its_messages() {
        let probe = RaftBatch {
            messages: Vec::new(),
            from: 0x17db9aa7935b2268,
            ack: 3,
        };
        let envelope = batch_bytes(&probe, 0);
        assert!((10..32).contains(&envelope), "{envelope}");
        let batch = RaftBatch {
            messages: vec![bytes::Bytes::from_static(&[1; 40])],
            ..probe
        };
        assert_eq!(batch_bytes(&batch, 40), 40);
    }

    #[test]
    fn a_peer_keeps_its_counters_across_lookups() {
        let m = PeerMetrics::new(1);
        m.outgoing(2).sent.bytes(10);
        m.outgoing(2).sent.bytes(5);
        m.incoming(3).failed(1);
        m.incoming(3).failed(1);
        let text = m.render();
        assert!(text.contains(r#"etcd_network_peer_sent_bytes_total{To="2"} 15"#));
        assert!(text.contains(r#"etcd_network_peer_received_failures_total{From="3"} 2"#));
    }
}
