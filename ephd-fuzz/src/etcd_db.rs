//! Target `etcd_db`: the reader of etcd's database format (what
//! `--restore-snapshot` takes from etcd or `etcdctl snapshot save`) on
//! arbitrary bytes. Reading must not panic; what it accepts must obey
//! etcd's rules: keys strictly ascending, `1 <= create <= mod <= revision`,
//! versions from 1, leases with an ID and a TTL.

use ephd::persist::etcd_db::read_bytes;

/// The clock the reader is given.
const NOW_UNIX_MS: i64 = 1_700_000_000_000;

/// Runs one input; panics on a finding.
pub fn run(data: &[u8]) {
    let Ok(got) = read_bytes(data.to_vec(), NOW_UNIX_MS) else {
        return;
    };
    assert!(got.revision >= 1, "revision {}", got.revision);
    assert!(
        got.kvs.windows(2).all(|w| w[0].key < w[1].key),
        "keys out of order"
    );
    for kv in &got.kvs {
        assert!(
            1 <= kv.create_revision
                && kv.create_revision <= kv.mod_revision
                && kv.mod_revision <= got.revision
                && kv.version >= 1,
            "impossible revisions accepted: {kv:?} at revision {}",
            got.revision
        );
    }
    for l in &got.leases {
        assert!(l.id > 0 && l.ttl > 0, "lease accepted: {l:?}");
    }
}
