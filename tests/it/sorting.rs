//! Ranges sorted by a field with ties: etcd sorts with Go's unstable
//! `sort.Sort`, so for more than twelve kvs the order among equal values is
//! that algorithm's, not key order. ephd reimplements it; these ranges must
//! come back in exactly stock etcd's order (the differential suite, which
//! draws from a small key space, ignores tie order).

use crate::harness::{Server, StockEtcd};
use crate::support::ephd;
use etcd_client::{Client, GetOptions, SortOrder, SortTarget};

/// The same history on both servers: 60 keys, values from a set of four so
/// every value is shared by ~15 keys, some keys updated to vary versions.
async fn load(client: &mut Client) {
    for i in 0..60u32 {
        let value = ["b", "d", "a", "c"][(i * 7 % 4) as usize];
        client.put(format!("s/{i:02}"), value, None).await.unwrap();
    }
    for i in (0..60u32).filter(|i| i % 3 == 0 || i % 5 == 0) {
        client.put(format!("s/{i:02}"), "a", None).await.unwrap();
    }
}

async fn ranges(client: &mut Client) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for (target, tname) in [
        (SortTarget::Value, "value"),
        (SortTarget::Version, "version"),
        (SortTarget::Create, "create"),
    ] {
        for (order, oname) in [(SortOrder::Ascend, "asc"), (SortOrder::Descend, "desc")] {
            for limit in [0, 20] {
                let opts = GetOptions::new()
                    .with_prefix()
                    .with_sort(target, order)
                    .with_limit(limit);
                let resp = client.get("s/", Some(opts)).await.unwrap();
                let keys = resp
                    .kvs()
                    .iter()
                    .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                    .collect();
                out.push((format!("{tname} {oname} limit {limit}"), keys));
            }
        }
    }
    out
}

#[tokio::test]
async fn ties_in_sorted_ranges_come_back_in_etcds_order() {
    let etcd = StockEtcd::start();
    let ours = ephd(&[]);
    let (mut a, mut b) = (etcd.client().await, ours.client().await);
    load(&mut a).await;
    load(&mut b).await;
    let (want, got) = (ranges(&mut a).await, ranges(&mut b).await);
    // The value sort really orders ties differently from a stable sort (key
    // order within equal values), so a naive sort could not pass.
    let all = a
        .get("s/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let mut stable: Vec<(Vec<u8>, String)> = all
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.value().to_vec(),
                String::from_utf8_lossy(kv.key()).into_owned(),
            )
        })
        .collect();
    stable.sort_by(|x, y| x.0.cmp(&y.0));
    let stable: Vec<String> = stable.into_iter().map(|(_, k)| k).collect();
    assert_eq!(want[0].1.len(), 60);
    assert_ne!(
        want[0].1, stable,
        "etcd's value sort kept key order: the test lost its ties"
    );
    for ((case, w), (_, g)) in want.iter().zip(got.iter()) {
        assert_eq!(w, g, "{case}: ephd's order differs from stock etcd's");
    }
}

/// Compare results and targets etcd does not define are plain integers on
/// the wire; ephd must evaluate them exactly as stock etcd does.
#[tokio::test]
async fn undefined_compare_values_behave_as_in_etcd() {
    use ephd::proto::etcdserverpb::{
        compare::TargetUnion, request_op::Request, Compare, PutRequest, RangeRequest, RequestOp,
        TxnRequest,
    };
    let etcd = StockEtcd::start();
    let ours = ephd(&[]);
    let mut answers = Vec::new();
    for mut kv in [etcd.kv().await, ours.kv().await] {
        kv.put(PutRequest {
            key: "u/1".into(),
            value: "b".into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let mut got = Vec::new();
        for (result, target, operand) in [
            (9, 3, TargetUnion::Value("zzz".into())),
            (9, 0, TargetUnion::Version(0)),
            (0, 9, TargetUnion::Version(5)),
            (1, 9, TargetUnion::Version(5)),
            (3, 9, TargetUnion::Version(5)),
            (0, 2, TargetUnion::Version(5)),
            (0, 1, TargetUnion::Lease(0)),
        ] {
            let txn = TxnRequest {
                compare: vec![Compare {
                    result,
                    target,
                    key: "u/1".into(),
                    target_union: Some(operand.clone()),
                    ..Default::default()
                }],
                success: vec![RequestOp {
                    request: Some(Request::RequestRange(RangeRequest {
                        key: "u/1".into(),
                        ..Default::default()
                    })),
                }],
                failure: vec![],
            };
            let r = kv
                .txn(txn)
                .await
                .map(|r| r.into_inner().succeeded)
                .map_err(|s| (s.code(), s.message().to_string()));
            got.push(format!(
                "result={result} target={target} {operand:?}: {r:?}"
            ));
        }
        answers.push(got);
    }
    assert_eq!(
        answers[0], answers[1],
        "stock etcd (left) and ephd (right) differ"
    );
}

/// An undefined sort order or target crashes stock etcd 3.4 (a nil sorter);
/// etcd 3.5+ rejects it, in ranges and in txn range ops, and so does ephd.
#[tokio::test]
async fn undefined_sort_options_are_rejected_like_etcd_35() {
    use ephd::proto::etcdserverpb::{request_op::Request, RangeRequest, RequestOp, TxnRequest};
    let ours = ephd(&[]);
    let mut kv = ours.kv().await;
    for (order, target) in [(7, 0), (1, 9), (0, 9)] {
        let range = RangeRequest {
            key: "u/".into(),
            sort_order: order,
            sort_target: target,
            ..Default::default()
        };
        let err = kv.range(range.clone()).await.unwrap_err();
        assert_eq!(
            (err.code(), err.message()),
            (
                tonic::Code::InvalidArgument,
                "etcdserver: invalid sort option"
            ),
            "order={order} target={target}"
        );
        let txn = TxnRequest {
            failure: vec![RequestOp {
                request: Some(Request::RequestRange(range)),
            }],
            ..Default::default()
        };
        let err = kv.txn(txn).await.unwrap_err();
        assert_eq!(err.message(), "etcdserver: invalid sort option");
    }
    // The server is still serving.
    kv.range(RangeRequest {
        key: "u/".into(),
        ..Default::default()
    })
    .await
    .unwrap();
}
