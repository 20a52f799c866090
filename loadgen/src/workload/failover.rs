//! `failover`: writes that must keep going while a cluster's members die.
//!
//! The load of `bench/cluster.sh`'s failover run (CLUSTER.md's benchmark
//! step): the script kills the leader of a three-member cluster again and
//! again while this runs, and reads from the report how long acknowledged
//! writes stopped each time. What it measures is what an application sees,
//! so the clients behave as a well-configured etcd client does: each
//! request has a short timeout (`--timeout`, the script passes 1 s), and a
//! client whose request fails or times out moves on to the next member in
//! `--endpoints` (cycling), instead of waiting for a dead one.
//!
//! Every acknowledged write's wall-clock time (Unix epoch, so the script
//! can set it against the times it killed members) is kept; the report
//! gives the gaps between consecutive acknowledgements that are at least
//! `--gap-min` long, the longest of them, and the first and last
//! acknowledgement. The run ends at `--duration` or `--total`, or earlier
//! on SIGTERM/SIGINT (the script stops it once its kills are done): the
//! clients stop issuing, finish what is in flight, and the report is
//! printed as usual.

use crate::driver::{measure_keeping_workers, Shape, Worker};
use crate::keys::{padded_key, value_with};
use crate::options::{parse_duration, Common};
use crate::pool::{call, resolve_endpoint};
use crate::record::Recorder;
use crate::report::{r3, Report};
use bytes::Bytes;
use ephd::proto::etcdserverpb::{kv_client::KvClient, PutRequest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tonic::transport::{Channel, Endpoint};

/// At most this many gaps are listed in the report (the longest are kept).
const MAX_LISTED_GAPS: usize = 2_000;

/// Options of `failover`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Key prefix (counted in --key-size).
    #[arg(long, default_value = "/bench/failover/")]
    pub prefix: String,
    /// List every gap between consecutive acknowledged writes at least
    /// this long (the longest gap is reported whatever its length).
    #[arg(long, value_parser = parse_duration, default_value = "50ms")]
    pub gap_min: Duration,
}

/// One client: a Put of a random key per op, on its current member; on a
/// failure or timeout it moves to the next member.
struct Writer {
    /// One KV client per member, in `--endpoints` order.
    members: Vec<KvClient<Channel>>,
    at: usize,
    rng: StdRng,
    prefix: Arc<str>,
    value: Bytes,
    key_space: u64,
    key_size: usize,
    timeout: Duration,
    stop: Arc<AtomicBool>,
    /// Acknowledgement times, µs since the Unix epoch.
    acks: Vec<u64>,
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Worker for Writer {
    async fn op(&mut self, _n: u64, rec: &mut Recorder) -> ControlFlow<()> {
        if self.stop.load(Ordering::Relaxed) {
            return ControlFlow::Break(());
        }
        let k = self.rng.random_range(0..self.key_space);
        let req = PutRequest {
            key: padded_key(&self.prefix, k, self.key_size),
            value: self.value.clone(),
            ..Default::default()
        };
        let t0 = Instant::now();
        let kv = &mut self.members[self.at];
        match call(self.timeout, kv.put(req)).await {
            Ok(_) => {
                rec.ok(t0);
                self.acks.push(unix_us());
            }
            Err(e) => {
                rec.err(&e);
                self.at = (self.at + 1) % self.members.len();
                rec.count("member_switches", 1);
            }
        }
        ControlFlow::Continue(())
    }
}

/// Gaps of at least `min_us` between consecutive times of `acks` (sorted),
/// plus the leading and trailing stretches of the phase `[start, end]`
/// without an acknowledgement, as `(from, to)` pairs in µs.
fn gaps(acks: &[u64], start: u64, end: u64, min_us: u64) -> Vec<(u64, u64)> {
    let mut points = Vec::with_capacity(acks.len() + 2);
    points.push(start);
    points.extend_from_slice(acks);
    points.push(end.max(*points.last().unwrap_or(&start)));
    points
        .windows(2)
        .filter(|w| w[1].saturating_sub(w[0]) >= min_us)
        .map(|w| (w[0], w[1]))
        .collect()
}

/// Defaults: 50 clients, writes for `--duration` (60 s unless given), key
/// 48 B, value 1 KiB, key space 10,000.
pub async fn run(c: &Common, a: &Args) -> Result<Report, String> {
    let clients = c.clients_or(50);
    let key_size = c.key_size.unwrap_or(48);
    let val_size = c.val_size_or(1024);
    let key_space = c.key_space_or(10_000);
    if c.endpoints.is_empty() {
        return Err("no endpoints given".into());
    }
    // Connections per member; they connect (and reconnect after a member
    // died and came back) lazily, on the requests that need them.
    let per_member = (c.conns() / c.endpoints.len()).max(1);
    let mut channels: Vec<Vec<Channel>> = Vec::new();
    for e in &c.endpoints {
        let addr = resolve_endpoint(e)?;
        let ep = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(c.timeout)
            .tcp_nodelay(true);
        channels.push((0..per_member).map(|_| ep.connect_lazy()).collect());
    }
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signal(stop.clone());
    let value = value_with("", val_size);
    let prefix: Arc<str> = a.prefix.as_str().into();
    let n = c.endpoints.len();
    let workers = (0..clients)
        .map(|i| Writer {
            members: channels
                .iter()
                .map(|m| KvClient::new(m[(i / n) % per_member].clone()))
                .collect(),
            at: i % n,
            rng: StdRng::seed_from_u64(rand::random()),
            prefix: prefix.clone(),
            value: value.clone(),
            key_space,
            key_size,
            timeout: c.timeout,
            stop: stop.clone(),
            acks: Vec::new(),
        })
        .collect();
    let start = unix_us();
    // The op count only applies with --total and no --duration: the
    // duration is always set here.
    let c = with_default_duration(c);
    let (m, workers) = measure_keeping_workers(&c, "failover", u64::MAX, workers).await;
    let end = unix_us();
    let mut acks: Vec<u64> = workers.into_iter().flat_map(|w| w.acks).collect();
    acks.sort_unstable();
    let mut r = m.report(
        n * per_member,
        Shape {
            key_size,
            val_size,
            key_space,
        },
    );
    let all = gaps(&acks, start, end, 0);
    let longest = all.iter().map(|(a, b)| b - a).max().unwrap_or(0);
    let mut listed = gaps(&acks, start, end, a.gap_min.as_micros() as u64);
    if listed.len() > MAX_LISTED_GAPS {
        listed.sort_unstable_by_key(|(a, b)| std::cmp::Reverse(b - a));
        listed.truncate(MAX_LISTED_GAPS);
        listed.sort_unstable();
    }
    // tonic channels whatever --transport says: they reconnect after a
    // member died and came back, the lean client does not.
    r.transport = "tonic";
    let ms = |us: u64| r3(us as f64 / 1000.0);
    r.set("start_unix_ms", ms(start));
    r.set("end_unix_ms", ms(end));
    r.set("first_ack_unix_ms", acks.first().map(|&t| ms(t)));
    r.set("last_ack_unix_ms", acks.last().map(|&t| ms(t)));
    r.set("max_gap_ms", ms(longest));
    r.set("gap_min_ms", ms(a.gap_min.as_micros() as u64));
    r.set(
        "gaps_unix_ms",
        listed
            .iter()
            .map(|&(a, b)| vec![ms(a), ms(b)])
            .collect::<Vec<_>>(),
    );
    r.set("stopped_by_signal", stop.load(Ordering::Relaxed));
    Ok(r)
}

/// `--duration 60s` when neither `--total` nor `--duration` is given: this
/// workload is meant to run for a while, not for a number of writes.
fn with_default_duration(c: &Common) -> Common {
    let mut c = c.clone();
    if c.total.is_none() && c.duration.is_none() {
        c.duration = Some(Duration::from_secs(60));
    }
    c
}

/// Sets `stop` on the first SIGTERM or SIGINT.
fn stop_on_signal(stop: Arc<AtomicBool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        stop.store(true, Ordering::Relaxed);
    });
}

#[cfg(test)]
mod tests {
    use super::gaps;

    #[test]
    fn gaps_include_the_stretches_before_the_first_and_after_the_last_ack() {
        let acks = [110, 120, 400, 410];
        assert_eq!(gaps(&acks, 100, 1_000, 50), vec![(120, 400), (410, 1_000)]);
        assert_eq!(gaps(&acks, 100, 1_000, 5).len(), 5);
        assert_eq!(gaps(&[], 100, 1_000, 50), vec![(100, 1_000)]);
    }
}
