//! Connections: the loopback-only endpoint check, the pool of HTTP/2
//! connections, and the KV client that hides which `--transport` carries
//! the unary calls. Everything that opens a socket to the server is here,
//! so the "loopback only" rule has one place to live.

use crate::h2rpc;
use crate::options::{Common, Transport};
use ephd::proto::etcdserverpb::{
    kv_client::KvClient, lease_client::LeaseClient, watch_client::WatchClient, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// Resolves an endpoint to a loopback socket address, refusing anything else:
/// this tool generates load and must only ever target this machine.
pub fn resolve_endpoint(raw: &str) -> Result<SocketAddr, String> {
    let s = raw.trim();
    if s.starts_with("https://") {
        return Err(format!("{raw}: TLS endpoints are not supported"));
    }
    let hostport = s.strip_prefix("http://").unwrap_or(s).trim_end_matches('/');
    let addrs: Vec<SocketAddr> = hostport
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve endpoint {raw:?}: {e}"))?
        .collect();
    if addrs.is_empty() {
        return Err(format!("endpoint {raw:?} resolves to no address"));
    }
    if let Some(bad) = addrs.iter().find(|a| !a.ip().is_loopback()) {
        return Err(format!(
            "refusing endpoint {raw:?} ({bad}): ephd-bench only targets loopback addresses"
        ));
    }
    // Prefer IPv4: "localhost" often resolves to ::1 first while servers
    // listen on 127.0.0.1.
    Ok(*addrs.iter().find(|a| a.is_ipv4()).unwrap_or(&addrs[0]))
}

/// The connection pool: `--conns` HTTP/2 connections, round-robin over the
/// endpoints. Every client stub made from one shares its connection.
///
/// With `--transport h2` the KV connections are the lean client's
/// ([`h2rpc::Channel`]), and the tonic channels that Watch and Lease use are
/// opened lazily, on their first request, so a workload that does not watch
/// holds no idle extra connections. With `--transport tonic` everything
/// goes over the tonic channels, connected up front as before.
pub struct Pool {
    channels: Vec<Channel>,
    h2: Vec<h2rpc::Channel>,
}

impl Pool {
    /// Opens every connection (5 s connect timeout each).
    pub async fn connect(common: &Common) -> Result<Pool, String> {
        if common.endpoints.is_empty() {
            return Err("no endpoints given".into());
        }
        let addrs = common
            .endpoints
            .iter()
            .map(|e| resolve_endpoint(e))
            .collect::<Result<Vec<_>, _>>()?;
        let lean = common.transport == Transport::H2;
        let mut channels = Vec::new();
        let mut h2 = Vec::new();
        for i in 0..common.conns() {
            let addr = addrs[i % addrs.len()];
            let ep = Endpoint::from_shared(format!("http://{addr}"))
                .map_err(|e| e.to_string())?
                .connect_timeout(Duration::from_secs(5))
                .tcp_nodelay(true)
                .initial_stream_window_size(Some(4 << 20))
                .initial_connection_window_size(Some(16 << 20));
            if lean {
                h2.push(h2rpc::Channel::connect(addr, Duration::from_secs(5)).await?);
                channels.push(ep.connect_lazy());
                continue;
            }
            let ch = tokio::time::timeout(Duration::from_secs(6), ep.connect())
                .await
                .map_err(|_| format!("connecting to {addr} timed out"))?
                .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
            channels.push(ch);
        }
        Ok(Pool { channels, h2 })
    }

    /// Number of connections.
    pub fn len(&self) -> usize {
        self.channels.len()
    }

    /// The `i`-th tonic connection (wrapping).
    fn channel(&self, i: usize) -> Channel {
        self.channels[i % self.channels.len()].clone()
    }

    /// A KV client on connection `i`, with no message size limits, over
    /// the `--transport` in use.
    pub fn kv(&self, i: usize) -> Kv {
        if self.h2.is_empty() {
            return Kv::Tonic(
                KvClient::new(self.channel(i))
                    .max_decoding_message_size(usize::MAX)
                    .max_encoding_message_size(usize::MAX),
            );
        }
        let ch = &self.h2[i % self.h2.len()];
        Kv::H2(Box::new(LeanKv {
            client: h2rpc::Client::new(ch),
            put: ch.method("/etcdserverpb.KV/Put"),
            range: ch.method("/etcdserverpb.KV/Range"),
            txn: ch.method("/etcdserverpb.KV/Txn"),
        }))
    }

    /// A Lease client on connection `i`.
    pub fn lease(&self, i: usize) -> LeaseClient<Channel> {
        LeaseClient::new(self.channel(i))
    }

    /// A Watch client on connection `i`, with no message size limits.
    pub fn watch(&self, i: usize) -> WatchClient<Channel> {
        WatchClient::new(self.channel(i))
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
    }
}

/// A KV client as the workloads use it: the same `put`/`range`/`txn`
/// signatures as tonic's generated `KvClient`, over either transport, so
/// the workloads do not care which one `--transport` picked.
///
/// The tonic calls are boxed: their futures are about twice the size of
/// the lean client's (1.5 KiB against 0.9), and unboxed they would make
/// every call's future that big, to be moved into `call`'s timeout on every
/// request whichever transport is in use.
pub enum Kv {
    /// tonic's generated client.
    Tonic(KvClient<Channel>),
    /// The lean client, with its method URIs built once (boxed: it holds
    /// buffers and a header template, and is made once per client task).
    H2(Box<LeanKv>),
}

/// The lean client's per-task state for the KV service.
pub struct LeanKv {
    client: h2rpc::Client,
    put: http::Uri,
    range: http::Uri,
    txn: http::Uri,
}

impl Kv {
    /// `KV/Put`.
    pub async fn put(
        &mut self,
        request: impl tonic::IntoRequest<PutRequest>,
    ) -> Result<tonic::Response<PutResponse>, tonic::Status> {
        match self {
            Kv::Tonic(c) => Box::pin(c.put(request)).await,
            Kv::H2(l) => l.client.unary(&l.put, request).await,
        }
    }

    /// `KV/Range`.
    pub async fn range(
        &mut self,
        request: impl tonic::IntoRequest<RangeRequest>,
    ) -> Result<tonic::Response<RangeResponse>, tonic::Status> {
        match self {
            Kv::Tonic(c) => Box::pin(c.range(request)).await,
            Kv::H2(l) => l.client.unary(&l.range, request).await,
        }
    }

    /// `KV/Txn`.
    pub async fn txn(
        &mut self,
        request: impl tonic::IntoRequest<TxnRequest>,
    ) -> Result<tonic::Response<TxnResponse>, tonic::Status> {
        match self {
            Kv::Tonic(c) => Box::pin(c.txn(request)).await,
            Kv::H2(l) => l.client.unary(&l.txn, request).await,
        }
    }
}

/// Runs one request with the per-request timeout; errors become a short
/// category ("timeout", or the gRPC code) plus the message.
pub async fn call<T>(
    timeout: Duration,
    fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, (String, String)> {
    match tokio::time::timeout(timeout, fut).await {
        Err(_) => Err(("timeout".into(), format!("no answer within {timeout:?}"))),
        Ok(Err(st)) => Err((format!("{:?}", st.code()), st.message().to_string())),
        Ok(Ok(r)) => Ok(r.into_inner()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_must_be_loopback() {
        assert!(resolve_endpoint("127.0.0.1:2379").is_ok());
        assert!(resolve_endpoint("http://127.0.0.1:2379/").is_ok());
        assert!(resolve_endpoint("localhost:2379")
            .unwrap()
            .ip()
            .is_loopback());
        assert!(resolve_endpoint("10.0.0.1:2379").is_err());
        assert!(resolve_endpoint("https://127.0.0.1:2379").is_err());
    }
}
