//! Post → CQE round trip through the frontend library, bypass vs mediated, against the bare
//! cache-line ping-pong floor measured in the same run.
//!
//! Two backends, each on a simulated host in this process (grants = shared memfd pages, event
//! channels = eventfds, XenStore = the embedded server):
//!
//! * **real**: the `vrdma-backend` daemon (control service, quotas, xenbus) with the software
//!   device model (`SoftDevice`, one engine thread) in dom0, attached with the toolstack code;
//!   a guest context in domain 1 with two QPs connected to each other through the engine. The
//!   operation is a 64-byte RDMA WRITE from one region to another, post → CQE on the
//!   requester's CQ.
//! * **fake**: the scripted fake backend of `tests/common`, whose toy engine completes every
//!   32-byte inline SEND at once: what the frontend and the shared-memory protocol alone cost.
//!
//! * `cache_line` — the floor, `bench_support::CacheLinePingPong` as in every bench (two
//!   128-byte lines, one writer each; one round trip = two cache-line transfers; both spin).
//! * `bypass` (fake) — `post_send_inline` (WQE + release-store + kick check) then `poll` until the
//!   CQE's phase bit flips; the engine thread spins on the SQ producer index. Two threads spin:
//!   the poster and the engine.
//! * `mediated` — the same calls in mediated mode: a `PostSend` and (at least) one `PollCq`
//!   control request, each a ring round trip with event-channel notifications; the poster
//!   spins 50 µs per request before blocking, the backend thread blocks on its event channel.
//!
//! Every figure is the median of batch means (`bench_support::Batches`); the ratios are also
//! printed as `bench-ratio` lines for `scripts/bench-ratios.sh`.
//!
//! `cargo bench -p vrdma --bench roundtrip`

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/real_pair.rs"]
mod real_pair;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bench_support::report::{figure_line, ratio_line, RatioRecord};
use bench_support::{time_ops, Batches, CacheLinePingPong, Samples};
use common::{FakeBackend, World};
use real_pair::RealPair;
use vrdma::{Context, Mode, WorkCompletion};

/// `rounds` batches of `batch` calls of `f` (after one warm-up batch): ns per call.
fn measure(rounds: usize, batch: u32, mut f: impl FnMut()) -> Samples {
    Batches::fixed(rounds, u64::from(batch)).run(|n| time_ops(n, &mut f))
}

fn roundtrip(mode: Mode, rounds: usize, batch: u32) -> Samples {
    let w = World::new();
    w.attach();
    let be = FakeBackend::start(&w);
    let ctx = Context::builder()
        .platform(w.guest_platform())
        .store(w.guest_store())
        .mode(mode)
        .open()
        .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mut cq = ctx.create_cq(64).unwrap();
    let mut qp = pd
        .create_qp(&cq, &cq)
        .sq_size(16)
        .rq_size(16)
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let engine = if mode == Mode::Bypass {
        let (st, s) = (be.state.clone(), stop.clone());
        Some(std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                st.lock().unwrap().run_engine(false);
            }
        }))
    } else {
        be.state.lock().unwrap().mediated_engine = true;
        None
    };
    let mut wc = [WorkCompletion::default(); 4];
    let payload = [0x5au8; 64];
    let r = measure(rounds, batch, || {
        qp.post_send_inline(&payload[..32], 1).unwrap();
        while cq.poll(&mut wc).unwrap().is_empty() {
            std::hint::spin_loop();
        }
    });
    stop.store(true, Ordering::Relaxed);
    if let Some(e) = engine {
        e.join().unwrap();
    }
    drop(qp);
    drop(cq);
    drop(pd);
    drop(ctx);
    r
}

/// Post → CQE of a 64-byte RDMA WRITE through the real backend daemon and software device.
fn real_roundtrip(mode: Mode, rounds: usize, batch: u32) -> Samples {
    let mut p = RealPair::start(mode);
    let (local, remote) = (p.src.slice(0..64), p.dst.remote().slice(0..64));
    let mut wc = [WorkCompletion::default(); 4];
    measure(rounds, batch, || {
        p.q1.post_write(&[local], remote, 1).unwrap();
        loop {
            let done = p.cq.poll(&mut wc).unwrap();
            if let Some(w) = done.first() {
                assert!(w.is_ok(), "{w:?}");
                break;
            }
            std::hint::spin_loop();
        }
    })
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: run short.
    let quick = !std::env::args().any(|a| a == "--bench");
    let (rounds, batch_b, batch_m) = if quick {
        (3, 200, 20)
    } else {
        (31, 20_000, 500)
    };
    let floor = CacheLinePingPong::measure_floor();
    let real_b = real_roundtrip(Mode::Bypass, rounds, batch_b);
    let real_m = real_roundtrip(Mode::Mediated, rounds, batch_m);
    let bypass = roundtrip(Mode::Bypass, rounds, batch_b);
    let mediated = roundtrip(Mode::Mediated, rounds, batch_m);
    println!("split driver round trip (post -> CQE), ns, medians of batch means:");
    println!("{}", figure_line("cache_line (floor, 2 spin)", &floor));
    println!("  real backend + software device, 64-byte RDMA WRITE:");
    println!("{}", figure_line("  bypass (2 spin)", &real_b));
    println!("{}", figure_line("  mediated", &real_m));
    println!(
        "    (bypass: poster and engine spin; mediated: poster spins 50 us per request then \
         blocks, engine spins, control thread blocks)"
    );
    let ratios = [
        (
            RatioRecord::of("roundtrip/real_bypass", &real_b, &floor),
            "  bypass / cache_line",
            "<= 2.0",
        ),
        (
            RatioRecord::of("roundtrip/real_mediated_vs_bypass", &real_m, &real_b),
            "  mediated / bypass",
            ">= 20",
        ),
    ];
    for (r, label, target) in &ratios {
        println!("{}", ratio_line(label, r, target));
        println!("{r}");
    }
    println!("  fake backend (toy engine), 32-byte inline SEND:");
    println!("{}", figure_line("  bypass (2 spin)", &bypass));
    println!("{}", figure_line("  mediated", &mediated));
    println!("    (mediated: poster spins 50 us then blocks; backend blocks)");
    let ratios = [
        (
            RatioRecord::of("roundtrip/fake_bypass", &bypass, &floor),
            "  bypass / cache_line",
        ),
        (
            RatioRecord::of("roundtrip/fake_mediated_vs_bypass", &mediated, &bypass),
            "  mediated / bypass",
        ),
    ];
    for (r, label) in &ratios {
        println!("{}", ratio_line(label, r, "-"));
        println!("{r}");
    }
}
