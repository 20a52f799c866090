//! The Cluster API's errors side by side: the same calls against a
//! three-member ephd cluster and a three-member stock etcd 3.4 on loopback
//! answer the same gRPC codes and texts; a single ephd answers as a single
//! stock etcd.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{
    cluster_client::ClusterClient, MemberAddRequest, MemberPromoteRequest, MemberRemoveRequest,
    MemberUpdateRequest, StatusRequest,
};
use tonic::transport::Channel;

use super::{add, members, remove};
use crate::cluster::{agreed_leader, TIMING};
use crate::harness::{free_port, Ephd, EphdCluster, Server, StockEtcd};

/// Three stock etcd processes forming one cluster, killed on drop.
struct StockCluster {
    clients: Vec<u16>,
    peers: Vec<u16>,
    children: Vec<Child>,
    _dir: tempfile::TempDir,
}

impl Drop for StockCluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A client endpoint of a stock cluster member.
struct At(u16);

impl Server for At {
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.0)
    }
}

impl StockCluster {
    fn start() -> StockCluster {
        let dir = tempfile::Builder::new()
            .prefix("ephd-it-etcd3-")
            .tempdir()
            .expect("data dir");
        let clients: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let peers: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let initial = peers
            .iter()
            .enumerate()
            .map(|(i, p)| format!("e{i}=http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut children = Vec::new();
        for i in 0..3 {
            let client = format!("http://127.0.0.1:{}", clients[i]);
            let peer = format!("http://127.0.0.1:{}", peers[i]);
            // etcd 3.4's checks (3.6 takes one change 3.4 refuses as an
            // unhealthy cluster; ephd answers as 3.4 does).
            let child = Command::new(crate::references::debian_etcd_34())
                .arg(format!("--name=e{i}"))
                .arg("--data-dir")
                .arg(dir.path().join(format!("e{i}")))
                .args(["--listen-client-urls", &client])
                .args(["--advertise-client-urls", &client])
                .args(["--listen-peer-urls", &peer])
                .args(["--initial-advertise-peer-urls", &peer])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-token", "stock-members"])
                .args(["--heartbeat-interval=50", "--election-timeout=500"])
                .args(["--log-level", "error"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("stock etcd is installed (scripts/test.sh installs it)");
            children.push(child);
        }
        StockCluster {
            clients,
            peers,
            children,
            _dir: dir,
        }
    }

    /// Waits until every member reports a leader.
    async fn ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for c in &self.clients {
            loop {
                let mut m = At(*c).maintenance().await;
                if let Ok(s) = m.status(StatusRequest {}).await {
                    if s.into_inner().leader != 0 {
                        break;
                    }
                }
                assert!(Instant::now() < deadline, "stock etcd cluster did not form");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Waits until the wall clock enters its next second.
async fn next_second() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    let rest = Duration::from_secs(1) - Duration::from_nanos(u64::from(now.subsec_nanos()));
    tokio::time::sleep(rest + Duration::from_millis(20)).await;
}

/// (code, message) of an answer, or "ok".
fn outcome<T>(r: Result<T, tonic::Status>) -> String {
    match r {
        Ok(_) => "ok".to_string(),
        Err(s) => format!("{:?}: {}", s.code(), s.message()),
    }
}

/// Runs the same sequence of calls on one cluster and returns what each
/// answered. `voter` is a voter's ID, `taken` its peer URL.
async fn sequence(c: &ClusterClient<Channel>, voter: u64, taken: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut c = c.clone();
    let free = format!("http://127.0.0.1:{}", free_port());
    let free2 = format!("http://127.0.0.1:{}", free_port());
    let unknown = 0x1234_5678;
    out.push(outcome(
        c.member_remove(MemberRemoveRequest { id: unknown }).await,
    ));
    out.push(outcome(
        c.member_promote(MemberPromoteRequest { id: unknown }).await,
    ));
    out.push(outcome(
        c.member_update(MemberUpdateRequest {
            id: unknown,
            peer_ur_ls: vec![free.clone()],
        })
        .await,
    ));
    // Promoting a voter: both etcd and ephd check first that the member
    // is in sync with the leader (from the leader's view of its log), then
    // that it is a learner; a voter a few entries behind on a loaded
    // machine gets the first answer. Neither changes anything, so ask
    // again while it is only behind.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let promoted = loop {
        let r = c.member_promote(MemberPromoteRequest { id: voter }).await;
        let behind = r.as_ref().is_err_and(|s| {
            s.message()
                == "etcdserver: can only promote a learner member which is in sync with leader"
        });
        if !behind || std::time::Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    out.push(outcome(promoted));
    out.push(outcome(add(&c, taken, false).await));
    out.push(outcome(add(&c, "bad", false).await));
    out.push(outcome(add(&c, "http://host-without-port", true).await));
    let learner = add(&c, &free, true).await.expect("add a learner");
    out.push(outcome(add(&c, &free2, true).await));
    // A new member's ID hashes its peer URLs and the wall-clock second (in
    // both systems): the same URLs added again within that second get the
    // same ID (`member ID already exist`), later they get `Peer URLs
    // already exists`. Ask in the next second, so the answer does not
    // depend on how fast the learner was added.
    next_second().await;
    out.push(outcome(add(&c, &free, false).await));
    out.push(outcome(
        c.member_promote(MemberPromoteRequest { id: learner.id })
            .await,
    ));
    out.push(outcome(
        c.member_update(MemberUpdateRequest {
            id: learner.id,
            peer_ur_ls: vec![taken.to_string()],
        })
        .await,
    ));
    out.push(outcome(remove(&c, learner.id).await));
    out.push(outcome(remove(&c, learner.id).await));
    out.push(outcome(
        add(&c, &format!("http://x:{}", free_port()), true)
            .await
            .map(|m| m.is_learner),
    ));
    // An unstarted voter breaks "every voter connected": further changes
    // that need a healthy cluster are refused until it is removed.
    let unstarted = add(&c, &free2, false).await.expect("add a voter");
    out.push(outcome(
        c.member_add(MemberAddRequest {
            peer_ur_ls: vec![format!("http://y:{}", free_port())],
            is_learner: false,
        })
        .await,
    ));
    out.push(outcome(remove(&c, unstarted.id).await));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_errors_match_a_three_member_stock_etcd() {
    let stock = StockCluster::start();
    let ours = EphdCluster::start(3, TIMING);
    stock.ready().await;
    agreed_leader(&ours, None).await;
    let stock_voter = members(&At(stock.clients[0])).await;
    let stock_voter = stock_voter
        .iter()
        .find(|m| m.peer_ur_ls == [format!("http://127.0.0.1:{}", stock.peers[1])])
        .expect("e1 listed")
        .id;
    let etcd = At(stock.clients[0]).cluster().await;
    let expected = sequence(
        &etcd,
        stock_voter,
        &format!("http://127.0.0.1:{}", stock.peers[1]),
    )
    .await;
    let m1 = ours.member(1).unwrap();
    let (m1_id, _, _) = crate::cluster::status(m1).await.unwrap();
    let ephd = ours.member(0).unwrap().cluster().await;
    let got = sequence(&ephd, m1_id, &m1.peer_url()).await;
    assert_eq!(got, expected, "ephd (left) and stock etcd (right) differ");
    // The answers are errors where etcd has them, not all "ok".
    assert!(
        expected.iter().any(|o| o.contains("member not found")),
        "{expected:?}"
    );
}

/// What a single member answers to membership calls about itself and an
/// unknown member.
async fn single_answers(server: &impl Server) -> Vec<String> {
    let list = members(server).await;
    let me = list[0].id;
    let mut c = server.cluster().await;
    let unknown = me ^ 0xff;
    vec![
        outcome(c.member_remove(MemberRemoveRequest { id: me }).await),
        outcome(c.member_remove(MemberRemoveRequest { id: unknown }).await),
        outcome(c.member_promote(MemberPromoteRequest { id: me }).await),
        outcome(c.member_promote(MemberPromoteRequest { id: unknown }).await),
        outcome(
            c.member_update(MemberUpdateRequest {
                id: unknown,
                peer_ur_ls: vec!["http://127.0.0.1:1".into()],
            })
            .await,
        ),
        outcome(
            c.member_update(MemberUpdateRequest {
                id: me,
                peer_ur_ls: list[0].peer_ur_ls.clone(),
            })
            .await,
        ),
        outcome(
            c.member_add(MemberAddRequest {
                peer_ur_ls: vec!["bad".into()],
                is_learner: true,
            })
            .await,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_member_answers_membership_calls_as_a_single_stock_etcd() {
    let etcd = StockEtcd::start();
    let ours = Ephd::start(&[]);
    let expected = single_answers(&etcd).await;
    let got = single_answers(&ours).await;
    assert_eq!(got, expected, "ephd (left) and stock etcd (right) differ");
    assert!(
        expected.iter().any(|o| o.contains("not enough started")),
        "{expected:?}"
    );
}
