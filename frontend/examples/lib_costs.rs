//! What the `vrdma` library adds to the bypass round trip: the device bench's post → CQE
//! (shared-ring's producer and CQ poller driving a `SoftDevice` directly) and the library
//! bench's `roundtrip/real_bypass` (the `vrdma` library through the real daemon) measured in one
//! process, interleaved round by round with the floor, so that the host's placement of the two
//! vCPUs is the same for the figures compared (docs/benchmarks.md, "The library path" and
//! "Seventh round, the library").
//!
//! * `floor` — `bench_support::CacheLinePingPong`, as in every bench.
//! * `dev_loop` — the device bench's `post_to_cqe_64B`: a loopback RC QP (connected to itself),
//!   a signaled 64-byte RDMA WRITE posted with `WqProducer::write` + `publish_and_check_kick`,
//!   completed by `CqPoller::poll_raw`.
//! * `dev_pair` — the same engine path in the library bench's shape: one bypass channel, two
//!   CQs, two QPs connected to each other, the WRITE from the first QP, the CQE on its CQ.
//! * `lib` — the library bench's `real_bypass`: `QueuePair::post_write` of one 64-byte slice,
//!   `CompletionQueue::poll` until the CQE, through the daemon and the software device on a
//!   simulated host.
//! * `lib_bytes` — `lib` with the WQE built as a `WqeRepr` and serialised with `to_bytes` per
//!   post (`post_raw_send_slot`); `lib_raw` — bytes built once (`post_raw_send_slot`), the
//!   poll as in `lib`.
//! * `lib_shm` — `dev_pair`'s loop (shared-ring's producer, `poll_raw`) on the library's own
//!   rings (`QueuePair::raw_send_queue`, `CompletionQueue::raw_poller`): the daemon's channel
//!   and the simulated host's pages without the library's code.
//! * `dev_pair_ks` — `dev_pair` on a channel with a kick source in the engine's poller (never
//!   notified), as the daemon's bypass channels have.
//! * `dev_sim2`, `dev_sim2w`, `dev_sim1` — `dev_pair` on a simulated host's grant pages
//!   (`benches/support/sim_pair.rs`): the frontend's end on the guest's mapping with the CQ
//!   read-only (as the daemon grants it), the same with the CQ read-write, or on dom0's own
//!   read-write mapping of every page.
//!
//! Every device here has one engine thread that spins 200 µs before sleeping (the daemon's
//! default), so only the engine of the figure being measured runs. Two threads spin in every
//! figure (poster and engine, or the two ping-pong threads). Round trips: 150 batches of 1000
//! after a warm-up; the 10th percentile and the median of the batch means, ns.
//!
//! `cargo run --release -p vrdma --example lib_costs [ROUNDS]`; `lib_costs ir N` (callgrind:
//! N library posts and polls, then N empty polls) and `lib_costs ir-engine N` (callgrind: N
//! WRITEs through the daemon's engine, then N through `dev_sim2`'s, to compare the engines).

use std::hint::spin_loop;
use std::sync::Arc;
use std::time::Duration;

use bench_support::{time_ops, Batches, CacheLinePingPong};
use shared_ring::abi::wqe::{WqeOpcode, WQE_LEN};
use vrdma::{Mode, WorkCompletion};
use vrdma_backend::device::testkit::{self, Loopback, TestChannel};
use vrdma_backend::device::{ChannelMode, Device, EngineConfig, SoftDevice};

#[path = "../benches/support/real_pair.rs"]
mod real_pair;
#[path = "../benches/support/sim_pair.rs"]
mod sim_pair;
use real_pair::RealPair;
use sim_pair::{SimMemPair, Views};

/// (10th percentile, median) over 150 batches of the mean of 1000 calls, ns (after 20 000).
fn spread(mut f: impl FnMut()) -> [f64; 2] {
    time_ops(20_000, &mut f);
    let s = Batches::fixed(150, 1000).run(|n| time_ops(n, &mut f));
    [s.percentile(0.1), s.percentile(0.5)]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let spin = Duration::from_micros(200);

    // dev_loop: the device bench's loopback.
    let mut lo = Loopback::with_spin(1 << 20, spin);
    let lo_wqe = lo.write_wqe(64);

    // dev_pair: two QPs on one channel, like the library bench.
    let pdev = SoftDevice::new(EngineConfig::default()).unwrap();
    let mut pch = TestChannel::open(&pdev, 1, ChannelMode::Bypass);
    let mut pcq1 = pch.cq(&pdev, 6);
    let pcq2 = pch.cq(&pdev, 6);
    let mut pq1 = pch.qp(&pdev, &pcq1, &pcq1, 4);
    let pq2 = pch.qp(&pdev, &pcq2, &pcq2, 4);
    testkit::connect(&pdev, &pq1, &pq2);
    let psrc = pch.mr(&pdev, 4096, testkit_access_all());
    let pdst = pch.mr(&pdev, 4096, testkit_access_all());
    let pair_wqe: [u8; WQE_LEN] = testkit::wqe(
        WqeOpcode::RdmaWrite,
        1,
        &[psrc.sge(0, 64)],
        (pdst.iova, pdst.keys.rkey),
        0,
    )
    .to_bytes();

    // dev_pair_ks: dev_pair on a channel with a kick source in the engine's poller (as the
    // daemon's bypass channels have: the guest's event channel), never notified.
    let kdev = SoftDevice::new(EngineConfig::default()).unwrap();
    let (_knotify, ksock) = std::os::unix::net::UnixStream::pair().unwrap();
    ksock.set_nonblocking(true).unwrap();
    let mut kch = TestChannel::open_with_kick_source(
        &kdev,
        1,
        ChannelMode::Bypass,
        Some(Arc::new(Source(ksock))),
    );
    let mut kcq1 = kch.cq(&kdev, 6);
    let kcq2 = kch.cq(&kdev, 6);
    let mut kq1 = kch.qp(&kdev, &kcq1, &kcq1, 4);
    let kq2 = kch.qp(&kdev, &kcq2, &kcq2, 4);
    testkit::connect(&kdev, &kq1, &kq2);
    let ksrc = kch.mr(&kdev, 4096, testkit_access_all());
    let kdst = kch.mr(&kdev, 4096, testkit_access_all());
    let k_wqe: [u8; WQE_LEN] = testkit::wqe(
        WqeOpcode::RdmaWrite,
        1,
        &[ksrc.sge(0, 64)],
        (kdst.iova, kdst.keys.rkey),
        0,
    )
    .to_bytes();

    // dev_sim2 / dev_sim1: dev_pair on a simulated host's grant pages, the frontend's end on
    // the guest's mapping (two virtual addresses per page, as the library) or on dom0's.
    let sim_tmp = tempfile::Builder::new()
        .prefix("vs")
        .tempdir_in("/tmp")
        .unwrap();
    let sim_host =
        xen_platform::sim::SimHost::start(xen_platform::sim::SimHostConfig::new(sim_tmp.path()))
            .unwrap();
    let mut sims = [
        (Views::Two, xen_platform::Access::ReadOnly),
        (Views::Two, xen_platform::Access::ReadWrite),
        (Views::One, xen_platform::Access::ReadOnly),
    ]
    .map(|(v, a)| {
        let guest = sim_host.create_domain(None, None).unwrap();
        SimMemPair::start(&sim_host, guest, v, a)
    });

    // lib: the library bench's real_bypass.
    let mut p = RealPair::start(Mode::Bypass);
    let (local, remote) = (p.src.slice(0..64), p.dst.remote().slice(0..64));
    let mut wc = [WorkCompletion::default(); 4];
    // The WQE `post_write(&[local], remote, 1)` builds, as a `WqeRepr`.
    let lkey = p.src.lkey();
    let write_wqe = || {
        testkit::wqe(
            WqeOpcode::RdmaWrite,
            1,
            &[vrdma::Sge {
                offset: 0,
                length: 64,
                lkey,
            }],
            (remote.addr, remote.rkey),
            0,
        )
    };
    let raw_wqe: [u8; WQE_LEN] = write_wqe().to_bytes();

    if std::env::args().nth(1).as_deref() == Some("ir-engine") {
        // For callgrind: N WRITEs through the daemon's engine (the library's rings, shared-ring's
        // code) and N through dev_sim2's; compare the two engine threads.
        let n: usize = std::env::args().nth(2).map_or(2000, |a| a.parse().unwrap());
        for _ in 0..n {
            let (sq, kick) = p.q1.raw_send_queue();
            sq.write(&raw_wqe).unwrap();
            if sq.publish_and_check_kick(kick) {
                p.q1.raw_kick().unwrap();
            }
            while p.cq.raw_poller().poll_raw().is_none() {
                std::thread::yield_now();
            }
        }
        let s = &mut sims[0];
        for _ in 0..n {
            s.q1.sq.write(&s.wqe).unwrap();
            if s.q1.sq.publish_and_check_kick(&mut s.q1.kick) {
                s.dev.kick(s.q1.ch);
            }
            while s.cq1.poller.poll_raw().is_none() {
                std::thread::yield_now();
            }
        }
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("ir") {
        // For callgrind: N posts and their polls (yielding while nothing is there), then N
        // polls of the idle CQ; per-call costs from `callgrind_annotate --inclusive=yes`.
        let n: usize = std::env::args().nth(2).map_or(2000, |a| a.parse().unwrap());
        for _ in 0..n {
            p.q1.post_write(&[local], remote, 1).unwrap();
            while p.cq.poll(&mut wc).unwrap().is_empty() {
                std::thread::yield_now();
            }
        }
        for _ in 0..n {
            assert!(p.cq.poll(&mut wc).unwrap().is_empty());
        }
        return;
    }
    println!(
        "bypass post -> CQE, 64-byte RDMA WRITE, ns (p10 / median of 150 batch means of 1000); \
         2 threads spin in every figure"
    );
    println!(
        "lib_bytes: WqeRepr::to_bytes per post + post_raw_send_slot; lib_raw: bytes built \
         once + post_raw_send_slot; lib_shm: dev_pair's loop on the library's rings"
    );
    println!(
        "round  floor         dev_loop      dev_pair      lib           lib_bytes     \
         lib_raw       lib_shm       dev_pair_ks   dev_sim2      dev_sim2w     dev_sim1      lib/floor(p10)"
    );
    for r in 0..rounds {
        // The echo thread spins while it exists: started and stopped around its own figure.
        let mut floor = CacheLinePingPong::start();
        let f = spread(|| floor.round_trip());
        drop(floor);
        let dl = spread(|| {
            lo.qp.sq.write(&lo_wqe).unwrap();
            if lo.qp.sq.publish_and_check_kick(&mut lo.qp.kick) {
                lo.dev.kick(lo.qp.ch);
            }
            while lo.cq.poller.poll_raw().is_none() {
                spin_loop();
            }
        });
        let dp = spread(|| {
            pq1.sq.write(&pair_wqe).unwrap();
            if pq1.sq.publish_and_check_kick(&mut pq1.kick) {
                pdev.kick(pq1.ch);
            }
            while pcq1.poller.poll_raw().is_none() {
                spin_loop();
            }
        });
        let dk = spread(|| {
            kq1.sq.write(&k_wqe).unwrap();
            if kq1.sq.publish_and_check_kick(&mut kq1.kick) {
                kdev.kick(kq1.ch);
            }
            while kcq1.poller.poll_raw().is_none() {
                spin_loop();
            }
        });
        let [ds2, ds2w, ds1] = [0, 1, 2].map(|i| {
            let s = &mut sims[i];
            spread(|| {
                s.q1.sq.write(&s.wqe).unwrap();
                if s.q1.sq.publish_and_check_kick(&mut s.q1.kick) {
                    s.dev.kick(s.q1.ch);
                }
                while s.cq1.poller.poll_raw().is_none() {
                    spin_loop();
                }
            })
        });
        // How the post builds its WQE: 0 the library's (`post_write`), 1 a `WqeRepr` built
        // and serialised to bytes per post (`to_bytes`, as the library did before), 2 bytes
        // built once.
        let mut lib = |build: u8| {
            spread(|| {
                match build {
                    0 => p.q1.post_write(&[local], remote, 1).unwrap(),
                    1 => {
                        let w = write_wqe();
                        p.q1.post_raw_send_slot(&std::hint::black_box(w).to_bytes())
                            .unwrap()
                    }
                    _ => p.q1.post_raw_send_slot(&raw_wqe).unwrap(),
                }
                loop {
                    if let Some(w) = p.cq.poll(&mut wc).unwrap().first() {
                        assert!(w.is_ok(), "{w:?}");
                        break;
                    }
                    spin_loop();
                }
            })
        };
        let l = lib(0);
        let lby = lib(1);
        let lr = lib(2);
        // lib_shm: `dev_pair`'s loop (shared-ring's producer and `poll_raw`) on the library's
        // own rings in the simulated host's pages: what the memory and the daemon's device
        // cost, without the library's code.
        let ls = spread(|| {
            let (sq, kick) = p.q1.raw_send_queue();
            sq.write(&raw_wqe).unwrap();
            if sq.publish_and_check_kick(kick) {
                p.q1.raw_kick().unwrap();
            }
            let poller = p.cq.raw_poller();
            while poller.poll_raw().is_none() {
                spin_loop();
            }
        });
        let all = [f, dl, dp, l, lby, lr, ls, dk, ds2, ds2w, ds1];
        print!("{r:>5}");
        for x in all {
            print!("  {:>5.1} {:>6.1}", x[0], x[1]);
        }
        println!("   {:.2}", l[0] / f[0]);
    }
    drop(p);
    drop(pcq1);
    drop(kcq1);
    drop(sims);
    drop(sim_host);
}

/// A kick source nobody notifies (the engine polls it, as it polls a guest's event channel).
struct Source(std::os::unix::net::UnixStream);

impl std::os::fd::AsFd for Source {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl vrdma_backend::device::KickSource for Source {
    fn fired(&self) {
        use std::io::Read;
        let mut b = [0u8; 64];
        while matches!((&self.0).read(&mut b), Ok(n) if n > 0) {}
    }
}

fn testkit_access_all() -> u32 {
    shared_ring::abi::control::access::ALL
}
