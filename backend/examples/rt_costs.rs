//! Where the bypass round trip's time goes: the pieces of a post → CQE round trip measured
//! one by one on this machine, with std atomics only (no vrdma code), so that the device
//! bench's figure can be split into "the shared-memory protocol itself" and "what the engine
//! adds" (docs/benchmarks.md, "Where the bypass round trip's time goes").
//!
//! Round trips are taken over 200 batches of 1000 and reported as the batch mean's minimum,
//! 10th percentile and median: on a loaded 2-core machine the two spinning threads share the
//! cores with everything else, and the low percentiles are the batches in which both ran,
//! which is what the figure is about (the median is the device bench's statistic).
//!
//! * `floor` — the one floor of every bench (`bench_support::CacheLinePingPong`).
//! * `protocol` — the bypass protocol with no engine around it, line for line as the frontend
//!   and engine do it: the poster writes a 64-byte WQE line, release-stores the producer index
//!   (its own line), fences and reads the sleep word (a third line, never written here); the
//!   "engine" spins on the producer index, copies the WQE out, writes the 28-byte CQE body and
//!   release-stores its owner word, fences and reads the CQ arm word; the poster spins on the
//!   owner word, copies the CQE out and stores the CQ consumer index (on the arm word's line,
//!   as in the doorbell page). What the device adds on top of this is engine work.
//! * `protocol_no_arm` — the same without the engine's fence and arm-word read.
//! * `device` — the device bench's `post_to_cqe_64B`: a signaled 64-byte RDMA WRITE on a
//!   loopback RC QP of a `SoftDevice` (one engine thread, never sleeping), posted with
//!   shared-ring's producer and kick check, completed by polling the CQE's phase bit.
//! * `device_batch` — the same WRITE posted 128 at a time, then all 128 CQEs polled: per
//!   WQE, what the engine's execution costs when the cross-core latency is paid once per
//!   batch (the engine's own work per operation).
//! * Single-thread unit costs of what the engine does per operation: an uncontended
//!   `fetch_add` (a locked instruction), `Mutex` lock + unlock, `RwLock` read + unlock,
//!   `Arc` clone + drop, `Weak` upgrade + drop, a full fence, `Instant::now`.
//!
//! `cargo run --release -p vrdma-backend --example rt_costs`

use std::hint::{black_box, spin_loop};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use bench_support::{time_ops, Batches};
use vrdma_backend::device::testkit::Loopback;
use vrdma_backend::device::Device;

#[repr(C, align(128))]
struct Line([AtomicU32; 16]);

impl Line {
    fn new() -> Self {
        Line(std::array::from_fn(|_| AtomicU32::new(0)))
    }
}

/// (minimum, 10th percentile, median) over 200 batches of the mean of 1000 round trips, ns.
fn spread(mut f: impl FnMut()) -> [f64; 3] {
    time_ops(20_000, &mut f);
    let s = Batches::fixed(200, 1000).run(|n| time_ops(n, &mut f));
    [s.percentile(0.0), s.percentile(0.1), s.percentile(0.5)]
}

/// Median over 21 rounds of the mean of `batch` calls, ns (single-thread unit costs).
fn measure(batch: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..batch {
        f();
    }
    let mut v: Vec<f64> = (0..21)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..batch {
                f();
            }
            t.elapsed().as_nanos() as f64 / f64::from(batch)
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// The floor: bench-support's one definition (the same as every bench's), sampled like the
/// other rows here.
fn floor() -> [f64; 3] {
    let mut pp = bench_support::CacheLinePingPong::start();
    spread(|| pp.round_trip())
}

/// The lines of one queue pair and CQ, as the doorbell page and rings lay them out.
struct Proto {
    wqe: Line,
    prod: Line,
    sleep: Line,
    cqe: Line,
    /// Arm word (+0) and CQ consumer index (+4): the frontend writes both.
    arm: Line,
}

fn protocol(arm_check: bool) -> [f64; 3] {
    let p = Arc::new(Proto {
        wqe: Line::new(),
        prod: Line::new(),
        sleep: Line::new(),
        cqe: Line::new(),
        arm: Line::new(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let t = {
        let (p, stop) = (p.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut cons = 0u32;
            while !stop.load(Ordering::Relaxed) {
                if p.prod.0[0].load(Ordering::Acquire) == cons {
                    spin_loop();
                    continue;
                }
                let mut w = [0u32; 16];
                for (d, s) in w.iter_mut().zip(&p.wqe.0) {
                    *d = s.load(Ordering::Relaxed);
                }
                black_box(w);
                cons = cons.wrapping_add(1);
                for s in &p.cqe.0[..7] {
                    s.store(cons, Ordering::Relaxed);
                }
                p.cqe.0[7].store(cons, Ordering::Release);
                if arm_check {
                    fence(Ordering::SeqCst);
                    black_box(p.arm.0[0].load(Ordering::Relaxed));
                }
            }
        })
    };
    let mut n = 0u32;
    let r = spread(|| {
        n = n.wrapping_add(1);
        for s in &p.wqe.0 {
            s.store(n, Ordering::Relaxed);
        }
        p.prod.0[0].store(n, Ordering::Release);
        fence(Ordering::SeqCst);
        black_box(p.sleep.0[0].load(Ordering::Relaxed));
        while p.cqe.0[7].load(Ordering::Acquire) != n {
            spin_loop();
        }
        let mut c = [0u32; 8];
        for (d, s) in c.iter_mut().zip(&p.cqe.0[..8]) {
            *d = s.load(Ordering::Relaxed);
        }
        black_box(c);
        p.arm.0[1].store(n, Ordering::Release);
    });
    stop.store(true, Ordering::Relaxed);
    p.prod.0[0].store(u32::MAX, Ordering::Release);
    t.join().unwrap();
    r
}

fn device() -> [f64; 3] {
    // The device's 4 KiB MRs.
    let mut l = Loopback::new(4096);
    spread(|| {
        // Built per post and stored as words, as the `vrdma` library posts (and the device
        // bench).
        let w = l.write_wqe_words(64);
        l.qp.sq.write_words(&w).unwrap();
        if l.qp.sq.publish_and_check_kick(&mut l.qp.kick) {
            l.dev.kick(l.qp.ch);
        }
        while l.cq.poller.poll_raw().is_none() {
            spin_loop();
        }
    })
}

fn device_batch() -> f64 {
    // The device's 4 KiB MRs; the channel and MRs stay alive (unmoved fields of `l`).
    let l = Loopback::new(4096);
    let w = l.write_wqe(64);
    let Loopback {
        dev,
        mut cq,
        mut qp,
        ..
    } = l;
    let mut batch = || {
        for _ in 0..128 {
            qp.sq.write(&w).unwrap();
        }
        if qp.sq.publish_and_check_kick(&mut qp.kick) {
            dev.kick(qp.ch);
        }
        for _ in 0..128 {
            while cq.poller.poll_raw().is_none() {
                spin_loop();
            }
        }
    };
    for _ in 0..1000 {
        batch();
    }
    let mut v: Vec<f64> = (0..200)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..20 {
                batch();
            }
            t.elapsed().as_nanos() as f64 / (20.0 * 128.0)
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 10]
}

fn row(name: &str, v: [f64; 3], floor: [f64; 3]) {
    println!(
        "{name:<38} {:8.1} {:8.1} {:8.1}   ratio {:5.2} {:5.2} {:5.2}",
        v[0],
        v[1],
        v[2],
        v[0] / floor[0],
        v[1] / floor[1],
        v[2] / floor[2]
    );
}

fn main() {
    const N: u32 = 200_000;
    let f = floor();
    let pr = protocol(true);
    let pn = protocol(false);
    println!("round trips, ns: batch-mean min, p10, median; ratios against the floor's");
    row("floor (two lines ping-pong)", f, f);
    row("protocol (WQE+prod, CQE, arm check)", pr, f);
    row("protocol without the arm check", pn, f);
    // Where the host puts the two vCPUs changes within a run (floors from 100 to 400 ns on
    // the project VM): floor and device alternate, five times, each ratio against the floor
    // measured just before it.
    let mut ratios = Vec::new();
    for round in 1..=5 {
        let f = floor();
        let d = device();
        row(&format!("round {round}: floor"), f, f);
        row(&format!("round {round}: device post->CQE, 64 B"), d, f);
        ratios.push(d[1] / f[1]);
    }
    println!(
        "device, 128 WRITEs per post, per WQE (p10)  {:7.1} ns",
        device_batch()
    );
    ratios.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "device post->CQE / floor at p10, five rounds: median {:.2}, min {:.2}, max {:.2}",
        ratios[2], ratios[0], ratios[4]
    );
    let a = AtomicU64::new(0);
    let rmw = measure(N, || {
        black_box(&a).fetch_add(1, Ordering::Relaxed);
    });
    let m = Mutex::new(0u64);
    let mutex = measure(N, || {
        *black_box(&m).lock().unwrap() += 1;
    });
    let rw = RwLock::new(0u64);
    let rwlock = measure(N, || {
        black_box(*black_box(&rw).read().unwrap());
    });
    let arc = Arc::new(0u64);
    let arc_c = measure(N, || {
        drop(black_box(black_box(&arc).clone()));
    });
    let weak = Arc::downgrade(&arc);
    let weak_u = measure(N, || {
        drop(black_box(black_box(&weak).upgrade()));
    });
    let fen = measure(N, || fence(Ordering::SeqCst));
    let now = measure(N, || {
        black_box(Instant::now());
    });
    println!("fetch_add (locked RMW)               {rmw:7.1} ns");
    println!("Mutex lock + unlock                  {mutex:7.1} ns");
    println!("RwLock read + unlock                 {rwlock:7.1} ns");
    println!("Arc clone + drop                     {arc_c:7.1} ns");
    println!("Weak upgrade + drop                  {weak_u:7.1} ns");
    println!("fence(SeqCst)                        {fen:7.1} ns");
    println!("Instant::now                         {now:7.1} ns");
}
