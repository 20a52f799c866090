//! A whole cluster resumes from the NEWEST saved state among the members
//! waiting for it (`resume.rs`), not just the seed's own.
//!
//! Only the seed (the first member of `--initial-cluster`) ever starts the
//! resumed cluster: two members starting could make two clusters. But the
//! seed's file may be older than another waiting member's (the seed was
//! behind, stopped or crashed first, or files are written only every
//! `--snapshot-interval`). So once a majority waits, the seed compares
//! its own saved state with what each waiting member of the same cluster
//! (same token and cluster ID) reports in its probe answer, and when one
//! is newer it fetches that member's file (`saved_state_pieces.rs`), checks
//! it whole (`saved_state::read`), makes it its own (its older file kept as
//! `.prev`) and resumes from it exactly as from its own.
//!
//! Which state is newest ([`newer`]):
//! * A state whose member list holds an ID another state lists as
//!   removed is from before that removal, whatever its index: a removed ID
//!   never comes back, and every resume or `--force-new-cluster` removes
//!   the other members' IDs. This keeps a file left over from before an
//!   earlier resume (a member that rejoined and stopped before it saved
//!   again) from winning with an index of the old cluster.
//! * Among the others, the higher Raft index wins (the applied state of
//!   one log grows with the index); at the same index the higher term;
//!   at the same index and term (the same state, by Raft's log matching)
//!   the seed keeps its own, and between two others the earlier in
//!   `--initial-cluster`.
//!
//! A failed fetch leaves the seed waiting (it tries again next round): it
//! never resumes from a file that did not arrive whole and decode, and
//! never from its own older one while a waiting member holds a newer one.

use crate::cluster::member::saved_state::{self, Saved};
use crate::cluster::member::saved_state_pieces;
use crate::cluster::replicated::member_list::Membership;
use crate::config::ClusterConfig;
use crate::proto::ephd::internal::{
    membership_client::MembershipClient, FetchSavedRequest, ProbeResponse,
};
use std::path::Path;
use std::time::{Duration, Instant};
use tonic::Request;

/// How long connecting and the first answer may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// A saved state among those compared: the seed's own (`from` none) or a
/// waiting member's answer.
struct Held<'a> {
    index: u64,
    term: u64,
    members: Membership,
    from: Option<&'a (String, ProbeResponse)>,
}

/// The waiting member (by peer URL, with its answer) holding a saved
/// state newer than `own` by the rules of the module docs, or `None` when
/// the seed's own is the newest.
pub(in crate::cluster) fn newer<'a>(
    config: &ClusterConfig,
    own: &Saved,
    answers: &'a [(String, ProbeResponse)],
) -> Option<&'a (String, ProbeResponse)> {
    let cluster_id = config.cluster_id();
    let mut held = vec![Held {
        index: own.snapshot.raft_index,
        term: own.snapshot.raft_term,
        members: own.membership().unwrap_or_default(),
        from: None,
    }];
    // Waiting members of this cluster (an ephd that does not report its
    // saved index cannot be compared).
    held.extend(
        answers
            .iter()
            .filter(|(_, r)| r.resuming && r.cluster_id == cluster_id && r.saved_index > 0)
            .map(|a| Held {
                index: a.1.saved_index,
                term: a.1.saved_term,
                members: a
                    .1
                    .saved_membership
                    .clone()
                    .map(Membership::from_state)
                    .unwrap_or_default(),
                from: Some(a),
            }),
    );
    let before = |a: &Held, b: &Held| a.members.members().any(|m| b.members.is_removed(m.id));
    let mut best: Option<&Held> = None;
    for h in held.iter().filter(|h| !held.iter().any(|o| before(h, o))) {
        if best.is_none_or(|b| (h.index, h.term) > (b.index, b.term)) {
            best = Some(h);
        }
    }
    if best.is_none() {
        // Every state predates another: states of two clusters forced
        // apart. Nothing says which is newer; the seed keeps its own.
        tracing::warn!(
            own = %own.describe(),
            waiting = %describe_all(answers),
            "the saved states of the waiting members each predate another (members removed \
             in one are members in another): resuming from this member's own"
        );
    }
    best.and_then(|b| b.from)
}

/// What a waiting member's answer says its saved file holds.
pub(in crate::cluster) fn describe(url: &str, r: &ProbeResponse) -> String {
    format!(
        "member {:x} at {url}: revision {}, raft index {}, term {}, written at unix time {}, \
         {} bytes",
        r.member_id, r.revision, r.saved_index, r.saved_term, r.saved_written_unix, r.saved_bytes
    )
}

fn describe_all(answers: &[(String, ProbeResponse)]) -> String {
    let all: Vec<String> = answers
        .iter()
        .filter(|(_, r)| r.resuming)
        .map(|(url, r)| describe(url, r))
        .collect();
    all.join("; ")
}

/// Fetches the saved file of the waiting member `from` into the seed's
/// data directory (the directory of `own`), checks it, and installs it as
/// the seed's own file (the older one kept as `.prev`): the state to
/// resume from. On an error nothing is installed and the partial file is
/// removed. `first`: the first attempt, which is announced at WARN (later
/// ones at DEBUG; the caller tells of their failures).
pub(in crate::cluster) async fn adopt(
    config: &ClusterConfig,
    own: &Saved,
    from: &(String, ProbeResponse),
    first: bool,
) -> Result<Saved, String> {
    let (url, r) = from;
    let dir = own
        .path
        .parent()
        .ok_or_else(|| format!("{} has no directory", own.path.display()))?
        .to_path_buf();
    let cluster_id = config.cluster_id();
    let tmp = dir.join(format!("{}.fetched", saved_state::file_name(cluster_id)));
    if first {
        tracing::warn!(
            own = %own.describe(),
            newer = %describe(url, r),
            "a waiting member holds a newer saved state than this member (the seed): fetching \
             it to resume the cluster from it"
        );
    } else {
        tracing::debug!(newer = %describe(url, r), "fetching the newer saved state again");
    }
    let started = Instant::now();
    let fetched = match fetch(config, url, r, &tmp).await {
        Ok(bytes) => check(r, &tmp).await.map(|s| (s, bytes)),
        Err(e) => Err(e),
    };
    let (mut fetched, bytes) = match fetched {
        Ok(f) => f,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    let installed =
        tokio::task::spawn_blocking(move || saved_state::install(&dir, cluster_id, &tmp))
            .await
            .map_err(|e| format!("the file installer failed: {e}"))?
            .map_err(|e| format!("cannot install the fetched saved state: {e}"))?;
    fetched.path = installed;
    if r.saved_written_unix != 0 {
        fetched.written_unix = r.saved_written_unix;
    }
    tracing::warn!(
        resuming_from = %fetched.describe(),
        fetched_from = %url,
        bytes,
        took_ms = started.elapsed().as_millis() as u64,
        own_kept_as = %format!("{}.prev", saved_state::file_name(cluster_id)),
        "fetched and checked the newer saved state; the cluster resumes from it"
    );
    Ok(fetched)
}

/// Streams `url`'s saved file into `tmp`; its size.
async fn fetch(
    config: &ClusterConfig,
    url: &str,
    r: &ProbeResponse,
    tmp: &Path,
) -> Result<u64, String> {
    let channel =
        crate::cluster::transport::peers::connect_at_start(config, url, ASK_TIMEOUT).await?;
    let mut client =
        MembershipClient::new(channel).max_decoding_message_size(saved_state_pieces::MAX_MESSAGE);
    let req = Request::new(FetchSavedRequest {
        token: config.token.clone(),
        cluster_id: config.cluster_id(),
        raft_index: r.saved_index,
        raft_term: r.saved_term,
    });
    // No deadline for the whole call: the file may be large; the receiver
    // gives up when a piece does not come.
    let chunks = tokio::time::timeout(ASK_TIMEOUT, client.fetch_saved(req))
        .await
        .map_err(|_| format!("{url} did not answer within {ASK_TIMEOUT:?}"))?
        .map_err(|s| format!("{url} refused: {}", s.message()))?
        .into_inner();
    saved_state_pieces::receive(chunks, tmp, r.saved_bytes)
        .await
        .map_err(|e| format!("fetching from {url}: {e}"))
}

/// Decodes the file fetched into `tmp` whole (`saved_state::read`: every
/// checksum) and checks it holds the state `r` announced.
async fn check(r: &ProbeResponse, tmp: &Path) -> Result<Saved, String> {
    let path = tmp.to_path_buf();
    let s = tokio::task::spawn_blocking(move || saved_state::read(&path))
        .await
        .map_err(|e| format!("the file reader failed: {e}"))??;
    let (index, term) = (s.snapshot.raft_index, s.snapshot.raft_term);
    if (index, term) != (r.saved_index, r.saved_term) {
        return Err(format!(
            "the fetched file holds raft index {index}, term {term}, not the index {} and \
             term {} its member announced",
            r.saved_index, r.saved_term
        ));
    }
    Ok(s)
}

#[cfg(test)]
#[path = "newest_saved_state_tests.rs"]
mod tests;
