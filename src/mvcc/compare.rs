//! Txn compares and the branch each (nested) txn takes.
//!
//! Every compare of a txn, nested ones included, is evaluated against the
//! state before the txn writes anything, as in etcd.

use super::range::KvSource;
use super::types::*;
use crate::error::Result;
use std::cmp::Ordering;

/// Whether compare `c` holds for the keys `source` shows at `rev`. A range
/// compare holds when it holds for every key in the range.
pub(crate) fn compare_holds(c: &Compare, source: &dyn KvSource, rev: i64) -> bool {
    let mut kvs = Vec::new();
    source.for_each_visible(&c.key, &c.range_end, rev, &mut |kv| kvs.push(kv.clone()));
    if kvs.is_empty() {
        // A missing key compares as all zeroes, except that a value compare
        // always fails (there is no way to express "missing value").
        if matches!(c.target, CompareTarget::Value(_)) {
            return false;
        }
        return compare_kv(c, &KeyValue::default());
    }
    kvs.iter().all(|kv| compare_kv(c, kv))
}

fn compare_kv(c: &Compare, kv: &KeyValue) -> bool {
    let ord = match &c.target {
        CompareTarget::Version(v) => kv.version.cmp(v),
        CompareTarget::Create(v) => kv.create_revision.cmp(v),
        CompareTarget::Mod(v) => kv.mod_revision.cmp(v),
        CompareTarget::Lease(v) => kv.lease.cmp(v),
        CompareTarget::Value(v) => kv.value.as_ref().cmp(v.as_ref()),
        CompareTarget::Unknown => Ordering::Equal,
    };
    match c.result {
        CompareResult::Equal => ord == Ordering::Equal,
        CompareResult::NotEqual => ord != Ordering::Equal,
        CompareResult::Greater => ord == Ordering::Greater,
        CompareResult::Less => ord == Ordering::Less,
        CompareResult::Unknown => true,
    }
}

/// Which branch each txn (and each nested txn on the taken path) takes.
pub(crate) struct Path {
    /// Whether every compare held.
    pub(crate) succeeded: bool,
    /// The paths of the nested txns in the taken branch, in op order.
    pub(crate) nested: Vec<Path>,
}

impl Path {
    /// Evaluates every compare on the taken path against `source` at `rev`.
    pub(crate) fn evaluate(req: &TxnRequest, source: &dyn KvSource, rev: i64) -> Path {
        let succeeded = req.compare.iter().all(|c| compare_holds(c, source, rev));
        let ops = if succeeded {
            &req.success
        } else {
            &req.failure
        };
        let nested = ops
            .iter()
            .filter_map(|op| match op {
                RequestOp::Txn(t) => Some(Path::evaluate(t, source, rev)),
                _ => None,
            })
            .collect();
        Path { succeeded, nested }
    }

    /// The ops of the branch taken.
    pub(crate) fn ops<'r>(&self, req: &'r TxnRequest) -> &'r [RequestOp] {
        if self.succeeded {
            &req.success
        } else {
            &req.failure
        }
    }

    /// Visits every op on the taken path depth-first in op order (a nested
    /// txn's ops where the nested txn stands), the order of etcd's checks.
    pub(crate) fn visit<'r>(
        &self,
        req: &'r TxnRequest,
        f: &mut dyn FnMut(&'r RequestOp) -> Result<()>,
    ) -> Result<()> {
        let mut nested = self.nested.iter();
        for op in self.ops(req) {
            match op {
                RequestOp::Txn(t) => {
                    if let Some(p) = nested.next() {
                        p.visit(t, f)?;
                    }
                }
                _ => f(op)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::range::in_range;
    use bytes::Bytes;
    use std::sync::Arc;

    /// A fixed set of key-values, all visible at every revision.
    struct Fixed(Vec<Kv>);

    impl KvSource for Fixed {
        fn for_each_visible_while(
            &self,
            key: &Bytes,
            end: &Bytes,
            _rev: i64,
            f: &mut dyn FnMut(&Kv) -> bool,
        ) {
            self.0
                .iter()
                .filter(|kv| in_range(&kv.key, key, end))
                .all(f);
        }
    }

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    /// Key `k` with version 3, create 10, mod 20, lease 7, value "m".
    fn source() -> Fixed {
        let kv = |k: &str, value: &str| {
            Arc::new(KeyValue {
                key: b(k),
                create_revision: 10,
                mod_revision: 20,
                version: 3,
                value: b(value),
                lease: 7,
            })
        };
        Fixed(vec![kv("k", "m"), kv("r1", "a"), kv("r2", "b")])
    }

    fn cmp(key: &str, end: &str, result: CompareResult, target: CompareTarget) -> bool {
        let c = Compare {
            result,
            target,
            key: b(key),
            range_end: b(end),
        };
        compare_holds(&c, &source(), i64::MAX)
    }

    use CompareResult::{Equal as Eq, Greater as Gt, Less as Lt, NotEqual as Ne};

    #[test]
    fn every_numeric_target_with_every_result() {
        type Target = fn(i64) -> CompareTarget;
        let targets: [(Target, i64); 4] = [
            (CompareTarget::Version, 3),
            (CompareTarget::Create, 10),
            (CompareTarget::Mod, 20),
            (CompareTarget::Lease, 7),
        ];
        for (target, actual) in targets {
            for (operand, want) in [
                (actual, [true, false, false, false]),
                (actual - 1, [false, true, false, true]),
                (actual + 1, [false, false, true, true]),
            ] {
                let got = [Eq, Gt, Lt, Ne].map(|r| cmp("k", "", r, target(operand)));
                assert_eq!(got, want, "{:?} vs {operand}", target(operand));
            }
        }
    }

    #[test]
    fn value_compares_bytes_and_a_missing_key_never_matches_a_value() {
        let v = |s: &str| CompareTarget::Value(b(s));
        assert!(cmp("k", "", Eq, v("m")));
        assert!(cmp("k", "", Gt, v("l")));
        assert!(cmp("k", "", Lt, v("mm")), "a prefix sorts first");
        assert!(cmp("k", "", Ne, v("")));
        for r in [Eq, Gt, Lt, Ne] {
            assert!(!cmp("missing", "", r, v("")), "{r:?}");
        }
    }

    #[test]
    fn a_missing_key_compares_as_zero() {
        assert!(cmp("missing", "", Eq, CompareTarget::Version(0)));
        assert!(cmp("missing", "", Eq, CompareTarget::Create(0)));
        assert!(cmp("missing", "", Eq, CompareTarget::Mod(0)));
        assert!(cmp("missing", "", Eq, CompareTarget::Lease(0)));
        assert!(cmp("missing", "", Lt, CompareTarget::Mod(1)));
        assert!(!cmp("missing", "", Gt, CompareTarget::Version(0)));
    }

    #[test]
    fn undefined_targets_and_results_behave_as_in_etcd() {
        // An undefined target sees "equal"; an undefined result always holds.
        assert!(cmp("k", "", Eq, CompareTarget::Unknown));
        assert!(!cmp("k", "", Ne, CompareTarget::Unknown));
        assert!(cmp(
            "k",
            "",
            CompareResult::Unknown,
            CompareTarget::Version(99)
        ));
        assert!(
            !cmp(
                "missing",
                "",
                CompareResult::Unknown,
                CompareTarget::Value(b("x"))
            ),
            "a value compare on a missing key fails before the result is looked at"
        );
    }

    #[test]
    fn a_range_compare_must_hold_for_every_key() {
        let v = |s: &str| CompareTarget::Value(b(s));
        assert!(cmp("r", "s", Eq, CompareTarget::Version(3)));
        assert!(!cmp("r", "s", Eq, v("a")), "r2 has b");
        assert!(cmp("r", "s", Lt, v("c")));
        assert!(cmp("a", "\0", Gt, CompareTarget::Mod(19)), "from-key range");
        assert!(
            cmp("x", "y", Eq, CompareTarget::Version(0)),
            "an empty range compares as zero"
        );
    }

    #[test]
    fn paths_follow_the_taken_branches_depth_first() {
        let put = |k: &str| {
            RequestOp::Put(PutRequest {
                key: b(k),
                ..Default::default()
            })
        };
        let holds = Compare {
            result: Eq,
            target: CompareTarget::Version(3),
            key: b("k"),
            range_end: Bytes::new(),
        };
        let fails = Compare {
            result: Ne,
            ..holds.clone()
        };
        let inner = TxnRequest {
            compare: vec![fails],
            success: vec![put("inner-then")],
            failure: vec![put("inner-else-1"), put("inner-else-2")],
        };
        let outer = TxnRequest {
            compare: vec![holds],
            success: vec![put("first"), RequestOp::Txn(inner), put("last")],
            failure: vec![put("outer-else")],
        };
        let path = Path::evaluate(&outer, &source(), i64::MAX);
        assert!(path.succeeded);
        assert_eq!(path.nested.len(), 1);
        assert!(!path.nested[0].succeeded);
        let mut seen = Vec::new();
        path.visit(&outer, &mut |op| {
            if let RequestOp::Put(p) = op {
                seen.push(String::from_utf8_lossy(&p.key).into_owned());
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, ["first", "inner-else-1", "inner-else-2", "last"]);
    }
}
