//! How deeply a TxnRequest nests, read from its encoded bytes without
//! decoding it, and a decoder for TxnRequests that bounds that depth.
//!
//! prost's decoder stops at 100 nested messages, which is 50 nested txns
//! (each level is a `RequestOp` holding a `TxnRequest`), and answers INTERNAL
//! "failed to decode Protobuf message". etcd decodes any depth and bounds
//! nesting through `--max-txn-ops` instead: a nested txn may use only what
//! its parents left of the op budget, so with the default 128 a txn nests at
//! most 129 deep and deeper ones get "too many operations in txn request"
//! (the store's validation does the same). ephd refuses, with that same
//! error, any txn nested deeper than [`MAX_TXN_DEPTH`] before decoding it
//! ([`txn_depth`]: iterative, skips every payload, one pass over the
//! request's structure), then decodes it with [`decode_txn`], which walks
//! the txn and op levels itself and leaves every other message to prost.
//!
//! prost's recursion limit stays on for everything else. It is not only
//! about txns: a group field (wire type 3, which etcd's protos never use
//! but any message may carry as an unknown field) is skipped by recursion,
//! one level per byte, so without the limit a request of a few hundred
//! kilobytes of nested groups overflowed a worker's stack and aborted the
//! server (found while writing the fuzz harness; the inputs are in
//! `fuzz/regressions/decode_requests/`).

use super::etcdserverpb::{
    request_op::Request, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use bytes::{Buf, Bytes};
use prost::encoding::{decode_key, message, skip_field, DecodeContext, WireType};
use prost::{DecodeError, Message};

/// The deepest txn nesting ephd decodes (a txn without nested txns has
/// depth 1): twice what etcd's default `--max-txn-ops` allows. Only a
/// `--max-txn-ops` above 255 would let etcd accept deeper txns.
pub const MAX_TXN_DEPTH: usize = 256;

/// Why [`decode_txn`] refused a message.
#[derive(Debug)]
pub enum TxnDecodeError {
    /// Not a well-formed TxnRequest: prost's own error, with the field path
    /// prost would report.
    Malformed(DecodeError),
    /// Txns nested deeper than [`MAX_TXN_DEPTH`].
    TooDeep,
}

impl From<DecodeError> for TxnDecodeError {
    fn from(e: DecodeError) -> Self {
        TxnDecodeError::Malformed(e)
    }
}

impl TxnDecodeError {
    /// Records the field the error happened in, as prost's messages do.
    fn at(mut self, message: &'static str, field: &'static str) -> Self {
        if let TxnDecodeError::Malformed(e) = &mut self {
            e.push(message, field);
        }
        self
    }
}

/// Decodes a TxnRequest as prost's generated code does (fields merged the
/// same way, unknown fields skipped), except that the txn and op levels are
/// walked here with their depth counted against [`MAX_TXN_DEPTH`] instead
/// of prost's recursion limit. Every other message in it (compares, ranges,
/// puts, deletes) is decoded by prost, each with a fresh recursion limit,
/// so the stack used is bounded: by `MAX_TXN_DEPTH` levels here, and by
/// prost's limit below each.
pub fn decode_txn(mut buf: Bytes) -> Result<TxnRequest, TxnDecodeError> {
    let mut txn = TxnRequest::default();
    merge_txn(&mut txn, &mut buf, 1)?;
    Ok(txn)
}

/// The payload of a length-delimited field, without copying it.
fn payload(wire_type: WireType, buf: &mut Bytes) -> Result<Bytes, DecodeError> {
    let mut out = Bytes::new();
    prost::encoding::bytes::merge(wire_type, &mut out, buf, DecodeContext::default())?;
    Ok(out)
}

fn merge_txn(txn: &mut TxnRequest, buf: &mut Bytes, depth: usize) -> Result<(), TxnDecodeError> {
    if depth > MAX_TXN_DEPTH {
        return Err(TxnDecodeError::TooDeep);
    }
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(buf)?;
        let at = |field| move |e: TxnDecodeError| e.at("TxnRequest", field);
        match tag {
            1 => message::merge_repeated(wire_type, &mut txn.compare, buf, Default::default())
                .map_err(TxnDecodeError::from)
                .map_err(at("compare"))?,
            2 | 3 => {
                let field = if tag == 2 { "success" } else { "failure" };
                let mut op = RequestOp::default();
                let mut body = payload(wire_type, buf).map_err(|e| at(field)(e.into()))?;
                merge_op(&mut op, &mut body, depth).map_err(at(field))?;
                if tag == 2 {
                    &mut txn.success
                } else {
                    &mut txn.failure
                }
                .push(op);
            }
            _ => skip_field(wire_type, tag, buf, DecodeContext::default())?,
        }
    }
    Ok(())
}

/// Merges `buf` into a message of the `request` oneof as prost does: into
/// the value already there when it is of the same kind, else into a new one.
fn merge_leaf<M: Message + Default>(
    wire_type: WireType,
    current: Option<&mut M>,
    buf: &mut Bytes,
) -> Result<Option<M>, DecodeError> {
    match current {
        Some(m) => message::merge(wire_type, m, buf, DecodeContext::default()).map(|()| None),
        None => {
            let mut m = M::default();
            message::merge(wire_type, &mut m, buf, DecodeContext::default())?;
            Ok(Some(m))
        }
    }
}

fn merge_op(op: &mut RequestOp, buf: &mut Bytes, depth: usize) -> Result<(), TxnDecodeError> {
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(buf)?;
        let at = |e: TxnDecodeError| e.at("RequestOp", "request");
        let slot = &mut op.request;
        let replaced = match tag {
            1 => {
                let current = match slot {
                    Some(Request::RequestRange(m)) => Some(m),
                    _ => None,
                };
                merge_leaf::<RangeRequest>(wire_type, current, buf)
                    .map(|m| m.map(Request::RequestRange))
            }
            2 => {
                let current = match slot {
                    Some(Request::RequestPut(m)) => Some(m),
                    _ => None,
                };
                merge_leaf::<PutRequest>(wire_type, current, buf)
                    .map(|m| m.map(Request::RequestPut))
            }
            3 => {
                let current = match slot {
                    Some(Request::RequestDeleteRange(m)) => Some(m),
                    _ => None,
                };
                merge_leaf::<DeleteRangeRequest>(wire_type, current, buf)
                    .map(|m| m.map(Request::RequestDeleteRange))
            }
            4 => {
                let mut body = payload(wire_type, buf).map_err(|e| at(e.into()))?;
                let mut txn = match slot.take() {
                    Some(Request::RequestTxn(t)) => t,
                    _ => TxnRequest::default(),
                };
                merge_txn(&mut txn, &mut body, depth + 1).map_err(at)?;
                Ok(Some(Request::RequestTxn(txn)))
            }
            _ => {
                skip_field(wire_type, tag, buf, DecodeContext::default())?;
                Ok(None)
            }
        };
        if let Some(new) = replaced.map_err(|e| at(e.into()))? {
            *slot = Some(new);
        }
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Txn,
    Op,
}

/// The nesting depth of the encoded TxnRequest in `bytes`, stopping early
/// once it is known to exceed `limit`. `None` when the bytes are not
/// well-formed protobuf; the decoder then reports the error.
pub fn txn_depth(bytes: &[u8], limit: usize) -> Option<usize> {
    // Each frame: where its message ends, and what it is.
    let mut stack = vec![(bytes.len(), Kind::Txn)];
    let mut txns = 1;
    let mut deepest = 1;
    let mut pos = 0;
    while let Some(&(end, kind)) = stack.last() {
        if pos == end {
            stack.pop();
            if kind == Kind::Txn {
                txns -= 1;
            }
            continue;
        }
        let key = varint(bytes, &mut pos, end)?;
        let (field, wire_type) = (key >> 3, key & 7);
        match wire_type {
            0 => {
                varint(bytes, &mut pos, end)?;
            }
            1 => pos = skip(pos, 8, end)?,
            5 => pos = skip(pos, 4, end)?,
            2 => {
                let len = usize::try_from(varint(bytes, &mut pos, end)?).ok()?;
                let sub_end = skip(pos, len, end)?;
                // TxnRequest.success = 2, .failure = 3 hold RequestOps;
                // RequestOp.request_txn = 4 holds a TxnRequest.
                match (kind, field) {
                    (Kind::Txn, 2 | 3) => stack.push((sub_end, Kind::Op)),
                    (Kind::Op, 4) => {
                        stack.push((sub_end, Kind::Txn));
                        txns += 1;
                        deepest = deepest.max(txns);
                        if deepest > limit {
                            return Some(deepest);
                        }
                    }
                    _ => pos = sub_end,
                }
            }
            _ => return None,
        }
    }
    Some(deepest)
}

fn skip(pos: usize, len: usize, end: usize) -> Option<usize> {
    pos.checked_add(len).filter(|p| *p <= end)
}

fn varint(bytes: &[u8], pos: &mut usize, end: usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        if *pos >= end {
            return None;
        }
        let b = bytes[*pos];
        *pos += 1;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb::{
        request_op::Request, Compare, PutRequest, RequestOp, TxnRequest,
    };
    use prost::Message;

    fn nested(depth: usize) -> TxnRequest {
        let mut txn = TxnRequest {
            compare: vec![Compare {
                key: b"k".to_vec().into(),
                ..Default::default()
            }],
            success: vec![RequestOp {
                request: Some(Request::RequestPut(PutRequest {
                    key: b"k".to_vec().into(),
                    value: vec![0xff; 300].into(),
                    lease: 7,
                    ..Default::default()
                })),
            }],
            failure: vec![],
        };
        for i in 1..depth {
            let op = RequestOp {
                request: Some(Request::RequestTxn(txn)),
            };
            txn = if i % 2 == 0 {
                TxnRequest {
                    success: vec![op],
                    ..Default::default()
                }
            } else {
                TxnRequest {
                    failure: vec![op],
                    ..Default::default()
                }
            };
        }
        txn
    }

    /// The encoding of `nested(depth)` built by hand, without recursion, so
    /// that depths a recursive encoder could not reach can be tested.
    fn nested_bytes(depth: usize) -> Vec<u8> {
        let mut txn = nested(1).encode_to_vec();
        for i in 1..depth {
            let mut op = vec![0x22]; // RequestOp.request_txn
            prost::encoding::encode_varint(txn.len() as u64, &mut op);
            op.extend_from_slice(&txn);
            txn = vec![if i % 2 == 0 { 0x12 } else { 0x1a }]; // success / failure
            prost::encoding::encode_varint(op.len() as u64, &mut txn);
            txn.extend_from_slice(&op);
        }
        txn
    }

    #[test]
    fn counts_nesting_through_both_branches() {
        for depth in [1, 2, 3, 50] {
            let bytes = nested(depth).encode_to_vec();
            assert_eq!(
                bytes,
                nested_bytes(depth),
                "the hand-built encoding is prost's"
            );
            assert_eq!(
                txn_depth(&bytes, MAX_TXN_DEPTH),
                Some(depth),
                "depth {depth}"
            );
        }
        for depth in [100, MAX_TXN_DEPTH] {
            assert_eq!(txn_depth(&nested_bytes(depth), MAX_TXN_DEPTH), Some(depth));
        }
        assert_eq!(txn_depth(&nested_bytes(999), usize::MAX), Some(999));
    }

    #[test]
    fn stops_early_past_the_limit() {
        let bytes = nested_bytes(5_000);
        assert_eq!(txn_depth(&bytes, MAX_TXN_DEPTH), Some(MAX_TXN_DEPTH + 1));
    }

    #[test]
    fn malformed_bytes_are_left_to_the_decoder() {
        let bytes = nested(3).encode_to_vec();
        for cut in 1..bytes.len() {
            // Never panics; a cut message is either malformed or shallower.
            if let Some(d) = txn_depth(&bytes[..cut], MAX_TXN_DEPTH) {
                assert!(d <= 3);
            }
        }
        assert_eq!(txn_depth(&[0x0b], 10), None, "group wire type");
        assert_eq!(
            txn_depth(&[0x12, 0x05, 0x01], 10),
            None,
            "length past the end"
        );
        assert_eq!(
            txn_depth(&[0x08, 0xff, 0xff], 10),
            None,
            "unterminated varint"
        );
        assert_eq!(txn_depth(&[], 10), Some(1), "an empty txn");
    }

    fn decode(bytes: &[u8]) -> Result<TxnRequest, TxnDecodeError> {
        decode_txn(Bytes::copy_from_slice(bytes))
    }

    #[test]
    fn decodes_what_prost_decodes() {
        // Both branches, compares, every op kind, unknown fields, a oneof
        // set twice (merged, then replaced) and a repeated field: all as
        // prost's generated decoder reads them, up to the depth prost takes.
        let mut txn = nested(40);
        txn.failure.push(RequestOp {
            request: Some(Request::RequestRange(RangeRequest {
                key: b"r".to_vec().into(),
                limit: 3,
                ..Default::default()
            })),
        });
        let mut bytes = txn.encode_to_vec();
        bytes.extend_from_slice(&[0x78, 0x05]); // unknown field 15, varint
        let op = |r: Request| RequestOp { request: Some(r) }.encode_to_vec();
        let put = |k: &[u8]| {
            Request::RequestPut(PutRequest {
                key: k.to_vec().into(),
                ..Default::default()
            })
        };
        let mut twice = op(put(b"a"));
        twice.extend(op(Request::RequestDeleteRange(DeleteRangeRequest {
            key: b"d".to_vec().into(),
            ..Default::default()
        })));
        twice.extend(op(put(b"b")));
        bytes.push(0x12);
        prost::encoding::encode_varint(twice.len() as u64, &mut bytes);
        bytes.extend(twice);
        let theirs = TxnRequest::decode(bytes.as_slice()).expect("prost decodes it");
        assert_eq!(decode(&bytes).expect("decodes"), theirs);
        for cut in 0..bytes.len() {
            let ours = decode(&bytes[..cut]).map_err(|e| match e {
                TxnDecodeError::Malformed(e) => e.to_string(),
                TxnDecodeError::TooDeep => "too deep".to_string(),
            });
            let theirs = TxnRequest::decode(&bytes[..cut]).map_err(|e| e.to_string());
            assert_eq!(
                ours.is_ok(),
                theirs.is_ok(),
                "cut at {cut}: {ours:?} {theirs:?}"
            );
            if let (Ok(ours), Ok(theirs)) = (ours, theirs) {
                assert_eq!(ours, theirs, "cut at {cut}");
            }
        }
    }

    #[test]
    fn decodes_up_to_the_bound_and_no_deeper() {
        let txn = decode(&nested_bytes(MAX_TXN_DEPTH)).expect("the deepest txn decodes");
        let mut depth = 1;
        let mut t = &txn;
        while let Some(inner) =
            t.success
                .iter()
                .chain(&t.failure)
                .find_map(|op| match &op.request {
                    Some(Request::RequestTxn(inner)) => Some(inner),
                    _ => None,
                })
        {
            depth += 1;
            t = inner;
        }
        assert_eq!(depth, MAX_TXN_DEPTH);
        assert!(matches!(
            decode(&nested_bytes(MAX_TXN_DEPTH + 1)),
            Err(TxnDecodeError::TooDeep)
        ));
    }

    #[test]
    fn nested_groups_are_refused_not_recursed_into() {
        // Field 15 as a group, 100 000 deep: prost's recursion limit
        // refuses it, in a txn and in any other message.
        let groups = vec![0x7b; 100_000];
        assert!(matches!(decode(&groups), Err(TxnDecodeError::Malformed(_))));
        let mut in_op = vec![0x12, 0x90, 0x4e]; // success, 10 000 bytes
        in_op.extend(vec![0x7b; 10_000]);
        assert!(matches!(decode(&in_op), Err(TxnDecodeError::Malformed(_))));
        assert!(RangeRequest::decode(groups.as_slice()).is_err());
    }
}
