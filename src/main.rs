//! The `ephd` server binary.

#![forbid(unsafe_code)]

use ephd::config::{self, Config, LoadError, Notice};
use ephd::logging::LogOutputs;
use ephd::server::Server;
use std::process::ExitCode;

/// jemalloc returns freed memory to the system (after compaction, lease
/// expiry) and fragments less than glibc's allocator under the many small,
/// long-lived allocations of the store.
///
/// Its built-in options are compiled in: `.cargo/config.toml` sets
/// `JEMALLOC_SYS_WITH_MALLOC_CONF`, which tikv-jemalloc-sys's build script
/// reads (the `_RJEM_MALLOC_CONF` environment variable still overrides them
/// at run time).
///
/// `oversize_threshold:0`: by default jemalloc gives allocations of 8 MiB and
/// more a dedicated arena that returns their pages to the kernel as soon as
/// they are freed. A large Range response then page-faults its whole encode
/// buffer in, and unmaps it again, on every request, which cost a large share
/// of the server's CPU on the `range` workload (figures in BENCHMARKS.md).
/// Without that arena, freed large buffers stay for reuse and go back to the
/// kernel through jemalloc's normal time-based decay.
///
/// `background_thread:true`: that decay (freed pages go back to the kernel
/// over `dirty_decay_ms`, 10 s by default) only runs when something drives
/// it. Without background threads only allocations do, so a server that
/// goes idle after a burst keeps the burst's memory: 2.1 GB of RSS a minute
/// after 200 concurrent lists of a 10 MB prefix, 275 MB after compacting
/// 148 MB of history down to 1.5 MB. With jemalloc's background threads
/// (one per arena in use, asleep between purges) RSS was back to 40 MB and
/// 54 MB ten seconds later (21 MB once the change log also gave its buffer
/// back), at the same put, lease-heartbeat and range throughput
/// (`bench/memory-return.sh`; bench/results/memory-return-20261130/).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ephd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(serve())
}

/// The multi-threaded tokio runtime, with the LIFO slot off when the build
/// allows it (`--cfg tokio_unstable`, set in `.cargo/config.toml`).
///
/// With the slot on, a finished request wakes its connection task straight
/// into the slot, so the connection writes every response with its own
/// `writev` before the next ready request runs. With it off, the connection
/// task queues behind the requests that are already ready and flushes their
/// responses together, which costs less server CPU per request without
/// adding latency (measured in BENCHMARKS.md).
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    builder.build()
}

async fn serve() -> ExitCode {
    let loaded = match config::load() {
        Ok(l) => l,
        Err(LoadError::Clap(e)) => e.exit(),
        Err(LoadError::Invalid(m)) => {
            eprintln!("ephd: {m}");
            return ExitCode::from(2);
        }
    };
    let config = loaded.config;
    let outputs = match LogOutputs::open(&config.log_outputs) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ephd: {e}");
            return ExitCode::from(2);
        }
    };
    ephd::logging::init(&config, outputs);
    log_startup(&config);
    for notice in loaded.notices {
        match notice {
            Notice::Info(m) => tracing::info!("{m}"),
            Notice::Warn(m) => tracing::warn!("{m}"),
        }
    }
    // From here on errors go through the logger, so that with
    // `--logger=zap` even the last line is a JSON object.
    let server = match Server::bind(config).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("ephd: {e}");
            return ExitCode::from(2);
        }
    };
    match server.run(shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("ephd: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The first line: what runs (ephd's version and the etcd version it
/// reports to clients, on what) and with which settings, each under its
/// flag's name, however it was given.
fn log_startup(config: &Config) {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    tracing::info!(
        "ephd-version" = env!("CARGO_PKG_VERSION"),
        "etcd-version" = ephd::api::ETCD_VERSION,
        os = std::env::consts::OS,
        arch = std::env::consts::ARCH,
        "max-cpu-available" = cpus,
        pid = std::process::id(),
        config = %config.effective(),
        "starting ephd"
    );
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down");
}
