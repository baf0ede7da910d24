//! Floors and alternatives measured in the same process and run as the vrdma figures: the
//! workspace's one cache-line ping-pong floor (bench-support), single-core memcpy bandwidth,
//! and raw TCP (ping-pong, blocking and busy-polled, and streaming) with the same message
//! sizes between two addresses (`--between`: 127.0.0.1 by default, the two simulated hosts'
//! 127.0.0.2 and 127.0.0.3 for the inter-host rows; bench-support's `tcp` module).

use std::time::Instant;

use anyhow::{Context as _, Result};
use bench_support::tcp::{self, TcpPingPong};
pub use bench_support::tcp::{Endpoints, Poll};
use bench_support::{Batches, CacheLinePingPong};

use crate::stats::{BwRow, LatencyRow};

/// Longest a baseline keeps sampling (a loaded machine can make each sample take a time slice).
pub const BASELINE_TIME_CAP: std::time::Duration = std::time::Duration::from_secs(1);

/// The bare cache-line ping-pong, the floor every vrdma benchmark uses
/// (`bench_support::CacheLinePingPong`: two spinning threads, two 128-byte lines with one
/// writer each), sampled as everywhere ([`Batches::FLOOR`]): mean round trip (µs) of each batch
/// of 10 000, and how many round trips were run in all. (The latency row built from them drops
/// the two largest batch means, as perftest does for every row.)
pub fn cache_line_rtts() -> (Vec<f64>, usize) {
    let s = CacheLinePingPong::measure_floor();
    let us = s.ns().iter().map(|ns| ns / 1e3).collect();
    (us, s.len() * Batches::FLOOR.size as usize)
}

/// Single-core memcpy bandwidth for `size`-byte copies, `iters` copies (at least 64 MiB
/// copied in all so small sizes are not all timer noise).
pub fn memcpy_bw(size: usize, iters: usize) -> BwRow {
    let src = vec![0xa5u8; size];
    let mut dst = vec![0u8; size];
    let iters = iters.max((64 << 20) / size.max(1)).min(10_000_000);
    let t = Instant::now();
    for _ in 0..iters {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    BwRow::new(size, iters, t.elapsed().as_secs_f64(), 0, &[])
}

/// Round trips (µs) of a TCP ping-pong between `ends` with `size`-byte messages
/// (`TCP_NODELAY`; [`Poll::Blocking`]: no thread spins, [`Poll::Busy`]: two threads spin), each
/// timed by its own clock reads as the vrdma latencies are, after 10 warm-up round trips. At
/// most `iters` round trips; fewer (at least 100) once [`BASELINE_TIME_CAP`] has passed.
pub fn tcp_pingpong_rtts(
    ends: Endpoints,
    size: usize,
    iters: usize,
    poll: Poll,
) -> Result<Vec<f64>> {
    let mut pp =
        TcpPingPong::start(ends, size, poll).with_context(|| format!("TCP ping-pong {ends}"))?;
    pp.round_trips(10)?;
    let s = pp.per_round_trip(iters.max(1), BASELINE_TIME_CAP)?;
    pp.finish()?;
    Ok(s.ns().iter().map(|ns| ns / 1e3).collect())
}

/// TCP streaming bandwidth between `ends`: `iters` writes of `size` bytes, timed until the
/// receiver has read them all (blocking sockets, no thread spins).
pub fn tcp_stream_bw(ends: Endpoints, size: usize, iters: usize) -> Result<BwRow> {
    let r = tcp::stream(ends, size, iters).with_context(|| format!("TCP stream {ends}"))?;
    Ok(BwRow::new(size, iters, r.elapsed.as_secs_f64(), 0, &[]))
}

/// Baselines for one message size.
#[derive(Debug, Clone, Copy)]
pub struct SizeBaseline {
    pub bytes: usize,
    /// Round trips, blocking reads (no thread spins).
    pub tcp_pingpong: LatencyRow,
    /// Round trips, both ends busy-polling non-blocking sockets (two threads spin).
    pub tcp_pingpong_busy: LatencyRow,
    pub tcp_stream: BwRow,
    pub memcpy: BwRow,
}

/// Everything `--baseline` measures.
#[derive(Debug, Clone)]
pub struct Baselines {
    /// Round trips of the bare cache-line ping-pong: statistics of its batch means.
    pub cache_line_rtt: LatencyRow,
    /// Between which addresses the TCP rows ran.
    pub tcp_endpoints: Endpoints,
    pub sizes: Vec<SizeBaseline>,
}

/// Halves every sample (one-way latency from round trips).
pub fn halve(v: &[f64]) -> Vec<f64> {
    v.iter().map(|x| x / 2.0).collect()
}

impl Baselines {
    /// Measures all baselines for `sizes` with `iters` iterations each, the TCP ones between
    /// `ends`.
    pub fn measure(sizes: &[usize], iters: usize, ends: Endpoints) -> Result<Baselines> {
        let iters = iters.max(100);
        let (cl, round_trips) = cache_line_rtts();
        let cache_line_rtt = LatencyRow::from_samples(8, round_trips, &cl);
        let mut out = Vec::new();
        for &s in sizes {
            let rtts = tcp_pingpong_rtts(ends, s, iters, Poll::Blocking)
                .context("TCP ping-pong baseline")?;
            let busy = tcp_pingpong_rtts(ends, s, iters, Poll::Busy)
                .context("TCP busy ping-pong baseline")?;
            out.push(SizeBaseline {
                bytes: s,
                tcp_pingpong: LatencyRow::from_samples(s, rtts.len(), &rtts),
                tcp_pingpong_busy: LatencyRow::from_samples(s, busy.len(), &busy),
                tcp_stream: tcp_stream_bw(ends, s, stream_iters(s, iters))
                    .context("TCP stream baseline")?,
                memcpy: memcpy_bw(s, iters),
            });
        }
        Ok(Baselines {
            cache_line_rtt,
            tcp_endpoints: ends,
            sizes: out,
        })
    }

    /// The baselines of one size.
    pub fn size(&self, bytes: usize) -> Option<&SizeBaseline> {
        self.sizes.iter().find(|b| b.bytes == bytes)
    }
}

/// Enough streaming writes to move at least 16 MiB (small messages are syscall-bound).
pub fn stream_iters(size: usize, iters: usize) -> usize {
    iters.max((16 << 20) / size.max(1)).min(1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baselines_measure_something() {
        let b = Baselines::measure(&[64, 4096], 200, Endpoints::LOOPBACK).unwrap();
        assert!(b.cache_line_rtt.t_typical > 0.0);
        assert_eq!(b.sizes.len(), 2);
        for s in &b.sizes {
            assert!(s.tcp_pingpong.t_typical > 0.0);
            assert!(s.tcp_pingpong_busy.t_typical > 0.0);
            assert!(s.tcp_stream.bw_avg_mb > 0.0);
            assert!(s.memcpy.bw_avg_mb > 0.0);
        }
        assert!(b.size(4096).is_some() && b.size(1).is_none());
    }

    #[test]
    fn tcp_rows_between_the_two_hosts_addresses() {
        let e = Endpoints::TWO_HOSTS;
        for poll in [Poll::Blocking, Poll::Busy] {
            let r = tcp_pingpong_rtts(e, 64, 150, poll).unwrap();
            // 150 round trips, or at least 100 if the time cap ends them first (a busy-polled
            // ping-pong on a loaded 2-core machine can take longer than the cap).
            assert!((100..=150).contains(&r.len()), "{poll:?}: {}", r.len());
            assert!(r.iter().all(|x| *x > 0.0));
        }
        let bw = tcp_stream_bw(e, 65536, 32).unwrap();
        assert_eq!((bw.bytes, bw.iterations), (65536, 32));
        assert!(bw.bw_avg_mb > 0.0);
        // An address nobody can bind is an error, not a hang.
        let bad: Endpoints = "192.0.2.1,127.0.0.3".parse().unwrap();
        assert!(tcp_pingpong_rtts(bad, 64, 10, Poll::Blocking).is_err());
    }
}
