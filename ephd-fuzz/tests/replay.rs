//! Replays every checked-in fuzz input through the fuzz targets' logic, so
//! plain `cargo test` (and CI, which has neither nightly nor cargo-fuzz)
//! keeps the harness compiling and correct, and keeps every crash the
//! fuzzer ever found fixed:
//! * `fuzz/seeds/<target>/`: the seed corpus (`write_seeds` makes it);
//! * `fuzz/regressions/<target>/`: every crashing input found, kept after
//!   its fix (see fuzz/README.md for how one is added).

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// Every file under `dir/<target>/`, sorted, with the target name.
fn inputs(dir: &str) -> Vec<(&'static str, PathBuf)> {
    let mut out = Vec::new();
    for target in ephd_fuzz::TARGETS {
        let Ok(entries) = std::fs::read_dir(fuzz_dir().join(dir).join(target)) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries.map(|e| e.expect("dir entry").path()).collect();
        files.sort();
        out.extend(files.into_iter().map(|f| (target, f)));
    }
    out
}

fn replay(dir: &str) -> usize {
    let inputs = inputs(dir);
    for (target, path) in &inputs {
        let data = std::fs::read(path).expect("read a fuzz input");
        eprintln!("{target}: {}", path.display());
        ephd_fuzz::run(target, &data);
    }
    inputs.len()
}

#[test]
fn generated_seeds_pass() {
    for target in ephd_fuzz::TARGETS {
        for (name, data) in ephd_fuzz::seeds::seeds(target) {
            eprintln!("{target}: {name}");
            ephd_fuzz::run(target, &data);
        }
    }
}

#[test]
fn checked_in_seeds_pass_and_are_current() {
    assert!(replay("seeds") > 0, "fuzz/seeds/ holds the seed corpus");
    for target in ephd_fuzz::TARGETS {
        for (name, data) in ephd_fuzz::seeds::seeds(target) {
            let path = fuzz_dir().join("seeds").join(target).join(&name);
            let on_disk = std::fs::read(&path).unwrap_or_default();
            assert!(
                on_disk == data,
                "{} is stale: run `cargo run -p ephd-fuzz --bin write_seeds`",
                path.display()
            );
        }
    }
}

#[test]
fn past_crashes_stay_fixed() {
    replay("regressions");
}
