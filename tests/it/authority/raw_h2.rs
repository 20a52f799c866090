//! A hand-written HTTP/2 client for one request per connection, small enough
//! to read in one sitting (RFC 9113 framing, RFC 7541 HPACK).
//!
//! It exists because no HTTP/2 client library lets a test put an arbitrary
//! string (a URL, `[::1`, nothing at all) in `:authority`: they build the
//! header block from a parsed URI. Here every request field goes on the wire
//! exactly as given, as an HPACK "literal without indexing, new name" with
//! raw (not Huffman-coded) strings, in the order given.
//!
//! Reading the answer needs a little more, because the server's HPACK encoder
//! (h2's) Huffman-codes every string and indexes fields: the decoder below
//! handles every field representation, the static table, a dynamic table
//! (one exchange stays far below the default 4096 bytes, so it never
//! evicts), and Huffman decoding rebuilt from the code lengths alone (the
//! HPACK code is canonical). Flow control needs nothing: a unary gRPC call
//! is far below the initial 64 KiB windows. Anything else the server could
//! send but does not (CONTINUATION, padding) fails loudly.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Every read of the exchange gives up after this long (a hung server).
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What a client sends first on a connection (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// Frame types (RFC 9113 §6).
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;

// Frame flags.
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// The one stream this client opens on each connection.
const STREAM: u32 = 1;

/// The HTTP/2 error code of a malformed request (RFC 9113 §7).
pub const PROTOCOL_ERROR: u32 = 0x1;

/// A decoded header field: name, value.
pub type Field = (String, String);

/// How the server ended the exchange.
#[derive(Debug)]
pub enum Outcome {
    /// The stream ended normally. `trailers` is the last header block; in a
    /// gRPC "trailers-only" answer it is the same block as `headers`.
    Answered {
        headers: Vec<Field>,
        body: Vec<u8>,
        trailers: Vec<Field>,
    },
    /// The server reset the stream (RST_STREAM) with this error code.
    Reset(u32),
    /// The server closed the connection (GOAWAY) with this error code.
    GoAway(u32),
}

/// Opens a connection to `addr`, sends the preface, an empty SETTINGS, one
/// HEADERS frame holding `fields` and one DATA frame holding `body` with
/// END_STREAM, then reads until stream 1 ends, is reset, or the connection
/// is closed with GOAWAY.
pub fn exchange(addr: SocketAddr, fields: &[(&str, &str)], body: &[u8]) -> Outcome {
    let mut conn = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    conn.set_read_timeout(Some(READ_TIMEOUT))
        .expect("set read timeout");
    let mut block = Vec::new();
    for (name, value) in fields {
        // 0000 0000: literal without indexing, new name (RFC 7541 §6.2.2).
        block.push(0x00);
        push_raw_string(&mut block, name);
        push_raw_string(&mut block, value);
    }
    let mut out = PREFACE.to_vec();
    push_frame(&mut out, SETTINGS, 0, 0, &[]);
    push_frame(&mut out, HEADERS, END_HEADERS, STREAM, &block);
    push_frame(&mut out, DATA, END_STREAM, STREAM, body);
    conn.write_all(&out).expect("send request");
    read_outcome(&mut conn)
}

/// Reads frames until stream 1 is over, answering SETTINGS and PING as a
/// peer must and decoding every header block in order (HPACK state is per
/// connection, so blocks of other streams would have to be decoded too;
/// this client opens no other stream).
fn read_outcome(conn: &mut TcpStream) -> Outcome {
    let mut hpack = Decoder::default();
    let mut blocks: Vec<Vec<Field>> = Vec::new();
    let mut body = Vec::new();
    loop {
        let (kind, flags, stream, payload) = read_frame(conn);
        match kind {
            SETTINGS if flags & ACK == 0 => write_frame(conn, SETTINGS, ACK, 0, &[]),
            PING if flags & ACK == 0 => write_frame(conn, PING, ACK, 0, &payload),
            GOAWAY => return Outcome::GoAway(be32(&payload[4..8])),
            RST_STREAM if stream == STREAM => return Outcome::Reset(be32(&payload[..4])),
            HEADERS if stream == STREAM => {
                assert_ne!(flags & END_HEADERS, 0, "CONTINUATION is not supported");
                assert_eq!(flags & (PADDED | PRIORITY), 0, "padding is not supported");
                blocks.push(hpack.decode_block(&payload));
                if flags & END_STREAM != 0 {
                    let trailers = blocks.last().cloned().unwrap_or_default();
                    return Outcome::Answered {
                        headers: blocks.swap_remove(0),
                        body,
                        trailers,
                    };
                }
            }
            DATA if stream == STREAM => {
                assert_eq!(flags & PADDED, 0, "padding is not supported");
                body.extend_from_slice(&payload);
                assert_eq!(flags & END_STREAM, 0, "stream ended without trailers");
            }
            // WINDOW_UPDATE, acknowledgements, PRIORITY: nothing to do.
            _ => {}
        }
    }
}

/// Appends a frame: 24-bit length, type, flags, 31-bit stream id, payload.
fn push_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

fn write_frame(conn: &mut TcpStream, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let mut out = Vec::new();
    push_frame(&mut out, kind, flags, stream, payload);
    conn.write_all(&out).expect("write frame");
}

/// Reads one frame: (type, flags, stream id, payload).
fn read_frame(conn: &mut TcpStream) -> (u8, u8, u32, Vec<u8>) {
    let mut head = [0u8; 9];
    conn.read_exact(&mut head)
        .expect("read frame header (connection closed before the stream ended?)");
    let len = be32(&[0, head[0], head[1], head[2]]) as usize;
    let stream = be32(&head[5..9]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    conn.read_exact(&mut payload).expect("read frame payload");
    (head[3], head[4], stream, payload)
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b.try_into().expect("4 bytes"))
}

/// An HPACK integer with an `prefix`-bit prefix whose other bits are
/// `high` (RFC 7541 §5.1).
fn push_int(out: &mut Vec<u8>, mut value: usize, prefix: u32, high: u8) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(high | value as u8);
        return;
    }
    out.push(high | max as u8);
    value -= max;
    while value >= 0x80 {
        out.push(0x80 | (value & 0x7f) as u8);
        value >>= 7;
    }
    out.push(value as u8);
}

/// An HPACK string literal, not Huffman-coded (RFC 7541 §5.2).
fn push_raw_string(out: &mut Vec<u8>, s: &str) {
    push_int(out, s.len(), 7, 0x00);
    out.extend_from_slice(s.as_bytes());
}

/// Names of the HPACK static table, indices 1..=61 (RFC 7541 Appendix A);
/// the few entries with a value are in `static_value`.
const STATIC_NAMES: [&str; 61] = [
    ":authority",
    ":method",
    ":method",
    ":path",
    ":path",
    ":scheme",
    ":scheme",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "accept",
    "access-control-allow-origin",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "content-disposition",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-range",
    "content-type",
    "cookie",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "link",
    "location",
    "max-forwards",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "refresh",
    "retry-after",
    "server",
    "set-cookie",
    "strict-transport-security",
    "transfer-encoding",
    "user-agent",
    "vary",
    "via",
    "www-authenticate",
];

fn static_value(index: usize) -> &'static str {
    match index {
        2 => "GET",
        3 => "POST",
        4 => "/",
        5 => "/index.html",
        6 => "http",
        7 => "https",
        8 => "200",
        9 => "204",
        10 => "206",
        11 => "304",
        12 => "400",
        13 => "404",
        14 => "500",
        16 => "gzip, deflate",
        _ => "",
    }
}

/// Huffman code length in bits of each byte value (RFC 7541 Appendix B).
/// The code is canonical, so the codes follow from the lengths.
const HUFFMAN_LENGTHS: [u8; 256] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
];

/// Decodes a canonical Huffman string bit by bit: among codes of one
/// length, the smallest is `first` and the `count` codes are consecutive,
/// assigned to the symbols in byte order.
fn huffman_decode(src: &[u8]) -> Vec<u8> {
    let mut counts = [0u32; 31];
    let mut symbols: Vec<u8> = Vec::with_capacity(256);
    for len in 1..=30u8 {
        for (byte, &l) in HUFFMAN_LENGTHS.iter().enumerate() {
            if l == len {
                counts[len as usize] += 1;
                symbols.push(byte as u8);
            }
        }
    }
    let mut out = Vec::new();
    let (mut code, mut first, mut index, mut len) = (0u32, 0u32, 0usize, 0usize);
    let mut all_ones = true;
    for bit in src
        .iter()
        .flat_map(|b| (0..8).rev().map(move |i| (b >> i) & 1))
    {
        code |= u32::from(bit);
        all_ones &= bit == 1;
        len += 1;
        assert!(len <= 30, "invalid Huffman code");
        let count = counts[len];
        if code < first + count {
            out.push(symbols[index + (code - first) as usize]);
            (code, first, index, len, all_ones) = (0, 0, 0, 0, true);
        } else {
            index += count as usize;
            first = (first + count) << 1;
            code <<= 1;
        }
    }
    // What is left must be padding: under 8 bits, all ones (§5.2).
    assert!(len < 8 && all_ones, "invalid Huffman padding");
    out
}

/// HPACK decoding state of one connection: the dynamic table, newest first.
#[derive(Default)]
struct Decoder {
    dynamic: Vec<Field>,
}

impl Decoder {
    /// Decodes one complete header block (RFC 7541 §6).
    fn decode_block(&mut self, mut src: &[u8]) -> Vec<Field> {
        let mut fields = Vec::new();
        while let Some(&first) = src.first() {
            if first & 0x80 != 0 {
                // 1xxxxxxx: indexed field.
                let index = read_int(&mut src, 7);
                fields.push(self.entry(index));
            } else if first & 0xe0 == 0x20 {
                // 001xxxxx: dynamic table size update; nothing to evict here.
                read_int(&mut src, 5);
            } else {
                // 01xxxxxx: literal with incremental indexing; 0000xxxx and
                // 0001xxxx: literal without / never indexed.
                let indexing = first & 0x40 != 0;
                let index = read_int(&mut src, if indexing { 6 } else { 4 });
                let name = match index {
                    0 => read_string(&mut src),
                    _ => self.entry(index).0,
                };
                let field = (name, read_string(&mut src));
                if indexing {
                    self.dynamic.insert(0, field.clone());
                    let size: usize = self
                        .dynamic
                        .iter()
                        .map(|(n, v)| 32 + n.len() + v.len())
                        .sum();
                    assert!(size <= 4096, "dynamic table eviction is not supported");
                }
                fields.push(field);
            }
        }
        fields
    }

    /// Static entries are 1..=61, dynamic ones follow (§2.3.3).
    fn entry(&self, index: usize) -> Field {
        match index {
            1..=61 => (STATIC_NAMES[index - 1].into(), static_value(index).into()),
            _ => self
                .dynamic
                .get(index - 62)
                .cloned()
                .unwrap_or_else(|| panic!("HPACK index {index} out of range")),
        }
    }
}

/// Reads an HPACK integer with a `prefix`-bit prefix (§5.1).
fn read_int(src: &mut &[u8], prefix: u32) -> usize {
    let max = (1usize << prefix) - 1;
    let mut value = usize::from(take(src)) & max;
    if value == max {
        let mut shift = 0;
        loop {
            let b = take(src);
            value += usize::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
    }
    value
}

/// Reads an HPACK string literal, Huffman-coded or raw (§5.2).
fn read_string(src: &mut &[u8]) -> String {
    let huffman = src.first().is_some_and(|b| b & 0x80 != 0);
    let len = read_int(src, 7);
    let all = *src;
    assert!(len <= all.len(), "HPACK string runs past the block");
    let (raw, rest) = all.split_at(len);
    *src = rest;
    let bytes = if huffman {
        huffman_decode(raw)
    } else {
        raw.to_vec()
    };
    String::from_utf8(bytes).expect("header field is UTF-8")
}

fn take(src: &mut &[u8]) -> u8 {
    let all = *src;
    let (&b, rest) = all.split_first().expect("HPACK block ends mid-field");
    *src = rest;
    b
}

/// The decoder's parts against RFC 7541's own examples (C.1.2: 1337 with a
/// 5-bit prefix; C.4.1: "www.example.com" Huffman-coded), so a failing
/// exchange cannot come from them.
#[test]
fn hpack_parts_decode_the_rfc_examples() {
    let mut int = Vec::new();
    push_int(&mut int, 1337, 5, 0);
    assert_eq!(int, [0x1f, 0x9a, 0x0a]);
    assert_eq!(read_int(&mut &int[..], 5), 1337);
    let coded = [
        0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
    ];
    assert_eq!(huffman_decode(&coded), b"www.example.com");
}
