//! HTTP/1.1 on the client port: the endpoints and etcd's JSON gateway.
//!
//! The same JSON requests go to ephd (in etcd-compatible mode, so
//! revisions match) and to a stock etcd 3.4 over real HTTP/1.1 (curl), and
//! the answers (status, and the body with member and cluster IDs
//! normalised) must be equal. `clients.rs` runs etcd's curl recipes, the
//! etcd3gw library and TLS against ephd.

#[path = "gateway/clients.rs"]
mod clients;

use crate::harness::{Server, StockEtcd};
use crate::support::ephd;
use serde_json::Value;
use std::process::Command;

/// The status and body of one HTTP request made with curl (HTTP/1.1).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    pub status: u16,
    pub body: String,
}

impl Answer {
    /// The body as JSON; panics with the body when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

/// `curl` with `args`, failing loudly when curl is missing or fails.
pub(crate) fn curl(args: &[&str]) -> Answer {
    let out = Command::new("curl")
        .args(["-s", "-S", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl must be installed (Debian package curl)");
    assert!(
        out.status.success(),
        "curl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8 answer");
    let (body, code) = text.rsplit_once('\n').expect("status line");
    Answer {
        status: code.parse().expect("status code"),
        body: body.to_string(),
    }
}

/// POSTs `body` to `base` + `path`.
pub(crate) fn post(base: &str, path: &str, body: &str) -> Answer {
    curl(&["-X", "POST", &format!("{base}{path}"), "-d", body])
}

/// `answer` with what must differ between two servers replaced: member and
/// cluster IDs, terms, and the URLs and names that carry ports.
fn normalized(answer: &Answer) -> (u16, Value) {
    let mut v = match serde_json::from_str::<Value>(&answer.body) {
        Ok(v) => v,
        Err(_) => Value::String(answer.body.clone()),
    };
    fn walk(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for (k, val) in map.iter_mut() {
                    match k.as_str() {
                        "cluster_id" | "member_id" | "raft_term" | "leader" | "memberID" => {
                            *val = Value::String("<id>".into())
                        }
                        "peerURLs" | "clientURLs" | "name" => *val = Value::String("<url>".into()),
                        _ => walk(val),
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut v);
    (answer.status, v)
}

/// One step of the side-by-side script: a path, a body, and whether the
/// error text may differ (Go's JSON decoder words its errors its own way;
/// only the status and the gRPC code are compared then).
struct Step {
    path: &'static str,
    body: &'static str,
    own_words: bool,
}

const fn step(path: &'static str, body: &'static str) -> Step {
    Step {
        path,
        body,
        own_words: false,
    }
}

/// The requests both servers answer, in order; keys are base64 (`foo` is
/// `Zm9v`, `fop` is `Zm9w`, `bar` is `YmFy`, `baz` is `YmF6`).
fn script() -> Vec<Step> {
    vec![
        step("/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy"}"#),
        step(
            "/v3/kv/put",
            r#"{"key":"Zm9v","value":"YmF6","prev_kv":true}"#,
        ),
        step(
            "/v3/kv/put",
            r#"{"key":"Zm9vMQ==","value":"YmFy","lease":"0"}"#,
        ),
        step("/v3/kv/range", r#"{"key":"Zm9v"}"#),
        step("/v3/kv/range", r#"{"key":"Zm9v","range_end":"Zm9w"}"#),
        step(
            "/v3/kv/range",
            r#"{"key":"Zm9v","rangeEnd":"Zm9w","count_only":true}"#,
        ),
        step(
            "/v3/kv/range",
            r#"{"key":"Zm9v","range_end":"Zm9w","limit":1,"sort_order":"DESCEND","sort_target":"KEY"}"#,
        ),
        step("/v3/kv/range", r#"{"key":"Zm9v","revision":"2"}"#),
        step("/v3/kv/range", r#"{"key":"bm9uZQ=="}"#),
        step("/v3/kv/range", r#"{}"#),
        step("/v3/kv/range", ""),
        step("/v3/kv/range", r#"{"key":"Zm9v","revision":"100"}"#),
        step("/v3beta/kv/range", r#"{"key":"Zm9v","keys_only":true}"#),
        step(
            "/v3/kv/txn",
            r#"{"compare":[{"target":"CREATE","key":"Zm9v","create_revision":"0"}],"success":[{"request_put":{"key":"Zm9v","value":"YmFy"}}],"failure":[{"request_range":{"key":"Zm9v"}}]}"#,
        ),
        step(
            "/v3/kv/txn",
            r#"{"compare":[{"target":"VALUE","result":"EQUAL","key":"Zm9v","value":"YmF6"}],"success":[{"requestPut":{"key":"Zm9v","value":"YmFy"}},{"request_delete_range":{"key":"Zm9vMQ==","prev_kv":true}}]}"#,
        ),
        step(
            "/v3/kv/deleterange",
            r#"{"key":"Zm9v","range_end":"Zm9w","prev_kv":true}"#,
        ),
        step("/v3/kv/deleterange", r#"{"key":"Zm9v"}"#),
        step("/v3/lease/grant", r#"{"TTL":60,"ID":"7587"}"#),
        step("/v3/lease/grant", r#"{"TTL":60,"ID":7587}"#),
        step(
            "/v3/kv/put",
            r#"{"key":"bGVhc2Vk","value":"eA==","lease":"7587"}"#,
        ),
        step(
            "/v3/kv/put",
            r#"{"key":"bGVhc2Vk","value":"eA==","lease":"99"}"#,
        ),
        step("/v3/lease/leases", "{}"),
        step("/v3/kv/lease/leases", "{}"),
        step("/v3/lease/revoke", r#"{"ID":"99"}"#),
        step("/v3/kv/lease/revoke", r#"{"ID":"7587"}"#),
        step("/v3/kv/range", r#"{"key":"bGVhc2Vk"}"#),
        step("/v3/lease/timetolive", r#"{"ID":"7587"}"#),
        step("/v3/kv/compaction", r#"{"revision":"3"}"#),
        step("/v3/kv/range", r#"{"key":"Zm9v","revision":"2"}"#),
        step("/v3/kv/compaction", r#"{"revision":"3"}"#),
        // Alarms: no header in etcd 3.4's answer; a raised NOSPACE refuses
        // puts until it is cleared.
        step("/v3/maintenance/alarm", r#"{"action":"GET"}"#),
        step(
            "/v3/maintenance/alarm",
            r#"{"action":"ACTIVATE","memberID":"1","alarm":"NOSPACE"}"#,
        ),
        step("/v3/maintenance/alarm", r#"{"action":"GET"}"#),
        step("/v3/kv/put", r#"{"key":"Zm9v","value":"eA=="}"#),
        step(
            "/v3/maintenance/alarm",
            r#"{"action":"DEACTIVATE","memberID":"1","alarm":"NOSPACE"}"#,
        ),
        step("/v3/maintenance/alarm", r#"{"action":"GET"}"#),
        // Not here: MemberAdd (a single ephd answers Unimplemented).
        step("/v3/auth/authenticate", r#"{"name":"root","password":"x"}"#),
        step("/v3beta/auth/authenticate", "{}"),
        step("/v3/kv/nothing", "{}"),
        step("/v3alpha-not/kv/range", "{}"),
        Step {
            path: "/v3/kv/range",
            body: r#"{"key":"Zm9v""#,
            own_words: true,
        },
        Step {
            path: "/v3/kv/range",
            body: r#"{"key":"!!"}"#,
            own_words: true,
        },
        Step {
            path: "/v3/kv/txn",
            body: r#"{"compare":[{"target":"NOPE","key":"Zm9v"}],"success":[{"request_put":{"key":"Zm9v","value":"eA=="}}]}"#,
            own_words: true,
        },
        step(
            "/v3/kv/txn",
            r#"{"compare":[{"target":"VALUE","key":"Zm9v","value":"eA==","x":1}],"success":[{"request_put":{"key":"Zm9v","value":"eA==","y":{}}}],"z":[]}"#,
        ),
        Step {
            path: "/v3/kv/range",
            body: r#"{"key":"Zm9v","keys_only":"yes"}"#,
            own_words: true,
        },
    ]
}

/// What is compared of an answer: all of it, or for errors worded by the
/// JSON decoder only the status and the code.
fn comparable(step: &Step, answer: &Answer) -> (u16, Value) {
    let (status, body) = normalized(answer);
    if step.own_words {
        return (status, body.get("code").cloned().unwrap_or(Value::Null));
    }
    (status, body)
}

#[test]
fn json_gateway_answers_as_stock_etcd_does() {
    let etcd = StockEtcd::start();
    let ours = ephd(&[]);
    let mut differences = Vec::new();
    for step in script() {
        let want = post(&etcd.endpoint(), step.path, step.body);
        let got = post(&ours.endpoint(), step.path, step.body);
        let (want_c, got_c) = (comparable(&step, &want), comparable(&step, &got));
        if want_c != got_c {
            differences.push(format!(
                "POST {} {}\n  etcd: {} {}\n  ephd: {} {}",
                step.path, step.body, want.status, want.body, got.status, got.body
            ));
        }
    }
    assert!(
        differences.is_empty(),
        "{} answers differ:\n{}\nephd log:\n{}",
        differences.len(),
        differences.join("\n"),
        ours.logs()
    );
}

#[test]
fn methods_and_unknown_paths_answer_as_etcd_does() {
    let etcd = StockEtcd::start();
    let ours = ephd(&[]);
    for args in [
        vec!["-X", "GET", "/v3/kv/range"],
        vec!["-X", "PUT", "/v3/kv/put"],
        vec!["-X", "GET", "/nothing"],
        vec!["-X", "POST", "/v3/maintenance/nothing"],
    ] {
        let ask = |base: &str| curl(&["-X", args[1], &format!("{base}{}", args[2])]);
        let (want, got) = (ask(&etcd.endpoint()), ask(&ours.endpoint()));
        assert_eq!(got, want, "{args:?}");
    }
    // The CORS headers etcd sends with every answer.
    let headers = Command::new("curl")
        .args(["-s", "-i", "-X", "OPTIONS"])
        .arg(format!("{}/v3/kv/range", ours.endpoint()))
        .output()
        .expect("curl");
    let headers = String::from_utf8_lossy(&headers.stdout).to_lowercase();
    assert!(headers.starts_with("http/1.1 200"), "{headers}");
    assert!(
        headers.contains("access-control-allow-origin: *"),
        "{headers}"
    );
}

#[test]
fn streams_answer_line_by_line_as_etcd_does() {
    let etcd = StockEtcd::start();
    let ours = ephd(&[]);
    let lines = |base: &str| -> Vec<(u16, Value)> {
        post(base, "/v3/lease/grant", r#"{"TTL":60,"ID":"42"}"#);
        post(base, "/v3/kv/put", r#"{"key":"dw==","value":"MQ=="}"#);
        post(base, "/v3/kv/put", r#"{"key":"dw==","value":"Mg=="}"#);
        post(base, "/v3/kv/deleterange", r#"{"key":"dw=="}"#);
        let keepalive = post(base, "/v3/lease/keepalive", r#"{"ID":"42"}"#);
        let mut out = vec![normalized(&keepalive)];
        let watch = clients::stream_lines(
            &format!("{base}/v3/watch"),
            r#"{"create_request":{"key":"dw==","start_revision":"1","prev_kv":true}}"#,
            2,
        );
        for line in watch {
            out.push(normalized(&Answer {
                status: 200,
                body: line,
            }));
        }
        out
    };
    assert_eq!(lines(&ours.endpoint()), lines(&etcd.endpoint()));
}
