//! Requests on the gRPC paths that are not whole gRPC calls, side by side
//! with stock etcd: a body that ends before its message (empty, cut inside
//! the message) answers `Unknown` "EOF" or "unexpected EOF" as grpc-go does
//! (cut inside the 5-byte prefix: the one documented difference), and an
//! HTTP/1.1 POST to a gRPC method path gets the 404 of etcd's HTTP handler
//! rather than a gRPC answer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::authority::raw_h2::{self, Outcome};
use crate::authority::{field, grpc_fields};
use crate::harness::StockEtcd;
use crate::support::ephd;

/// A `grpc-message` as clients read it: percent-decoded (tonic encodes
/// spaces, grpc-go does not; both decode alike).
fn decoded(message: &str) -> String {
    let bytes = message.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], message.get(i + 1..i + 3)) {
            (b'%', Some(hex)) if u8::from_str_radix(hex, 16).is_ok() => {
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// (grpc-status, decoded grpc-message) of a unary call to `path` whose body
/// is `body`, exactly as sent.
fn unary_status(port: u16, path: &str, body: &[u8]) -> (String, String) {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let authority = format!("127.0.0.1:{port}");
    match raw_h2::exchange(addr, &grpc_fields(path, &authority), body) {
        Outcome::Answered { trailers, .. } => (
            field(&trailers, "grpc-status").unwrap_or("").to_string(),
            decoded(field(&trailers, "grpc-message").unwrap_or("")),
        ),
        other => panic!("{path} {body:?} on {port}: {other:?}"),
    }
}

/// The status line, the headers etcd's handler sets, and the body of an
/// HTTP/1.1 POST to `path`.
fn http1_post(port: u16, path: &str) -> (String, Vec<String>, String) {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/grpc\r\n\
         Content-Length: 1\r\nConnection: close\r\n\r\nx"
    );
    conn.write_all(req.as_bytes()).unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).expect("read the answer");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a head and a body");
    let mut lines = head.lines();
    let status = lines.next().unwrap_or("").to_string();
    let mut headers: Vec<String> = lines
        .map(|l| l.to_ascii_lowercase())
        .filter(|l| !l.starts_with("date:"))
        .collect();
    headers.sort();
    (status, headers, body.to_string())
}

#[test]
fn incomplete_calls_and_http1_posts_get_etcds_answers() {
    let etcd = StockEtcd::start();
    let server = ephd(&[]);
    let cases: [(&str, &[u8]); 4] = [
        ("/etcdserverpb.KV/Range", b""),
        ("/etcdserverpb.KV/Range", b"\x00\x00\x00"),
        ("/etcdserverpb.KV/Put", b"\x00\x00\x00\x00\x10ab"),
        (
            "/etcdserverpb.Lease/LeaseGrant",
            b"\x00\x00\x00\x00\x02\x08",
        ),
    ];
    for (path, body) in cases {
        let want = unary_status(etcd.port(), path, body);
        assert_ne!(want.0, "0", "etcd took {body:?} as a call");
        let got = unary_status(server.port(), path, body);
        if body.len() < 5 && !body.is_empty() {
            // The one known difference (README, "Compatibility notes"): a
            // body cut inside the 5-byte message prefix is "EOF" from etcd
            // 3.6 and "unexpected EOF" from ephd, both Unknown. Pinned so a
            // change on either side shows.
            assert_eq!(want, ("2".to_string(), "EOF".to_string()), "etcd");
            assert_eq!(got, ("2".to_string(), "unexpected EOF".to_string()), "ephd");
            continue;
        }
        assert_eq!(got, want, "{path} {body:?}");
    }
    for path in ["/etcdserverpb.KV/Range", "/etcdserverpb.Watch/Watch"] {
        let want = http1_post(etcd.port(), path);
        assert!(want.0.contains(" 404 "), "etcd: {want:?}");
        assert_eq!(http1_post(server.port(), path), want, "{path}");
    }
}
