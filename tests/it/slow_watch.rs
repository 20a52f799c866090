//! Slow watchers: clients that stop reading their watch streams.
//!
//! kube-apiserver relists a resource whenever one of its watches is
//! canceled, so ephd never cancels a watcher for being slow: a stream that
//! is not read holds a bounded amount of server memory, blocks neither
//! writers nor any other watcher, gets every event once and in order when
//! it reads again, and is canceled only when the next revision it needs has
//! been compacted.
//!
//! Two ways of not reading are used. A *TCP stall* (`StallingProxy`): the
//! client's bytes go through a loopback proxy that stops reading from the
//! server, as when the client process is frozen; the client advertises the
//! largest HTTP/2 windows, so nothing but TCP and the server's own buffers
//! stop the server. A *flow-control stall* (`small_window_channel`): the
//! client application stops reading one stream, whose 64 KiB HTTP/2 window
//! fills, while other streams on the same connection keep going.
//!
//! Every wait is bounded; the bounds only catch hangs and say nothing about
//! speed. Memory is asserted against the data written, not against time.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use ephd::proto::etcdserverpb::WatchResponse;
use ephd::proto::mvccpb::event::EventType;
use etcd_client::{Client, GetOptions, TxnOp, WatchOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::transport::{Channel, Endpoint};

use crate::harness::{connect_client, Server};
use crate::support::{ephd, prefix_end, rev, watch_req, within, within_for, RawWatch};

/// Bound for a whole phase (many requests or many responses), not one step.
const PHASE: Duration = Duration::from_secs(120);

/// The largest HTTP/2 flow-control window (2^31 - 1).
const MAX_WINDOW: u32 = (1 << 31) - 1;

/// A loopback TCP proxy in front of a server whose server-to-client
/// direction can be paused: while paused it reads nothing from the server,
/// so the server's socket fills up and its writes to this client block,
/// exactly as with a client process that stopped (SIGSTOP, a long GC pause).
/// Client-to-server bytes always flow.
struct StallingProxy {
    addr: SocketAddr,
    paused: watch::Sender<bool>,
    accept: tokio::task::JoinHandle<()>,
}

impl StallingProxy {
    /// Listens on a free loopback port and forwards every connection to
    /// `upstream`.
    async fn start(upstream: SocketAddr) -> StallingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let (paused, _) = watch::channel(false);
        let gate = paused.clone();
        let accept = tokio::spawn(async move {
            // Dropping the set (when this task is aborted) stops the copies.
            let mut copies = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                // A small receive buffer towards the server, so a pause
                // stalls the server after little data in the kernel.
                let socket = TcpSocket::new_v4().expect("socket");
                socket.set_recv_buffer_size(16 * 1024).expect("SO_RCVBUF");
                let server = socket.connect(upstream).await.expect("proxy connects");
                let (mut client_r, mut client_w) = client.into_split();
                let (mut server_r, mut server_w) = server.into_split();
                copies.spawn(async move {
                    let _ = tokio::io::copy(&mut client_r, &mut server_w).await;
                    let _ = server_w.shutdown().await;
                });
                let mut gate = gate.subscribe();
                copies.spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        if gate.wait_for(|paused| !*paused).await.is_err() {
                            return;
                        }
                        match server_r.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if client_w.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        StallingProxy {
            addr,
            paused,
            accept,
        }
    }

    /// A connection through the proxy that advertises the largest HTTP/2
    /// windows, so only TCP and the server's buffers limit what the server
    /// sends.
    async fn channel(&self) -> Channel {
        let ep = Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .initial_stream_window_size(Some(MAX_WINDOW))
            .initial_connection_window_size(Some(MAX_WINDOW))
            .connect_timeout(Duration::from_secs(5));
        within("connect through the proxy", ep.connect())
            .await
            .expect("connects")
    }

    /// Stops forwarding the server's bytes.
    fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Forwards the server's bytes again.
    fn resume(&self) {
        self.paused.send_replace(false);
    }
}

impl Drop for StallingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// A direct connection whose HTTP/2 stream windows are the protocol minimum
/// (64 KiB) and whose connection window is large: a stream that is not read
/// stops the server after 64 KiB, while the other streams of the connection
/// keep their share of the connection window.
async fn small_window_channel(endpoint: &str) -> Channel {
    let ep = Endpoint::from_shared(endpoint.to_string())
        .unwrap()
        .initial_stream_window_size(Some(65_535))
        .initial_connection_window_size(Some(64 << 20))
        .connect_timeout(Duration::from_secs(5));
    within("connect", ep.connect()).await.expect("connects")
}

/// The server's resident set in bytes, from `/proc/<pid>/status`.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc status");
    kb * 1024
}

/// Writes `writers` x `puts` distinct keys `{prefix}{w}/{i}` whose values
/// are `value_len` bytes, over separate connections, every put bounded.
async fn write_many(endpoint: &str, prefix: &str, writers: usize, puts: usize, value_len: usize) {
    let mut tasks = JoinSet::new();
    for w in 0..writers {
        let mut c = connect_client(endpoint).await;
        let prefix = prefix.to_string();
        tasks.spawn(async move {
            for i in 0..puts {
                let key = format!("{prefix}{w}/{i:05}");
                within(
                    "put while watchers are stalled",
                    c.put(key.as_str(), value_of(&key, value_len), None),
                )
                .await
                .expect("put succeeds");
            }
        });
    }
    within_for(PHASE, "writers", async {
        while let Some(res) = tasks.join_next().await {
            res.expect("writer did not panic");
        }
    })
    .await;
}

/// The value written under `key`: the key, then filler up to `len` bytes,
/// so an event can be checked against its key.
fn value_of(key: &str, len: usize) -> Vec<u8> {
    let mut v = key.as_bytes().to_vec();
    v.resize(len.max(key.len()), b'.');
    v
}

/// The current revision, through a Range.
async fn current_revision(c: &mut Client) -> i64 {
    rev(within(
        "range",
        c.get(
            "current-revision",
            Some(GetOptions::new().with_count_only()),
        ),
    )
    .await
    .expect("range")
    .header())
}

/// Reads one raw watch stream until it has delivered every revision in
/// `first..=last` to watch `id` (one event per revision, each value matching
/// its key, no gap, no duplicate, nothing else on the stream).
async fn expect_every_put(w: &mut RawWatch, id: i64, first: i64, last: i64, value_len: usize) {
    let mut next = first;
    while next <= last {
        let r = w.next().await;
        assert_eq!(r.watch_id, id, "{}", brief(&r));
        assert!(!r.canceled && !r.created, "{}", brief(&r));
        for e in &r.events {
            let kv = e.kv.as_ref().unwrap();
            assert_eq!(kv.mod_revision, next, "every revision once, in order");
            assert_eq!(
                kv.value,
                value_of(std::str::from_utf8(&kv.key).unwrap(), value_len)
            );
            next += 1;
        }
    }
}

/// A response without its (possibly large) values, for failure messages.
fn brief(r: &WatchResponse) -> String {
    let revs: Vec<i64> = r
        .events
        .iter()
        .map(|e| e.kv.as_ref().map_or(0, |kv| kv.mod_revision))
        .collect();
    format!(
        "watch_id {} created {} canceled {} compact_revision {} cancel_reason {:?} event revisions {:?}",
        r.watch_id, r.created, r.canceled, r.compact_revision, r.cancel_reason, revs
    )
}

/// Collects the mod revisions an `etcd_client` watch stream delivers until
/// it has `n` events.
async fn collect_revisions(mut stream: etcd_client::WatchStream, n: usize) -> Vec<i64> {
    let mut revs = Vec::with_capacity(n);
    while revs.len() < n {
        let r = within("reading watcher event", stream.message())
            .await
            .expect("reading watch stream ok")
            .expect("reading watch stream open");
        assert!(!r.canceled(), "a reading watcher was canceled: {r:?}");
        revs.extend(r.events().iter().map(|e| e.kv().unwrap().mod_revision()));
    }
    revs
}

/// Many streams that stop reading (TCP stalls and flow-control stalls)
/// slow down neither writers nor two watchers that keep reading, one of
/// them on the same connection as stalled streams; the server holds a
/// bounded amount of memory per stalled stream instead of a copy of
/// everything written; and stalled streams that read again get every event
/// once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalled_streams_block_neither_writers_nor_readers_and_stay_bounded() {
    const PROXIES: usize = 4;
    const TCP_STALLED_PER_PROXY: usize = 6;
    const WINDOW_STALLED: usize = 8;
    const WRITERS: usize = 4;
    const PUTS: usize = 256;
    const VALUE: usize = 16 * 1024; // 4 x 256 x 16 KiB = 16 MiB written
    let server = ephd(&[]);
    let endpoint = server.endpoint();
    let upstream: SocketAddr = format!("127.0.0.1:{}", server.port()).parse().unwrap();
    let prefix_range = || watch_req(b"s/", &prefix_end(b"s/"), 0);

    // TCP-stalled streams: several per proxied connection.
    let mut proxies = Vec::new();
    let mut tcp_stalled = Vec::new();
    for _ in 0..PROXIES {
        let proxy = StallingProxy::start(upstream).await;
        let channel = proxy.channel().await;
        for _ in 0..TCP_STALLED_PER_PROXY {
            let mut w = RawWatch::open_on(channel.clone());
            let id = w.create_ok(prefix_range()).await.watch_id;
            tcp_stalled.push((w, id));
        }
        proxies.push(proxy);
    }
    // Flow-control-stalled streams, and a reading watcher on their connection.
    let shared = small_window_channel(&endpoint).await;
    let mut window_stalled = Vec::new();
    for _ in 0..WINDOW_STALLED {
        let mut w = RawWatch::open_on(shared.clone());
        let id = w.create_ok(prefix_range()).await.watch_id;
        window_stalled.push((w, id));
    }
    let mut neighbour = RawWatch::open_on(shared.clone());
    let neighbour_id = neighbour.create_ok(prefix_range()).await.watch_id;
    // A reading watcher on its own connection, through etcd-client.
    let reader_client = connect_client(&endpoint).await;
    let mut reader = within(
        "watch",
        reader_client
            .watch_client()
            .watch("s/", Some(WatchOptions::new().with_prefix())),
    )
    .await
    .expect("watch stream");
    assert!(within("created", reader.message())
        .await
        .unwrap()
        .unwrap()
        .created());
    for p in &proxies {
        p.pause();
    }

    let puts = WRITERS * PUTS;
    let first = 2;
    let last = 1 + puts as i64;
    let reading = tokio::spawn(collect_revisions(reader, puts));
    let neighbour_reading = tokio::spawn(async move {
        expect_every_put(&mut neighbour, neighbour_id, first, last, VALUE).await;
        neighbour
    });
    let rss_before = rss_bytes(server.pid());

    write_many(&endpoint, "s/", WRITERS, PUTS, VALUE).await;

    let revs = within_for(PHASE, "reading watcher", reading).await.unwrap();
    assert_eq!(
        revs,
        (first..=last).collect::<Vec<_>>(),
        "the reading watcher got every event once, in order"
    );
    let _neighbour = within_for(PHASE, "neighbour of stalled streams", neighbour_reading)
        .await
        .expect("the watcher sharing a connection with stalled streams got everything");
    let mut c = connect_client(&endpoint).await;
    assert_eq!(current_revision(&mut c).await, last);

    // Memory: the store holds the data once; each stalled stream may hold
    // its buffers (a few responses, HTTP/2's send buffer), not its own copy
    // of everything written, which would be 32 x 16 MiB here.
    let stalled = tcp_stalled.len() + window_stalled.len();
    let data = (puts * VALUE) as u64;
    let grown = rss_bytes(server.pid()).saturating_sub(rss_before);
    let per_stream_allowance: u64 = 4 << 20;
    let bound = 3 * data + stalled as u64 * per_stream_allowance;
    eprintln!(
        "stalled streams: {stalled}, data written: {} KiB, server RSS grew by {} KiB (bound {} KiB)",
        data >> 10,
        grown >> 10,
        bound >> 10
    );
    assert!(
        grown <= bound,
        "the server grew by {grown} bytes for {data} bytes written and {stalled} stalled streams"
    );

    // Reading again: every stalled stream gets everything, once, in order.
    for p in &proxies {
        p.resume();
    }
    within_for(PHASE, "stalled streams catching up", async {
        for (w, id) in tcp_stalled.iter_mut().chain(window_stalled.iter_mut()) {
            expect_every_put(w, *id, first, last, VALUE).await;
        }
    })
    .await;
}

/// A stalled stream with several watchers (a prefix with `prev_kv`, one
/// key, a NOPUT filter, one replaying from the past) that reads again gets,
/// for each watcher, exactly the events it would have got while reading:
/// puts, overwrites, deletes and multi-key txns, once and in revision order.
/// A compaction at the watchers' own start revision, made while they were
/// stalled, cancels none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resumed_stream_gets_every_event_once_in_order_for_each_watcher() {
    const ROUNDS: usize = 600;
    const VALUE: usize = 8 * 1024; // ~10 MiB of puts: far beyond the buffers
    let server = ephd(&[]);
    let endpoint = server.endpoint();
    let upstream: SocketAddr = format!("127.0.0.1:{}", server.port()).parse().unwrap();
    let mut c = connect_client(&endpoint).await;
    within("put", c.put("m/old", "before", None)).await.unwrap(); // r2
    let start = current_revision(&mut c).await + 1;

    let proxy = StallingProxy::start(upstream).await;
    let mut w = RawWatch::open_on(proxy.channel().await);
    let mut all = watch_req(b"m/", &prefix_end(b"m/"), 0);
    all.prev_kv = true;
    let all = w.create_ok(all).await.watch_id;
    let hot = w.create_ok(watch_req(b"m/hot", b"", 0)).await.watch_id;
    let mut deletes = watch_req(b"m/", &prefix_end(b"m/"), 0);
    deletes.filters =
        vec![ephd::proto::etcdserverpb::watch_create_request::FilterType::Noput as i32];
    let deletes = w.create_ok(deletes).await.watch_id;
    let replay = w
        .create_ok(watch_req(b"m/", &prefix_end(b"m/"), 2))
        .await
        .watch_id;
    proxy.pause();

    // What each watcher must get: (put?, key, revision, value length,
    // previous value's length).
    type Seen = (bool, String, i64, usize, Option<usize>);
    let mut expected: BTreeMap<i64, Vec<Seen>> = BTreeMap::new();
    let mut values: BTreeMap<String, usize> = BTreeMap::new();
    expected
        .entry(replay)
        .or_default()
        .push((true, "m/old".into(), 2, 6, None));
    values.insert("m/old".into(), 6);
    let mut record = |key: &str, revision: i64, put: Option<usize>| {
        let prev = values.get(key).copied();
        let len = put.unwrap_or(0);
        let seen_all = (put.is_some(), key.to_string(), revision, len, prev);
        expected.entry(all).or_default().push(seen_all);
        let plain = (put.is_some(), key.to_string(), revision, len, None);
        expected.entry(replay).or_default().push(plain.clone());
        if key == "m/hot" {
            expected.entry(hot).or_default().push(plain.clone());
        }
        if put.is_none() {
            expected.entry(deletes).or_default().push(plain);
        }
        match put {
            Some(len) => values.insert(key.to_string(), len),
            None => values.remove(key),
        };
    };
    for i in 0..ROUNDS {
        let len = VALUE + i % 7;
        let key = format!("m/k{:03}", i % 50);
        let r = rev(within("put", c.put(key.as_str(), vec![b'v'; len], None))
            .await
            .unwrap()
            .header());
        record(&key, r, Some(len));
        let r = rev(within("put", c.put("m/hot", vec![b'h'; 10 + i % 5], None))
            .await
            .unwrap()
            .header());
        record("m/hot", r, Some(10 + i % 5));
        if i % 10 == 9 {
            let r = rev(within("delete", c.delete(key.as_str(), None))
                .await
                .unwrap()
                .header());
            record(&key, r, None);
        }
        if i % 25 == 24 {
            // One revision, several keys: put two, delete the hot key.
            let (a, b) = (format!("m/t{i}a"), format!("m/t{i}b"));
            let r = rev(within(
                "txn",
                c.txn(etcd_client::Txn::new().and_then([
                    TxnOp::put(a.as_str(), "x", None),
                    TxnOp::put("unwatched", "y", None),
                    TxnOp::put(b.as_str(), "zz", None),
                    TxnOp::delete("m/hot", None),
                ])),
            )
            .await
            .unwrap()
            .header());
            // A txn's events come in the order of its operations.
            record(&a, r, Some(1));
            record(&b, r, Some(2));
            record("m/hot", r, None);
        }
    }
    within("compact", c.compact(start, None)).await.unwrap();
    let last = current_revision(&mut c).await;

    proxy.resume();
    let mut got: BTreeMap<i64, Vec<Seen>> = BTreeMap::new();
    let total: usize = expected.values().map(Vec::len).sum();
    within_for(PHASE, "stalled stream catching up", async {
        let mut n = 0;
        while n < total {
            let r = w.next().await;
            assert!(
                !r.canceled,
                "canceled although its next revision was kept: {}",
                brief(&r)
            );
            assert!(r.header.as_ref().unwrap().revision <= last, "{}", brief(&r));
            for e in &r.events {
                let kv = e.kv.as_ref().unwrap();
                got.entry(r.watch_id).or_default().push((
                    e.r#type == EventType::Put as i32,
                    String::from_utf8(kv.key.to_vec()).unwrap(),
                    kv.mod_revision,
                    kv.value.len(),
                    e.prev_kv.as_ref().map(|p| p.value.len()),
                ));
                n += 1;
            }
        }
    })
    .await;
    for (id, want) in &expected {
        let have = got.remove(id).unwrap_or_default();
        assert_eq!(have.len(), want.len(), "watch {id}: number of events");
        assert!(have == *want, "watch {id}: events differ from the writes");
    }
    assert!(
        got.is_empty(),
        "events for unknown watchers: {:?}",
        got.keys()
    );
    // Still live afterwards.
    let r = rev(within("put", c.put("m/hot", "live", None))
        .await
        .unwrap()
        .header());
    let mut live = BTreeMap::new();
    while live.len() < 3 {
        let resp = w.next().await;
        assert_eq!(resp.events.len(), 1, "{}", brief(&resp));
        assert_eq!(resp.events[0].kv.as_ref().unwrap().mod_revision, r);
        live.insert(resp.watch_id, ());
    }
    assert_eq!(live.into_keys().collect::<Vec<_>>(), {
        let mut ids = vec![all, hot, replay];
        ids.sort();
        ids
    });
}

/// A compaction that removes nothing a stalled watcher still needs does
/// not cancel it, even though its client has not read those events yet:
/// the stream's cursor was already past them (they are in flight), so it
/// gets them all, then live events.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compaction_below_a_stalled_watchers_next_revision_does_not_cancel_it() {
    const PUTS: i64 = 20;
    let metrics_port = crate::harness::free_port();
    let server = ephd(&[
        "--listen-metrics-urls",
        &format!("http://127.0.0.1:{metrics_port}"),
    ]);
    let upstream: SocketAddr = format!("127.0.0.1:{}", server.port()).parse().unwrap();
    let proxy = StallingProxy::start(upstream).await;
    let mut w = RawWatch::open_on(proxy.channel().await);
    let id = w
        .create_ok(watch_req(b"c/", &prefix_end(b"c/"), 0))
        .await
        .watch_id;
    proxy.pause();
    let mut c = connect_client(&server.endpoint()).await;
    for i in 0..PUTS {
        let key = format!("c/{i:02}");
        within("put", c.put(key.as_str(), value_of(&key, 100), None))
            .await
            .unwrap(); // r2..=r21
    }
    // The server counts events as its stream task hands them on, after
    // moving the watcher's cursor past them.
    within_for(PHASE, "the stream task taking every event", async {
        loop {
            let (_, metrics) = crate::operations::http_get(metrics_port, "/metrics");
            let sent = metrics
                .lines()
                .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_events_total "))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0);
            if sent >= PUTS as f64 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let last = 1 + PUTS;
    within("compact", c.compact(last, None)).await.unwrap();
    proxy.resume();
    expect_every_put(&mut w, id, 2, last, 100).await;
    let key = "c/live";
    within("put", c.put(key, value_of(key, 100), None))
        .await
        .unwrap();
    expect_every_put(&mut w, id, last + 1, last + 1, 100).await;
}

/// A stalled watcher whose next revision has been compacted is canceled,
/// with `compact_revision` set and no `cancel_reason`, as etcd does (clients
/// turn that into "etcdserver: mvcc: required revision has been compacted"
/// and relist). Before the cancel it gets exactly the events that were in
/// flight, in order, and nothing after a gap; the cancel comes only because
/// its next revision is below the compaction. The stream itself stays
/// usable: a new watch from the compacted revision replays the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_watcher_is_canceled_once_its_next_revision_is_compacted() {
    const WRITERS: usize = 4;
    const PUTS: usize = 400;
    const VALUE: usize = 8 * 1024; // ~13 MiB: far more than the buffers hold
    let server = ephd(&[]);
    let endpoint = server.endpoint();
    let upstream: SocketAddr = format!("127.0.0.1:{}", server.port()).parse().unwrap();
    let proxy = StallingProxy::start(upstream).await;
    let mut w = RawWatch::open_on(proxy.channel().await);
    let id = w
        .create_ok(watch_req(b"s/", &prefix_end(b"s/"), 0))
        .await
        .watch_id;
    proxy.pause();
    write_many(&endpoint, "s/", WRITERS, PUTS, VALUE).await;
    let mut c = connect_client(&endpoint).await;
    let compacted = current_revision(&mut c).await;
    within("compact", c.compact(compacted, None)).await.unwrap();
    proxy.resume();

    let mut next = 2;
    let canceled = within_for(PHASE, "stalled watcher", async {
        loop {
            let r = w.next().await;
            assert_eq!(r.watch_id, id, "{}", brief(&r));
            if r.canceled {
                return r;
            }
            for e in &r.events {
                let kv = e.kv.as_ref().unwrap();
                assert_eq!(kv.mod_revision, next, "no gap, no duplicate");
                assert_eq!(
                    kv.value,
                    value_of(std::str::from_utf8(&kv.key).unwrap(), VALUE)
                );
                next += 1;
            }
        }
    })
    .await;
    assert!(!canceled.created && canceled.events.is_empty());
    assert_eq!(canceled.compact_revision, compacted, "{}", brief(&canceled));
    assert_eq!(canceled.cancel_reason, "", "etcd sends no reason here");
    assert!(
        next < compacted,
        "canceled only because its next revision {next} is below the compaction at {compacted}"
    );

    // The relist path: a new watch from the compacted revision on the same
    // stream replays from there and follows live writes.
    let again = w
        .create_ok(watch_req(b"s/", &prefix_end(b"s/"), compacted))
        .await
        .watch_id;
    let key = "s/after";
    within("put", c.put(key, value_of(key, VALUE), None))
        .await
        .unwrap();
    expect_every_put(&mut w, again, compacted, compacted + 1, VALUE).await;
}
