//! The floor of every latency ratio: a cache-line ping-pong between two spinning threads.
//!
//! **What one round trip is.** Two 64-bit counters, `ping` and `pong`, each alone in its own
//! 128-byte-aligned line (128, not 64: x86's adjacent-line prefetcher fetches lines in pairs,
//! so two 64-byte neighbours would still disturb each other). The measuring thread is the only
//! writer of `ping`, the echo thread the only writer of `pong`. The measuring thread
//! release-stores `n` to `ping` and acquire-spins on `pong`; the echo thread, acquire-spinning
//! on `ping`, sees `n` and release-stores it to `pong`; the measuring thread sees it. So one
//! round trip moves `ping` to the echo's core and `pong` back: **two cache-line transfers**,
//! each a line written by one side and read by the other. Nothing else is touched while it
//! runs (the echo is stopped through `ping` itself, with a sentinel value).
//!
//! **Why this one.** It is the physical minimum of a bypass post → CQE round trip: the poster
//! writes a WQE and the producer index that the engine reads, the engine writes a CQE that the
//! poster reads — at least one line each way, each with a single writer, which is exactly this
//! protocol. A variant where both threads write one shared word (used until issue 11 by the
//! library bench) is a different protocol — one line changing owner with a read and a write
//! upgrade on each side — and measured 140 ns on a machine where this one measured 270–370 ns,
//! so ratios against the two were not comparable.
//!
//! **Threads.** Two, both spinning; not pinned to CPUs, because the engine and poster threads
//! the floor is compared against are not pinned either (the same scheduler treats both), and on
//! a loaded 2-core machine a pinned spinner cannot move away from a busy core.
//!
//! **How it is sampled.** Like every figure divided by it: [`Batches`] of many round trips
//! between two clock reads, one sample = the mean round trip of a batch, the figure = the median
//! of the samples ([`Batches::FLOOR`] for the standalone measurement; criterion's `iter_custom`
//! batches in the criterion benches, through [`CacheLinePingPong::round_trips`]).

use std::hint::spin_loop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::samples::{Batches, Samples};

/// A counter alone in a 128-byte line.
#[repr(C, align(128))]
struct Line(AtomicU64);

/// `ping` (written by the measuring thread) and `pong` (written by the echo thread).
struct Lines {
    ping: Line,
    pong: Line,
}

/// The value of `ping` that tells the echo thread to exit.
const STOP: u64 = u64::MAX;

/// The floor: a running echo thread and the two lines (see the module documentation).
/// Dropping it stops the echo thread.
pub struct CacheLinePingPong {
    lines: Arc<Lines>,
    seq: u64,
    echo: Option<JoinHandle<()>>,
}

impl CacheLinePingPong {
    /// Starts the echo thread (it spins until this is dropped).
    pub fn start() -> CacheLinePingPong {
        let lines = Arc::new(Lines {
            ping: Line(AtomicU64::new(0)),
            pong: Line(AtomicU64::new(0)),
        });
        let l = lines.clone();
        let echo = std::thread::Builder::new()
            .name("floor-echo".into())
            .spawn(move || {
                let mut seen = 0;
                loop {
                    let v = l.ping.0.load(Ordering::Acquire);
                    if v == seen {
                        spin_loop();
                    } else if v == STOP {
                        return;
                    } else {
                        l.pong.0.store(v, Ordering::Release);
                        seen = v;
                    }
                }
            })
            .expect("spawn the cache-line echo thread");
        CacheLinePingPong {
            lines,
            seq: 0,
            echo: Some(echo),
        }
    }

    /// One round trip: `ping` out, `pong` back.
    #[inline]
    pub fn round_trip(&mut self) {
        self.seq += 1;
        let n = self.seq;
        self.lines.ping.0.store(n, Ordering::Release);
        while self.lines.pong.0.load(Ordering::Acquire) != n {
            spin_loop();
        }
    }

    /// `n` round trips back to back; the time they took (for criterion's `iter_custom`).
    pub fn round_trips(&mut self, n: u64) -> Duration {
        let t = Instant::now();
        for _ in 0..n {
            self.round_trip();
        }
        t.elapsed()
    }

    /// Samples the floor with `batches`: ns per round trip, one sample per batch.
    pub fn measure(&mut self, batches: Batches) -> Samples {
        batches.run(|n| self.round_trips(n))
    }

    /// The standard standalone measurement: starts the echo, [`Batches::FLOOR`], stops it.
    pub fn measure_floor() -> Samples {
        CacheLinePingPong::start().measure(Batches::FLOOR)
    }
}

impl Drop for CacheLinePingPong {
    fn drop(&mut self) {
        self.lines.ping.0.store(STOP, Ordering::Release);
        if let Some(h) = self.echo.take() {
            // The echo thread only spins and stores; it cannot panic.
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_do_not_share_a_128_byte_pair() {
        let l = Lines {
            ping: Line(AtomicU64::new(0)),
            pong: Line(AtomicU64::new(0)),
        };
        let (a, b) = (
            &l.ping as *const Line as usize,
            &l.pong as *const Line as usize,
        );
        assert_eq!(a % 128, 0);
        assert_eq!(b % 128, 0);
        assert_eq!(b - a, 128);
    }

    #[test]
    fn every_round_trip_is_echoed_and_drop_stops_the_echo() {
        let mut pp = CacheLinePingPong::start();
        pp.round_trips(1000);
        assert_eq!(pp.lines.pong.0.load(Ordering::Acquire), 1000);
        let s = pp.measure(Batches {
            size: 100,
            min: 3,
            max: 3,
            time_cap: Duration::from_secs(60),
        });
        assert_eq!(s.len(), 3);
        assert_eq!(pp.lines.pong.0.load(Ordering::Acquire), 1000 + 100 * 4);
        drop(pp); // joins the echo thread: a missed STOP would hang here
    }
}
