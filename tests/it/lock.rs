//! The Lock service through the `etcd-client` crate's lock client: the key
//! layout clients rely on, mutual exclusion between contending clients,
//! holders released by lease revoke and expiry, cancelled waits that leave
//! nothing behind, and interop with `etcdctl lock`, which implements the
//! same lock on the client side.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions, LockOptions};
use tokio::task::JoinSet;

use crate::harness::{connect_client, Server};
use crate::support::{rev, within, within_for, TestServer};

/// Bound for a whole contended phase (many lock round trips).
const PHASE: Duration = Duration::from_secs(60);

/// A client without a per-request timeout, for Lock calls that wait.
pub async fn patient_client(endpoint: &str) -> Client {
    within("connect", Client::connect([endpoint], None))
        .await
        .expect("connect")
}

/// The lock key of a session: `<name>/<lease in lowercase hex>`.
pub fn lock_key(name: &str, lease: i64) -> String {
    format!("{name}/{lease:x}")
}

/// Keys under `prefix`, in key order.
pub async fn keys_under(client: &mut Client, prefix: &str) -> Vec<String> {
    let resp = within(
        "get prefix",
        client.get(prefix, Some(GetOptions::new().with_prefix())),
    )
    .await
    .expect("get");
    resp.kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// Waits (bounded) until the keys under `prefix` are exactly `want`.
pub async fn wait_keys(client: &mut Client, prefix: &str, want: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = keys_under(client, prefix).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "keys under {prefix}: {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn grant(client: &mut Client, ttl: i64) -> i64 {
    within("grant", client.lease_grant(ttl, None))
        .await
        .expect("grant")
        .id()
}

#[tokio::test]
async fn lock_and_unlock_use_etcds_key_layout() {
    let server = TestServer::start();
    let mut c = connect_client(&server.endpoint()).await;
    let lease = grant(&mut c, 30).await;
    let opts = LockOptions::new().with_lease(lease);
    let locked = within("lock", c.lock("door", Some(opts.clone())))
        .await
        .unwrap();
    assert_eq!(locked.key(), lock_key("door", lease).as_bytes());
    // The key is an ordinary key: empty value, attached to the lease, and
    // created by the revision in the header.
    let got = c.get(locked.key(), None).await.unwrap();
    let kv = &got.kvs()[0];
    assert_eq!((kv.value(), kv.lease()), (&b""[..], lease));
    assert_eq!(kv.create_revision(), rev(locked.header()));
    // Locking again with the same lease is the same acquisition.
    let again = within("relock", c.lock("door", Some(opts))).await.unwrap();
    assert_eq!(again.key(), locked.key());
    let unlocked = within("unlock", c.unlock(locked.key())).await.unwrap();
    assert_eq!(rev(unlocked.header()), kv.create_revision() + 1);
    assert!(keys_under(&mut c, "door/").await.is_empty());
    // Unlocking a key that is not there answers with the current revision.
    let none = within("unlock missing", c.unlock("door/none"))
        .await
        .unwrap();
    assert_eq!(rev(none.header()), rev(unlocked.header()));
}

#[tokio::test]
async fn contending_clients_exclude_each_other() {
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 5;
    let server = TestServer::start();
    let endpoint = server.endpoint();
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..CLIENTS {
        let endpoint = endpoint.clone();
        let inside = inside.clone();
        tasks.spawn(async move {
            let mut c = patient_client(&endpoint).await;
            for _ in 0..ROUNDS {
                let lease = grant(&mut c, 30).await;
                let opts = LockOptions::new().with_lease(lease);
                let locked = c.lock("counter", Some(opts)).await.expect("lock");
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                // A read-modify-write that loses updates without the lock.
                // (The counter lives outside the lock's prefix.)
                let got = c.get("counter-value", None).await.unwrap();
                let n: usize = got
                    .kvs()
                    .first()
                    .map_or(0, |kv| kv.value_str().unwrap().parse().unwrap());
                tokio::time::sleep(Duration::from_millis(5)).await;
                c.put("counter-value", (n + 1).to_string(), None)
                    .await
                    .unwrap();
                inside.fetch_sub(1, Ordering::SeqCst);
                // Half the rounds unlock, the others revoke the session.
                if n.is_multiple_of(2) {
                    c.unlock(locked.key()).await.expect("unlock");
                } else {
                    c.lease_revoke(lease).await.expect("revoke");
                }
            }
        });
    }
    within_for(PHASE, "contended locking", async {
        while let Some(r) = tasks.join_next().await {
            r.expect("client task");
        }
    })
    .await;
    let mut c = connect_client(&endpoint).await;
    let got = c.get("counter-value", None).await.unwrap();
    assert_eq!(
        got.kvs()[0].value_str().unwrap(),
        (CLIENTS * ROUNDS).to_string()
    );
    assert!(keys_under(&mut c, "counter/").await.is_empty());
}

#[tokio::test]
async fn a_holder_is_released_when_its_lease_is_revoked_or_expires() {
    let server = TestServer::start();
    let endpoint = server.endpoint();
    let mut c = connect_client(&endpoint).await;
    // The first holder's lease is never kept alive: it expires.
    let short = grant(&mut c, 2).await;
    let long = grant(&mut c, 60).await;
    let third = grant(&mut c, 60).await;
    let opts = |l: i64| Some(LockOptions::new().with_lease(l));
    within("lock", c.lock("gate", opts(short))).await.unwrap();
    let started = Instant::now();
    let second = tokio::spawn({
        let endpoint = endpoint.clone();
        async move {
            patient_client(&endpoint)
                .await
                .lock("gate", opts(long))
                .await
        }
    });
    let second = within_for(Duration::from_secs(15), "lock after expiry", second)
        .await
        .unwrap()
        .expect("second lock");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "waited for the expiry"
    );
    assert_eq!(second.key(), lock_key("gate", long).as_bytes());
    let waiter = tokio::spawn({
        let endpoint = endpoint.clone();
        async move {
            patient_client(&endpoint)
                .await
                .lock("gate", opts(third))
                .await
        }
    });
    wait_keys(
        &mut c,
        "gate/",
        &[lock_key("gate", long), lock_key("gate", third)],
    )
    .await;
    assert!(!waiter.is_finished(), "the lock is held");
    within("revoke", c.lease_revoke(long)).await.unwrap();
    let third_locked = within("lock after revoke", waiter).await.unwrap().unwrap();
    assert_eq!(third_locked.key(), lock_key("gate", third).as_bytes());
}

#[tokio::test]
async fn a_lock_abandoned_while_waiting_leaves_no_key() {
    let server = TestServer::start();
    let endpoint = server.endpoint();
    let mut c = connect_client(&endpoint).await;
    let (holder, quitter) = (grant(&mut c, 60).await, grant(&mut c, 60).await);
    let opts = |l: i64| Some(LockOptions::new().with_lease(l));
    within("lock", c.lock("desk", opts(holder))).await.unwrap();
    let mut w = patient_client(&endpoint).await;
    // The client gives up (the RPC is cancelled) while the lock is held.
    let gave_up = tokio::time::timeout(Duration::from_millis(500), w.lock("desk", opts(quitter)));
    assert!(gave_up.await.is_err(), "the lock is held");
    wait_keys(&mut c, "desk/", &[lock_key("desk", holder)]).await;
}

/// A background `etcdctl` (killed when dropped) whose output lines arrive
/// on a channel.
pub struct Background {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Background {
    /// Starts `etcdctl --endpoints <endpoint> <args>`.
    pub fn etcdctl(endpoint: &str, args: &[&str]) -> Background {
        use std::io::BufRead;
        let host = endpoint.trim_start_matches("http://");
        let mut child = std::process::Command::new(crate::cli::etcdctl_path())
            .arg(format!("--endpoints={host}"))
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn etcdctl");
        let (tx, lines) = std::sync::mpsc::channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx2.send(format!("stderr: {l}"));
            }
        });
        Background { child, lines }
    }

    /// The next output line, waiting at most `limit`.
    pub fn line(&self, limit: Duration) -> Option<String> {
        self.lines.recv_timeout(limit).ok()
    }

    /// Interrupts it as a user's Ctrl-C would (it then cleans up its key)
    /// and waits (bounded) for it to exit.
    pub fn interrupt(&mut self) {
        let pid = self.child.id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("etcdctl did not exit after SIGINT");
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn etcdctl_lock_and_the_lock_service_exclude_each_other() {
    let server = TestServer::start();
    let endpoint = server.endpoint();
    let mut c = connect_client(&endpoint).await;
    // etcdctl holds the lock (client-side recipe): the service waits.
    let mut held = Background::etcdctl(&endpoint, &["lock", "shared"]);
    let key = held
        .line(Duration::from_secs(10))
        .expect("etcdctl lock prints its key");
    assert!(key.starts_with("shared/"), "{key}");
    let lease = grant(&mut c, 60).await;
    let waiter = tokio::spawn({
        let endpoint = endpoint.clone();
        let opts = LockOptions::new().with_lease(lease);
        async move {
            patient_client(&endpoint)
                .await
                .lock("shared", Some(opts))
                .await
        }
    });
    wait_keys(&mut c, "shared/", &{
        let mut both = vec![key.clone(), lock_key("shared", lease)];
        both.sort();
        both
    })
    .await;
    assert!(!waiter.is_finished(), "etcdctl holds the lock");
    held.interrupt();
    let locked = within("lock after etcdctl", waiter).await.unwrap().unwrap();
    assert_eq!(locked.key(), lock_key("shared", lease).as_bytes());
    // The service holds it: etcdctl waits, and runs its command only after
    // Unlock.
    let mut queued = Background::etcdctl(&endpoint, &["lock", "shared", "echo", "acquired"]);
    assert_eq!(
        queued.line(Duration::from_millis(1500)),
        None,
        "etcdctl must wait"
    );
    assert!(!queued.exited());
    within("unlock", c.unlock(locked.key())).await.unwrap();
    let line = queued.line(Duration::from_secs(10));
    assert_eq!(line.as_deref(), Some("acquired"));
    wait_keys(&mut c, "shared/", &[]).await;
}

#[tokio::test]
async fn sessions_need_a_granted_lease_even_where_puts_adopt_unknown_ones() {
    // The Kubernetes-safe default adopts unknown lease IDs on puts; a lock
    // or campaign session on a lease that is gone is still refused.
    let server = crate::harness::Ephd::start(&[]);
    let mut c = connect_client(&server.endpoint()).await;
    let unknown = 0x1234_5678;
    let opts = LockOptions::new().with_lease(unknown);
    let refused = within("lock", c.lock("adopt", Some(opts))).await;
    let not_found = "etcdserver: requested lease not found";
    crate::support::assert_err(refused, tonic::Code::Unknown, not_found);
    let campaign = within("campaign", c.campaign("adopt", "v", unknown)).await;
    crate::support::assert_err(campaign, tonic::Code::Unknown, not_found);
    assert!(keys_under(&mut c, "adopt/").await.is_empty());
    // A plain put still adopts it (unchanged behaviour).
    let opts = etcd_client::PutOptions::new().with_lease(unknown);
    within("put", c.put("adopted", "v", Some(opts)))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_elections_span_a_cluster() {
    let timing = ["--heartbeat-interval=50", "--election-timeout=500"];
    let cluster = crate::harness::EphdCluster::start(3, &timing);
    let endpoint = |i: usize| cluster.member(i).unwrap().endpoint();
    let mut clients = Vec::new();
    for i in 0..3 {
        clients.push(patient_client(&endpoint(i)).await);
    }
    // Grants succeed once a leader is elected.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut leases = Vec::new();
    while leases.len() < 2 {
        match within("grant", clients[0].lease_grant(60, None)).await {
            Ok(g) => leases.push(g.id()),
            Err(e) => {
                assert!(Instant::now() < deadline, "no leader: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let opts = |l: i64| Some(LockOptions::new().with_lease(l));
    // Held through member 0; a waiter through member 1; released through
    // member 2.
    let held = within("lock", clients[0].lock("span", opts(leases[0])))
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let mut c = clients[1].clone();
        let lease = leases[1];
        async move { c.lock("span", opts(lease)).await }
    });
    let mut both = vec![lock_key("span", leases[0]), lock_key("span", leases[1])];
    both.sort();
    wait_keys(&mut clients[2], "span/", &both).await;
    assert!(!waiter.is_finished(), "the lock is held");
    within("unlock", clients[2].unlock(held.key()))
        .await
        .unwrap();
    let got = within("lock after unlock", waiter).await.unwrap().unwrap();
    assert_eq!(got.key(), lock_key("span", leases[1]).as_bytes());
    // An election campaigned through one member is seen from another.
    within("campaign", clients[1].campaign("vote", "m1", leases[1]))
        .await
        .unwrap();
    let leader = within("leader", clients[2].leader("vote")).await.unwrap();
    assert_eq!(leader.kv().unwrap().value(), b"m1");
}
