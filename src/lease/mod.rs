//! Leases: the lease table, its key attachments and its timers.
//!
//! The [`Lessor`] has two sides, kept apart on purpose:
//! * the **lease table** (IDs, TTLs, attached keys), changed only by the
//!   store's apply path. It is deterministic: IDs are chosen by the caller,
//!   and nothing in it reads a clock, so every member of a future cluster
//!   that applies the same entries holds the same table;
//! * the **timers** (each lease's deadline), driven by whoever owns the
//!   clock with an explicit `now`: arming new leases, keep-alive refreshes
//!   (memory-only, which is what makes them cheap) and finding expired
//!   leases. Expiry is a decision the caller turns into a revoke entry.
//!
//! The lessor knows nothing about revisions: revoking a lease is done by the
//! store, which asks the lessor for the keys and deletes them as one write.
//! Every lease rule clients see is served through the store's lease entry
//! point (`mvcc::Store::lease_*`).

mod lessor;

pub use lessor::{LeaseInfo, Lessor, LessorConfig, RestoredLease, MAX_LEASE_TTL};
