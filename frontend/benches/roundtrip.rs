//! Post → CQE round trip through the frontend library, bypass vs mediated, against the bare
//! cache-line ping-pong floor measured in the same run.
//!
//! The device is the scripted fake backend of `tests/common` on a simulated host in this
//! process (grants = shared memfd pages, event channels = eventfds, XenStore = the embedded
//! server): its toy engine completes every SEND at once. So this measures what the frontend
//! and the shared-memory protocol cost, not the software device model.
//!
//! * `cache_line` — two threads bounce one atomic word (both spin).
//! * `bypass` — `post_send_inline` (WQE + release-store + kick check) then `poll` until the
//!   CQE's phase bit flips; the engine thread spins on the SQ producer index. Two threads spin:
//!   the poster and the engine.
//! * `mediated` — the same calls in mediated mode: a `PostSend` and (at least) one `PollCq`
//!   control request, each a ring round trip with event-channel notifications; the poster
//!   spins 50 µs per request before blocking, the backend thread blocks on its event channel.
//!
//! `cargo bench -p vrdma --bench roundtrip`

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use common::{FakeBackend, World};
use vrdma::{Context, Mode, WorkCompletion};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Median over `rounds` of the mean round trip of `batch` iterations, in ns.
fn measure(rounds: usize, batch: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..batch {
        f();
    }
    let v = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..batch {
                f();
            }
            t.elapsed().as_nanos() as f64 / f64::from(batch)
        })
        .collect();
    median(v)
}

fn cache_line() -> f64 {
    let word = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (w, s) = (word.clone(), stop.clone());
    let echo = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            let v = w.load(Ordering::Acquire);
            if v % 2 == 1 {
                w.store(v + 1, Ordering::Release);
            }
        }
    });
    let mut next = 0u32;
    let r = measure(31, 20_000, || {
        word.store(next + 1, Ordering::Release);
        while word.load(Ordering::Acquire) != next + 2 {
            std::hint::spin_loop();
        }
        next += 2;
    });
    stop.store(true, Ordering::Relaxed);
    echo.join().unwrap();
    r
}

fn roundtrip(mode: Mode, rounds: usize, batch: u32) -> f64 {
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

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: run short.
    let quick = !std::env::args().any(|a| a == "--bench");
    let (rounds, batch_b, batch_m) = if quick {
        (3, 200, 20)
    } else {
        (31, 20_000, 500)
    };
    let floor = cache_line();
    let bypass = roundtrip(Mode::Bypass, rounds, batch_b);
    let mediated = roundtrip(Mode::Mediated, rounds, batch_m);
    println!("split driver (frontend) round trip, 32-byte inline SEND -> CQE, medians:");
    println!("  cache_line  {floor:>10.1} ns   (2 threads spin)");
    println!("  bypass      {bypass:>10.1} ns   (2 threads spin: poster, engine)");
    println!(
        "  mediated    {mediated:>10.1} ns   (poster spins 50 us then blocks; backend blocks)"
    );
    println!(
        "  bypass / cache_line = {:.2}   (target <= 2.0)",
        bypass / floor
    );
    println!(
        "  mediated / bypass   = {:.1}   (target >= 20)",
        mediated / bypass
    );
}
