//! KV.RangeStream (etcd 3.7): a Range answered as a stream of chunks, so a
//! list of a huge prefix never exists in memory whole, on the server or in
//! one message.
//!
//! What the stream carries, as etcd's: the chunks' key-values concatenated
//! in order are the unary Range's; every chunk but the last carries only
//! key-values, the last one the header, `count` and `more` too (a range
//! with nothing in it is one message with those alone). The revision is
//! fixed by the first chunk: a request for revision 0 reads every chunk at
//! the revision that was current then, and the header reports that
//! revision; a compaction past it mid-stream ends the stream with etcd's
//! "required revision has been compacted". `limit` bounds the keys over
//! the whole stream; `count` is the range's whole count at that revision,
//! as in Range. A `count_only` request is one message. A sort other than
//! etcd's default (none, or ascending by key) and the revision filters are
//! answered Unimplemented, as etcd answers them.
//!
//! Each chunk is about `--max-request-bytes` of key-values (etcd aims at
//! the same size), read on a build thread and given room in the response
//! budget like any large Range (`overload.rs`); one chunk is queued ahead
//! of the client, so a stream holds about two chunks whatever the range.

use super::{convert, shutting_down, status, stopped, Shared};
use crate::backend::Backend;
use crate::error::Error;
use crate::mvcc::{RangeRequest, SortOrder, SortTarget};
use crate::proto::etcdserverpb as pb;
use futures::Stream;
use std::pin::Pin;
use tokio::sync::mpsc;
use tonic::Status;

/// The response stream of KV.RangeStream.
pub type RangeStreamOut =
    Pin<Box<dyn Stream<Item = Result<pb::RangeStreamResponse, Status>> + Send>>;

/// Why etcd refuses a sorted RangeStream.
pub const ERR_SORT: &str = "RangeStream does not support custom sort orders";
/// Why etcd refuses a filtered RangeStream.
pub const ERR_FILTERS: &str = "RangeStream does not support revision filters";

/// Checks a request as etcd does before streaming anything.
fn check(req: &RangeRequest) -> Result<(), Status> {
    if req.key.is_empty() {
        return Err(status(Error::EmptyKey));
    }
    if req.sort_order == SortOrder::Unknown || req.sort_target == SortTarget::Unknown {
        return Err(status(Error::InvalidSortOption));
    }
    let default_order = req.sort_order == SortOrder::None
        || (req.sort_target == SortTarget::Key && req.sort_order == SortOrder::Ascend);
    if !default_order {
        return Err(Status::unimplemented(ERR_SORT));
    }
    if req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0
    {
        return Err(Status::unimplemented(ERR_FILTERS));
    }
    Ok(())
}

/// Starts answering `req` as a stream.
pub(super) async fn start(
    shared: &Shared,
    req: pb::RangeRequest,
) -> Result<RangeStreamOut, Status> {
    let serializable = req.serializable;
    let req = convert::range_request(req);
    check(&req)?;
    shared.metrics.range_total.inc();
    if !serializable {
        shared.backend.read_index().await.map_err(status)?;
    }
    let (tx, rx) = mpsc::channel(1);
    let shared = shared.clone();
    tokio::spawn(async move {
        let mut stop = shared.stop.clone();
        tokio::select! {
            result = produce(&shared, req, &tx) => {
                if let Err(s) = result {
                    if s.code() == tonic::Code::ResourceExhausted {
                        shared.metrics.shed_total.inc();
                    }
                    let _ = tx.send(Err(s)).await;
                }
            }
            _ = stopped(&mut stop) => {
                let _ = tx.send(Err(shutting_down())).await;
            }
        }
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

type Sender = mpsc::Sender<Result<pb::RangeStreamResponse, Status>>;

/// Reads and sends the chunks; returns the status to end the stream with
/// (`Ok` when it ended normally or the client went away).
async fn produce(shared: &Shared, mut req: RangeRequest, tx: &Sender) -> Result<(), Status> {
    let Shared {
        store,
        info,
        overload,
        ..
    } = shared;
    if req.count_only {
        let resp = store.range(&req).map_err(status)?;
        let out = pb::RangeResponse {
            header: info.header(resp.revision),
            count: resp.count,
            ..Default::default()
        };
        let _ = tx.send(Ok(wrap(out))).await;
        return Ok(());
    }
    let limit = if req.limit > 0 {
        req.limit as usize
    } else {
        usize::MAX
    };
    let chunk_bytes = info.max_request_bytes.max(1);
    let keys_only = req.keys_only;
    let mut sent = 0usize;
    let mut header_rev = None;
    // Room in the response budget of the chunk handed to the client last:
    // given back once the next one is queued (the channel holds one).
    let mut _held = None;
    loop {
        let deadline = overload.deadline();
        let core = store.clone();
        let read = req.clone();
        let max_kvs = limit - sent;
        let chunk = overload
            .build(deadline, move || {
                core.range_chunk(&read, max_kvs, chunk_bytes)
            })
            .await?;
        if header_rev.is_none() {
            header_rev = Some(chunk.current);
            if req.revision <= 0 {
                req.revision = chunk.revision;
            }
        }
        let size: usize = chunk
            .kvs
            .iter()
            .map(|kv| {
                kv.key.len() + if keys_only { 0 } else { kv.value.len() } + crate::mvcc::KV_OVERHEAD
            })
            .sum();
        let permit = overload.room(size as u64 + 64, deadline).await?;
        sent += chunk.kvs.len();
        let mut out = pb::RangeResponse {
            kvs: chunk
                .kvs
                .iter()
                .map(|k| convert::kv(k, keys_only))
                .collect(),
            ..Default::default()
        };
        let done = chunk.next.is_none() || sent >= limit;
        if done {
            out.header = info.header(header_rev.unwrap_or(chunk.current));
            out.more = chunk.next.is_some();
            out.count = sent as i64;
            if let Some(next) = &chunk.next {
                // The rest of the range, counted at the same revision.
                let rest = RangeRequest {
                    key: next.clone(),
                    count_only: true,
                    ..req.clone()
                };
                let core = store.clone();
                out.count += overload
                    .build(overload.deadline(), move || core.range(&rest))
                    .await?
                    .count;
            }
        }
        if tx.send(Ok(wrap(out))).await.is_err() {
            return Ok(());
        }
        _held = Some(permit);
        match chunk.next {
            Some(next) if !done => req.key = next,
            _ => return Ok(()),
        }
    }
}

fn wrap(range_response: pb::RangeResponse) -> pb::RangeStreamResponse {
    pb::RangeStreamResponse {
        range_response: Some(range_response),
    }
}
