//! KV.RangeStream (etcd 3.7) through a raw tonic client: every streamed
//! answer is compared with ephd's unary Range of the same request, and the
//! same requests go to stock etcd 3.7, whose merged answers and refusals
//! ephd's must equal (chunk boundaries are each server's own).

use ephd::proto::etcdserverpb::{
    kv_client::KvClient, range_request::SortOrder, range_request::SortTarget, CompactionRequest,
    PutRequest, RangeRequest, RangeResponse, RangeStreamResponse,
};
use tonic::transport::Channel;
use tonic::{Code, Streaming};

use crate::harness::{Ephd, Server, StockEtcd, RPC_TIMEOUT};

const VALUE: usize = 50 * 1024;

async fn client(server: &impl Server) -> KvClient<Channel> {
    // A small window: the server cannot run far ahead of what is read,
    // so a test can act between chunks.
    let channel = tonic::transport::Endpoint::from_shared(server.endpoint())
        .expect("endpoint")
        .connect_timeout(RPC_TIMEOUT)
        .initial_stream_window_size(65_535)
        .connect()
        .await
        .expect("connect");
    KvClient::new(channel).max_decoding_message_size(64 << 20)
}

async fn put(kv: &mut KvClient<Channel>, key: &str, size: usize) -> i64 {
    kv.put(PutRequest {
        key: key.as_bytes().to_vec().into(),
        value: vec![b'v'; size].into(),
        ..Default::default()
    })
    .await
    .expect("put")
    .into_inner()
    .header
    .expect("header")
    .revision
}

/// 300 keys of 50 KiB (15 MB: about ten chunks) and a few small ones.
async fn fill(kv: &mut KvClient<Channel>) -> i64 {
    for i in 0..300 {
        put(kv, &format!("big/{i:03}"), VALUE).await;
    }
    let mut last = 0;
    for i in 0..5 {
        last = put(kv, &format!("small/{i}"), 10).await;
    }
    last
}

fn prefix(p: &str) -> RangeRequest {
    let mut end = p.as_bytes().to_vec();
    *end.last_mut().expect("non-empty") += 1;
    RangeRequest {
        key: p.as_bytes().to_vec().into(),
        range_end: end.into(),
        ..Default::default()
    }
}

/// Reads the whole stream; checks that only the last message carries the
/// header, count and more; returns the messages merged, and how many.
async fn merged(
    stream: &mut Streaming<RangeStreamResponse>,
) -> Result<(RangeResponse, usize), tonic::Status> {
    let mut parts = Vec::new();
    while let Some(msg) = stream.message().await? {
        parts.push(msg.range_response.expect("range_response"));
    }
    let n = parts.len();
    assert!(n >= 1, "at least one message");
    let mut out = RangeResponse::default();
    for (i, part) in parts.into_iter().enumerate() {
        if i + 1 < n {
            assert!(
                part.header.is_none() && part.count == 0 && !part.more && !part.kvs.is_empty(),
                "middle chunk {i} carries key-values only: header {:?} count {} more {}",
                part.header,
                part.count,
                part.more
            );
        } else {
            assert!(part.header.is_some(), "the last chunk has the header");
            out.header = part.header;
            out.count = part.count;
            out.more = part.more;
        }
        out.kvs.extend(part.kvs);
    }
    Ok((out, n))
}

async fn streamed(kv: &mut KvClient<Channel>, req: RangeRequest) -> (RangeResponse, usize) {
    let mut stream = kv
        .range_stream(req)
        .await
        .expect("range_stream")
        .into_inner();
    merged(&mut stream).await.expect("stream")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_chunks_merge_into_the_unary_range() {
    let server = Ephd::start(&[]);
    let mut kv = client(&server).await;
    let before_small = fill(&mut kv).await - 5;
    let key_asc = RangeRequest {
        sort_order: SortOrder::Ascend as i32,
        sort_target: SortTarget::Key as i32,
        ..prefix("big/")
    };
    let cases = [
        ("a prefix of 10 MB", prefix("big/"), true),
        (
            "every key",
            RangeRequest {
                range_end: vec![0].into(),
                ..prefix("big/")
            },
            true,
        ),
        (
            "a limit",
            RangeRequest {
                limit: 70,
                ..prefix("big/")
            },
            true,
        ),
        (
            "a limit above the count",
            RangeRequest {
                limit: 1000,
                ..prefix("small/")
            },
            false,
        ),
        (
            "keys only",
            RangeRequest {
                keys_only: true,
                ..prefix("big/")
            },
            false,
        ),
        (
            "count only",
            RangeRequest {
                count_only: true,
                ..prefix("big/")
            },
            false,
        ),
        (
            "an older revision",
            RangeRequest {
                revision: before_small,
                range_end: vec![0].into(),
                ..prefix("big/")
            },
            true,
        ),
        ("ascending by key", key_asc, true),
        (
            "one key",
            RangeRequest {
                range_end: Default::default(),
                ..prefix("big/007")
            },
            false,
        ),
        ("no key", prefix("nothing/"), false),
        (
            "an empty span",
            RangeRequest {
                range_end: b"a".to_vec().into(),
                ..prefix("b")
            },
            false,
        ),
    ];
    for (what, req, chunked) in cases {
        let unary = kv.range(req.clone()).await.expect("range").into_inner();
        let (merged, messages) = streamed(&mut kv, req).await;
        assert_eq!(merged, unary, "{what}");
        assert_eq!(messages > 1, chunked, "{what}: {messages} messages");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_chunk_fixes_the_revision_and_compaction_ends_the_stream() {
    let server = Ephd::start(&[]);
    let mut kv = client(&server).await;
    let rev = fill(&mut kv).await;
    let unary = kv.range(prefix("big/")).await.expect("range").into_inner();

    // Writes after the first chunk are not seen by the later ones.
    let mut stream = kv
        .range_stream(prefix("big/"))
        .await
        .expect("stream")
        .into_inner();
    let first = stream.message().await.expect("first").expect("some");
    let newer = put(&mut kv, "big/999", 10).await;
    assert!(newer > rev);
    let (rest, _) = merged(&mut stream).await.expect("rest");
    let mut kvs = first.range_response.expect("range_response").kvs;
    kvs.extend(rest.kvs);
    assert_eq!(kvs, unary.kvs, "the stream reads at its first revision");
    assert_eq!(rest.header.expect("header").revision, rev);
    assert_eq!(rest.count, unary.count);

    // A compaction past that revision mid-stream ends it as etcd does.
    let mut stream = kv
        .range_stream(prefix("big/"))
        .await
        .expect("stream")
        .into_inner();
    stream.message().await.expect("first").expect("some");
    let later = put(&mut kv, "other", 10).await;
    kv.compact(CompactionRequest {
        revision: later,
        physical: false,
    })
    .await
    .expect("compact");
    let err = merged(&mut stream).await.expect_err("compacted mid-stream");
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert_eq!(
        err.message(),
        "etcdserver: mvcc: required revision has been compacted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_etcd_refuses_is_refused() {
    let server = Ephd::start(&[]);
    let mut kv = client(&server).await;
    let rev = put(&mut kv, "a", 1).await;
    let cases = [
        (
            RangeRequest {
                sort_order: SortOrder::Descend as i32,
                ..prefix("a")
            },
            Code::Unimplemented,
            "RangeStream does not support custom sort orders",
        ),
        (
            RangeRequest {
                sort_order: SortOrder::Ascend as i32,
                sort_target: SortTarget::Mod as i32,
                ..prefix("a")
            },
            Code::Unimplemented,
            "RangeStream does not support custom sort orders",
        ),
        (
            RangeRequest {
                min_mod_revision: 1,
                ..prefix("a")
            },
            Code::Unimplemented,
            "RangeStream does not support revision filters",
        ),
        (
            RangeRequest {
                key: Default::default(),
                ..prefix("a")
            },
            Code::InvalidArgument,
            "etcdserver: key is not provided",
        ),
        (
            RangeRequest {
                revision: rev + 10,
                ..prefix("a")
            },
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision",
        ),
    ];
    for (req, code, message) in cases {
        let err = match kv.range_stream(req.clone()).await {
            Err(e) => e,
            Ok(resp) => merged(&mut resp.into_inner())
                .await
                .expect_err(&format!("{req:?} is refused")),
        };
        assert_eq!((err.code(), err.message()), (code, message), "{req:?}");
    }
}

/// A streamed answer as compared between servers: the merged key-values,
/// count, more and revision, or the refusal.
async fn answer(kv: &mut KvClient<Channel>, req: RangeRequest) -> Result<RangeResponse, String> {
    let result = match kv.range_stream(req).await {
        Err(e) => Err(e),
        Ok(resp) => merged(&mut resp.into_inner()).await.map(|(r, _)| r),
    };
    result
        .map(|mut r| {
            if let Some(h) = r.header.as_mut() {
                (h.cluster_id, h.member_id, h.raft_term) = (0, 0, 0);
            }
            r
        })
        .map_err(|e| format!("{:?}: {}", e.code(), e.message()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_stream_answers_as_stock_etcd_3_7() {
    let etcd = StockEtcd::start_release("etcd-3.7", &[]);
    let ours = Ephd::start(&["--etcd-compat"]);
    let (mut theirs, mut mine) = (client(&etcd).await, client(&ours).await);
    let mut last = 0;
    for kv in [&mut theirs, &mut mine] {
        for i in 0..60 {
            put(kv, &format!("big/{i:03}"), VALUE).await;
        }
        for i in 0..5 {
            last = put(kv, &format!("small/{i}"), 10).await;
        }
    }
    let all = RangeRequest {
        key: b"\0".to_vec().into(),
        range_end: b"\0".to_vec().into(),
        ..Default::default()
    };
    let cases = [
        prefix("big/"),
        prefix("small/"),
        all.clone(),
        RangeRequest {
            limit: 7,
            ..prefix("big/")
        },
        RangeRequest {
            keys_only: true,
            ..all.clone()
        },
        RangeRequest {
            count_only: true,
            ..all.clone()
        },
        RangeRequest {
            revision: last - 3,
            ..prefix("small/")
        },
        RangeRequest {
            sort_order: SortOrder::Ascend as i32,
            sort_target: SortTarget::Key as i32,
            ..prefix("small/")
        },
        RangeRequest {
            sort_order: SortOrder::Descend as i32,
            ..prefix("small/")
        },
        RangeRequest {
            max_create_revision: 3,
            ..prefix("big/")
        },
        RangeRequest {
            key: Default::default(),
            ..prefix("big/")
        },
        RangeRequest {
            revision: last + 10,
            ..prefix("big/")
        },
        RangeRequest {
            serializable: true,
            ..prefix("missing/")
        },
    ];
    for req in cases {
        let want = answer(&mut theirs, req.clone()).await;
        let got = answer(&mut mine, req.clone()).await;
        assert_eq!(got, want, "{req:?}: ephd (left) and etcd 3.7 (right)");
    }
}
