//! ephd integration tests: a single test binary (`cargo test --test it`)
//! whose modules share the process harness in `harness`.
//!
//! Every test starts its own server processes on free loopback ports, so
//! tests run in parallel threads without interfering with each other.

mod auth;
mod auth_diff;
mod auth_persist;
mod auth_tls;
mod authority;
mod cli;
mod cluster;
mod cluster_catchup_load;
mod cluster_compaction;
mod cluster_data_dir;
mod cluster_force;
mod cluster_initial;
mod cluster_leader;
mod cluster_learner;
mod cluster_limits;
mod cluster_members;
mod cluster_move_leader;
mod cluster_rejoin;
mod cluster_removal;
mod cluster_replaced;
mod cluster_sections;
mod cluster_snapshot;
mod cluster_snapshot_chunks;
mod cluster_timeouts;
mod cluster_tls;
mod concurrency;
mod config;
mod deploy_cluster;
mod differential;
mod election;
mod embed;
mod etcd_cluster;
mod etcdctl;
mod exposure;
mod gateway;
mod go_client;
mod harness;
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
mod operations;
mod overload;
mod quota;
mod range_stream;
mod recipes_diff;
mod restart;
mod safety_net;
mod slow_watch;
mod smoke;
mod snapshot;
mod sorting;
mod support;
mod tls;
mod tls_rotation;
mod watch;
