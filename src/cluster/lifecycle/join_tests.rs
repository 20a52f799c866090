//! How a member started with `--initial-cluster-state new` decides, from
//! the other members' probe answers, to start, rejoin, join or refuse.

use super::{check_restart, NotStarted, Start};
use crate::config::{member_id, ClusterConfig, Member};
use crate::proto::ephd::internal::ProbeResponse;
use std::time::Duration;

const ME: &str = "http://10.0.0.1:2380";

fn config() -> ClusterConfig {
    let members: Vec<Member> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let urls = vec![format!("http://10.0.0.{}:2380", i + 1)];
            Member {
                name: n.to_string(),
                id: member_id(&urls, "tok"),
                peer_urls: urls,
            }
        })
        .collect();
    ClusterConfig {
        name: "a".into(),
        token: "tok".into(),
        listen_peer_urls: vec![ME.into()],
        advertise_peer_urls: vec![ME.into()],
        members,
        heartbeat: Duration::from_millis(100),
        election: Duration::from_secs(1),
        existing: false,
        snapshot_count: 10,
        catchup_entries: 5,
        peer_tls: None,
        force_new_cluster: false,
    }
}

/// An answer of member `from` (leader `leader`), saying who holds this
/// member's URLs (`urls`: ID and whether it ran).
fn says(from: u64, leader: u64, urls: Option<(u64, bool)>) -> (String, ProbeResponse) {
    let (urls_member, urls_member_started) = urls.unwrap_or((0, false));
    let r = ProbeResponse {
        token: "tok".into(),
        member_id: from,
        leader,
        urls_member,
        urls_member_started,
        ..Default::default()
    };
    (format!("http://peer-{from:x}:2380"), r)
}

fn decide(answers: &[(String, ProbeResponse)]) -> Result<Start, NotStarted> {
    let c = config();
    check_restart(&c, c.member_id(), answers)
}

#[test]
fn a_first_start_or_a_lone_start_starts_new() {
    let me = config().member_id();
    assert!(matches!(decide(&[]), Ok(Start::New)));
    // The others formed without it: its ID holds its URLs, never ran.
    assert!(matches!(
        decide(&[says(2, 2, Some((me, false)))]),
        Ok(Start::New)
    ));
}

#[test]
fn a_member_that_ran_rejoins_from_the_id_that_holds_its_urls() {
    let me = config().member_id();
    match decide(&[says(2, 2, Some((me, true))), says(3, 2, Some((me, true)))]) {
        Ok(Start::Rejoin { old, refusal }) => {
            assert_eq!(old, me);
            assert!(refusal.contains("member remove"), "{refusal}");
        }
        _ => panic!("a restart beside a leader rejoins"),
    }
    // After an earlier rejoin its URLs belong to another ID, which ran;
    // its --initial-cluster ID is removed.
    let mut removed = says(2, 2, Some((77, true)));
    removed.1.asker_removed = true;
    assert!(matches!(
        decide(&[removed]),
        Ok(Start::Rejoin { old: 77, .. })
    ));
}

#[test]
fn urls_added_and_not_started_join_as_that_member() {
    let mut r = says(2, 2, Some((88, false)));
    r.1.asker_removed = true;
    assert!(matches!(decide(&[r]), Ok(Start::Join)));
}

#[test]
fn a_removed_member_and_a_lost_majority_are_refused() {
    let mut removed = says(2, 2, None);
    removed.1.asker_removed = true;
    // Removed: final, whatever the others do later.
    let Some(NotStarted::Refused(e)) = decide(&[removed]).err() else {
        panic!("a removed member is refused for good");
    };
    assert!(e.contains("was removed from the cluster"), "{e}");
    // A lost majority: held until members return.
    let me = config().member_id();
    let Some(NotStarted::Held(e)) = decide(&[says(2, 0, Some((me, true)))]).err() else {
        panic!("a member beside a leaderless minority is held");
    };
    assert!(
        e.contains("a majority of the cluster may have lost its state"),
        "{e}"
    );
    assert!(e.contains("--force-new-cluster"), "{e}");
}

#[test]
fn members_without_the_leader_do_not_speak_for_a_working_cluster() {
    let me = config().member_id();
    // An old member (no leader) still lists this member's URLs as having
    // run; the working cluster (leader 3) removed it.
    let old = says(2, 0, Some((me, true)));
    let mut working = says(3, 3, None);
    working.1.asker_removed = true;
    let e = decide(&[old, working]).err().expect("removed");
    assert!(
        matches!(&e, NotStarted::Refused(why) if why.contains("was removed")),
        "{e:?}"
    );
}

#[test]
fn a_member_without_saved_state_beside_members_waiting_to_resume_refuses() {
    // b waits to resume (saved revision 77); a has nothing: starting a new,
    // empty cluster beside it would drop the saved state.
    let mut waiting = says(2, 0, None);
    waiting.1.resuming = true;
    waiting.1.revision = 77;
    let e = match decide(&[waiting.clone()]) {
        Err(NotStarted::Held(e)) => e,
        other => panic!(
            "started or refused for good beside a member waiting to resume: {:?}",
            other.err()
        ),
    };
    assert!(
        e.contains("waits to resume its saved state (revision 77)") && e.contains("holds none"),
        "{e}"
    );
    // The seed already runs and has a place for a: a joins it, whatever
    // the others still waiting say.
    let placed = says(3, 0, Some((0x99, false)));
    assert!(matches!(decide(&[waiting, placed]), Ok(Start::Join)));
}

#[test]
fn a_follower_behind_on_a_removal_does_not_undo_it() {
    // The operator removed the member that held this member's URLs (after
    // removing this member's own ID earlier); the leader applied it, a
    // follower has not yet and still names the removed member.
    let mut stale = says(2, 3, Some((0x55, true)));
    stale.1.asker_removed = true;
    stale.1.committed = 40;
    let mut leader = says(3, 3, None);
    leader.1.asker_removed = true;
    leader.1.committed = 41;
    for answers in [[stale.clone(), leader.clone()], [leader, stale]] {
        let e = decide(&answers).err().expect("removed");
        assert!(
            matches!(&e, NotStarted::Refused(why) if why.contains("was removed")),
            "{e:?}"
        );
    }
    // Without the leader's answer, the follower furthest along speaks.
    let mut behind = says(2, 3, Some((0x55, true)));
    behind.1.asker_removed = true;
    behind.1.committed = 40;
    let mut ahead = says(4, 3, None);
    ahead.1.asker_removed = true;
    ahead.1.committed = 41;
    let e = decide(&[behind, ahead]).err().expect("removed");
    assert!(matches!(&e, NotStarted::Refused(_)), "{e:?}");
}
