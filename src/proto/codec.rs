//! The protobuf codec the generated services and clients use.
//!
//! It is tonic-prost's codec with two changes. A TxnRequest is decoded by
//! `super::nesting`: its depth is checked first, and it is decoded with
//! its own bound on nesting rather than prost's recursion limit, which
//! would stop at 50 nested txns where etcd accepts more. Before encoding a message it
//! reserves the message's exact encoded length in the output buffer. tonic's
//! buffer starts at 8 KiB and doubles as a message is written into it, so a
//! large Range response was copied again on every doubling, a sizeable share
//! of the server's CPU on the `range` workload (measured in BENCHMARKS.md).
//! Computing the length first costs one extra pass over the message's fields,
//! not over its bytes.

use super::etcdserverpb::TxnRequest;
use super::nesting::{decode_txn, txn_depth, TxnDecodeError, MAX_TXN_DEPTH};
use crate::error::{Error, INTERNAL_ENCODE_FAILED};
use bytes::Buf;
use prost::Message;
use std::any::{Any, TypeId};
use std::marker::PhantomData;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// A [`Codec`] for prost messages that sizes its encode buffer exactly.
#[derive(Debug, Clone)]
pub struct ExactCodec<T, U> {
    _messages: PhantomData<(T, U)>,
}

impl<T, U> Default for ExactCodec<T, U> {
    fn default() -> Self {
        ExactCodec {
            _messages: PhantomData,
        }
    }
}

impl<T, U> Codec for ExactCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ExactEncoder<T>;
    type Decoder = CheckedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ExactEncoder {
            _message: PhantomData,
        }
    }

    fn decoder(&mut self) -> Self::Decoder {
        CheckedDecoder {
            _message: PhantomData,
        }
    }
}

/// Decodes one prost message; a TxnRequest only after its nesting depth is
/// known to be within [`MAX_TXN_DEPTH`].
#[derive(Debug, Clone)]
pub struct CheckedDecoder<U> {
    _message: PhantomData<U>,
}

impl<U: Message + Default + 'static> Decoder for CheckedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        decode_request(buf).map(Some)
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// What [`CheckedDecoder`] does with one received message, on any buffer:
/// a TxnRequest is refused when it nests deeper than [`MAX_TXN_DEPTH`],
/// before it is decoded, and decoded by [`decode_txn`]; every other message
/// by prost. Public so the fuzz harness (`ephd-fuzz/`) decodes exactly as
/// the server does, without a gRPC stream around it.
pub fn decode_request<U: Message + Default + 'static>(mut buf: impl Buf) -> Result<U, Status> {
    if TypeId::of::<U>() != TypeId::of::<TxnRequest>() {
        return U::decode(buf).map_err(decode_error);
    }
    // One contiguous message: for tonic's buffer this takes it without
    // copying.
    let bytes = buf.copy_to_bytes(buf.remaining());
    let too_deep = || Status::invalid_argument(Error::TooManyOps.message());
    if txn_depth(&bytes, MAX_TXN_DEPTH).is_some_and(|d| d > MAX_TXN_DEPTH) {
        return Err(too_deep());
    }
    let txn = decode_txn(bytes).map_err(|e| match e {
        TxnDecodeError::Malformed(e) => decode_error(e),
        // Only when the scan above could not read the nesting (a group
        // field, which the decoder skips): the same answer, found later.
        TxnDecodeError::TooDeep => too_deep(),
    })?;
    let mut decoded = Some(txn);
    Ok((&mut decoded as &mut dyn Any)
        .downcast_mut::<Option<U>>()
        .and_then(Option::take)
        .expect("U is TxnRequest"))
}

/// The same answer as tonic-prost's decoder for malformed input.
fn decode_error(e: prost::DecodeError) -> Status {
    Status::internal(e.to_string())
}

/// Encodes one prost message after reserving its exact length.
#[derive(Debug, Clone)]
pub struct ExactEncoder<T> {
    _message: PhantomData<T>,
}

impl<T: Message> Encoder for ExactEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("{INTERNAL_ENCODE_FAILED}: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}
