//! ephd integration tests: a single test binary (`cargo test --test it`)
//! whose modules share the process harness in `harness`.
//!
//! Every test starts its own server processes on free loopback ports, so
//! tests run in parallel threads without interfering with each other.

mod authority;
mod cli;
mod cluster;
mod cluster_members;
mod concurrency;
mod config;
mod differential;
mod embed;
mod etcdctl;
mod exposure;
mod harness;
mod kubernetes;
mod kv;
mod layout;
mod lease;
mod limits;
mod logging;
mod maintenance;
mod metrics;
mod operations;
mod overload;
mod quota;
mod restart;
mod safety_net;
mod slow_watch;
mod smoke;
mod sorting;
mod support;
mod tls;
mod tls_rotation;
mod watch;
