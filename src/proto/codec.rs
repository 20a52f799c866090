//! The protobuf codec the generated services and clients use.
//!
//! It is tonic-prost's codec with one change: before encoding a message it
//! reserves the message's exact encoded length in the output buffer. tonic's
//! buffer starts at 8 KiB and doubles as a message is written into it, so a
//! large Range response was copied again on every doubling, a sizeable share
//! of the server's CPU on the `range` workload (measured in BENCHMARKS.md).
//! Computing the length first costs one extra pass over the message's fields,
//! not over its bytes.

use crate::error::INTERNAL_ENCODE_FAILED;
use prost::Message;
use std::marker::PhantomData;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
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
    type Decoder = tonic_prost::ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ExactEncoder {
            _message: PhantomData,
        }
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstCodec::<T, U>::raw_decoder(BufferSettings::default())
    }
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
