//! Two threads ping-ponging through shared memory, each spinning on its own core (the machine
//! has 2 cores; both threads spin). Reported as round-trip time and as a ratio to a bare
//! cache-line ping-pong measured in the same run:
//!
//! * `bare_cache_line` — the floor (`bench_support::CacheLinePingPong`, the same in every bench:
//!   two 128-byte lines, one writer each; one round trip = two cache-line transfers).
//! * `xen_ring` — control-ring round trip: write request, push + check notify (full fence);
//!   the back end copies it out, writes a response, push + check notify; the front copies it.
//! * `cqe_phase` — one CQE each way through two CQs, polled by phase bit (no shared index).
//! * `wqe_to_cqe` — the bypass data path: post a WQE + release the SQ producer index + kick
//!   check (full fence); the engine polls the doorbell, copies and parses the WQE, writes a
//!   CQE + arm check (full fence); the poster polls the CQE by phase bit.
//!
//! `cargo bench -p shared-ring --bench pingpong`
#![cfg_attr(loom, allow(unused))]

#[cfg(not(loom))]
mod bench {
    use std::hint::spin_loop;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use bench_support::report::{figure_line, ratio_line, RatioRecord};
    use bench_support::{CacheLinePingPong, Recorder};
    use criterion::Criterion;

    use shared_ring::abi::cqe::{CqeOpcode, CqeRepr, CqeStatus, CQE_LEN};
    use shared_ring::abi::wqe::{flags, WqeData, WqeOpcode, WqeRepr, WQE_LEN};
    use shared_ring::cq::{CqPoller, CqWriter};
    use shared_ring::doorbell::DoorbellPage;
    use shared_ring::queue::{Consumer, Producer};
    use shared_ring::xen_ring::{BackRing, FrontRing};
    use shared_ring::SharedRegion;

    static REC: Recorder = Recorder::new();

    /// Runs `echo` on a helper thread until the returned guard is dropped.
    struct Helper {
        stop: Arc<AtomicBool>,
        handle: Option<std::thread::JoinHandle<()>>,
    }
    impl Helper {
        fn spawn(mut echo: impl FnMut() + Send + 'static) -> Self {
            let stop = Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            let handle = std::thread::spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    echo();
                }
            });
            Self {
                stop,
                handle: Some(handle),
            }
        }
    }
    impl Drop for Helper {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
            if let Some(h) = self.handle.take() {
                h.join().unwrap();
            }
        }
    }

    fn bare(c: &mut Criterion) {
        let mut floor = CacheLinePingPong::start();
        c.bench_function("bare_cache_line", |b| {
            b.iter_custom(|iters| REC.record("bare_cache_line", floor.round_trips(iters), iters))
        });
    }

    fn xen_ring(c: &mut Criterion) {
        let region = SharedRegion::alloc(4096).unwrap();
        let mut front = FrontRing::<64>::init(region.clone()).unwrap();
        let mut back = BackRing::<64>::new(region).unwrap();
        let _h = Helper::spawn(move || match back.next_request() {
            Ok(Some(r)) => {
                back.write_response(&r).unwrap();
                back.push_responses_and_check_notify();
            }
            _ => spin_loop(),
        });
        let req = [7u8; 64];
        c.bench_function("xen_ring", |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    front.write_request(&req).unwrap();
                    front.push_requests_and_check_notify();
                    loop {
                        if let Ok(Some(r)) = front.next_response() {
                            std::hint::black_box(r);
                            break;
                        }
                        spin_loop();
                    }
                }
                REC.record("xen_ring", t.elapsed(), iters)
            })
        });
    }

    fn cq_pair(size: usize) -> (CqWriter, CqPoller) {
        let dbr = SharedRegion::alloc(4096).unwrap();
        let db = DoorbellPage::init(dbr, 1).unwrap();
        let mem = SharedRegion::alloc(size * CQE_LEN).unwrap();
        (
            CqWriter::new(mem.slots(0, size).unwrap(), db.cq(0).unwrap()),
            CqPoller::new(mem.slots(0, size).unwrap(), db.cq(0).unwrap()),
        )
    }

    fn cqe(wr_id: u64) -> [u8; CQE_LEN] {
        CqeRepr {
            wr_id,
            status: CqeStatus::Success,
            opcode: CqeOpcode::Send,
            byte_len: 64,
            imm_data: 0,
            qp_num: 1,
            vendor_err: 0,
            flags: 0,
        }
        .to_bytes()
    }

    fn cqe_phase(c: &mut Criterion) {
        let (mut w1, mut p1) = cq_pair(256);
        let (mut w2, mut p2) = cq_pair(256);
        let _h = Helper::spawn(move || match p1.poll_raw() {
            Some(c) => {
                w2.write(&c).unwrap();
            }
            None => spin_loop(),
        });
        let entry = cqe(1);
        c.bench_function("cqe_phase", |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    w1.write(&entry).unwrap();
                    loop {
                        if let Some(c) = p2.poll_raw() {
                            std::hint::black_box(c);
                            break;
                        }
                        spin_loop();
                    }
                }
                REC.record("cqe_phase", t.elapsed(), iters)
            })
        });
    }

    fn wqe_to_cqe(c: &mut Criterion) {
        let dbr = SharedRegion::alloc(4096).unwrap();
        let db = DoorbellPage::init(dbr, 1).unwrap();
        let q = db.queue(0).unwrap();
        let sq_mem = SharedRegion::alloc(256 * WQE_LEN).unwrap();
        let mut sq = Producer::<WQE_LEN>::new(
            sq_mem.slots(0, 256).unwrap(),
            q.prod.clone(),
            q.cons.clone(),
            0,
        );
        let mut engine_sq =
            Consumer::<WQE_LEN>::new(sq_mem.slots(0, 256).unwrap(), q.prod, q.cons, 0);
        let mut kick = db.engine_kick().unwrap();
        let (mut cq_w, mut cq_p) = {
            let mem = SharedRegion::alloc(256 * CQE_LEN).unwrap();
            (
                CqWriter::new(mem.slots(0, 256).unwrap(), db.cq(1).unwrap()),
                CqPoller::new(mem.slots(0, 256).unwrap(), db.cq(1).unwrap()),
            )
        };
        let _h = Helper::spawn(move || match engine_sq.pop() {
            Ok(Some(w)) => {
                engine_sq.release();
                let wqe = WqeRepr::from_bytes(&w).unwrap();
                cq_w.write(&cqe(wqe.wr_id)).unwrap();
                cq_w.notify_needed(false);
            }
            _ => spin_loop(),
        });
        let wqe = WqeRepr {
            opcode: WqeOpcode::Send,
            flags: flags::SIGNALED,
            wr_id: 42,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            data: WqeData::inline(&[0x5a; 32]).unwrap(),
        }
        .to_bytes();
        c.bench_function("wqe_to_cqe", |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    sq.write(&wqe).unwrap();
                    sq.publish_and_check_kick(&mut kick);
                    loop {
                        if let Some(c) = cq_p.poll_raw() {
                            std::hint::black_box(c);
                            break;
                        }
                        spin_loop();
                    }
                }
                REC.record("wqe_to_cqe", t.elapsed(), iters)
            })
        });
    }

    pub fn main() {
        let mut c = Criterion::default()
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3))
            .sample_size(50)
            .configure_from_args();
        bare(&mut c);
        xen_ring(&mut c);
        cqe_phase(&mut c);
        wqe_to_cqe(&mut c);
        c.final_summary();
        let floor = REC.samples("bare_cache_line");
        println!("\nshared-ring ping-pong, 2 threads spinning, ns per round trip (medians of criterion's samples):");
        println!("{}", figure_line("bare_cache_line (floor)", &floor));
        for name in ["xen_ring", "cqe_phase", "wqe_to_cqe"] {
            let s = REC.samples(name);
            if s.is_empty() {
                continue; // filtered out on the command line
            }
            let r = RatioRecord::of(&format!("pingpong/{name}"), &s, &floor);
            println!("{}", figure_line(name, &s));
            println!("{}", ratio_line(&format!("  {name} / floor"), &r, "-"));
            println!("{r}");
        }
    }
}

fn main() {
    #[cfg(not(loom))]
    bench::main();
}
