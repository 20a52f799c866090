//! ephd driven exactly as kube-apiserver 1.30–1.35 drives the servers of
//! `--etcd-servers-overrides` for Events and coordination.k8s.io Leases
//! (the contract: /work/shared/design/k8s-etcd-contract.md).
//!
//! `apiserver` builds every request by hand on the raw tonic clients; the
//! other modules are the traffic: node-lease heartbeats through a watch
//! cache, events with leases and paginated lists, the compactor, and
//! connection-level serving (keepalive, stream counts, message sizes).
//! Restarts are in `crate::restart`.

pub mod apiserver;
mod compactor;
mod events;
mod node_leases;
mod serving;
