//! Messages over the gRPC size limit (`--max-request-bytes` plus etcd's
//! 512 KiB of framing allowance) get the same code and text from ephd as
//! from stock etcd, on unary calls and on streams.

use std::time::Duration;

use ephd::proto::etcdserverpb::{
    kv_client::KvClient, watch_client::WatchClient, watch_request::RequestUnion, PutRequest,
    WatchCreateRequest, WatchRequest,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::harness::{connect_channel, Server, StockEtcd};
use crate::support::{ephd, within};

/// etcd's default limit: 1.5 MiB of request plus 512 KiB.
const GRPC_LIMIT: usize = 1_572_864 + 512 * 1024;

async fn oversized_put(endpoint: &str) -> (tonic::Code, String) {
    let mut kv = KvClient::new(connect_channel(endpoint).await)
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);
    let req = PutRequest {
        key: b"big".to_vec().into(),
        value: vec![b'v'; GRPC_LIMIT + 1000].into(),
        ..Default::default()
    };
    let err = within("oversized put", kv.put(req))
        .await
        .expect_err("an oversized put fails");
    (err.code(), err.message().to_string())
}

/// A watch stream whose create request is over the limit: the stream ends
/// with a status, before any answer.
async fn oversized_watch_create(endpoint: &str) -> (tonic::Code, String) {
    let (tx, rx) = mpsc::channel(1);
    tx.send(WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: vec![b'k'; GRPC_LIMIT + 1000].into(),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut watch =
        WatchClient::new(connect_channel(endpoint).await).max_encoding_message_size(usize::MAX);
    let outcome = within("oversized watch create", async {
        match watch.watch(ReceiverStream::new(rx)).await {
            Err(status) => Err(status),
            Ok(resp) => match resp.into_inner().message().await {
                Ok(Some(answer)) => panic!("answered an oversized create: {answer:?}"),
                Ok(None) => Ok(()),
                Err(status) => Err(status),
            },
        }
    })
    .await;
    drop(tx);
    let status = outcome.expect_err("the stream ends with an error, not OK");
    (status.code(), status.message().to_string())
}

#[tokio::test]
async fn oversized_messages_get_etcds_resource_exhausted() {
    let etcd = StockEtcd::start();
    let ephd = ephd(&[]);
    let want = oversized_put(&etcd.endpoint()).await;
    assert_eq!(want.0, tonic::Code::ResourceExhausted, "{want:?}");
    assert_eq!(oversized_put(&ephd.endpoint()).await, want);

    let want = oversized_watch_create(&etcd.endpoint()).await;
    assert_eq!(want.0, tonic::Code::ResourceExhausted, "{want:?}");
    assert_eq!(oversized_watch_create(&ephd.endpoint()).await, want);

    // The server still serves after both.
    let mut c = crate::harness::connect_client(&ephd.endpoint()).await;
    tokio::time::timeout(Duration::from_secs(5), c.put("after", "ok", None))
        .await
        .expect("in time")
        .expect("put");
}
