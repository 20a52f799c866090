//! Tests of the storm's accounting: the streaming key counter against
//! prost's encoding, a list's retries against a scripted server that sheds
//! load or drops connections, and a tiny storm against ephd in-process.

use super::lists::{list, range_request, Conn, ListSpec};
use super::wire::RangeCounter;
use crate::record::{Errors, Recorder};
use bytes::{Bytes, BytesMut};
use ephd::proto::etcdserverpb::{RangeResponse, ResponseHeader};
use ephd::proto::mvccpb::KeyValue;
use http::HeaderMap;
use prost::Message;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `n` keys of ~`size` bytes each, framed as a unary gRPC reply.
fn reply(n: usize, size: usize) -> Bytes {
    let msg = RangeResponse {
        header: Some(ResponseHeader {
            cluster_id: 1,
            member_id: 2,
            revision: 1234567,
            raft_term: 3,
        }),
        kvs: (0..n)
            .map(|i| KeyValue {
                key: Bytes::from(format!("/registry/events/ns/{i}")),
                value: Bytes::from(vec![b'v'; size]),
                create_revision: 5,
                mod_revision: 300 + i as i64,
                version: 1,
                lease: 0,
            })
            .collect(),
        more: true,
        count: n as i64 + 7,
    };
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&[0]);
    buf.extend_from_slice(&(msg.encoded_len() as u32).to_be_bytes());
    msg.encode(&mut buf).unwrap();
    buf.freeze()
}

#[test]
fn the_counter_counts_keys_whatever_the_chunking() {
    for (n, size) in [(0, 0), (1, 0), (3, 200), (50, 1024), (2, 70_000)] {
        let framed = reply(n, size);
        for chunk in [1, 2, 5, 7, 13, 4096, usize::MAX] {
            let mut c = RangeCounter::default();
            for part in framed.chunks(chunk.min(framed.len())) {
                c.feed(part).unwrap();
            }
            c.finish().unwrap();
            assert_eq!(c.kvs, n as u64, "n {n} size {size} chunk {chunk}");
            assert_eq!(c.count, n as i64 + 7);
            assert!(c.more);
            assert_eq!(c.bytes, framed.len() as u64);
        }
    }
    // An empty reply message (all defaults) is complete and has no keys.
    let mut c = RangeCounter::default();
    c.feed(&[0, 0, 0, 0, 0]).unwrap();
    c.finish().unwrap();
    assert_eq!((c.kvs, c.count, c.more), (0, 0, false));
}

#[test]
fn the_counter_refuses_broken_replies() {
    let framed = reply(10, 100);
    // Cut anywhere: never complete.
    for cut in [1, 4, 5, 6, 40, framed.len() - 1] {
        let mut c = RangeCounter::default();
        c.feed(&framed[..cut]).unwrap();
        assert!(c.finish().is_err(), "cut at {cut}");
    }
    assert!(RangeCounter::default().finish().is_err());
    // Compressed flag.
    let mut bad = framed.to_vec();
    bad[0] = 1;
    assert!(RangeCounter::default().feed(&bad).is_err());
    // A field longer than the message.
    let mut c = RangeCounter::default();
    assert!(c.feed(&[0, 0, 0, 0, 3, 0x12, 0x7f, 0]).is_err());
    // A group (wire type 3).
    let mut c = RangeCounter::default();
    assert!(c.feed(&[0, 0, 0, 0, 2, 0x0b, 0]).is_err());
    // Anything after the message is ignored, as gRPC clients do.
    let mut c = RangeCounter::default();
    c.feed(&framed).unwrap();
    c.feed(&framed).unwrap();
    c.finish().unwrap();
    assert_eq!(c.kvs, 10);
}

// ---------------------------------------------------------------
// A scripted server: request `i` (from 0) of the whole server sheds load
// while `i < shed`, the connection is dropped at request `drop_at`, and
// every other request gets `keys` keys.

struct Script {
    shed: u64,
    drop_at: u64,
    keys: usize,
    seen: AtomicU64,
}

fn ok_trailers() -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", "0".parse().unwrap());
    t
}

async fn scripted(script: Arc<Script>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let script = script.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(tcp).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    let i = script.seen.fetch_add(1, Ordering::SeqCst);
                    if i == script.drop_at {
                        // Drop the whole connection with the request open.
                        return;
                    }
                    let script = script.clone();
                    tokio::spawn(async move {
                        let mut body = req.into_body();
                        while let Some(Ok(c)) = body.data().await {
                            let _ = body.flow_control().release_capacity(c.len());
                        }
                        let mut head = http::Response::builder()
                            .status(200)
                            .header("content-type", "application/grpc");
                        if i < script.shed {
                            head = head
                                .header("grpc-status", "8")
                                .header("grpc-message", "etcdserver: too many requests");
                            let _ = respond.send_response(head.body(()).unwrap(), true);
                            return;
                        }
                        let mut tx = respond
                            .send_response(head.body(()).unwrap(), false)
                            .unwrap();
                        let _ = tx.send_data(reply(script.keys, 64), false);
                        let _ = tx.send_trailers(ok_trailers());
                    });
                }
            });
        }
    });
    addr
}

fn spec(expect: u64) -> ListSpec {
    let p = Bytes::from_static(b"/registry/events/");
    ListSpec {
        request: range_request(&p, &crate::keys::prefix_end(&p), false),
        expect,
        timeout: Duration::from_secs(10),
        retries: 3,
        backoff: Duration::from_millis(1),
    }
}

async fn one_list(script: Script, expect: u64) -> (Recorder, Errors, u64) {
    let addr = scripted(Arc::new(script)).await;
    let conn = Conn::new(addr);
    let (mut rec, mut kinds) = (Recorder::default(), Errors::default());
    list(&conn, &spec(expect), &mut rec, &mut kinds).await;
    let opened = conn.opened().await;
    (rec, kinds, opened)
}

#[tokio::test]
async fn shed_lists_are_retried_and_counted() {
    let script = |shed, drop_at, keys| Script {
        shed,
        drop_at,
        keys,
        seen: AtomicU64::new(0),
    };
    // Shed twice, then served.
    let (rec, kinds, opened) = one_list(script(2, u64::MAX, 20), 20).await;
    assert_eq!((rec.ops, rec.errors.total()), (1, 0));
    assert_eq!(rec.counters["retries"], 2);
    assert_eq!(kinds.by_kind["ResourceExhausted"], 2);
    assert_eq!(
        kinds.samples["ResourceExhausted"],
        "etcdserver: too many requests"
    );
    assert_eq!(opened, 1);

    // Shed every time: a failure after 3 retries.
    let (rec, _, _) = one_list(script(u64::MAX, u64::MAX, 20), 20).await;
    assert_eq!((rec.ops, rec.errors.total()), (0, 1));
    assert_eq!(rec.counters["retries"], 3);
    assert_eq!(rec.counters["retries_exhausted"], 1);
    assert_eq!(rec.errors.by_kind["ResourceExhausted"], 1);

    // Fewer keys than preloaded: an error at once, no retry.
    let (rec, _, _) = one_list(script(0, u64::MAX, 19), 20).await;
    assert_eq!(rec.errors.by_kind["incomplete list"], 1);
    assert!(!rec.counters.contains_key("retries"));

    // More keys (others wrote under the prefix) is fine.
    let (rec, _, _) = one_list(script(0, u64::MAX, 25), 20).await;
    assert_eq!(rec.ops, 1);

    // The connection dropped mid-request: Unavailable, a new connection,
    // then served.
    let (rec, kinds, opened) = one_list(script(0, 0, 20), 20).await;
    assert_eq!((rec.ops, rec.errors.total()), (1, 0));
    assert_eq!(kinds.by_kind["Unavailable"], 1);
    assert_eq!(opened, 2);
}

// ---------------------------------------------------------------
// A tiny storm against ephd in-process, through the whole workload.

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    common: crate::options::Common,
    #[command(flatten)]
    args: super::Args,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_storm_against_ephd_adds_up() {
    use clap::Parser;
    let config =
        ephd::config::Config::parse_from(["ephd", "--listen-client-urls", "http://127.0.0.1:0"]);
    let server = ephd::server::Server::bind(config).await.unwrap();
    let addr = server.local_addrs()[0].to_string();
    tokio::spawn(server.run(std::future::pending()));

    let pid = std::process::id().to_string();
    let cli = Cli::parse_from([
        "t",
        "--endpoints",
        &addr,
        "--conns",
        "2",
        "--server-pid",
        &pid,
        "--val-size",
        "100",
        "--objects",
        "300",
        "--storms",
        "2",
        "--lists",
        "4,7",
        "--baseline",
        "200ms",
        "--pause",
        "100ms",
        "--settle",
        "200ms",
        "--heartbeat-op",
        "cas",
        "--heartbeat-keys",
        "50",
        "--prefix",
        "/registry/events-tiny/",
    ]);
    let r = super::run(&cli.common, &cli.args).await.unwrap();
    let j: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
    assert_eq!(j["ops"], 11, "{j}");
    assert_eq!(j["errors"], 0);
    assert_eq!(j["retries"], 0);
    assert_eq!(j["list_keys"], 300);
    assert_eq!(j["lists_plan"], serde_json::json!([4, 7]));
    let storms = j["storm_detail"].as_array().unwrap();
    assert_eq!(storms.len(), 2);
    assert_eq!(storms[0]["ok"], 4);
    assert_eq!(storms[1]["ok"], 7);
    // Heartbeats ran the whole time: about 40 in the baseline alone.
    assert!(j["hb_baseline_n"].as_u64().unwrap() >= 20, "{j}");
    assert!(j["hb_sent"].as_u64().unwrap() >= j["hb_baseline_n"].as_u64().unwrap());
    assert_eq!(j["hb_failures"], 0);
    // A CAS finds its key moved only when the previous write of the key
    // (50 × 5 ms earlier) has not been answered yet: rare, even here.
    let cas = j["hb_cas_failures"].as_u64().unwrap();
    assert!(cas * 10 < j["hb_sent"].as_u64().unwrap(), "{j}");
    assert!(j["rss_max_mb"].as_f64().unwrap() > 0.0);
    assert!(j["rss_after_settle_mb"].as_f64().unwrap() > 0.0);
    // Every list brought the whole prefix.
    let reply = j["list_reply_mb"].as_f64().unwrap();
    let got = j["list_mb_received"].as_f64().unwrap();
    assert!((got - 11.0 * reply).abs() < 0.01, "{got} vs 11 × {reply}");
}
