//! The initial-revision gate on a real one-voter Raft node, in process: a
//! write made before the initial revision is applied waits for it and
//! lands above it.

use crate::cluster::log::initial_gate::{self, InitialGate, WritesWaitFor};
use crate::cluster::member::applied_membership::Boot;
use crate::cluster::node::raft_node::Node;
use crate::cluster::replicated::member_list::{MemberInfo, Membership};
use crate::config::{member_id, ClusterConfig, Member};
use crate::error::Error;
use crate::mvcc::{Applied, Entry, PutRequest, Store, StoreConfig};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(10);

/// One member, alone in its cluster: it elects itself after an election
/// timeout.
fn single(hold_writes: bool) -> (Arc<Node>, Arc<Store>) {
    solo(
        hold_writes,
        Duration::from_millis(10),
        Duration::from_millis(50),
    )
}

/// [`single`] with the given heartbeat interval and election timeout.
pub(crate) fn solo(
    hold_writes: bool,
    heartbeat: Duration,
    election: Duration,
) -> (Arc<Node>, Arc<Store>) {
    let (config, boot) = alone("gate-test", heartbeat, election);
    let store = Arc::new(Store::new(StoreConfig::default()));
    let wait = WritesWaitFor {
        initial_revision: hold_writes,
        replicated_limits: false,
    };
    let node = Node::start(
        &config,
        store.clone(),
        boot,
        wait,
        None,
        crate::cluster::PeerSettings::default(),
    )
    .unwrap();
    (node, store)
}

/// The settings and boot of a member alone in its cluster (initial
/// cluster token `token`).
pub(crate) fn alone(token: &str, heartbeat: Duration, election: Duration) -> (ClusterConfig, Boot) {
    let url = "http://127.0.0.1:1".to_string();
    let id = member_id(std::slice::from_ref(&url), token);
    let config = ClusterConfig {
        name: "solo".into(),
        members: vec![Member {
            name: "solo".into(),
            peer_urls: vec![url.clone()],
            id,
        }],
        token: token.into(),
        listen_peer_urls: vec![url.clone()],
        advertise_peer_urls: vec![url.clone()],
        heartbeat,
        election,
        existing: false,
        snapshot_count: 1000,
        catchup_entries: 100,
        peer_tls: None,
        force_new_cluster: false,
    };
    let initial = Membership::of([MemberInfo {
        id,
        name: "solo".into(),
        peer_urls: vec![url],
        client_urls: Vec::new(),
        is_learner: false,
    }]);
    let boot = Boot {
        id,
        cluster_id: config.cluster_id(),
        initial: initial.clone(),
        current: initial,
        name: "solo".into(),
        client_urls: Vec::new(),
        promote: false,
        resume: None,
        log: None,
    };
    (config, boot)
}

async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < deadline, "{what} within {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A put of `key` (value `v`).
pub(in crate::cluster) fn put(key: &'static str) -> Entry {
    Entry::Put(PutRequest {
        key: Bytes::from_static(key.as_bytes()),
        value: Bytes::from_static(b"v"),
        ..Default::default()
    })
}

/// The revision a put was applied at.
pub(in crate::cluster) fn revision(applied: Applied) -> i64 {
    match applied {
        Applied::Put(p) => p.revision,
        other => panic!("a put applied as {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_before_the_initial_revision_waits_and_lands_above_it() {
    let (node, store) = single(true);
    until("a leader", || node.status().is_leader()).await;
    // The write reaches the gate while the node leads and could commit it.
    let early = tokio::spawn({
        let node = node.clone();
        async move { node.propose(put("early")).await }
    });
    until("the write waiting at the gate", || node.gate.waiting() == 1).await;
    assert!(!early.is_finished());
    let initial = 1_000_000;
    // The jump, then `compact_rev_key` written at the next revision.
    let key_rev = match node.propose(Entry::Initialize { revision: initial }).await {
        Ok(Applied::Initialize { revision }) => revision,
        other => panic!("initialize: {other:?}"),
    };
    assert_eq!(key_rev, initial + 1);
    assert!(node.gate.is_open());
    let rev = revision(early.await.unwrap().unwrap());
    assert!(
        rev > key_rev,
        "the early write is at {rev}, above {key_rev}"
    );
    assert_eq!(store.compacted_revision(), initial);
    assert!(initial_gate::initialized(&store));
    // Later writes pass at once.
    assert!(revision(node.propose(put("late")).await.unwrap()) > rev);
    tokio::task::spawn_blocking(move || node.stop())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_revision_continuity_writes_pass_at_once() {
    let (node, store) = single(false);
    until("a leader", || node.status().is_leader()).await;
    assert_eq!(revision(node.propose(put("k")).await.unwrap()), 2);
    assert!(!initial_gate::initialized(&store));
    tokio::task::spawn_blocking(move || node.stop())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_closed_gate_times_out_as_a_request_does() {
    let gate = InitialGate::new(WritesWaitFor {
        initial_revision: true,
        replicated_limits: false,
    });
    let soon = Instant::now() + Duration::from_millis(20);
    let k = put("k");
    assert!(matches!(gate.pass(&k, soon).await, Err(Error::Timeout)));
    let initialize = Entry::Initialize { revision: 5 };
    assert!(gate.pass(&initialize, soon).await.is_ok(), "never held");
    assert_eq!(gate.waiting(), 0, "a timed-out write leaves no waiter");
    gate.applied(&Ok(Applied::Initialize { revision: 5 }));
    gate.applied(&Ok(Applied::Initialize { revision: 5 }));
    assert!(gate.pass(&k, Instant::now()).await.is_ok());
    assert!(initial_gate::holds(&put("k")));
    assert!(!initial_gate::holds(&Entry::Initialize { revision: 5 }));
}

/// Members whose flags differ must apply every write under the same
/// limits: a fresh member proposes nothing before it has applied the
/// leader's replicated limits (a put on an unknown lease committed before
/// them would be adopted by one member and refused by another).
#[tokio::test]
async fn writes_wait_for_the_replicated_limits_too() {
    let gate = InitialGate::new(WritesWaitFor {
        initial_revision: true,
        replicated_limits: true,
    });
    let soon = || Instant::now() + Duration::from_millis(20);
    let k = put("k");
    gate.applied(&Ok(Applied::Initialize { revision: 5 }));
    assert!(
        matches!(gate.pass(&k, soon()).await, Err(Error::Timeout)),
        "the initial revision alone does not open it"
    );
    let limits = Entry::Limits(Store::new(StoreConfig::default()).own_limits());
    assert!(gate.pass(&limits, soon()).await.is_ok(), "never held");
    gate.applied(&Ok(Applied::Limits { revision: 5 }));
    assert!(gate.pass(&k, soon()).await.is_ok());

    // Installing a snapshot whose store had both opens it as well.
    let gate = InitialGate::new(WritesWaitFor {
        initial_revision: false,
        replicated_limits: true,
    });
    let store = Store::new(StoreConfig::default());
    gate.installed(&store);
    assert!(
        !gate.is_open(),
        "the flags' own limits are not replicated ones"
    );
    store
        .apply(Entry::Limits(store.own_limits()))
        .expect("apply limits");
    gate.installed(&store);
    assert!(gate.is_open());
}
