//! The multi-version key-value store: one global revision, history per key,
//! Range/Put/DeleteRange/Txn/Compact with etcd's exact semantics.
//!
//! See [`Store`] for the concurrency design. Nothing here knows about gRPC.

mod gosort;
mod index;
mod log;
pub mod range;
mod store;
mod txn;
mod types;

pub use log::{EventLog, LoggedEvent};
pub use store::{Stats, Store, StoreConfig};
pub use types::*;
