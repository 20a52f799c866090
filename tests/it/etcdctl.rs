//! etcdctl smoke tests: one scripted etcdctl session is run against a stock
//! etcd and against ephd and the outputs are compared after normalizing only
//! what must differ (cluster/member ids, raft term, lease ids, TTL countdown).
//! Commands whose output is inherently server-specific (endpoint status,
//! health, member list) are asserted on explicitly, against both servers.

use std::time::Duration;

use crate::cli::{self, CmdOutput};
use crate::harness::{Server, StockEtcd};
use crate::support;

/// How long a background `etcdctl watch` may take to print its history.
const WATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// One etcdctl invocation of the script. `{L1}` in arguments or stdin
/// stands for the first lease id granted by the server under test, in hex.
struct Step {
    args: Vec<String>,
    stdin: Option<String>,
    /// Run as a background watch, stopped after printing this line.
    watch_until: Option<String>,
    /// Output order is unspecified (Go map order): compare sorted lines.
    unordered: bool,
}

fn step(args: &[&str]) -> Step {
    Step {
        args: args.iter().map(|a| a.to_string()).collect(),
        stdin: None,
        watch_until: None,
        unordered: false,
    }
}

/// `etcdctl txn` in its non-interactive stdin format: compares, blank line,
/// success ops, blank line, failure ops, blank line.
fn txn(extra: &[&str], compares: &[&str], success: &[&str], failure: &[&str]) -> Step {
    let mut s = step(&["txn", "--interactive=false"]);
    s.args.extend(extra.iter().map(|a| a.to_string()));
    let block = |lines: &[&str]| lines.iter().map(|l| format!("{l}\n")).collect::<String>();
    s.stdin = Some(format!(
        "{}\n{}\n{}\n",
        block(compares),
        block(success),
        block(failure)
    ));
    s
}

fn watch(args: &[&str], until: &str) -> Step {
    let mut s = step(&["watch"]);
    s.args.extend(args.iter().map(|a| a.to_string()));
    s.watch_until = Some(until.to_string());
    s
}

fn unordered(mut s: Step) -> Step {
    s.unordered = true;
    s
}

/// The scripted session. Revisions are deterministic because both servers
/// start empty at revision 1 and see exactly the same writes.
fn script() -> Vec<Step> {
    vec![
        // --- puts ---
        step(&["put", "foo", "bar"]),
        step(&["put", "foo2", "baz"]),
        step(&["put", "fop", "x"]),
        step(&["put", "a", "1"]),
        step(&["put", "b", "2"]),
        step(&["put", "zz", ""]),
        step(&["put", "foo", "bar2", "--prev-kv"]),
        step(&["put", "foo", "bar3", "--prev-kv", "-w", "json"]),
        step(&["put", "zz", "--ignore-value"]),
        step(&["put", "missing", "--ignore-value"]),
        step(&["put", "zz", "newval", "--ignore-lease"]),
        // --- gets ---
        step(&["get", "foo"]),
        step(&["get", "foo", "--prefix"]),
        step(&["get", "foo", "--prefix", "-w", "json"]),
        step(&["get", "foo", "--rev=2"]),
        step(&["get", "foo", "--rev=1"]),
        step(&["get", "foo", "--rev=8", "-w", "json"]),
        step(&["get", "foo", "--rev=1000"]),
        step(&["get", "", "--prefix", "--sort-by=KEY", "--order=DESCEND"]),
        step(&["get", "", "--prefix", "--sort-by=MODIFY", "--order=ASCEND"]),
        step(&["get", "", "--prefix", "--sort-by=MODIFY", "--order=DESCEND"]),
        step(&["get", "", "--prefix", "--sort-by=CREATE", "--order=DESCEND"]),
        step(&[
            "get",
            "",
            "--prefix",
            "--sort-by=VERSION",
            "--order=DESCEND",
        ]),
        step(&["get", "", "--prefix", "--sort-by=VALUE", "--order=ASCEND"]),
        step(&["get", "", "--prefix", "--order=DESCEND"]),
        step(&["get", "", "--from-key", "--keys-only"]),
        step(&["get", "b", "--from-key"]),
        step(&["get", "a", "fop"]),
        step(&["get", "a", "fop", "--keys-only", "-w", "json"]),
        step(&["get", "", "--prefix", "--limit=2"]),
        step(&["get", "", "--prefix", "--limit=2", "-w", "json"]),
        step(&[
            "get",
            "",
            "--prefix",
            "--limit=2",
            "--sort-by=KEY",
            "--order=DESCEND",
        ]),
        step(&["get", "", "--prefix", "--keys-only", "-w", "json"]),
        step(&["get", "foo", "--print-value-only"]),
        step(&["get", "foo", "--consistency=s"]),
        step(&["get", "foo", "--prefix", "--hex"]),
        step(&["get", "missing"]),
        step(&["get", "missing", "-w", "json"]),
        // --- txns ---
        txn(
            &[],
            &[r#"value("foo2") = "baz""#],
            &["put t1 v1", "get foo2", "del zz"],
            &["put never x"],
        ),
        txn(
            &[],
            &[r#"version("foo2") > "5""#],
            &["put never x"],
            &["put t2 x", "put t3 y --prev-kv", "get t1"],
        ),
        txn(
            &["-w", "json"],
            &[
                r#"mod("foo2") < "100""#,
                r#"create("foo2") = "3""#,
                r#"ver("t1") != "2""#,
            ],
            &["get t --prefix", "del t2 --prev-kv", "put t1 v2 --prev-kv"],
            &[],
        ),
        txn(
            &[],
            &[r#"ver("nokey") = "0""#, r#"c("nokey") = "0""#],
            &["get nokey"],
            &["put never x"],
        ),
        txn(&[], &[r#"val("t1") = "v2""#], &["put d 1", "put d 2"], &[]),
        txn(&[], &[], &["put empty-txn ok"], &[]),
        step(&["get", "", "--prefix", "-w", "json"]),
        // --- watches over history (sentinel write ends them) ---
        step(&["put", "foo~end", "done"]),
        watch(&["", "--prefix", "--rev=2"], "done"),
        watch(&["foo", "--prefix", "--rev=3", "--prev-kv"], "done"),
        watch(&["a", "fop", "--rev=1"], "done"),
        watch(&["foo~end", "--rev=2", "-w", "json"], "done"),
        // --- deletes ---
        step(&["del", "fop"]),
        step(&["del", "missing"]),
        step(&["del", "foo", "--prefix", "--prev-kv"]),
        step(&["del", "a", "b"]),
        step(&["del", "nothing", "--prefix", "--prev-kv"]),
        step(&["del", "t", "--from-key"]),
        step(&["get", "", "--prefix"]),
        step(&["get", "", "--prefix", "--rev=12"]),
        // --- leases ---
        step(&["lease", "grant", "60"]),
        step(&["lease", "grant", "120"]),
        step(&["put", "lk1", "v", "--lease={L1}"]),
        step(&["put", "lk2", "v", "--lease={L1}"]),
        step(&["put", "lk3", "v", "--lease={L2}"]),
        step(&["get", "lk", "--prefix", "-w", "json"]),
        step(&["lease", "keep-alive", "--once", "{L1}"]),
        step(&["lease", "timetolive", "{L1}", "--keys"]),
        step(&["lease", "timetolive", "{L2}"]),
        unordered(step(&["lease", "list"])),
        // (etcdctl 3.4 panics on `lease("k") = "id"` compares: its parser
        // passes a string where an int is required; the differential suite
        // covers LEASE compares through the raw API instead.)
        step(&["lease", "revoke", "{L1}"]),
        step(&["get", "lk", "--prefix"]),
        step(&["lease", "timetolive", "{L1}"]),
        step(&["lease", "revoke", "{L1}"]),
        step(&["lease", "keep-alive", "--once", "{L1}"]),
        step(&["put", "x", "y", "--lease=1234"]),
        step(&["put", "lk3", "v2", "--ignore-lease"]),
        step(&["get", "lk3", "-w", "json"]),
        step(&["lease", "timetolive", "1234"]),
        unordered(step(&["lease", "list"])),
        step(&["lease", "revoke", "{L2}"]),
        step(&["get", "lk3"]),
        // --- compaction ---
        step(&["compaction", "5"]),
        step(&["get", "foo", "--rev=4"]),
        step(&["get", "foo", "--rev=5", "-w", "json"]),
        step(&["compaction", "3"]),
        step(&["compaction", "5"]),
        step(&["compaction", "100000"]),
        step(&["compaction", "--physical", "10"]),
        watch(&["foo", "--rev=2"], "never printed"),
        step(&["get", "", "--prefix", "--keys-only"]),
    ]
}

/// A normalized step result, ready to be compared across servers.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    command: String,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs the whole script against `endpoint` and normalizes every output.
fn run_script(endpoint: &str) -> Vec<Outcome> {
    let mut leases: Vec<u64> = Vec::new();
    let mut granted_ttls: Vec<i64> = Vec::new();
    let mut outcomes = Vec::new();
    for s in script() {
        let args: Vec<String> = s.args.iter().map(|a| substitute(a, &leases)).collect();
        let stdin = s.stdin.as_deref().map(|i| substitute(i, &leases));
        let out = match &s.watch_until {
            Some(until) => cli::watch_until(endpoint, &args, until, WATCH_TIMEOUT),
            None => cli::run(endpoint, &args, stdin.as_deref()),
        };
        if let Some((id, ttl)) = parse_granted(&out.stdout) {
            leases.push(id);
            granted_ttls.push(ttl);
        }
        outcomes.push(normalize(&s, out, &leases));
    }
    assert!(
        granted_ttls.iter().all(|ttl| *ttl > 0),
        "lease grants reported TTLs {granted_ttls:?}"
    );
    outcomes
}

/// Runs the script against two servers concurrently (halves wall time;
/// the servers are independent processes).
fn run_both(a: &str, b: &str) -> (Vec<Outcome>, Vec<Outcome>) {
    std::thread::scope(|scope| {
        let a = scope.spawn(|| run_script(a));
        let b = run_script(b);
        (a.join().expect("script thread panicked"), b)
    })
}

fn substitute(text: &str, leases: &[u64]) -> String {
    let mut text = text.to_string();
    for (i, id) in leases.iter().enumerate() {
        let n = i + 1;
        text = text.replace(&format!("{{L{n}}}"), &format!("{id:x}"));
    }
    text
}

/// Parses `lease 694d7a3b5c2e1a04 granted with TTL(60s)`.
fn parse_granted(stdout: &str) -> Option<(u64, i64)> {
    let rest = stdout.trim().strip_prefix("lease ")?;
    let (id, rest) = rest.split_once(" granted with TTL(")?;
    let ttl = rest.strip_suffix("s)")?.parse().ok()?;
    Some((u64::from_str_radix(id, 16).ok()?, ttl))
}

fn normalize(s: &Step, out: CmdOutput, leases: &[u64]) -> Outcome {
    let mut stdout = normalize_text(&out.stdout, leases);
    if s.unordered {
        let mut lines: Vec<&str> = stdout.lines().collect();
        lines.sort_unstable();
        stdout = lines.iter().map(|l| format!("{l}\n")).collect();
    }
    // etcdctl logs each failed RPC attempt as a JSON line with a timestamp
    // and a random client id; the human-readable "Error: ..." line remains.
    let stderr: String = out
        .stderr
        .lines()
        .filter(|l| !l.starts_with("{\"level\":"))
        .map(|l| format!("{l}\n"))
        .collect();
    Outcome {
        command: format!("etcdctl {}", s.args.join(" ")),
        code: out.code,
        stdout,
        stderr: normalize_text(&stderr, leases),
    }
}

/// Replaces server-chosen values by placeholders: lease ids (hex and
/// decimal) by their grant ordinal, cluster/member ids and raft terms in
/// JSON headers by fixed tokens, and the TTL countdown by `~` when it is
/// within a few seconds of the granted TTL.
fn normalize_text(text: &str, leases: &[u64]) -> String {
    let mut text = text.to_string();
    for (i, id) in leases.iter().enumerate() {
        let token = format!("<lease{}>", i + 1);
        text = text
            .replace(&format!("{id:016x}"), &token)
            .replace(&format!("{id:x}"), &token)
            .replace(&id.to_string(), &token);
    }
    for field in [
        "\"cluster_id\":",
        "\"member_id\":",
        "\"raft_term\":",
        "\"ClusterID\":",
        "\"MemberID\":",
    ] {
        text = replace_number_after(&text, field);
    }
    sort_attached_keys(&normalize_remaining(&text))
}

/// `attached keys([k2 k1])` lists a lease's keys in Go map order: sort them.
fn sort_attached_keys(text: &str) -> String {
    const MARKER: &str = "attached keys([";
    let Some(start) = text.find(MARKER).map(|p| p + MARKER.len()) else {
        return text.to_string();
    };
    let Some(len) = text[start..].find("])") else {
        return text.to_string();
    };
    let mut keys: Vec<&str> = text[start..start + len].split(' ').collect();
    keys.sort_unstable();
    format!(
        "{}{}{}",
        &text[..start],
        keys.join(" "),
        &text[start + len..]
    )
}

/// Replaces the decimal number that follows each occurrence of `marker`.
fn replace_number_after(text: &str, marker: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(pos) = rest.find(marker) {
        let (head, tail) = rest.split_at(pos + marker.len());
        out.push_str(head);
        let digits = tail.chars().take_while(|c| c.is_ascii_digit()).count();
        out.push_str(if digits > 0 { "<n>" } else { "" });
        rest = &tail[digits..];
    }
    out.push_str(rest);
    out
}

/// `granted with TTL(60s), remaining(59s)`: the countdown depends on timing,
/// so it is accepted when 0 <= granted - remaining <= 5 and replaced by `~`.
fn normalize_remaining(text: &str) -> String {
    text.split_inclusive('\n')
        .map(|line| {
            let Some((head, tail)) = line.split_once("remaining(") else {
                return line.to_string();
            };
            let Some((secs, after)) = tail.split_once("s)") else {
                return line.to_string();
            };
            let granted = head
                .split_once("TTL(")
                .and_then(|(_, t)| t.split_once("s)"))
                .and_then(|(g, _)| g.parse::<i64>().ok());
            match (granted, secs.parse::<i64>()) {
                (Some(g), Ok(r)) if (0..=5).contains(&(g - r)) => {
                    format!("{head}remaining(~s){after}")
                }
                _ => line.to_string(),
            }
        })
        .collect()
}

/// Compares two script runs and panics listing every differing step.
fn assert_same_outcomes(reference: &str, want: &[Outcome], other: &str, got: &[Outcome]) {
    assert_eq!(want.len(), got.len(), "script length differs");
    let mismatches: Vec<String> = want
        .iter()
        .zip(got)
        .enumerate()
        .filter(|(_, (w, g))| w != g)
        .map(|(i, (w, g))| {
            format!(
                "step {i}: {}\n  {reference}: code={:?}\n    stdout: {:?}\n    stderr: {:?}\n  \
                 {other}: code={:?}\n    stdout: {:?}\n    stderr: {:?}",
                w.command, w.code, w.stdout, w.stderr, g.code, g.stdout, g.stderr
            )
        })
        .collect();
    assert!(
        mismatches.is_empty(),
        "{} of {} etcdctl steps differ between {reference} and {other}:\n{}",
        mismatches.len(),
        want.len(),
        mismatches.join("\n")
    );
}

/// Sanity checks that make the comparison meaningful even if both servers
/// were broken the same way: a few outputs are pinned literally.
fn assert_script_landmarks(outcomes: &[Outcome]) {
    let find = |cmd: &str| {
        outcomes
            .iter()
            .find(|o| o.command == cmd)
            .unwrap_or_else(|| panic!("no step {cmd:?}"))
    };
    assert_eq!(find("etcdctl put foo bar").stdout, "OK\n");
    assert_eq!(find("etcdctl get foo").stdout, "foo\nbar3\n");
    assert_eq!(find("etcdctl get foo --rev=2").stdout, "foo\nbar\n");
    assert_eq!(find("etcdctl del foo --prefix --prev-kv").code, Some(0));
    let compacted = find("etcdctl get foo --rev=4");
    assert_eq!(compacted.code, Some(1));
    assert!(
        compacted
            .stderr
            .contains("etcdserver: mvcc: required revision has been compacted"),
        "{compacted:?}"
    );
    assert_eq!(
        find("etcdctl lease timetolive {L1} --keys").stdout,
        "lease <lease1> granted with TTL(60s), remaining(~s), attached keys([lk1 lk2])\n"
    );
    let txns: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.command.starts_with("etcdctl txn"))
        .map(|o| o.stdout.lines().next().unwrap_or(""))
        .collect();
    assert_eq!(txns[..2], ["SUCCESS", "FAILURE"], "{outcomes:?}");
    let watched = find("etcdctl watch  --prefix --rev=2");
    assert!(
        watched
            .stdout
            .starts_with("PUT\nfoo\nbar\nPUT\nfoo2\nbaz\n"),
        "{watched:?}"
    );
    assert!(
        watched.stdout.ends_with("PUT\nfoo~end\ndone\n"),
        "{watched:?}"
    );
}

#[test]
fn etcdctl_script_matches_stock_etcd() {
    let etcd = StockEtcd::start();
    let ephd = support::ephd(&[]);
    let (want, got) = run_both(&etcd.endpoint(), &ephd.endpoint());
    assert_script_landmarks(&want);
    assert_same_outcomes("stock etcd", &want, "ephd", &got);
}

/// Guards the normalization itself: two stock etcds must compare equal.
#[test]
fn etcdctl_script_selfcheck_etcd_vs_etcd() {
    let a = StockEtcd::start();
    let b = StockEtcd::start();
    let (want, got) = run_both(&a.endpoint(), &b.endpoint());
    assert_script_landmarks(&want);
    assert_same_outcomes("stock etcd A", &want, "stock etcd B", &got);
}

/// Extracts the unsigned number after `"key":` in a JSON text (first match).
fn json_u64(json: &str, key: &str) -> Option<u64> {
    let marker = format!("\"{key}\":");
    let tail = &json[json.find(&marker)? + marker.len()..];
    let digits: String = tail.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// Server-specific outputs (ids, versions, sizes) asserted on content.
fn check_endpoint_commands(endpoint: &str, name: &str) {
    let put = cli::run(endpoint, &strings(&["put", "k", "v"]), None);
    assert_eq!(put.stdout, "OK\n", "{put:?}");

    // endpoint status, simple format (etcdctl 3.6): "<endpoint>, <member
    // id hex>, <version>, <storage version>, <db size>, <in use>, <% not in
    // use>, <quota>, <is leader>, <is learner>, <term>, <index>, <applied>,
    // <errors>, <downgrade target>, <downgrade enabled>"
    let status = cli::run(endpoint, &strings(&["endpoint", "status"]), None);
    assert_eq!(status.code, Some(0), "{status:?}");
    let fields: Vec<&str> = status.stdout.trim_end().split(", ").collect();
    assert_eq!(fields.len(), 16, "{status:?}");
    // etcdctl is given `host:port` (see `cli::etcdctl_command`) and echoes it.
    let host_port = endpoint.strip_prefix("http://").unwrap_or(endpoint);
    assert_eq!(fields[0], host_port, "{status:?}");
    let member_id = u64::from_str_radix(fields[1], 16).expect("hex member id");
    assert_ne!(member_id, 0, "{status:?}");
    assert!(fields[2].starts_with('3'), "version {status:?}");
    assert_eq!(fields[3], "3.6.0", "storage version {status:?}");
    assert_eq!(fields[7], "2.1 GB", "etcd's default quota {status:?}");
    assert_eq!((fields[8], fields[9]), ("true", "false"), "{status:?}");

    let status = cli::run(
        endpoint,
        &strings(&["endpoint", "status", "-w", "json"]),
        None,
    );
    assert_eq!(status.code, Some(0), "{status:?}");
    let json = &status.stdout;
    assert!(
        json.contains(&format!("\"Endpoint\":\"{host_port}\"")),
        "{json}"
    );
    assert_eq!(json_u64(json, "member_id"), Some(member_id), "{json}");
    assert_eq!(json_u64(json, "leader"), Some(member_id), "{json}");
    assert_eq!(json_u64(json, "revision"), Some(2), "{json}");
    assert!(json_u64(json, "cluster_id").unwrap_or(0) != 0, "{json}");
    assert!(json_u64(json, "dbSize").unwrap_or(0) > 0, "{json}");

    // endpoint health prints to stdout in the simple format (etcdctl 3.6).
    let health = cli::run(endpoint, &strings(&["endpoint", "health"]), None);
    assert_eq!(health.code, Some(0), "{health:?}");
    let want = format!("{host_port} is healthy: successfully committed proposal: took = ");
    assert!(health.stdout.contains(&want), "{health:?}");
    let health = cli::run(
        endpoint,
        &strings(&["endpoint", "health", "-w", "json"]),
        None,
    );
    assert_eq!(health.code, Some(0), "{health:?}");
    assert!(
        health
            .stdout
            .contains(&format!("\"endpoint\":\"{host_port}\",\"health\":true")),
        "{health:?}"
    );

    // member list: "<id hex>, started, <name>, <peer urls>, <client urls>, <is learner>"
    let members = cli::run(endpoint, &strings(&["member", "list"]), None);
    assert_eq!(members.code, Some(0), "{members:?}");
    let lines: Vec<&str> = members.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{members:?}");
    let fields: Vec<&str> = lines[0].split(", ").collect();
    assert_eq!(fields.len(), 6, "{members:?}");
    assert_eq!(u64::from_str_radix(fields[0], 16).ok(), Some(member_id));
    assert_eq!(fields[1], "started", "{members:?}");
    assert_eq!(fields[2], name, "{members:?}");
    assert_eq!(fields[4], endpoint, "{members:?}");
    assert_eq!(fields[5], "false", "{members:?}");

    let members = cli::run(endpoint, &strings(&["member", "list", "-w", "json"]), None);
    assert_eq!(members.code, Some(0), "{members:?}");
    assert_eq!(json_u64(&members.stdout, "ID"), Some(member_id));
    assert!(
        members.stdout.contains(&format!("\"name\":\"{name}\"")),
        "{members:?}"
    );
    assert!(
        members
            .stdout
            .contains(&format!("\"clientURLs\":[\"{endpoint}\"]")),
        "{members:?}"
    );
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

#[test]
fn etcdctl_endpoint_and_member_commands_on_ephd() {
    let ephd = support::ephd(&["--name", "ephd-it"]);
    check_endpoint_commands(&ephd.endpoint(), "ephd-it");
}

/// Validates `check_endpoint_commands` itself against the reference.
#[test]
fn etcdctl_endpoint_and_member_commands_on_stock_etcd() {
    let etcd = StockEtcd::start();
    check_endpoint_commands(&etcd.endpoint(), "default");
}
