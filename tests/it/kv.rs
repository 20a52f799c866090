//! KV service: Range, Put, DeleteRange, Txn and Compact through the real
//! `etcd-client` crate, with exact results and exact etcd errors.
//!
//! Every test starts its own server, so revisions are predictable: a fresh
//! store is at revision 1 and each write that changes something adds one.
//! Tests that need no ephd flag run against `TestServer`, which can be
//! pointed at stock etcd (`EPHD_IT_REFERENCE=etcd`) to check the
//! expectations themselves.

use etcd_client::{
    Client, CompactionOptions, Compare, CompareOp, DeleteOptions, GetOptions, GetResponse,
    KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use tonic::Code;

use crate::harness::Server;
use crate::support::{assert_err, ephd, rev, within, TestServer};

const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";
const FUTURE: &str = "etcdserver: mvcc: required revision is a future revision";

async fn put(c: &mut Client, key: &str, value: &str) -> i64 {
    let resp = within("put", c.put(key, value, None))
        .await
        .expect("put succeeds");
    rev(resp.header())
}

async fn get(c: &mut Client, key: &str, opts: Option<GetOptions>) -> GetResponse {
    within("range", c.get(key, opts))
        .await
        .expect("range succeeds")
}

async fn txn(c: &mut Client, t: Txn) -> TxnResponse {
    within("txn", c.txn(t)).await.expect("txn succeeds")
}

/// The current revision, as a Range header reports it.
async fn current_rev(c: &mut Client) -> i64 {
    rev(get(c, "current-revision-probe", None).await.header())
}

fn keys(kvs: &[KeyValue]) -> Vec<String> {
    kvs.iter()
        .map(|kv| String::from_utf8(kv.key().to_vec()).expect("utf-8 key"))
        .collect()
}

fn values(kvs: &[KeyValue]) -> Vec<String> {
    kvs.iter()
        .map(|kv| String::from_utf8(kv.value().to_vec()).expect("utf-8 value"))
        .collect()
}

/// (create_revision, mod_revision, version) of a kv.
fn revs(kv: &KeyValue) -> (i64, i64, i64) {
    (kv.create_revision(), kv.mod_revision(), kv.version())
}

// ---------------------------------------------------------------- Range

#[tokio::test]
async fn range_single_key_prefix_from_key_and_all_keys() {
    let server = TestServer::start();
    let mut c = server.client().await;
    for (i, k) in ["a", "a/1", "a/2", "b", "c"].iter().enumerate() {
        assert_eq!(put(&mut c, k, &format!("v{i}")).await, i as i64 + 2);
    }

    let single = get(&mut c, "a/1", None).await;
    assert_eq!(keys(single.kvs()), ["a/1"]);
    assert_eq!(values(single.kvs()), ["v1"]);
    assert_eq!((single.count(), single.more()), (1, false));
    assert_eq!(rev(single.header()), 6);

    let missing = get(&mut c, "a/", None).await;
    assert!(missing.kvs().is_empty());
    assert_eq!((missing.count(), missing.more()), (0, false));

    let prefix = get(&mut c, "a/", Some(GetOptions::new().with_prefix())).await;
    assert_eq!(keys(prefix.kvs()), ["a/1", "a/2"]);
    assert_eq!(prefix.count(), 2);

    let range = get(&mut c, "a/2", Some(GetOptions::new().with_range("c"))).await;
    assert_eq!(keys(range.kvs()), ["a/2", "b"], "range_end is exclusive");

    let from_key = get(&mut c, "a/2", Some(GetOptions::new().with_from_key())).await;
    assert_eq!(keys(from_key.kvs()), ["a/2", "b", "c"]);

    let all = get(&mut c, "", Some(GetOptions::new().with_all_keys())).await;
    assert_eq!(keys(all.kvs()), ["a", "a/1", "a/2", "b", "c"]);
    assert_eq!(values(all.kvs()), ["v0", "v1", "v2", "v3", "v4"]);
    assert_eq!(all.count(), 5);

    let empty_range = get(&mut c, "c", Some(GetOptions::new().with_range("a"))).await;
    assert!(empty_range.kvs().is_empty(), "key >= range_end is empty");
    assert_eq!(empty_range.count(), 0);
}

#[tokio::test]
async fn range_limit_reports_more_and_total_count() {
    let server = TestServer::start();
    let mut c = server.client().await;
    for k in ["k1", "k2", "k3", "k4", "k5"] {
        put(&mut c, k, "v").await;
    }
    for (limit, expect, more) in [
        (1, vec!["k1"], true),
        (4, vec!["k1", "k2", "k3", "k4"], true),
        (5, vec!["k1", "k2", "k3", "k4", "k5"], false),
        (6, vec!["k1", "k2", "k3", "k4", "k5"], false),
        (0, vec!["k1", "k2", "k3", "k4", "k5"], false),
    ] {
        let r = get(
            &mut c,
            "k",
            Some(GetOptions::new().with_prefix().with_limit(limit)),
        )
        .await;
        assert_eq!(keys(r.kvs()), expect, "limit {limit}");
        assert_eq!(r.more(), more, "more with limit {limit}");
        assert_eq!(r.count(), 5, "count ignores limit {limit}");
    }
    let sub = get(
        &mut c,
        "k2",
        Some(GetOptions::new().with_range("k4").with_limit(1)),
    )
    .await;
    assert_eq!(keys(sub.kvs()), ["k2"]);
    assert_eq!((sub.more(), sub.count()), (true, 2));
}

#[tokio::test]
async fn range_at_historical_revision_reports_current_header() {
    let server = TestServer::start();
    let mut c = server.client().await;
    let r2 = put(&mut c, "k", "v1").await;
    let r3 = put(&mut c, "k", "v2").await;
    let r4 = put(&mut c, "other", "x").await;
    let del = within("delete", c.delete("k", None)).await.unwrap();
    let r5 = rev(del.header());
    assert_eq!((r2, r3, r4, r5), (2, 3, 4, 5));

    let at2 = get(&mut c, "k", Some(GetOptions::new().with_revision(2))).await;
    assert_eq!(values(at2.kvs()), ["v1"]);
    assert_eq!(revs(&at2.kvs()[0]), (2, 2, 1));
    assert_eq!(rev(at2.header()), 5, "header is current even for old reads");

    let at3 = get(&mut c, "k", Some(GetOptions::new().with_revision(3))).await;
    assert_eq!(values(at3.kvs()), ["v2"]);
    assert_eq!(revs(&at3.kvs()[0]), (2, 3, 2));
    let at4 = get(&mut c, "k", Some(GetOptions::new().with_revision(4))).await;
    assert_eq!(values(at4.kvs()), ["v2"]);
    let at5 = get(&mut c, "k", Some(GetOptions::new().with_revision(5))).await;
    assert!(at5.kvs().is_empty());
    assert_eq!(at5.count(), 0);

    let all_at2 = get(
        &mut c,
        "",
        Some(GetOptions::new().with_all_keys().with_revision(2)),
    )
    .await;
    assert_eq!(keys(all_at2.kvs()), ["k"]);
    let all_at1 = get(
        &mut c,
        "",
        Some(GetOptions::new().with_all_keys().with_revision(1)),
    )
    .await;
    assert!(all_at1.kvs().is_empty());
    assert_eq!(rev(all_at1.header()), 5);
    let now = get(&mut c, "", Some(GetOptions::new().with_all_keys())).await;
    assert_eq!(keys(now.kvs()), ["other"]);
}

/// Three keys whose key, version, create, mod and value orders are five
/// different permutations, so every sort target is distinguishable.
async fn sort_fixture(c: &mut Client) {
    put(c, "k3", "b").await; // r2
    put(c, "k1", "a").await; // r3
    put(c, "k2", "c").await; // r4
    put(c, "k3", "b").await; // r5
    put(c, "k3", "b").await; // r6
    put(c, "k1", "a").await; // r7
                             // k1: create 3, mod 7, version 2, value a
                             // k2: create 4, mod 4, version 1, value c
                             // k3: create 2, mod 6, version 3, value b
}

#[tokio::test]
async fn range_sorts_by_every_target_and_order() {
    let server = TestServer::start();
    let mut c = server.client().await;
    sort_fixture(&mut c).await;
    let asc = |v: [&str; 3]| v.map(String::from).to_vec();
    let cases = [
        (SortTarget::Key, ["k1", "k2", "k3"]),
        (SortTarget::Version, ["k2", "k1", "k3"]),
        (SortTarget::Create, ["k3", "k1", "k2"]),
        (SortTarget::Mod, ["k2", "k3", "k1"]),
        (SortTarget::Value, ["k1", "k3", "k2"]),
    ];
    for (target, ascending) in cases {
        let mut descending = asc(ascending);
        descending.reverse();
        for (order, expect) in [
            (SortOrder::Ascend, asc(ascending)),
            (SortOrder::Descend, descending),
            // No order with a target: etcd sorts ascending (key order for KEY).
            (SortOrder::None, asc(ascending)),
        ] {
            let r = get(
                &mut c,
                "k",
                Some(GetOptions::new().with_prefix().with_sort(target, order)),
            )
            .await;
            assert_eq!(keys(r.kvs()), expect, "sort {target:?} {order:?}");
            assert_eq!((r.count(), r.more()), (3, false));
        }
    }

    // Sorting happens before the limit.
    let top = get(
        &mut c,
        "k",
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Mod, SortOrder::Descend)
                .with_limit(2),
        ),
    )
    .await;
    assert_eq!(keys(top.kvs()), ["k1", "k3"]);
    assert_eq!((top.more(), top.count()), (true, 3));
}

#[tokio::test]
async fn range_target_without_order_sorts_only_the_fetched_page() {
    // etcd decides to fetch everything from the *requested* order: a target
    // without an order keeps the early limit (limit + 1 keys in key order)
    // and then sorts that page ascending.
    let server = TestServer::start();
    let mut c = server.client().await;
    sort_fixture(&mut c).await;
    let r = get(
        &mut c,
        "k",
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::None)
                .with_limit(1),
        ),
    )
    .await;
    assert_eq!(keys(r.kvs()), ["k1"], "k1,k2 fetched, sorted by create");
    assert_eq!((r.more(), r.count()), (true, 3));
    let full = get(
        &mut c,
        "k",
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1),
        ),
    )
    .await;
    assert_eq!(keys(full.kvs()), ["k3"], "an explicit order sorts all keys");
}

#[tokio::test]
async fn range_serializable_keys_only_and_count_only() {
    let server = TestServer::start();
    let mut c = server.client().await;
    put(&mut c, "a", "1").await;
    put(&mut c, "b", "22").await;
    put(&mut c, "b", "333").await;

    let linear = get(&mut c, "", Some(GetOptions::new().with_all_keys())).await;
    let serial = get(
        &mut c,
        "",
        Some(GetOptions::new().with_all_keys().with_serializable()),
    )
    .await;
    assert_eq!(keys(serial.kvs()), keys(linear.kvs()));
    assert_eq!(values(serial.kvs()), ["1", "333"]);
    assert_eq!(
        serial.kvs().iter().map(revs).collect::<Vec<_>>(),
        [(2, 2, 1), (3, 4, 2)]
    );
    assert_eq!(rev(serial.header()), 4);

    let keys_only = get(
        &mut c,
        "",
        Some(GetOptions::new().with_all_keys().with_keys_only()),
    )
    .await;
    assert_eq!(keys(keys_only.kvs()), ["a", "b"]);
    assert_eq!(values(keys_only.kvs()), ["", ""], "keys_only drops values");
    assert_eq!(
        keys_only.kvs().iter().map(revs).collect::<Vec<_>>(),
        [(2, 2, 1), (3, 4, 2)],
        "keys_only keeps revisions and versions"
    );

    let count_only = get(
        &mut c,
        "",
        Some(
            GetOptions::new()
                .with_all_keys()
                .with_count_only()
                .with_limit(1),
        ),
    )
    .await;
    assert!(count_only.kvs().is_empty());
    assert_eq!((count_only.count(), count_only.more()), (2, false));
    assert_eq!(rev(count_only.header()), 4);
}

#[tokio::test]
async fn range_revision_filters_apply_before_limit() {
    let server = TestServer::start();
    let mut c = server.client().await;
    put(&mut c, "a", "1").await; // r2
    put(&mut c, "b", "1").await; // r3
    put(&mut c, "c", "1").await; // r4
    put(&mut c, "d", "1").await; // r5
    put(&mut c, "a", "2").await; // r6
    put(&mut c, "b", "2").await; // r7
                                 // a: create 2 mod 6; b: create 3 mod 7; c: create 4 mod 4; d: create 5 mod 5
    let q = |o: GetOptions| Some(o.with_all_keys());
    let cases: Vec<(GetOptions, Vec<&str>, bool)> = vec![
        (
            GetOptions::new().with_min_mod_revision(5),
            vec!["a", "b", "d"],
            false,
        ),
        (
            GetOptions::new().with_max_mod_revision(5),
            vec!["c", "d"],
            false,
        ),
        (
            GetOptions::new().with_min_create_revision(3),
            vec!["b", "c", "d"],
            false,
        ),
        (
            GetOptions::new().with_max_create_revision(3),
            vec!["a", "b"],
            false,
        ),
        (
            GetOptions::new()
                .with_min_mod_revision(5)
                .with_max_mod_revision(6),
            vec!["a", "d"],
            false,
        ),
        // Filtered first, then limited: b,c (not a,b then filtered to b).
        (
            GetOptions::new().with_min_create_revision(3).with_limit(2),
            vec!["b", "c"],
            true,
        ),
        // Limit 1 of the filtered c,d: not a (filtered out) nor nothing.
        (
            GetOptions::new().with_max_mod_revision(5).with_limit(1),
            vec!["c"],
            true,
        ),
        (
            GetOptions::new()
                .with_min_create_revision(3)
                .with_max_create_revision(4)
                .with_limit(2),
            vec!["b", "c"],
            false,
        ),
        (
            GetOptions::new()
                .with_min_mod_revision(4)
                .with_sort(SortTarget::Mod, SortOrder::Descend)
                .with_limit(2),
            vec!["b", "a"],
            true,
        ),
    ];
    for (opts, expect, more) in cases {
        let desc = format!("{opts:?}");
        let r = get(&mut c, "", q(opts)).await;
        assert_eq!(keys(r.kvs()), expect, "{desc}");
        assert_eq!(r.more(), more, "more for {desc}");
        assert_eq!(r.count(), 4, "count ignores filters: {desc}");
    }
}

#[tokio::test]
async fn range_rejects_empty_key_future_and_compacted_revisions() {
    let server = TestServer::start();
    let mut c = server.client().await;
    put(&mut c, "k", "1").await; // r2
    put(&mut c, "k", "2").await; // r3
    put(&mut c, "k", "3").await; // r4
    assert_err(
        c.get("", None).await,
        Code::InvalidArgument,
        "etcdserver: key is not provided",
    );
    assert_err(
        c.get("k", Some(GetOptions::new().with_revision(5))).await,
        Code::OutOfRange,
        FUTURE,
    );
    within("compact", c.compact(3, None)).await.unwrap();
    assert_err(
        c.get("k", Some(GetOptions::new().with_revision(2))).await,
        Code::OutOfRange,
        COMPACTED,
    );
    let at3 = get(&mut c, "k", Some(GetOptions::new().with_revision(3))).await;
    assert_eq!(
        values(at3.kvs()),
        ["2"],
        "the compacted revision is readable"
    );
    let at4 = get(&mut c, "k", Some(GetOptions::new().with_revision(4))).await;
    assert_eq!(values(at4.kvs()), ["3"]);
}

// ------------------------------------------------------------------ Put

#[tokio::test]
async fn put_returns_prev_kv_and_tracks_versions() {
    let server = TestServer::start();
    let mut c = server.client().await;
    let prev = || Some(PutOptions::new().with_prev_key());

    let first = within("put", c.put("k", "v1", prev())).await.unwrap();
    assert_eq!(rev(first.header()), 2);
    assert!(first.prev_key().is_none(), "no previous version on create");
    let kv = get(&mut c, "k", None).await.kvs()[0].clone();
    assert_eq!((revs(&kv), kv.value()), ((2, 2, 1), &b"v1"[..]));

    let second = within("put", c.put("k", "v2", prev())).await.unwrap();
    assert_eq!(rev(second.header()), 3);
    let p = second.prev_key().expect("prev_kv requested");
    assert_eq!(
        (p.key(), p.value(), revs(p)),
        (&b"k"[..], &b"v1"[..], (2, 2, 1))
    );
    let kv = get(&mut c, "k", None).await.kvs()[0].clone();
    assert_eq!((revs(&kv), kv.value()), ((2, 3, 2), &b"v2"[..]));

    let third = within("put", c.put("k", "v3", None)).await.unwrap();
    assert_eq!(rev(third.header()), 4);
    assert!(third.prev_key().is_none(), "prev_kv only when requested");

    within("delete", c.delete("k", None)).await.unwrap(); // r5
    let again = within("put", c.put("k", "v4", prev())).await.unwrap();
    assert_eq!(rev(again.header()), 6);
    assert!(again.prev_key().is_none(), "a deleted key has no prev_kv");
    let kv = get(&mut c, "k", None).await.kvs()[0].clone();
    assert_eq!(
        revs(&kv),
        (6, 6, 1),
        "re-created: new create_revision, version 1"
    );
}

#[tokio::test]
async fn put_stores_empty_values() {
    let server = TestServer::start();
    let mut c = server.client().await;
    put(&mut c, "e", "").await;
    let r = get(&mut c, "e", None).await;
    assert_eq!(r.count(), 1, "a key with an empty value exists");
    assert_eq!(values(r.kvs()), [""]);
    assert_eq!(revs(&r.kvs()[0]), (2, 2, 1));
    put(&mut c, "e", "").await;
    let r = get(&mut c, "e", None).await;
    assert_eq!(
        revs(&r.kvs()[0]),
        (2, 3, 2),
        "an identical put is a new version"
    );
}

#[tokio::test]
async fn put_attaches_leases_and_rejects_unknown_ones() {
    let server = TestServer::start();
    let mut c = server.client().await;
    let lease = within("grant", c.lease_grant(60, None)).await.unwrap().id();
    let r = within(
        "put",
        c.put("k", "v", Some(PutOptions::new().with_lease(lease))),
    )
    .await
    .unwrap();
    assert_eq!(rev(r.header()), 2);
    assert_eq!(get(&mut c, "k", None).await.kvs()[0].lease(), lease);

    let unknown = lease.wrapping_add(12345);
    assert_err(
        c.put("k2", "v", Some(PutOptions::new().with_lease(unknown)))
            .await,
        Code::NotFound,
        "etcdserver: requested lease not found",
    );
    assert_eq!(current_rev(&mut c).await, 2, "a failed put writes nothing");
    assert_eq!(get(&mut c, "k2", None).await.count(), 0);
}

#[tokio::test]
async fn put_ignore_value_and_ignore_lease() {
    let server = TestServer::start();
    let mut c = server.client().await;
    let l1 = within("grant", c.lease_grant(60, None)).await.unwrap().id();
    let l2 = within("grant", c.lease_grant(60, None)).await.unwrap().id();
    within(
        "put",
        c.put("k", "v1", Some(PutOptions::new().with_lease(l1))),
    )
    .await
    .unwrap(); // r2

    // New lease, old value.
    within(
        "put",
        c.put(
            "k",
            "",
            Some(PutOptions::new().with_ignore_value().with_lease(l2)),
        ),
    )
    .await
    .unwrap(); // r3
    let kv = get(&mut c, "k", None).await.kvs()[0].clone();
    assert_eq!(
        (kv.value(), kv.lease(), revs(&kv)),
        (&b"v1"[..], l2, (2, 3, 2))
    );

    // New value, old lease.
    within(
        "put",
        c.put("k", "v2", Some(PutOptions::new().with_ignore_lease())),
    )
    .await
    .unwrap(); // r4
    let kv = get(&mut c, "k", None).await.kvs()[0].clone();
    assert_eq!(
        (kv.value(), kv.lease(), revs(&kv)),
        (&b"v2"[..], l2, (2, 4, 3))
    );

    // Both kept: still a new version.
    within(
        "put",
        c.put(
            "k",
            "",
            Some(PutOptions::new().with_ignore_value().with_ignore_lease()),
        ),
    )
    .await
    .unwrap(); // r5
    let kv = get(&mut c, "k", None).await.kvs()[0].clone();
    assert_eq!(
        (kv.value(), kv.lease(), revs(&kv)),
        (&b"v2"[..], l2, (2, 5, 4))
    );

    // Without ignore_lease, a put detaches the lease.
    within("put", c.put("k", "v3", None)).await.unwrap(); // r6
    assert_eq!(get(&mut c, "k", None).await.kvs()[0].lease(), 0);

    assert_err(
        c.put("missing", "", Some(PutOptions::new().with_ignore_value()))
            .await,
        Code::InvalidArgument,
        "etcdserver: key not found",
    );
    assert_err(
        c.put("missing", "v", Some(PutOptions::new().with_ignore_lease()))
            .await,
        Code::InvalidArgument,
        "etcdserver: key not found",
    );
    assert_err(
        c.put("k", "x", Some(PutOptions::new().with_ignore_value()))
            .await,
        Code::InvalidArgument,
        "etcdserver: value is provided",
    );
    assert_err(
        c.put(
            "k",
            "x",
            Some(PutOptions::new().with_ignore_lease().with_lease(l1)),
        )
        .await,
        Code::InvalidArgument,
        "etcdserver: lease is provided",
    );
    assert_err(
        c.put("", "x", None).await,
        Code::InvalidArgument,
        "etcdserver: key is not provided",
    );
    assert_eq!(current_rev(&mut c).await, 6, "rejected puts write nothing");
}

// ---------------------------------------------------------- DeleteRange

#[tokio::test]
async fn delete_single_range_prefix_and_missing_keys() {
    let server = TestServer::start();
    let mut c = server.client().await;
    for k in ["a", "b", "c", "d", "e", "p/1", "p/2"] {
        put(&mut c, k, &format!("val-{k}")).await; // r2..r8
    }

    let one = within("delete", c.delete("a", None)).await.unwrap();
    assert_eq!((one.deleted(), rev(one.header())), (1, 9));
    assert!(one.prev_kvs().is_empty(), "prev_kvs only when requested");

    let missing = within(
        "delete",
        c.delete("a", Some(DeleteOptions::new().with_prev_key())),
    )
    .await
    .unwrap();
    assert_eq!(missing.deleted(), 0);
    assert!(missing.prev_kvs().is_empty());
    assert_eq!(rev(missing.header()), 9, "deleting nothing is not a write");
    assert_eq!(current_rev(&mut c).await, 9);

    let range = within(
        "delete",
        c.delete(
            "b",
            Some(DeleteOptions::new().with_range("d").with_prev_key()),
        ),
    )
    .await
    .unwrap();
    assert_eq!((range.deleted(), rev(range.header())), (2, 10));
    assert_eq!(keys(range.prev_kvs()), ["b", "c"]);
    assert_eq!(values(range.prev_kvs()), ["val-b", "val-c"]);
    assert_eq!(
        range.prev_kvs().iter().map(revs).collect::<Vec<_>>(),
        [(3, 3, 1), (4, 4, 1)]
    );

    let prefix = within(
        "delete",
        c.delete("p/", Some(DeleteOptions::new().with_prefix())),
    )
    .await
    .unwrap();
    assert_eq!((prefix.deleted(), rev(prefix.header())), (2, 11));

    let from = within(
        "delete",
        c.delete(
            "d",
            Some(DeleteOptions::new().with_from_key().with_prev_key()),
        ),
    )
    .await
    .unwrap();
    assert_eq!((from.deleted(), rev(from.header())), (2, 12));
    assert_eq!(keys(from.prev_kvs()), ["d", "e"]);

    let all = get(&mut c, "", Some(GetOptions::new().with_all_keys())).await;
    assert_eq!(all.count(), 0);
    let before = get(
        &mut c,
        "",
        Some(GetOptions::new().with_all_keys().with_revision(8)),
    )
    .await;
    assert_eq!(before.count(), 7, "deleted keys stay readable in history");

    let none = within(
        "delete",
        c.delete("", Some(DeleteOptions::new().with_all_keys())),
    )
    .await
    .unwrap();
    assert_eq!((none.deleted(), rev(none.header())), (0, 12));
}

// ------------------------------------------------------------------ Txn

/// Runs a compare-only (read-only) txn and returns whether it succeeded.
async fn holds(c: &mut Client, cmp: Compare) -> bool {
    let desc = format!("{cmp:?}");
    let before = current_rev(c).await;
    let r = txn(c, Txn::new().when([cmp])).await;
    assert_eq!(
        rev(r.header()),
        before,
        "a compare-only txn writes nothing: {desc}"
    );
    assert!(r.op_responses().is_empty());
    r.succeeded()
}

#[tokio::test]
async fn txn_compares_every_target_with_every_operator() {
    let server = TestServer::start();
    let mut c = server.client().await;
    let lease = within("grant", c.lease_grant(600, None))
        .await
        .unwrap()
        .id();
    let with_lease = || Some(PutOptions::new().with_lease(lease));
    within("put", c.put("k", "m", with_lease())).await.unwrap(); // r2
    within("put", c.put("k", "m", with_lease())).await.unwrap(); // r3
                                                                 // k: version 2, create 2, mod 3, value "m", lease `lease`

    type Make = Box<dyn Fn(CompareOp, usize) -> Compare>;
    let targets: Vec<(&str, Make)> = vec![
        (
            "version",
            Box::new(|op, i| Compare::version("k", op, [1, 2, 3][i])),
        ),
        (
            "create",
            Box::new(|op, i| Compare::create_revision("k", op, [1, 2, 3][i])),
        ),
        (
            "mod",
            Box::new(|op, i| Compare::mod_revision("k", op, [2, 3, 4][i])),
        ),
        (
            "value",
            Box::new(|op, i| Compare::value("k", op, ["l", "m", "n"][i])),
        ),
        (
            "lease",
            Box::new(move |op, i| Compare::lease("k", op, [lease - 1, lease, lease + 1][i])),
        ),
    ];
    // For operands below / equal to / above the key's field.
    let ops = [
        (CompareOp::Equal, [false, true, false]),
        (CompareOp::Greater, [true, false, false]),
        (CompareOp::Less, [false, false, true]),
        (CompareOp::NotEqual, [true, false, true]),
    ];
    for (name, make) in &targets {
        for (op, expect) in ops {
            for (i, want) in expect.iter().enumerate() {
                let got = holds(&mut c, make(op, i)).await;
                assert_eq!(got, *want, "{name} {op:?} operand #{i}");
            }
        }
    }
}

#[tokio::test]
async fn txn_compare_over_a_range_requires_every_key() {
    let server = TestServer::start();
    let mut c = server.client().await;
    put(&mut c, "p/a", "1").await; // r2
    put(&mut c, "p/b", "1").await; // r3
    put(&mut c, "p/c", "2").await; // r4
    put(&mut c, "q", "1").await; // r5

    let value_all = Compare::value("p/", CompareOp::Equal, "1").with_prefix();
    assert!(!holds(&mut c, value_all).await, "p/c differs");
    let value_some = Compare::value("p/a", CompareOp::Equal, "1").with_range("p/c");
    assert!(holds(&mut c, value_some).await);
    let version = Compare::version("p/", CompareOp::Equal, 1).with_prefix();
    assert!(holds(&mut c, version).await);
    let created = Compare::create_revision("p/", CompareOp::Less, 4).with_prefix();
    assert!(!holds(&mut c, created).await, "p/c was created at 4");
    let created = Compare::create_revision("p/", CompareOp::Less, 5).with_prefix();
    assert!(holds(&mut c, created).await);
    let modified = Compare::mod_revision("p/", CompareOp::Greater, 1).with_prefix();
    assert!(holds(&mut c, modified).await);

    // An empty range compares like a missing key.
    let empty_mod = Compare::mod_revision("z/", CompareOp::Equal, 0).with_prefix();
    assert!(holds(&mut c, empty_mod).await);
    let empty_value = Compare::value("z/", CompareOp::NotEqual, "x").with_prefix();
    assert!(!holds(&mut c, empty_value).await);
}

#[tokio::test]
async fn txn_compares_on_missing_keys() {
    let server = TestServer::start();
    let mut c = server.client().await;
    put(&mut c, "other", "x").await;
    for (cmp, want) in [
        (Compare::mod_revision("nope", CompareOp::Equal, 0), true),
        (Compare::version("nope", CompareOp::Equal, 0), true),
        (Compare::create_revision("nope", CompareOp::Equal, 0), true),
        (Compare::lease("nope", CompareOp::Equal, 0), true),
        (Compare::mod_revision("nope", CompareOp::Greater, 0), false),
        (Compare::version("nope", CompareOp::Less, 1), true),
        (
            Compare::create_revision("nope", CompareOp::NotEqual, 0),
            false,
        ),
        // A missing key has no value: every value compare fails.
        (Compare::value("nope", CompareOp::Equal, ""), false),
        (Compare::value("nope", CompareOp::NotEqual, "x"), false),
        (Compare::value("nope", CompareOp::Less, "z"), false),
        (Compare::value("nope", CompareOp::Greater, ""), false),
    ] {
        let desc = format!("{cmp:?}");
        assert_eq!(holds(&mut c, cmp).await, want, "{desc}");
    }
}

#[tokio::test]
async fn txn_runs_every_op_kind_in_both_branches() {
    let server = TestServer::start();
    let mut c = server.client().await;
    put(&mut c, "a", "1").await; // r2
    put(&mut c, "b", "1").await; // r3

    let nested = Txn::new()
        // Compares see the state before the txn: c does not exist yet.
        .when([Compare::version("c", CompareOp::Equal, 0)])
        .and_then([TxnOp::put("d", "dd", None)])
        .or_else([TxnOp::put("e", "ee", None)]);
    let t = Txn::new()
        .when([Compare::value("a", CompareOp::Equal, "1")])
        .and_then([
            TxnOp::put("c", "new", Some(PutOptions::new().with_prev_key())),
            TxnOp::get("a", None),
            TxnOp::delete("b", Some(DeleteOptions::new().with_prev_key())),
            TxnOp::txn(nested),
            TxnOp::get("c", None),
        ])
        .or_else([TxnOp::put("f", "x", None)]);
    let r = txn(&mut c, t).await;
    assert!(r.succeeded());
    assert_eq!(rev(r.header()), 4);
    let ops = r.op_responses();
    assert_eq!(ops.len(), 5);
    match &ops[0] {
        TxnOpResponse::Put(p) => {
            assert!(p.prev_key().is_none());
            assert_eq!(rev(p.header()), 4);
        }
        other => panic!("op 0: {other:?}"),
    }
    match &ops[1] {
        TxnOpResponse::Get(g) => {
            assert_eq!(values(g.kvs()), ["1"]);
            assert_eq!(rev(g.header()), 4, "a read after a write sees its revision");
        }
        other => panic!("op 1: {other:?}"),
    }
    match &ops[2] {
        TxnOpResponse::Delete(d) => {
            assert_eq!(d.deleted(), 1);
            assert_eq!(keys(d.prev_kvs()), ["b"]);
            assert_eq!(rev(d.header()), 4);
        }
        other => panic!("op 2: {other:?}"),
    }
    match &ops[3] {
        TxnOpResponse::Txn(t) => {
            assert!(t.succeeded(), "nested compare saw c missing");
            let inner = t.op_responses();
            assert_eq!(inner.len(), 1);
            assert!(matches!(inner[0], TxnOpResponse::Put(_)));
        }
        other => panic!("op 3: {other:?}"),
    }
    match &ops[4] {
        TxnOpResponse::Get(g) => {
            assert_eq!(values(g.kvs()), ["new"], "reads see earlier ops of the txn");
            assert_eq!(revs(&g.kvs()[0]), (4, 4, 1));
        }
        other => panic!("op 4: {other:?}"),
    }
    let all = get(&mut c, "", Some(GetOptions::new().with_all_keys())).await;
    assert_eq!(keys(all.kvs()), ["a", "c", "d"]);
    assert!(all.kvs()[1..].iter().all(|kv| kv.mod_revision() == 4));

    // The failure branch, with a nested txn taking its success branch.
    let t = Txn::new()
        .when([Compare::value("a", CompareOp::Equal, "2")])
        .and_then([TxnOp::put("x", "x", None)])
        .or_else([
            TxnOp::put("f", "ff", None),
            TxnOp::get("f", None),
            TxnOp::txn(
                Txn::new()
                    .when([Compare::mod_revision("f", CompareOp::Equal, 0)])
                    .or_else([TxnOp::put("g", "gg", None)]),
            ),
            TxnOp::delete("zzz", None),
        ]);
    let r = txn(&mut c, t).await;
    assert!(!r.succeeded());
    assert_eq!(rev(r.header()), 5);
    let ops = r.op_responses();
    assert_eq!(ops.len(), 4);
    match &ops[1] {
        TxnOpResponse::Get(g) => assert_eq!(values(g.kvs()), ["ff"]),
        other => panic!("op 1: {other:?}"),
    }
    match &ops[2] {
        TxnOpResponse::Txn(t) => {
            assert!(t.succeeded());
            assert!(t.op_responses().is_empty(), "empty success branch");
        }
        other => panic!("op 2: {other:?}"),
    }
    match &ops[3] {
        TxnOpResponse::Delete(d) => {
            assert_eq!(d.deleted(), 0);
            assert_eq!(rev(d.header()), 5);
        }
        other => panic!("op 3: {other:?}"),
    }
    let all = get(&mut c, "", Some(GetOptions::new().with_all_keys())).await;
    assert_eq!(keys(all.kvs()), ["a", "c", "d", "f"]);
}

#[tokio::test]
async fn write_txn_commits_at_one_revision() {
    let server = TestServer::start();
    let mut c = server.client().await;
    put(&mut c, "x", "0").await; // r2
    let r = txn(
        &mut c,
        Txn::new().and_then([
            TxnOp::put("a", "1", None),
            TxnOp::put("b", "2", None),
            TxnOp::put("c", "3", None),
            TxnOp::delete("x", None),
        ]),
    )
    .await;
    assert!(r.succeeded(), "a txn without compares succeeds");
    assert_eq!(rev(r.header()), 3);
    let all = get(&mut c, "", Some(GetOptions::new().with_all_keys())).await;
    assert_eq!(keys(all.kvs()), ["a", "b", "c"]);
    for kv in all.kvs() {
        assert_eq!(
            revs(kv),
            (3, 3, 1),
            "every write of the txn is at its revision"
        );
    }
    let before = get(
        &mut c,
        "",
        Some(GetOptions::new().with_all_keys().with_revision(2)),
    )
    .await;
    assert_eq!(
        keys(before.kvs()),
        ["x"],
        "nothing of the txn is visible at 2"
    );
    assert_eq!(put(&mut c, "y", "1").await, 4, "the txn used one revision");
}

#[tokio::test]
async fn txn_that_changes_nothing_keeps_the_revision() {
    let server = TestServer::start();
    let mut c = server.client().await;
    put(&mut c, "k", "v").await; // r2
    let fails = || Compare::value("k", CompareOp::Equal, "other");

    let r = txn(
        &mut c,
        Txn::new()
            .when([fails()])
            .and_then([TxnOp::put("k", "w", None)]),
    )
    .await;
    assert!(!r.succeeded());
    assert_eq!(rev(r.header()), 2);
    assert!(r.op_responses().is_empty());

    let r = txn(
        &mut c,
        Txn::new()
            .when([fails()])
            .and_then([TxnOp::put("k", "w", None)])
            .or_else([TxnOp::get("k", None)]),
    )
    .await;
    assert!(!r.succeeded());
    assert_eq!(rev(r.header()), 2);
    match &r.op_responses()[..] {
        [TxnOpResponse::Get(g)] => assert_eq!(values(g.kvs()), ["v"]),
        other => panic!("{other:?}"),
    }

    let r = txn(
        &mut c,
        Txn::new().and_then([TxnOp::delete("missing", None), TxnOp::get("k", None)]),
    )
    .await;
    assert_eq!(rev(r.header()), 2, "deleting a missing key writes nothing");
    assert_eq!(current_rev(&mut c).await, 2);
    assert_eq!(get(&mut c, "k", None).await.kvs()[0].mod_revision(), 2);

    let r = txn(
        &mut c,
        Txn::new()
            .when([fails()])
            .or_else([TxnOp::put("k2", "x", None)]),
    )
    .await;
    assert_eq!(
        rev(r.header()),
        3,
        "a write in the failure branch is a write"
    );
}

#[tokio::test]
async fn txn_rejects_duplicate_keys() {
    let server = TestServer::start();
    let mut c = server.client().await;
    put(&mut c, "a", "0").await; // r2
    const DUP: &str = "etcdserver: duplicate key given in txn request";
    let rejected = [
        Txn::new().and_then([TxnOp::put("a", "1", None), TxnOp::put("a", "2", None)]),
        Txn::new().or_else([TxnOp::put("b", "1", None), TxnOp::put("b", "2", None)]),
        Txn::new().and_then([TxnOp::put("a", "1", None), TxnOp::delete("a", None)]),
        Txn::new().and_then([
            TxnOp::delete("a", Some(DeleteOptions::new().with_range("c"))),
            TxnOp::put("b", "1", None),
        ]),
        Txn::new().and_then([
            TxnOp::put("a", "1", None),
            TxnOp::txn(Txn::new().and_then([TxnOp::put("a", "2", None)])),
        ]),
    ];
    for t in rejected {
        let desc = format!("{t:?}");
        let r = c.txn(t).await;
        assert!(r.is_err(), "{desc}");
        assert_err(r, Code::InvalidArgument, DUP);
    }
    let accepted = [
        // One key in each branch: only one branch runs.
        Txn::new()
            .and_then([TxnOp::put("a", "1", None)])
            .or_else([TxnOp::put("a", "2", None)]),
        // Two deletes of one key do not conflict.
        Txn::new().and_then([TxnOp::delete("a", None), TxnOp::delete("a", None)]),
        // Both branches of a nested txn may write the same key.
        Txn::new().and_then([TxnOp::txn(
            Txn::new()
                .and_then([TxnOp::put("n", "1", None)])
                .or_else([TxnOp::put("n", "2", None)]),
        )]),
    ];
    for t in accepted {
        let desc = format!("{t:?}");
        within("txn", c.txn(t))
            .await
            .unwrap_or_else(|e| panic!("{desc}: {e}"));
    }
    // Exactly the three accepted txns wrote: r3 put a, r4 delete a, r5 put n.
    assert_eq!(current_rev(&mut c).await, 5);
}

#[tokio::test]
async fn txn_rejects_more_ops_than_max_txn_ops() {
    let server = ephd(&["--max-txn-ops", "4"]);
    let mut c = server.client().await;
    const TOO_MANY: &str = "etcdserver: too many operations in txn request";
    let puts = |n: usize| -> Vec<TxnOp> {
        (0..n)
            .map(|i| TxnOp::put(format!("k{i}"), "v", None))
            .collect()
    };
    let gets =
        |n: usize| -> Vec<TxnOp> { (0..n).map(|i| TxnOp::get(format!("k{i}"), None)).collect() };
    let compares = |n: usize| -> Vec<Compare> {
        (0..n)
            .map(|i| Compare::version(format!("k{i}"), CompareOp::Equal, 0))
            .collect()
    };
    let r = txn(&mut c, Txn::new().when(compares(4)).and_then(puts(4))).await;
    assert!(r.succeeded());
    assert_eq!(rev(r.header()), 2, "four ops are allowed");

    assert_err(
        c.txn(Txn::new().and_then(puts(5))).await,
        Code::InvalidArgument,
        TOO_MANY,
    );
    assert_err(
        c.txn(Txn::new().or_else(gets(5))).await,
        Code::InvalidArgument,
        TOO_MANY,
    );
    assert_err(
        c.txn(Txn::new().when(compares(5))).await,
        Code::InvalidArgument,
        TOO_MANY,
    );
    // A nested txn gets the budget its parent left: 4 - 2 = 2 ops.
    let nested = |n: usize| {
        Txn::new().and_then([
            TxnOp::put("n", "v", None),
            TxnOp::txn(Txn::new().and_then(gets(n))),
        ])
    };
    assert_err(c.txn(nested(3)).await, Code::InvalidArgument, TOO_MANY);
    let r = txn(&mut c, nested(2)).await;
    assert_eq!(rev(r.header()), 3);
    assert_eq!(current_rev(&mut c).await, 3);
}

// -------------------------------------------------------------- Compact

#[tokio::test]
async fn compact_keeps_the_newest_version_at_or_below_it() {
    let server = TestServer::start();
    let mut c = server.client().await;
    put(&mut c, "k", "a").await; // r2
    put(&mut c, "o", "1").await; // r3
    put(&mut c, "o", "2").await; // r4
    put(&mut c, "k", "b").await; // r5
    put(&mut c, "d", "x").await; // r6
    within("delete", c.delete("d", None)).await.unwrap(); // r7

    let resp = within("compact", c.compact(4, None)).await.unwrap();
    assert_eq!(rev(resp.header()), 7);

    let k4 = get(&mut c, "k", Some(GetOptions::new().with_revision(4))).await;
    assert_eq!(values(k4.kvs()), ["a"], "k keeps its version from r2");
    assert_eq!(revs(&k4.kvs()[0]), (2, 2, 1));
    let o4 = get(&mut c, "o", Some(GetOptions::new().with_revision(4))).await;
    assert_eq!(values(o4.kvs()), ["2"]);
    let all4 = get(
        &mut c,
        "",
        Some(GetOptions::new().with_all_keys().with_revision(4)),
    )
    .await;
    assert_eq!(keys(all4.kvs()), ["k", "o"]);
    assert_eq!(rev(all4.header()), 7);
    let k5 = get(&mut c, "k", Some(GetOptions::new().with_revision(5))).await;
    assert_eq!(values(k5.kvs()), ["b"]);
    for old in [1, 2, 3] {
        assert_err(
            c.get("k", Some(GetOptions::new().with_revision(old))).await,
            Code::OutOfRange,
            COMPACTED,
        );
    }

    assert_err(c.compact(4, None).await, Code::OutOfRange, COMPACTED);
    assert_err(c.compact(3, None).await, Code::OutOfRange, COMPACTED);
    assert_err(c.compact(8, None).await, Code::OutOfRange, FUTURE);

    let physical = within(
        "compact",
        c.compact(6, Some(CompactionOptions::new().with_physical())),
    )
    .await
    .unwrap();
    assert_eq!(rev(physical.header()), 7);
    assert_err(
        c.get("k", Some(GetOptions::new().with_revision(5))).await,
        Code::OutOfRange,
        COMPACTED,
    );
    let d6 = get(&mut c, "d", Some(GetOptions::new().with_revision(6))).await;
    assert_eq!(values(d6.kvs()), ["x"]);
    let now = get(&mut c, "", Some(GetOptions::new().with_all_keys())).await;
    assert_eq!(keys(now.kvs()), ["k", "o"]);
    assert_eq!(values(now.kvs()), ["b", "2"]);
    // Compacting at the current revision is allowed.
    within("compact", c.compact(7, None)).await.unwrap();
    assert_eq!(put(&mut c, "k", "c").await, 8);
    let k = get(&mut c, "k", None).await;
    assert_eq!(revs(&k.kvs()[0]), (2, 8, 3), "compaction keeps versions");
}

// ------------------------------------------------------------- Limits

#[tokio::test]
async fn requests_over_max_request_bytes_are_rejected() {
    let server = ephd(&["--max-request-bytes", "1024"]);
    let mut c = server.client().await;
    const TOO_LARGE: &str = "etcdserver: request is too large";
    let big = "x".repeat(2048);
    assert_err(
        c.put("big", big.as_str(), None).await,
        Code::InvalidArgument,
        TOO_LARGE,
    );
    let medium = "y".repeat(600);
    assert_err(
        c.txn(Txn::new().and_then([
            TxnOp::put("t1", medium.as_str(), None),
            TxnOp::put("t2", medium.as_str(), None),
        ]))
        .await,
        Code::InvalidArgument,
        TOO_LARGE,
    );
    assert_eq!(current_rev(&mut c).await, 1, "nothing was written");
    assert_eq!(put(&mut c, "ok", &"z".repeat(512)).await, 2);
    assert_eq!(get(&mut c, "ok", None).await.kvs()[0].value().len(), 512);
}

#[tokio::test]
async fn txn_rejects_invalid_ops_before_writing_anything() {
    let server = TestServer::start();
    let mut c = server.client().await;
    put(&mut c, "k", "1").await; // r2
    put(&mut c, "k", "2").await; // r3
    put(&mut c, "k", "3").await; // r4
    within("compact", c.compact(3, None)).await.unwrap();
    let w = || TxnOp::put("w", "written?", None);
    let cases: Vec<(Txn, Code, &str)> = vec![
        (
            Txn::new().and_then([
                w(),
                TxnOp::get("k", Some(GetOptions::new().with_revision(5))),
            ]),
            Code::OutOfRange,
            FUTURE,
        ),
        (
            Txn::new().and_then([
                w(),
                TxnOp::get("k", Some(GetOptions::new().with_revision(2))),
            ]),
            Code::OutOfRange,
            COMPACTED,
        ),
        (
            // Only the branch that runs is checked against the store...
            Txn::new()
                .when([Compare::version("k", CompareOp::Equal, 3)])
                .and_then([
                    w(),
                    TxnOp::put("x", "v", Some(PutOptions::new().with_lease(999))),
                ]),
            Code::NotFound,
            "etcdserver: requested lease not found",
        ),
        (
            Txn::new().and_then([
                w(),
                TxnOp::put("missing", "", Some(PutOptions::new().with_ignore_value())),
            ]),
            Code::InvalidArgument,
            "etcdserver: key not found",
        ),
        (
            // ...but every op of both branches must be well-formed.
            Txn::new().and_then([w()]).or_else([TxnOp::put(
                "x",
                "v",
                Some(PutOptions::new().with_ignore_value()),
            )]),
            Code::InvalidArgument,
            "etcdserver: value is provided",
        ),
        (
            Txn::new().and_then([w()]).or_else([TxnOp::get("", None)]),
            Code::InvalidArgument,
            "etcdserver: key is not provided",
        ),
        (
            Txn::new().and_then([w(), TxnOp::delete("", None)]),
            Code::InvalidArgument,
            "etcdserver: key is not provided",
        ),
        (
            Txn::new()
                .when([Compare::version("", CompareOp::Equal, 0)])
                .and_then([w()]),
            Code::InvalidArgument,
            "etcdserver: key is not provided",
        ),
    ];
    for (t, code, msg) in cases {
        let desc = format!("{t:?}");
        let r = within("txn", c.txn(t)).await;
        assert!(r.is_err(), "{desc} succeeded");
        assert_err(r, code, msg);
    }
    // The branch not taken is not checked against the store.
    let r = txn(
        &mut c,
        Txn::new()
            .when([Compare::version("k", CompareOp::Equal, 3)])
            .or_else([TxnOp::put(
                "x",
                "v",
                Some(PutOptions::new().with_lease(999)),
            )]),
    )
    .await;
    assert!(r.succeeded());
    assert_eq!(rev(r.header()), 4);
    assert_err(
        c.delete("", None).await,
        Code::InvalidArgument,
        "etcdserver: key is not provided",
    );
    assert_eq!(
        get(&mut c, "w", None).await.count(),
        0,
        "nothing was written"
    );
    assert_eq!(current_rev(&mut c).await, 4);
    // A historical read inside a write txn: old value, current header.
    let r = txn(
        &mut c,
        Txn::new().and_then([
            TxnOp::put("k", "4", None),
            TxnOp::get("k", Some(GetOptions::new().with_revision(3))),
        ]),
    )
    .await;
    match &r.op_responses()[1] {
        TxnOpResponse::Get(g) => {
            assert_eq!(values(g.kvs()), ["2"]);
            assert_eq!(rev(g.header()), 5);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn txn_compare_and_delete_with_from_key_ranges() {
    let server = TestServer::start();
    let mut c = server.client().await;
    put(&mut c, "a", "1").await; // r2
    put(&mut c, "b", "1").await; // r3
    put(&mut c, "c", "2").await; // r4
    let from_b = |cmp: Compare| cmp.with_range("\0");
    assert!(holds(&mut c, from_b(Compare::version("b", CompareOp::Equal, 1))).await);
    assert!(!holds(&mut c, from_b(Compare::value("b", CompareOp::Equal, "1"))).await);
    assert!(holds(&mut c, from_b(Compare::value("a", CompareOp::Greater, "0"))).await);
    // etcd's duplicate-key check treats a from-key delete ("\0" end) as an
    // empty interval, so a put of a key at or after it is accepted.
    let r = txn(
        &mut c,
        Txn::new().and_then([
            TxnOp::delete("b", Some(DeleteOptions::new().with_from_key())),
            TxnOp::put("c", "3", None),
        ]),
    )
    .await;
    assert_eq!(rev(r.header()), 5);
    let all = get(&mut c, "", Some(GetOptions::new().with_all_keys())).await;
    assert_eq!(keys(all.kvs()), ["a", "c"]);
    assert_eq!(values(all.kvs()), ["1", "3"]);
    assert_eq!(
        revs(&all.kvs()[1]),
        (5, 5, 1),
        "deleted, then re-created at 5"
    );
}

#[tokio::test]
async fn txn_edge_cases_on_the_wire() {
    // What etcd-client cannot express: an op with no request, and compare
    // targets / results outside the enums.
    use ephd::proto::etcdserverpb::{self as pb, compare::TargetUnion};
    let server = TestServer::start();
    let mut kv = server.kv().await;
    let mut c = server.client().await;
    put(&mut c, "k", "v").await; // r2
    let empty_op = pb::TxnRequest {
        success: vec![pb::RequestOp { request: None }],
        ..Default::default()
    };
    crate::support::assert_raw_err(
        within("txn", kv.txn(empty_op)).await,
        Code::InvalidArgument,
        "etcdserver: key not found",
    );
    let cmp = |target: i32, result: i32, union: Option<TargetUnion>| pb::TxnRequest {
        compare: vec![pb::Compare {
            result,
            target,
            key: "k".into(),
            range_end: Default::default(),
            target_union: union,
        }],
        ..Default::default()
    };
    let succeeded = |resp: tonic::Response<pb::TxnResponse>| resp.into_inner().succeeded;
    for (req, want, what) in [
        // VERSION target with a MOD operand: compared against version 0.
        (
            cmp(0, 0, Some(TargetUnion::ModRevision(2))),
            false,
            "version == 0",
        ),
        (
            cmp(0, 1, Some(TargetUnion::ModRevision(2))),
            true,
            "version > 0",
        ),
        // No operand at all: VALUE compares against the empty value.
        (cmp(3, 1, None), true, "value > empty"),
        // A result outside the enum always holds.
        (
            cmp(2, 9, Some(TargetUnion::ModRevision(100))),
            true,
            "unknown result",
        ),
    ] {
        let r = within("txn", kv.txn(req)).await.expect(what);
        assert_eq!(succeeded(r), want, "{what}");
    }
    assert_eq!(current_rev(&mut c).await, 2);
}
