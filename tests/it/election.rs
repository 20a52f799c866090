//! The Election service through the `etcd-client` crate's election client:
//! campaign, proclaim, leader, resign with etcd's errors, Observe as leaders
//! change, abandoned campaigns, and interop with `etcdctl elect`, which
//! runs the same election on the client side.

use std::time::Duration;

use etcd_client::{Client, LeaderKey, ObserveStream, ProclaimOptions, ResignOptions};

use crate::harness::{connect_client, Server};
use crate::lock::{keys_under, lock_key, patient_client, wait_keys, Background};
use crate::support::{assert_err, rev, within, TestServer};

async fn grant(client: &mut Client, ttl: i64) -> i64 {
    within("grant", client.lease_grant(ttl, None))
        .await
        .expect("grant")
        .id()
}

/// The next Observe message's (header revision, value).
async fn observed(stream: &mut ObserveStream) -> (i64, String) {
    let msg = within("observe", stream.message())
        .await
        .expect("observe stream")
        .expect("observe stream ended");
    let kv = msg.kv().expect("leader kv");
    (rev(msg.header()), kv.value_str().unwrap().to_string())
}

async fn leader_value(c: &mut Client, name: &str) -> String {
    let resp = within("leader", c.leader(name)).await.expect("leader");
    resp.kv().unwrap().value_str().unwrap().to_string()
}

#[tokio::test]
async fn campaign_proclaim_leader_and_resign() {
    let server = TestServer::start();
    let mut c = connect_client(&server.endpoint()).await;
    let lease = grant(&mut c, 30).await;
    let no_leader = within("leader", c.leader("job")).await;
    assert_err(no_leader, tonic::Code::Unknown, "election: no leader");
    let won = within("campaign", c.campaign("job", "one", lease))
        .await
        .unwrap();
    let leader = won.leader().expect("leader key").clone();
    assert_eq!(leader.name(), b"job");
    assert_eq!(leader.key(), lock_key("job", lease).as_bytes());
    assert_eq!((leader.rev(), leader.lease()), (rev(won.header()), lease));
    assert_eq!(leader_value(&mut c, "job").await, "one");
    let proclaim = ProclaimOptions::new().with_leader(leader.clone());
    let p = within("proclaim", c.proclaim("two", Some(proclaim)))
        .await
        .unwrap();
    let now = within("leader", c.leader("job")).await.unwrap();
    assert_eq!(rev(now.header()), rev(p.header()));
    assert_eq!(now.kv().unwrap().value(), b"two");
    let resign = ResignOptions::new().with_leader(leader.clone());
    let r = within("resign", c.resign(Some(resign))).await.unwrap();
    assert_eq!(rev(r.header()), rev(p.header()) + 1);
    let gone = within("leader", c.leader("job")).await;
    assert_err(gone, tonic::Code::Unknown, "election: no leader");
    // The former leader: Proclaim is refused; Resign changes nothing.
    let stale = ProclaimOptions::new().with_leader(leader.clone());
    let refused = within("proclaim", c.proclaim("three", Some(stale))).await;
    assert_err(refused, tonic::Code::Unknown, "election: not leader");
    let again = ResignOptions::new().with_leader(leader);
    let r2 = within("resign again", c.resign(Some(again))).await.unwrap();
    assert_eq!(rev(r2.header()), rev(r.header()));
    let missing = within("resign without leader", c.resign(None)).await;
    assert_err(
        missing,
        tonic::Code::Unknown,
        "\"leader\" field must be provided",
    );
    let unknown = within("campaign", c.campaign("job", "x", 0x7777_7777)).await;
    assert_err(
        unknown,
        tonic::Code::Unknown,
        "etcdserver: requested lease not found",
    );
}

#[tokio::test]
async fn observe_follows_values_and_successive_leaders() {
    let server = TestServer::start();
    let endpoint = server.endpoint();
    let mut c = connect_client(&endpoint).await;
    let (a, b) = (grant(&mut c, 60).await, grant(&mut c, 60).await);
    // Observing starts before there is a leader. (etcd sends the stream's
    // headers only with its first message, so the call completes then.)
    let mut watcher = patient_client(&endpoint).await;
    let call = tokio::spawn(async move {
        let stream = watcher.observe("svc").await;
        (watcher, stream)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let won = within("campaign", c.campaign("svc", "a1", a))
        .await
        .unwrap();
    let (_watcher, stream) = within("observe", call).await.unwrap();
    let mut stream = stream.unwrap();
    let leader = won.leader().unwrap().clone();
    assert_eq!(
        observed(&mut stream).await,
        (leader.rev(), "a1".to_string())
    );
    let p = ProclaimOptions::new().with_leader(leader.clone());
    let p = within("proclaim", c.proclaim("a2", Some(p))).await.unwrap();
    assert_eq!(
        observed(&mut stream).await,
        (rev(p.header()), "a2".to_string())
    );
    // A second candidate waits; the first resigns; the second leads.
    let contender = tokio::spawn({
        let endpoint = endpoint.clone();
        async move {
            patient_client(&endpoint)
                .await
                .campaign("svc", "b1", b)
                .await
        }
    });
    wait_keys(&mut c, "svc/", &{
        let mut both = vec![lock_key("svc", a), lock_key("svc", b)];
        both.sort();
        both
    })
    .await;
    let r = ResignOptions::new().with_leader(leader);
    let r = within("resign", c.resign(Some(r))).await.unwrap();
    assert_eq!(
        observed(&mut stream).await,
        (rev(r.header()), "b1".to_string())
    );
    within("contender", contender).await.unwrap().unwrap();
    // Once the second leader's session ends there is no leader until the
    // next campaign, which the stream reports.
    within("revoke", c.lease_revoke(b)).await.unwrap();
    wait_keys(&mut c, "svc/", &[]).await;
    let third = within("campaign", c.campaign("svc", "c1", 0))
        .await
        .unwrap();
    let at = third.leader().unwrap().rev();
    assert_eq!(observed(&mut stream).await, (at, "c1".to_string()));
}

#[tokio::test]
async fn a_campaign_abandoned_while_waiting_leaves_no_key() {
    let server = TestServer::start();
    let endpoint = server.endpoint();
    let mut c = connect_client(&endpoint).await;
    let (leader, quitter) = (grant(&mut c, 60).await, grant(&mut c, 60).await);
    within("campaign", c.campaign("seat", "l", leader))
        .await
        .unwrap();
    let mut w = patient_client(&endpoint).await;
    let gave_up =
        tokio::time::timeout(Duration::from_millis(500), w.campaign("seat", "q", quitter));
    assert!(gave_up.await.is_err(), "there is a leader");
    wait_keys(&mut c, "seat/", &[lock_key("seat", leader)]).await;
    assert_eq!(leader_value(&mut c, "seat").await, "l");
}

#[tokio::test]
async fn etcdctl_elect_and_the_election_service_share_elections() {
    let server = TestServer::start();
    let endpoint = server.endpoint();
    let mut c = connect_client(&endpoint).await;
    // etcdctl campaigns first and leads (client-side recipe).
    let mut ctl = Background::etcdctl(&endpoint, &["elect", "shared", "from-etcdctl"]);
    let key = ctl
        .line(Duration::from_secs(10))
        .expect("etcdctl elect prints its key");
    assert!(key.starts_with("shared/"), "{key}");
    assert_eq!(
        ctl.line(Duration::from_secs(5)).as_deref(),
        Some("from-etcdctl")
    );
    assert_eq!(leader_value(&mut c, "shared").await, "from-etcdctl");
    let mut watcher = patient_client(&endpoint).await;
    let mut stream = within("observe", watcher.observe("shared")).await.unwrap();
    assert_eq!(observed(&mut stream).await.1, "from-etcdctl");
    // The service's candidate waits behind it.
    let lease = grant(&mut c, 60).await;
    let campaign = tokio::spawn({
        let endpoint = endpoint.clone();
        async move {
            patient_client(&endpoint)
                .await
                .campaign("shared", "from-service", lease)
                .await
        }
    });
    wait_keys(&mut c, "shared/", &{
        let mut both = vec![key.clone(), lock_key("shared", lease)];
        both.sort();
        both
    })
    .await;
    assert!(!campaign.is_finished(), "etcdctl leads");
    // etcdctl resigns on Ctrl-C; the service's candidate leads, and both
    // the service's Observe and `etcdctl elect -l` see it.
    ctl.interrupt();
    let won = within("campaign", campaign).await.unwrap().unwrap();
    let leader: LeaderKey = won.leader().unwrap().clone();
    assert_eq!(observed(&mut stream).await.1, "from-service");
    let listen = Background::etcdctl(&endpoint, &["elect", "-l", "shared"]);
    let lines = [
        listen.line(Duration::from_secs(10)),
        listen.line(Duration::from_secs(5)),
    ];
    let want = [
        Some(lock_key("shared", lease)),
        Some("from-service".to_string()),
    ];
    assert_eq!(lines, want);
    let r = ResignOptions::new().with_leader(leader);
    within("resign", c.resign(Some(r))).await.unwrap();
    assert!(keys_under(&mut c, "shared/").await.is_empty());
}
