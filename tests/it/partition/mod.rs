//! Real network partitions: cluster members in network namespaces of
//! their own, joined through a router namespace whose routing rules drop
//! packets between chosen members (`net.rs`); the same scenarios on stock
//! etcd and on ephd (`scenarios.rs`) under a Kubernetes-like workload with
//! a watch and leases (`workload.rs`). Needs root (it creates namespaces);
//! fails, never skips, without.

mod members;
mod net;
mod scenarios;
mod workload;
