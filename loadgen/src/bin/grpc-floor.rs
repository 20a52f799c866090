//! `grpc-floor`: etcd's KV service that does no work. Every Range, Put,
//! DeleteRange, Txn and Compact is decoded and answered at once with an
//! empty response carrying a header, over the same stack as ephd (tonic on
//! hyper and h2, tokio's multi-threaded runtime with the LIFO slot off,
//! jemalloc, TCP_NODELAY). What a client measures against it at a given
//! rate is the machine's latency floor for gRPC at that rate: the client,
//! the kernel's loopback and the HTTP/2 and gRPC layers, without a store.
//! `bench/floor.sh` puts ephd and stock etcd beside it.
//!
//! Usage: `grpc-floor [ADDRESS]` (default `127.0.0.1:2379`); loopback
//! addresses only. Runs until SIGINT or SIGTERM.

use ephd::proto::etcdserverpb::kv_server::{Kv, KvServer};
use ephd::proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RangeStreamResponse, ResponseHeader, TxnRequest,
    TxnResponse,
};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI64, Ordering};
use tonic::{Request, Response, Status};

#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Answers every call without touching any state but a revision counter,
/// so the headers look like a store's.
#[derive(Default)]
struct Floor {
    revision: AtomicI64,
}

impl Floor {
    fn header(&self, write: bool) -> Option<ResponseHeader> {
        let revision = if write {
            self.revision.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.revision.load(Ordering::Relaxed)
        };
        Some(ResponseHeader {
            cluster_id: 1,
            member_id: 1,
            revision,
            raft_term: 1,
        })
    }
}

#[tonic::async_trait]
impl Kv for Floor {
    async fn range(&self, _: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        Ok(Response::new(RangeResponse {
            header: self.header(false),
            ..Default::default()
        }))
    }

    type RangeStreamStream = tokio_stream::Empty<Result<RangeStreamResponse, Status>>;

    async fn range_stream(
        &self,
        _: Request<RangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        Err(Status::unimplemented("grpc-floor answers unary calls only"))
    }

    async fn put(&self, _: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        Ok(Response::new(PutResponse {
            header: self.header(true),
            ..Default::default()
        }))
    }

    async fn delete_range(
        &self,
        _: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        Ok(Response::new(DeleteRangeResponse {
            header: self.header(true),
            ..Default::default()
        }))
    }

    async fn txn(&self, _: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        Ok(Response::new(TxnResponse {
            header: self.header(true),
            succeeded: true,
            ..Default::default()
        }))
    }

    async fn compact(
        &self,
        _: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        Ok(Response::new(CompactionResponse {
            header: self.header(false),
        }))
    }
}

fn main() -> ExitCode {
    let arg = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:2379".into());
    let addr: SocketAddr = match arg.trim_start_matches("http://").parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("grpc-floor: {arg:?} is not an address (host:port): {e}");
            return ExitCode::from(2);
        }
    };
    if !addr.ip().is_loopback() {
        eprintln!("grpc-floor: {addr} is not a loopback address");
        return ExitCode::from(2);
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    let runtime = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("grpc-floor: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("grpc-floor: cannot listen on {addr}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        eprintln!("grpc-floor: serving etcd's KV without a store on {addr}");
        let served = tonic::transport::Server::builder()
            .add_service(KvServer::new(Floor::default()).max_decoding_message_size(usize::MAX))
            .serve_with_incoming_shutdown(incoming, stopped())
            .await;
        match served {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("grpc-floor: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Completes at SIGINT or SIGTERM.
async fn stopped() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
