//! The state a Raft snapshot carries beside the store, as its sections
//! (`mvcc::snapshot::Sections`): the member list (names and URLs; Raft's
//! own configuration travels in the snapshot's metadata) and the auth
//! state (users, roles, enabled flag, auth revision, live tokens). Both
//! change only by applying log entries, so a member that catches up by
//! snapshot needs them exactly as they were at the snapshot's index: with
//! an older member list it would connect to the wrong peers and answer
//! MemberList differently; with an older auth state it would decide
//! authorized entries differently from the others.

use crate::auth::AuthImage;
use crate::cluster::log::input::Input;
use crate::cluster::log::queue::Sender;
use crate::cluster::member::applied_membership::{self, Members};
use crate::cluster::replicated::member_list::Membership;
use crate::mvcc::snapshot::Sections;
use crate::mvcc::Store;

/// The sections at the apply thread's current index (taken on the apply
/// thread, with the store's image).
pub(in crate::cluster) fn capture(store: &Store, members: &Members) -> Sections {
    let auth = store.auth().image(true);
    Sections {
        members: Some(members.current.read().encode()),
        auth: (!auth.is_pristine()).then(|| auth.encode()),
    }
}

/// A received snapshot's sections, decoded before anything is installed
/// (a snapshot is installed whole or not at all).
pub(in crate::cluster) struct Decoded {
    /// `None`: a snapshot without the section (from an earlier release);
    /// the member list stays as it is.
    membership: Option<Membership>,
    /// No section: auth was never used on the leader, so the fresh state.
    auth: AuthImage,
}

/// Decodes the sections; an error says which one is damaged.
pub(in crate::cluster) fn decode(sections: &Sections) -> Result<Decoded, String> {
    let membership = sections
        .members
        .as_deref()
        .map(Membership::decode)
        .transpose()?;
    let auth = match sections.auth.as_deref() {
        Some(bytes) => AuthImage::decode(bytes)?,
        None => AuthImage::pristine(),
    };
    Ok(Decoded { membership, auth })
}

/// Installs decoded sections, right after the store's image (on the apply
/// thread, so no entry applies in between).
pub(in crate::cluster) fn install(
    decoded: Decoded,
    store: &Store,
    members: &Members,
    me: u64,
    inbox: &Sender<Input>,
) {
    store.auth().install(decoded.auth);
    if let Some(membership) = decoded.membership {
        applied_membership::install(members, me, inbox, membership);
    }
}
