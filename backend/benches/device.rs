//! The software device's data path, in one process, against floors measured in the same run.
//!
//! * `bare_cache_line` — floor: `bench_support::CacheLinePingPong`, the same in every bench (two
//!   128-byte lines, one writer each; one round trip = two cache-line transfers).
//! * `post_to_cqe_64B` — the bypass round trip through the engine: the bench thread (playing
//!   the frontend with shared-ring's producer and CQ poller) posts a signaled 64-byte RDMA
//!   WRITE on a loopback QP and spins on the CQE's phase bit; the engine thread spins on the
//!   doorbell. Two threads spin (the machine has 2 cores): the bench thread and one engine.
//! * `memcpy_1MiB` — floor: single-core `copy_from_slice` of 1 MiB between private buffers.
//! * `write_1MiB` — an RDMA WRITE of 1 MiB through the engine, post to CQE.
//!
//! `cargo bench -p vrdma-backend --bench device`; ratios are printed at the end, each also as a
//! `bench-ratio` line for `scripts/bench-ratios.sh`.

use std::hint::spin_loop;
use std::time::{Duration, Instant};

use bench_support::report::{figure_line, ratio_line, RatioRecord};
use bench_support::{CacheLinePingPong, Recorder, Samples};
use criterion::{Criterion, Throughput};
use vrdma_backend::device::testkit::Loopback;
use vrdma_backend::device::Device;

static REC: Recorder = Recorder::new();

fn bare_cache_line(c: &mut Criterion) {
    let mut floor = CacheLinePingPong::start();
    c.bench_function("bare_cache_line", |b| {
        b.iter_custom(|iters| REC.record("bare_cache_line", floor.round_trips(iters), iters))
    });
}

fn round_trip(l: &mut Loopback, len: u32) {
    // Built per post and stored as words, as the `vrdma` library posts.
    let w = l.write_wqe_words(len);
    l.qp.sq.write_words(&w).unwrap();
    if l.qp.sq.publish_and_check_kick(&mut l.qp.kick) {
        l.dev.kick(l.qp.ch);
    }
    loop {
        if let Some(c) = l.cq.poller.poll_raw() {
            std::hint::black_box(c);
            return;
        }
        spin_loop();
    }
}

fn device_round_trip(c: &mut Criterion) {
    let mut l = Loopback::new(1 << 20);
    c.bench_function("post_to_cqe_64B", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                round_trip(&mut l, 64);
            }
            REC.record("post_to_cqe_64B", start.elapsed(), iters)
        })
    });
}

fn bandwidth(c: &mut Criterion) {
    const LEN: usize = 1 << 20;
    let mut g = c.benchmark_group("bandwidth");
    g.throughput(Throughput::Bytes(LEN as u64));
    let a = vec![7u8; LEN];
    let mut bbuf = vec![0u8; LEN];
    g.bench_function("memcpy_1MiB", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                bbuf.copy_from_slice(std::hint::black_box(&a));
                std::hint::black_box(&mut bbuf);
            }
            REC.record("memcpy_1MiB", start.elapsed(), iters)
        })
    });
    let mut l = Loopback::new(1 << 20);
    g.bench_function("write_1MiB", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                round_trip(&mut l, LEN as u32);
            }
            REC.record("write_1MiB", start.elapsed(), iters)
        })
    });
    g.finish();
}

fn report() {
    let floor = REC.samples("bare_cache_line");
    let rt = REC.samples("post_to_cqe_64B");
    let memcpy = REC.samples("memcpy_1MiB");
    let write = REC.samples("write_1MiB");
    // Bytes per ns = GB/s, of the medians.
    let gbs = |s: &Samples| (1u64 << 20) as f64 / s.median();
    println!(
        "\nsoftware device, spinning threads: 2 (bench thread + 1 engine thread); \
         ns per operation, medians of criterion's samples"
    );
    println!("{}", figure_line("bare cache-line round trip", &floor));
    println!("{}", figure_line("post->CQE round trip, 64 B", &rt));
    let r = RatioRecord::of("device/post_to_cqe_64B", &rt, &floor);
    println!("{}", ratio_line("  post->CQE / floor", &r, "<= 2.0"));
    println!("{r}");
    println!("{}", figure_line("memcpy 1 MiB", &memcpy));
    println!("{}", figure_line("RDMA WRITE 1 MiB", &write));
    let r = RatioRecord {
        id: "device/write_1MiB_GBps_vs_memcpy".into(),
        value: gbs(&write),
        floor: gbs(&memcpy),
    };
    println!("{}", ratio_line("  WRITE GB/s / memcpy GB/s", &r, ">= 0.8"));
    println!("{r}");
}

fn main() {
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    bare_cache_line(&mut c);
    device_round_trip(&mut c);
    bandwidth(&mut c);
    report();
    c.final_summary();
}
