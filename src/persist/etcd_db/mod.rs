//! etcd's database format: the bbolt file `etcdctl snapshot save` writes
//! and an etcd data dir keeps as `member/snap/db`.
//!
//! Maintenance.Snapshot sends ephd's state in this format, so etcd's tools
//! (`etcdctl snapshot status`, `etcdutl snapshot restore`, backup tools that
//! verify etcd snapshots) take it and a stock etcd restored from it serves
//! the same keys, revisions, leases, users and roles; `--restore-snapshot`
//! reads it back, from ephd or from etcd 3.4 to 3.7. `--data-dir` keeps
//! ephd's own format (see `persist`).
//!
//! What is carried: every live key at its revision (ephd keeps no history
//! in a snapshot, so the file is compacted at the snapshot's revision and
//! an etcd restored from it starts at that revision), the leases with
//! their granted and remaining TTLs, and the auth state (users with their
//! bcrypt hashes, roles, the enabled flag and the auth revision). Tokens,
//! alarms and the member list are not carried: `etcdutl snapshot restore`
//! writes the members from its own flags, as it does for an etcd snapshot.

mod bbolt;
mod layout;
mod read;
#[cfg(test)]
mod tests;
mod write;

pub use layout::{has_bbolt_magic, SHA256_LEN, STORAGE_VERSION};
pub use read::{read, read_bytes};
pub use write::{write, Contents};
