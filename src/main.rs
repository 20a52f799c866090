//! The `ephd` server binary.

#![forbid(unsafe_code)]

use ephd::config::{self, LoadError, Notice};
use ephd::server::Server;
use parking_lot::Mutex;
use std::fs::File;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

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
    let filter = tracing_subscriber::EnvFilter::try_new(config.log_filter())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(!outputs.has_file())
        .with_writer(outputs)
        .init();
    for notice in loaded.notices {
        match notice {
            Notice::Info(m) => tracing::info!("{m}"),
            Notice::Warn(m) => tracing::warn!("{m}"),
        }
    }
    let server = match Server::bind(config).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ephd: {e}");
            return ExitCode::from(2);
        }
    };
    match server.run(shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ephd: {e}");
            ExitCode::FAILURE
        }
    }
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

/// Where log lines go (`--log-outputs`): each formatted event is written
/// whole to every output, so lines from concurrent threads never interleave
/// within one output.
#[derive(Clone)]
struct LogOutputs(Arc<Vec<LogOutput>>);

/// One `--log-outputs` target.
enum LogOutput {
    Stdout,
    Stderr,
    /// A file opened for appending, as etcd's zap logger does.
    File(Mutex<File>),
}

impl LogOutputs {
    /// Opens etcd's `--log-outputs` list: `default` and `stderr` (ephd has
    /// no journald output, so `default` is stderr), `stdout`, or file paths.
    fn open(names: &[String]) -> Result<LogOutputs, String> {
        let mut outputs = Vec::new();
        for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
            outputs.push(match name {
                "default" | "stderr" => LogOutput::Stderr,
                "stdout" => LogOutput::Stdout,
                path => LogOutput::File(Mutex::new(
                    File::options()
                        .create(true)
                        .append(true)
                        .open(path)
                        .map_err(|e| format!("cannot open --log-outputs file {path}: {e}"))?,
                )),
            });
        }
        if outputs.is_empty() {
            outputs.push(LogOutput::Stderr);
        }
        Ok(LogOutputs(Arc::new(outputs)))
    }

    /// Whether a file is among the outputs: files get no ANSI colours,
    /// which would only be escape codes in them.
    fn has_file(&self) -> bool {
        self.0.iter().any(|o| matches!(o, LogOutput::File(_)))
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogOutputs {
    type Writer = LogWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LogWriter(&self.0)
    }
}

/// Writes one log event to every output; an output that fails (a full
/// disk, a closed pipe) does not keep the others from getting it.
struct LogWriter<'a>(&'a [LogOutput]);

impl Write for LogWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for output in self.0 {
            let _ = match output {
                LogOutput::Stdout => std::io::stdout().write_all(buf),
                LogOutput::Stderr => std::io::stderr().write_all(buf),
                LogOutput::File(f) => f.lock().write_all(buf),
            };
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        for output in self.0 {
            let _ = match output {
                LogOutput::Stdout => std::io::stdout().flush(),
                LogOutput::Stderr => std::io::stderr().flush(),
                LogOutput::File(f) => f.lock().flush(),
            };
        }
        Ok(())
    }
}
