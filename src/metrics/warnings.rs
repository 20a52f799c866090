//! Rate-limited WARN lines about requests an operator should hear of:
//!
//! * **shed**: no room for the request now (`ResourceExhausted` "etcdserver:
//!   too many requests", from the overload limits); the client retries.
//! * **rejected**: the server refused the request or failed it: every code
//!   except `OK`, `Canceled` (the client went away), `NotFound` (a lease
//!   that is gone) and `OutOfRange` (a compacted or future revision), which
//!   are ordinary answers to valid requests.
//! * **slow**: a unary call that took longer than the threshold
//!   (`--experimental-warning-apply-duration`, 100 ms by default as in
//!   etcd), measured by the gRPC metrics layer from the call's arrival to
//!   its status (the same span as `grpc_server_handling_seconds`), so it
//!   includes queueing and sending the response. Streams (Watch,
//!   LeaseKeepAlive, Snapshot) live as long as their clients want and are
//!   never slow.
//!
//! Each kind logs at most one line every [`EVERY`], carrying the method,
//! the gRPC code and message, the client's address, how long the call took
//! and how many calls of that kind were left unlogged since the previous
//! line. The metrics layer calls [`RequestWarnings::report`] only for calls
//! that failed or ran over the threshold: for every other call the cost is
//! one comparison of the duration it measures anyway.

use crate::config::go_duration;
use crate::error::Error;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Least time between two lines of the same kind.
pub const EVERY: Duration = Duration::from_secs(10);

/// The slow-request threshold by default: etcd's default for its "apply
/// request took too long" warning.
pub const SLOW: Duration = Duration::from_millis(100);

/// gRPC code numbers the classification needs (grpc-go's numbering).
const OK: usize = 0;
const CANCELED: usize = 1;
const NOT_FOUND: usize = 5;
const RESOURCE_EXHAUSTED: usize = 8;
const OUT_OF_RANGE: usize = 11;

/// What a warning is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Refused or failed by the server.
    Rejected,
    /// Shed with "too many requests".
    Shed,
    /// Took longer than the threshold.
    Slow,
}

/// Lets one event through at most every period and counts the others, for
/// logging from many threads at once without a lock: the first event at or
/// after the next allowed time wins a compare-and-swap.
///
/// Time is passed in (as the time since an origin the caller picks), so
/// tests drive it without sleeping.
#[derive(Debug)]
pub struct RateLimit {
    every: u64,
    next: AtomicU64,
    suppressed: AtomicU64,
}

impl RateLimit {
    /// A limiter that lets the first event through, then one per `every`.
    pub fn new(every: Duration) -> RateLimit {
        RateLimit {
            every: every.as_nanos().min(u64::MAX as u128) as u64,
            next: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether the event at `now` may be logged: `Some` with how many
    /// events were held back since the last one let through, or `None`
    /// (this one is counted as held back).
    pub fn admit(&self, now: Duration) -> Option<u64> {
        let now = now.as_nanos().min(u64::MAX as u128) as u64;
        let next = self.next.load(Ordering::Relaxed);
        if now >= next
            && self
                .next
                .compare_exchange(
                    next,
                    now.saturating_add(self.every),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// One finished call, as the metrics layer saw it.
#[derive(Debug, Clone)]
pub struct Finished<'a> {
    /// The gRPC service, `etcdserverpb.KV`.
    pub service: &'a str,
    /// The method's name, `Range`.
    pub method: &'a str,
    /// Whether the method is unary (only unary calls can be slow).
    pub unary: bool,
    /// The gRPC code's name, as grpc-go spells it.
    pub code_name: &'a str,
    /// The gRPC code's number.
    pub code: usize,
    /// The status message, when the call ended with one.
    pub message: Option<&'a str>,
    /// The client's address, when the connection has one.
    pub remote: Option<SocketAddr>,
    /// From the call's arrival to its status.
    pub took: Duration,
}

/// The request warnings of one server: the threshold and one limiter per
/// kind.
#[derive(Debug)]
pub struct RequestWarnings {
    origin: Instant,
    /// The slow threshold in nanoseconds; `u64::MAX` turns it off.
    slow: AtomicU64,
    limits: [RateLimit; 3],
}

impl Default for RequestWarnings {
    fn default() -> Self {
        RequestWarnings::new(SLOW, EVERY)
    }
}

impl RequestWarnings {
    /// Warnings for calls slower than `slow`, one line per kind per `every`.
    pub fn new(slow: Duration, every: Duration) -> RequestWarnings {
        let w = RequestWarnings {
            origin: Instant::now(),
            slow: AtomicU64::new(u64::MAX),
            limits: [
                RateLimit::new(every),
                RateLimit::new(every),
                RateLimit::new(every),
            ],
        };
        w.set_slow(slow);
        w
    }

    /// Sets the slow threshold (the server sets the configured one once);
    /// zero turns slow-request warnings off.
    pub fn set_slow(&self, slow: Duration) {
        let nanos = if slow.is_zero() {
            u64::MAX
        } else {
            slow.as_nanos().min(u64::MAX as u128) as u64
        };
        self.slow.store(nanos, Ordering::Relaxed);
    }

    /// Whether a call that ended with `code` after `took` needs a look by
    /// [`RequestWarnings::report`]: the one test on every call's path.
    #[inline]
    pub fn worth_a_look(&self, code: usize, took: Duration) -> bool {
        code != OK || took.as_nanos() > self.slow.load(Ordering::Relaxed) as u128
    }

    /// What `call` is worth warning about, if anything.
    pub fn classify(&self, call: &Finished<'_>) -> Option<Kind> {
        if call.code == RESOURCE_EXHAUSTED && call.message == Some(Error::TooManyRequests.message())
        {
            return Some(Kind::Shed);
        }
        if !matches!(call.code, OK | CANCELED | NOT_FOUND | OUT_OF_RANGE) {
            return Some(Kind::Rejected);
        }
        let slow = call.took.as_nanos() > self.slow.load(Ordering::Relaxed) as u128;
        (call.unary && slow).then_some(Kind::Slow)
    }

    /// Logs `call` if it is worth a warning and its kind's limiter lets it.
    pub fn report(&self, call: &Finished<'_>) {
        self.report_at(call, self.origin.elapsed());
    }

    /// [`RequestWarnings::report`] at `now` (time since this value was
    /// made); returns what was logged: the kind and how many calls of that
    /// kind were held back before it.
    pub fn report_at(&self, call: &Finished<'_>, now: Duration) -> Option<(Kind, u64)> {
        let kind = self.classify(call)?;
        let suppressed = self.limits[kind as usize].admit(now)?;
        let took = go_duration(call.took);
        let took = took.as_str();
        let remote = call.remote.map(tracing::field::display);
        // The gRPC path, as clients and grpc-go's logs name a method.
        let method = format!("/{}/{}", call.service, call.method);
        let method = method.as_str();
        let (code, error) = (call.code_name, call.message);
        match kind {
            Kind::Shed => tracing::warn!(
                method,
                code,
                error,
                remote,
                took,
                suppressed,
                "request shed: no room for it now, the client retries"
            ),
            Kind::Rejected => tracing::warn!(
                method,
                code,
                error,
                remote,
                took,
                suppressed,
                "request rejected"
            ),
            Kind::Slow => {
                let slow = Duration::from_nanos(self.slow.load(Ordering::Relaxed));
                tracing::warn!(
                    method,
                    code,
                    error,
                    remote,
                    took,
                    "expected-duration" = %go_duration(slow),
                    suppressed,
                    "request took too long"
                )
            }
        }
        Some((kind, suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_limiter_lets_one_event_through_per_period_and_counts_the_rest() {
        let l = RateLimit::new(Duration::from_secs(10));
        assert_eq!(l.admit(secs(0.0)), Some(0), "the first event is logged");
        assert_eq!(l.admit(secs(0.1)), None);
        assert_eq!(l.admit(secs(5.0)), None);
        assert_eq!(l.admit(secs(9.999)), None);
        assert_eq!(l.admit(secs(10.0)), Some(3), "three held back");
        assert_eq!(l.admit(secs(19.0)), None);
        // A quiet spell: the next event is logged at once, with the count
        // of the last period.
        assert_eq!(l.admit(secs(100.0)), Some(1));
        assert_eq!(l.admit(secs(111.0)), Some(0));
    }

    #[test]
    fn many_threads_log_once_per_period_and_lose_no_count() {
        let l = std::sync::Arc::new(RateLimit::new(Duration::from_secs(10)));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    (0..1000)
                        .filter_map(|_| l.admit(secs(1.0)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let admitted: Vec<u64> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        assert_eq!(admitted.len(), 1, "{admitted:?}");
        // Events held back while the winner was being let through may be
        // counted in its line or in the next one, never lost.
        let next = l.admit(secs(11.0)).unwrap();
        assert_eq!(admitted[0] + next, 3999);
    }

    fn call(
        code: usize,
        message: Option<&'static str>,
        unary: bool,
        took: f64,
    ) -> Finished<'static> {
        Finished {
            service: "etcdserverpb.KV",
            method: "Range",
            unary,
            code_name: crate::metrics::grpc::CODES[code],
            code,
            message,
            remote: Some("127.0.0.1:40000".parse().unwrap()),
            took: secs(took),
        }
    }

    #[test]
    fn calls_are_classified_as_operators_need() {
        let w = RequestWarnings::new(SLOW, EVERY);
        let shed = Some("etcdserver: too many requests");
        assert_eq!(w.classify(&call(8, shed, true, 0.0)), Some(Kind::Shed));
        let nospace = Some("etcdserver: mvcc: database space exceeded");
        assert_eq!(
            w.classify(&call(8, nospace, true, 0.0)),
            Some(Kind::Rejected)
        );
        let too_large = Some("etcdserver: request is too large");
        assert_eq!(
            w.classify(&call(3, too_large, true, 0.0)),
            Some(Kind::Rejected)
        );
        assert_eq!(
            w.classify(&call(14, None, false, 0.0)),
            Some(Kind::Rejected)
        );
        // Ordinary answers are not worth a line, unless they were slow.
        for code in [0, 1, 5, 11] {
            assert_eq!(w.classify(&call(code, None, true, 0.05)), None, "{code}");
            assert_eq!(w.classify(&call(code, None, true, 0.2)), Some(Kind::Slow));
        }
        // A stream is never slow; a slow failure is reported as a failure.
        assert_eq!(w.classify(&call(0, None, false, 3600.0)), None);
        assert_eq!(w.classify(&call(8, shed, true, 20.0)), Some(Kind::Shed));
        assert!(!w.worth_a_look(0, secs(0.1)), "over, not at, the threshold");
        assert!(w.worth_a_look(0, secs(0.100_001)));
        assert!(w.worth_a_look(1, secs(0.0)));
        w.set_slow(Duration::ZERO);
        assert_eq!(
            w.classify(&call(0, None, true, 1e6)),
            None,
            "0 turns it off"
        );
        assert!(!w.worth_a_look(0, secs(1e6)));
    }

    #[test]
    fn each_kind_has_its_own_limiter() {
        let w = RequestWarnings::new(SLOW, EVERY);
        let shed = call(8, Some("etcdserver: too many requests"), true, 0.0);
        let rejected = call(3, Some("etcdserver: request is too large"), true, 0.0);
        let slow = call(0, None, true, 0.5);
        assert_eq!(w.report_at(&shed, secs(0.0)), Some((Kind::Shed, 0)));
        assert_eq!(w.report_at(&shed, secs(1.0)), None);
        assert_eq!(w.report_at(&rejected, secs(1.0)), Some((Kind::Rejected, 0)));
        assert_eq!(w.report_at(&slow, secs(1.0)), Some((Kind::Slow, 0)));
        for t in 2..9 {
            assert_eq!(w.report_at(&shed, secs(t as f64)), None);
            assert_eq!(w.report_at(&slow, secs(t as f64)), None);
        }
        assert_eq!(w.report_at(&shed, secs(10.0)), Some((Kind::Shed, 8)));
        assert_eq!(
            w.report_at(&slow, secs(10.0)),
            None,
            "its period began at 1 s"
        );
        assert_eq!(w.report_at(&slow, secs(11.0)), Some((Kind::Slow, 8)));
        // A call that is worth nothing is neither logged nor counted.
        assert_eq!(w.report_at(&call(0, None, true, 0.01), secs(30.0)), None);
        assert_eq!(
            w.report_at(&rejected, secs(30.0)),
            Some((Kind::Rejected, 0))
        );
    }
}
