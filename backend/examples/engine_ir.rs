//! The engine's per-WQE work as instruction counts, which do not depend on the machine's load
//! (docs/benchmarks.md, "Where the bypass round trip's time goes"): the device bench's signaled
//! 64-byte RDMA WRITE on a loopback QP, posted `BATCH` at a time by a thread that yields
//! instead of spinning while it waits for the CQEs, to an engine that sleeps as soon as a pass
//! finds nothing (`spin` = 0). Neither thread busy-polls, so under
//! `valgrind --tool=callgrind --separate-threads=yes` the engine thread's instruction count is
//! its work on the WQEs plus one sleep per batch; two runs with different `WQES` give the cost
//! of one WQE as their difference divided by the difference in WQEs:
//!
//! ```sh
//! cargo build --release -p vrdma-backend --example engine_ir
//! for n in 12800 25600; do
//!   valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file=/tmp/eir.$n.%p \
//!     target/release/examples/engine_ir $n
//! done
//! ```
//!
//! Run natively it prints the mean time per WQE (which does depend on the load).
//!
//! `engine_ir [WQES [BATCH]]`, defaults 12800 and 128 (`BATCH` ≤ 256, the SQ's size).

use std::time::{Duration, Instant};

use vrdma_backend::device::testkit::Loopback;
use vrdma_backend::device::Device;

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u32>());
    let wqes = args.next().unwrap_or(Ok(12_800)).expect("WQES: a number");
    let batch = args.next().unwrap_or(Ok(128)).expect("BATCH: a number");
    assert!((1..=256).contains(&batch), "BATCH must be 1..=256");
    let l = Loopback::with_spin(4096, Duration::ZERO);
    let w = l.write_wqe(64);
    let Loopback {
        dev,
        mut cq,
        mut qp,
        ..
    } = l;
    let start = Instant::now();
    let mut left = wqes;
    while left > 0 {
        let n = left.min(batch);
        for _ in 0..n {
            qp.sq.write(&w).expect("SQ has room");
        }
        if qp.sq.publish_and_check_kick(&mut qp.kick) {
            dev.kick(qp.ch);
        }
        for _ in 0..n {
            while cq.poller.poll_raw().is_none() {
                std::thread::yield_now();
            }
        }
        left -= n;
    }
    let t = start.elapsed();
    println!(
        "{wqes} WQEs in batches of {batch}: {:.1} ns per WQE",
        t.as_nanos() as f64 / f64::from(wqes.max(1))
    );
}
