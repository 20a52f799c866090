//! `--force-new-cluster`: when a majority of a cluster lost its state (ephd
//! keeps none on disk, so a restarted process has none) the old cluster
//! can never elect a leader again, and a member that starts without its
//! state refuses to form the cluster anew (`join.rs`), since that could
//! lose acknowledged writes. The operator then starts ONE member with
//! `--force-new-cluster`, as with etcd.
//!
//! What it does, as etcd 3.4 does with its data (checked with a stock
//! etcd: the cluster ID and the member's ID stay, every other member is
//! removed, so their old IDs are refused from then on): the member starts
//! a one-member cluster under its `--initial-cluster` member ID and
//! cluster ID, with the others recorded as removed. Raft's configuration
//! is this member alone, so it elects itself at once. With `--data-dir`
//! it resumes its saved state (`saved_state.rs`; its ID found by its peer URLs
//! in the saved member list) and, as etcd keeps its WAL's committed
//! entries, the entries its trusted Raft log committed after that state
//! (`restart::forced_tail`, applied by [`replay_tail`]); entries past the
//! log's commit index were never acknowledged and are dropped. Without
//! `--data-dir`, an ephd process starts empty: the
//! new cluster starts with no data (and a fresh initial revision, above
//! every earlier one), and the writes the old cluster's running members
//! still hold in memory are not carried over; the startup log says which
//! members held what. The others then join the etcd way: MemberAdd, and
//! start with `--initial-cluster-state existing`.
//!
//! [`resume`] is the same start for the seed of a whole cluster resuming
//! by itself (`resume.rs`).
//!
//! Refused while a member that answers has a leader: the old cluster (or
//! an earlier forced one) works, and forcing would split it into two
//! clusters under one cluster ID.

use crate::cluster::member::applied_membership::Boot;
use crate::cluster::member::saved_state::Saved;
use crate::cluster::replicated::member_list::{Change, MemberInfo, Membership};
use crate::config::ClusterConfig;
use crate::mvcc::Store;
use crate::proto::ephd::internal::ProbeResponse;
use raft::prelude::{Entry, EntryType};

/// What a member started with `--force-new-cluster` starts with, given
/// what the other members answered (`answers`, by peer URL) and the
/// committed entries its Raft log holds after `saved` (`tail`,
/// `restart::forced_tail`), or why it refuses.
pub(in crate::cluster) fn boot(
    config: &ClusterConfig,
    client_urls: Vec<String>,
    initial: Membership,
    answers: &[(String, ProbeResponse)],
    (saved, tail): (Option<&Saved>, &[Entry]),
) -> Result<Boot, String> {
    forced(config, client_urls, initial, answers, (saved, tail), false)
}

/// Applies the normal entries of a forced member's `tail` to `store`
/// (restored from its saved state, before its revisions move up), through
/// the apply path every member applies committed entries with.
pub fn replay_tail(store: &Store, tail: &[Entry]) {
    for e in tail {
        if e.get_entry_type() == EntryType::EntryNormal && !e.get_data().is_empty() {
            let data = bytes::Bytes::copy_from_slice(e.get_data());
            crate::cluster::node::apply_loop::apply_normal(
                store,
                e.get_index(),
                e.get_term(),
                data,
            );
        }
    }
}

/// The seed of a whole cluster resuming its saved state (`resume.rs`): as
/// [`boot`] with `saved`, except that every other member is replaced by a
/// learner with the same peer URLs under a new ID, not started yet, which
/// it starts as (`join.rs`) when it finds this member leading, and is
/// promoted once caught up.
pub(in crate::cluster) fn resume(
    config: &ClusterConfig,
    client_urls: Vec<String>,
    initial: Membership,
    answers: &[(String, ProbeResponse)],
    saved: &Saved,
) -> Result<Boot, String> {
    forced(
        config,
        client_urls,
        initial,
        answers,
        (Some(saved), &[]),
        true,
    )
}

fn forced(
    config: &ClusterConfig,
    client_urls: Vec<String>,
    initial: Membership,
    answers: &[(String, ProbeResponse)],
    (saved, tail): (Option<&Saved>, &[Entry]),
    relearn: bool,
) -> Result<Boot, String> {
    let mut id = config.member_id();
    if let Some((url, r)) = answers.iter().find(|(_, r)| r.leader != 0) {
        return Err(format!(
            "--force-new-cluster refused: the member at {url} (member {:x}) has a leader \
             (member {:x}, term {}): the cluster works, and forcing a new one beside it would \
             split it into two clusters with the same cluster ID. A member that lost its \
             state rejoins the etcd way: `etcdctl member remove {id:x}`, `etcdctl member add \
             {} --peer-urls={}`, then start it with --initial-cluster-state existing (and \
             without --force-new-cluster)",
            r.member_id,
            r.leader,
            r.term,
            config.name,
            config.advertise_peer_urls.join(","),
        ));
    }
    // Resuming saved state: the membership it holds (IDs may have changed
    // since --initial-cluster, by rejoins), this member found by its peer
    // URLs in it.
    let mut initial = initial;
    let mut resume = None;
    if let Some(s) = saved {
        if let Some(bytes) = &s.snapshot.sections.members {
            let held = Membership::decode(bytes)
                .map_err(|e| format!("{}: its member list: {e}", s.path.display()))?;
            let mine = held
                .members()
                .find(|m| m.peer_urls == config.advertise_peer_urls)
                .map(|m| m.id);
            if let Some(mine) = mine {
                id = mine;
                initial = held;
            }
        }
        resume = Some((s.snapshot.raft_index, s.snapshot.raft_term));
        tracing::warn!(
            saved = %s.describe(),
            "--force-new-cluster resumes from this member's saved state"
        );
    }
    // The log's committed entries after it: their membership changes here,
    // their writes by `replay_tail`.
    for e in tail {
        if e.get_entry_type() == EntryType::EntryConfChange {
            match Change::from_entry_data(e.get_data()) {
                Ok((change, _, _)) => {
                    let _ = initial.apply(&change);
                }
                Err(why) => tracing::error!(error = %why, "membership change skipped"),
            }
        }
    }
    if let Some(last) = tail.last() {
        resume = Some((last.get_index(), last.get_term()));
        // A rejoin in the tail may have given this member a new ID.
        if let Some(mine) = initial
            .members()
            .find(|m| m.peer_urls == config.advertise_peer_urls)
        {
            id = mine.id;
        }
    }
    let forced = alone(&initial, id, relearn.then_some(config.token.as_str()));
    let removed: Vec<String> = initial
        .members()
        .filter(|m| m.id != id)
        .map(|m| format!("{:x}", m.id))
        .collect();
    let lost = match (saved.is_some(), tail.last()) {
        (_, Some(last)) => format!(
            "The new cluster holds this member's saved state and the {} committed entries its \
             raft log holds after it (to index {}); what only the old members listed here \
             hold beyond that is lost.",
            tail.len(),
            last.get_index()
        ),
        (true, None) => "The new cluster holds this member's saved state; writes after it \
                         was saved are lost, and so is what only the old members listed here \
                         hold."
            .to_string(),
        (false, None) => "This process holds no data, so the new cluster starts empty: \
                          every write of the old cluster is lost, including what the old \
                          members listed here still hold."
            .to_string(),
    };
    tracing::warn!(
        member_id = %format_args!("{id:x}"),
        cluster_id = %format_args!("{:x}", config.cluster_id()),
        removed = %removed.join(","),
        old_members = %holdings(answers),
        lost,
        "forcing a new one-member cluster (--force-new-cluster): this member alone, every \
         other member removed. Stop the old members that still run, add each back with \
         MemberAdd and start it with --initial-cluster-state existing; restart this member \
         without --force-new-cluster"
    );
    Ok(Boot {
        id,
        cluster_id: config.cluster_id(),
        current: forced.clone(),
        initial: forced,
        name: config.name.clone(),
        client_urls,
        promote: false,
        resume,
        log: None,
    })
}

/// `initial` with every member but `me` removed (so none of their IDs can
/// vote or join again), `me` a voter (a saved state may hold it as a
/// learner that had not been promoted yet). With `relearn` (the cluster's
/// token), each removed member's peer URLs come back as a learner not
/// started yet under a new ID: learners with empty logs never vote, so
/// they cannot elect one of themselves over the member holding the state
/// (two unstarted voters would be a majority of three).
fn alone(initial: &Membership, me: u64, relearn: Option<&str>) -> Membership {
    let mut m = initial.clone();
    if m.get(me).is_some_and(|x| x.is_learner) {
        let _ = m.apply(&Change::Promote(me));
    }
    let others: Vec<MemberInfo> = m.members().filter(|x| x.id != me).cloned().collect();
    for other in &others {
        // A member of the membership is always removable.
        let _ = m.apply(&Change::Remove(other.id));
    }
    let Some(token) = relearn else { return m };
    for other in others {
        let fresh = (0u64..)
            .map(|n| {
                let salt = format!("{token}|resumed|{:x}|{n}", other.id);
                crate::config::member_id(&other.peer_urls, &salt)
            })
            .find(|id| *id != 0 && m.get(*id).is_none() && !m.is_removed(*id))
            .unwrap_or_default();
        m.add_resumed_learner(MemberInfo {
            id: fresh,
            name: String::new(),
            peer_urls: other.peer_urls,
            client_urls: Vec::new(),
            is_learner: true,
        });
    }
    m
}

/// What each answering member holds, for messages: `member <id> at <url>:
/// term T, committed index N, revision R`.
pub(in crate::cluster) fn holdings(answers: &[(String, ProbeResponse)]) -> String {
    if answers.is_empty() {
        return "no other member answers".to_string();
    }
    answers
        .iter()
        .map(|(url, r)| {
            format!(
                "member {:x} at {url}: term {}, committed index {}, revision {}",
                r.member_id, r.term, r.committed, r.revision
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use protobuf::Message as _;

    fn config(name: &str) -> ClusterConfig {
        ClusterConfig {
            force_new_cluster: true,
            ..ClusterConfig::for_tests(&["a", "b", "c"], name)
        }
    }

    fn initial(c: &ClusterConfig) -> Membership {
        Membership::initial(c)
    }

    fn answer(member_id: u64, leader: u64) -> (String, ProbeResponse) {
        let r = ProbeResponse {
            token: "tok".into(),
            member_id,
            leader,
            term: 7,
            committed: 42,
            revision: 1234,
            asker_started: true,
            ..Default::default()
        };
        ("http://10.0.0.2:2380".to_string(), r)
    }

    #[test]
    fn a_forced_member_is_alone_with_its_ids_and_the_others_removed() {
        let c = config("a");
        let (a, b, cc) = (c.members[0].id, c.members[1].id, c.members[2].id);
        let boot = boot(&c, vec![], initial(&c), &[answer(cc, 0)], (None, &[])).unwrap();
        assert_eq!((boot.id, boot.cluster_id), (a, c.cluster_id()));
        let ids: Vec<u64> = boot.initial.members().map(|m| m.id).collect();
        assert_eq!(ids, [a]);
        assert!(boot.initial.is_removed(b) && boot.initial.is_removed(cc));
        assert_eq!(boot.initial.conf_state().get_voters(), [a]);
        assert_eq!(boot.current, boot.initial);
    }

    fn put_entry(index: u64, term: u64, key: &str) -> Entry {
        let put = crate::mvcc::Entry::Put(crate::mvcc::PutRequest {
            key: bytes::Bytes::copy_from_slice(key.as_bytes()),
            value: bytes::Bytes::from_static(b"v"),
            ..Default::default()
        });
        let mut e = Entry::default();
        e.set_entry_type(EntryType::EntryNormal);
        e.set_index(index);
        e.set_term(term);
        e.set_data(crate::entry_bytes::encode(1, index, 0, put).into());
        e
    }

    #[test]
    fn the_committed_tail_of_the_log_is_carried_into_the_forced_cluster() {
        let c = config("a");
        let a = c.members[0].id;
        // The log after the saved state: two writes and a member added.
        let added = MemberInfo {
            id: 77,
            name: String::new(),
            peer_urls: vec!["http://10.0.0.9:2380".into()],
            client_urls: Vec::new(),
            is_learner: false,
        };
        let conf = conf_entry(2, Change::Add(added));
        let tail = [put_entry(1, 1, "k1"), conf, put_entry(3, 2, "k2")];
        let boot = boot(&c, vec![], initial(&c), &[], (None, &tail)).unwrap();
        assert_eq!(boot.resume, Some((3, 2)));
        // The member the tail added is removed with the others.
        assert_eq!(boot.initial.conf_state().get_voters(), [a]);
        assert!(boot.initial.is_removed(77));
        let store = Store::new(crate::mvcc::StoreConfig::default());
        replay_tail(&store, &tail);
        assert_eq!(store.current_revision(), 3);
        for key in ["k1", "k2"] {
            let found = store
                .range(&crate::mvcc::RangeRequest {
                    key: bytes::Bytes::copy_from_slice(key.as_bytes()),
                    ..Default::default()
                })
                .unwrap();
            assert_eq!(found.kvs.len(), 1, "{key}");
        }
    }

    fn conf_entry(index: u64, change: Change) -> Entry {
        let mut e = Entry::default();
        e.set_entry_type(EntryType::EntryConfChange);
        e.set_index(index);
        e.set_term(1);
        e.set_data(
            change
                .to_conf_change(1, index)
                .write_to_bytes()
                .unwrap()
                .into(),
        );
        e
    }

    #[test]
    fn a_rejoin_in_the_tail_gives_the_forced_member_its_new_id() {
        let c = config("a");
        let a = c.members[0].id;
        let rejoined = MemberInfo {
            id: 99,
            name: String::new(),
            peer_urls: c.advertise_peer_urls.clone(),
            client_urls: Vec::new(),
            is_learner: false,
        };
        let tail = [
            conf_entry(1, Change::Remove(a)),
            conf_entry(2, Change::Add(rejoined)),
        ];
        let boot = boot(&c, vec![], initial(&c), &[], (None, &tail)).unwrap();
        assert_eq!(boot.id, 99);
        assert_eq!(boot.initial.conf_state().get_voters(), [99]);
        assert!(boot.initial.is_removed(a));
    }

    #[test]
    fn a_resumed_member_takes_its_id_from_the_saved_members_and_votes() {
        let c = config("a");
        let (a, b) = (c.members[0].id, c.members[1].id);
        // a rejoined under a new ID and was still a learner when saved.
        let mut held = initial(&c);
        held.apply(&Change::Remove(a)).unwrap();
        let mine = MemberInfo {
            id: 99,
            name: String::new(),
            peer_urls: c.advertise_peer_urls.clone(),
            client_urls: Vec::new(),
            is_learner: true,
        };
        held.apply(&Change::Add(mine)).unwrap();
        let saved = Saved {
            snapshot: crate::mvcc::snapshot::Snapshot {
                raft_index: 40,
                raft_term: 3,
                sections: crate::mvcc::snapshot::Sections {
                    members: Some(held.encode()),
                    auth: None,
                },
                ..Default::default()
            },
            path: "/x/ephd-cluster.snap".into(),
            written_unix: 0,
            handed_out: Default::default(),
        };
        let boot = boot(&c, vec![], initial(&c), &[], (Some(&saved), &[])).unwrap();
        assert_eq!((boot.id, boot.resume), (99, Some((40, 3))));
        assert_eq!(boot.initial.conf_state().get_voters(), [99]);
        assert!(boot.initial.is_removed(a) && boot.initial.is_removed(b));
    }

    #[test]
    fn the_resuming_seed_gives_every_other_member_a_new_unstarted_learner_id() {
        let c = config("a");
        let (a, b, cc) = (c.members[0].id, c.members[1].id, c.members[2].id);
        let saved = Saved {
            snapshot: crate::mvcc::snapshot::Snapshot {
                raft_index: 12,
                raft_term: 2,
                sections: crate::mvcc::snapshot::Sections {
                    members: Some(initial(&c).encode()),
                    auth: None,
                },
                ..Default::default()
            },
            path: "/x/ephd-cluster.snap".into(),
            written_unix: 0,
            handed_out: Default::default(),
        };
        let boot = resume(&c, vec![], initial(&c), &[], &saved).unwrap();
        assert_eq!((boot.id, boot.resume), (a, Some((12, 2))));
        assert!(boot.initial.is_removed(b) && boot.initial.is_removed(cc));
        // The seed alone votes: members with empty logs cannot outvote it.
        assert_eq!(boot.initial.conf_state().get_voters(), [a]);
        assert_eq!(boot.initial.conf_state().get_learners().len(), 2);
        for (old, urls) in [(b, &c.members[1].peer_urls), (cc, &c.members[2].peer_urls)] {
            let placed = boot.initial.by_peer_urls(urls).expect("a place for it");
            assert!(placed.id != old && placed.is_learner && !placed.has_published());
        }
    }

    #[test]
    fn forcing_beside_a_working_cluster_is_refused() {
        let c = config("a");
        let (b, cc) = (c.members[1].id, c.members[2].id);
        let e = boot(
            &c,
            vec![],
            initial(&c),
            &[answer(cc, 0), answer(b, cc)],
            (None, &[]),
        )
        .unwrap_err();
        assert!(
            e.contains("has a leader") && e.contains("member remove"),
            "{e}"
        );
        assert!(holdings(&[answer(cc, 0)]).contains("committed index 42, revision 1234"));
        assert_eq!(holdings(&[]), "no other member answers");
    }
}
