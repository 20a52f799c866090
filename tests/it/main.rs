//! ephd integration tests: a single test binary (`cargo test --test it`)
//! whose modules share the process harness in `harness`.
//!
//! Every test starts its own server processes on free loopback ports, so
//! tests run in parallel threads without interfering with each other.

mod auth;
mod auth_diff;
mod auth_jwt;
mod auth_persist;
mod auth_tls;
mod authority;
mod cli;
mod cluster;
mod concurrency;
mod config;
mod crl;
mod deploy_cluster;
mod differential;
mod election;
mod embed;
mod etcd_cluster;
mod etcd_snapshot;
mod etcdctl;
mod exposure;
mod gateway;
mod go_client;
mod harness;
mod incomplete_calls;
mod kube_apiserver;
mod kubernetes;
mod kv;
mod layout;
mod lease;
mod limits;
mod lincheck;
mod lock;
mod logging;
mod maintenance;
mod metrics;
mod migration;
mod operations;
mod overload;
mod partition;
mod quota;
mod range_stream;
mod recipes_diff;
mod references;
mod restart;
mod safety_net;
mod slow_watch;
mod smoke;
mod snapshot;
mod sorting;
mod storage_conformance;
mod support;
mod tls;
mod tls_ca_required;
mod tls_rotation;
mod watch;
mod watch_burst;
