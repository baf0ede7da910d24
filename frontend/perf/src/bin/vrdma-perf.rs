//! `vrdma-perf`: perftest-style RDMA benchmarks over vrdma. Run the server in one guest
//! (`vrdma-perf send_lat`) and the client in another (`vrdma-perf send_lat HOST`); see
//! `vrdma-perf --help` and docs/benchmarks.md.

use std::process::ExitCode;

use clap::Parser;
use vrdma_perf::PerfArgs;

fn main() -> ExitCode {
    vrdma_perf::init_tracing();
    let args = PerfArgs::parse();
    match vrdma_perf::run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vrdma-perf: {e:#}");
            ExitCode::FAILURE
        }
    }
}
