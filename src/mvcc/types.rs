//! Plain data types of the store core: key-values, events and the request
//! and response shapes of Range, Put, DeleteRange and Txn.
//!
//! They mirror etcd's messages field for field, but belong to the core so
//! that it knows nothing about protobuf or gRPC; `api/` converts.

use bytes::Bytes;
use std::sync::Arc;

/// One version of one key, shared (never copied) between the index, the
/// event log and every response that returns it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyValue {
    /// The key bytes, shared with the index entry.
    pub key: Bytes,
    /// Revision of the put that created this generation of the key.
    pub create_revision: i64,
    /// Revision of the write that produced this version.
    pub mod_revision: i64,
    /// Number of puts since the key was (re)created; 1 for a create.
    pub version: i64,
    /// The value bytes.
    pub value: Bytes,
    /// The lease the key is attached to, 0 for none.
    pub lease: i64,
}

/// A shared, immutable key-value version.
pub type Kv = Arc<KeyValue>;

/// What happened to a key at a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The key was created or updated.
    Put,
    /// The key was deleted (explicitly, by range, or by lease revoke/expiry).
    Delete,
}

/// A change to one key, as watchers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Put or delete.
    pub kind: EventKind,
    /// For a put the new version; for a delete only `key` and `mod_revision`.
    pub kv: Kv,
    /// The version the key had before this change, if it existed.
    pub prev_kv: Option<Kv>,
}

impl Event {
    /// etcd's "create" rule, which clients use too: a put whose
    /// `create_revision` equals its `mod_revision`.
    pub fn is_create(&self) -> bool {
        self.kind == EventKind::Put && self.kv.create_revision == self.kv.mod_revision
    }
}

/// Sort order of a Range, with etcd's numeric values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortOrder {
    /// No sorting requested (results still come in key order).
    #[default]
    None,
    /// Ascending by the sort target.
    Ascend,
    /// Descending by the sort target.
    Descend,
    /// A value etcd does not define; rejected by request validation.
    Unknown,
}

/// Field a Range sorts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortTarget {
    /// The key bytes.
    #[default]
    Key,
    /// The version count.
    Version,
    /// The create revision.
    Create,
    /// The mod revision.
    Mod,
    /// The value bytes.
    Value,
    /// A value etcd does not define; rejected by request validation.
    Unknown,
}

/// A Range request; see etcd's `RangeRequest`.
#[derive(Debug, Clone, Default)]
pub struct RangeRequest {
    /// First key (or the only key when `range_end` is empty).
    pub key: Bytes,
    /// Exclusive end; empty for a single key, `"\0"` for every key >= `key`.
    pub range_end: Bytes,
    /// At most this many kvs; 0 is unlimited.
    pub limit: i64,
    /// Read at this revision; 0 or less means current.
    pub revision: i64,
    /// Requested sort order.
    pub sort_order: SortOrder,
    /// Requested sort target.
    pub sort_target: SortTarget,
    /// Return keys without values.
    pub keys_only: bool,
    /// Return only the count.
    pub count_only: bool,
    /// Filters, 0 meaning unset.
    pub min_mod_revision: i64,
    /// See `min_mod_revision`.
    pub max_mod_revision: i64,
    /// See `min_mod_revision`.
    pub min_create_revision: i64,
    /// See `min_mod_revision`.
    pub max_create_revision: i64,
}

/// Response to a Range.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeResponse {
    /// The revision in the response header.
    pub revision: i64,
    /// Matching kvs after filters, sort and limit.
    pub kvs: Vec<Kv>,
    /// Whether more kvs matched than `limit` allowed.
    pub more: bool,
    /// All live keys in the range at the read revision, ignoring limit and filters.
    pub count: i64,
    /// Set when `keys_only` was requested: values must not be sent.
    pub keys_only: bool,
}

/// A Put request; see etcd's `PutRequest`.
#[derive(Debug, Clone, Default)]
pub struct PutRequest {
    /// Key to write.
    pub key: Bytes,
    /// Value to write.
    pub value: Bytes,
    /// Lease to attach, 0 for none.
    pub lease: i64,
    /// Return the previous version.
    pub prev_kv: bool,
    /// Keep the current value.
    pub ignore_value: bool,
    /// Keep the current lease.
    pub ignore_lease: bool,
}

/// Response to a Put.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutResponse {
    /// The revision in the response header.
    pub revision: i64,
    /// The previous version, when requested and present.
    pub prev_kv: Option<Kv>,
}

/// A DeleteRange request; see etcd's `DeleteRangeRequest`.
#[derive(Debug, Clone, Default)]
pub struct DeleteRequest {
    /// First key (or the only key when `range_end` is empty).
    pub key: Bytes,
    /// Exclusive end, with Range's conventions.
    pub range_end: Bytes,
    /// Return the deleted versions.
    pub prev_kv: bool,
}

/// Response to a DeleteRange.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteResponse {
    /// The revision in the response header.
    pub revision: i64,
    /// Number of keys deleted.
    pub deleted: i64,
    /// The deleted versions, when requested.
    pub prev_kvs: Vec<Kv>,
}

/// What a compare looks at, with the operand from the request. A target
/// whose operand is missing or of another kind compares against zero (or the
/// empty value), as in etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompareTarget {
    /// The key's version.
    Version(i64),
    /// The key's create revision.
    Create(i64),
    /// The key's mod revision.
    Mod(i64),
    /// The key's value.
    Value(Bytes),
    /// The key's lease.
    Lease(i64),
    /// A target etcd does not define: every such compare sees "equal".
    Unknown,
}

/// Comparison operator; `Unknown` values always hold, as in etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareResult {
    /// `==`
    Equal,
    /// `>`
    Greater,
    /// `<`
    Less,
    /// `!=`
    NotEqual,
    /// Not one of etcd's values.
    Unknown,
}

/// One compare of a Txn.
#[derive(Debug, Clone)]
pub struct Compare {
    /// The operator.
    pub result: CompareResult,
    /// The field and operand.
    pub target: CompareTarget,
    /// The key, or first key of a range.
    pub key: Bytes,
    /// Range end with Range's conventions; every key in it must satisfy the compare.
    pub range_end: Bytes,
}

/// One operation inside a Txn branch.
#[derive(Debug, Clone)]
pub enum RequestOp {
    /// A read.
    Range(RangeRequest),
    /// A write of one key.
    Put(PutRequest),
    /// A delete of a key or range.
    Delete(DeleteRequest),
    /// A nested transaction.
    Txn(TxnRequest),
    /// An op with no request set (etcd answers "key not found").
    Empty,
}

/// A Txn request.
#[derive(Debug, Clone, Default)]
pub struct TxnRequest {
    /// All must hold for `success` to run.
    pub compare: Vec<Compare>,
    /// Ops run when every compare holds.
    pub success: Vec<RequestOp>,
    /// Ops run otherwise.
    pub failure: Vec<RequestOp>,
}

/// Response of one Txn op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseOp {
    /// Response of a Range op.
    Range(RangeResponse),
    /// Response of a Put op.
    Put(PutResponse),
    /// Response of a DeleteRange op.
    Delete(DeleteResponse),
    /// Response of a nested Txn.
    Txn(TxnResponse),
}

/// Response to a Txn.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnResponse {
    /// The revision in the response header (0 for nested txns, as in etcd).
    pub revision: i64,
    /// Whether the compares held.
    pub succeeded: bool,
    /// One response per op of the branch that ran.
    pub responses: Vec<ResponseOp>,
}

/// Response to a LeaseGrant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseGrantResponse {
    /// The header revision.
    pub revision: i64,
    /// The granted lease ID.
    pub id: i64,
    /// The effective TTL in seconds.
    pub ttl: i64,
}

/// Response to one LeaseKeepAlive request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseKeepAliveResponse {
    /// The header revision, read before the refresh, as etcd does.
    pub revision: i64,
    /// The lease ID asked about.
    pub id: i64,
    /// The lease's TTL, or 0 when it is unknown or already expired.
    pub ttl: i64,
}

/// Response to a LeaseTimeToLive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseTimeToLiveResponse {
    /// The header revision.
    pub revision: i64,
    /// The lease ID asked about.
    pub id: i64,
    /// Whole seconds left, or -1 when the lease is unknown.
    pub ttl: i64,
    /// The TTL it was granted with, 0 when unknown.
    pub granted_ttl: i64,
    /// Attached keys, sorted, when asked for.
    pub keys: Vec<Bytes>,
}

/// Response to a LeaseLeases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseLeasesResponse {
    /// The header revision.
    pub revision: i64,
    /// Every granted lease ID, ascending.
    pub ids: Vec<i64>,
}

/// What an Alarm request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlarmAction {
    /// List raised alarms (of one type, or all for type 0).
    Get,
    /// Raise an alarm for a member.
    Activate,
    /// Clear an alarm of a member.
    Deactivate,
}

/// A raised alarm: which member, and etcd's alarm type number (0 none,
/// 1 NOSPACE, 2 CORRUPT; other numbers are kept as given).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct AlarmMember {
    /// The member the alarm is about.
    pub member_id: u64,
    /// The alarm type.
    pub alarm: i32,
}
