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

/// A txn nested `depth` deep: each level's success or failure branch holds
/// the next txn; the innermost puts `key`.
fn nested_txn(depth: usize, key: &str) -> ephd::proto::etcdserverpb::TxnRequest {
    use ephd::proto::etcdserverpb::{request_op::Request, RequestOp, TxnRequest};
    let mut txn = TxnRequest {
        success: vec![RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: key.as_bytes().to_vec().into(),
                value: b"deep".to_vec().into(),
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    for _ in 1..depth {
        txn = TxnRequest {
            success: vec![RequestOp {
                request: Some(Request::RequestTxn(txn)),
            }],
            ..Default::default()
        };
    }
    txn
}

/// The part of a TxnResponse the nesting test reads. The response to a
/// deeply nested txn nests as deeply as the txn, deeper than prost's
/// recursion limit lets a client decode; decoded as this, the nested
/// responses (field 3) are an unknown field, skipped without recursion.
#[derive(Clone, PartialEq, prost::Message)]
struct TxnOutcome {
    #[prost(message, optional, tag = "1")]
    header: Option<ephd::proto::etcdserverpb::ResponseHeader>,
    #[prost(bool, tag = "2")]
    succeeded: bool,
}

/// Sends a deeply nested txn. Encoding (and dropping) it recurses once per
/// level, so the client runs on a thread with a large stack.
fn send_nested(endpoint: &str, depth: usize) -> Result<(i64, bool), (tonic::Code, String)> {
    use ephd::proto::codec::ExactCodec;
    use ephd::proto::etcdserverpb::TxnRequest;
    let endpoint = endpoint.to_string();
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut grpc = tonic::client::Grpc::new(connect_channel(&endpoint).await);
                grpc.ready().await.expect("channel ready");
                let what = format!("txn nested {depth} deep");
                let call = grpc.unary(
                    tonic::Request::new(nested_txn(depth, "deep")),
                    tonic::codegen::http::uri::PathAndQuery::from_static("/etcdserverpb.KV/Txn"),
                    ExactCodec::<TxnRequest, TxnOutcome>::default(),
                );
                let resp = within(&what, call).await;
                resp.map(|r| {
                    let r = r.into_inner();
                    (r.header.map_or(0, |h| h.revision), r.succeeded)
                })
                .map_err(|s| (s.code(), s.message().to_string()))
            })
        })
        .unwrap()
        .join()
        .unwrap()
}

/// etcd lets a nested txn spend what is left of `--max-txn-ops` after its
/// parent's ops, so with the default 128 a txn nests at most ~128 deep and
/// deeper ones get "too many operations". ephd answers the same, and bounds
/// what it decodes at all (`MAX_TXN_DEPTH`) so no depth can exhaust a stack.
#[tokio::test]
async fn deeply_nested_txns_are_answered_like_etcd_and_bounded() {
    let etcd = StockEtcd::start();
    let ephd = ephd(&[]);
    for depth in [60, 100, 128, 129, 130, 200] {
        let want = send_nested(&etcd.endpoint(), depth);
        assert_eq!(send_nested(&ephd.endpoint(), depth), want, "depth {depth}");
    }
    assert!(send_nested(&etcd.endpoint(), 100).is_ok());
    let too_many = Err((
        tonic::Code::InvalidArgument,
        "etcdserver: too many operations in txn request".to_string(),
    ));
    assert_eq!(send_nested(&etcd.endpoint(), 200), too_many);
    let max = ephd::proto::nesting::MAX_TXN_DEPTH;
    assert_eq!(send_nested(&ephd.endpoint(), max + 1), too_many);
    assert_eq!(
        send_nested(&ephd.endpoint(), 1_000),
        too_many,
        "refused before decoding, however deep"
    );

    // With a larger op budget, the deepest txn ephd decodes is served: the
    // server's stacks hold it.
    let roomy = crate::support::ephd(&["--max-txn-ops", "100000"]);
    let at_max = send_nested(&roomy.endpoint(), max);
    assert!(matches!(at_max, Ok((_, true))), "{at_max:?}");
    assert_eq!(send_nested(&roomy.endpoint(), max + 1), too_many);
    let mut c = crate::harness::connect_client(&roomy.endpoint()).await;
    let got = c.get("deep", None).await.expect("get");
    assert_eq!(got.kvs()[0].value(), b"deep");
}
