//! etcd's JSON encoding of its protobuf messages, as its grpc-gateway
//! (jsonpb with the proto field names) writes and reads them:
//!
//! - field names as written in the `.proto` files (`create_revision`,
//!   `cluster_id`, but `ID`, `TTL`, `dbSize` where etcd named them so);
//! - fields at their default value left out;
//! - 64-bit integers as strings, 32-bit ones as numbers, enums by name;
//! - `bytes` as standard base64.
//!
//! Reading accepts what jsonpb accepts: either field-name style, 64-bit
//! integers as numbers or strings, enums by name or number, and unknown
//! fields are ignored. The messages are known by name from the descriptors
//! compiled in by build.rs, so no message is mapped by hand.

use prost::Message;
use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage, SerializeOptions};
use std::sync::OnceLock;
use tonic::Status;

/// The descriptors of every message ephd compiles (build.rs).
static DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/ephd_descriptors.bin"));

fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(DESCRIPTORS).expect("build.rs wrote a valid descriptor set")
    })
}

/// The descriptor of the message `name` (fully qualified).
fn message(name: &str) -> Result<prost_reflect::MessageDescriptor, Status> {
    pool()
        .get_message_by_name(name)
        .ok_or_else(|| Status::internal(format!("gateway: no message named {name}")))
}

/// The protobuf encoding of the JSON `value` read as message `name`.
/// A body that is not such a message is InvalidArgument, as etcd's gateway
/// answers it (HTTP 400). Unknown fields and unknown enum names are
/// ignored (the field keeps its default), as etcd 3.6's gateway reads JSON
/// (protojson with `DiscardUnknown`).
pub fn encode_value(name: &str, value: serde_json::Value) -> Result<Vec<u8>, Status> {
    let desc = message(name)?;
    let options = DeserializeOptions::new().deny_unknown_fields(false);
    let msg = DynamicMessage::deserialize_with_options(desc, value, &options)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(msg.encode_to_vec())
}

/// The first JSON value of `body` read as message `name`, encoded; an
/// empty body is the empty message (etcd's gateway reads the first value
/// and ignores the rest).
pub fn encode_body(name: &str, body: &[u8]) -> Result<Vec<u8>, Status> {
    let mut values = serde_json::Deserializer::from_slice(body).into_iter::<serde_json::Value>();
    match values.next() {
        None => encode_value(name, serde_json::Value::Object(Default::default())),
        Some(Ok(value)) => encode_value(name, value),
        Some(Err(e)) => Err(Status::invalid_argument(e.to_string())),
    }
}

/// The JSON text of the protobuf message `bytes` of type `name`.
pub fn to_json(name: &str, bytes: &[u8]) -> Result<String, Status> {
    let desc = message(name)?;
    let msg = DynamicMessage::decode(desc, bytes)
        .map_err(|e| Status::internal(format!("gateway: undecodable {name}: {e}")))?;
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .skip_default_fields(true)
        .stringify_64_bit_integers(true)
        .use_enum_numbers(false);
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::new(&mut out);
    msg.serialize_with_options(&mut ser, &options)
        .map_err(|e| Status::internal(format!("gateway: {name} as JSON: {e}")))?;
    String::from_utf8(out).map_err(|e| Status::internal(e.to_string()))
}

/// The HTTP status etcd's gateway (grpc-gateway v2, etcd 3.6) answers a
/// gRPC code with.
pub fn http_status(code: tonic::Code) -> u16 {
    use tonic::Code::*;
    match code {
        Ok => 200,
        Cancelled => 499,
        Unknown => 500,
        InvalidArgument => 400,
        DeadlineExceeded => 504,
        NotFound => 404,
        AlreadyExists => 409,
        PermissionDenied => 403,
        Unauthenticated => 401,
        ResourceExhausted => 429,
        FailedPrecondition => 400,
        Aborted => 409,
        OutOfRange => 400,
        Unimplemented => 501,
        Internal => 500,
        Unavailable => 503,
        DataLoss => 500,
    }
}

/// The body of a failed call: `{"code":…,"message":…}`, the gRPC status
/// as etcd 3.6's gateway writes it.
pub fn error_body(status: &Status) -> String {
    format!(
        r#"{{"code":{},"message":{}}}"#,
        status.code() as i32,
        quoted(status.message())
    )
}

/// The line a stream ends with when its call fails after it started:
/// `{"error":{"code":…,"message":…}}`, the gRPC status under "error" as
/// grpc-gateway v2 (etcd 3.6) writes it.
pub fn stream_error_line(status: &Status) -> String {
    format!("{{\"error\":{}}}\n", error_body(status))
}

/// `s` as a JSON string.
fn quoted(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb as pb;

    #[test]
    fn etcd_field_names_strings_for_64_bit_and_defaults_left_out() {
        let resp = pb::RangeResponse {
            header: Some(pb::ResponseHeader {
                cluster_id: 14841639068965178418,
                member_id: 10276657743932975437,
                revision: 2,
                raft_term: 2,
            }),
            kvs: vec![crate::proto::mvccpb::KeyValue {
                key: bytes::Bytes::from_static(b"foo"),
                create_revision: 2,
                mod_revision: 2,
                version: 1,
                value: bytes::Bytes::from_static(b"bar"),
                lease: 0,
            }],
            more: false,
            count: 1,
        };
        assert_eq!(
            to_json("etcdserverpb.RangeResponse", &resp.encode_to_vec()).unwrap(),
            r#"{"header":{"cluster_id":"14841639068965178418","member_id":"10276657743932975437","revision":"2","raft_term":"2"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}],"count":"1"}"#
        );
        let grant = pb::LeaseGrantResponse {
            header: None,
            id: 7,
            ttl: 30,
            error: String::new(),
        };
        assert_eq!(
            to_json("etcdserverpb.LeaseGrantResponse", &grant.encode_to_vec()).unwrap(),
            r#"{"ID":"7","TTL":"30"}"#
        );
    }

    #[test]
    fn reads_either_name_style_numbers_or_strings_and_enum_names() {
        let bytes = encode_body(
            "etcdserverpb.RangeRequest",
            br#"{"key":"Zm9v","rangeEnd":"Zm9w","limit":"5","sort_order":"DESCEND","sortTarget":2,"bogus":1} trailing"#,
        )
        .unwrap();
        let req = pb::RangeRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(&req.key[..], b"foo");
        assert_eq!(&req.range_end[..], b"fop");
        assert_eq!(req.limit, 5);
        assert_eq!(req.sort_order, 2);
        assert_eq!(req.sort_target, 2);
        // Unknown fields are ignored at any depth.
        let txn = encode_body(
            "etcdserverpb.TxnRequest",
            br#"{"compare":[{"target":"VALUE","key":"Zm9v","x":1}],"success":[{"request_put":{"key":"Zm9v","y":{}}}],"z":[]}"#,
        )
        .unwrap();
        let txn = pb::TxnRequest::decode(txn.as_slice()).unwrap();
        assert_eq!(txn.compare.len(), 1);
        assert_eq!(txn.success.len(), 1);
        let empty = encode_body("etcdserverpb.RangeRequest", b"  ").unwrap();
        assert!(empty.is_empty());
        for bad in [
            &br#"{"key":"Zm9v""#[..],
            b"[]",
            br#"{"key":"!!"}"#,
            br#"{"count_only":"true"}"#,
        ] {
            let err = encode_body("etcdserverpb.RangeRequest", bad).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad:?}");
        }
        // An unknown enum name leaves the field at its default, as etcd
        // 3.6's gateway reads it.
        let unknown = encode_body(
            "etcdserverpb.RangeRequest",
            br#"{"key":"Zm9v","sort_order":"NOPE","sort_target":"MOD"}"#,
        )
        .unwrap();
        let unknown = pb::RangeRequest::decode(unknown.as_slice()).unwrap();
        assert_eq!((unknown.sort_order, unknown.sort_target), (0, 3));
    }

    #[test]
    fn error_bodies_as_etcd_writes_them() {
        let s = Status::invalid_argument("etcdserver: key is not provided");
        assert_eq!(
            error_body(&s),
            r#"{"code":3,"message":"etcdserver: key is not provided"}"#
        );
        assert_eq!(http_status(s.code()), 400);
        assert_eq!(http_status(tonic::Code::FailedPrecondition), 400);
        assert_eq!(
            stream_error_line(&Status::not_found("x")),
            "{\"error\":{\"code\":5,\"message\":\"x\"}}\n"
        );
    }
}
