//! The logic of ephd's fuzz targets, one module per target.
//!
//! `fuzz/` (cargo-fuzz's crate) needs nightly-only compiler flags and
//! libFuzzer; this crate needs neither, so the targets' logic lives here and
//! each fuzz target is a single call into it. That keeps the harness
//! compiled, linted and tested by the ordinary `cargo test --workspace`:
//! `tests/replay.rs` runs every checked-in seed and every past crash input
//! (`fuzz/seeds/`, `fuzz/regressions/`) through the same functions.
//!
//! Each `run` function takes the fuzzer's bytes and panics when it finds
//! something wrong; returning normally means the input was fine (including
//! when ephd rightly refused it).
//!
//! * [`decode`]: bytes → every request message the server decodes, through
//!   the server's own decoder, and (when it decodes) through the real
//!   service handlers against a small store. Nothing may panic, and every
//!   error must be one etcd's clients know.
//! * [`store_ops`]: bytes → a sequence of store operations, each checked
//!   against the small reference model in [`model`].
//! * [`snapshot`]: bytes → the snapshot reader; valid snapshots read back
//!   exactly, damaged ones are refused whole.
//! * [`etcd_db`]: bytes → the reader of etcd's database format; nothing
//!   may panic, and what it accepts obeys etcd's rules.

pub mod decode;
pub mod etcd_db;
pub mod model;
pub mod seeds;
pub mod snapshot;
pub mod store_ops;

/// The names of the fuzz targets, as `fuzz/Cargo.toml` and the directories
/// under `fuzz/seeds/` and `fuzz/regressions/` spell them.
pub const TARGETS: [&str; 4] = ["decode_requests", "store_ops", "snapshot", "etcd_db"];

/// The stack of the threads that decode and serve requests in the server:
/// tokio's default for worker threads, which ephd does not change. The
/// decode target runs on a thread this size, so a recursion the server's
/// workers could not afford crashes the fuzzer too.
pub const SERVER_STACK: usize = 2 << 20;

/// Runs fuzz target `target` on one input (what the fuzz target itself and
/// the replay test call).
pub fn run(target: &str, data: &[u8]) {
    match target {
        "decode_requests" => on_server_stack(|| decode::run(data)),
        "store_ops" => store_ops::run(data),
        "snapshot" => snapshot::run(data),
        "etcd_db" => etcd_db::run(data),
        other => panic!("no fuzz target called {other}"),
    }
}

/// Runs `f` on a thread with [`SERVER_STACK`]; its panic becomes ours.
fn on_server_stack(f: impl FnOnce() + Send) {
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("fuzz-worker".into())
            .stack_size(SERVER_STACK)
            .spawn_scoped(scope, f)
            .expect("spawn a worker thread");
        if let Err(panic) = worker.join() {
            std::panic::resume_unwind(panic);
        }
    });
}
