//! The KV service.

use super::{authz, check_size, convert, status, PreEncoded, Shared};
use crate::backend::Backend;
use crate::proto::etcdserverpb::{self as pb, kv_server::Kv};
use prost::Message;
use tonic::{Request, Response, Status};

fn count_shed(metrics: &crate::metrics::Metrics, s: &Status) {
    if s.code() == tonic::Code::ResourceExhausted {
        metrics.shed_total.inc();
    }
}

/// Serves Range, RangeStream, Put, DeleteRange, Txn and Compact.
pub struct KvService(pub Shared);

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(
        &self,
        req: Request<pb::RangeRequest>,
    ) -> Result<Response<pb::RangeResponse>, Status> {
        // Before anything else, as etcd's interceptor refuses it.
        self.0
            .backend
            .check_range_allowed(req.get_ref().serializable)?;
        let by = authz::caller(&self.0, &req).await?;
        let req = req.into_inner();
        let Shared {
            store,
            info,
            metrics,
            overload,
            ..
        } = &self.0;
        metrics.range_total.inc();
        if !req.serializable {
            self.0.backend.read_index().await.map_err(status)?;
        }
        authz::check_read(&self.0, &by, &req.key, &req.range_end)?;
        let req = convert::range_request(req);
        if req.range_end.is_empty() || req.count_only {
            // One key, or a count: small, answered right here.
            let resp = store.range(&req).map_err(status)?;
            let header = info.header(resp.revision);
            return Ok(Response::new(convert::range_response(resp, header)));
        }
        // A span of keys may be a list of thousands: built and encoded off
        // the async workers, and sent only with room in the response budget.
        let deadline = overload.deadline();
        let core = store.clone();
        let built = overload.build(deadline, move || core.range(&req)).await;
        let resp = built.inspect_err(|s| count_shed(metrics, s))?;
        let permit = overload
            .room(convert::range_response_size(&resp), deadline)
            .await
            .inspect_err(|s| count_shed(metrics, s))?;
        let header = info.header(resp.revision);
        let encode = move || PreEncoded::encode(&convert::range_response(resp, header), permit);
        // It has its room: it waits for a builder as long as it takes
        // rather than being shed after all that work.
        let pre = overload
            .finish(encode)
            .await
            .inspect_err(|s| count_shed(metrics, s))?;
        let mut out = Response::new(pb::RangeResponse::default());
        out.extensions_mut().insert(pre);
        Ok(out)
    }

    type RangeStreamStream = super::range_stream::RangeStreamOut;

    async fn range_stream(
        &self,
        req: Request<pb::RangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        super::range_stream::start(&self.0, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn put(&self, req: Request<pb::PutRequest>) -> Result<Response<pb::PutResponse>, Status> {
        let by = authz::caller(&self.0, &req).await?;
        let req = req.into_inner();
        let Shared {
            backend,
            info,
            metrics,
            ..
        } = &self.0;
        check_size(info, req.encoded_len())?;
        metrics.put_total.inc();
        let resp = backend
            .put(by, convert::put_request(req))
            .await
            .map_err(status)?;
        let header = info.header(resp.revision);
        Ok(Response::new(convert::put_response(resp, header)))
    }

    async fn delete_range(
        &self,
        req: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        let by = authz::caller(&self.0, &req).await?;
        let req = req.into_inner();
        let Shared {
            backend,
            info,
            metrics,
            ..
        } = &self.0;
        check_size(info, req.encoded_len())?;
        metrics.delete_total.inc();
        let resp = backend
            .delete_range(by, convert::delete_request(req))
            .await
            .map_err(status)?;
        let header = info.header(resp.revision);
        Ok(Response::new(convert::delete_response(resp, header)))
    }

    async fn txn(&self, req: Request<pb::TxnRequest>) -> Result<Response<pb::TxnResponse>, Status> {
        let by = authz::caller(&self.0, &req).await?;
        let req = req.into_inner();
        let Shared {
            backend,
            info,
            metrics,
            ..
        } = &self.0;
        check_size(info, req.encoded_len())?;
        metrics.txn_total.inc();
        let resp = backend
            .txn(by, convert::txn_request(req))
            .await
            .map_err(status)?;
        let header = info.header(resp.revision);
        Ok(Response::new(convert::txn_response(resp, header)))
    }

    async fn compact(
        &self,
        req: Request<pb::CompactionRequest>,
    ) -> Result<Response<pb::CompactionResponse>, Status> {
        // etcd 3.4 checks no permission for a compaction, only that a
        // token, if given, is valid.
        authz::caller(&self.0, &req).await?;
        let req = req.into_inner();
        let rev = self.0.backend.compact(req.revision).await?;
        Ok(Response::new(pb::CompactionResponse {
            header: self.0.info.header(rev),
        }))
    }
}
