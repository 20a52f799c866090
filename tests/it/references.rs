//! The reference programs built from published Go modules by
//! scripts/install-references.sh (scripts/test.sh runs it): stock etcd and
//! etcdctl 3.6 and 3.7, kine, kube-apiserver, and our Go drivers built on
//! etcd's and Kubernetes' own clients.
//!
//! A test that needs one and does not find it fails with the command that
//! builds it; it never skips.

use std::path::PathBuf;

/// The etcd release every differential test compares ephd with: the one
/// kube-apiserver 1.34 and later ship with.
pub const ETCD: &str = "etcd-3.6";

/// etcdctl of [`ETCD`]'s release.
pub const ETCDCTL: &str = "etcdctl-3.6";

/// Where install-references.sh puts its binaries: `$EPHD_REFERENCES/bin`,
/// by default `~/.cache/ephd/references/bin`.
pub fn dir() -> PathBuf {
    let base = std::env::var_os("EPHD_REFERENCES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache/ephd/references")
        });
    base.join("bin")
}

/// The path of reference binary `name` (for example [`ETCD`]); panics with
/// the command that builds it when it is missing.
pub fn binary(name: &str) -> PathBuf {
    let path = dir().join(name);
    assert!(
        path.is_file(),
        "reference binary {} is missing: run scripts/install-references.sh \
         (scripts/test.sh runs it) to build it from its Go module",
        path.display()
    );
    path
}

/// Debian's etcd 3.4 (`etcd` on the PATH, installed by
/// scripts/install-etcd.sh, which scripts/test.sh runs), for the few cases
/// that still compare with 3.4's own answers: its log lines for
/// configuration, and its reconfiguration checks. Panics with the command
/// that installs it when it is missing.
pub fn debian_etcd_34() -> PathBuf {
    let found = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("etcd"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "Debian's etcd 3.4 is missing from the PATH: run scripts/install-etcd.sh \
             (scripts/test.sh runs it)"
        )
    })
}

/// Stock etcd of the differential reference release.
pub fn etcd() -> PathBuf {
    binary(ETCD)
}

/// Stock etcdctl of the differential reference release.
pub fn etcdctl() -> PathBuf {
    binary(ETCDCTL)
}
