//! The software device's data path, in one process, against floors measured in the same run.
//!
//! * `bare_cache_line` — floor: two threads ping-pong one atomic store each way.
//! * `post_to_cqe_64B` — the bypass round trip through the engine: the bench thread (playing
//!   the frontend with shared-ring's producer and CQ poller) posts a signaled 64-byte RDMA
//!   WRITE on a loopback QP and spins on the CQE's phase bit; the engine thread spins on the
//!   doorbell. Two threads spin (the machine has 2 cores): the bench thread and one engine.
//! * `memcpy_1MiB` — floor: single-core `copy_from_slice` of 1 MiB between private buffers.
//! * `write_1MiB` — an RDMA WRITE of 1 MiB through the engine, post to CQE.
//!
//! `cargo bench -p vrdma-backend --bench device`; ratios are printed at the end.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use shared_ring::abi::control::access;
use shared_ring::abi::wqe::WqeOpcode;
use vrdma_backend::device::testkit::{wqe, TestChannel, TestCq, TestMr, TestQp};
use vrdma_backend::device::{ChannelMode, Device, EngineConfig, SoftDevice};

static SAMPLES: Mutex<Vec<(&'static str, f64)>> = Mutex::new(Vec::new());

fn record(name: &'static str, d: Duration, iters: u64) -> Duration {
    SAMPLES
        .lock()
        .unwrap()
        .push((name, d.as_nanos() as f64 / iters as f64));
    d
}

fn median(name: &str) -> f64 {
    let mut v: Vec<f64> = SAMPLES
        .lock()
        .unwrap()
        .iter()
        .filter(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

#[repr(align(128))]
struct Line(AtomicU32);

fn bare_cache_line(c: &mut Criterion) {
    let ping = Arc::new(Line(AtomicU32::new(0)));
    let pong = Arc::new(Line(AtomicU32::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let t = {
        let (ping, pong, stop) = (ping.clone(), pong.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = 0;
            while !stop.load(Ordering::Relaxed) {
                let v = ping.0.load(Ordering::Acquire);
                if v != seen {
                    seen = v;
                    pong.0.store(v, Ordering::Release);
                } else {
                    spin_loop();
                }
            }
        })
    };
    let mut n = 0u32;
    c.bench_function("bare_cache_line", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                n = n.wrapping_add(1).max(1);
                ping.0.store(n, Ordering::Release);
                while pong.0.load(Ordering::Acquire) != n {
                    spin_loop();
                }
            }
            record("bare_cache_line", start.elapsed(), iters)
        })
    });
    stop.store(true, Ordering::Relaxed);
    ping.0.store(u32::MAX, Ordering::Release);
    t.join().unwrap();
}

struct Loop {
    dev: SoftDevice,
    cq: TestCq,
    qp: TestQp,
    src: TestMr,
    dst: TestMr,
}

fn loopback() -> Loop {
    let dev = SoftDevice::new(EngineConfig {
        threads: 1,
        spin: Duration::from_secs(3600),
    })
    .unwrap();
    let mut ch = TestChannel::open(&dev, 1, ChannelMode::Bypass);
    let cq = ch.cq(&dev, 10);
    let qp = ch.qp(&dev, &cq, &cq, 8);
    dev.connect_qp(ch.id, qp.num, qp.num).unwrap();
    let src = ch.mr(&dev, 1 << 20, access::ALL);
    let dst = ch.mr(&dev, 1 << 20, access::ALL);
    Loop {
        dev,
        cq,
        qp,
        src,
        dst,
    }
}

fn round_trip(l: &mut Loop, len: u32) {
    let w = wqe(
        WqeOpcode::RdmaWrite,
        1,
        &[l.src.sge(0, len)],
        (l.dst.iova, l.dst.keys.rkey),
        0,
    );
    l.qp.sq.write(&w.to_bytes()).unwrap();
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
    let mut l = loopback();
    c.bench_function("post_to_cqe_64B", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                round_trip(&mut l, 64);
            }
            record("post_to_cqe_64B", start.elapsed(), iters)
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
            record("memcpy_1MiB", start.elapsed(), iters)
        })
    });
    let mut l = loopback();
    g.bench_function("write_1MiB", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                round_trip(&mut l, LEN as u32);
            }
            record("write_1MiB", start.elapsed(), iters)
        })
    });
    g.finish();
}

fn report() {
    let floor = median("bare_cache_line");
    let rt = median("post_to_cqe_64B");
    let memcpy = median("memcpy_1MiB");
    let write = median("write_1MiB");
    let gbs = |ns: f64| (1u64 << 20) as f64 / ns;
    println!("\nsoftware device, spinning threads: 2 (bench thread + 1 engine thread)");
    println!("bare cache-line round trip   {floor:8.1} ns");
    println!(
        "post->CQE round trip, 64 B   {rt:8.1} ns   ratio {:.2} (target <= 2.0)",
        rt / floor
    );
    println!("memcpy 1 MiB                 {:8.2} GB/s", gbs(memcpy));
    println!(
        "RDMA WRITE 1 MiB             {:8.2} GB/s   ratio {:.2} (target >= 0.8)",
        gbs(write),
        memcpy / write
    );
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
