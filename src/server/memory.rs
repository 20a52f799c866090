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
//! (watch buffers, connections, the allocator's own slack). The space quota
//! itself, `--quota-backend-bytes`, is etcd's: counted in etcd's backend
//! measure (`mvcc/backend_size.rs`), etcd's 2 GiB by default, and checked
//! beside the memory bound:
//!
//! | share | default | flag |
//! |---|---|---|
//! | stored data (accounted store memory) | 40% of the limit, at most 8 GiB | `--quota-backend-bytes` < 0 turns it off |
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
/// etcd's `--quota-backend-bytes` when not given: 2 GiB.
const ETCD_DEFAULT_QUOTA: i64 = 2 << 30;
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
    /// What the store checks writes against: the space quota
    /// (`--quota-backend-bytes`, etcd's 2 GiB when 0, the default) and the
    /// stored data's share of the limit; both `None` when
    /// `--quota-backend-bytes` < 0.
    pub space: SpaceBounds,
    /// Bytes of Range responses allowed in flight at once.
    pub response_bytes: u64,
}

impl MemoryPlan {
    /// Applies the flags to `limit`.
    pub fn new(config: &Config, limit: MemoryLimit) -> MemoryPlan {
        let off = config.quota_backend_bytes < 0;
        let quota_bytes = match config.quota_backend_bytes {
            q if q < 0 => None,
            0 => Some(ETCD_DEFAULT_QUOTA),
            q => Some(q),
        };
        let memory_bound_bytes = (!off).then(|| (limit.bytes / 5 * 2).min(8 * GIB) as i64);
        let response_bytes = match config.max_response_bytes_in_flight {
            0 => (limit.bytes / 5).clamp(64 * MIB, 2 * GIB),
            n => n,
        };
        MemoryPlan {
            limit,
            space: SpaceBounds {
                quota_bytes,
                memory_bound_bytes,
            },
            response_bytes,
        }
    }

    /// The largest snapshot a cluster member accepts from a peer: half
    /// the limit (see the module docs).
    pub fn peer_snapshot_bytes(&self) -> u64 {
        self.limit.bytes / 2
    }
}

/// The store's space quota and memory bound ([`MemoryPlan::space`]); the
/// default has neither.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpaceBounds {
    /// `--quota-backend-bytes`, in etcd's backend measure.
    pub quota_bytes: Option<i64>,
    /// The stored data's share of the memory limit, in accounted memory.
    pub memory_bound_bytes: Option<i64>,
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

/// The memory limit of this process's cgroup: the smallest limit on the
/// path from its own cgroup (`/proc/self/cgroup`) up to the mount root,
/// since a parent's limit binds every child. v2's `memory.max` first;
/// else v1's `memory.limit_in_bytes` under the memory controller's mount,
/// on the path `/proc/self/cgroup` names for that controller. `max` and
/// v1's "unlimited" (a huge number) count as no limit. A path that does
/// not exist under the mount (a container without its own cgroup
/// namespace, which sees its own cgroup at the mount root) is skipped.
fn cgroup_limit(proc_cgroup: &Path, root: &Path) -> Option<(u64, &'static str)> {
    let own = std::fs::read_to_string(proc_cgroup).unwrap_or_default();
    let v2_path = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or("/");
    if let Some(limit) = smallest_on_path(root, v2_path, "memory.max") {
        return Some((limit, "cgroup v2"));
    }
    // v1 lines are `ID:controller[,controller…]:/path`.
    let v1_path = own
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':').skip(1);
            parts.next().zip(parts.next())
        })
        .find(|(controllers, _)| controllers.split(',').any(|c| c == "memory"))
        .map_or("/", |(_, path)| path);
    smallest_on_path(&root.join("memory"), v1_path, "memory.limit_in_bytes")
        .map(|limit| (limit, "cgroup v1"))
}

/// The smallest limit in `file` in the directories from `mount/path` up to
/// `mount` itself.
fn smallest_on_path(mount: &Path, path: &str, file: &str) -> Option<u64> {
    let mut dir = mount.join(path.trim_start_matches('/'));
    let mut smallest: Option<u64> = None;
    loop {
        if let Some(limit) = std::fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|text| parse_limit(&text))
        {
            smallest = Some(smallest.map_or(limit, |s| s.min(limit)));
        }
        if dir == mount || !dir.pop() || !dir.starts_with(mount) {
            return smallest;
        }
    }
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
        assert_eq!(plan.space.memory_bound_bytes, Some((4 * GIB) as i64));
        assert_eq!(plan.space.quota_bytes, Some(2 << 30), "etcd's default");
        assert_eq!(plan.response_bytes, 2 * GIB);
        let big = MemoryPlan::new(&Config::defaults(), limit(64 * GIB));
        assert_eq!(
            big.space.memory_bound_bytes,
            Some((8 * GIB) as i64),
            "capped at 8 GiB"
        );
        let small = MemoryPlan::new(&Config::defaults(), limit(256 * MIB));
        assert_eq!(small.response_bytes, 64 * MIB, "at least 64 MiB");
    }

    #[test]
    fn a_snapshot_of_a_store_at_its_quota_fits_what_a_member_accepts() {
        for bytes in [256 * MIB, 4 * GIB, 10 * GIB, 20 * GIB, 64 * GIB] {
            let plan = MemoryPlan::new(&Config::defaults(), limit(bytes));
            assert_eq!(plan.peer_snapshot_bytes(), bytes / 2);
            assert!(plan.peer_snapshot_bytes() > plan.space.memory_bound_bytes.unwrap() as u64);
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
        assert_eq!(plan.space.quota_bytes, Some(1_000_000));
        assert_eq!(plan.space.memory_bound_bytes, Some((GIB / 5 * 2) as i64));
        assert_eq!(plan.response_bytes, 5000);
        let off = Config::parse_from(["ephd", "--quota-backend-bytes", "-1"]);
        let off = MemoryPlan::new(&off, limit(GIB));
        assert_eq!(
            (off.space.quota_bytes, off.space.memory_bound_bytes),
            (None, None)
        );
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

    /// A tree of cgroup directories under `root`, each `(path, file, limit)`.
    fn tree(root: &Path, dirs: &[(&str, &str, &str)]) {
        for (path, file, limit) in dirs {
            let dir = root.join(path);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(file), format!("{limit}\n")).unwrap();
        }
    }

    #[test]
    fn the_smallest_limit_from_the_own_cgroup_up_to_the_root_wins() {
        // v2: the pod's limit (1 GiB) binds the container's larger one.
        let v2 = tempfile::tempdir().unwrap();
        let proc_cgroup = v2.path().join("proc-cgroup");
        std::fs::write(&proc_cgroup, "0::/kubepods/pod1/ctr\n").unwrap();
        tree(
            v2.path(),
            &[
                ("kubepods", "memory.max", "max"),
                ("kubepods/pod1", "memory.max", "1073741824"),
                ("kubepods/pod1/ctr", "memory.max", "2147483648"),
            ],
        );
        assert_eq!(
            cgroup_limit(&proc_cgroup, v2.path()),
            Some((GIB, "cgroup v2"))
        );

        // v1 in a child cgroup, the memory controller mounted with another
        // one (as `cpu,memory` or on its own): the limit is read on the
        // process's own path, not only at the mount root (which has none).
        let v1 = tempfile::tempdir().unwrap();
        let proc_cgroup = v1.path().join("proc-cgroup");
        std::fs::write(
            &proc_cgroup,
            "12:pids:/user.slice\n4:memory:/user.slice/ephd\n1:name=systemd:/init.scope\n",
        )
        .unwrap();
        let unlimited = "9223372036854771712";
        tree(
            v1.path(),
            &[
                ("memory", "memory.limit_in_bytes", unlimited),
                ("memory/user.slice", "memory.limit_in_bytes", unlimited),
                (
                    "memory/user.slice/ephd",
                    "memory.limit_in_bytes",
                    "1073741824",
                ),
            ],
        );
        assert_eq!(
            cgroup_limit(&proc_cgroup, v1.path()),
            Some((GIB, "cgroup v1"))
        );
        // A parent's smaller limit binds the child's.
        tree(
            v1.path(),
            &[("memory/user.slice", "memory.limit_in_bytes", "536870912")],
        );
        assert_eq!(
            cgroup_limit(&proc_cgroup, v1.path()),
            Some((512 * MIB, "cgroup v1"))
        );
        std::fs::write(&proc_cgroup, "4:cpu,memory:/user.slice/ephd\n").unwrap();
        assert_eq!(
            cgroup_limit(&proc_cgroup, v1.path()),
            Some((512 * MIB, "cgroup v1"))
        );

        // A path the mount does not have (no cgroup namespace): the mount
        // root's limit.
        std::fs::write(&proc_cgroup, "0::/docker/abc\n").unwrap();
        let ns = tempfile::tempdir().unwrap();
        tree(ns.path(), &[("", "memory.max", "268435456")]);
        assert_eq!(
            cgroup_limit(&proc_cgroup, ns.path()),
            Some((256 * MIB, "cgroup v2"))
        );
    }
}
