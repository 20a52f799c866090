//! Lock and Election side by side with stock etcd: one scripted sequence of
//! raw requests (success paths, every error case, an Observe stream) runs
//! against etcd and against ephd in exact-etcd mode, and every answer (the
//! whole response, or the gRPC code and message) must be the same once the
//! server-chosen lease IDs are named by order of appearance and the
//! member's identity in headers is checked for presence only.
//!
//! A waiter whose lease expired before the lock came free is asserted on
//! its own: etcd 3.6, like ephd, answers `mutex: session is expired`.

use std::collections::HashMap;
use std::time::Duration;

use ephd::proto::etcdserverpb::{
    lease_client::LeaseClient, LeaseGrantRequest, LeaseLeasesRequest, LeaseRevokeRequest,
    ResponseHeader,
};
use ephd::proto::v3electionpb::{
    election_client::ElectionClient, CampaignRequest, LeaderKey, LeaderRequest, ProclaimRequest,
    ResignRequest,
};
use ephd::proto::v3lockpb::{lock_client::LockClient, LockRequest, UnlockRequest};
use tonic::transport::Channel;

use crate::harness::{Server, StockEtcd};
use crate::support::{ephd, within};

/// Names lease IDs in the order they appear, so that two servers' answers
/// compare although each chose its own IDs.
#[derive(Default)]
struct Leases {
    names: HashMap<i64, String>,
}

impl Leases {
    fn name(&mut self, id: i64) -> String {
        let n = self.names.len();
        self.names
            .entry(id)
            .or_insert_with(|| format!("L{n}"))
            .clone()
    }

    /// `text` with every known lease ID (decimal, and hex as in keys)
    /// replaced by its name.
    fn rewrite(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (id, name) in &self.names {
            out = out.replace(&format!("{id:x}"), name);
            out = out.replace(&id.to_string(), name);
        }
        out
    }
}

/// The member's identity must be there; its values differ by server.
fn header(h: &mut Option<ResponseHeader>) {
    let h = h.as_mut().expect("response has a header");
    assert!(
        h.cluster_id != 0 && h.member_id != 0 && h.raft_term != 0,
        "{h:?}"
    );
    (h.cluster_id, h.member_id, h.raft_term) = (1, 1, 1);
}

struct Target {
    lock: LockClient<Channel>,
    election: ElectionClient<Channel>,
    lease: LeaseClient<Channel>,
    leases: Leases,
}

/// One answer, as text.
fn answer<T: std::fmt::Debug>(
    r: Result<tonic::Response<T>, tonic::Status>,
    fix: impl FnOnce(&mut T),
) -> String {
    match r {
        Ok(resp) => {
            let mut v = resp.into_inner();
            fix(&mut v);
            format!("{v:?}")
        }
        Err(s) => format!("ERR {:?} {}", s.code(), s.message()),
    }
}

impl Target {
    async fn new(server: &impl Server) -> Target {
        let channel = server.channel().await;
        Target {
            lock: LockClient::new(channel.clone()),
            election: ElectionClient::new(channel.clone()),
            lease: LeaseClient::new(channel),
            leases: Leases::default(),
        }
    }

    async fn grant(&mut self, ttl: i64) -> i64 {
        let req = LeaseGrantRequest { ttl, id: 0 };
        let id = within("grant", self.lease.lease_grant(req))
            .await
            .unwrap()
            .into_inner()
            .id;
        self.leases.name(id);
        id
    }

    /// Names the leases the last request granted (lease 0 sessions).
    async fn learn_leases(&mut self) {
        let all = within("leases", self.lease.lease_leases(LeaseLeasesRequest {})).await;
        let mut ids: Vec<i64> = all
            .unwrap()
            .into_inner()
            .leases
            .iter()
            .map(|l| l.id)
            .collect();
        ids.sort();
        for id in ids {
            self.leases.name(id);
        }
    }

    /// Runs the script; every answer as normalized text.
    async fn run(&mut self) -> Vec<String> {
        let l1 = self.grant(60).await;
        let l2 = self.grant(60).await;
        let missing = 0x7fff_0000_i64;
        let mut out = Vec::new();
        macro_rules! step {
            ($what:expr, $call:expr, $fix:expr) => {{
                let got = answer(within($what, $call).await, $fix);
                self.learn_leases().await;
                out.push(format!("{}: {}", $what, self.leases.rewrite(&got)));
            }};
        }
        let lock = |name: &str, lease| LockRequest {
            name: name.to_string().into(),
            lease,
        };
        let fix_lock = |r: &mut ephd::proto::v3lockpb::LockResponse| header(&mut r.header);
        let fix_unlock = |r: &mut ephd::proto::v3lockpb::UnlockResponse| header(&mut r.header);
        step!(
            "lock unknown lease",
            self.lock.lock(lock("d", missing)),
            fix_lock
        );
        step!("lock", self.lock.lock(lock("d", l1)), fix_lock);
        step!("lock again", self.lock.lock(lock("d", l1)), fix_lock);
        step!("lock empty name", self.lock.lock(lock("", l2)), fix_lock);
        step!("lock lease 0", self.lock.lock(lock("z", 0)), fix_lock);
        step!(
            "lock negative lease",
            self.lock.lock(lock("d", -5)),
            fix_lock
        );
        let unlock = |key: &str| UnlockRequest {
            key: key.to_string().into(),
        };
        step!(
            "unlock missing",
            self.lock.unlock(unlock("nokey")),
            fix_unlock
        );
        step!("unlock empty", self.lock.unlock(unlock("")), fix_unlock);
        step!(
            "unlock",
            self.lock.unlock(unlock(&format!("d/{l1:x}"))),
            fix_unlock
        );

        let fix_leader = |r: &mut ephd::proto::v3electionpb::LeaderResponse| header(&mut r.header);
        let fix_camp = |r: &mut ephd::proto::v3electionpb::CampaignResponse| header(&mut r.header);
        let fix_procl = |r: &mut ephd::proto::v3electionpb::ProclaimResponse| header(&mut r.header);
        let fix_resign = |r: &mut ephd::proto::v3electionpb::ResignResponse| header(&mut r.header);
        let leader = |name: &str| LeaderRequest {
            name: name.to_string().into(),
        };
        let campaign = |name: &str, lease, value: &str| CampaignRequest {
            name: name.to_string().into(),
            lease,
            value: value.to_string().into(),
        };
        step!("leader none", self.election.leader(leader("e")), fix_leader);
        step!(
            "leader of lock keys",
            self.election.leader(leader("")),
            fix_leader
        );
        step!(
            "campaign unknown lease",
            self.election.campaign(campaign("e", missing, "x")),
            fix_camp
        );
        step!(
            "campaign",
            self.election.campaign(campaign("e", l1, "v1")),
            fix_camp
        );
        step!(
            "campaign again",
            self.election.campaign(campaign("e", l1, "v1")),
            fix_camp
        );
        step!(
            "campaign new value",
            self.election.campaign(campaign("e", l1, "v2")),
            fix_camp
        );
        step!("leader", self.election.leader(leader("e")), fix_leader);
        let key = format!("e/{l1:x}");
        let now = self
            .election
            .leader(leader("e"))
            .await
            .unwrap()
            .into_inner();
        let rev = now.kv.unwrap().create_revision;
        let lk = |rev, lease| LeaderKey {
            name: "e".into(),
            key: key.clone().into(),
            rev,
            lease,
        };
        let proclaim = |leader: Option<LeaderKey>, value: &str| ProclaimRequest {
            leader,
            value: value.to_string().into(),
        };
        step!(
            "proclaim no leader",
            self.election.proclaim(proclaim(None, "p")),
            fix_procl
        );
        step!(
            "proclaim",
            self.election.proclaim(proclaim(Some(lk(rev, l1)), "v3")),
            fix_procl
        );
        step!(
            "proclaim wrong rev",
            self.election
                .proclaim(proclaim(Some(lk(rev + 100, l1)), "p")),
            fix_procl
        );
        step!(
            "proclaim unknown lease",
            self.election
                .proclaim(proclaim(Some(lk(rev, missing)), "p")),
            fix_procl
        );
        step!(
            "proclaim lease 0",
            self.election.proclaim(proclaim(Some(lk(rev, 0)), "v4")),
            fix_procl
        );
        step!(
            "leader after proclaims",
            self.election.leader(leader("e")),
            fix_leader
        );
        let empty = LeaderKey {
            lease: l1,
            ..Default::default()
        };
        step!(
            "proclaim empty key",
            self.election.proclaim(proclaim(Some(empty), "p")),
            fix_procl
        );
        let resign = |leader: Option<LeaderKey>| ResignRequest { leader };
        step!(
            "resign no leader",
            self.election.resign(resign(None)),
            fix_resign
        );
        step!(
            "resign wrong rev",
            self.election.resign(resign(Some(lk(rev + 100, l1)))),
            fix_resign
        );
        step!(
            "resign",
            self.election.resign(resign(Some(lk(rev, l1)))),
            fix_resign
        );
        step!(
            "leader after resign",
            self.election.leader(leader("e")),
            fix_leader
        );
        step!(
            "campaign lease 0",
            self.election.campaign(campaign("e0", 0, "zero")),
            fix_camp
        );
        out.extend(self.observe(l1, l2).await);
        out
    }

    /// An Observe stream across a proclaim, a resign, a time without leader
    /// and the next campaign.
    async fn observe(&mut self, l1: i64, l2: i64) -> Vec<String> {
        // etcd sends an Observe stream's headers with its first message
        // (ephd at once), so the call completes only once there is a leader.
        let mut observer = self.election.clone();
        let call =
            tokio::spawn(async move { observer.observe(LeaderRequest { name: "o".into() }).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let camp = |lease, value: &str| CampaignRequest {
            name: "o".into(),
            lease,
            value: value.to_string().into(),
        };
        // Each change is read before the next is made, so when the
        // observer looks (before or after it) does not change the answer.
        let mut seen = Vec::new();
        macro_rules! next {
            ($stream:expr) => {{
                let msg = within("observed", $stream.message()).await.unwrap();
                let mut msg = msg.expect("an Observe message");
                header(&mut msg.header);
                seen.push(format!(
                    "observe: {}",
                    self.leases.rewrite(&format!("{msg:?}"))
                ));
            }};
        }
        let won = self
            .election
            .campaign(camp(l2, "a"))
            .await
            .unwrap()
            .into_inner();
        let mut stream = within("observe", call).await.unwrap().unwrap().into_inner();
        next!(stream);
        let leader = won.leader.unwrap();
        let proclaim = ProclaimRequest {
            leader: Some(leader.clone()),
            value: "b".into(),
        };
        self.election.proclaim(proclaim).await.unwrap();
        next!(stream);
        let resign = ResignRequest {
            leader: Some(leader),
        };
        self.election.resign(resign).await.unwrap();
        self.election.campaign(camp(l1, "c")).await.unwrap();
        next!(stream);
        seen
    }
}

#[tokio::test]
async fn lock_and_election_answer_as_stock_etcd() {
    let etcd = StockEtcd::start();
    let ours = ephd(&[]);
    let want = Target::new(&etcd).await.run().await;
    let got = Target::new(&ours).await.run().await;
    // The script reaches every answer it is meant to compare.
    let all = want.join("\n");
    for landmark in [
        "lock unknown lease: ERR Unknown etcdserver: requested lease not found",
        "unlock empty: ERR Unknown etcdserver: key is not provided",
        "leader none: ERR Unknown election: no leader",
        "proclaim wrong rev: ERR Unknown election: not leader",
        "proclaim no leader: ERR Unknown \"leader\" field must be provided",
        "lock lease 0: LockResponse",
        "key: b\"o/L0\"",
    ] {
        assert!(all.contains(landmark), "{landmark:?} missing from:\n{all}");
    }
    assert_eq!(want.len(), got.len());
    let diffs: Vec<String> = want
        .iter()
        .zip(&got)
        .filter(|(w, g)| w != g)
        .map(|(w, g)| format!("etcd: {w}\nephd: {g}"))
        .collect();
    assert!(diffs.is_empty(), "differences:\n{}", diffs.join("\n\n"));
}

/// A waiter's lease expires while the lock is held; then the holder's is
/// revoked. Returns the waiter's answer.
async fn expired_waiter(server: &impl Server) -> Result<Vec<u8>, (tonic::Code, String)> {
    let mut t = Target::new(server).await;
    let holder = t.grant(60).await;
    let waiter = t.grant(2).await;
    t.lock
        .lock(LockRequest {
            name: "x".into(),
            lease: holder,
        })
        .await
        .unwrap();
    let mut lock = t.lock.clone();
    let wait = tokio::spawn(async move {
        lock.lock(LockRequest {
            name: "x".into(),
            lease: waiter,
        })
        .await
    });
    // Well past the waiter's TTL (and etcd's expiry check interval).
    tokio::time::sleep(Duration::from_secs(4)).await;
    t.lease
        .lease_revoke(LeaseRevokeRequest { id: holder })
        .await
        .unwrap();
    match within("waiter", wait).await.unwrap() {
        Ok(r) => Ok(r.into_inner().key.to_vec()),
        Err(s) => Err((s.code(), s.message().to_string())),
    }
}

#[tokio::test]
async fn a_waiter_whose_session_expired_is_refused_as_stock_etcd_does() {
    let etcd = StockEtcd::start();
    let ours = ephd(&[]);
    let (theirs, mine) = tokio::join!(expired_waiter(&etcd), expired_waiter(&ours));
    // etcd 3.6 refuses to hand over a lock whose waiter's key is gone (3.4
    // handed it over).
    let want = Err((
        tonic::Code::Unknown,
        "mutex: session is expired".to_string(),
    ));
    assert_eq!(theirs, want, "stock etcd");
    assert_eq!(mine, want, "ephd");
}
