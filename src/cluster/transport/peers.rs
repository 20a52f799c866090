//! Raft messages to the other members: per peer, two bounded queues (lanes:
//! control and bulk, `sender.rs`), each drained by a task with a connection
//! of its own, which sends what has queued up as one batch per call to the
//! peer's `ephd.internal.RaftTransport` service (`peer_service.rs`). Messages
//! are encoded with raft-rs' own protobuf types, by those tasks.
//! When a queue is full or the peer is unreachable, messages are dropped:
//! Raft is built for a lossy network and retries (heartbeats, append
//! probes), so the Raft thread never waits for a peer. A snapshot's
//! delivery (or its loss) is reported back to the Raft thread, which must
//! tell raft (`catchup.rs`).
//!
//! Peers are dynamic: a member added by an applied conf change gets a
//! queue, a removed one loses its queue (its task ends), and one whose peer
//! URLs changed gets a new connection. Each task records since when its
//! peer has answered without interruption ([`PeerHealth`]), which the
//! reconfiguration checks read as etcd reads its transport's. With peer
//! TLS every connection is TLS, with this member's peer certificate, made by
//! `peer_dial.rs` (which also checks the allowed name on the certificate of
//! the dialled member and picks up rotated files). A
//! peer that answers that this member was removed raises its removal
//! (`removal.rs`).

use crate::cluster::log::input::{Input, PeerChange};
use crate::cluster::log::queue::Sender;
use crate::cluster::replicated::member_list::MemberInfo;
use crate::cluster::replicated::removal::Removal;
use crate::cluster::transport::peer_dial::PeerDialer;
use crate::cluster::transport::peer_metrics::Outgoing;
use crate::cluster::transport::peer_settings::PeerSettings;
pub(in crate::cluster) use crate::cluster::transport::sender::PeerHealth;
pub use crate::cluster::transport::sender::MAX_BATCH_BYTES;
use crate::cluster::transport::sender::{send_loop, Lane, Target};
use crate::config::ClusterConfig;
use parking_lot::Mutex;
use raft::prelude::{Message, MessageType};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Messages queued for one peer's lane at most.
const QUEUE: usize = 4096;

/// One peer's lanes, and where their tasks send.
struct Queue {
    url: String,
    /// The link's metrics: messages dropped here are send failures.
    out: Arc<Outgoing>,
    control: mpsc::Sender<Message>,
    bulk: mpsc::Sender<Message>,
}

/// The sending side: a queue per peer.
pub(in crate::cluster) struct Peers {
    me: u64,
    /// The runtime the sender tasks run on (the Raft thread is not one of
    /// its threads).
    runtime: tokio::runtime::Handle,
    queues: HashMap<u64, Queue>,
    health: Arc<PeerHealth>,
    /// Where send loops report snapshots' delivery.
    inbox: Sender<Input>,
    /// Framed lanes or gRPC streams, the snapshot chunk size, peer TLS.
    settings: PeerSettings,
    /// Peers whose snapshot message could not even be queued: raft must
    /// hear that it failed (see [`Peers::take_undelivered`]).
    undelivered: Mutex<Vec<u64>>,
    /// Raised when a peer answers that this member was removed.
    removal: Arc<Removal>,
}

impl Peers {
    /// Starts one sender task per other member, on the current tokio
    /// runtime, over peer TLS when `settings` has it.
    pub(in crate::cluster) fn start<'a>(
        members: impl IntoIterator<Item = &'a MemberInfo>,
        me: u64,
        health: Arc<PeerHealth>,
        inbox: Sender<Input>,
        removal: Arc<Removal>,
        settings: PeerSettings,
    ) -> Result<Peers, String> {
        let mut peers = Peers {
            me,
            runtime: tokio::runtime::Handle::current(),
            queues: HashMap::new(),
            health,
            inbox,
            settings,
            undelivered: Mutex::new(Vec::new()),
            removal,
        };
        for m in members {
            if let Some(url) = m.peer_urls.first() {
                peers.change(PeerChange::Upsert {
                    id: m.id,
                    name: display_name(m),
                    url: url.clone(),
                });
            }
        }
        Ok(peers)
    }

    /// Adds, re-points or drops a peer.
    pub(in crate::cluster) fn change(&mut self, change: PeerChange) {
        match change {
            PeerChange::None => {}
            PeerChange::Upsert { id, .. } if id == self.me => {}
            PeerChange::Upsert { id, name, url } => {
                if self.queues.get(&id).is_some_and(|q| q.url == url) {
                    return;
                }
                let (control, control_rx) = mpsc::channel(QUEUE);
                let (bulk, bulk_rx) = mpsc::channel(QUEUE);
                tracing::info!(peer = %name, url = %url, "sending raft messages to a peer");
                let out = self.health.metrics().outgoing(id);
                let to = Target {
                    me: self.me,
                    id,
                    name,
                    url: url.clone(),
                    inbox: self.inbox.clone(),
                    removal: self.removal.clone(),
                    out: out.clone(),
                    settings: self.settings.clone(),
                };
                let health = self.health.clone();
                let lanes = [(Lane::Control, control_rx), (Lane::Bulk, bulk_rx)];
                for (lane, rx) in lanes {
                    self.runtime
                        .spawn(send_loop(to.clone(), lane, rx, health.clone()));
                }
                // Replacing the old queues ends the old tasks.
                self.queues.insert(
                    id,
                    Queue {
                        url,
                        out,
                        control,
                        bulk,
                    },
                );
            }
            PeerChange::Remove(id) => {
                if self.queues.remove(&id).is_some() {
                    self.health.removed(id);
                    tracing::info!(peer = %format_args!("{id:x}"), "no more raft messages to a removed member");
                }
            }
        }
    }

    /// Peers whose snapshot message was dropped before it was queued.
    pub(in crate::cluster) fn take_undelivered(&self) -> Vec<u64> {
        std::mem::take(&mut *self.undelivered.lock())
    }

    /// Queues `msgs` for their peers, each on its lane; drops what does
    /// not fit. Encoding happens in the lanes' tasks, off the Raft thread.
    pub(in crate::cluster) fn send_all(&self, msgs: Vec<Message>) {
        for m in msgs {
            let to = m.get_to();
            let snapshot = m.get_msg_type() == MessageType::MsgSnapshot;
            let queued = self.queues.get(&to).is_some_and(|q| {
                let lane = match Lane::of(&m) {
                    Lane::Control => &q.control,
                    Lane::Bulk => &q.bulk,
                };
                let queued = lane.try_send(m).is_ok();
                if !queued {
                    q.out.sent.failed(1);
                }
                queued
            });
            if snapshot && !queued {
                self.undelivered.lock().push(to);
            }
        }
    }
}

/// A member's name for log lines: its `--name`, or its ID before it has
/// published one.
pub(in crate::cluster) fn display_name(m: &MemberInfo) -> String {
    if m.name.is_empty() {
        format!("{:x}", m.id)
    } else {
        m.name.clone()
    }
}

/// A channel to a peer's `url` for a call made while `config`'s member
/// starts (a probe, a join, a rejoin, a saved file fetched), connected
/// now with `timeout`: over peer TLS with its files read now.
pub(in crate::cluster) async fn connect_at_start(
    config: &ClusterConfig,
    url: &str,
    timeout: Duration,
) -> Result<tonic::transport::Channel, String> {
    PeerDialer::load(config.peer_tls.as_ref(), Duration::ZERO)?
        .connect(url, timeout)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::log::queue;

    fn message(to: u64, kind: MessageType) -> Message {
        let mut m = Message::default();
        m.set_msg_type(kind);
        m.set_from(1);
        m.set_to(to);
        m
    }

    /// A peer whose lanes are full loses what does not fit: each dropped
    /// message is a send failure in its metrics, and a dropped snapshot is
    /// reported so raft hears it failed. The test's runtime runs no task
    /// until the test awaits, so the lanes' tasks take nothing meanwhile.
    #[tokio::test]
    async fn messages_that_do_not_fit_the_queue_are_counted_as_send_failures() {
        let (inbox, _rx) = queue::unbounded();
        let peer = MemberInfo {
            id: 2,
            name: "m2".into(),
            peer_urls: vec!["http://127.0.0.1:1".into()],
            client_urls: Vec::new(),
            is_learner: false,
        };
        let health = Arc::new(PeerHealth::new(1));
        let peers = Peers::start(
            [&peer],
            1,
            health.clone(),
            inbox,
            Arc::default(),
            PeerSettings::default(),
        )
        .unwrap();
        let over = 7;
        let beats = (0..QUEUE + over)
            .map(|_| message(2, MessageType::MsgHeartbeat))
            .collect();
        peers.send_all(beats);
        let failures = r#"etcd_network_peer_sent_failures_total{To="2"}"#;
        let text = health.metrics().render();
        assert!(text.contains(&format!("{failures} {over}")), "{text}");
        assert!(peers.take_undelivered().is_empty());

        // The bulk lane fills the same way; a snapshot that finds it full
        // is undelivered.
        let appends = (0..QUEUE)
            .map(|_| message(2, MessageType::MsgAppend))
            .chain([message(2, MessageType::MsgSnapshot)])
            .collect();
        peers.send_all(appends);
        let text = health.metrics().render();
        assert!(text.contains(&format!("{failures} {}", over + 1)), "{text}");
        assert_eq!(peers.take_undelivered(), vec![2]);
        // A message for a member that is no peer goes nowhere and is no
        // peer's failure.
        peers.send_all(vec![message(9, MessageType::MsgHeartbeat)]);
        assert!(!health.metrics().render().contains(r#"To="9""#));
    }
}
