use super::*;

fn member(id: u64, url: &str) -> MemberInfo {
    MemberInfo {
        id,
        name: format!("m{id}"),
        peer_urls: vec![url.to_string()],
        client_urls: Vec::new(),
        is_learner: false,
    }
}

fn three() -> Membership {
    Membership::of([
        member(1, "http://a:2380"),
        member(2, "http://b:2380"),
        member(3, "http://c:2380"),
    ])
}

fn learner(id: u64, url: &str) -> MemberInfo {
    MemberInfo {
        name: String::new(),
        is_learner: true,
        ..member(id, url)
    }
}

#[test]
fn changes_follow_etcds_rules() {
    let mut m = three();
    assert_eq!(
        m.apply(&Change::Add(member(2, "http://x:2380"))),
        Err(Error::MemberExist)
    );
    assert_eq!(
        m.apply(&Change::Add(member(9, "http://b:2380"))),
        Err(Error::PeerUrlExist)
    );
    m.apply(&Change::Add(learner(4, "http://d:2380"))).unwrap();
    assert_eq!(
        m.apply(&Change::Add(learner(5, "http://e:2380"))),
        Err(Error::TooManyLearners)
    );
    assert_eq!(m.apply(&Change::Promote(1)), Err(Error::MemberNotLearner));
    assert_eq!(m.apply(&Change::Promote(77)), Err(Error::MemberNotFound));
    assert_eq!(m.apply(&Change::Remove(77)), Err(Error::MemberNotFound));
    let cs = m.conf_state();
    assert_eq!(
        (cs.get_voters(), cs.get_learners()),
        (&[1, 2, 3][..], &[4][..])
    );
    m.apply(&Change::Promote(4)).unwrap();
    assert!(!m.get(4).unwrap().is_learner);
    assert!(
        !m.get(4).unwrap().is_started(),
        "no name until it publishes"
    );
    m.apply(&Change::Publish {
        id: 4,
        name: "d".into(),
        client_urls: vec!["http://d:2379".into()],
    })
    .unwrap();
    assert!(m.get(4).unwrap().has_published());
    // A member may keep its own URLs, not take another's.
    let update = |id, url: &str| Change::UpdatePeerUrls {
        id,
        peer_urls: vec![url.to_string()],
    };
    m.apply(&update(4, "http://d:2380")).unwrap();
    assert_eq!(
        m.apply(&update(4, "http://a:2380")),
        Err(Error::PeerUrlExist)
    );
    m.apply(&update(4, "http://d2:2380")).unwrap();
    assert_eq!(m.by_peer_urls(&["http://d2:2380".into()]).unwrap().id, 4);
    // A removed ID never comes back, not even with new URLs.
    m.apply(&Change::Remove(2)).unwrap();
    assert!(m.is_removed(2));
    assert_eq!(
        m.apply(&Change::Add(member(2, "http://b2:2380"))),
        Err(Error::MemberNotFound)
    );
    assert_eq!(m.apply(&Change::Remove(2)), Err(Error::MemberNotFound));
    // Its URLs are free again, for a member with a new ID.
    m.apply(&Change::Add(member(6, "http://b:2380"))).unwrap();
}

#[test]
fn a_failed_change_changes_nothing() {
    let mut m = three();
    let before = m.clone();
    assert!(m.apply(&Change::Add(member(3, "http://z:1"))).is_err());
    assert!(m.apply(&Change::Promote(2)).is_err());
    assert_eq!(m, before);
}

#[test]
fn snapshot_bytes_carry_members_and_removed_ids() {
    let mut m = three();
    m.apply(&Change::Add(learner(4, "http://d:2380"))).unwrap();
    m.apply(&Change::Remove(2)).unwrap();
    m.apply(&Change::Publish {
        id: 1,
        name: "one".into(),
        client_urls: vec!["http://a:2379".into(), "http://a:2377".into()],
    })
    .unwrap();
    let back = Membership::decode(&m.encode()).unwrap();
    assert_eq!(back, m);
    assert!(back.is_removed(2));
    assert!(back.get(4).unwrap().is_learner);
    assert!(Membership::decode(b"\xff\xff").is_err());
    assert_eq!(Membership::decode(&[]).unwrap(), Membership::default());
}

#[test]
fn conf_change_entries_round_trip_and_raft_ignores_attribute_changes() {
    let changes = [
        Change::Add(learner(4, "http://d:2380")),
        Change::Add(member(5, "http://e:2380")),
        Change::Remove(2),
        Change::Promote(4),
        Change::UpdatePeerUrls {
            id: 1,
            peer_urls: vec!["http://a2:2380".into()],
        },
        Change::Publish {
            id: 3,
            name: "c".into(),
            client_urls: vec!["http://c:2379".into()],
        },
    ];
    for (i, c) in changes.iter().enumerate() {
        let cc = c.to_conf_change(7, i as u64);
        let (back, proposer, proposal) = Change::from_conf_change(&cc).unwrap();
        assert_eq!((&back, proposer, proposal), (c, 7, i as u64));
    }
    assert_eq!(
        changes[0].raft_change().get_change_type(),
        ConfChangeType::AddLearnerNode
    );
    assert_eq!(changes[3].raft_change().get_node_id(), 4);
    assert_eq!(
        changes[2].raft_change().get_change_type(),
        ConfChangeType::RemoveNode
    );
    assert_eq!(changes[4].raft_change().get_node_id(), 0);
    assert_eq!(changes[5].raft_change().get_node_id(), 0);
}
