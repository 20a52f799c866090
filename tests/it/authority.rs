//! `:authority` as etcd accepts it. etcdctl 3.4 sends an `--endpoints` URL
//! (`http://host:port`) as the HTTP/2 `:authority`; grpc-go, which stock
//! etcd serves with, accepts any authority, and ephd's patched h2
//! (third_party/h2/EPHD-PATCH.md) now does too. Checked three ways, each
//! side by side with stock etcd:
//!
//! * a unary Maintenance.Status call sent byte by byte (`raw_h2`) under
//!   authorities no HTTP/2 client library would send;
//! * the etcdctl 3.4 commands of every runbook with `--endpoints=http://…`,
//!   including the `--cluster` forms that dial MemberList's `http://` URLs;
//! * what h2 still rejects while parsing a request (a missing `:scheme`, a
//!   `te` other than `trailers`): an RST_STREAM PROTOCOL_ERROR for the
//!   client, and the reason in ephd's log under the filter README gives.

pub(crate) mod raw_h2;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{StatusRequest, StatusResponse};
use prost::Message;

use crate::cli::{self, CmdOutput};
use crate::harness::{Ephd, Server, StockEtcd};
use raw_h2::Outcome;

/// The path of Maintenance.Status, the call etcdctl's `endpoint status` makes.
const STATUS_PATH: &str = "/etcdserverpb.Maintenance/Status";

/// The authorities every server must accept: URLs as etcdctl 3.4 sends
/// them, the plain form, and odd strings that parse as no authority at all.
fn authorities(port: u16) -> Vec<String> {
    vec![
        format!("http://127.0.0.1:{port}"),
        format!("https://127.0.0.1:{port}"),
        format!("127.0.0.1:{port}"),
        format!("http://127.0.0.1:{port}/some/path"),
        "unix:///tmp/x.sock".to_string(),
        "[::1".to_string(),
        String::new(),
    ]
}

/// `:authority` plus the fields a gRPC client sends, in a gRPC client's order.
pub(crate) fn grpc_fields<'a>(path: &'a str, authority: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
}

/// A gRPC length-prefixed message: not compressed, 4-byte length, bytes.
pub(crate) fn grpc_message(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

pub(crate) fn field<'a>(fields: &'a [raw_h2::Field], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// Calls Maintenance.Status under `authority` and returns the decoded
/// answer, failing with everything the server sent unless it is
/// `:status 200`, `grpc-status 0` and exactly one StatusResponse.
fn status_under(addr: SocketAddr, authority: &str, who: &str) -> StatusResponse {
    let request = grpc_message(&StatusRequest {}.encode_to_vec());
    let outcome = raw_h2::exchange(addr, &grpc_fields(STATUS_PATH, authority), &request);
    let (headers, body, trailers) = match outcome {
        Outcome::Answered {
            headers,
            body,
            trailers,
        } => (headers, body, trailers),
        other => panic!("{who}, :authority {authority:?}: {other:?}"),
    };
    let context = format!("{who}, :authority {authority:?}: {headers:?} {trailers:?}");
    assert_eq!(field(&headers, ":status"), Some("200"), "{context}");
    assert_eq!(field(&trailers, "grpc-status"), Some("0"), "{context}");
    assert!(body.len() >= 5 && body[0] == 0, "{context}: body {body:?}");
    let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
    assert_eq!(body.len(), 5 + len, "{context}: one message expected");
    StatusResponse::decode(&body[5..]).unwrap_or_else(|e| panic!("{context}: {e}"))
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Every authority in `authorities` gets the same answer as the plain
/// `host:port` one: a StatusResponse of this member.
fn check_status_under_every_authority(port: u16, who: &str) {
    let plain = status_under(loopback(port), &format!("127.0.0.1:{port}"), who);
    let header = plain.header.expect("Status has a header");
    assert_ne!(header.member_id, 0, "{who}: {plain:?}");
    assert_eq!(plain.leader, header.member_id, "{who}: {plain:?}");
    assert!(plain.version.starts_with('3'), "{who}: {plain:?}");
    for authority in authorities(port) {
        let got = status_under(loopback(port), &authority, who);
        let got_header = got.header.expect("Status has a header");
        assert_eq!(
            (got_header.cluster_id, got_header.member_id, &got.version),
            (header.cluster_id, header.member_id, &plain.version),
            "{who}, :authority {authority:?}"
        );
    }
}

#[test]
fn status_answers_under_any_authority_on_ephd() {
    let ephd = Ephd::start(&[]);
    check_status_under_every_authority(ephd.port(), "ephd");
}

/// The reference: grpc-go (stock etcd) accepts the same authorities, and
/// the hand-written client gets a real answer from a server that is not ours.
#[test]
fn status_answers_under_any_authority_on_stock_etcd() {
    let etcd = StockEtcd::start();
    check_status_under_every_authority(etcd.port(), "stock etcd");
}

/// Splits etcdctl's simple-format table row into trimmed fields.
fn row(line: &str) -> Vec<String> {
    line.split(',').map(|f| f.trim().to_string()).collect()
}

/// Asserts that etcdctl exited 0 and returns its stdout lines.
#[track_caller]
fn ok_lines(out: &CmdOutput, what: &str) -> Vec<String> {
    assert_eq!(out.code, Some(0), "{what}: {out:?}");
    out.stdout.lines().map(str::to_string).collect()
}

/// Runs the URL-endpoint commands against `endpoint` (`http://host:port`,
/// given to etcdctl as is), asserts each one's own shape, and returns the
/// outputs with everything server-specific replaced by a placeholder, for
/// comparing a server with stock etcd.
fn url_endpoint_commands(endpoint: &str) -> Vec<String> {
    let run = |args: &[&str]| {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        cli::run_with_endpoints(endpoint, &args, None)
    };
    let put = run(&["put", "k", "v"]);
    assert_eq!(ok_lines(&put, "put"), ["OK"]);
    let mut shapes = Vec::new();

    // ENDPOINT, ID, VERSION, STORAGE VERSION, DB SIZE, IN USE, PERCENTAGE
    // NOT IN USE, QUOTA, IS LEADER, IS LEARNER, RAFT TERM, RAFT INDEX, RAFT
    // APPLIED INDEX, ERRORS, DOWNGRADE TARGET VERSION, DOWNGRADE ENABLED
    // (etcdctl 3.6); `--cluster` dials the client URLs MemberList
    // advertises (one member here, the same URL).
    for args in [
        &["endpoint", "status"][..],
        &["endpoint", "status", "--cluster"],
    ] {
        let out = run(args);
        let lines = ok_lines(&out, &args.join(" "));
        assert_eq!(lines.len(), 1, "{out:?}");
        let f = row(&lines[0]);
        assert_eq!(f.len(), 16, "{out:?}");
        assert_eq!(f[0], endpoint, "{out:?}");
        assert!(
            u64::from_str_radix(&f[1], 16).is_ok_and(|id| id != 0),
            "{out:?}"
        );
        assert!(f[2].starts_with('3'), "{out:?}");
        assert_eq!(f[3], "3.6.0", "{out:?}");
        assert_eq!((f[8].as_str(), f[9].as_str()), ("true", "false"), "{out:?}");
        for number in &f[10..13] {
            assert!(number.parse::<u64>().is_ok(), "{out:?}");
        }
        shapes.push(format!(
            "{}: ENDPOINT, ID, 3.x, {}, SIZE, SIZE, N%, {}, {}, {}, N, N, N, [{}], [{}], {}",
            args.join(" "),
            f[3],
            f[7],
            f[8],
            f[9],
            f[13],
            f[14],
            f[15]
        ));
    }

    // ENDPOINT, HASH (of the keys and values at the current revision),
    // HASH REVISION.
    for args in [
        &["endpoint", "hashkv"][..],
        &["endpoint", "hashkv", "--cluster"],
    ] {
        let out = run(args);
        let lines = ok_lines(&out, &args.join(" "));
        assert_eq!(lines.len(), 1, "{out:?}");
        let f = row(&lines[0]);
        assert_eq!(f.len(), 3, "{out:?}");
        assert_eq!(f[0], endpoint, "{out:?}");
        assert!(f[1].parse::<u32>().is_ok(), "{out:?}");
        assert!(f[2].parse::<i64>().is_ok(), "{out:?}");
        shapes.push(format!("{}: ENDPOINT, HASH, REVISION", args.join(" ")));
    }

    // Health goes to stdout (etcdctl 3.6): "<endpoint> is healthy:
    // successfully committed proposal: took = <duration>".
    for args in [
        &["endpoint", "health"][..],
        &["endpoint", "health", "--cluster"],
    ] {
        let out = run(args);
        assert_eq!(out.code, Some(0), "{out:?}");
        let prefix = format!("{endpoint} is healthy: successfully committed proposal: took = ");
        let took: Vec<&str> = out
            .stdout
            .lines()
            .filter(|l| l.contains(" is healthy"))
            .map(|l| l.strip_prefix(&prefix).unwrap_or(""))
            .collect();
        assert!(took.len() == 1 && !took[0].is_empty(), "{out:?}");
        shapes.push(format!(
            "{}: {}DURATION",
            args.join(" "),
            prefix.replace(endpoint, "ENDPOINT")
        ));
    }

    for args in [&["defrag"][..], &["defrag", "--cluster"]] {
        let out = run(args);
        // etcdctl 3.6 adds how long it took.
        let lines: Vec<String> = ok_lines(&out, &args.join(" "))
            .iter()
            .map(|l| l.split(". took ").next().unwrap_or(l).to_string())
            .collect();
        assert_eq!(
            lines,
            [format!("Finished defragmenting etcd member[{endpoint}]")],
            "{out:?}"
        );
        shapes.push(format!(
            "{}: {}",
            args.join(" "),
            lines[0].replace(endpoint, "ENDPOINT")
        ));
    }
    shapes
}

#[test]
fn etcdctl_with_url_endpoints_matches_stock_etcd() {
    let etcd = StockEtcd::start();
    let ephd = Ephd::start(&[]);
    let want = url_endpoint_commands(&etcd.endpoint());
    let got = url_endpoint_commands(&ephd.endpoint());
    assert_eq!(got, want, "ephd (left) vs stock etcd (right)");
}

/// The log filter README gives for seeing why h2 reset a request: the
/// request-level checks log under `h2::server` at debug, the header-block
/// ones under `h2::frame::headers` at trace.
const H2_REJECTIONS_FILTER: &str = "info,h2::server=debug,h2::frame::headers=trace";

/// Waits (bounded) until ephd's log contains `text`.
fn wait_for_log(ephd: &Ephd, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ephd.logs().contains(text) {
        assert!(
            Instant::now() < deadline,
            "ephd never logged {text:?}:\n{}",
            ephd.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What h2 still rejects while parsing a request gets a stream reset with
/// PROTOCOL_ERROR, and the reason reaches ephd's log under
/// `H2_REJECTIONS_FILTER`.
#[test]
fn a_malformed_request_is_reset_and_its_reason_logged_under_the_h2_filter() {
    let ephd = Ephd::start(&["--log-level", H2_REJECTIONS_FILTER]);
    let addr = loopback(ephd.port());
    let authority = format!("127.0.0.1:{}", ephd.port());
    let request = grpc_message(&StatusRequest {}.encode_to_vec());
    let valid = grpc_fields(STATUS_PATH, &authority);

    let no_scheme: Vec<_> = valid
        .iter()
        .copied()
        .filter(|(n, _)| *n != ":scheme")
        .collect();
    let te_gzip: Vec<_> = valid
        .iter()
        .map(|&(n, v)| if n == "te" { (n, "gzip") } else { (n, v) })
        .collect();
    for (fields, reason) in [
        (no_scheme, "malformed headers: missing scheme"),
        (te_gzip, "TE header not set to trailers"),
    ] {
        match raw_h2::exchange(addr, &fields, &request) {
            Outcome::Reset(code) => assert_eq!(code, raw_h2::PROTOCOL_ERROR, "{reason}"),
            Outcome::GoAway(code) => panic!("{reason}: connection closed, GOAWAY code {code}"),
            other => panic!("{reason}: expected RST_STREAM, got {other:?}"),
        }
        wait_for_log(&ephd, reason);
    }
    // The server goes on serving: the same connection setup with valid
    // fields still gets an answer.
    status_under(addr, &authority, "ephd");
}
