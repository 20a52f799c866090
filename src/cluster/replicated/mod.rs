//! State every member applies alike from the log: the member list
//! (`member_list.rs`, replicated by conf change entries) and what a member
//! does when that list says it was removed (`removal.rs`). Imports only
//! `log`.

pub mod member_list;
pub(in crate::cluster) mod removal;
