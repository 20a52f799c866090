use super::*;
use crate::mvcc::StoreConfig;
use std::time::Duration;

const BOUND: Duration = Duration::from_secs(5);

fn recipes() -> (Recipes, watch::Sender<bool>) {
    let (stop, stop_rx) = watch::channel(false);
    let store = Arc::new(Store::new(StoreConfig::default()));
    let me = crate::backend::MemberInfo {
        id: 1,
        name: "default".into(),
        peer_urls: Vec::new(),
        client_urls: Vec::new(),
        is_learner: false,
    };
    let single = crate::backend::SingleMember::new(store.clone(), me, 2);
    (Recipes::new(store, Mode::Single(single), stop_rx), stop)
}

fn grant(r: &Recipes) -> i64 {
    r.store.lease_grant(0, 60).unwrap().id
}

fn exists(r: &Recipes, key: &[u8]) -> bool {
    let req = RangeRequest {
        key: Bytes::copy_from_slice(key),
        ..Default::default()
    };
    !r.store.range(&req).unwrap().kvs.is_empty()
}

#[test]
fn keys_are_the_lease_in_gos_hex() {
    assert_eq!(
        session_key(b"l/", 0x694d_77a1),
        Bytes::from_static(b"l/694d77a1")
    );
    assert_eq!(session_key(b"l/", -26), Bytes::from_static(b"l/-1a"));
    assert_eq!(prefix_end(b"a/"), Bytes::from_static(b"a0"));
    assert_eq!(prefix_end(b"a\xff"), Bytes::from_static(b"b"));
    assert_eq!(prefix_end(b"\xff"), Bytes::from_static(b"\0"));
}

#[tokio::test]
async fn a_waiter_gets_the_lock_once_every_older_key_is_gone() {
    let (r, _stop) = recipes();
    let (a, b) = (grant(&r), grant(&r));
    let first = r.lock(b"m", a).await.unwrap();
    assert_eq!(first.key, session_key(b"m/", a));
    // The same session locks again at once, with the same key.
    assert_eq!(r.lock(b"m", a).await.unwrap().key, first.key);
    let waiter = tokio::spawn({
        let r = r.clone();
        async move { r.lock(b"m", b).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished(), "the lock is held");
    assert!(exists(&r, &session_key(b"m/", b)), "the waiter is queued");
    let released = r.unlock(first.key).await.unwrap();
    let second = tokio::time::timeout(BOUND, waiter).await.unwrap().unwrap();
    let second = second.unwrap();
    assert_eq!(second.key, session_key(b"m/", b));
    assert_eq!(
        second.revision, released,
        "header of the read after the wait"
    );
}

#[tokio::test]
async fn a_waiter_whose_lease_expired_is_told_its_session_is_gone() {
    let (r, _stop) = recipes();
    let (a, b) = (grant(&r), grant(&r));
    r.lock(b"m", a).await.unwrap();
    let waiter = tokio::spawn({
        let r = r.clone();
        async move { r.lock(b"m", b).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    r.store.lease_revoke(b).unwrap();
    r.store.lease_revoke(a).unwrap();
    let got = tokio::time::timeout(BOUND, waiter).await.unwrap().unwrap();
    assert_eq!(got, Err(RecipeError::SessionExpired));
}

#[tokio::test]
async fn an_abandoned_wait_removes_its_key_and_leaves_no_task() {
    let (r, _stop) = recipes();
    let (a, b) = (grant(&r), grant(&r));
    r.lock(b"m", a).await.unwrap();
    let wait = r.lock(b"m", b);
    assert!(tokio::time::timeout(Duration::from_millis(50), wait)
        .await
        .is_err());
    // The dropped request's cleanup runs on a task of its own.
    let key = session_key(b"m/", b);
    tokio::time::timeout(BOUND, async {
        while exists(&r, &key) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the abandoned key is removed");
    assert!(
        exists(&r, &session_key(b"m/", a)),
        "the holder keeps its lock"
    );
}

#[tokio::test]
async fn lease_zero_gets_a_session_lease_and_unknown_leases_fail() {
    let (r, _stop) = recipes();
    let locked = r.lock(b"z", 0).await.unwrap();
    let leases = r.store.lease_leases().ids;
    assert_eq!(leases.len(), 1);
    assert_eq!(locked.key, session_key(b"z/", leases[0]));
    let granted = r.store.lease_time_to_live(leases[0], false).granted_ttl;
    assert_eq!(granted, SESSION_TTL);
    let missing = Err(RecipeError::Store(Error::LeaseNotFound));
    assert_eq!(r.lock(b"z", 12345).await, missing);
    let campaign = r
        .campaign(Bytes::from_static(b"e"), 12345, Bytes::new())
        .await;
    assert_eq!(campaign.map(drop), missing.map(drop));
}

#[tokio::test]
async fn an_election_hands_over_and_reports_etcds_errors() {
    let (r, _stop) = recipes();
    let (a, b) = (grant(&r), grant(&r));
    let name = Bytes::from_static(b"e");
    assert_eq!(r.leader(&name).await, Err(RecipeError::NoLeader));
    let (la, hdr) = r
        .campaign(name.clone(), a, Bytes::from_static(b"1"))
        .await
        .unwrap();
    assert_eq!((la.rev, la.lease), (hdr, a));
    let proclaimed = r.proclaim(Some(la.clone()), Bytes::from_static(b"2")).await;
    let (at, kv) = r.leader(&name).await.unwrap();
    assert_eq!((at, kv.value.as_ref()), (proclaimed.unwrap(), &b"2"[..]));
    let contender = tokio::spawn({
        let r = r.clone();
        let name = name.clone();
        async move { r.campaign(name, b, Bytes::from_static(b"b")).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!contender.is_finished());
    r.resign(Some(la.clone())).await.unwrap();
    let (lb, _) = tokio::time::timeout(BOUND, contender)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(lb.lease, b);
    assert_eq!(r.leader(&name).await.unwrap().1.value.as_ref(), b"b");
    // The old leader: Proclaim fails, Resign succeeds and changes nothing.
    let again = r.proclaim(Some(la.clone()), Bytes::new()).await;
    assert_eq!(again, Err(RecipeError::NotLeader));
    assert!(r.resign(Some(la)).await.is_ok());
    assert!(exists(&r, &lb.key));
    let missing = Err(RecipeError::MissingLeaderKey);
    assert_eq!(r.proclaim(None, Bytes::new()).await, missing);
    assert_eq!(r.resign(None).await, missing);
}

async fn next(rx: &mut mpsc::Receiver<Observed>) -> Observed {
    tokio::time::timeout(BOUND, rx.recv())
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn observe_follows_values_and_successive_leaders() {
    let (r, _stop) = recipes();
    let (a, b) = (grant(&r), grant(&r));
    let name = Bytes::from_static(b"o");
    let (tx, mut rx) = mpsc::channel(8);
    let observer = tokio::spawn({
        let r = r.clone();
        async move { r.observe(b"o", &tx).await }
    });
    let (la, _) = r
        .campaign(name.clone(), a, Bytes::from_static(b"a1"))
        .await
        .unwrap();
    let (h, kv) = next(&mut rx).await;
    assert_eq!((h, kv.value.as_ref()), (la.rev, &b"a1"[..]));
    let p = r
        .proclaim(Some(la.clone()), Bytes::from_static(b"a2"))
        .await
        .unwrap();
    let (h, kv) = next(&mut rx).await;
    assert_eq!((h, kv.value.as_ref()), (p, &b"a2"[..]));
    let contender = tokio::spawn({
        let r = r.clone();
        async move { r.campaign(name, b, Bytes::from_static(b"b1")).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let resigned = r.resign(Some(la)).await.unwrap();
    let (h, kv) = next(&mut rx).await;
    assert_eq!((h, kv.value.as_ref()), (resigned, &b"b1"[..]));
    contender.await.unwrap().unwrap();
    drop(rx);
    // With its receiver gone the observer ends at its next send.
    r.store.lease_revoke(b).unwrap();
    r.lock(b"o", 0).await.unwrap();
    let ended = tokio::time::timeout(BOUND, observer)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ended, Ok(()));
}

#[tokio::test]
async fn waits_end_when_the_server_stops() {
    let (r, stop) = recipes();
    let (a, b) = (grant(&r), grant(&r));
    r.lock(b"s", a).await.unwrap();
    let waiter = tokio::spawn({
        let r = r.clone();
        async move { r.lock(b"s", b).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.send(true).unwrap();
    let got = tokio::time::timeout(BOUND, waiter).await.unwrap().unwrap();
    assert_eq!(got, Err(RecipeError::ShuttingDown));
    assert!(
        !exists(&r, &session_key(b"s/", b)),
        "the waiter's key is removed"
    );
}
