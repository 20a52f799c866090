//! Request checks that need no state: etcd's validation of Range, Put,
//! DeleteRange and Txn, in etcd's order, so the first error a client sees is
//! the one etcd would report.

use super::entry::Entry;
use super::types::*;
use crate::error::{Error, Result};
use bytes::Bytes;
use std::collections::HashSet;

/// etcd's stateless checks of a client's request as `entry` carries it
/// (nothing for entries that are not requests), run before it is applied
/// or proposed so that a malformed request is refused by the member it
/// reached and never replicated; `max_txn_ops` is `--max-txn-ops`. The
/// apply path checks again, as every member must for an entry it did not
/// propose.
pub fn check_request(entry: &Entry, max_txn_ops: usize) -> Result<()> {
    match entry {
        Entry::Put(p) => check_put(p),
        Entry::Delete(d) => check_key(&d.key),
        Entry::Txn(t) => check_txn(t, max_txn_ops),
        Entry::Authorized { entry, .. } => check_request(entry, max_txn_ops),
        _ => Ok(()),
    }
}

/// etcd's checks for a txn, in etcd's order: op counts, compare keys, every
/// op recursively (nested txns get what is left of the op budget), then the
/// rule that no key is written twice.
pub(crate) fn check_txn(req: &TxnRequest, max_ops: usize) -> Result<()> {
    check_txn_ops(req, max_ops as i64)?;
    check_intervals(&req.success)?;
    check_intervals(&req.failure)?;
    Ok(())
}

fn check_txn_ops(req: &TxnRequest, max_ops: i64) -> Result<()> {
    let opc = req
        .compare
        .len()
        .max(req.success.len())
        .max(req.failure.len()) as i64;
    if opc > max_ops {
        return Err(Error::TooManyOps);
    }
    if req.compare.iter().any(|c| c.key.is_empty()) {
        return Err(Error::EmptyKey);
    }
    for op in req.success.iter().chain(req.failure.iter()) {
        check_op(op, max_ops - opc)?;
    }
    Ok(())
}

fn check_op(op: &RequestOp, max_ops: i64) -> Result<()> {
    match op {
        RequestOp::Range(r) => check_range(r),
        RequestOp::Put(p) => check_put(p),
        RequestOp::Delete(d) => check_key(&d.key),
        RequestOp::Txn(t) => check_txn_ops(t, max_ops),
        RequestOp::Empty => Err(Error::KeyNotFound),
    }
}

/// etcd 3.5+'s Range checks (3.4 crashed on an undefined sort target).
pub(crate) fn check_range(r: &RangeRequest) -> Result<()> {
    check_key(&r.key)?;
    if r.sort_order == SortOrder::Unknown || r.sort_target == SortTarget::Unknown {
        return Err(Error::InvalidSortOption);
    }
    Ok(())
}

/// A key must not be empty.
pub(crate) fn check_key(key: &Bytes) -> Result<()> {
    if key.is_empty() {
        Err(Error::EmptyKey)
    } else {
        Ok(())
    }
}

/// etcd's Put checks: a key, and no value or lease given together with the
/// flag that keeps the current one.
pub(crate) fn check_put(p: &PutRequest) -> Result<()> {
    check_key(&p.key)?;
    if p.ignore_value && !p.value.is_empty() {
        return Err(Error::ValueProvided);
    }
    if p.ignore_lease && p.lease != 0 {
        return Err(Error::LeaseProvided);
    }
    Ok(())
}

/// A deleted interval as etcd's overlap check sees it: `[begin, end)` by
/// plain byte comparison (so a `"\0"` end matches nothing, as in etcd), or a
/// single key when `end` is empty.
struct DelInterval {
    begin: Bytes,
    end: Bytes,
}

impl DelInterval {
    fn contains(&self, k: &Bytes) -> bool {
        if self.end.is_empty() {
            *k == self.begin
        } else {
            self.begin <= *k && *k < self.end
        }
    }
}

/// etcd's rule that one txn must not write a key twice: no two puts of a
/// key, and no put inside a deleted range, across nesting levels (the two
/// branches of a nested txn may put the same key).
fn check_intervals(ops: &[RequestOp]) -> Result<()> {
    intervals(ops).map(drop)
}

fn intervals(ops: &[RequestOp]) -> Result<(HashSet<Bytes>, Vec<DelInterval>)> {
    let mut dels: Vec<DelInterval> = ops
        .iter()
        .filter_map(|op| match op {
            RequestOp::Delete(d) => Some(DelInterval {
                begin: d.key.clone(),
                end: d.range_end.clone(),
            }),
            _ => None,
        })
        .collect();
    let hits = |dels: &[DelInterval], k: &Bytes| dels.iter().any(|d| d.contains(k));
    let mut puts: HashSet<Bytes> = HashSet::new();
    for op in ops {
        let RequestOp::Txn(t) = op else { continue };
        let (puts_then, dels_then) = intervals(&t.success)?;
        let (puts_else, dels_else) = intervals(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || hits(&dels, k) {
                return Err(Error::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        for k in &puts_else {
            if (puts.contains(k) && !puts_then.contains(k)) || hits(&dels, k) {
                return Err(Error::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        dels.extend(
            dels_then
                .into_iter()
                .filter(|d| d.end.is_empty() || d.begin < d.end),
        );
        dels.extend(
            dels_else
                .into_iter()
                .filter(|d| d.end.is_empty() || d.begin < d.end),
        );
    }
    for op in ops {
        let RequestOp::Put(p) = op else { continue };
        if puts.contains(&p.key) || hits(&dels, &p.key) {
            return Err(Error::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

/// etcd treats a txn as read-only only when both branches hold nothing but
/// ranges (a nested txn makes it a write txn even if it only reads).
pub(crate) fn is_read_only(req: &TxnRequest) -> bool {
    req.success
        .iter()
        .chain(req.failure.iter())
        .all(|op| matches!(op, RequestOp::Range(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn put(k: &str) -> RequestOp {
        RequestOp::Put(PutRequest {
            key: b(k),
            ..Default::default()
        })
    }

    fn del(k: &str, end: &str) -> RequestOp {
        RequestOp::Delete(DeleteRequest {
            key: b(k),
            range_end: b(end),
            prev_kv: false,
        })
    }

    fn get(k: &str) -> RequestOp {
        RequestOp::Range(RangeRequest {
            key: b(k),
            ..Default::default()
        })
    }

    fn txn(success: Vec<RequestOp>, failure: Vec<RequestOp>) -> TxnRequest {
        TxnRequest {
            compare: Vec::new(),
            success,
            failure,
        }
    }

    fn nested(success: Vec<RequestOp>, failure: Vec<RequestOp>) -> RequestOp {
        RequestOp::Txn(txn(success, failure))
    }

    fn check(t: &TxnRequest) -> Result<()> {
        check_txn(t, 128)
    }

    #[test]
    fn a_key_may_be_put_once_per_branch() {
        assert_eq!(
            check(&txn(vec![put("a"), put("a")], vec![])),
            Err(Error::DuplicateKey)
        );
        assert_eq!(
            check(&txn(vec![], vec![put("a"), put("a")])),
            Err(Error::DuplicateKey)
        );
        assert_eq!(
            check(&txn(vec![put("a")], vec![put("a")])),
            Ok(()),
            "branches are separate"
        );
        assert_eq!(
            check(&txn(vec![put("a"), get("a"), get("a")], vec![])),
            Ok(())
        );
    }

    #[test]
    fn a_put_must_not_fall_in_a_deleted_interval() {
        assert_eq!(
            check(&txn(vec![del("a", ""), put("a")], vec![])),
            Err(Error::DuplicateKey)
        );
        assert_eq!(
            check(&txn(vec![del("a", "c"), put("b")], vec![])),
            Err(Error::DuplicateKey)
        );
        assert_eq!(
            check(&txn(vec![del("a", "c"), put("c")], vec![])),
            Ok(()),
            "end is exclusive"
        );
        // A "\0" end means "from key" in a range, but the overlap check
        // compares bytes plainly, as etcd does: it covers nothing.
        assert_eq!(check(&txn(vec![del("a", "\0"), put("b")], vec![])), Ok(()));
        assert_eq!(
            check(&txn(vec![del("a", ""), del("a", "")], vec![])),
            Ok(()),
            "deletes may overlap"
        );
    }

    #[test]
    fn nested_branches_may_put_the_same_key_but_not_the_parent() {
        let ok = txn(vec![nested(vec![put("a")], vec![put("a")])], vec![]);
        assert_eq!(check(&ok), Ok(()));
        let clash = txn(vec![put("a"), nested(vec![put("a")], vec![])], vec![]);
        assert_eq!(check(&clash), Err(Error::DuplicateKey));
        let clash_else = txn(vec![put("a"), nested(vec![], vec![put("a")])], vec![]);
        assert_eq!(check(&clash_else), Err(Error::DuplicateKey));
        let under_delete = txn(vec![del("a", "z"), nested(vec![put("b")], vec![])], vec![]);
        assert_eq!(check(&under_delete), Err(Error::DuplicateKey));
        // A nested txn's delete covers the parent's later puts.
        let nested_delete = txn(vec![nested(vec![del("a", "z")], vec![]), put("b")], vec![]);
        assert_eq!(check(&nested_delete), Err(Error::DuplicateKey));
        // ...unless its interval is empty (begin >= end), which etcd drops.
        let empty_interval = txn(vec![nested(vec![del("z", "a")], vec![]), put("b")], vec![]);
        assert_eq!(check(&empty_interval), Ok(()));
        let two_nested = txn(
            vec![
                nested(vec![put("a")], vec![]),
                nested(vec![put("a")], vec![]),
            ],
            vec![],
        );
        assert_eq!(check(&two_nested), Err(Error::DuplicateKey));
    }

    #[test]
    fn op_counts_are_checked_before_keys_and_shrink_with_nesting() {
        let many = txn((0..5).map(|i| put(&format!("k{i}"))).collect(), vec![]);
        assert_eq!(check_txn(&many, 4), Err(Error::TooManyOps));
        assert_eq!(check_txn(&many, 5), Ok(()));
        // The nested txn gets max_ops minus the parent's op count.
        let inner = txn(
            vec![nested(vec![put("a"), put("b")], vec![]), get("x")],
            vec![],
        );
        assert_eq!(check_txn(&inner, 4), Ok(()));
        assert_eq!(check_txn(&inner, 3), Err(Error::TooManyOps));
        // Too many ops wins over an empty key in the same request.
        let both = txn(vec![put(""), put("a"), put("b")], vec![]);
        assert_eq!(check_txn(&both, 2), Err(Error::TooManyOps));
        assert_eq!(check_txn(&both, 3), Err(Error::EmptyKey));
    }

    #[test]
    fn ops_are_checked_in_order_with_etcds_errors() {
        let empty_op = txn(vec![RequestOp::Empty], vec![]);
        assert_eq!(check(&empty_op), Err(Error::KeyNotFound));
        let value_and_ignore = RequestOp::Put(PutRequest {
            key: b("a"),
            value: b("v"),
            ignore_value: true,
            ..Default::default()
        });
        assert_eq!(
            check(&txn(vec![value_and_ignore], vec![])),
            Err(Error::ValueProvided)
        );
        let lease_and_ignore = PutRequest {
            key: b("a"),
            lease: 5,
            ignore_lease: true,
            ..Default::default()
        };
        assert_eq!(check_put(&lease_and_ignore), Err(Error::LeaseProvided));
        let bad_sort = RangeRequest {
            key: b("a"),
            sort_order: SortOrder::Unknown,
            ..Default::default()
        };
        assert_eq!(check_range(&bad_sort), Err(Error::InvalidSortOption));
        let empty_key_first = RangeRequest {
            sort_target: SortTarget::Unknown,
            ..Default::default()
        };
        assert_eq!(check_range(&empty_key_first), Err(Error::EmptyKey));
        let mut empty_compare = txn(vec![], vec![]);
        empty_compare.compare.push(Compare {
            result: CompareResult::Equal,
            target: CompareTarget::Version(0),
            key: Bytes::new(),
            range_end: Bytes::new(),
        });
        assert_eq!(check(&empty_compare), Err(Error::EmptyKey));
    }

    #[test]
    fn only_pure_range_txns_are_read_only() {
        assert!(is_read_only(&txn(vec![get("a")], vec![get("b")])));
        assert!(is_read_only(&txn(vec![], vec![])));
        assert!(!is_read_only(&txn(vec![get("a")], vec![put("b")])));
        assert!(!is_read_only(&txn(
            vec![nested(vec![get("a")], vec![])],
            vec![]
        )));
    }
}
