//! `ephd-bench`: a load generator for any etcd v3 endpoint (ephd or stock
//! etcd), speaking the wire protocol with ephd's protos (no etcd-client
//! layer in the way): unary KV calls through the lean HTTP/2 client in
//! `h2rpc` (or tonic's, with `--transport tonic`), streams through tonic.
//!
//! Workloads are Kubernetes-shaped: plain puts, node-lease heartbeats (CAS
//! updates with a checking watch), event churn (creates with shared leases),
//! full-prefix lists, and watch fan-out. Each run prints throughput, latency
//! percentiles, errors, watch delivery checks and, with `--server-pid`, the
//! server's CPU per op and peak RSS; `--json` prints one JSON line instead.
//! Every loop is bounded by `--total`/`--duration` and `--max-time`; only
//! loopback endpoints are accepted. See bench/README.md.
//!
//! `soak` is not a benchmark: it starts its own ephd and injects faults
//! under the Kubernetes write mix, checking every acknowledged write and
//! watch event (bench/README.md, "Fault soak").
//!
//! Layout: `workload/` has one module per subcommand, each saying only what
//! one op of one client is and what it reports; `soak/` is the fault soak; `driver` runs every
//! workload's phases (budget, client tasks, progress, CPU samples, the
//! report's common fields). Beneath them: `options` (the shared flags),
//! `pool` (connections, loopback check, the KV transport switch), `h2rpc`
//! (the lean unary client), `budget`, `record`, `cpu`, `progress`, `keys`,
//! `ops` (request shapes), `watchcheck` (checking watchers) and `report`.

mod budget;
mod cpu;
mod driver;
mod h2rpc;
mod keys;
mod ops;
mod options;
mod pool;
mod progress;
mod record;
mod report;
mod soak;
mod watchcheck;
mod workload;

use clap::Parser;
use options::Common;
use std::process::ExitCode;
use std::time::Duration;
use workload::Workload;

/// jemalloc, as in the server: every request allocates a little (h2 stream
/// state, header maps, the decoded reply), and glibc's allocator was a
/// visible share of the client's CPU per op.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser, Debug)]
#[command(
    name = "ephd-bench",
    version,
    about = "Load generator for etcd v3 endpoints (ephd or stock etcd); loopback only",
    after_help = "Exit status: 0 ok; 1 setup failure; 2 hard time limit; 3 the run had request errors or watch anomalies (lost, out-of-order, duplicate events), or the soak found violations."
)]
struct Cli {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    workload: Workload,
}

async fn run(cli: &Cli) -> Result<report::Report, String> {
    let c = &cli.common;
    let mut r = cli.workload.run(c).await?;
    r.label = c.label.clone();
    if r.endpoints.is_empty() {
        r.endpoints = c.endpoints.join(",");
    }
    // A workload that does not use the KV transport switch says what it uses.
    if r.transport.is_empty() {
        r.transport = c.transport.name();
    }
    r.client_threads = c.threads();
    r.rate = c.rate;
    Ok(r)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // One thread by default: see `Common::threads`.
    let threads = cli.common.threads();
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    builder.enable_all();
    let rt = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ephd-bench: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    // Setup, measurement and drain are each bounded; this is the backstop.
    let c = &cli.common;
    let hard = c.max_time * 3 + c.drain_timeout + Duration::from_secs(60);
    let outcome = rt.block_on(async { tokio::time::timeout(hard, run(&cli)).await });
    // Watch streams and tickers may still be running: do not wait for them.
    rt.shutdown_background();
    match outcome {
        Ok(Ok(report)) => {
            if c.json {
                println!("{}", report.json());
            } else {
                print!("{}", report.human());
            }
            if report.failed() {
                ExitCode::from(3)
            } else {
                ExitCode::SUCCESS
            }
        }
        Ok(Err(e)) => {
            eprintln!("ephd-bench: {e}");
            ExitCode::from(1)
        }
        Err(_) => {
            eprintln!("ephd-bench: gave up after the hard time limit of {hard:?}");
            ExitCode::from(2)
        }
    }
}
