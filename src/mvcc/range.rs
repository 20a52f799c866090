//! Range evaluation shared by unary reads and reads inside transactions:
//! filters, sort and limit in exactly etcd's order.

use super::types::{Kv, RangeRequest, RangeResponse, SortOrder, SortTarget};
use bytes::Bytes;
use std::cmp::Ordering;

/// Where a range reads from: calls `f` with the version of every key in
/// `[key, end)` (with etcd's range conventions) visible at `rev`, in key order.
pub(crate) trait KvSource {
    /// Calls `f` for each visible version in key order until it answers
    /// false.
    fn for_each_visible_while(
        &self,
        key: &Bytes,
        end: &Bytes,
        rev: i64,
        f: &mut dyn FnMut(&Kv) -> bool,
    );

    fn for_each_visible(&self, key: &Bytes, end: &Bytes, rev: i64, f: &mut dyn FnMut(&Kv)) {
        self.for_each_visible_while(key, end, rev, &mut |kv| {
            f(kv);
            true
        });
    }
}

/// The upper bound of a range in etcd's conventions: `None` means "a single
/// key", `Some(None)` means "no upper bound" (`range_end == "\0"`).
pub(crate) fn range_bound(range_end: &Bytes) -> Option<Option<&Bytes>> {
    if range_end.is_empty() {
        None
    } else if range_end.as_ref() == b"\0" {
        Some(None)
    } else {
        Some(Some(range_end))
    }
}

/// Whether `k` lies in the range `[key, range_end)` with etcd's conventions.
pub fn in_range(k: &[u8], key: &[u8], range_end: &[u8]) -> bool {
    if range_end.is_empty() {
        k == key
    } else if range_end == b"\0" {
        k >= key
    } else {
        k >= key && k < range_end
    }
}

/// Runs a Range at `rev` against `source`, reporting `header_rev`.
pub(crate) fn execute_range(
    req: &RangeRequest,
    rev: i64,
    header_rev: i64,
    source: &dyn KvSource,
) -> RangeResponse {
    execute_range_counted(req, rev, header_rev, source, None)
}

/// How many keys a Range fetches: etcd fetches everything when it must
/// sort or filter, otherwise one more than the limit so that `more` can be
/// told.
fn fetch_limit(req: &RangeRequest) -> usize {
    let has_filters = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    if req.sort_order != SortOrder::None || has_filters || req.limit <= 0 {
        usize::MAX
    } else {
        req.limit as usize + 1
    }
}

/// Whether the count of a Range is all that needs the rest of its range
/// walked, and the keys it returns are the first of its range in key
/// order: a limit, no sort and no filters. Only such a Range can use a
/// count known beforehand.
pub(crate) fn walks_only_to_count(req: &RangeRequest) -> bool {
    fetch_limit(req) != usize::MAX && !req.count_only && req.sort_target == SortTarget::Key
}

/// [`execute_range`], given the count of keys visible at `rev` in the
/// range when it is known (a Range [`walks_only_to_count`]): the walk then
/// stops one key past the limit instead of counting the rest.
pub(crate) fn execute_range_counted(
    req: &RangeRequest,
    rev: i64,
    header_rev: i64,
    source: &dyn KvSource,
    known_count: Option<i64>,
) -> RangeResponse {
    let fetch_limit = fetch_limit(req);
    let known_count = known_count.filter(|_| walks_only_to_count(req));
    let mut count: i64 = 0;
    let mut kvs: Vec<Kv> = Vec::new();
    let count_only = req.count_only;
    source.for_each_visible_while(&req.key, &req.range_end, rev, &mut |kv| {
        count += 1;
        if !count_only && kvs.len() < fetch_limit {
            kvs.push(kv.clone());
        }
        known_count.is_none() || kvs.len() < fetch_limit
    });
    let count = known_count.unwrap_or(count);
    if count_only {
        return RangeResponse {
            revision: header_rev,
            kvs: Vec::new(),
            more: false,
            count,
            keys_only: req.keys_only,
        };
    }
    if req.min_mod_revision != 0 {
        kvs.retain(|kv| kv.mod_revision >= req.min_mod_revision);
    }
    if req.max_mod_revision != 0 {
        kvs.retain(|kv| kv.mod_revision <= req.max_mod_revision);
    }
    if req.min_create_revision != 0 {
        kvs.retain(|kv| kv.create_revision >= req.min_create_revision);
    }
    if req.max_create_revision != 0 {
        kvs.retain(|kv| kv.create_revision <= req.max_create_revision);
    }
    sort_kvs(&mut kvs, req.sort_order, req.sort_target);
    let mut more = false;
    if req.limit > 0 && kvs.len() > req.limit as usize {
        kvs.truncate(req.limit as usize);
        more = true;
    }
    RangeResponse {
        revision: header_rev,
        kvs,
        more,
        count,
        keys_only: req.keys_only,
    }
}

fn sort_kvs(kvs: &mut [Kv], order: SortOrder, target: SortTarget) {
    // etcd sorts ascending when a non-key target is given without an order.
    let order = if target != SortTarget::Key && order == SortOrder::None {
        SortOrder::Ascend
    } else {
        order
    };
    let cmp: fn(&Kv, &Kv) -> Ordering = match target {
        SortTarget::Key => |a, b| a.key.cmp(&b.key),
        SortTarget::Version => |a, b| a.version.cmp(&b.version),
        SortTarget::Create => |a, b| a.create_revision.cmp(&b.create_revision),
        SortTarget::Mod => |a, b| a.mod_revision.cmp(&b.mod_revision),
        SortTarget::Value => |a, b| a.value.cmp(&b.value),
        SortTarget::Unknown => return,
    };
    match order {
        SortOrder::Ascend => super::gosort::sort(kvs, cmp),
        SortOrder::Descend => super::gosort::sort(kvs, |a, b| cmp(b, a)),
        SortOrder::None | SortOrder::Unknown => {}
    }
}
