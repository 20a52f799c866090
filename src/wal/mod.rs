//! The write-ahead log (`--wal`, in `--data-dir`/`wal/`): every change a
//! single member applies is written here before it is acknowledged, so a
//! process crash loses nothing acknowledged. A restart restores the newest
//! snapshot and replays the records after the position it covers, through
//! the store's apply path (`mvcc::journal`).
//!
//! # Modes
//! * `buffered` (the default with a data directory): each batch is handed
//!   to the kernel with `write()` before its writes are answered. It
//!   survives every crash of the process (the kernel holds the bytes), not
//!   a crash of the machine.
//! * `fsync`: each batch is also synced to the disk before its writes are
//!   answered, as etcd syncs its log: it survives power loss too.
//! * `none`: no log; a crash loses the writes since the last snapshot.
//!
//! Request workers never write: they append their record to a queue; the
//! log's own thread writes whatever has queued up as one batch (group
//! commit), then reports it durable, which publishes the batch's revisions.
//!
//! # Trust
//! A log is trusted when it can hold every acknowledged change: each
//! segment holding records after the snapshot, and the newest one, was
//! written in `fsync` mode or since this machine's boot (the kernel's boot
//! ID is in every segment's header), no segment is damaged or missing, and
//! replay reproduced every record's revision. From a trusted log the store
//! continues exactly where it stopped; otherwise it replays what there is
//! and revisions jump ahead as after a restart without a log, since
//! revisions a client saw may be gone.
//!
//! # A cluster member's log
//! A cluster member writes its Raft log instead (`raft_log.rs`): its
//! entries, hard state and installed snapshots, in the same segments,
//! under `raft-log-<cluster ID>/`, so it restarts under its own ID.
//!
//! # Files
//! Segments `<first position, 20 digits>.wal` (see `segment.rs`), a new one
//! at every start and whenever one reaches [`SEGMENT_BYTES`]. A segment
//! is removed once a snapshot that is no longer needed covers all of it.

mod raft_log;
mod recover;
mod segment;
mod writer;

pub use crate::config::WalMode;
pub use raft_log::{
    raft_log_dir, recover_raft_log, Identity, KeptSegment, RaftLog, RaftLogStart, RecoveredRaftLog,
};
pub use recover::{recover, Recovered};
pub use writer::{drop_covered, Release, Wal, WalMetrics, SEGMENT_BYTES};

/// This machine's boot ID, as the kernel gives it (empty where it does not).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The log's directory inside a data directory.
pub fn dir_in(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("wal")
}

#[cfg(test)]
mod raft_log_tests;
#[cfg(test)]
mod tests;
