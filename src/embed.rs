//! An ephd inside a test process, the way etcd's `embed` package starts an
//! etcd inside a Go test: [`Embedded::start`] serves on a free loopback
//! port in exact-etcd mode (`--etcd-compat`: revision 1, unknown leases
//! refused, nothing pre-created) and [`Embedded::stop`], or dropping it,
//! shuts it down.
//!
//! The server runs on a thread of its own with its own tokio runtime, so it
//! works the same from a plain `#[test]` and from `#[tokio::test]` (whose
//! single-threaded runtime would otherwise have to serve the server and
//! the test's client at once), and the test's runtime can end first.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let etcd = ephd::embed::Embedded::start()?;
//! let mut client = etcd_client::Client::connect([etcd.endpoint()], None).await?;
//! let put = client.put("greeting", "hello", None).await?;
//! assert_eq!(put.header().map(|h| h.revision()), Some(2));
//! etcd.stop()?;
//! # Ok(()) }
//! ```

use crate::config::Config;
use crate::server::Server;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread::JoinHandle;
use tokio::sync::oneshot;

/// The listen URL of a free loopback port.
const FREE_PORT: &str = "http://127.0.0.1:0";

/// A running in-process ephd; stopped when dropped.
#[derive(Debug)]
pub struct Embedded {
    addr: SocketAddr,
    endpoint: String,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), String>>>,
}

impl Embedded {
    /// Starts an exact-etcd-mode ephd with every other setting at its
    /// default, listening on `127.0.0.1` on a free port, and returns once
    /// it accepts connections.
    pub fn start() -> Result<Embedded, String> {
        let mut config = Config::etcd_compat();
        config.listen_client_urls = vec![FREE_PORT.to_string()];
        Embedded::start_with(config)
    }

    /// Starts an ephd with `config` (build it with [`Config::etcd_compat`]
    /// or [`Config::defaults`], then change fields), on its listen URLs as
    /// given: those configurations listen on etcd's 127.0.0.1:2379, so set
    /// `listen_client_urls` to a URL with port 0 (`http://127.0.0.1:0`) for
    /// a free port. [`Embedded::endpoint`] names the first one. Returns once
    /// it accepts connections, or why it could not start (a port in use, an
    /// unreadable `data_dir`, ...).
    pub fn start_with(mut config: Config) -> Result<Embedded, String> {
        if config.listen_client_urls.is_empty() {
            config.listen_client_urls = vec![FREE_PORT.to_string()];
        }
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ephd-embedded".to_string())
            .spawn(move || serve(config, ready_tx, stop_rx))
            .map_err(|e| format!("cannot start the embedded server's thread: {e}"))?;
        match ready_rx.recv() {
            Ok(Ok((addr, tls))) => Ok(Embedded {
                addr,
                endpoint: format!("{}://{addr}", if tls { "https" } else { "http" }),
                stop: Some(stop_tx),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(match thread.join() {
                Ok(Err(e)) => e,
                _ => "the embedded server's thread ended before serving".to_string(),
            }),
        }
    }

    /// The client endpoint, e.g. `http://127.0.0.1:34567`, to hand to a
    /// client (`etcd_client::Client::connect([endpoint], None)`, or
    /// etcdctl's `--endpoints`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The address the first client listener is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Shuts the server down as SIGTERM would (open streams end, in-flight
    /// requests finish, a final snapshot is written when `data_dir` is
    /// set) and waits for it; returns the server's error if it failed.
    pub fn stop(mut self) -> Result<(), String> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), String> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take().map(JoinHandle::join) {
            None => Ok(()),
            Some(Ok(result)) => result,
            Some(Err(_)) => Err("the embedded server panicked".to_string()),
        }
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!("embedded ephd stopped with an error: {e}");
        }
    }
}

/// The server thread: binds, reports the address (or the error), serves
/// until `stop` fires or its sender is dropped.
fn serve(
    config: Config,
    ready: mpsc::Sender<Result<(SocketAddr, bool), String>>,
    stop: oneshot::Receiver<()>,
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ephd-embedded-worker")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the embedded server's runtime: {e}"));
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(e.clone()));
            return Err(e);
        }
    };
    runtime.block_on(async move {
        let tls = config
            .listen_client_urls
            .first()
            .is_some_and(|u| u.starts_with("https://"));
        let server = match Server::bind(config).await {
            Ok(server) => server,
            Err(e) => {
                let _ = ready.send(Err(e.clone()));
                return Err(e);
            }
        };
        let Some(addr) = server.local_addrs().first().copied() else {
            let e = "no client listen URL to serve on".to_string();
            let _ = ready.send(Err(e.clone()));
            return Err(e);
        };
        let _ = ready.send(Ok((addr, tls)));
        server
            .run(async move {
                let _ = stop.await;
            })
            .await
    })
}
