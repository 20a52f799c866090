//! Reading a Range reply as it streams in, without keeping it.
//!
//! A storm has hundreds of 10 MB replies in flight at once. Decoding each
//! into a `RangeResponse` would make this client hold them all (1,000 lists
//! of 10 MB is 10 GB, on a machine whose memory the server under test is
//! meant to be the one filling), and prost would build 10,000 `KeyValue`s
//! per list on the cores the server needs. What the storm checks is only
//! how many keys each list returned, so [`RangeCounter`] walks the gRPC
//! frame and the top level of the protobuf message chunk by chunk,
//! counting the `kvs` entries and skipping their bytes. The client's memory
//! then stays at its HTTP/2 windows, whatever the storm's size.

use http::HeaderMap;
use tonic::{Code, Status};

/// `RangeResponse.kvs` (`repeated mvccpb.KeyValue kvs = 2`).
const KVS_FIELD: u64 = 2;
/// `RangeResponse.more` (`bool more = 3`).
const MORE_FIELD: u64 = 3;
/// `RangeResponse.count` (`int64 count = 4`).
const COUNT_FIELD: u64 = 4;

/// What a varint being read will mean once complete.
#[derive(Debug, Clone, Copy)]
enum Varint {
    /// A field tag (field number and wire type).
    Tag,
    /// The length of a length-delimited field.
    Len(u64),
    /// The value of a varint field.
    Value(u64),
}

/// Where the counter is in the reply.
#[derive(Debug, Clone, Copy)]
enum State {
    /// Reading the 5-byte gRPC message prefix.
    Prefix,
    /// Reading a varint: what it is for, its value so far, the next shift.
    Varint(Varint, u64, u32),
    /// Skipping this many bytes of a field's payload.
    Skip(u64),
    /// The message is complete; anything after it is ignored, as gRPC
    /// clients ignore extra messages on a unary call.
    Done,
}

/// Counts the keys of one streamed `RangeResponse` (see the module docs).
#[derive(Debug)]
pub struct RangeCounter {
    state: State,
    prefix: [u8; 5],
    prefix_got: usize,
    /// Bytes of the message body still to come (after the prefix).
    left: u64,
    /// `kvs` entries seen.
    pub kvs: u64,
    /// The reply's `count` field (0 if absent).
    pub count: i64,
    /// The reply's `more` field.
    pub more: bool,
    /// Bytes received, prefix included.
    pub bytes: u64,
}

impl Default for RangeCounter {
    fn default() -> Self {
        RangeCounter {
            state: State::Prefix,
            prefix: [0; 5],
            prefix_got: 0,
            left: 0,
            kvs: 0,
            count: 0,
            more: false,
            bytes: 0,
        }
    }
}

impl RangeCounter {
    /// Takes the next chunk of the reply body. An error means the reply is
    /// malformed; the list has failed.
    pub fn feed(&mut self, mut data: &[u8]) -> Result<(), String> {
        self.bytes += data.len() as u64;
        while !data.is_empty() {
            match self.state {
                State::Done => return Ok(()),
                State::Prefix => {
                    let n = (5 - self.prefix_got).min(data.len());
                    self.prefix[self.prefix_got..self.prefix_got + n].copy_from_slice(&data[..n]);
                    self.prefix_got += n;
                    data = &data[n..];
                    if self.prefix_got == 5 {
                        if self.prefix[0] != 0 {
                            return Err(format!(
                                "reply with compression flag {} (none was asked for)",
                                self.prefix[0]
                            ));
                        }
                        let p = self.prefix;
                        self.left = u32::from_be_bytes([p[1], p[2], p[3], p[4]]) as u64;
                        self.next_field();
                    }
                }
                State::Skip(n) => {
                    let k = n.min(data.len() as u64);
                    data = &data[k as usize..];
                    // Skips never run past the message: checked when set.
                    self.left -= k;
                    if k == n {
                        self.next_field();
                    } else {
                        self.state = State::Skip(n - k);
                    }
                }
                State::Varint(what, value, shift) => {
                    let b = data[0];
                    data = &data[1..];
                    // A varint is only started with body bytes left.
                    self.left -= 1;
                    if shift >= 64 {
                        return Err("varint longer than 10 bytes".into());
                    }
                    let value = value | (u64::from(b & 0x7f) << shift);
                    if b & 0x80 != 0 {
                        if self.left == 0 {
                            return Err("message ends inside a varint".into());
                        }
                        self.state = State::Varint(what, value, shift + 7);
                    } else {
                        self.on_varint(what, value)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The next field, or the end of the message.
    fn next_field(&mut self) {
        self.state = if self.left == 0 {
            State::Done
        } else {
            State::Varint(Varint::Tag, 0, 0)
        };
    }

    /// Starts skipping `n` payload bytes (0 goes straight to the next field).
    fn skip(&mut self, n: u64) -> Result<(), String> {
        if n > self.left {
            return Err(format!(
                "a field of {n} bytes overruns the message ({} left)",
                self.left
            ));
        }
        if n == 0 {
            self.next_field();
        } else {
            self.state = State::Skip(n);
        }
        Ok(())
    }

    fn on_varint(&mut self, what: Varint, value: u64) -> Result<(), String> {
        match what {
            Varint::Tag => {
                if self.left == 0 {
                    return Err("message ends after a field tag".into());
                }
                let field = value >> 3;
                match value & 7 {
                    0 => self.state = State::Varint(Varint::Value(field), 0, 0),
                    1 => self.skip(8)?,
                    2 => self.state = State::Varint(Varint::Len(field), 0, 0),
                    5 => self.skip(4)?,
                    w => return Err(format!("field {field} has wire type {w}")),
                }
            }
            Varint::Len(field) => {
                if field == KVS_FIELD {
                    self.kvs += 1;
                }
                self.skip(value)?;
            }
            Varint::Value(field) => {
                match field {
                    MORE_FIELD => self.more = value != 0,
                    COUNT_FIELD => self.count = value as i64,
                    _ => {}
                }
                self.next_field();
            }
        }
        Ok(())
    }

    /// The reply's end: the message must be complete.
    pub fn finish(&self) -> Result<(), String> {
        match self.state {
            State::Done => Ok(()),
            State::Prefix if self.prefix_got == 0 => Err("reply without a message".into()),
            _ => Err(format!(
                "reply cut short: {} bytes received, {} of the message missing",
                self.bytes, self.left
            )),
        }
    }
}

/// The outcome a `grpc-status` header gives (None without one); the code
/// and the percent-decoded message are read by tonic, as the lean client
/// does.
pub fn grpc_status(headers: &HeaderMap) -> Option<Result<(), Status>> {
    let status = Status::from_header_map(headers)?;
    Some(if status.code() == Code::Ok {
        Ok(())
    } else {
        Err(status)
    })
}

/// An h2 error as a status, and whether it took the connection down
/// (then the connection must be opened again before a retry). A lost
/// connection is `Unavailable`, as gRPC clients report it; a stream reset
/// is mapped by tonic from its reason (REFUSED_STREAM is `Unavailable`,
/// ENHANCE_YOUR_CALM `ResourceExhausted`, ...).
pub fn h2_status(err: h2::Error) -> (Status, bool) {
    if err.is_io() || err.is_go_away() {
        return (
            Status::unavailable(format!("connection error: {err}")),
            true,
        );
    }
    (Status::from_error(Box::new(err)), false)
}
