//! How a member starts in a cluster, and the peer service (on the peer
//! listener, `ephd.internal.Membership`) that answers starting members.
//!
//! * `--initial-cluster-state new`: the member belongs to the initial
//!   cluster. It first asks the other members what they know ([`probe`]).
//!   A member that starts without its Raft state (ephd keeps none on disk)
//!   must never vote or acknowledge under an ID that voted or acknowledged
//!   before: if a running member of the same cluster (same
//!   `--initial-cluster-token`) says this ID has already run in it, the
//!   member rejoins under a new ID (`rejoin.rs`: the old ID removed, added
//!   as a learner, promoted once caught up), or, when that is refused,
//!   refuses to start and says how to rejoin the etcd way (MemberRemove,
//!   MemberAdd, start with `--initial-cluster-state existing`). If the
//!   members that answer have no leader, a majority may have lost its
//!   state: forming anew would drop acknowledged writes, so the member
//!   refuses, unless `--force-new-cluster` (`force.rs`) makes it a new
//!   one-member cluster.
//! * `--initial-cluster-state existing`: the member was added by MemberAdd.
//!   It asks the running members for its ID (found by its peer URLs), the
//!   cluster ID and the membership the log starts from ([`join`]), starts
//!   Raft with them, and replays the leader's log.

use crate::cluster::lifecycle::rejoin::{self, Refused};
use crate::cluster::lifecycle::resume::Waited;
use crate::cluster::log::input::Progress;
use crate::cluster::member::applied_membership::Boot;
use crate::cluster::member::saved_state::Saved;
use crate::cluster::node::raft_node::Node;
use crate::cluster::replicated::member_list::{MemberInfo, Membership};
use crate::config::ClusterConfig;
use crate::error::Error;
use crate::mvcc::Store;
use crate::proto::ephd::internal::{
    membership_client::MembershipClient,
    membership_server::{Membership as MembershipRpc, MembershipServer},
    FetchSavedRequest, JoinRequest, JoinResponse, ProbeRequest, ProbeResponse, PromoteRequest,
    PromoteResponse, RejoinRequest,
};
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};

/// How long one call to another member may take while starting.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a joining member keeps asking the running members.
const JOIN_PATIENCE: Duration = Duration::from_secs(20);

/// Why a member does not start (yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotStarted {
    /// What the other members answer forbids starting now: none has a
    /// leader and a majority may have lost its state, or they wait to
    /// resume from saved state this member cannot join. That changes when
    /// members return, so the server holds its start (saying why on
    /// `/health` and `/metrics`) and asks again.
    Held(String),
    /// Starting is wrong whatever the others answer (a removed ID, a
    /// forced cluster beside a working one, a failed join): the process
    /// ends.
    Refused(String),
}

impl NotStarted {
    /// The line that says why, and what to do.
    pub fn reason(&self) -> &str {
        match self {
            NotStarted::Held(why) | NotStarted::Refused(why) => why,
        }
    }
}

/// What this member starts its Raft node with: found alone from
/// `--initial-cluster` for a new cluster (after checking that no running
/// cluster knows this ID), or from the running members when joining.
/// `saved`: this member's state from `--data-dir` (`saved_state.rs`), used by
/// `--force-new-cluster` (with `forced_tail`, the committed entries its
/// Raft log holds after it, `restart::forced_tail`) and by the seed of a whole-cluster resume, which
/// replaces it with a newer one it fetched from a waiting member
/// (`newest_saved_state.rs`); otherwise it makes a member that would form the cluster
/// anew refuse (the cluster ran before).
pub async fn bootstrap(
    config: &ClusterConfig,
    client_urls: Vec<String>,
    saved_state: &mut Option<Saved>,
    forced_tail: &[raft::prelude::Entry],
) -> Result<Boot, NotStarted> {
    use NotStarted::{Held, Refused};
    let saved = saved_state.as_ref();
    let initial = Membership::initial(config);
    if config.existing {
        return join(config, client_urls).await.map_err(Refused);
    }
    let id = config.member_id();
    let mut answers = probe(config, id).await;
    if config.force_new_cluster {
        return crate::cluster::node::force::boot(
            config,
            client_urls,
            initial,
            &answers,
            (saved, forced_tail),
        )
        .map_err(Refused);
    }
    // Holding saved state while no member leads: the whole cluster may be
    // coming back; wait for it to resume (`resume.rs`).
    if let Some(s) = saved.filter(|_| answers.iter().all(|(_, r)| r.leader == 0)) {
        let (waited, last) =
            crate::cluster::lifecycle::resume::wait(config, s, || probe(config, id)).await;
        answers = last;
        match waited {
            Waited::Resume(None) => {
                return crate::cluster::node::force::resume(
                    config,
                    client_urls,
                    initial,
                    &answers,
                    s,
                )
                .map_err(Refused)
            }
            Waited::Resume(Some(newer)) => {
                let boot = crate::cluster::node::force::resume(
                    config,
                    client_urls,
                    initial,
                    &answers,
                    &newer,
                );
                *saved_state = Some(*newer);
                return boot.map_err(Refused);
            }
            Waited::Running => {}
            Waited::GaveUp(failed) => {
                return Err(Held(format!(
                    "no member answered with a leader within {:?} while this member holds a \
                     saved state of the cluster (token {:?}){}. {}",
                    crate::cluster::lifecycle::resume::PATIENCE,
                    config.token,
                    match (crate::cluster::lifecycle::resume::is_seed(config), failed) {
                        (true, Some(why)) => format!(
                            ", and the newer saved state of a waiting member could not be \
                             fetched ({why})"
                        ),
                        (true, None) => {
                            ", and fewer than a majority of the members wait to resume".into()
                        }
                        (false, _) => String::new(),
                    },
                    resume_way(s)
                )))
            }
        }
    }
    if saved.is_none() {
        answers = wait_for_election(config, id, answers).await;
    }
    let start = check_restart(config, id, &answers).map_err(|e| match (e, saved) {
        // The refusal of a majority restarted without state: with saved
        // state the way out is a resume, not an empty forced cluster.
        (Held(e), Some(s)) if e.contains("--force-new-cluster") => Held(format!(
            "this member ran in the cluster with token {:?} before and no member that \
             answers has a leader ({}): a majority may have lost its raft state, and forming \
             the cluster anew could lose acknowledged writes, so ephd refuses to start. {}",
            config.token,
            crate::cluster::node::force::holdings(&answers),
            resume_way(s)
        )),
        (e, _) => e,
    })?;
    if let Some(s) = saved {
        if matches!(start, Start::New) {
            return Err(Held(format!(
                "no member that answers has a leader, and this member holds a saved state of \
                 the cluster (token {:?}) in --data-dir: the cluster ran before. Forming it \
                 anew would start empty and drop that state, so ephd refuses to start. {}",
                config.token,
                resume_way(s)
            )));
        }
        tracing::info!(
            saved = %s.describe(),
            "the cluster runs: this member catches up from it; its saved state is not used"
        );
    }
    match start {
        Start::New => {}
        Start::Rejoin { old, refusal } => {
            return rejoin_patiently(config, (old, refusal), answers, client_urls).await
        }
        Start::Join => return start_as_added(config, client_urls).await.map_err(Refused),
    }
    Ok(Boot {
        id,
        cluster_id: config.cluster_id(),
        current: initial.clone(),
        initial,
        name: config.name.clone(),
        client_urls,
        promote: false,
        resume: None,
        log: None,
    })
}

/// How many election timeouts a restarted member waits for survivors that
/// answer without a leader to elect one, before it takes them for a
/// minority that lost its majority.
const ELECTIONS_AWAITED: u32 = 10;

/// Survivors that know this member ran but answer without a leader are
/// most likely electing (this member led them and came back within an
/// election timeout): probes again, for at most [`ELECTIONS_AWAITED`]
/// election timeouts, until one answers with a leader. Returns the last
/// answers.
async fn wait_for_election(
    config: &ClusterConfig,
    id: u64,
    mut answers: Vec<(String, ProbeResponse)>,
) -> Vec<(String, ProbeResponse)> {
    let electing = |answers: &[(String, ProbeResponse)]| {
        answers
            .iter()
            .any(|(_, r)| r.asker_started || r.urls_member_started)
            && answers.iter().all(|(_, r)| r.leader == 0)
    };
    if !electing(&answers) {
        return answers;
    }
    tracing::info!("the members that answer have no leader yet; waiting for their election");
    let deadline = tokio::time::Instant::now() + ELECTIONS_AWAITED * config.election;
    let pause = (config.election / 4).max(Duration::from_millis(50));
    while electing(&answers) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(pause).await;
        answers = probe(config, id).await;
    }
    answers
}

/// Added (by MemberAdd or an earlier rejoin) and not started yet: starts
/// as that member; a learner promotes itself once caught up, as after a
/// rejoin.
async fn start_as_added(config: &ClusterConfig, client_urls: Vec<String>) -> Result<Boot, String> {
    let mut boot = join(config, client_urls).await?;
    boot.promote = boot.current.get(boot.id).is_some_and(|m| m.is_learner);
    Ok(boot)
}

/// Rejoins under a new ID (`rejoin.rs`), asking again while the cluster is
/// in a state that passes by itself, for at most [`rejoin::PATIENCE`]
/// (each reason logged once). Before each new attempt it probes the
/// others and decides again, so what an attempt that timed out did is
/// seen rather than repeated: a finished addition is started as, and a
/// removal of the old ID without the addition is completed by the
/// addition alone. Survivors without a leader, or no answers at all, are
/// waited out: this member knows it ran, so it never forms a cluster anew
/// from such answers.
async fn rejoin_patiently(
    config: &ClusterConfig,
    (mut old, mut refusal): (u64, String),
    mut answers: Vec<(String, ProbeResponse)>,
    client_urls: Vec<String>,
) -> Result<Boot, NotStarted> {
    let id = config.member_id();
    let deadline = tokio::time::Instant::now() + rejoin::PATIENCE;
    let pause = (config.election / 4).max(Duration::from_millis(50));
    let mut said = std::collections::HashSet::new();
    let mut sent = false;
    let mut removed_already = false;
    let mut why;
    loop {
        match rejoin::rejoin(config, old, &answers, client_urls.clone(), removed_already).await {
            Ok(boot) => return Ok(boot),
            Err(Refused::Final(why)) => {
                return Err(NotStarted::Refused(format!(
                    "{refusal} (the automatic rejoin failed: {why})"
                )))
            }
            Err(Refused::Transient { why: w, sent: s }) => {
                sent |= s;
                if said.insert(w.clone()) {
                    tracing::info!(reason = %w, "rejoin not possible yet; asking again");
                }
                why = w;
            }
        }
        // Probe and decide again, until there is something to try.
        loop {
            if tokio::time::Instant::now() >= deadline {
                return Err(NotStarted::Held(format!(
                    "{refusal} (the automatic rejoin did not finish within {:?}: {why})",
                    rejoin::PATIENCE
                )));
            }
            tokio::time::sleep(pause).await;
            answers = probe(config, id).await;
            let removed_by_us = sent
                && answers.iter().any(|(_, r)| r.asker_removed)
                && answers.iter().all(|(_, r)| r.urls_member == 0);
            match check_restart(config, id, &answers) {
                Ok(Start::Rejoin { old: o, refusal: r }) => {
                    (old, refusal, removed_already) = (o, r, false);
                    break;
                }
                Ok(Start::Join) => {
                    return start_as_added(config, client_urls)
                        .await
                        .map_err(NotStarted::Refused)
                }
                Err(_) if removed_by_us && answers.iter().any(|(_, r)| r.leader != 0) => {
                    removed_already = true;
                    break;
                }
                Err(e) if answers.iter().any(|(_, r)| r.leader != 0) => return Err(e),
                Ok(Start::New) | Err(_) => {
                    let w = "no member that answers has a leader".to_string();
                    if said.insert(w.clone()) {
                        tracing::info!(reason = %w, "rejoin not possible yet; asking again");
                    }
                    why = w;
                }
            }
        }
    }
}

/// The peer URLs of every other member `--initial-cluster` names.
fn others(config: &ClusterConfig) -> Vec<String> {
    config
        .members
        .iter()
        .filter(|m| m.name != config.name)
        .filter_map(|m| m.peer_urls.first().cloned())
        .collect()
}

/// A membership client of `url`, for a call made while `config`'s member
/// starts.
async fn client(
    config: &ClusterConfig,
    url: &str,
) -> Option<MembershipClient<tonic::transport::Channel>> {
    let channel = crate::cluster::transport::peers::connect_at_start(config, url, ASK_TIMEOUT)
        .await
        .ok()?;
    Some(MembershipClient::new(channel))
}

/// What the other members `--initial-cluster` names say about this
/// member and their cluster, by peer URL (those of the same token only;
/// members that do not answer are left out).
async fn probe(config: &ClusterConfig, id: u64) -> Vec<(String, ProbeResponse)> {
    let asks = others(config).into_iter().map(|url| async move {
        let mut c = client(config, &url).await?;
        let req = ProbeRequest {
            token: config.token.clone(),
            member_id: id,
            peer_urls: config.advertise_peer_urls.clone(),
        };
        let mut req = Request::new(req);
        req.set_timeout(ASK_TIMEOUT);
        let r = c.probe(req).await.ok()?.into_inner();
        Some((url, r))
    });
    futures::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .filter(|(url, r)| {
            let same = r.token == config.token;
            if !same {
                // Another cluster on a URL --initial-cluster names: its
                // answers do not count, but the operator should know.
                tracing::warn!(
                    peer = %url,
                    token = %r.token,
                    ours = %config.token,
                    "a member named in --initial-cluster answers with another \
                     --initial-cluster-token: it belongs to another cluster and is ignored"
                );
            }
            same
        })
        .collect()
}

/// How a member started with `--initial-cluster-state new` starts, after
/// probing the others.
enum Start {
    /// As a member of the initial cluster (a first start).
    New,
    /// It ran as `old` and restarted without state: rejoin under a new ID
    /// (`rejoin.rs`); `refusal` says the etcd way if that fails.
    Rejoin { old: u64, refusal: String },
    /// Its peer URLs belong to a member added but not started yet (by
    /// MemberAdd, or an earlier rejoin it did not finish): start as it.
    Join,
}

/// The answer whose member list is the newest: the leader's own, else that
/// of the running member with the highest committed index (the first of
/// equals). Members waiting to resume run no Raft node and hold no list.
fn newest_membership(answers: &[(String, ProbeResponse)]) -> Option<&(String, ProbeResponse)> {
    let running = || answers.iter().filter(|(_, r)| !r.resuming);
    running()
        .find(|(_, r)| r.leader != 0 && r.member_id == r.leader)
        // `max_by_key` keeps the last of equals: reversed, the first.
        .or_else(|| running().rev().max_by_key(|(_, r)| r.committed))
}

/// Decides how this member starts from what the others say, or refuses:
/// when this ID was removed, or when it has already run (it would vote
/// and acknowledge again with an empty log) while no answering member has
/// a leader (a majority may have lost its state).
fn check_restart(
    config: &ClusterConfig,
    id: u64,
    answers: &[(String, ProbeResponse)],
) -> Result<Start, NotStarted> {
    let hex = format!("{id:x}");
    // When a member answering has a leader, the working cluster's members
    // speak for it (an old member cut off from it, or left over after
    // --force-new-cluster, may be out of date).
    let leader = answers.iter().map(|(_, r)| r.leader).find(|l| *l != 0);
    let answers: Vec<(String, ProbeResponse)> = answers
        .iter()
        .filter(|(_, r)| leader.is_none_or(|l| r.leader == l))
        .cloned()
        .collect();
    // The member that holds this member's peer URLs now: its
    // --initial-cluster ID, or one MemberAdd or an earlier rejoin gave.
    // Asked by the newest membership that answers (the leader's, else the
    // running member furthest along): a follower that has not applied a
    // removal yet would still name a member the operator just removed.
    let by_urls = newest_membership(&answers).filter(|(_, r)| r.urls_member != 0);
    let ran = match by_urls {
        Some((url, r)) if r.urls_member_started => Some((url, r.urls_member)),
        Some((_, r)) if r.urls_member != id => return Ok(Start::Join),
        _ => {
            if let Some((url, _)) = answers.iter().find(|(_, r)| r.asker_removed) {
                return Err(NotStarted::Refused(format!(
                    "member {hex} was removed from the cluster (as the member at {url} \
                     says): a removed ID never joins again. Add this member anew with \
                     MemberAdd and start it with --initial-cluster-state existing"
                )));
            }
            answers
                .iter()
                .find(|(_, r)| r.asker_started)
                .map(|(url, _)| (url, id))
        }
    };
    if let (Some((url, old)), true) = (ran, leader.is_some()) {
        let refusal = etcd_way(config, old, url);
        return Ok(Start::Rejoin { old, refusal });
    }
    let Some((url, old)) = ran else {
        // Members wait to resume saved state (`resume.rs`) and this one holds
        // none: forming the cluster anew would start it empty beside them.
        if let Some((url, r)) = answers.iter().find(|(_, r)| r.resuming) {
            return Err(NotStarted::Held(format!(
                "the member at {url} (member {:x}) waits to resume its saved state (revision {}), \
                 but this member holds none (no --data-dir, or its file is gone): the cluster \
                 resumes through the first member of --initial-cluster, from the newest saved \
                 state among the waiting members. Start that member with its --data-dir, or \
                 start the member whose saved state has the highest raft index alone with \
                 --force-new-cluster, then start this one again",
                r.member_id, r.revision
            )));
        }
        return Ok(Start::New);
    };
    Err(NotStarted::Held(format!(
        "member {old:x} ({}) has already run in the cluster with token {:?} (as the member at \
         {url} says) and this process starts without its raft state, while no member that \
         answers has a leader: a majority of the cluster may have lost its state. Forming \
         the cluster again could lose acknowledged writes that only the running members \
         hold ({}), so ephd refuses to start. If those members cannot elect a leader again, \
         start ONE member with --force-new-cluster: it becomes a new one-member cluster \
         (same cluster ID and member ID, every other member removed) that starts empty, \
         since this process holds no data: every write of the old cluster is lost, those \
         members' included. Then stop the old cluster's members that still run, and add \
         each back (`etcdctl member add`, then start it with --initial-cluster-state \
         existing)",
        config.name,
        config.token,
        crate::cluster::node::force::holdings(&answers),
    )))
}

/// How a whole cluster resumes from saved state, said to a member that
/// refuses to start while holding `saved`.
fn resume_way(saved: &Saved) -> String {
    format!(
        "This member's saved state: {}. A whole cluster resumes by itself when every \
         member is started with its --data-dir: the first member of --initial-cluster \
         resumes, from the newest saved state among the waiting members, once a majority \
         waits; the others rejoin it. To resume from a chosen member's state instead (the \
         one with the highest raft index: every member's refusal says its own), start that \
         member alone with --force-new-cluster: it \
         becomes a one-member cluster holding that state (revisions continue above every \
         earlier one with --revision-continuity); then add each other member back \
         (`etcdctl member add`) and start it with --initial-cluster-state existing. Writes \
         after that state was saved that its raft log (--wal) does not hold committed, and \
         what only the other members' files hold, are lost. To start an empty cluster \
         instead, remove the file",
        saved.describe()
    )
}

/// Why a member that ran as `old` must not start under it, and the etcd
/// way to rejoin (said when the automatic rejoin fails).
fn etcd_way(config: &ClusterConfig, old: u64, url: &str) -> String {
    format!(
        "member {old:x} ({}) has already run in the cluster with token {:?} (as the member at \
         {url} says), and this process starts without its raft state: it must not vote or \
         acknowledge under its old ID. Rejoin the etcd way: `etcdctl member remove {old:x}`, \
         `etcdctl member add {} --peer-urls={}`, then start this member with \
         --initial-cluster-state existing",
        config.name,
        config.token,
        config.name,
        config.advertise_peer_urls.join(","),
    )
}

/// Asks the running members (those `--initial-cluster` names) what this
/// member, added by MemberAdd, starts with.
async fn join(config: &ClusterConfig, client_urls: Vec<String>) -> Result<Boot, String> {
    let deadline = tokio::time::Instant::now() + JOIN_PATIENCE;
    let mut last = String::from("no member answered");
    loop {
        let mut refused = None;
        for url in others(config) {
            let Some(mut c) = client(config, &url).await else {
                last = format!("{url}: not reachable");
                continue;
            };
            let mut req = Request::new(JoinRequest {
                token: config.token.clone(),
                peer_urls: config.advertise_peer_urls.clone(),
            });
            req.set_timeout(ASK_TIMEOUT);
            match c.join(req).await {
                Ok(r) => {
                    let r = r.into_inner();
                    tracing::info!(
                        member_id = %format_args!("{:x}", r.member_id),
                        from = %url,
                        "joining a running cluster"
                    );
                    return Ok(Boot::joined(r, config.name.clone(), client_urls, false));
                }
                // A clear refusal (a member removed since, and still
                // running, may be out of date: ask the others too).
                Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                    refused = Some(format!("{url}: {}", s.message()));
                }
                Err(s) => last = format!("{url}: {}", s.message()),
            }
        }
        if let Some(why) = refused {
            return Err(format!("cannot join the cluster: {why}"));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "cannot join the cluster (--initial-cluster-state existing): {last}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// MemberPromote on a follower: the leader decides.
pub(in crate::cluster) async fn forward_promote(
    node: &Node,
    id: u64,
) -> crate::error::Result<Membership> {
    let leader = node.status().leader().ok_or(Error::NoLeader)?;
    let url = node
        .membership()
        .get(leader)
        .and_then(|m| m.peer_urls.first().cloned())
        .ok_or(Error::NoLeader)?;
    let channel = node
        .peer_settings()
        .dialer
        .connect(&url, ASK_TIMEOUT)
        .await
        .map_err(|_| Error::NoLeader)?;
    let mut c = MembershipClient::new(channel);
    let mut req = Request::new(PromoteRequest { member_id: id });
    // The leader waits up to its request timeout for the change to apply.
    req.set_timeout(node.request_timeout() + ASK_TIMEOUT);
    match c.promote(req).await {
        Ok(r) => Ok(Membership::from_state(
            r.into_inner().current.unwrap_or_default(),
        )),
        Err(s) => Err(error_of(&s)),
    }
}

/// The error a forwarded call answered with.
fn error_of(s: &Status) -> Error {
    [
        Error::MemberNotFound,
        Error::MemberNotLearner,
        Error::LearnerNotReady,
        Error::MemberNotEnoughStarted,
        Error::NoLeader,
        Error::Timeout,
        Error::Stopped,
    ]
    .into_iter()
    .find(|e| e.message() == s.message())
    .unwrap_or(Error::Timeout)
}

/// The peer service answering starting members and forwarded promotions.
pub struct MembershipService {
    node: Arc<Node>,
    store: Arc<Store>,
}

/// The peer service for `node` (whose store is `store`), to serve on the
/// peer listener.
pub fn membership_service(
    node: &Arc<Node>,
    store: &Arc<Store>,
) -> MembershipServer<MembershipService> {
    MembershipServer::new(MembershipService {
        node: node.clone(),
        store: store.clone(),
    })
}

impl MembershipService {
    /// Whether member `id` has run in this cluster as a voter: it
    /// published itself, its raft messages reached this member
    /// (`heard_from.rs`), or (on the leader) the leader has replicated entries to
    /// it. A learner may start again without its state: it never votes and
    /// its log never counts for a commit.
    async fn has_run(&self, id: u64, m: &Membership) -> bool {
        if m.get(id).is_some_and(|x| x.is_learner) {
            return false;
        }
        if m.get(id).is_some_and(MemberInfo::has_published) || self.node.seen.contains(id) {
            return true;
        }
        let progress: Option<Progress> = self.node.progress().await.ok().flatten();
        progress.is_some_and(|p| p.matched.get(&id).is_some_and(|i| *i > 0))
    }

    fn check_token(&self, token: &str) -> Result<(), Status> {
        let ours = &self.node.members().token;
        if token == ours {
            Ok(())
        } else {
            Err(Status::failed_precondition(format!(
                "--initial-cluster-token {token:?} is not this cluster's ({ours:?})"
            )))
        }
    }
}

#[tonic::async_trait]
impl MembershipRpc for MembershipService {
    async fn probe(&self, req: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        let req = req.into_inner();
        let m = self.node.membership();
        let status = self.node.status();
        let same = req.token == self.node.members().token;
        let urls_member = m
            .by_peer_urls(&req.peer_urls)
            .filter(|_| same)
            .map_or(0, |x| x.id);
        let urls_member_started = urls_member != 0 && self.has_run(urls_member, &m).await;
        let asker_started = same && self.has_run(req.member_id, &m).await;
        // The member this one follows as leader asks while starting: it
        // restarted without its state and leads no more.
        let leader = status.leader().unwrap_or(0);
        for restarted in [req.member_id, urls_member] {
            if restarted != 0 && restarted == leader && (asker_started || urls_member_started) {
                let _ = self
                    .node
                    .send(crate::cluster::log::input::Input::LeaderGone(leader));
            }
        }
        Ok(Response::new(ProbeResponse {
            token: self.node.members().token.clone(),
            cluster_id: self.node.cluster_id(),
            member_id: self.node.id(),
            leader,
            committed: status.committed(),
            asker_started,
            asker_removed: same && m.is_removed(req.member_id),
            term: status.term(),
            revision: self.store.current_revision(),
            urls_member,
            urls_member_started,
            resuming: false,
            ..Default::default()
        }))
    }

    type FetchSavedStream = crate::cluster::member::saved_state_pieces::Chunks;

    /// A running member holds its state in its Raft log, not a file to
    /// resume from.
    async fn fetch_saved(
        &self,
        _: Request<FetchSavedRequest>,
    ) -> Result<Response<Self::FetchSavedStream>, Status> {
        Err(Status::failed_precondition(
            "this member runs: its saved state is not served",
        ))
    }

    async fn join(&self, req: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        let req = req.into_inner();
        self.check_token(&req.token)?;
        let m = self.node.membership();
        let Some(member) = m.by_peer_urls(&req.peer_urls) else {
            return Err(Status::failed_precondition(format!(
                "no member has peer URLs {}: add it with MemberAdd first",
                req.peer_urls.join(",")
            )));
        };
        if self.has_run(member.id, &m).await {
            return Err(Status::failed_precondition(format!(
                "member {:x} with peer URLs {} has already run in this cluster and must not \
                 vote or acknowledge again without its state: remove it (MemberRemove), add \
                 it again (MemberAdd) and start it with --initial-cluster-state existing",
                member.id,
                req.peer_urls.join(",")
            )));
        }
        Ok(Response::new(JoinResponse {
            cluster_id: self.node.cluster_id(),
            member_id: member.id,
            initial: Some(self.node.members().initial.to_state()),
            current: Some(m.to_state()),
        }))
    }

    async fn rejoin(&self, req: Request<RejoinRequest>) -> Result<Response<JoinResponse>, Status> {
        let req = req.into_inner();
        self.check_token(&req.token)?;
        crate::cluster::lifecycle::rejoin::serve(&self.node, req)
            .await
            .map(Response::new)
    }

    async fn promote(
        &self,
        req: Request<PromoteRequest>,
    ) -> Result<Response<PromoteResponse>, Status> {
        let id = req.into_inner().member_id;
        let to_status = |e: Error| crate::grpc_status::status(e);
        let progress = self
            .node
            .progress()
            .await
            .map_err(to_status)?
            .ok_or_else(|| to_status(Error::NoLeader))?;
        let after = self
            .node
            .promote_as_leader(id, &progress)
            .await
            .map_err(to_status)?;
        Ok(Response::new(PromoteResponse {
            current: Some(after.to_state()),
        }))
    }
}

#[cfg(test)]
#[path = "join_tests.rs"]
mod tests;
