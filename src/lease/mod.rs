//! Leases: grant, keep-alive, time-to-live, and the expiry timer.
//!
//! The [`Lessor`] owns every lease and the set of keys attached to it. It
//! knows nothing about revisions: revoking a lease (explicitly or on expiry)
//! is done by the store, which asks the lessor for the keys and deletes them
//! as one ordinary write. Refreshes are memory-only, which is what makes
//! keep-alives cheap.

mod lessor;

pub use lessor::{LeaseInfo, Lessor, LessorConfig, MAX_LEASE_TTL};
