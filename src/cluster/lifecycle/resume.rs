//! A whole cluster resuming from its members' saved state (`--data-dir`,
//! `saved_state.rs`) without an operator.
//!
//! After every member stopped (a rolling restart gone wrong, a power
//! loss), each comes back with a saved state but no Raft state. None may
//! vote or acknowledge under its old ID with a stale log, so the cluster
//! resumes through ONE member, the **seed**: the first member of
//! `--initial-cluster` (a rule every member applies alike, without
//! talking, so two seeds are impossible). While it waits, a member holding
//! saved state answers the other members' probes on its peer URL with
//! `resuming` and what its file holds (revision, Raft index and term,
//! member list), and hands the file itself to the seed (`FetchSaved`)
//! ([`responder`], served by the server before its Raft node exists).
//!
//! * The seed resumes once a majority of the saved voters (itself
//!   included) answer `resuming`: members that stopped and came back, not
//!   a running majority it merely cannot reach (which would answer with a
//!   leader, or not at all), so a partitioned member never starts a second
//!   cluster. It resumes from the newest saved state among the waiting
//!   members (`newest_saved_state.rs`): its own, or a newer one it fetches from a
//!   waiting member and makes its own first. It starts a cluster holding
//!   that state (`force.rs`: same cluster ID, revisions continue above
//!   every earlier one) in which it is the only voter (so it leads at
//!   once) and every other member is replaced by a learner with the same
//!   peer URLs under a new ID, not started yet. Not voters: two members
//!   with empty logs would be a majority of three and could elect one of
//!   themselves over the member holding the state.
//! * Every other member waits until a member answers with a leader (or
//!   with such a place for it), then starts as that learner, as a member
//!   added by MemberAdd does (`join.rs`), catches up by snapshot and is
//!   promoted. Its own saved state is not used (the seed took it if it
//!   was the newest).
//!
//! What is lost: the writes after the newest file among the waiting
//! majority was written (none after a clean stop of every member, which
//! each ends with a final save). A file only a member that did not come
//! back holds is not seen. A member that waits longer than [`PATIENCE`]
//! stops and says what to do.

use crate::cluster::member::saved_state::Saved;
use crate::cluster::member::saved_state_pieces;
use crate::config::ClusterConfig;
use crate::metrics::warnings::RateLimit;
use crate::proto::ephd::internal::{
    membership_server::{Membership as MembershipRpc, MembershipServer},
    FetchSavedRequest, JoinRequest, JoinResponse, MembershipState, ProbeRequest, ProbeResponse,
    PromoteRequest, PromoteResponse, RejoinRequest,
};
use std::path::PathBuf;
use std::time::Duration;
use tonic::{Request, Response, Status};

/// How long a member holding saved state waits for the cluster to resume.
pub const PATIENCE: Duration = Duration::from_secs(120);
/// How often it asks the others meanwhile.
const ROUND: Duration = Duration::from_millis(500);
/// A waiting member waits past [`PATIENCE`] while a piece of its file
/// went to the seed this recently.
const FETCH_IDLE: Duration = Duration::from_secs(15);
/// At most one warning per this period about a fetch that keeps failing.
const FAILURE_WARNINGS: Duration = Duration::from_secs(10);

/// What a waiting member answers on its peer URL.
#[derive(Debug, Clone)]
pub struct Responder {
    token: String,
    cluster_id: u64,
    member_id: u64,
    revision: i64,
    index: u64,
    term: u64,
    written_unix: u64,
    handed_out: saved_state_pieces::HandedOut,
    bytes: u64,
    membership: Option<MembershipState>,
    path: PathBuf,
}

/// The peer service a member holding `saved` serves until its Raft node
/// starts: probes answered with `resuming` and what its file holds, the
/// file itself to the seed (`FetchSaved`, `newest_saved_state.rs`), everything else
/// Unavailable.
pub fn responder(config: &ClusterConfig, saved: &Saved) -> MembershipServer<Responder> {
    MembershipServer::new(Responder {
        token: config.token.clone(),
        // The ID the file is named by (`saved::load`).
        cluster_id: config.cluster_id(),
        member_id: saved_id(config, saved),
        revision: saved.snapshot.image.revision,
        index: saved.snapshot.raft_index,
        term: saved.snapshot.raft_term,
        written_unix: saved.written_unix,
        handed_out: saved.handed_out.clone(),
        bytes: std::fs::metadata(&saved.path).map_or(0, |m| m.len()),
        membership: saved.membership().map(|m| m.to_state()),
        path: saved.path.clone(),
    })
}

/// This member's ID in its saved member list (found by its peer URLs: a
/// rejoin may have changed it), or its `--initial-cluster` one.
fn saved_id(config: &ClusterConfig, saved: &Saved) -> u64 {
    saved
        .membership()
        .and_then(|m| {
            m.members()
                .find(|x| x.peer_urls == config.advertise_peer_urls)
                .map(|x| x.id)
        })
        .unwrap_or_else(|| config.member_id())
}

fn waiting() -> Status {
    Status::unavailable("this member restarts from its saved state and waits for the cluster")
}

#[tonic::async_trait]
impl MembershipRpc for Responder {
    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse {
            token: self.token.clone(),
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision: self.revision,
            resuming: true,
            saved_index: self.index,
            saved_term: self.term,
            saved_written_unix: self.written_unix,
            saved_bytes: self.bytes,
            saved_membership: self.membership.clone(),
            ..Default::default()
        }))
    }

    type FetchSavedStream = saved_state_pieces::Chunks;

    async fn fetch_saved(
        &self,
        req: Request<FetchSavedRequest>,
    ) -> Result<Response<Self::FetchSavedStream>, Status> {
        let req = req.into_inner();
        if req.token != self.token || req.cluster_id != self.cluster_id {
            return Err(Status::failed_precondition(format!(
                "not this cluster's saved state (token {:?}, cluster {:x}; asked for {:?}, {:x})",
                self.token, self.cluster_id, req.token, req.cluster_id
            )));
        }
        if (req.raft_index, req.raft_term) != (self.index, self.term) {
            return Err(Status::failed_precondition(format!(
                "this member's saved state is at raft index {}, term {}, not index {}, term {}",
                self.index, self.term, req.raft_index, req.raft_term
            )));
        }
        tracing::info!(
            file = %self.path.display(),
            bytes = self.bytes,
            "sending this member's saved state to the seed, which resumes the cluster from it"
        );
        let chunks = saved_state_pieces::serve(self.path.clone(), self.handed_out.clone())
            .map_err(|e| {
                Status::unavailable(format!("cannot read {}: {e}", self.path.display()))
            })?;
        Ok(Response::new(chunks))
    }

    async fn join(&self, _: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        Err(waiting())
    }

    async fn rejoin(&self, _: Request<RejoinRequest>) -> Result<Response<JoinResponse>, Status> {
        Err(waiting())
    }

    async fn promote(
        &self,
        _: Request<PromoteRequest>,
    ) -> Result<Response<PromoteResponse>, Status> {
        Err(waiting())
    }
}

/// What a member holding saved state does after a round of probes.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::cluster) enum Next {
    /// A member answers with a leader, or the seed runs with a place for
    /// this member: start as the others say (`join.rs`), the saved state
    /// unused.
    Running,
    /// This member is the seed and a majority waits: resume.
    Resume,
    /// Ask again.
    Wait,
}

/// Whether this member is the seed: the first of `--initial-cluster`.
pub(in crate::cluster) fn is_seed(config: &ClusterConfig) -> bool {
    config
        .members
        .first()
        .is_some_and(|m| m.name == config.name)
}

/// Decides from one round of `answers` (by peer URL).
pub(in crate::cluster) fn next(
    config: &ClusterConfig,
    saved: &Saved,
    answers: &[(String, ProbeResponse)],
) -> Next {
    // A leader, or the seed running with a place for this member (a
    // learner with its peer URLs, not started yet).
    let placed = |r: &ProbeResponse| !r.resuming && r.urls_member != 0 && !r.urls_member_started;
    if answers.iter().any(|(_, r)| r.leader != 0 || placed(r)) {
        return Next::Running;
    }
    if !is_seed(config) {
        return Next::Wait;
    }
    let voters = saved.membership().map_or(config.members.len(), |m| {
        m.members().filter(|x| !x.is_learner).count()
    });
    let resuming = 1 + answers.iter().filter(|(_, r)| r.resuming).count();
    if resuming > voters / 2 {
        Next::Resume
    } else {
        Next::Wait
    }
}

/// How [`wait`] ended.
#[derive(Debug)]
pub(in crate::cluster) enum Waited {
    /// As [`Next::Running`].
    Running,
    /// This member is the seed and a majority waits: resume from its own
    /// saved state, or (`Some`) from the newer one it fetched from a
    /// waiting member and installed as its own (`newest_saved_state.rs`).
    Resume(Option<Box<Saved>>),
    /// [`PATIENCE`] ran out; with why the newer saved state of a waiting
    /// member could not be fetched, when that is what kept the seed.
    GaveUp(Option<String>),
}

/// Probes with `ask` every [`ROUND`] until [`next`] says something other
/// than wait, or [`PATIENCE`] runs out (with the last answers). When the
/// seed is to resume and a waiting member holds a newer saved state, the
/// seed fetches it first; if that fails it waits and tries again next
/// round (it never resumes from its older state while a waiting member
/// holds a newer one).
pub(in crate::cluster) async fn wait<F, Fut>(
    config: &ClusterConfig,
    saved: &Saved,
    mut ask: F,
) -> (Waited, Vec<(String, ProbeResponse)>)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Vec<(String, ProbeResponse)>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    tracing::info!(
        saved = %saved.describe(),
        seed = is_seed(config),
        "holding saved state and no member answers with a leader: waiting for the cluster \
         to resume (the first member of --initial-cluster resumes, from the newest saved \
         state among the waiting members, once a majority waits)"
    );
    // Why the last round's fetch failed (none after a round without one).
    let mut failed: Option<String>;
    // A fetch failing every round is told once per period, not per round.
    let started = std::time::Instant::now();
    let warnings = RateLimit::new(FAILURE_WARNINGS);
    let mut fetches = 0u64;
    let mut extended = false;
    loop {
        let answers = ask().await;
        match next(config, saved, &answers) {
            Next::Running => return (Waited::Running, answers),
            Next::Wait => failed = None,
            Next::Resume => {
                let Some(from) =
                    crate::cluster::node::newest_saved_state::newer(config, saved, &answers)
                else {
                    return (Waited::Resume(None), answers);
                };
                fetches += 1;
                match crate::cluster::node::newest_saved_state::adopt(
                    config,
                    saved,
                    from,
                    fetches == 1,
                )
                .await
                {
                    Ok(newer) => return (Waited::Resume(Some(Box::new(newer))), answers),
                    Err(e) => {
                        match warnings.admit(started.elapsed()) {
                            Some(held) => tracing::warn!(
                                own = %saved.describe(),
                                newer = %crate::cluster::node::newest_saved_state::describe(&from.0, &from.1),
                                error = %e,
                                failed_fetches_not_logged = held,
                                "cannot fetch the newer saved state of a waiting member: \
                                 trying again every round (the cluster does not resume from \
                                 an older state while a waiting member holds a newer one)"
                            ),
                            None => tracing::debug!(error = %e, "fetch failed again"),
                        }
                        failed = Some(e);
                    }
                }
            }
        }
        if tokio::time::Instant::now() >= deadline {
            // The seed fetching this member's file is the resume under
            // way: wait for it rather than give up in the middle.
            if !saved.handed_out.within(FETCH_IDLE) {
                return (Waited::GaveUp(failed), answers);
            }
            if !extended {
                extended = true;
                tracing::info!(
                    file = %saved.path.display(),
                    "still waiting past {PATIENCE:?}: the seed is fetching this member's saved \
                     state"
                );
            }
        }
        tokio::time::sleep(ROUND).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::snapshot::Snapshot;

    fn config(name: &str, n: usize) -> ClusterConfig {
        let names: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        ClusterConfig::for_tests(&names, name)
    }

    fn saved() -> Saved {
        Saved {
            snapshot: Snapshot::default(),
            path: "/d/ephd-cluster.snap".into(),
            written_unix: 0,
            handed_out: Default::default(),
        }
    }

    fn answer(resuming: bool, leader: u64, urls: Option<(u64, bool)>) -> (String, ProbeResponse) {
        let (urls_member, urls_member_started) = urls.unwrap_or((0, false));
        let r = ProbeResponse {
            token: "tok".into(),
            resuming,
            leader,
            urls_member,
            urls_member_started,
            ..Default::default()
        };
        ("http://10.0.0.9:2380".into(), r)
    }

    #[test]
    fn the_seed_resumes_once_a_majority_waits_and_never_beside_a_leader() {
        let (seed, other) = (config("m0", 3), config("m1", 3));
        assert!(is_seed(&seed) && !is_seed(&other));
        let s = saved();
        // Alone, or beside a leaderless member that runs (an old survivor):
        // wait; a majority of three waiting (itself and one more): resume.
        assert_eq!(next(&seed, &s, &[]), Next::Wait);
        assert_eq!(next(&seed, &s, &[answer(false, 0, None)]), Next::Wait);
        assert_eq!(next(&seed, &s, &[answer(true, 0, None)]), Next::Resume);
        // Five members: three must wait.
        let five = config("m0", 5);
        let two = [answer(true, 0, None), answer(false, 0, None)];
        assert_eq!(next(&five, &s, &two), Next::Wait);
        let three = [answer(true, 0, None), answer(true, 0, None)];
        assert_eq!(next(&five, &s, &three), Next::Resume);
        // A leader answers: the cluster runs, whoever asks.
        let led = [answer(true, 0, None), answer(false, 7, None)];
        assert_eq!(next(&seed, &s, &led), Next::Running);
        assert_eq!(next(&other, &s, &led), Next::Running);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_member_waits_past_its_patience_while_the_seed_fetches_its_file() {
        let other = config("m1", 3);
        let dir = tempfile::tempdir().unwrap();
        let waiting = || async { vec![answer(true, 0, None)] };
        // Nobody fetches its file: it gives up once its patience is out.
        let mut s = saved();
        s.path = dir.path().join("not-fetched.snap");
        let started = tokio::time::Instant::now();
        let (waited, _) = wait(&other, &s, waiting).await;
        assert!(matches!(waited, Waited::GaveUp(None)));
        assert!(started.elapsed() >= PATIENCE);
        // The seed is fetching it: it waits on until the cluster runs.
        s.path = dir.path().join("fetched.snap");
        s.handed_out.note();
        let patience_rounds = (PATIENCE.as_millis() / ROUND.as_millis()) as u32;
        let mut asked = 0;
        let started = tokio::time::Instant::now();
        let (waited, _) = wait(&other, &s, || {
            asked += 1;
            let running = asked > patience_rounds + 20;
            async move {
                if running {
                    vec![answer(false, 0, Some((0x99, false)))]
                } else {
                    vec![answer(true, 0, None)]
                }
            }
        })
        .await;
        assert!(matches!(waited, Waited::Running));
        assert!(started.elapsed() > PATIENCE);
    }

    #[test]
    fn the_others_wait_until_the_seed_runs_with_a_place_for_them() {
        let other = config("m1", 3);
        let s = saved();
        assert_eq!(next(&other, &s, &[answer(true, 0, None)]), Next::Wait);
        // An old survivor that knows this member ran is no place for it.
        let survivor = answer(false, 0, Some((5, true)));
        assert_eq!(next(&other, &s, &[survivor]), Next::Wait);
        let seed = answer(false, 0, Some((0x99, false)));
        assert_eq!(next(&other, &s, &[seed]), Next::Running);
    }
}
