//! CPU and memory sampling from /proc: the server's (`--server-pid`) and
//! this process's CPU time around the measured phase, the share of the
//! machine that other processes took meanwhile, and the server's peak RSS.
//! CPU per op is the figure that stays comparable while the client and the
//! server share the machine's cores.

use std::time::Instant;

fn clk_tck() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Peak resident set size (VmHWM) of a process, in MiB.
pub fn peak_rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Busy time of all CPUs (user, nice, system, irq, softirq, steal), in ticks.
fn machine_busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let f: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal
    Some(
        [0, 1, 2, 5, 6, 7]
            .iter()
            .map(|&i| f.get(i).copied().unwrap_or(0))
            .sum(),
    )
}

/// CPU time of the server (if sampled), of this process and of the whole
/// machine at one moment.
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    server: Option<u64>,
    client: Option<u64>,
    machine: Option<u64>,
    at: Instant,
}

/// CPU used between two samples.
#[derive(Debug, Clone, Copy)]
pub struct CpuDelta {
    /// Server CPU seconds, if sampled.
    pub server_s: Option<f64>,
    /// This process's CPU seconds.
    pub client_s: Option<f64>,
    /// Share of all CPUs used by everything else (0..1): above ~0.1 the
    /// run was probably disturbed.
    pub other_frac: Option<f64>,
}

impl CpuSample {
    /// Samples now.
    pub fn take(server_pid: Option<u32>) -> Self {
        CpuSample {
            server: server_pid.and_then(|p| cpu_ticks(&p.to_string())),
            client: cpu_ticks("self"),
            machine: machine_busy_ticks(),
            at: Instant::now(),
        }
    }

    /// CPU used between `self` and `later`.
    pub fn delta(&self, later: &CpuSample) -> CpuDelta {
        let hz = clk_tck() as f64;
        let d = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / hz),
            _ => None,
        };
        let (server_s, client_s) = (d(self.server, later.server), d(self.client, later.client));
        let wall = later.at.duration_since(self.at).as_secs_f64();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let other_frac = d(self.machine, later.machine).map(|busy| {
            let other = busy - server_s.unwrap_or(0.0) - client_s.unwrap_or(0.0);
            (other.max(0.0) / (cpus * wall.max(1e-3))).min(1.0)
        });
        CpuDelta {
            server_s,
            client_s,
            other_frac,
        }
    }
}
