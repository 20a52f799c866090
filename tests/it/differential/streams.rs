//! Bidirectional gRPC streams (Watch, LeaseKeepAlive) driven from a
//! background task that records every response, so the sequential test
//! driver can wait — always with a deadline — for a condition on what has
//! arrived so far.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ephd::proto::etcdserverpb::{
    lease_client::LeaseClient, watch_client::WatchClient, LeaseKeepAliveRequest,
    LeaseKeepAliveResponse, WatchRequest, WatchResponse,
};
use tokio::sync::{mpsc, Notify};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;

/// Responses received on one stream, plus how the stream ended (if it did).
pub struct Received<T> {
    pub responses: Vec<T>,
    pub closed: Option<String>,
}

struct Shared<T> {
    received: Mutex<Received<T>>,
    notify: Notify,
}

/// One open bidirectional stream: requests go in through `send`, responses
/// accumulate in order and can be awaited with `wait_for`.
pub struct RecordedStream<Req, Resp> {
    tx: mpsc::UnboundedSender<Req>,
    shared: Arc<Shared<Resp>>,
}

impl<Req: Send + 'static, Resp: Send + 'static> RecordedStream<Req, Resp> {
    /// Starts the call on a background task. The call is made inside the
    /// task because a gRPC server may only send response headers together
    /// with its first message, which comes after our first request.
    fn spawn<F, Fut, S>(call: F) -> RecordedStream<Req, Resp>
    where
        F: FnOnce(UnboundedReceiverStream<Req>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<S, tonic::Status>> + Send,
        S: futures::Stream<Item = Result<Resp, tonic::Status>> + Send + Unpin,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            received: Mutex::new(Received {
                responses: Vec::new(),
                closed: None,
            }),
            notify: Notify::new(),
        });
        let task_shared = shared.clone();
        tokio::spawn(async move {
            use futures::StreamExt;
            let end = match call(UnboundedReceiverStream::new(rx)).await {
                Err(status) => format!("call failed: {status}"),
                Ok(mut stream) => loop {
                    match stream.next().await {
                        Some(Ok(resp)) => {
                            task_shared.received.lock().unwrap().responses.push(resp);
                            task_shared.notify.notify_waiters();
                        }
                        Some(Err(status)) => break format!("stream error: {status}"),
                        None => break "stream ended".to_string(),
                    }
                },
            };
            task_shared.received.lock().unwrap().closed = Some(end);
            task_shared.notify.notify_waiters();
        });
        RecordedStream { tx, shared }
    }

    /// Queues a request on the stream.
    pub fn send(&self, req: Req) {
        // A closed stream shows up as a missing response in `wait_for`.
        let _ = self.tx.send(req);
    }

    /// Waits until `cond` returns `Some` for the responses received so far,
    /// or the stream closed, or `timeout` passed (then `None`).
    pub async fn wait_for<T>(
        &self,
        timeout: Duration,
        mut cond: impl FnMut(&Received<Resp>) -> Option<T>,
    ) -> Option<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.shared.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let received = self.shared.received.lock().unwrap();
                if let Some(t) = cond(&received) {
                    return Some(t);
                }
                if received.closed.is_some() {
                    return None;
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return cond(&self.shared.received.lock().unwrap());
            }
        }
    }

    /// Runs `f` on a snapshot of what was received so far.
    pub fn inspect<T>(&self, f: impl FnOnce(&Received<Resp>) -> T) -> T {
        f(&self.shared.received.lock().unwrap())
    }
}

/// A Watch stream.
pub type WatchStream = RecordedStream<WatchRequest, WatchResponse>;

/// Opens a Watch stream on `client`.
pub fn open_watch(client: WatchClient<Channel>) -> WatchStream {
    RecordedStream::spawn(move |requests| async move {
        let mut client = client;
        client.watch(requests).await.map(|r| r.into_inner())
    })
}

/// A LeaseKeepAlive stream.
pub type KeepAliveStream = RecordedStream<LeaseKeepAliveRequest, LeaseKeepAliveResponse>;

/// Opens a LeaseKeepAlive stream on `client`.
pub fn open_keep_alive(client: LeaseClient<Channel>) -> KeepAliveStream {
    RecordedStream::spawn(move |requests| async move {
        let mut client = client;
        client
            .lease_keep_alive(requests)
            .await
            .map(|r| r.into_inner())
    })
}
