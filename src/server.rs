//! Wiring: the store, the gRPC services, listeners, background tasks and
//! graceful shutdown.

use crate::api::{
    AuthService, ClusterService, KvService, LeaseService, MaintenanceService, ServerInfo, Shared,
    WatchService,
};
use crate::config::{listen_addr, Config};
use crate::mvcc::{Store, StoreConfig};
use crate::proto::etcdserverpb::{
    auth_server::AuthServer, cluster_server::ClusterServer, kv_server::KvServer,
    lease_server::LeaseServer, maintenance_server::MaintenanceServer, watch_server::WatchServer,
};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;

/// gRPC framing overhead etcd allows on top of `--max-request-bytes`.
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;
/// How often lease expiry is checked.
const EXPIRY_TICK: Duration = Duration::from_millis(100);
/// Leases revoked per tick at most (1,000/s, etcd's revoke rate), so an
/// expiry storm cannot starve other requests.
const REVOKES_PER_TICK: usize = 100;

/// A bound, not yet running server.
pub struct Server {
    shared: Shared,
    listeners: Vec<(SocketAddr, TcpListener)>,
    config: Config,
}

impl Server {
    /// Builds the store and binds every listen URL. Fails (without
    /// panicking) on bad URLs or ports already in use.
    pub async fn bind(config: Config) -> Result<Server, String> {
        let store = Arc::new(Store::new(StoreConfig {
            max_txn_ops: config.max_txn_ops,
            ..StoreConfig::default()
        }));
        let mut info = ServerInfo::new(&config.name, config.advertised_urls());
        info.max_request_bytes = config.max_request_bytes;
        info.progress_notify_interval = if config.watch_progress_notify_interval.is_zero() {
            Duration::from_secs(600)
        } else {
            config.watch_progress_notify_interval
        };
        let mut listeners = Vec::new();
        for url in &config.listen_client_urls {
            let addr = listen_addr(url)?;
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {url}: {e}"))?;
            let local = listener.local_addr().map_err(|e| e.to_string())?;
            listeners.push((local, listener));
        }
        Ok(Server {
            shared: Shared {
                store,
                info: Arc::new(info),
            },
            listeners,
            config,
        })
    }

    /// The addresses actually bound (useful with port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners.iter().map(|(a, _)| *a).collect()
    }

    /// The store, for in-process tests and tools.
    pub fn store(&self) -> Arc<Store> {
        self.shared.store.clone()
    }

    /// Serves until `shutdown` completes, then stops accepting, lets
    /// in-flight requests finish and returns.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), String> {
        let (stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        });
        let expiry = tokio::spawn(expire_leases(self.shared.store.clone(), stop_rx.clone()));
        let decode_limit = self.config.max_request_bytes + GRPC_OVERHEAD_BYTES;
        let mut servers = Vec::new();
        for (addr, listener) in self.listeners {
            tracing::info!(%addr, "serving etcd v3 gRPC");
            let shared = self.shared.clone();
            let mut stop = stop_rx.clone();
            let router = tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .max_concurrent_streams(Some(u32::MAX))
                .http2_keepalive_interval(Some(Duration::from_secs(2 * 3600)))
                .http2_keepalive_timeout(Some(Duration::from_secs(20)))
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
                .add_service(AuthServer::new(AuthService(shared)));
            let incoming = TcpListenerStream::new(listener);
            servers.push(tokio::spawn(async move {
                router
                    .serve_with_incoming_shutdown(incoming, async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
                    .await
            }));
        }
        let mut result = Ok(());
        for s in servers {
            match s.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(format!("server error: {e}")),
                Err(e) => result = Err(format!("server task failed: {e}")),
            }
        }
        expiry.abort();
        result
    }
}

/// Revokes expired leases, at most [`REVOKES_PER_TICK`] per tick.
async fn expire_leases(store: Arc<Store>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(EXPIRY_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let ids = store.lessor().expired(Instant::now(), REVOKES_PER_TICK);
        if ids.is_empty() {
            continue;
        }
        let store = store.clone();
        let revoked = tokio::task::spawn_blocking(move || {
            for id in ids {
                match store.lease_revoke(id) {
                    Ok(rev) => tracing::debug!(lease = id, rev, "lease expired"),
                    Err(e) => tracing::debug!(lease = id, error = %e, "expired lease already gone"),
                }
            }
        });
        if let Err(e) = revoked.await {
            tracing::error!(error = %e, "lease expiry task failed");
        }
    }
}
