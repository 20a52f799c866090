//! Which saved state the seed resumes from, and fetching it from a real
//! waiting member's responder over loopback.

use super::*;
use crate::cluster::replicated::member_list::{Change, MemberInfo};
use crate::mvcc::snapshot::{Sections, Snapshot};
use crate::mvcc::StoreImage;

fn config(name: &str) -> ClusterConfig {
    ClusterConfig::for_tests(&["m0", "m1", "m2"], name)
}

/// The initial membership of [`config`]'s cluster.
fn initial(c: &ClusterConfig) -> Membership {
    Membership::initial(c)
}

fn snapshot(revision: i64, index: u64, term: u64, members: &Membership) -> Snapshot {
    Snapshot {
        raft_index: index,
        raft_term: term,
        image: StoreImage {
            revision,
            compacted: -1,
            ..Default::default()
        },
        sections: Sections {
            members: Some(members.encode()),
            auth: None,
        },
    }
}

fn own(index: u64, term: u64, members: &Membership) -> Saved {
    Saved {
        snapshot: snapshot(100 + index as i64, index, term, members),
        path: "/d/ephd-cluster.snap".into(),
        written_unix: 1,
        handed_out: Default::default(),
    }
}

/// Member `n`'s answer while it waits with a state at `index`/`term`.
fn waiting(
    c: &ClusterConfig,
    n: usize,
    index: u64,
    term: u64,
    members: &Membership,
) -> (String, ProbeResponse) {
    let r = ProbeResponse {
        token: c.token.clone(),
        cluster_id: c.cluster_id(),
        member_id: c.members[n].id,
        resuming: true,
        revision: 100 + index as i64,
        saved_index: index,
        saved_term: term,
        saved_membership: Some(members.to_state()),
        ..Default::default()
    };
    (c.members[n].peer_urls[0].clone(), r)
}

fn chosen(c: &ClusterConfig, own: &Saved, answers: &[(String, ProbeResponse)]) -> Option<u64> {
    newer(c, own, answers).map(|(_, r)| r.member_id)
}

#[test]
fn the_newest_waiting_state_wins_by_raft_index_then_term() {
    let c = config("m0");
    let m = initial(&c);
    let (m1, m2) = (c.members[1].id, c.members[2].id);
    // Older or equal states: the seed keeps its own (the same index and
    // term is the same state).
    let older = [waiting(&c, 1, 30, 2, &m), waiting(&c, 2, 40, 2, &m)];
    assert_eq!(chosen(&c, &own(40, 2, &m), &older), None);
    // One newer: it; two newer: the highest index.
    assert_eq!(chosen(&c, &own(35, 2, &m), &older), Some(m2));
    let both = [waiting(&c, 1, 60, 2, &m), waiting(&c, 2, 50, 3, &m)];
    assert_eq!(chosen(&c, &own(40, 2, &m), &both), Some(m1));
    // At the same index the higher term; at the same index and term the
    // earlier in --initial-cluster.
    let terms = [waiting(&c, 1, 60, 2, &m), waiting(&c, 2, 60, 3, &m)];
    assert_eq!(chosen(&c, &own(40, 2, &m), &terms), Some(m2));
    let tied = [waiting(&c, 1, 60, 3, &m), waiting(&c, 2, 60, 3, &m)];
    assert_eq!(chosen(&c, &own(40, 2, &m), &tied), Some(m1));
    assert_eq!(chosen(&c, &own(60, 3, &m), &tied), None);
}

#[test]
fn states_of_another_cluster_or_not_waiting_are_not_compared() {
    let c = config("m0");
    let m = initial(&c);
    let mut other = waiting(&c, 1, 90, 2, &m);
    other.1.cluster_id ^= 1;
    let mut running = waiting(&c, 2, 90, 2, &m);
    running.1.resuming = false;
    // An ephd that does not report what its file holds.
    let mut silent = waiting(&c, 2, 90, 2, &m);
    silent.1.saved_index = 0;
    let answers = [other, running, silent];
    assert_eq!(chosen(&c, &own(10, 2, &m), &answers), None);
}

#[test]
fn a_state_from_before_an_earlier_resume_loses_whatever_its_index() {
    let c = config("m0");
    let old = initial(&c);
    let (m0, m1, m2) = (c.members[0].id, c.members[1].id, c.members[2].id);
    // An earlier resume through m0: the others' old IDs removed, back as
    // new learner IDs.
    let mut resumed = old.clone();
    for (id, n) in [(m1, 1), (m2, 2)] {
        resumed.apply(&Change::Remove(id)).unwrap();
        resumed.add_resumed_learner(MemberInfo {
            id: 0x100 + n as u64,
            name: String::new(),
            peer_urls: c.members[n].peer_urls.clone(),
            client_urls: Vec::new(),
            is_learner: true,
        });
    }
    assert!(resumed.get(m0).is_some());
    // m1 rejoined the resumed cluster and stopped before it saved again:
    // its file is the old cluster's, at a higher index than the seed's.
    let stale = [
        waiting(&c, 1, 500, 4, &old),
        waiting(&c, 2, 120, 5, &resumed),
    ];
    assert_eq!(chosen(&c, &own(110, 5, &resumed), &stale), Some(m2));
    assert_eq!(chosen(&c, &own(130, 5, &resumed), &stale), None);
    // The seed's own file is the stale one: a newer state wins even at a
    // lower index.
    let fresh = [waiting(&c, 2, 120, 5, &resumed)];
    assert_eq!(chosen(&c, &own(500, 4, &old), &fresh), Some(m2));
    // States of two clusters forced apart (each removed the other's
    // members): nothing says which is newer; the seed keeps its own.
    let mut forced_a = old.clone();
    forced_a.apply(&Change::Remove(m1)).unwrap();
    let mut forced_b = old.clone();
    forced_b.apply(&Change::Remove(m0)).unwrap();
    let apart = [waiting(&c, 1, 900, 9, &forced_b)];
    assert_eq!(chosen(&c, &own(10, 2, &forced_a), &apart), None);
}

/// Serves `saved` the way a waiting member `name` does, on a loopback
/// port; its peer URL.
async fn responding(name: &str, saved: &Saved) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let service = crate::cluster::lifecycle::resume::responder(&config(name), saved);
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
    });
    url
}

/// What `responder` answers a probe, as the seed sees it at `url`.
async fn probed(url: &str) -> (String, ProbeResponse) {
    let mut c =
        crate::proto::ephd::internal::membership_client::MembershipClient::connect(url.to_string())
            .await
            .unwrap();
    let r = c
        .probe(crate::proto::ephd::internal::ProbeRequest::default())
        .await
        .unwrap()
        .into_inner();
    (url.to_string(), r)
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn the_seed_fetches_a_newer_file_checks_it_and_keeps_its_own_as_prev() {
    let seed = config("m0");
    let cid = seed.cluster_id();
    let m = initial(&seed);
    let (mine, theirs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // A file of several pieces: a large value in the newer state.
    saved_state::write(mine.path(), cid, &snapshot(200, 40, 2, &m)).unwrap();
    let mut big = snapshot(250, 80, 3, &m);
    big.sections.auth = Some(vec![7; 2 * saved_state_pieces::CHUNK + 5]);
    saved_state::write(theirs.path(), cid, &big).unwrap();
    let own = saved_state::load(mine.path(), cid).unwrap().unwrap();
    let source = saved_state::load(theirs.path(), cid).unwrap().unwrap();
    let url = responding("m1", &source).await;
    let answer = probed(&url).await;
    assert_eq!((answer.1.saved_index, answer.1.saved_term), (80, 3));
    assert_eq!(answer.1.cluster_id, cid);
    assert!(answer.1.saved_bytes > 2 * saved_state_pieces::CHUNK as u64);
    assert_eq!(
        newer(&seed, &own, std::slice::from_ref(&answer)),
        Some(&answer)
    );

    let got = adopt(&seed, &own, &answer, true).await.unwrap();
    assert_eq!(got.snapshot, big);
    assert_eq!(got.path, mine.path().join(saved_state::file_name(cid)));
    let name = saved_state::file_name(cid);
    assert_eq!(files(mine.path()), [name.clone(), format!("{name}.prev")]);
    // What a restart of the seed reads now: the fetched state; its own
    // older one is the previous file.
    assert_eq!(
        saved_state::load(mine.path(), cid)
            .unwrap()
            .unwrap()
            .snapshot,
        big
    );
    let prev = saved_state::read(&mine.path().join(format!("{name}.prev"))).unwrap();
    assert_eq!(prev.snapshot.raft_index, 40);
}

#[tokio::test]
async fn a_failed_fetch_installs_nothing_and_leaves_no_partial_file() {
    let seed = config("m0");
    let cid = seed.cluster_id();
    let m = initial(&seed);
    let (mine, theirs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    saved_state::write(mine.path(), cid, &snapshot(200, 40, 2, &m)).unwrap();
    saved_state::write(theirs.path(), cid, &snapshot(250, 80, 3, &m)).unwrap();
    let own = saved_state::load(mine.path(), cid).unwrap().unwrap();
    let source = saved_state::load(theirs.path(), cid).unwrap().unwrap();
    let before = files(mine.path());
    let url = responding("m1", &source).await;
    let answer = probed(&url).await;

    // Nobody there any more.
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let e = adopt(&seed, &own, &(gone, answer.1.clone()), true)
        .await
        .unwrap_err();
    assert!(e.contains("cannot connect"), "{e}");
    // The member holds another state than it announced (it restarted
    // meanwhile): refused before anything is sent.
    let mut moved = answer.clone();
    moved.1.saved_index = 81;
    let e = adopt(&seed, &own, &moved, true).await.unwrap_err();
    assert!(e.contains("refused") && e.contains("raft index 80"), "{e}");
    // Its file was damaged after it was loaded: it arrives whole but does
    // not decode, and is not used.
    let path = theirs.path().join(saved_state::file_name(cid));
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let e = adopt(&seed, &own, &answer, true).await.unwrap_err();
    assert!(e.contains(".fetched"), "{e}");
    // Each time: the seed's own file untouched, nothing half-written left.
    assert_eq!(files(mine.path()), before);
    assert_eq!(
        saved_state::load(mine.path(), cid)
            .unwrap()
            .unwrap()
            .snapshot
            .raft_index,
        40
    );
}
