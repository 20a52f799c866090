//! The protobuf codec the generated services and clients use.
//!
//! It is tonic-prost's codec with two changes. Before decoding a
//! TxnRequest it checks how deeply the txn nests (see [`super::nesting`]),
//! since prost's own recursion limit is off. Before encoding a message it
//! reserves the message's exact encoded length in the output buffer. tonic's
//! buffer starts at 8 KiB and doubles as a message is written into it, so a
//! large Range response was copied again on every doubling, a sizeable share
//! of the server's CPU on the `range` workload (measured in BENCHMARKS.md).
//! Computing the length first costs one extra pass over the message's fields,
//! not over its bytes.

use super::etcdserverpb::TxnRequest;
use super::nesting::{txn_depth, MAX_TXN_DEPTH};
use crate::error::{Error, INTERNAL_ENCODE_FAILED};
use bytes::Buf;
use prost::Message;
use std::any::TypeId;
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
/// a TxnRequest is decoded only after its nesting depth is known to be
/// within [`MAX_TXN_DEPTH`]. Public so the fuzz harness (`ephd-fuzz/`)
/// decodes exactly as the server does, without a gRPC stream around it.
pub fn decode_request<U: Message + Default + 'static>(mut buf: impl Buf) -> Result<U, Status> {
    if TypeId::of::<U>() != TypeId::of::<TxnRequest>() {
        return U::decode(buf).map_err(decode_error);
    }
    // The scan needs the message in one slice: usually it is, and is
    // scanned in place; otherwise it is gathered first.
    let gathered =
        (buf.chunk().len() != buf.remaining()).then(|| buf.copy_to_bytes(buf.remaining()));
    let bytes = gathered.as_deref().unwrap_or_else(|| buf.chunk());
    if txn_depth(bytes, MAX_TXN_DEPTH).is_some_and(|d| d > MAX_TXN_DEPTH) {
        return Err(Status::invalid_argument(Error::TooManyOps.message()));
    }
    let decoded = match gathered {
        Some(bytes) => U::decode(bytes),
        None => U::decode(buf),
    };
    decoded.map_err(decode_error)
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
