//! The multi-version key-value store: one global revision, history per key,
//! Range/Put/DeleteRange/Txn/Compact and leases with etcd's exact semantics.
//! Nothing here knows about gRPC.
//!
//! # Layers
//! Dependencies run one way, from the bottom up:
//! ```text
//! types, entry        plain request/response data; Entry/Applied
//! command             each client mutation typed: its entry and its answer
//! backend_size        a version's bytes in etcd's backend, for the quota
//! history             one key's versions: visibility, pruning
//! index               every key's history, ordered and hashed
//! log, sequencer      the change log; revisions allocated and published in order
//! stats               size and apply counters
//! validate, compare   stateless request checks; compares and branch paths
//! range, gosort       Range evaluation (filters, sort, limit) over a KvSource
//! page_counts         what the next page of a paged list has left to count
//! view, locks         the locked read view; the write lock plan and write view
//! store               the Store: its parts and who may touch them when
//! write, read,        the operations on a Store, one concern each
//!   compact, restore
//! apply               the one write path: every mutation is an Entry
//! journal, journaled  changes handed to a write-ahead log in replay order;
//!                     attaching one, replaying its records, the snapshot cut
//! alarms              NOSPACE/CORRUPT alarms and what they forbid
//! quota               the space quota, checked before applying or proposing
//! leases              every lease rule, through the apply path
//! image, initial      the whole state as data (cluster snapshots); the
//!                     cluster's initial-revision entry
//! ```
//! See [`Store`] (`store.rs`) for the concurrency design and `apply.rs` for
//! the write path a replicated log will call.

mod alarms;
mod apply;
mod authorize;
mod backend_size;
mod chunk;
mod command;
mod compact;
mod compare;
mod entry;
mod gosort;
mod history;
mod image;
mod index;
mod initial;
mod journal;
mod journaled;
mod leases;
mod limits;
mod locks;
mod log;
mod page_counts;
mod quota;
pub mod range;
mod read;
mod restore;
mod sequencer;
pub mod snapshot;
mod snapshot_records;
mod stats;
mod store;
mod store_limits;
mod types;
mod validate;
mod view;
mod write;

#[cfg(test)]
mod tests;

pub use alarms::{ALARM_CORRUPT, ALARM_NONE, ALARM_NOSPACE};
pub use chunk::{RangeChunk, KV_OVERHEAD};
pub use command::{AlarmChange, Command, Compaction, LeaseGrant, LeaseRevoke};
pub use entry::{Applied, Entry};
pub use image::{ImageLease, ImageVersion, StoreImage};
pub use initial::COMPACT_REV_KEY;
pub use journal::{Change, Journal, ReplayError, Replayed};
pub use journaled::SnapshotCut;
pub use leases::IdDraws;
pub use limits::Limits;
pub use log::{EventLog, LoggedEvent};
pub use quota::{space_cost, Space};
pub use stats::Stats;
pub use store::{Store, StoreConfig};
pub use types::*;
pub use validate::check_request;
