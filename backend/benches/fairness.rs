//! Engine fairness (issue 10): a guest posting 1 GiB RDMA WRITEs in a loop against another
//! guest's 64-byte ping-pong, both served by the same (single) engine thread.
//!
//! * idle: the good pair's ping-pong alone — A SENDs 64 B to B, B SENDs 64 B back (RECVs
//!   pre-posted), one round trip = two messages through the engine; median of the samples.
//! * loaded: the same while the hog channel keeps a 1 GiB RDMA WRITE in flight at all times
//!   (source never written, so it reads the zero page; destination 1 GiB of fresh anonymous
//!   memory, faulted in by the first WRITE before measuring).
//!
//! Spinning threads: 2 (the bench thread driving the ping-pong, and the engine). The hog's
//! thread posts a WRITE, then polls its CQ once a millisecond (sleeping in between).
//!
//! `cargo bench -p vrdma-backend --bench fairness`; prints the medians (with their spread) and
//! their ratio (target: loaded ≤ 3 × idle), also as a `bench-ratio` line.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bench_support::report::{figure_line, ratio_line, RatioRecord};
use bench_support::Samples;
use shared_ring::abi::control::access;
use shared_ring::abi::wqe::WqeOpcode;
use vrdma_backend::device::testkit::{connect, wqe, TestChannel, TestCq, TestMr, TestQp};
use vrdma_backend::device::{ChannelMode, Device, EngineConfig, SoftDevice};

const SAMPLES: usize = 20_000;
const HOG_LEN: u32 = 1 << 30;

struct Side {
    qp: TestQp,
    cq: TestCq,
    mr: TestMr,
}

fn spin_cqe(cq: &mut TestCq) {
    loop {
        if cq.poller.poll_raw().is_some() {
            return;
        }
        std::hint::spin_loop();
    }
}

/// One ping-pong round trip: A → B, B → A, each 64 B; returns its duration.
fn round_trip(dev: &SoftDevice, a: &mut Side, b: &mut Side, i: u64) -> Duration {
    // RECVs first (not timed): one on each side.
    b.qp.post_recv(dev, i, &[b.mr.sge(0, 64)]);
    a.qp.post_recv(dev, i, &[a.mr.sge(64, 64)]);
    let start = Instant::now();
    let mut w = wqe(WqeOpcode::Send, i, &[a.mr.sge(0, 64)], (0, 0), 0);
    w.flags = 0; // unsignaled: only the RECV completions are waited for
    a.qp.post_send(dev, &w);
    spin_cqe(&mut b.cq);
    let mut w = wqe(WqeOpcode::Send, i, &[b.mr.sge(0, 64)], (0, 0), 0);
    w.flags = 0;
    b.qp.post_send(dev, &w);
    spin_cqe(&mut a.cq);
    start.elapsed()
}

/// Round trips (ns each) until at least `n` samples and at least `min` of time.
fn sample(dev: &SoftDevice, a: &mut Side, b: &mut Side, n: usize, min: Duration) -> Samples {
    let start = Instant::now();
    let mut v = Samples::default();
    while v.len() < n || start.elapsed() < min {
        v.push(round_trip(dev, a, b, v.len() as u64), 1);
    }
    v
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to configure.
    let dev = SoftDevice::new(EngineConfig {
        threads: 1,
        spin: Duration::from_secs(3600),
    })
    .expect("device");
    let mut ca = TestChannel::open(&dev, 1, ChannelMode::Bypass);
    let mut cb = TestChannel::open(&dev, 2, ChannelMode::Bypass);
    let side = |ch: &mut TestChannel| {
        let cq = ch.cq(&dev, 10);
        let qp = ch.qp(&dev, &cq, &cq, 8);
        let mr = ch.mr(&dev, 4096, access::ALL);
        Side { qp, cq, mr }
    };
    let mut a = side(&mut ca);
    let mut b = side(&mut cb);
    connect(&dev, &a.qp, &b.qp);
    // Warm up, then idle.
    sample(&dev, &mut a, &mut b, 2_000, Duration::ZERO);
    let idle = sample(&dev, &mut a, &mut b, SAMPLES, Duration::from_secs(1));

    let mut ch = TestChannel::open(&dev, 9, ChannelMode::Bypass);
    let mut hcq = ch.cq(&dev, 4);
    let mut hqp = ch.qp(&dev, &hcq, &hcq, 4);
    dev.connect_qp(ch.id, hqp.num, hqp.num)
        .expect("hog loopback");
    let src = ch.mr(&dev, u64::from(HOG_LEN), access::ALL);
    let dst = ch.mr(&dev, u64::from(HOG_LEN), access::ALL);
    let stop = AtomicBool::new(false);
    let writes = AtomicU64::new(0);
    let (loaded, hog_secs, hog_writes) = std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let w = wqe(
                    WqeOpcode::RdmaWrite,
                    i,
                    &[src.sge(0, HOG_LEN)],
                    (dst.iova, dst.keys.rkey),
                    0,
                );
                hqp.post_send(&dev, &w);
                while hcq.poll(&dev).is_none() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                writes.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
        });
        // Measure once the destination is faulted in (the first WRITE is done).
        while writes.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let w0 = writes.load(Ordering::SeqCst);
        let t0 = Instant::now();
        let loaded = sample(&dev, &mut a, &mut b, SAMPLES, Duration::from_secs(3));
        let secs = t0.elapsed().as_secs_f64();
        let w1 = writes.load(Ordering::SeqCst);
        stop.store(true, Ordering::Relaxed);
        (loaded, secs, w1 - w0)
    });
    println!("engine fairness, 1 engine thread; spinning threads: 2 (bench thread + engine)");
    println!("{}", figure_line("64 B ping-pong round trip, idle", &idle));
    println!("{}", figure_line("  with the 1 GiB hog", &loaded));
    let r = RatioRecord::of("fairness/loaded_vs_idle", &loaded, &idle);
    println!("{}", ratio_line("ratio loaded / idle", &r, "<= 3.0"));
    println!("{r}");
    println!(
        "hog meanwhile: {hog_writes} WRITEs of 1 GiB completed in {hog_secs:.2} s ({:.2} GB/s)",
        hog_writes as f64 * f64::from(HOG_LEN) / hog_secs / 1e9
    );
}
