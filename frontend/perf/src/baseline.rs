//! Floors and alternatives measured in the same process and run as the vrdma figures: the
//! workspace's one cache-line ping-pong floor (bench-support), single-core memcpy bandwidth,
//! and TCP over loopback (ping-pong and streaming) with the same message sizes.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use anyhow::{Context as _, Result};
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

fn loopback_pair() -> Result<(TcpStream, TcpStream)> {
    let l = TcpListener::bind("127.0.0.1:0").context("bind a loopback TCP listener")?;
    let a = TcpStream::connect(l.local_addr()?).context("connect over loopback")?;
    let (b, _) = l.accept()?;
    a.set_nodelay(true)?;
    b.set_nodelay(true)?;
    Ok((a, b))
}

/// Round trips (µs) of a TCP ping-pong over loopback with `size`-byte messages (blocking
/// sockets, `TCP_NODELAY`: no thread spins). At most `iters` round trips; fewer (at least 100)
/// if the first 100 say the rest would take longer than [`BASELINE_TIME_CAP`].
pub fn tcp_pingpong_rtts(size: usize, iters: usize) -> Result<Vec<f64>> {
    let probe = tcp_pingpong_n(size, iters.min(100))?;
    let per = probe.iter().sum::<f64>() / probe.len().max(1) as f64;
    let more = ((BASELINE_TIME_CAP.as_secs_f64() * 1e6 / per.max(0.001)) as usize)
        .min(iters.saturating_sub(probe.len()));
    let mut all = probe;
    if more > 0 {
        all.extend(tcp_pingpong_n(size, more)?);
    }
    Ok(all)
}

fn tcp_pingpong_n(size: usize, iters: usize) -> Result<Vec<f64>> {
    let (mut a, mut b) = loopback_pair()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = vec![0u8; size];
        for _ in 0..iters {
            b.read_exact(&mut buf)?;
            b.write_all(&buf)?;
        }
        Ok(())
    });
    let mut buf = vec![0x5au8; size];
    let mut rtts = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        a.write_all(&buf)?;
        a.read_exact(&mut buf)?;
        rtts.push(t.elapsed().as_secs_f64() * 1e6);
    }
    echo.join()
        .map_err(|_| anyhow::anyhow!("TCP echo thread panicked"))??;
    Ok(rtts)
}

/// TCP streaming bandwidth over loopback: `iters` writes of `size` bytes, timed until the
/// receiver has read them all.
pub fn tcp_stream_bw(size: usize, iters: usize) -> Result<BwRow> {
    let (mut a, mut b) = loopback_pair()?;
    let total = size * iters;
    let sink = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = vec![0u8; (1 << 20).max(size)];
        let mut got = 0;
        while got < total {
            let n = b.read(&mut buf)?;
            if n == 0 {
                break;
            }
            got += n;
        }
        b.write_all(b"k")
    });
    let buf = vec![0x5au8; size];
    let t = Instant::now();
    for _ in 0..iters {
        a.write_all(&buf)?;
    }
    let mut ack = [0u8; 1];
    a.read_exact(&mut ack)?;
    let secs = t.elapsed().as_secs_f64();
    sink.join()
        .map_err(|_| anyhow::anyhow!("TCP sink thread panicked"))??;
    Ok(BwRow::new(size, iters, secs, 0, &[]))
}

/// Baselines for one message size.
#[derive(Debug, Clone, Copy)]
pub struct SizeBaseline {
    pub bytes: usize,
    pub tcp_pingpong: LatencyRow,
    pub tcp_stream: BwRow,
    pub memcpy: BwRow,
}

/// Everything `--baseline` measures.
#[derive(Debug, Clone)]
pub struct Baselines {
    /// Round trips of the bare cache-line ping-pong: statistics of its batch means.
    pub cache_line_rtt: LatencyRow,
    pub sizes: Vec<SizeBaseline>,
}

/// Halves every sample (one-way latency from round trips).
pub fn halve(v: &[f64]) -> Vec<f64> {
    v.iter().map(|x| x / 2.0).collect()
}

impl Baselines {
    /// Measures all baselines for `sizes` with `iters` iterations each.
    pub fn measure(sizes: &[usize], iters: usize) -> Result<Baselines> {
        let iters = iters.max(100);
        let (cl, round_trips) = cache_line_rtts();
        let cache_line_rtt = LatencyRow::from_samples(8, round_trips, &cl);
        let mut out = Vec::new();
        for &s in sizes {
            let rtts = tcp_pingpong_rtts(s, iters).context("TCP ping-pong baseline")?;
            out.push(SizeBaseline {
                bytes: s,
                tcp_pingpong: LatencyRow::from_samples(s, iters, &rtts),
                tcp_stream: tcp_stream_bw(s, stream_iters(s, iters))
                    .context("TCP stream baseline")?,
                memcpy: memcpy_bw(s, iters),
            });
        }
        Ok(Baselines {
            cache_line_rtt,
            sizes: out,
        })
    }

    /// The baselines of one size.
    pub fn size(&self, bytes: usize) -> Option<&SizeBaseline> {
        self.sizes.iter().find(|b| b.bytes == bytes)
    }
}

/// Enough streaming writes to move at least 16 MiB (small messages are syscall-bound).
fn stream_iters(size: usize, iters: usize) -> usize {
    iters.max((16 << 20) / size.max(1)).min(1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baselines_measure_something() {
        let b = Baselines::measure(&[64, 4096], 200).unwrap();
        assert!(b.cache_line_rtt.t_typical > 0.0);
        assert_eq!(b.sizes.len(), 2);
        for s in &b.sizes {
            assert!(s.tcp_pingpong.t_typical > 0.0);
            assert!(s.tcp_stream.bw_avg_mb > 0.0);
            assert!(s.memcpy.bw_avg_mb > 0.0);
        }
        assert!(b.size(4096).is_some() && b.size(1).is_none());
    }
}
