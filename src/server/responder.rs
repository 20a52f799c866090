//! Cluster mode with `--data-dir`: while a member holding saved state waits
//! for the cluster to resume (`cluster/lifecycle/resume.rs`), its peer URLs answer
//! the other members' probes, before its Raft node and the real peer
//! service exist. Stopped (and the listeners closed) before the member
//! binds them for good.

use super::accept;
use super::listeners::{bind_all, Bound};
use crate::cluster::member::saved_state::Saved;
use crate::config::ClusterConfig;
use crate::tls;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The temporary peer servers.
pub(super) struct Responding {
    stop: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
}

/// Serves [`crate::cluster::lifecycle::resume::responder`] on `config`'s peer
/// listeners (with peer TLS when configured, offering `first_protocol` in
/// ALPN as the member's peer listener will).
pub(super) async fn start(
    config: &ClusterConfig,
    saved: &Saved,
    first_protocol: Option<&'static [u8]>,
) -> Result<Responding, String> {
    let live = match &config.peer_tls {
        Some(peer) => Some(tls::Reloader::for_peers(peer, first_protocol)?.live()),
        None => None,
    };
    let (stop, stopped) = watch::channel(false);
    let mut servers = Vec::new();
    for Bound { listener, tls, .. } in bind_all(&config.listen_peer_urls).await? {
        let router = tonic::transport::Server::builder()
            .add_service(crate::cluster::lifecycle::resume::responder(config, saved));
        let mut stopped = stopped.clone();
        let shutdown = async move { crate::api::stopped(&mut stopped).await };
        let incoming = accept::incoming(listener);
        servers.push(match (live.clone(), tls) {
            (Some(live), true) => tokio::spawn(async move {
                let incoming = tls::incoming(incoming, live);
                let _ = router
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await;
            }),
            _ => tokio::spawn(async move {
                let _ = router
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await;
            }),
        });
    }
    Ok(Responding { stop, servers })
}

impl Responding {
    /// Stops serving and closes the listeners (a connection a prober left
    /// open is cut after a moment).
    pub(super) async fn stop(self) {
        let _ = self.stop.send(true);
        for s in self.servers {
            let abort = s.abort_handle();
            if tokio::time::timeout(Duration::from_millis(500), s)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }
}
