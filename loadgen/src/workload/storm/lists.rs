//! The storm's lists: full Ranges of the prefix on their own HTTP/2
//! connections, read by [`RangeCounter`] as they stream in, each retried
//! like a client that backs off when the server sheds load.
//!
//! Not the pool's lean client: that one keeps every reply whole (right for
//! the other workloads, fatal for a storm of 10 MB replies, see `wire`) and
//! never reconnects, while a list here must survive a server that drops a
//! connection under load and retry on a new one.

use super::wire::{grpc_status, h2_status, RangeCounter};
use crate::record::{Errors, Recorder};
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, TE};
use http::{Method, Request, Uri, Version};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tonic::{Code, Status};

/// One HTTP/2 connection of the storm, opened again after it breaks.
pub struct Conn {
    addr: SocketAddr,
    uri: Uri,
    slot: tokio::sync::Mutex<Slot>,
}

/// The live connection, if any, and how many times it was opened.
#[derive(Default)]
struct Slot {
    opened: u64,
    send: Option<h2::client::SendRequest<Bytes>>,
}

impl Conn {
    /// A connection to `addr`, opened on first use.
    pub fn new(addr: SocketAddr) -> Arc<Conn> {
        let uri = format!("http://{addr}/etcdserverpb.KV/Range")
            .parse()
            .expect("an address and a path make a valid URI");
        Arc::new(Conn {
            addr,
            uri,
            slot: tokio::sync::Mutex::new(Slot::default()),
        })
    }

    /// The live connection (opened now if it is not) and its generation,
    /// which `broken` takes to close exactly that one.
    async fn sender(&self) -> Result<(u64, h2::client::SendRequest<Bytes>), Status> {
        let mut slot = self.slot.lock().await;
        if slot.send.is_none() {
            slot.send = Some(open(self.addr).await?);
            slot.opened += 1;
        }
        let send = slot.send.clone().expect("set above");
        Ok((slot.opened, send))
    }

    /// Forgets generation `opened` after a connection error, so the next
    /// attempt opens a new connection (unless another task already did).
    async fn broken(&self, opened: u64) {
        let mut slot = self.slot.lock().await;
        if slot.opened == opened {
            slot.send = None;
        }
    }

    /// Times the connection was opened (1 if it never broke).
    pub async fn opened(&self) -> u64 {
        self.slot.lock().await.opened
    }
}

/// Opens one HTTP/2 connection (plain TCP: loopback only). The windows are
/// the pool's (4 MiB per stream, 16 MiB per connection); capacity is
/// handed back as each chunk is counted, so they bound this client's
/// memory, not the server's pace.
async fn open(addr: SocketAddr) -> Result<h2::client::SendRequest<Bytes>, Status> {
    let connect = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| Status::unavailable(format!("cannot connect to {addr}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        h2::client::Builder::new()
            .initial_window_size(4 << 20)
            .initial_connection_window_size(16 << 20)
            .enable_push(false)
            .handshake::<_, Bytes>(tcp)
            .await
            .map_err(|e| Status::unavailable(format!("http2 handshake with {addr}: {e}")))
    };
    let (send, conn) = tokio::time::timeout(Duration::from_secs(5), connect)
        .await
        .map_err(|_| Status::unavailable(format!("connecting to {addr} timed out")))??;
    // Errors of the connection also reach every stream on it.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send)
}

/// The `KV/Range` request of a full list of `[key, range_end)`, framed
/// once and shared by every list of the run.
pub fn range_request(key: &Bytes, range_end: &Bytes, serializable: bool) -> Bytes {
    use prost::Message;
    let req = ephd::proto::etcdserverpb::RangeRequest {
        key: key.clone(),
        range_end: range_end.clone(),
        serializable,
        ..Default::default()
    };
    let mut buf = Vec::with_capacity(5 + req.encoded_len());
    buf.push(0);
    buf.extend_from_slice(&(req.encoded_len() as u32).to_be_bytes());
    req.encode(&mut buf).expect("a Vec grows as needed");
    Bytes::from(buf)
}

/// What every list of a run sends and expects.
#[derive(Clone)]
pub struct ListSpec {
    /// The framed request (`range_request`).
    pub request: Bytes,
    /// Keys a complete list returns at least (those preloaded).
    pub expect: u64,
    /// Bound on each attempt.
    pub timeout: Duration,
    /// Retries after a ResourceExhausted or Unavailable answer.
    pub retries: u32,
    /// Wait before the first retry; doubled for each next one, ±20%.
    pub backoff: Duration,
}

/// A list that returned.
struct Listed {
    kvs: u64,
    bytes: u64,
}

/// Why an attempt failed: (category, message), and whether the connection
/// went down with it.
struct Failed {
    kind: String,
    msg: String,
    code: Option<Code>,
    conn_lost: bool,
}

impl Failed {
    fn status(st: Status, conn_lost: bool) -> Failed {
        Failed {
            kind: format!("{:?}", st.code()),
            msg: st.message().to_string(),
            code: Some(st.code()),
            conn_lost,
        }
    }

    fn h2(err: h2::Error) -> Failed {
        let (st, lost) = h2_status(err);
        Failed::status(st, lost)
    }

    fn other(kind: &str, msg: String) -> Failed {
        Failed {
            kind: kind.into(),
            msg,
            code: None,
            conn_lost: false,
        }
    }

    /// What a client retries: the server shedding load ("etcdserver: too
    /// many requests" is ResourceExhausted) or not reachable right now.
    fn retryable(&self) -> bool {
        matches!(self.code, Some(Code::ResourceExhausted | Code::Unavailable))
    }
}

/// One attempt of one list.
async fn attempt(conn: &Conn, spec: &ListSpec) -> Result<Listed, Failed> {
    let (opened, mut send) = conn.sender().await.map_err(|st| Failed::status(st, true))?;
    let lost = |e: h2::Error| {
        let f = Failed::h2(e);
        (f.conn_lost, f)
    };
    let result = async {
        std::future::poll_fn(|cx| send.poll_ready(cx))
            .await
            .map_err(lost)?;
        let mut req = Request::new(());
        *req.method_mut() = Method::POST;
        *req.uri_mut() = conn.uri.clone();
        *req.version_mut() = Version::HTTP_2;
        let h = req.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(TE, HeaderValue::from_static("trailers"));
        let (response, mut stream) = send.send_request(req, false).map_err(lost)?;
        stream.send_data(spec.request.clone(), true).map_err(lost)?;
        let (parts, mut body) = response.await.map_err(lost)?.into_parts();
        let in_headers = match grpc_status(&parts.headers) {
            Some(Err(st)) => return Err((false, Failed::status(st, false))),
            Some(Ok(())) => true,
            None => false,
        };
        let mut counter = RangeCounter::default();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(lost)?;
            let _ = body.flow_control().release_capacity(chunk.len());
            counter
                .feed(&chunk)
                .map_err(|m| (false, Failed::other("bad reply", m)))?;
        }
        let trailers = body.trailers().await.map_err(lost)?;
        match trailers.as_ref().and_then(grpc_status) {
            Some(Err(st)) => return Err((false, Failed::status(st, false))),
            Some(Ok(())) => {}
            None if in_headers => {}
            None => {
                return Err((
                    false,
                    Failed::other("Unknown", "reply ended without grpc-status".into()),
                ))
            }
        }
        counter
            .finish()
            .map_err(|m| (false, Failed::other("bad reply", m)))?;
        Ok(Listed {
            kvs: counter.kvs,
            bytes: counter.bytes,
        })
    }
    .await;
    match result {
        Ok(l) => Ok(l),
        Err((conn_lost, f)) => {
            if conn_lost {
                conn.broken(opened).await;
            }
            Err(f)
        }
    }
}

/// One list with its retries, recorded in `rec`: its time (from its first
/// send to its complete reply, retries and backoff included) if it
/// succeeded, else one error; `retries` (and `retry_kinds`, by gRPC code)
/// for every retry; `bytes` received by the attempt that succeeded.
pub async fn list(conn: &Conn, spec: &ListSpec, rec: &mut Recorder, retry_kinds: &mut Errors) {
    let t0 = Instant::now();
    let mut retries = 0;
    loop {
        let outcome = match tokio::time::timeout(spec.timeout, attempt(conn, spec)).await {
            Ok(r) => r,
            Err(_) => Err(Failed::other(
                "timeout",
                format!("no complete reply within {:?}", spec.timeout),
            )),
        };
        match outcome {
            Ok(l) if l.kvs >= spec.expect => {
                rec.ok(t0);
                rec.count("bytes", l.bytes);
                return;
            }
            Ok(l) => {
                rec.err(&(
                    "incomplete list".into(),
                    format!("a list returned {} of {} keys", l.kvs, spec.expect),
                ));
                return;
            }
            Err(f) if f.retryable() && retries < spec.retries => {
                retries += 1;
                rec.count("retries", 1);
                retry_kinds.add(&f.kind, &f.msg);
                let jitter = 0.8 + 0.4 * rand::random::<f64>();
                let wait = spec
                    .backoff
                    .mul_f64(f64::from(1u32 << (retries - 1)) * jitter);
                tokio::time::sleep(wait).await;
            }
            Err(f) => {
                if f.retryable() {
                    rec.count("retries_exhausted", 1);
                }
                rec.err(&(f.kind, f.msg));
                return;
            }
        }
    }
}

/// What one storm did.
pub struct StormOutcome {
    /// Every list: latency of those that succeeded, errors, `retries`,
    /// `retries_exhausted` and `bytes` counters.
    pub rec: Recorder,
    /// Retries by gRPC code, with a sample message each.
    pub retry_kinds: Errors,
    /// From the storm's start to its last list's end.
    pub elapsed: Duration,
    /// Lists still running at `bound` (counted as errors too).
    pub cut: u64,
}

/// Sends `lists` lists at once, list `i` on connection `i mod conns`, and
/// waits for all of them, or until `bound`, after which the rest are
/// stopped and counted as `storm cut short` errors.
pub async fn storm(
    conns: &[Arc<Conn>],
    spec: &ListSpec,
    lists: u64,
    bound: Duration,
) -> StormOutcome {
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..lists {
        let conn = conns[i as usize % conns.len()].clone();
        let spec = spec.clone();
        tasks.spawn(async move {
            let mut rec = Recorder::default();
            let mut kinds = Errors::default();
            list(&conn, &spec, &mut rec, &mut kinds).await;
            (rec, kinds)
        });
    }
    let mut rec = Recorder::default();
    let mut retry_kinds = Errors::default();
    let deadline = tokio::time::Instant::from_std(t0 + bound);
    let mut done = 0;
    while let Ok(Some(joined)) = tokio::time::timeout_at(deadline, tasks.join_next()).await {
        done += 1;
        match joined {
            Ok((r, k)) => {
                rec.merge(r);
                retry_kinds.merge(k);
            }
            Err(e) => rec.errors.add("client task", &e.to_string()),
        }
    }
    let elapsed = t0.elapsed();
    let cut = lists - done;
    for _ in 0..cut {
        rec.errors.add(
            "storm cut short",
            &format!("list still running after the bound of {bound:?}"),
        );
    }
    tasks.abort_all();
    StormOutcome {
        rec,
        retry_kinds,
        elapsed,
        cut,
    }
}
