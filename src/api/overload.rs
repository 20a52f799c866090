//! Bounded work for large reads, so a list storm cannot take the memory or
//! the async workers that everything else (lease heartbeats first) needs.
//!
//! A Range over a span of keys is built on a build thread of lower CPU
//! priority, at most [`Overload::builders`] at a time, never on the async
//! workers that serve every other request. Its response then needs room in a byte budget
//! (`--max-response-bytes-in-flight`) for as long as it exists: from before
//! it is converted until the last byte has left the server (or the client
//! went away), because a response handed to HTTP/2 stays in memory until
//! the client has read it. A Range that cannot start building or get room
//! within `--overload-queue-timeout` is shed with etcd's "etcdserver: too
//! many requests" (ResourceExhausted), which clients retry; a response
//! larger than the whole budget waits until it can have all of it.
//!
//! Single-key reads and writes never wait here: they are small and must
//! stay fast while lists queue.

use crate::error::{Error, INTERNAL_ENCODE_FAILED, INTERNAL_RANGE_FAILED};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tonic::codegen::http;
use tonic::Status;

/// Budget units are KiB, so a `u32` permit count covers 4 TiB.
const UNIT: u64 = 1024;

/// The shared limits on large reads.
#[derive(Debug)]
pub struct Overload {
    /// Jobs for the build threads; they end when this is dropped.
    pool: crossbeam_channel::Sender<Job>,
    builders: Arc<Semaphore>,
    builder_count: usize,
    budget: Arc<Semaphore>,
    budget_units: u32,
    queue_timeout: Duration,
}

/// Room in the response budget, held until the response is gone.
#[derive(Debug, Clone)]
pub struct ResponsePermit(#[allow(dead_code)] Arc<OwnedSemaphorePermit>);

impl Overload {
    /// Limits of `builders` concurrent builds and `budget_bytes` of
    /// responses, waiting at most `queue_timeout` for either.
    pub fn new(builders: usize, budget_bytes: u64, queue_timeout: Duration) -> Overload {
        let builders = builders.max(1);
        let units = (budget_bytes / UNIT).clamp(1, u32::MAX as u64 >> 1) as u32;
        Overload {
            pool: build_threads(builders),
            builders: Arc::new(Semaphore::new(builders)),
            builder_count: builders,
            budget: Arc::new(Semaphore::new(units as usize)),
            budget_units: units,
            queue_timeout,
        }
    }

    /// How many large reads are built at once.
    pub fn builders(&self) -> usize {
        self.builder_count
    }

    /// Bytes of the response budget not in use now.
    pub fn budget_available(&self) -> u64 {
        self.budget.available_permits() as u64 * UNIT
    }

    /// The deadline a request arriving now must start by.
    pub fn deadline(&self) -> Instant {
        Instant::now() + self.queue_timeout
    }

    /// Runs `build` on a build thread once a builder slot is free,
    /// unless `deadline` passes first ("too many requests").
    pub async fn build<T, F>(&self, deadline: Instant, build: F) -> Result<T, Status>
    where
        F: FnOnce() -> crate::error::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        self.run(deadline, move || build().map_err(super::status))
            .await
    }

    /// [`Overload::build`] for work that fails with a gRPC status.
    pub async fn run<T, F>(&self, deadline: Instant, work: F) -> Result<T, Status>
    where
        F: FnOnce() -> Result<T, Status> + Send + 'static,
        T: Send + 'static,
    {
        let slot = tokio::time::timeout_at(deadline, self.builders.clone().acquire_owned())
            .await
            .map_err(|_| shed())?
            .map_err(|_| shed())?;
        self.dispatch(slot, work).await
    }

    /// Runs `work` of a request that already holds its room in the budget
    /// (encoding a built response) on a build thread, waiting for a
    /// builder slot as long as it takes. Shedding it now would throw away
    /// a finished build and give its room to a request that has not built
    /// anything yet; the wait is bounded by the builds already running,
    /// since requests still queued for a slot are shed at their own
    /// deadline.
    pub async fn finish<T, F>(&self, work: F) -> Result<T, Status>
    where
        F: FnOnce() -> Result<T, Status> + Send + 'static,
        T: Send + 'static,
    {
        let slot = self
            .builders
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| shed())?;
        self.dispatch(slot, work).await
    }

    /// Hands `work` to a build thread together with its builder `slot`.
    async fn dispatch<T, F>(&self, slot: OwnedSemaphorePermit, work: F) -> Result<T, Status>
    where
        F: FnOnce() -> Result<T, Status> + Send + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _slot = slot;
            // A panicking build fails its request, not the build thread.
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            let _ = tx.send(out);
        });
        if self.pool.send(job).is_err() {
            return Err(Status::internal(format!(
                "{INTERNAL_RANGE_FAILED}: no build thread"
            )));
        }
        match rx.await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Status::internal(format!(
                "{INTERNAL_RANGE_FAILED}: panicked"
            ))),
            Err(_) => Err(Status::internal(format!(
                "{INTERNAL_RANGE_FAILED}: build thread gone"
            ))),
        }
    }

    /// Room for a response of about `bytes`, unless `deadline` passes first
    /// ("too many requests"). A response larger than the whole budget
    /// waits for all of it.
    pub async fn room(&self, bytes: u64, deadline: Instant) -> Result<ResponsePermit, Status> {
        let units = bytes.div_ceil(UNIT).clamp(1, self.budget_units as u64) as u32;
        let permit =
            tokio::time::timeout_at(deadline, self.budget.clone().acquire_many_owned(units))
                .await
                .map_err(|_| shed())?
                .map_err(|_| shed())?;
        Ok(ResponsePermit(Arc::new(permit)))
    }
}

/// One large build, run on a build thread.
type Job = Box<dyn FnOnce() + Send>;

/// The nice value of the threads that build large responses. The async
/// workers (heartbeats, watches, every small request) stay at the
/// process's own priority, so when a list storm keeps every core busy the
/// kernel runs them first and the builds take what is left; with an equal
/// share a heartbeat waits behind a build for a whole time slice.
const BUILDER_NICE: i32 = 10;

/// Starts `n` build threads at [`BUILDER_NICE`] (their own threads, not
/// tokio's blocking pool, whose threads also revoke expired leases and
/// must keep the process's priority). A build slot is taken before a job
/// is sent, so a job never waits here for a thread.
fn build_threads(n: usize) -> crossbeam_channel::Sender<Job> {
    let (tx, rx) = crossbeam_channel::unbounded::<Job>();
    for i in 0..n {
        let rx = rx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("ephd-build-{i}"))
            .spawn(move || {
                lower_priority();
                for job in rx {
                    job();
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "could not start a response build thread");
        }
    }
    tx
}

/// Lowers the calling thread's CPU priority to [`BUILDER_NICE`] (Linux
/// applies a nice value per thread); leaves it when it is already lower.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let tid = rustix::thread::gettid();
        let current = rustix::process::getpriority_process(Some(tid)).unwrap_or(0);
        if current < BUILDER_NICE {
            if let Err(e) = rustix::process::setpriority_process(Some(tid), BUILDER_NICE) {
                tracing::debug!(error = %e, "could not lower a build thread's priority");
            }
        }
    }
}

/// etcd's answer for a request the server has no room for now.
fn shed() -> Status {
    super::status(Error::TooManyRequests)
}

/// A unary response encoded ahead of time off the async workers, to be
/// sent as it is: the handler returns an empty message of the method's type
/// with this in the response's extensions, and [`SendPreEncoded`] swaps
/// the body. The room in the budget goes with the bytes and is given back
/// when the body has been sent or dropped, not when the handler returned.
#[derive(Debug, Clone)]
pub struct PreEncoded {
    /// The gRPC message frame: the 5-byte prefix, then the message.
    pub frame: bytes::Bytes,
    /// Its room in the response budget.
    pub permit: ResponsePermit,
}

impl PreEncoded {
    /// Encodes `message` as one uncompressed gRPC message frame, in a
    /// buffer of exactly its size. A message over gRPC's 4 GiB frame limit
    /// fails as grpc-go's sender fails it.
    pub fn encode<M: prost::Message>(
        message: &M,
        permit: ResponsePermit,
    ) -> Result<PreEncoded, Status> {
        let len = message.encoded_len();
        let Ok(len32) = u32::try_from(len) else {
            return Err(Status::resource_exhausted(format!(
                "grpc: trying to send message larger than max ({len} vs. {})",
                u32::MAX
            )));
        };
        let mut buf = bytes::BytesMut::with_capacity(5 + len);
        bytes::BufMut::put_u8(&mut buf, 0);
        bytes::BufMut::put_u32(&mut buf, len32);
        // A BytesMut grows as needed, so encoding into it cannot run out of
        // room; the error arm is unreachable in practice.
        message
            .encode(&mut buf)
            .map_err(|e| Status::internal(format!("{INTERNAL_ENCODE_FAILED}: {e}")))?;
        Ok(PreEncoded {
            frame: buf.freeze(),
            permit,
        })
    }
}

/// Sends a handler's [`PreEncoded`] frame as the response body, in place of
/// the empty message tonic encoded, without copying it again: a 10 MB list
/// leaves as the buffer it was encoded into. Cheap for every other
/// response: one extensions lookup.
#[derive(Debug, Clone, Copy, Default)]
pub struct SendPreEncoded;

impl<S> tower::Layer<S> for SendPreEncoded {
    type Service = tower::util::MapResponse<S, fn(HttpResponse) -> HttpResponse>;

    fn layer(&self, inner: S) -> Self::Service {
        tower::util::MapResponse::new(inner, swap_body as fn(HttpResponse) -> HttpResponse)
    }
}

type HttpResponse = http::Response<tonic::body::Body>;

fn swap_body(mut resp: HttpResponse) -> HttpResponse {
    match resp.extensions_mut().remove::<PreEncoded>() {
        None => resp,
        Some(pre) => resp.map(|_tonic_body| {
            tonic::body::Body::new(PreEncodedBody {
                frame: Some(pre.frame),
                trailers_sent: false,
                _permit: pre.permit,
            })
        }),
    }
}

/// One message frame, then the OK trailers, as tonic would send them.
struct PreEncodedBody {
    frame: Option<bytes::Bytes>,
    trailers_sent: bool,
    _permit: ResponsePermit,
}

impl http_body::Body for PreEncodedBody {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if let Some(frame) = self.frame.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(frame))));
        }
        if self.trailers_sent {
            return Poll::Ready(None);
        }
        self.trailers_sent = true;
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.frame.is_none() && self.trailers_sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn room_is_shared_and_given_back_when_the_permit_goes() {
        let o = Overload::new(1, 10 * UNIT, Duration::from_millis(50));
        let a = o.room(6 * UNIT, o.deadline()).await.unwrap();
        assert_eq!(o.budget_available(), 4 * UNIT);
        // Does not fit before the deadline: shed.
        let shed = o.room(6 * UNIT, o.deadline()).await.unwrap_err();
        assert_eq!(shed.code(), tonic::Code::ResourceExhausted);
        assert_eq!(shed.message(), "etcdserver: too many requests");
        drop(a);
        let b = o.room(6 * UNIT, o.deadline()).await.unwrap();
        drop(b);
        // Larger than the whole budget: takes all of it.
        let all = o.room(100 * UNIT, o.deadline()).await.unwrap();
        assert_eq!(o.budget_available(), 0);
        drop(all);
        assert_eq!(o.budget_available(), 10 * UNIT);
    }

    /// Starts a build that holds `o`'s only slot until the sender is used
    /// (or dropped), and gives it time to take the slot.
    async fn occupy_the_only_slot(
        o: &Arc<Overload>,
    ) -> (
        tokio::task::JoinHandle<Result<i32, Status>>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let slow = {
            let o = o.clone();
            tokio::spawn(async move {
                o.build(o.deadline(), move || {
                    wait.recv().ok();
                    Ok(1)
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        (slow, release)
    }

    #[tokio::test]
    async fn builds_run_off_the_async_workers_and_queue_for_a_slot() {
        let o = Arc::new(Overload::new(1, UNIT, Duration::from_millis(50)));
        let (slow, release) = occupy_the_only_slot(&o).await;
        // The only slot is busy past the deadline: shed.
        let shed = o.build(o.deadline(), || Ok(2)).await.unwrap_err();
        assert_eq!(shed.message(), "etcdserver: too many requests");
        release.send(()).unwrap();
        assert_eq!(slow.await.unwrap().unwrap(), 1);
        assert_eq!(o.build(o.deadline(), || Ok(3)).await.unwrap(), 3);
    }

    /// The encode of a response that already has its room is never shed:
    /// it waits past the queue timeout for the slot a slow build holds.
    #[tokio::test]
    async fn finishing_work_waits_for_a_slot_past_the_queue_timeout() {
        let o = Arc::new(Overload::new(1, UNIT, Duration::from_millis(20)));
        let (slow, release) = occupy_the_only_slot(&o).await;
        let finishing = {
            let o = o.clone();
            tokio::spawn(async move { o.finish(|| Ok(2)).await })
        };
        // Well past the queue timeout, it is still waiting, not shed.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!finishing.is_finished());
        release.send(()).unwrap();
        assert_eq!(slow.await.unwrap().unwrap(), 1);
        assert_eq!(finishing.await.unwrap().unwrap(), 2);
    }

    /// Builds run on the pool's own threads, at a lower priority than the
    /// caller; a build that panics fails its request and leaves the thread
    /// serving the next one.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn builds_run_at_lower_priority_and_survive_a_panic() {
        let o = Overload::new(1, UNIT, Duration::from_secs(5));
        let (name, nice) = o
            .build(o.deadline(), || {
                let name = std::thread::current().name().map(str::to_owned);
                let tid = rustix::thread::gettid();
                Ok((
                    name,
                    rustix::process::getpriority_process(Some(tid)).unwrap(),
                ))
            })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("ephd-build-0"));
        let own = rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap();
        assert_eq!(nice, BUILDER_NICE.max(own));
        let failed = o
            .build::<(), _>(o.deadline(), || panic!("a bad build"))
            .await
            .unwrap_err();
        assert_eq!(failed.code(), tonic::Code::Internal);
        assert_eq!(o.build(o.deadline(), || Ok(7)).await.unwrap(), 7);
    }
}
