//! How deeply a TxnRequest nests, read from its encoded bytes without
//! decoding it.
//!
//! prost's decoder stops at 100 nested messages, which is 50 nested txns
//! (each level is a `RequestOp` holding a `TxnRequest`), and answers INTERNAL
//! "failed to decode Protobuf message". etcd decodes any depth and bounds
//! nesting through `--max-txn-ops` instead: a nested txn may use only what
//! its parents left of the op budget, so with the default 128 a txn nests at
//! most 129 deep and deeper ones get "too many operations in txn request"
//! (the store's validation does the same). ephd turns prost's limit off and
//! refuses, with that same error, any txn nested deeper than
//! [`MAX_TXN_DEPTH`] before decoding it: the decoder and the store handle
//! txns recursively, and an unbounded depth could exhaust a worker's stack.
//! This scan is iterative and skips every payload, so it costs one pass
//! over the request's structure.

/// The deepest txn nesting ephd decodes (a txn without nested txns has
/// depth 1): twice what etcd's default `--max-txn-ops` allows. Only a
/// `--max-txn-ops` above 255 would let etcd accept deeper txns.
pub const MAX_TXN_DEPTH: usize = 256;

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
}
