//! Wiring: the store, the gRPC services, listeners, TLS and graceful
//! shutdown. What happens before serving is in `bootstrap.rs`; the
//! background tasks (lease expiry, auto-compaction, snapshots) in `tasks.rs`.

mod accept;
mod bootstrap;
pub mod memory;
pub mod revisions;
mod tasks;

use bootstrap::build_store;
use memory::MemoryPlan;
use revisions::{guard_revisions, RevisionGuard};
pub use revisions::{start_revision, COMPACT_REV_KEY};
use tasks::{auto_compact, expire_leases, snapshot_loop, write_snapshot, CompactionPolicy};

use crate::api::{
    AuthService, ClusterService, GrpcGoLimits, KvService, LeaseService, MaintenanceService,
    Overload, SendPreEncoded, ServerInfo, Shared, WatchService,
};
use crate::config::{listen_addr, Config};
use crate::metrics::{grpc::GrpcMetricsLayer, Metrics};
use crate::mvcc::Store;
use crate::proto::etcdserverpb::{
    auth_server::AuthServer, cluster_server::ClusterServer, kv_server::KvServer,
    lease_server::LeaseServer, maintenance_server::MaintenanceServer, watch_server::WatchServer,
};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
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
    tls: Option<tonic::transport::ServerTlsConfig>,
    config: Config,
    guard: RevisionGuard,
}

/// A bound listener and whether it serves TLS.
struct Bound {
    addr: SocketAddr,
    tls: bool,
    listener: TcpListener,
}

async fn bind_all(urls: &[String]) -> Result<Vec<Bound>, String> {
    let mut out = Vec::new();
    for url in urls.iter().filter(|u| !u.trim().is_empty()) {
        let (addr, tls) = listen_addr(url)?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {url}: {e}"))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        out.push(Bound {
            addr: local,
            tls,
            listener,
        });
    }
    Ok(out)
}

/// The TLS settings for https:// listeners, from etcd-named flags.
fn tls_config(config: &Config) -> Result<tonic::transport::ServerTlsConfig, String> {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let read = |p: &Option<PathBuf>, flag: &str| -> Result<Vec<u8>, String> {
        let p = p
            .as_ref()
            .ok_or_else(|| format!("https:// listen URLs need {flag}"))?;
        std::fs::read(p).map_err(|e| format!("cannot read {flag} {}: {e}", p.display()))
    };
    let cert = read(&config.cert_file, "--cert-file")?;
    let key = read(&config.key_file, "--key-file")?;
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
    if config.trusted_ca_file.is_some() {
        let ca = read(&config.trusted_ca_file, "--trusted-ca-file")?;
        tls = tls
            .client_ca_root(Certificate::from_pem(ca))
            .client_auth_optional(!config.client_cert_auth);
    } else if config.client_cert_auth {
        return Err("--client-cert-auth needs --trusted-ca-file".to_string());
    }
    Ok(tls)
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
    /// (without panicking) on bad URLs, ports in use or unreadable snapshots.
    pub async fn bind(config: Config) -> Result<Server, String> {
        let memory = MemoryPlan::new(&config, memory::memory_limit());
        tracing::info!(
            limit_bytes = memory.limit.bytes,
            limit_from = memory.limit.source,
            quota_bytes = memory.quota_bytes.unwrap_or(-1),
            response_bytes_in_flight = memory.response_bytes,
            "memory bounds"
        );
        let boot = build_store(&config, crate::persist::wall_clock_ms(), memory.quota_bytes)?;
        let store = Arc::new(boot.store);
        let mut info = ServerInfo::new(&config.name, config.advertised_urls());
        info.max_request_bytes = config.max_request_bytes;
        info.progress_notify_interval = if config.watch_progress_notify_interval.is_zero() {
            Duration::from_secs(600)
        } else {
            config.watch_progress_notify_interval
        };
        config.auto_compaction()?;
        let listeners = bind_all(&config.listen_client_urls).await?;
        let http_listeners = bind_all(&config.listen_metrics_urls).await?;
        if http_listeners.iter().any(|b| b.tls) {
            return Err(
                "--listen-metrics-urls must be http:// (serve them on a private address)"
                    .to_string(),
            );
        }
        let tls = if listeners.iter().any(|b| b.tls) {
            Some(tls_config(&config)?)
        } else {
            None
        };
        let (stop, stop_rx) = watch::channel(false);
        let metrics = Metrics::new();
        metrics.set_server_version(crate::api::ETCD_VERSION);
        metrics
            .grpc
            .warnings
            .set_slow(config.warning_apply_duration);
        metrics
            .quota_backend_bytes
            .set(memory.quota_bytes.unwrap_or(-1));
        Ok(Server {
            shared: Shared {
                store,
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
            tls,
            config,
            guard: boot.guard,
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
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        });
        let store = self.shared.store.clone();
        let expiry = tokio::spawn(expire_leases(self.shared.clone()));
        // The safety net runs unless auto-compaction is configured or it is
        // set to 0; an exact-etcd mode would turn it off here.
        let compactor = CompactionPolicy::from_flags(
            self.config.auto_compaction()?,
            self.config.compaction_safety_net,
        )
        .map(|policy| tokio::spawn(auto_compact(store.clone(), policy, stop_rx.clone())));
        let guard = self
            .guard
            .needed()
            .then(|| tokio::spawn(guard_revisions(store.clone(), self.guard, stop_rx.clone())));
        let snapshots = self.config.data_dir.clone().map(|dir| {
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
        let decode_limit = self.config.max_request_bytes + GRPC_OVERHEAD_BYTES;
        // grpc.health.v1.Health, as etcd serves it: the server as a whole
        // ("") is SERVING until shutdown begins.
        let (health, health_service) = tonic_health::server::health_reporter();
        {
            let mut stop = stop_rx.clone();
            tokio::spawn(async move {
                crate::api::stopped(&mut stop).await;
                health
                    .set_service_status("", tonic_health::ServingStatus::NotServing)
                    .await;
            });
        }
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
            let mut builder = tonic::transport::Server::builder();
            if tls {
                let cfg = self
                    .tls
                    .clone()
                    .expect("TLS config exists for https listeners");
                builder = builder
                    .tls_config(cfg)
                    .map_err(|e| format!("invalid TLS settings: {e}"))?;
            }
            // Metrics outermost: they see the status the other layers leave.
            let router = builder
                .layer(GrpcMetricsLayer(shared.metrics.grpc.clone()))
                .layer(GrpcGoLimits)
                .layer(SendPreEncoded)
                .max_concurrent_streams(Some(self.config.max_concurrent_streams))
                .http2_keepalive_interval(
                    Some(self.config.grpc_keepalive_interval).filter(|d| !d.is_zero()),
                )
                .http2_keepalive_timeout(
                    Some(self.config.grpc_keepalive_timeout).filter(|d| !d.is_zero()),
                )
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
                .add_service(AuthServer::new(AuthService(shared)))
                .add_service(health_service.clone());
            let incoming = accept::incoming(listener);
            servers.push(tokio::spawn(async move {
                router
                    .serve_with_incoming_shutdown(incoming, async move {
                        crate::api::stopped(&mut stop).await;
                    })
                    .await
            }));
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
        result
    }
}
