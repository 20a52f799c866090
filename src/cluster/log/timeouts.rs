//! Why a proposal timed out, in etcd's words and by etcd's rule. A write
//! that is not applied within the request timeout has an unknown fate: it
//! may still commit, or it may be lost with a failed leader. etcd names the
//! likely cause: this member became the new leader shortly after the write
//! was proposed (`request timed out, possibly due to previous leader
//! failure`), or it lost its link to the leader, or as leader to a quorum,
//! since the proposal (`possibly due to connection lost`); otherwise the
//! plain `request timed out`. All are Unavailable, which clients retry.
//!
//! "Shortly after" is etcd's window: the proposal was made less than two
//! election timeouts before this member became leader (the time a failed
//! leader takes to be noticed and replaced). Like etcd, only the member
//! that became leader counts the election: a follower of the new leader
//! answers by the link test.

use crate::error::Error;
use std::time::{Duration, Instant};

/// What the member knows when the proposal times out.
pub(in crate::cluster) struct Now<'a> {
    /// This member's ID.
    pub(in crate::cluster) me: u64,
    /// `--election-timeout`.
    pub(in crate::cluster) election: Duration,
    /// When this member last became leader.
    pub(in crate::cluster) leader_elected: Option<Instant>,
    /// The leader it knows of.
    pub(in crate::cluster) leader: Option<u64>,
    /// The voting members (this one included when it votes).
    pub(in crate::cluster) voters: &'a [u64],
    /// Since when a peer has answered without interruption.
    pub(in crate::cluster) active_since: &'a dyn Fn(u64) -> Option<Instant>,
}

/// The error for a proposal made at `proposed` that timed out, given `now`.
pub(in crate::cluster) fn reason(proposed: Instant, now: Now<'_>) -> Error {
    if let Some(elected) = now.leader_elected {
        let lost = elected.checked_sub(2 * now.election);
        if proposed < elected && lost.is_none_or(|lost| proposed > lost) {
            return Error::TimeoutDueToLeaderFail;
        }
    }
    let connected_since_proposal =
        |id: u64| id == now.me || (now.active_since)(id).is_some_and(|t| t <= proposed);
    match now.leader {
        None => Error::Timeout,
        Some(leader) if leader == now.me => {
            let connected = now
                .voters
                .iter()
                .filter(|id| connected_since_proposal(**id))
                .count();
            if connected < now.voters.len() / 2 + 1 {
                Error::TimeoutDueToConnectionLost
            } else {
                Error::Timeout
            }
        }
        Some(leader) if !connected_since_proposal(leader) => Error::TimeoutDueToConnectionLost,
        Some(_) => Error::Timeout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ELECTION: Duration = Duration::from_millis(500);

    /// Connected to everyone since long before `p`.
    fn always(_: u64) -> Option<Instant> {
        Instant::now().checked_sub(Duration::from_secs(60))
    }

    /// A follower of leader 2 in a cluster of three, connected to everyone
    /// since long before, with no leader change since long before `p`.
    fn calm(p: Instant) -> Now<'static> {
        Now {
            me: 1,
            election: ELECTION,
            leader_elected: Some(p - Duration::from_secs(60)),
            leader: Some(2),
            voters: &[1, 2, 3],
            active_since: &always,
        }
    }

    #[test]
    fn a_leader_elected_soon_after_the_proposal_is_a_leader_failure() {
        let p = Instant::now();
        for after in [
            Duration::from_millis(1),
            ELECTION,
            2 * ELECTION - Duration::from_millis(1),
        ] {
            let now = Now {
                leader_elected: Some(p + after),
                ..calm(p)
            };
            assert_eq!(reason(p, now), Error::TimeoutDueToLeaderFail, "{after:?}");
        }
    }

    #[test]
    fn a_leader_elected_long_after_or_before_the_proposal_is_not() {
        let p = Instant::now();
        for elected in [p + 2 * ELECTION + Duration::from_millis(1), p, p - ELECTION] {
            let now = Now {
                leader_elected: Some(elected),
                ..calm(p)
            };
            assert_eq!(reason(p, now), Error::Timeout, "{elected:?}");
        }
    }

    #[test]
    fn a_follower_that_lost_its_leader_says_connection_lost() {
        let p = Instant::now();
        let later = p + Duration::from_millis(10);
        let lost = Now {
            active_since: &move |id| (id == 2).then_some(later),
            ..calm(p)
        };
        assert_eq!(reason(p, lost), Error::TimeoutDueToConnectionLost);
        let gone = Now {
            active_since: &|_| None,
            ..calm(p)
        };
        assert_eq!(reason(p, gone), Error::TimeoutDueToConnectionLost);
        assert_eq!(reason(p, calm(p)), Error::Timeout);
    }

    #[test]
    fn a_leader_without_a_quorum_since_the_proposal_says_connection_lost() {
        let p = Instant::now();
        let before = p - Duration::from_secs(1);
        let one_peer = Now {
            leader: Some(1),
            active_since: &move |id| (id == 2).then_some(before),
            ..calm(p)
        };
        assert_eq!(reason(p, one_peer), Error::Timeout);
        let alone = Now {
            leader: Some(1),
            active_since: &|_| None,
            ..calm(p)
        };
        assert_eq!(reason(p, alone), Error::TimeoutDueToConnectionLost);
        let no_leader = Now {
            leader: None,
            active_since: &|_| None,
            ..calm(p)
        };
        assert_eq!(reason(p, no_leader), Error::Timeout);
    }
}
