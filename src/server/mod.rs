//! Wiring: the store, the gRPC services, listeners, TLS and graceful
//! shutdown. What happens before serving is in `bootstrap.rs`; the
//! background tasks (lease expiry, auto-compaction, snapshots) in `tasks.rs`.

mod accept;
mod bootstrap;
mod held;
mod initial;
mod limits;
mod listeners;
pub mod memory;
mod responder;
mod restore;
pub mod revisions;
mod tasks;

use bootstrap::{build_cluster_store, build_store};
use held::{start_when_allowed, HeldStart};
use listeners::{advertised, bind_all, Bound};
use memory::MemoryPlan;
use revisions::{guard_revisions, RevisionGuard};
pub use revisions::{start_revision, COMPACT_REV_KEY};
use tasks::{auto_compact, expire_leases, snapshot_loop, write_snapshot, CompactionPolicy};

use crate::api::{
    AuthService, ClusterService, ElectionService, GrpcGoLimits, KvService, LeaseService,
    LockService, MaintenanceService, Overload, SendPreEncoded, ServerInfo, Shared, WatchService,
};
use crate::backend::{Backend, ClusterMember, Mode, SingleMember};
use crate::cluster::PeerService;
use crate::config::{listen_addr, Config};
use crate::metrics::{grpc::GrpcMetricsLayer, Metrics};
use crate::mvcc::Store;
use crate::proto::ephd::internal::raft_transport_server::RaftTransportServer;
use crate::proto::etcdserverpb::{
    auth_server::AuthServer, cluster_server::ClusterServer, kv_server::KvServer,
    lease_server::LeaseServer, maintenance_server::MaintenanceServer, watch_server::WatchServer,
};
use crate::proto::v3electionpb::election_server::ElectionServer;
use crate::proto::v3lockpb::lock_server::LockServer;
use crate::tls;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// gRPC framing overhead etcd allows on top of `--max-request-bytes`.
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;
/// How long shutdown waits for in-flight requests.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A bound, not yet running server.
pub struct Server {
    shared: Shared,
    stop: watch::Sender<bool>,
    listeners: Vec<Bound>,
    http_listeners: Vec<Bound>,
    /// The https:// listeners' certificates, reloaded while serving.
    tls: Option<tls::Reloader>,
    /// Cluster mode: where peers' Raft messages arrive.
    peer_listeners: Vec<Bound>,
    /// Cluster mode with https:// peer URLs: the peer certificates,
    /// reloaded while serving like the client ones.
    peer_tls: Option<tls::Reloader>,
    config: Config,
    /// A single member's revision guard (cluster mode has none yet).
    guard: Option<RevisionGuard>,
    /// A single member's write-ahead log.
    wal: Option<Arc<crate::wal::Wal>>,
}

/// Starts the write-ahead log of `plan` and hands the store's changes to
/// it; first writes the snapshot its records will continue, when the start
/// changed the store outside the log.
async fn start_wal(
    store: &Arc<Store>,
    plan: bootstrap::WalPlan,
    data_dir: &std::path::Path,
) -> Result<Arc<crate::wal::Wal>, String> {
    let weak = Arc::downgrade(store);
    let wal = crate::wal::Wal::start(
        &plan.dir,
        plan.mode,
        plan.next_position,
        &crate::wal::boot_id(),
        Box::new(move |revision| {
            if let Some(store) = weak.upgrade() {
                store.journal_durable(revision);
            }
        }),
    )
    .map_err(|e| {
        format!(
            "cannot start the write-ahead log in {}: {e}",
            plan.dir.display()
        )
    })?;
    let wal = Arc::new(wal);
    store.attach_journal(wal.clone());
    if plan.snapshot_first {
        write_snapshot(store, data_dir).await?;
    }
    tracing::info!(
        dir = %plan.dir.display(),
        mode = %plan.mode,
        next_position = plan.next_position,
        "write-ahead log started"
    );
    Ok(wal)
}

/// How often the gRPC health service re-runs the readiness checks.
const READINESS_EVERY: Duration = Duration::from_secs(1);

/// Keeps the gRPC health status of the server (`""`) equal to `/readyz`'s
/// verdict, checked every [`READINESS_EVERY`], and NOT_SERVING from the
/// moment shutdown begins.
async fn mirror_readiness(health: tonic_health::server::HealthReporter, shared: Shared) {
    use tonic_health::ServingStatus::{NotServing, Serving};
    let mut stop = shared.stop.clone();
    let mut serving = true;
    loop {
        tokio::select! {
            _ = crate::api::stopped(&mut stop) => break,
            _ = tokio::time::sleep(READINESS_EVERY) => {}
        }
        let ready = crate::http::ready(&shared).await;
        if ready != serving {
            serving = ready;
            tracing::warn!(serving, "gRPC health status follows /readyz");
            health
                .set_service_status("", if ready { Serving } else { NotServing })
                .await;
        }
    }
    health.set_service_status("", NotServing).await;
}

/// Logs which mode the server runs in: the Kubernetes-safe default, or
/// exact-etcd mode with its warning about restarts.
fn log_mode(config: &Config) {
    if config.etcd_compat {
        tracing::info!(
            revision_continuity = config.revision_continuity,
            lease_adopt_unknown_ttl = config.lease_adopt_unknown_ttl,
            compaction_safety_net = ?config.compaction_safety_net,
            "mode: exact etcd (--etcd-compat)"
        );
        tracing::warn!(
            "exact-etcd mode: like a fresh etcd, a restart starts revisions over (at 1, or at the \
             last snapshot's revision with --data-dir) and loses what was not saved; never point \
             kube-apiserver at this server"
        );
    } else {
        tracing::info!(
            revision_continuity = config.revision_continuity,
            lease_adopt_unknown_ttl = config.lease_adopt_unknown_ttl,
            compaction_safety_net = ?config.compaction_safety_net,
            "mode: Kubernetes-safe (the default; --etcd-compat gives etcd's exact behaviour)"
        );
    }
}

/// How many large Ranges are built at once: all cores but one, so the async
/// workers that serve heartbeats and writes always have a core to run on.
fn list_builders() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get().saturating_sub(1))
        .unwrap_or(1)
        .max(1)
}

impl Server {
    /// Restores state, builds the store and binds every listen URL. Fails
    /// (without panicking) on bad URLs, ports in use, unreadable snapshots,
    /// or plaintext on a non-loopback address without
    /// `--allow-insecure-plaintext` ([`crate::config::check_client_exposure`]).
    pub async fn bind(mut config: Config) -> Result<Server, String> {
        // Before anything is restored or bound: a refused exposure must
        // leave no trace (README, "Container image").
        for warning in crate::config::check_client_exposure(&config)? {
            tracing::warn!("{warning}");
        }
        let memory = MemoryPlan::new(&config, memory::memory_limit());
        tracing::info!(
            limit_bytes = memory.limit.bytes,
            limit_from = memory.limit.source,
            quota_bytes = memory.space.quota_bytes.unwrap_or(-1),
            memory_bound_bytes = memory.space.memory_bound_bytes.unwrap_or(-1),
            response_bytes_in_flight = memory.response_bytes,
            "memory bounds"
        );
        log_mode(&config);
        let peer_settings = crate::cluster::PeerSettings {
            framed_lanes: config.peer_transport != "grpc",
            snapshot_chunk_bytes: config.snapshot_chunk_bytes as usize,
            snapshot_receive_limit: memory.peer_snapshot_bytes(),
            // Peer TLS for every member this one dials once it runs.
            dialer: crate::cluster::PeerDialer::load(
                config.cluster.as_ref().and_then(|c| c.peer_tls.as_ref()),
                config.tls_reload_interval,
            )?,
        };
        if config.cluster.is_some() && !peer_settings.framed_lanes {
            tracing::info!("EPHD_PEER_TRANSPORT=grpc: raft messages travel on gRPC streams only");
        }
        // TLS is set up before anything listens, so that SIGHUP reloads
        // certificates (instead of ending the process) from the moment a
        // client can connect.
        let wants_tls = config
            .listen_client_urls
            .iter()
            .filter(|u| !u.trim().is_empty())
            .any(|u| listen_addr(u).is_ok_and(|(_, tls)| tls));
        let tls = if wants_tls {
            let mut reloader = tls::Reloader::new(&config)?;
            reloader.listen_for_hangup();
            Some(reloader)
        } else {
            None
        };
        let listeners = bind_all(&config.listen_client_urls).await?;
        if config.advertise_client_urls.is_empty() {
            config.advertise_client_urls = advertised(&config.listen_client_urls, &listeners);
        }
        let http_listeners = bind_all(&config.listen_metrics_urls).await?;
        if http_listeners.iter().any(|b| b.tls) {
            return Err(
                "--listen-metrics-urls must be http:// (serve them on a private address)"
                    .to_string(),
            );
        }
        // Cluster mode: learn this member's ID (and check it may start)
        // from the other members first.
        let mut saved = bootstrap::load_saved(&config)?;
        let log_settings = bootstrap::raft_log_settings(&config);
        let mut earlier_log = None;
        let mut forced_tail = Vec::new();
        let member = match &config.cluster {
            Some(c) => {
                let restart = match &log_settings {
                    Some(settings) if c.force_new_cluster => {
                        forced_tail = crate::cluster::member::restart::forced_tail(
                            c,
                            settings,
                            saved.as_ref(),
                        )?;
                        None
                    }
                    Some(settings) => crate::cluster::member::restart::from_log(
                        c,
                        settings,
                        saved.as_ref(),
                        config.advertised_urls(),
                    )?,
                    None => None,
                };
                match restart {
                    Some(r) => {
                        earlier_log = Some(r.log);
                        Some(r.boot)
                    }
                    None => {
                        // Holding saved state: answer the others while waiting.
                        let responding = match &saved {
                            Some(s) if !c.force_new_cluster && !c.existing => Some(
                                responder::start(c, s, peer_settings.listener_protocol()).await?,
                            ),
                            _ => None,
                        };
                        let live_tls = tls.as_ref().map(tls::Reloader::live);
                        let start = (&mut saved, forced_tail.as_slice());
                        let boot = start_when_allowed(c, &config, start, |reason| {
                            HeldStart::serve(&listeners, &http_listeners, live_tls.clone(), reason)
                        });
                        let boot = boot.await;
                        if let Some(r) = responding {
                            r.stop().await;
                        }
                        Some(boot?)
                    }
                }
            }
            None => None,
        };
        let (store, guard, wal) = match &member {
            None => {
                let boot = build_store(&config, crate::persist::wall_clock_ms(), memory.space)?;
                let store = Arc::new(boot.store);
                let wal = match (boot.wal, &config.data_dir) {
                    (Some(plan), Some(data_dir)) => Some(start_wal(&store, plan, data_dir).await?),
                    _ => None,
                };
                (store, Some(boot.guard), wal)
            }
            Some(b) => {
                let store = build_cluster_store(&config, b.id, memory.space);
                let resumed = b.resume.is_some() || b.log.is_some();
                if resumed && (saved.is_some() || !forced_tail.is_empty()) {
                    // From its own log the member continues where it
                    // stopped; a resumed cluster's revisions jump (after a
                    // forced member replayed its log's committed entries).
                    let jump = config.revision_continuity && b.log.is_none();
                    bootstrap::resume_cluster_store(&store, saved, &forced_tail, jump)?;
                }
                (Arc::new(store), None, None)
            }
        };
        let mut info = ServerInfo::new(&config.name, config.advertised_urls());
        if let (Some(c), Some(b)) = (&config.cluster, &member) {
            info.member_id = b.id;
            info.cluster_id = b.cluster_id;
            info.peer_urls = c.advertise_peer_urls.clone();
        } else if !config.advertise_peer_urls.is_empty() {
            info.peer_urls = config.advertise_peer_urls.clone();
        }
        info.max_request_bytes = config.max_request_bytes;
        info.progress_notify_interval = if config.watch_progress_notify_interval.is_zero() {
            Duration::from_secs(600)
        } else {
            config.watch_progress_notify_interval
        };
        config.auto_compaction()?;
        let peer_tls = match config.cluster.as_ref().and_then(|c| c.peer_tls.as_ref()) {
            Some(peer) => {
                let mut reloader =
                    tls::Reloader::for_peers(peer, peer_settings.listener_protocol())?;
                reloader.listen_for_hangup();
                Some(reloader)
            }
            None => None,
        };
        let (peer_listeners, backend) = match (&config.cluster, member) {
            (Some(c), Some(boot)) => {
                let peers = bind_all(&c.listen_peer_urls).await?;
                // The server runs the limits replicator (`limits.rs`).
                let wait = crate::cluster::WritesWaitFor {
                    initial_revision: config.revision_continuity,
                    replicated_limits: true,
                };
                let disk = bootstrap::cluster_disk(&config, &boot, log_settings, earlier_log);
                let node = crate::cluster::start_node(
                    c,
                    store.clone(),
                    boot,
                    wait,
                    disk,
                    peer_settings.clone(),
                )?;
                (
                    peers,
                    Mode::Cluster(ClusterMember::new(store.clone(), node)),
                )
            }
            _ => {
                let single = SingleMember::new(store.clone(), info.member_info(), info.raft_term);
                (Vec::new(), Mode::Single(single))
            }
        };
        let (stop, stop_rx) = watch::channel(false);
        let metrics = Metrics::new();
        metrics.set_server_version(crate::api::ETCD_VERSION);
        metrics.set_server_id(info.member_id);
        metrics
            .grpc
            .warnings
            .set_slow(config.warning_apply_duration);
        metrics
            .quota_backend_bytes
            .set(memory.space.quota_bytes.unwrap_or(-1));
        metrics
            .memory_bound_bytes
            .set(memory.space.memory_bound_bytes.unwrap_or(-1));
        let wal_metrics = crate::wal::WalMetrics {
            sync_seconds: metrics.wal_fsync_seconds.clone(),
            written_bytes: metrics.wal_write_bytes.clone(),
        };
        if let Some(wal) = &wal {
            wal.report_to(wal_metrics.clone());
        }
        if let Some(node) = backend.cluster_node() {
            node.report_log_to(wal_metrics);
        }
        Ok(Server {
            shared: Shared {
                store,
                backend,
                info: Arc::new(info),
                metrics: Arc::new(metrics),
                overload: Arc::new(Overload::new(
                    list_builders(),
                    memory.response_bytes,
                    config.overload_queue_timeout,
                )),
                stop: stop_rx,
            },
            stop,
            listeners,
            http_listeners,
            peer_listeners,
            peer_tls,
            tls,
            config,
            guard,
            wal,
        })
    }

    /// The gRPC addresses actually bound (useful with port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners.iter().map(|b| b.addr).collect()
    }

    /// The HTTP (health/metrics) addresses actually bound.
    pub fn http_addrs(&self) -> Vec<SocketAddr> {
        self.http_listeners.iter().map(|b| b.addr).collect()
    }

    /// The store, for in-process tests and tools.
    pub fn store(&self) -> Arc<Store> {
        self.shared.store.clone()
    }

    /// Serves until `shutdown` completes; then ends open streams with
    /// Unavailable, lets in-flight requests finish (bounded), writes the
    /// final snapshot when `--data-dir` is set, and returns.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), String> {
        let stop_tx = self.stop;
        let stop_rx = self.shared.stop.clone();
        let handover = self.shared.backend.cluster_node().cloned();
        tokio::spawn(async move {
            // A member removed from the cluster stops as on a signal.
            match &handover {
                Some(node) => tokio::select! {
                    _ = shutdown => {}
                    _ = node.removed() => {}
                },
                None => shutdown.await,
            }
            // A leader hands over first, while it still serves its peers.
            if let Some(node) = handover {
                crate::cluster::node::leadership::hand_over(&node).await;
            }
            let _ = stop_tx.send(true);
        });
        let store = self.shared.store.clone();
        let expiry = tokio::spawn(expire_leases(self.shared.clone()));
        if self.config.revision_continuity {
            tokio::spawn(initial::propose_initial_revision(self.shared.clone()));
        }
        tokio::spawn(limits::replicate_limits(self.shared.clone()));
        // The safety net runs unless auto-compaction is configured or it is
        // set to 0; an exact-etcd mode would turn it off here.
        let policy = CompactionPolicy::from_flags(
            self.config.auto_compaction()?,
            self.config.compaction_safety_net,
        );
        let node = self.shared.backend.cluster_node().cloned();
        let compactor = policy.map(|policy| {
            tokio::spawn(auto_compact(
                store.clone(),
                policy,
                stop_rx.clone(),
                node.clone(),
            ))
        });
        let guard = self
            .guard
            .filter(RevisionGuard::needed)
            .map(|g| tokio::spawn(guard_revisions(store.clone(), g, stop_rx.clone())));
        let mut peer_servers = Vec::new();
        if let Some(node) = &node {
            let peer_live = self.peer_tls.map(|reloader| {
                let live = reloader.live();
                tokio::spawn(reloader.run(self.config.tls_reload_interval, stop_rx.clone()));
                live
            });
            for Bound {
                addr,
                listener,
                tls,
            } in self.peer_listeners
            {
                tracing::info!(%addr, tls, "serving raft peers");
                let service = RaftTransportServer::new(PeerService::new(node))
                    .max_decoding_message_size(crate::cluster::MAX_BATCH_BYTES);
                let mut stop = stop_rx.clone();
                let router = tonic::transport::Server::builder()
                    .add_service(service)
                    .add_service(crate::cluster::membership_service(node, &store));
                let shutdown = async move { crate::api::stopped(&mut stop).await };
                let incoming = accept::incoming(listener);
                // Framed Raft lanes are served apart (`cluster/transport/frames.rs`).
                let lanes = (PeerService::new(node), stop_rx.clone());
                peer_servers.push(match (&peer_live, tls) {
                    (Some(live), true) => tokio::spawn(router.serve_with_incoming_shutdown(
                        crate::cluster::serve::framed_lane_service::framed_apart(
                            tls::incoming(incoming, live.clone()),
                            lanes,
                        ),
                        shutdown,
                    )),
                    _ => tokio::spawn(router.serve_with_incoming_shutdown(
                        crate::cluster::serve::framed_lane_service::framed_apart(incoming, lanes),
                        shutdown,
                    )),
                });
            }
        }
        let saving = match (&node, &self.config.data_dir) {
            (Some(n), Some(_)) => Some(tokio::spawn(crate::cluster::save_loop(
                n.clone(),
                self.config.snapshot_interval,
                stop_rx.clone(),
            ))),
            _ => None,
        };
        let single_dir = self.config.data_dir.clone().filter(|_| node.is_none());
        let snapshots = single_dir.map(|dir| {
            tokio::spawn(snapshot_loop(
                store.clone(),
                dir,
                self.config.snapshot_interval,
                stop_rx.clone(),
            ))
        });
        for Bound { addr, listener, .. } in self.http_listeners {
            tracing::info!(%addr, "serving /health and /metrics");
            let mut stop = stop_rx.clone();
            tokio::spawn(crate::http::serve(
                listener,
                self.shared.clone(),
                async move {
                    crate::api::stopped(&mut stop).await;
                },
            ));
        }
        let live_tls = self.tls.map(|reloader| {
            let live = reloader.live();
            tokio::spawn(reloader.run(self.config.tls_reload_interval, stop_rx.clone()));
            live
        });
        let decode_limit = self.config.max_request_bytes + GRPC_OVERHEAD_BYTES;
        // grpc.health.v1.Health: the server as a whole ("") is SERVING
        // while /readyz passes and until shutdown begins, so gRPC probes
        // and load balancers agree with the HTTP ones.
        let (health, health_service) = crate::api::Health::new();
        health
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        tokio::spawn(mirror_readiness(health, self.shared.clone()));
        let mut servers = Vec::new();
        for Bound {
            addr,
            tls,
            listener,
        } in self.listeners
        {
            tracing::info!(%addr, tls, "serving etcd v3 gRPC");
            let shared = self.shared.clone();
            let mut stop = stop_rx.clone();
            let gateway_shared = shared.clone();
            let grpc = tonic::service::Routes::default()
                .add_service(
                    KvServer::new(KvService(shared.clone()))
                        .max_decoding_message_size(decode_limit)
                        .max_encoding_message_size(usize::MAX),
                )
                .add_service(
                    WatchServer::new(WatchService(shared.clone()))
                        .max_decoding_message_size(decode_limit)
                        .max_encoding_message_size(usize::MAX),
                )
                .add_service(
                    LeaseServer::new(LeaseService(shared.clone()))
                        .max_decoding_message_size(decode_limit),
                )
                .add_service(MaintenanceServer::new(MaintenanceService(shared.clone())))
                .add_service(ClusterServer::new(ClusterService(shared.clone())))
                .add_service(LockServer::new(LockService::new(shared.clone())))
                .add_service(ElectionServer::new(ElectionService::new(shared.clone())))
                .add_service(AuthServer::new(AuthService(shared)))
                .add_service(health_service.clone());
            // Metrics outermost: they see the status the other layers leave.
            // HTTP/1.1 is accepted beside HTTP/2 for the endpoints and the
            // JSON gateway (src/gateway), which share the port as on etcd.
            let router = tonic::transport::Server::builder()
                .layer(GrpcMetricsLayer(gateway_shared.metrics.grpc.clone()))
                .layer(GrpcGoLimits)
                .layer(gateway_shared.backend.interceptor())
                .layer(SendPreEncoded)
                .accept_http1(true)
                .max_concurrent_streams(Some(self.config.max_concurrent_streams))
                .http2_keepalive_interval(
                    Some(self.config.grpc_keepalive_interval).filter(|d| !d.is_zero()),
                )
                .http2_keepalive_timeout(
                    Some(self.config.grpc_keepalive_timeout).filter(|d| !d.is_zero()),
                )
                .add_routes(crate::gateway::client_routes(grpc, &gateway_shared));
            let incoming = accept::incoming(listener);
            let shutdown = async move {
                crate::api::stopped(&mut stop).await;
            };
            // TLS is terminated here (tls.rs), so certificates can rotate;
            // plaintext connections go to tonic as they are accepted.
            servers.push(if tls {
                let live = live_tls
                    .clone()
                    .ok_or_else(|| format!("{addr} is https:// but TLS is not set up"))?;
                tokio::spawn(
                    router.serve_with_incoming_shutdown(tls::incoming(incoming, live), shutdown),
                )
            } else {
                tokio::spawn(router.serve_with_incoming_shutdown(incoming, shutdown))
            });
        }
        let mut result = Ok(());
        let mut stop = stop_rx.clone();
        crate::api::stopped(&mut stop).await;
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        for s in servers {
            match tokio::time::timeout_at(deadline, s).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => result = Err(format!("server error: {e}")),
                Ok(Err(e)) => result = Err(format!("server task failed: {e}")),
                Err(_) => tracing::warn!(
                    "in-flight requests did not finish within the shutdown grace period"
                ),
            }
        }
        expiry.abort();
        if let Some(c) = compactor {
            c.abort();
        }
        if let Some(g) = guard {
            let _ = g.await;
        }
        if let Some(node) = node {
            // Stops raft and applying; a write still waiting fails.
            let stopping = node.clone();
            let _ = tokio::task::spawn_blocking(move || stopping.stop()).await;
            if let Some(task) = saving {
                let _ = task.await;
                let snap = node.capture_stopped(&store);
                let written = crate::cluster::write_saved(&node, snap).await;
                if let Err(e) = written {
                    result = Err(e);
                }
            }
            for s in peer_servers {
                let _ = tokio::time::timeout(SHUTDOWN_GRACE, s).await;
            }
        }
        // Every request that got an answer is applied by now; fence off any
        // straggler so the final snapshot holds every acknowledged write.
        let fence = store.clone();
        let _ = tokio::task::spawn_blocking(move || fence.stop_writes()).await;
        if let Some(task) = snapshots {
            if let Ok(Err(e)) = task.await {
                tracing::error!(error = %e, "periodic snapshot failed");
            }
            if let Some(dir) = &self.config.data_dir {
                if let Err(e) = write_snapshot(&store, dir).await {
                    result = Err(e);
                }
            }
        }
        if let Some(wal) = self.wal {
            let _ = tokio::task::spawn_blocking(move || wal.close()).await;
        }
        result
    }
}
