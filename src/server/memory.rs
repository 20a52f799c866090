//! How much memory ephd may use, and how it is shared out.
//!
//! ephd keeps everything in memory, so the two things that can grow without
//! a client's help, the stored data and the responses being built, get
//! bounds derived from the memory the process may really use: the cgroup
//! limit of its container when there is one (v2 `memory.max`, or v1
//! `memory.limit_in_bytes`), else the machine's `MemTotal`. Explicit flags
//! override both shares.
//!
//! The default split leaves room for what is not bounded by either share
//! (watch buffers, connections, the allocator's own slack):
//!
//! | share | default | flag |
//! |---|---|---|
//! | space quota (accounted store memory) | 40% of the limit, at most 8 GiB | `--quota-backend-bytes` |
//! | Range responses built and in flight | 20% of the limit, 64 MiB to 2 GiB | `--max-response-bytes-in-flight` |
//!
//! In cluster mode a member catching up receives a snapshot of the whole
//! store into one buffer and then decodes it beside that buffer; one over
//! half the limit could never be installed, so that is the most a member
//! accepts ([`MemoryPlan::peer_snapshot_bytes`]), checked before it
//! allocates anything. A snapshot of a store within the default quota
//! (40%) stays below it.

use crate::config::Config;
use std::path::Path;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// The memory the process may use and where that figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimit {
    /// Bytes.
    pub bytes: u64,
    /// `cgroup v2`, `cgroup v1`, `MemTotal` or `assumed`.
    pub source: &'static str,
}

/// The bounds in force, derived from the limit and the flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    /// What the shares were derived from.
    pub limit: MemoryLimit,
    /// The space quota; `None` when turned off (`--quota-backend-bytes` < 0).
    pub quota_bytes: Option<i64>,
    /// Bytes of Range responses allowed in flight at once.
    pub response_bytes: u64,
}

impl MemoryPlan {
    /// Applies the flags to `limit`.
    pub fn new(config: &Config, limit: MemoryLimit) -> MemoryPlan {
        let quota_bytes = match config.quota_backend_bytes {
            q if q < 0 => None,
            0 => Some((limit.bytes / 5 * 2).min(8 * GIB) as i64),
            q => Some(q),
        };
        let response_bytes = match config.max_response_bytes_in_flight {
            0 => (limit.bytes / 5).clamp(64 * MIB, 2 * GIB),
            n => n,
        };
        MemoryPlan {
            limit,
            quota_bytes,
            response_bytes,
        }
    }

    /// The largest snapshot a cluster member accepts from a peer: half
    /// the limit (see the module docs).
    pub fn peer_snapshot_bytes(&self) -> u64 {
        self.limit.bytes / 2
    }
}

/// The memory this process may use, read from the system.
pub fn memory_limit() -> MemoryLimit {
    let total = meminfo_total(Path::new("/proc/meminfo"));
    let cgroup = cgroup_limit(Path::new("/proc/self/cgroup"), Path::new("/sys/fs/cgroup"));
    pick(total, cgroup)
}

/// The smaller of the machine's memory and the cgroup limit; 4 GiB when
/// neither can be read (a non-Linux build).
fn pick(total: Option<u64>, cgroup: Option<(u64, &'static str)>) -> MemoryLimit {
    match (total, cgroup) {
        (Some(t), Some((c, source))) if c < t => MemoryLimit { bytes: c, source },
        (Some(t), _) => MemoryLimit {
            bytes: t,
            source: "MemTotal",
        },
        (None, Some((c, source))) => MemoryLimit { bytes: c, source },
        (None, None) => MemoryLimit {
            bytes: 4 * GIB,
            source: "assumed",
        },
    }
}

fn meminfo_total(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The memory limit of this process's cgroup: v2's `memory.max` in the
/// process's own cgroup directory (or the mount root, as containers see
/// it), else v1's `memory.limit_in_bytes`. `max` and v1's "unlimited"
/// (a huge number) count as no limit.
fn cgroup_limit(proc_cgroup: &Path, root: &Path) -> Option<(u64, &'static str)> {
    let own = std::fs::read_to_string(proc_cgroup).unwrap_or_default();
    let v2_path = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_start_matches('/'));
    let mut v2_candidates = Vec::new();
    if let Some(p) = v2_path.filter(|p| !p.is_empty()) {
        v2_candidates.push(root.join(p).join("memory.max"));
    }
    v2_candidates.push(root.join("memory.max"));
    for path in v2_candidates {
        if let Ok(text) = std::fs::read_to_string(&path) {
            return parse_limit(&text).map(|b| (b, "cgroup v2"));
        }
    }
    let v1 = std::fs::read_to_string(root.join("memory/memory.limit_in_bytes")).ok()?;
    parse_limit(&v1).map(|b| (b, "cgroup v1"))
}

fn parse_limit(text: &str) -> Option<u64> {
    let n: u64 = text.trim().parse().ok()?;
    // cgroup v1 reports "no limit" as a page-rounded i64::MAX.
    (n < (1 << 60)).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn limit(bytes: u64) -> MemoryLimit {
        MemoryLimit {
            bytes,
            source: "MemTotal",
        }
    }

    #[test]
    fn shares_follow_the_limit_within_their_bounds() {
        let plan = MemoryPlan::new(&Config::defaults(), limit(10 * GIB));
        assert_eq!(plan.quota_bytes, Some((4 * GIB) as i64));
        assert_eq!(plan.response_bytes, 2 * GIB);
        let big = MemoryPlan::new(&Config::defaults(), limit(64 * GIB));
        assert_eq!(big.quota_bytes, Some((8 * GIB) as i64), "capped at 8 GiB");
        let small = MemoryPlan::new(&Config::defaults(), limit(256 * MIB));
        assert_eq!(small.response_bytes, 64 * MIB, "at least 64 MiB");
    }

    #[test]
    fn a_snapshot_of_a_store_at_its_quota_fits_what_a_member_accepts() {
        for bytes in [256 * MIB, 4 * GIB, 10 * GIB, 20 * GIB, 64 * GIB] {
            let plan = MemoryPlan::new(&Config::defaults(), limit(bytes));
            assert_eq!(plan.peer_snapshot_bytes(), bytes / 2);
            assert!(plan.peer_snapshot_bytes() > plan.quota_bytes.unwrap() as u64);
        }
        // The 8 GiB quota from 20 GiB up: beyond any 32-bit length.
        let big = MemoryPlan::new(&Config::defaults(), limit(20 * GIB));
        assert_eq!(big.peer_snapshot_bytes(), 10 * GIB);
    }

    #[test]
    fn flags_override_and_a_negative_quota_turns_it_off() {
        let c = Config::parse_from([
            "ephd",
            "--quota-backend-bytes",
            "1000000",
            "--max-response-bytes-in-flight",
            "5000",
        ]);
        let plan = MemoryPlan::new(&c, limit(GIB));
        assert_eq!(plan.quota_bytes, Some(1_000_000));
        assert_eq!(plan.response_bytes, 5000);
        let off = Config::parse_from(["ephd", "--quota-backend-bytes", "-1"]);
        assert_eq!(MemoryPlan::new(&off, limit(GIB)).quota_bytes, None);
    }

    #[test]
    fn the_cgroup_limit_wins_when_smaller() {
        assert_eq!(
            pick(Some(24 * GIB), Some((2 * GIB, "cgroup v2"))),
            MemoryLimit {
                bytes: 2 * GIB,
                source: "cgroup v2"
            }
        );
        assert_eq!(pick(Some(GIB), Some((2 * GIB, "cgroup v2"))), limit(GIB));
        assert_eq!(pick(None, None).source, "assumed");
    }

    #[test]
    fn cgroup_files_are_read_as_containers_lay_them_out() {
        let dir = tempfile::tempdir().unwrap();
        let proc_cgroup = dir.path().join("cgroup");
        // v2, limit in the process's own cgroup directory.
        std::fs::write(&proc_cgroup, "0::/kubepods/pod1/ctr\n").unwrap();
        let own = dir.path().join("kubepods/pod1/ctr");
        std::fs::create_dir_all(&own).unwrap();
        std::fs::write(own.join("memory.max"), "1073741824\n").unwrap();
        assert_eq!(
            cgroup_limit(&proc_cgroup, dir.path()),
            Some((GIB, "cgroup v2"))
        );
        // v2 without a limit.
        std::fs::write(own.join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_limit(&proc_cgroup, dir.path()), None);
        // v1 only.
        let v1 = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(v1.path().join("memory")).unwrap();
        std::fs::write(
            v1.path().join("memory/memory.limit_in_bytes"),
            "536870912\n",
        )
        .unwrap();
        assert_eq!(
            cgroup_limit(&v1.path().join("none"), v1.path()),
            Some((512 * MIB, "cgroup v1"))
        );
        std::fs::write(
            v1.path().join("memory/memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        assert_eq!(cgroup_limit(&v1.path().join("none"), v1.path()), None);
        assert!(meminfo_total(Path::new("/proc/meminfo")).is_some_and(|b| b > 0));
    }
}
