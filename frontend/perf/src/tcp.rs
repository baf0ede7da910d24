//! `vrdma-perf tcp_pingpong` and `vrdma-perf tcp_stream` (also `--baseline tcp-pingpong`):
//! the raw TCP baselines on their own, both ends in this process, between the two addresses
//! of `--between` — the denominators of the inter-host rows of the targets table
//! (docs/benchmarks.md) when given the two simulated hosts' addresses (127.0.0.2,127.0.0.3).
//! No vrdma device is opened.
//!
//! * `tcp_pingpong` (default size 64 B): round trips with `TCP_NODELAY`, blocking reads (no
//!   thread spins) and busy-polled non-blocking sockets (two threads spin); with `--events`,
//!   blocking only. Each round trip timed by its own clock reads, as vrdma-perf's own
//!   latencies; perftest's statistics.
//! * `tcp_stream` (default sizes 64 KiB and 1 MiB): one connection, `--iters` messages per
//!   size (default: 1 GiB's worth), timed until the receiver has read them all; blocking, no
//!   thread spins.

use anyhow::Result;
use serde_json::json;

use crate::baseline::{tcp_pingpong_rtts, tcp_stream_bw, Endpoints, Poll};
use crate::run::{PerfArgs, Test};
use crate::stats::{bw_table, latency_table, BwRow, LatencyRow};

/// Bytes each `tcp_stream` size moves when `--iters` is not given.
pub const DEFAULT_STREAM_BYTES: u64 = 1 << 30;

/// What a TCP baseline run measured.
#[derive(Debug, Clone)]
pub struct TcpReport {
    pub test: Test,
    pub ends: Endpoints,
    /// Per way of polling, one round-trip row per size (`tcp_pingpong`).
    pub pingpong: Vec<(Poll, Vec<LatencyRow>)>,
    /// One row per size (`tcp_stream`).
    pub stream: Vec<BwRow>,
}

fn poll_name(p: Poll) -> &'static str {
    match p {
        Poll::Blocking => "blocking",
        Poll::Busy => "busy-poll",
    }
}

/// Runs `args.test` (a TCP baseline) for `sizes`; `iters` as given on the command line.
pub fn run(args: &PerfArgs, sizes: &[usize], iters: Option<usize>) -> Result<TcpReport> {
    if sizes.contains(&0) {
        anyhow::bail!("--size 0 is not supported");
    }
    let ends = args.endpoints();
    let mut report = TcpReport {
        test: args.test,
        ends,
        pingpong: Vec::new(),
        stream: Vec::new(),
    };
    match args.test {
        Test::TcpPingpong => {
            let polls: &[Poll] = if args.events {
                &[Poll::Blocking]
            } else {
                &[Poll::Blocking, Poll::Busy]
            };
            let iters = iters.unwrap_or(1000).max(1);
            for &poll in polls {
                let mut rows = Vec::new();
                for &size in sizes {
                    let rtts = tcp_pingpong_rtts(ends, size, iters, poll)?;
                    rows.push(LatencyRow::from_samples(size, rtts.len(), &rtts));
                }
                report.pingpong.push((poll, rows));
            }
        }
        Test::TcpStream => {
            for &size in sizes {
                let n = match iters {
                    Some(n) => n.max(1),
                    None => bench_support::tcp::count_for(size, DEFAULT_STREAM_BYTES, 1),
                };
                report.stream.push(tcp_stream_bw(ends, size, n)?);
            }
        }
        other => anyhow::bail!("{} is not a TCP baseline", other.name()),
    }
    Ok(report)
}

impl TcpReport {
    /// perftest-style text.
    pub fn text(&self) -> String {
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let mut s = format!(
            "# vrdma-perf {}  TCP {} (client socket bound to the first address, listener on the \
             second, both ends in this process; TCP_NODELAY)  this machine has {cores} cores\n",
            self.test.name(),
            self.ends
        );
        for (poll, rows) in &self.pingpong {
            s.push_str(&format!(
                "# polling: {}  spinning threads: {}\n# latency is the round trip (one-way = \
                 RTT/2, as send_lat and write_lat report)\n",
                poll_name(*poll),
                poll.spinning()
            ));
            s.push_str(&latency_table(rows));
        }
        if !self.stream.is_empty() {
            s.push_str(&format!(
                "# polling: blocking  spinning threads: {}\n",
                Poll::Blocking.spinning()
            ));
            s.push_str(&bw_table(&self.stream));
        }
        s
    }

    /// The same as one JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "test": self.test.name(),
            "endpoints": {"client": self.ends.client.to_string(), "server": self.ends.server.to_string()},
            "pingpong_rtt": self.pingpong.iter().map(|(p, rows)| json!({
                "polling": poll_name(*p),
                "spinning_threads": p.spinning(),
                "latency": rows.iter().map(LatencyRow::to_json).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "stream": {
                "spinning_threads": Poll::Blocking.spinning(),
                "bandwidth": self.stream.iter().map(BwRow::to_json).collect::<Vec<_>>(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(line: &[&str]) -> PerfArgs {
        PerfArgs::try_parse_from(std::iter::once("vrdma-perf").chain(line.iter().copied())).unwrap()
    }

    #[test]
    fn the_command_lines_parse() {
        let a = args(&[
            "--baseline",
            "tcp-pingpong",
            "--between",
            "127.0.0.2,127.0.0.3",
        ]);
        assert_eq!(a.test, Test::TcpPingpong);
        assert_eq!(a.endpoints(), Endpoints::TWO_HOSTS);
        assert_eq!(args(&["tcp_stream"]).test, Test::TcpStream);
        assert_eq!(args(&["tcp_stream"]).endpoints(), Endpoints::LOOPBACK);
        // The vrdma tests and their --baseline as before.
        let a = args(&["send_lat", "127.0.0.1", "--baseline"]);
        assert!(a.baseline && a.test == Test::SendLat && a.host.as_deref() == Some("127.0.0.1"));
        assert!(PerfArgs::try_parse_from(["vrdma-perf", "tcp_stream", "--between", "x"]).is_err());
    }

    #[test]
    fn tcp_pingpong_reports_both_pollings_between_the_addresses() {
        let a = args(&[
            "tcp_pingpong",
            "--between",
            "127.0.0.2,127.0.0.3",
            "--iters",
            "200",
        ]);
        let r = run(&a, &[64, 4096], Some(200)).unwrap();
        let polls: Vec<Poll> = r.pingpong.iter().map(|(p, _)| *p).collect();
        assert_eq!(polls, [Poll::Blocking, Poll::Busy]);
        for (_, rows) in &r.pingpong {
            let sizes: Vec<usize> = rows.iter().map(|x| x.bytes).collect();
            assert_eq!(sizes, [64, 4096]);
            // At most --iters round trips; at least 100 when the 1 s cap ends them first (a
            // loaded machine: the busy-polled pair shares the cores with everything else).
            assert!(
                rows.iter()
                    .all(|x| (100..=200).contains(&x.iterations) && x.t_typical > 0.0),
                "{rows:?}"
            );
        }
        let t = r.text();
        assert!(t.contains("TCP 127.0.0.2 -> 127.0.0.3"), "{t}");
        assert!(
            t.contains("spinning threads: 0") && t.contains("spinning threads: 2"),
            "{t}"
        );
        let j = r.to_json();
        assert_eq!(j["endpoints"]["server"], "127.0.0.3");
        assert_eq!(j["pingpong_rtt"][1]["polling"], "busy-poll");
        assert_eq!(j["pingpong_rtt"][0]["latency"][0]["bytes"], 64);
        assert!(r.stream.is_empty());
        // --events: blocking only.
        let a = args(&["tcp_pingpong", "--events"]);
        assert_eq!(run(&a, &[64], Some(100)).unwrap().pingpong.len(), 1);
    }

    #[test]
    fn tcp_stream_reports_each_size() {
        let a = args(&["tcp_stream", "--between", "127.0.0.2,127.0.0.3"]);
        let r = run(&a, &[65536, 1 << 20], Some(16)).unwrap();
        let got: Vec<(usize, usize)> = r.stream.iter().map(|x| (x.bytes, x.iterations)).collect();
        assert_eq!(got, [(65536, 16), (1 << 20, 16)]);
        assert!(r.stream.iter().all(|x| x.bw_avg_mb > 0.0));
        assert!(r.pingpong.is_empty());
        assert_eq!(r.to_json()["stream"]["bandwidth"][1]["bytes"], 1 << 20);
    }
}
