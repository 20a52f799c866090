//! The faults the soak injects, one per round (SIGKILL and the damaged
//! snapshot are restarts, in `mod.rs`). Each one also checks what the
//! server must do about it; the checkpoint after the round checks that
//! nothing else suffered.

use super::model::{digest, Family, BURST_PREFIX, EVENTS_PREFIX};
use super::rawh2::{self, frame, message, Raw};
use super::watch::{list_rev, range_patiently, shed, ERR_COMPACTED};
use super::Soak;
use crate::keys::prefix_end;
use crate::pool::call;
use bytes::Bytes;
use ephd::proto::etcdserverpb::{
    kv_client::KvClient, lease_client::LeaseClient, request_op::Request, watch_client::WatchClient,
    watch_request::RequestUnion, CompactionRequest, LeaseGrantRequest, LeaseKeepAliveRequest,
    PutRequest, RangeRequest, RequestOp, TxnRequest, WatchCreateRequest, WatchRequest,
};
use std::collections::{BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;

/// The server's gauge of open watch streams.
const STREAMS_GAUGE: &str = "etcd_debugging_mvcc_watch_stream_total";
/// The server's gauge of watchers.
const WATCHERS_GAUGE: &str = "etcd_debugging_mvcc_watcher_total";
/// How long the server may take to let go of abandoned streams.
const RELEASE_WAIT: Duration = Duration::from_secs(15);
/// Where writes nobody checks go (calls abandoned in flight).
const CHAOS_PREFIX: &str = "/soak-chaos/";

/// One value of the server's `/metrics`.
async fn metric(addr: SocketAddr, name: &str) -> Result<f64, String> {
    let fetch = async {
        let mut tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("metrics: {e}"))?;
        tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n")
            .await
            .map_err(|e| format!("metrics: {e}"))?;
        let mut body = Vec::new();
        tcp.read_to_end(&mut body)
            .await
            .map_err(|e| format!("metrics: {e}"))?;
        Ok::<_, String>(String::from_utf8_lossy(&body).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .map_err(|_| "metrics: no answer".to_string())??;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .ok_or_else(|| format!("metrics: no {name}"))
}

fn watch_create(key: &str, start_revision: i64) -> WatchRequest {
    let key = Bytes::from(key.to_string());
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            range_end: prefix_end(&key),
            key,
            start_revision,
            prev_kv: true,
            ..Default::default()
        })),
    }
}

fn list_all() -> RangeRequest {
    RangeRequest {
        key: Bytes::from_static(b"/registry/"),
        range_end: prefix_end(b"/registry/"),
        ..Default::default()
    }
}

/// What a malformed request must get.
enum Expect {
    /// Exactly this code and message (etcd's answer).
    Exact(Code, String),
    /// This code, whatever the message.
    Code(Code),
    /// Any error status.
    Refused,
}

impl Soak<'_> {
    /// Abandons watch streams (mid-replay) and unary calls (big lists,
    /// puts) by resetting or closing their connections, and drops a watch
    /// stream with RST_STREAM; the server must release every one of them.
    pub(super) async fn drop_clients(&mut self) -> Result<(), String> {
        let addr = self.srv.addr;
        let metrics = self.srv.metrics;
        let streams0 = metric(metrics, STREAMS_GAUGE).await?;
        let watchers0 = metric(metrics, WATCHERS_GAUGE).await?;
        let ep = self.ep()?;
        let old = ep.compacted.load(Ordering::Acquire) + 1;
        let channel = ep.channel.clone();
        let mut held = Vec::new();
        // Watch streams replaying history, abandoned after their first
        // answers: alternately reset (RST) and closed (FIN).
        for i in 0..4 {
            let mut raw = Raw::connect(addr, i % 2 == 0, 65_535).await?;
            let (resp, stream) = raw
                .start(
                    "/etcdserverpb.Watch/Watch",
                    message(&watch_create(EVENTS_PREFIX, old)),
                    false,
                )
                .await?;
            let first = tokio::time::timeout(Duration::from_secs(5), async {
                let r = resp.await.map_err(|e| e.to_string())?;
                let mut body = r.into_body();
                body.data().await.transpose().map_err(|e| e.to_string())
            })
            .await;
            if !matches!(first, Ok(Ok(Some(_)))) {
                self.viol.add(format!(
                    "drop_clients: a replaying watch stream got no data: {first:?}"
                ));
            }
            held.push((raw, Some(stream)));
            self.stats.dropped_streams += 1;
        }
        // Big lists in flight, never read.
        for _ in 0..2 {
            let mut raw = Raw::connect(addr, true, 65_535).await?;
            for _ in 0..8 {
                let _ = raw
                    .start("/etcdserverpb.KV/Range", message(&list_all()), true)
                    .await?;
                self.stats.dropped_calls += 1;
            }
            held.push((raw, None));
        }
        // Writes in flight (outside the checked prefixes).
        let mut raw = Raw::connect(addr, true, 65_535).await?;
        for i in 0..20 {
            let put = PutRequest {
                key: Bytes::from(format!("{CHAOS_PREFIX}{i:03}")),
                value: Bytes::from(vec![b'x'; 1024]),
                ..Default::default()
            };
            let _ = raw
                .start("/etcdserverpb.KV/Put", message(&put), true)
                .await?;
            self.stats.dropped_calls += 1;
        }
        held.push((raw, None));
        // A watch stream the client cancels (RST_STREAM) on a shared
        // connection, after its first answer.
        {
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            let _ = tx.send(watch_create(EVENTS_PREFIX, old)).await;
            let mut wc = WatchClient::new(channel);
            let answer = tokio::time::timeout(Duration::from_secs(5), async {
                let mut s = wc
                    .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
                    .await?
                    .into_inner();
                s.message().await
            })
            .await;
            if !matches!(answer, Ok(Ok(Some(_)))) {
                self.viol.add(format!(
                    "drop_clients: a watch stream got no answer: {answer:?}"
                ));
            }
            self.stats.dropped_streams += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(held);
        // The server must let go of all of them.
        let deadline = Instant::now() + RELEASE_WAIT;
        loop {
            let s = metric(metrics, STREAMS_GAUGE).await?;
            let w = metric(metrics, WATCHERS_GAUGE).await?;
            if s <= streams0 && w <= watchers0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.viol.add(format!(
                    "drop_clients: {RELEASE_WAIT:?} after the clients went away the server still has {s} watch streams and {w} watchers (before: {streams0} and {watchers0})"
                ));
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The slow stream stops reading for half a round.
    pub(super) async fn stall_watchers(&mut self) -> Result<(), String> {
        let half = self.a.round / 2;
        let ep = self.ep()?;
        ep.watches.set_paused("slow", true);
        tokio::time::sleep(half).await;
        ep.watches.set_paused("slow", false);
        Ok(())
    }

    /// Requests no client should send; each must get etcd's answer (or at
    /// least an error status), and the server must go on serving.
    pub(super) async fn malformed(&mut self) -> Result<(), String> {
        let addr = self.srv.addr;
        let timeout = self.c.timeout;
        let mrb = self.max_request_bytes;
        let limit = mrb + 512 * 1024;
        let too_large = |n: usize| {
            Expect::Exact(
                Code::ResourceExhausted,
                format!("grpc: received message larger than max ({n} vs. {limit})"),
            )
        };
        let put = |key: &str, value: Vec<u8>| PutRequest {
            key: Bytes::from(key.to_string()),
            value: Bytes::from(value),
            ..Default::default()
        };
        let valid = message(&put("/soak-chaos/valid", b"v".to_vec()));
        let big = put("/soak-chaos/big", vec![b'b'; limit + 1024]);
        let big_len = prost::Message::encoded_len(&big);
        let wide = put("/soak-chaos/wide", vec![b'w'; mrb + 100]);
        let many = TxnRequest {
            success: (0..129)
                .map(|i| RequestOp {
                    request: Some(Request::RequestPut(put(
                        &format!("/soak-chaos/many-{i}"),
                        b"m".to_vec(),
                    ))),
                })
                .collect(),
            ..Default::default()
        };
        let big_watch = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: Bytes::from(vec![b'k'; limit + 10]),
                ..Default::default()
            })),
        };
        let big_watch_len = prost::Message::encoded_len(&big_watch);
        let kv = |m: &str| format!("/etcdserverpb.KV/{m}");
        let cases: Vec<(&str, String, Bytes, Expect)> = vec![
            (
                "garbage protobuf",
                kv("Put"),
                frame(0, 6, &[0xff; 6]),
                Expect::Code(Code::Internal),
            ),
            (
                "a message over the gRPC limit",
                kv("Put"),
                message(&big),
                too_large(big_len),
            ),
            (
                "a length prefix of 4 GiB",
                kv("Put"),
                frame(0, 0xffff_fff0, &[0; 16]),
                too_large(0xffff_fff0),
            ),
            (
                "a message cut short",
                kv("Put"),
                frame(0, 100, &valid[5..]),
                Expect::Refused,
            ),
            (
                "a compressed flag without grpc-encoding",
                kv("Put"),
                frame(1, (valid.len() - 5) as u32, &valid[5..]),
                Expect::Refused,
            ),
            (
                "an unknown compression flag",
                kv("Put"),
                frame(7, (valid.len() - 5) as u32, &valid[5..]),
                Expect::Refused,
            ),
            (
                "a put over --max-request-bytes",
                kv("Put"),
                message(&wide),
                Expect::Exact(
                    Code::InvalidArgument,
                    "etcdserver: request is too large".into(),
                ),
            ),
            (
                "a put without a key",
                kv("Put"),
                message(&put("", b"v".to_vec())),
                Expect::Exact(
                    Code::InvalidArgument,
                    "etcdserver: key is not provided".into(),
                ),
            ),
            (
                "a txn with 129 operations",
                kv("Txn"),
                message(&many),
                Expect::Exact(
                    Code::InvalidArgument,
                    "etcdserver: too many operations in txn request".into(),
                ),
            ),
            (
                "an unknown method",
                kv("Nope"),
                valid.clone(),
                Expect::Code(Code::Unimplemented),
            ),
            (
                "a watch create of garbage",
                "/etcdserverpb.Watch/Watch".into(),
                frame(0, 6, &[0xff; 6]),
                Expect::Refused,
            ),
            (
                "a watch create over the gRPC limit",
                "/etcdserverpb.Watch/Watch".into(),
                message(&big_watch),
                too_large(big_watch_len),
            ),
        ];
        for (what, path, body, expect) in cases {
            let mut raw = Raw::connect(addr, false, 1 << 20).await?;
            let reply = raw.unary(&path, body, timeout).await;
            self.stats.malformed_cases += 1;
            let ok = match (&expect, reply.code) {
                (Expect::Exact(code, msg), Some(c)) => c == *code && reply.message == *msg,
                (Expect::Code(code), Some(c)) => c == *code,
                (Expect::Refused, Some(c)) => c != Code::Ok,
                (_, None) => false,
            };
            if !ok {
                let want = match &expect {
                    Expect::Exact(c, m) => format!("{c:?} {m:?}"),
                    Expect::Code(c) => format!("{c:?}"),
                    Expect::Refused => "an error status".into(),
                };
                self.viol.add(format!(
                    "malformed: {what}: got {:?} {:?}, expected {want}",
                    reply.code, reply.message
                ));
            }
        }
        // Not HTTP at all, and HTTP/2 with a broken frame: the server must
        // close the connection. An HTTP/1.1 request is served as etcd
        // serves it on the client port (the JSON gateway and the health
        // endpoints): asked to close, the server must answer and close.
        let junk: Vec<u8> = (0..2048u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        // A SETTINGS frame whose length is not a multiple of 6: a
        // connection error (FRAME_SIZE_ERROR).
        preface.extend_from_slice(&[0, 0, 5, 4, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5]);
        for (what, bytes) in [
            (
                "an HTTP/1.1 request asking to close",
                b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
            ),
            ("random bytes", junk),
            (
                "an HTTP/2 preface, then a malformed SETTINGS frame",
                preface,
            ),
        ] {
            self.stats.malformed_cases += 1;
            match rawh2::garbage_is_refused(addr, &bytes, Duration::from_secs(10)).await {
                Ok(true) => {}
                Ok(false) => self.viol.add(format!(
                    "malformed: {what}: the server kept the connection open for 10 s"
                )),
                Err(e) => self.viol.add(format!("malformed: {what}: {e}")),
            }
        }
        // Still serving.
        let ep = self.ep()?;
        let mut tries = 0;
        loop {
            let req = put("/soak-chaos/after-malformed", b"ok".to_vec());
            match call(timeout, ep.kv.put(req)).await {
                Ok(_) => return Ok(()),
                Err((_, m)) if shed(&m) && tries < 10 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(200 * tries)).await;
                }
                Err((k, m)) => {
                    return Err(format!(
                        "a put after the malformed requests failed: {k}: {m}"
                    ))
                }
            }
        }
    }

    /// A lease with `--burst-keys` keys and a short TTL expires: the keys
    /// go, and every events watcher sees each DELETE once, all at one
    /// revision.
    pub(super) async fn lease_burst(&mut self) -> Result<(), String> {
        let n = self.a.burst_keys;
        let ttl = self.a.burst_ttl.max(2);
        let timeout = self.c.timeout;
        self.stats.bursts += 1;
        let prefix = format!("{BURST_PREFIX}{:04}/", self.stats.bursts);
        let model = self.model.clone();
        let viol = self.viol.clone();
        let ep = self.ep.as_mut().ok_or("no server connection")?;
        let mut leases = LeaseClient::new(ep.channel.clone());
        let sent = Instant::now();
        let grant = call(
            timeout,
            leases.lease_grant(LeaseGrantRequest { ttl, id: 0 }),
        )
        .await
        .map_err(|(k, m)| format!("granting the burst lease: {k}: {m}"))?;
        let id = grant.id;
        model.lock().lease_granted(id, ttl, sent);
        let conc = 32.min(n.max(1));
        let mut tasks = Vec::new();
        for t in 0..conc {
            let mut kv = ep.pool.kv(t);
            let (model, viol, prefix) = (model.clone(), viol.clone(), prefix.clone());
            tasks.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in (t..n).step_by(conc) {
                    let key = Bytes::from(format!("{prefix}k-{i:05}"));
                    let value = Bytes::from(format!("burst value {i} of lease {id:x}"));
                    let hash = digest(&value);
                    model.lock().sent(&key, Family::Events, hash, id);
                    let put = PutRequest {
                        key: key.clone(),
                        value,
                        lease: id,
                        ..Default::default()
                    };
                    match call(timeout, kv.put(put)).await {
                        Ok(r) => {
                            let rev = r.header.map_or(0, |h| h.revision);
                            if let Err(e) = model.lock().acked(&key, rev, hash) {
                                viol.add(e);
                            }
                            acked.push((rev, key));
                        }
                        Err(_) => model.lock().failed(&key, hash),
                    }
                }
                acked
            }));
        }
        let mut acked = Vec::new();
        for t in tasks {
            acked.extend(t.await.map_err(|e| format!("burst writer: {e}"))?);
        }
        let put_s = sent.elapsed();
        // Restart the TTL now that every key is attached, so the whole
        // burst expires together however long the puts took.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let _ = tx.send(LeaseKeepAliveRequest { id }).await;
        let refreshed = Instant::now();
        let ka = tokio::time::timeout(timeout, async {
            let mut s = leases
                .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await?
                .into_inner();
            s.message().await
        })
        .await;
        match ka {
            Ok(Ok(Some(r))) if r.ttl > 0 => {
                model.lock().lease_granted(id, ttl, refreshed);
            }
            other => {
                return Err(format!(
                    "keeping the burst lease alive after {put_s:?} of puts failed: {other:?}"
                ))
            }
        }
        drop(tx);
        let Some(first) = acked.iter().map(|(r, _)| *r).min() else {
            return Err("no burst put was acknowledged".into());
        };
        // The keys go once the TTL is over.
        let deadline = refreshed + Duration::from_secs(ttl as u64 + 15);
        let pfx = Bytes::from(prefix.clone());
        loop {
            let count = RangeRequest {
                range_end: prefix_end(&pfx),
                key: pfx.clone(),
                count_only: true,
                ..Default::default()
            };
            let left = range_patiently(&mut ep.kv, count, timeout)
                .await
                .map_err(|(k, m)| format!("counting burst keys: {k}: {m}"))?
                .count;
            if left == 0 {
                let s = refreshed.elapsed().as_secs_f64();
                self.stats.burst_expiry_max_s = self.stats.burst_expiry_max_s.max(s);
                if s + 1.0 < ttl as f64 {
                    self.viol.add(format!(
                        "lease_burst: the keys were gone {s:.1} s after the lease's last keep-alive, before its TTL of {ttl} s"
                    ));
                }
                break;
            }
            if Instant::now() >= deadline {
                self.viol.add(format!(
                    "lease_burst: {left} keys of lease {id:x} still there {:?} after its TTL of {ttl} s",
                    refreshed.elapsed()
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Every events watcher that saw the puts sees every DELETE.
        let want: HashSet<Bytes> = acked.into_iter().map(|(_, k)| k).collect();
        let deadline = Instant::now() + Duration::from_secs(15);
        while !ep.watches.burst_deletes_at_least(first, want.len()) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for (name, dels) in ep.watches.take_burst_deletes(first) {
            let mine: Vec<_> = dels
                .into_iter()
                .filter(|(_, k)| k.starts_with(prefix.as_bytes()))
                .collect();
            let keys: HashSet<&Bytes> = mine.iter().map(|(_, k)| k).collect();
            let revs: BTreeSet<i64> = mine.iter().map(|(r, _)| *r).collect();
            let missing = want.iter().filter(|k| !keys.contains(k)).count();
            if missing > 0 || keys.len() != mine.len() || revs.len() != 1 {
                self.viol.add(format!(
                    "lease_burst: {name} got {} DELETEs of the {} keys ({missing} missing, {} repeated) at {} revisions {:?}, expected each once at one revision",
                    mine.len(),
                    want.len(),
                    mine.len() - keys.len(),
                    revs.len(),
                    revs.iter().take(3).collect::<Vec<_>>()
                ));
            }
            self.stats.burst_deletes_checked += mine.len() as u64;
        }
        Ok(())
    }

    /// Compacts to the current revision while the slow stream is not
    /// reading; also checks that a watch created below the compaction is
    /// created, then canceled as compacted.
    pub(super) async fn compact_mid_watch(&mut self) -> Result<(), String> {
        let pause = self.a.round / 3;
        let timeout = self.c.timeout;
        let ep = self.ep.as_mut().ok_or("no server connection")?;
        ep.watches.set_paused("slow", true);
        tokio::time::sleep(pause).await;
        let rev = list_rev(&mut ep.kv, timeout).await?;
        ep.compacted.fetch_max(rev, Ordering::AcqRel);
        let mut kv = KvClient::new(ep.channel.clone());
        match call(
            timeout,
            kv.compact(CompactionRequest {
                revision: rev,
                physical: true,
            }),
        )
        .await
        {
            Ok(_) => {}
            Err((_, m)) if m == ERR_COMPACTED => {}
            Err((k, m)) => return Err(format!("compacting to {rev}: {k}: {m}")),
        }
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let _ = tx.send(watch_create(EVENTS_PREFIX, rev - 1)).await;
        let mut wc = WatchClient::new(ep.channel.clone());
        let answers = tokio::time::timeout(timeout, async {
            let mut s = wc
                .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await?
                .into_inner();
            let a = s.message().await?;
            let b = s.message().await?;
            Ok::<_, tonic::Status>((a, b))
        })
        .await;
        let requested = ep.compacted.load(Ordering::Acquire);
        match answers {
            Ok(Ok((Some(a), Some(b))))
                if a.created
                    && !a.canceled
                    && b.canceled
                    && b.watch_id == a.watch_id
                    && b.compact_revision >= rev
                    && b.compact_revision <= requested => {}
            other => self.viol.add(format!(
                "compact_mid_watch: a watch from revision {} below the compaction at {rev} got {other:?}, expected created, then canceled with compact_revision {rev} ({ERR_COMPACTED})",
                rev - 1
            )),
        }
        drop(tx);
        self.stats.below_compaction_cancels += 1;
        ep.watches.set_paused("slow", false);
        Ok(())
    }

    /// `--storm` lists of every object at once, half whole, half in pages
    /// of 500 pinned to the first page's revision.
    pub(super) async fn list_storm(&mut self) -> Result<(), String> {
        let n = self.a.storm;
        let timeout = self.c.timeout;
        let ep = self.ep()?;
        let compacted = ep.compacted.clone();
        let mut tasks = Vec::new();
        for i in 0..n {
            let mut kv = ep.pool.kv(i);
            tasks.push(tokio::spawn(async move {
                let t0 = Instant::now();
                let mut bytes = 0usize;
                if i % 2 == 0 {
                    let r = call(timeout, kv.range(list_all())).await?;
                    if r.more || r.count != r.kvs.len() as i64 {
                        return Err((
                            "incomplete list".to_string(),
                            format!("{} of {} objects", r.kvs.len(), r.count),
                        ));
                    }
                    bytes += r
                        .kvs
                        .iter()
                        .map(|kv| kv.key.len() + kv.value.len())
                        .sum::<usize>();
                } else {
                    let mut req = list_all();
                    req.limit = 500;
                    let mut got = 0i64;
                    let mut want = None;
                    let mut at = 0;
                    let mut last: Option<Bytes> = None;
                    loop {
                        let r = match call(timeout, kv.range(req.clone())).await {
                            // The pinned revision was compacted between two
                            // pages: etcd's answer (the apiserver's "continue
                            // token expired"), legitimate once a compaction
                            // past it was requested; checked by the caller.
                            Err((_, m)) if at > 0 && m == ERR_COMPACTED => {
                                return Err(("expired".to_string(), at.to_string()))
                            }
                            other => other?,
                        };
                        let rev = r.header.as_ref().map_or(0, |h| h.revision);
                        // A header carries the store's current revision,
                        // not the one the page was read at.
                        if at == 0 {
                            at = rev;
                            want = Some(r.count);
                            req.revision = rev;
                        } else if rev < at {
                            return Err((
                                "incomplete list".to_string(),
                                format!("a page after revision {at} has the header revision {rev}"),
                            ));
                        }
                        for kv in &r.kvs {
                            if last.as_ref().is_some_and(|l| kv.key <= *l) {
                                return Err((
                                    "incomplete list".to_string(),
                                    "pages out of key order".to_string(),
                                ));
                            }
                            last = Some(kv.key.clone());
                            bytes += kv.key.len() + kv.value.len();
                        }
                        got += r.kvs.len() as i64;
                        if !r.more {
                            break;
                        }
                        let mut next = last.clone().unwrap_or_default().to_vec();
                        next.push(0);
                        req.key = Bytes::from(next);
                    }
                    // A paginated list at the first page's revision sees the
                    // count that page reported, minus what earlier pages
                    // already passed: exactly that many objects.
                    if Some(got) != want {
                        return Err((
                            "incomplete list".to_string(),
                            format!("pages gave {got} objects, the first page counted {want:?}"),
                        ));
                    }
                }
                Ok((bytes, t0.elapsed()))
            }));
        }
        for t in tasks {
            match t.await.map_err(|e| format!("storm task: {e}"))? {
                Ok((bytes, took)) => {
                    self.stats.storm_lists += 1;
                    self.stats.storm_mib += bytes as f64 / (1 << 20) as f64;
                    self.stats.storm_max_s = self.stats.storm_max_s.max(took.as_secs_f64());
                }
                Err((k, m)) if k == "ResourceExhausted" && shed(&m) => self.stats.storm_shed += 1,
                Err((k, _)) if k == "timeout" => self.stats.storm_timeouts += 1,
                Err((k, at)) if k == "expired" => {
                    let requested = compacted.load(Ordering::Acquire);
                    if at.parse::<i64>().is_ok_and(|at| at < requested) {
                        self.stats.storm_expired += 1;
                    } else {
                        self.viol.add(format!(
                            "list_storm: pages pinned to revision {at} were refused as compacted, above any compaction requested ({requested})"
                        ));
                    }
                }
                Err((k, m)) => self
                    .viol
                    .add(format!("list_storm: a list failed: {k}: {m}")),
            }
        }
        Ok(())
    }
}
