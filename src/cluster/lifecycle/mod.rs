//! How a member starts, joins, changes and leaves the cluster: the start
//! (new or joining) and the membership service that answers starting
//! members (`join.rs`), a member restarted without state rejoining under a
//! new ID (`rejoin.rs`), a whole cluster resuming from saved state
//! (`resume.rs`), and the Cluster API's membership changes
//! (`reconfig.rs`).

pub(in crate::cluster) mod join;
pub(in crate::cluster) mod reconfig;
pub(in crate::cluster) mod rejoin;
pub mod resume;
