//! Accepting client connections without spinning when the process runs out
//! of file descriptors (or the kernel of memory for sockets).
//!
//! tonic's accept loop retries an accept error at once, and an exhausted
//! descriptor table fails every accept immediately while the pending
//! connection stays queued: the loop would burn whole cores and log nothing.
//! Here such errors back off (10 ms, doubling up to 1 s) until an accept
//! succeeds again, and are logged as a warning at most every
//! [`LOG_EVERY`], with how many accepts failed meanwhile. Errors that
//! concern one connection only (aborted or reset before accept) are
//! skipped at once, as before.

use futures::Stream;
use std::io;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};

/// First pause after a resource error.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// Longest pause between accept attempts while resources are exhausted.
const MAX_PAUSE: Duration = Duration::from_secs(1);
/// Least time between two warnings about the same condition.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The connections `listener` accepts, with TCP_NODELAY set (tonic sets it
/// only on sockets it accepts itself; without it, Nagle's algorithm would
/// hold small responses back for the peer's delayed ACK). Never yields an
/// error: accept errors are handled here, see the module docs.
pub(super) fn incoming(listener: TcpListener) -> impl Stream<Item = io::Result<TcpStream>> + Send {
    futures::stream::unfold(
        (listener, Backoff::default()),
        |(listener, mut backoff)| async move {
            loop {
                match listener.accept().await {
                    Ok((stream, peer)) => {
                        backoff.recovered();
                        if let Err(e) = stream.set_nodelay(true) {
                            tracing::debug!(%peer, error = %e, "connection lost before it was served");
                            continue;
                        }
                        return Some((Ok(stream), (listener, backoff)));
                    }
                    Err(e) if per_connection(&e) => {
                        tracing::debug!(error = %e, "a connection failed before accept");
                    }
                    Err(e) => backoff.pause(&e).await,
                }
            }
        },
    )
}

/// Errors about one queued connection, not about this process.
fn per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// Pause and warning state while accepts keep failing.
#[derive(Default)]
struct Backoff {
    pause: Option<Duration>,
    failed: u64,
    last_warning: Option<Instant>,
}

impl Backoff {
    async fn pause(&mut self, e: &io::Error) {
        self.failed += 1;
        let now = Instant::now();
        if self
            .last_warning
            .is_none_or(|at| now.duration_since(at) >= LOG_EVERY)
        {
            self.last_warning = Some(now);
            tracing::warn!(
                error = %e,
                failed_accepts = self.failed,
                "cannot accept client connections; backing off (if this is \"Too many open files\", raise the file-descriptor limit: ulimit -n, LimitNOFILE)"
            );
        }
        let pause = self.pause.map_or(FIRST_PAUSE, |p| (p * 2).min(MAX_PAUSE));
        self.pause = Some(pause);
        tokio::time::sleep(pause).await;
    }

    fn recovered(&mut self) {
        if self.pause.take().is_some() {
            tracing::info!(
                failed_accepts = self.failed,
                "accepting client connections again"
            );
            self.failed = 0;
            self.last_warning = None;
        }
    }
}
