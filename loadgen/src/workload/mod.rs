//! The workloads, one module each: what one client does per op (a
//! [`Worker`](crate::driver::Worker)), its setup, and what it adds to the
//! report. Everything they share (budget, progress, CPU sampling, client
//! tasks, the report's common fields) is in `crate::driver`.

mod churn;
mod expiry;
mod failover;
mod fanout;
mod heartbeat;
mod put;
mod range;
mod storm;

use crate::options::Common;
use crate::report::Report;
use clap::Subcommand;

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Workload {
    /// Plain Puts over a key space (etcd's `benchmark put` shape).
    Put(put::Args),
    /// Node Lease renewals: CAS Txn updates, with a checking prefix watch.
    LeaseHeartbeat(heartbeat::Args),
    /// Event creates with shared leases, with a checking prefix watch.
    EventChurn(churn::Args),
    /// Writes while a cluster's members die: clients with a short timeout
    /// that move to the next member on a failure; reports the gaps between
    /// acknowledged writes (bench/cluster.sh's failover run).
    Failover(failover::Args),
    /// A lease expiry storm: many leases with one key each, their deadlines
    /// within about a second, against a heartbeat writer; expiry rate and
    /// lateness, early expiries, the heartbeat's latency during the storm.
    LeaseExpiry(expiry::Args),
    /// Full-prefix lists of preloaded objects, optionally paginated.
    Range(range::Args),
    /// Many watchers on one prefix, fed by writers at a fixed or max rate.
    WatchFanout(fanout::Args),
    /// Storms of concurrent full lists of a ~10 MB prefix, against an
    /// open-loop heartbeat writer; server RSS over time.
    Storm(storm::Args),
    /// A fault soak: starts its own ephd, drives the Kubernetes write mix
    /// with checking watchers, injects faults (dropped clients, stalled
    /// watchers, malformed requests, lease-expiry bursts, compaction
    /// mid-watch, list storms, SIGKILL, damaged snapshots) and checks every
    /// acknowledged write and watch event.
    // Boxed: its options are several times the size of any other's.
    Soak(Box<crate::soak::Args>),
}

impl Workload {
    /// Runs the workload and returns its report.
    pub async fn run(&self, c: &Common) -> Result<Report, String> {
        match self {
            Workload::Put(a) => put::run(c, a).await,
            Workload::LeaseHeartbeat(a) => heartbeat::run(c, a).await,
            Workload::EventChurn(a) => churn::run(c, a).await,
            Workload::Failover(a) => failover::run(c, a).await,
            Workload::LeaseExpiry(a) => expiry::run(c, a).await,
            Workload::Range(a) => range::run(c, a).await,
            Workload::WatchFanout(a) => fanout::run(c, a).await,
            Workload::Storm(a) => storm::run(c, a).await,
            Workload::Soak(a) => crate::soak::run(c, a).await,
        }
    }
}
