//! `vrdma-perf`: perftest-style benchmarks over the `vrdma` library (`send_lat`, `write_lat`,
//! `read_lat`, `send_bw`, `write_bw`, `read_bw`), with in-run baselines. A guest tool: it
//! links the `vrdma` library only; `vrdma-demo` (crate `demo/`) runs it across two guest
//! domains of an embedded simulated Xen host. `tcp_pingpong` and `tcp_stream` run the raw TCP
//! baselines alone ([`tcp`]). See docs/benchmarks.md, "vrdma-perf".

pub mod baseline;
pub mod run;
pub mod stats;
pub mod tcp;

pub use run::{run, PerfArgs, Report, Test, DEFAULT_PORT};

/// Sets up `tracing` to stderr (default filter `warn`, `RUST_LOG` overrides).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
}
