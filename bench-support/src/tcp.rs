//! Raw TCP baselines between two addresses: the denominators of the inter-host rows of the
//! targets table (docs/benchmarks.md; "inter-host WRITE bandwidth ÷ raw TCP stream between the
//! same endpoints", "inter-host SEND 64 B latency ÷ raw TCP ping-pong").
//!
//! Both ends run in this process (two threads), and the connection goes between the two
//! addresses of [`Endpoints`]: the client's socket is bound to `client` before it connects to
//! a listener on `server` (port 0: the kernel picks). On the simulated hosts those are the two
//! backends' loopback addresses (127.0.0.2 and 127.0.0.3), so the baseline crosses the same
//! kernel path as the iWARP traffic between the two backends.
//!
//! * [`TcpPingPong`] — `size`-byte messages bounced by an echo thread, `TCP_NODELAY` on both
//!   sockets. [`Poll::Blocking`]: blocking reads, **no thread spins**. [`Poll::Busy`]:
//!   non-blocking sockets read in a loop, **two threads spin** (the measuring thread and the
//!   echo thread), the way a busy-polling RDMA ping-pong spins. Sampled per round trip
//!   ([`TcpPingPong::per_round_trip`], as `vrdma-perf` times its own latencies) or in batches
//!   ([`TcpPingPong::measure`], as the floor is; [`pingpong_samples`] is the standard one for
//!   benches).
//! * [`stream`] — one thread writes `count` messages of `size` bytes, another reads them all
//!   and answers one byte; timed from the first write to that answer. Blocking sockets, **no
//!   thread spins**.
//!
//! Every socket has read and write timeouts ([`IO_TIMEOUT`]) and every loop is bounded, so a
//! lost peer is an error, never a hang.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::str::FromStr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::samples::{Batches, Samples};

/// How long one read or write may wait before the baseline gives up.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The two ends of a baseline connection: the client's address (bound before it connects) and
/// the server's (its listener, port 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoints {
    pub client: IpAddr,
    pub server: IpAddr,
}

impl Endpoints {
    /// 127.0.0.1 to 127.0.0.1: a single host's loopback.
    pub const LOOPBACK: Endpoints = Endpoints {
        client: IpAddr::V4(Ipv4Addr::LOCALHOST),
        server: IpAddr::V4(Ipv4Addr::LOCALHOST),
    };

    /// The two simulated hosts of the inter-host tests: host A at 127.0.0.2 (client), host B
    /// at 127.0.0.3 (server).
    pub const TWO_HOSTS: Endpoints = Endpoints {
        client: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
        server: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)),
    };

    /// A listener on `server` (port 0) and a client bound to `client` connected to it, both
    /// with `TCP_NODELAY` and [`IO_TIMEOUT`] on reads and writes: (client, server side).
    pub fn connect(&self) -> io::Result<(TcpStream, TcpStream)> {
        let listener = TcpListener::bind(SocketAddr::new(self.server, 0))
            .map_err(|e| ctx(e, format!("bind a listener on {}", self.server)))?;
        let target = listener.local_addr()?;
        let client = connect_from(self.client, target)?;
        // The connection is already in the listener's backlog: accept does not wait.
        let (server, peer) = listener.accept()?;
        if peer.ip() != self.client {
            return Err(io::Error::other(format!(
                "the baseline connection came from {peer}, not from {}",
                self.client
            )));
        }
        for s in [&client, &server] {
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(IO_TIMEOUT))?;
            s.set_write_timeout(Some(IO_TIMEOUT))?;
        }
        Ok((client, server))
    }
}

impl std::fmt::Display for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} -> {}", self.client, self.server)
    }
}

impl FromStr for Endpoints {
    type Err = String;
    /// `CLIENT,SERVER` (two IP addresses), or one address for both.
    fn from_str(s: &str) -> Result<Endpoints, String> {
        let ip = |t: &str| {
            t.trim()
                .parse::<IpAddr>()
                .map_err(|_| format!("{t:?} is not an IP address"))
        };
        match s.split_once(',') {
            Some((c, sv)) => Ok(Endpoints {
                client: ip(c)?,
                server: ip(sv)?,
            }),
            None => {
                let a = ip(s)?;
                Ok(Endpoints {
                    client: a,
                    server: a,
                })
            }
        }
    }
}

fn ctx(e: io::Error, what: String) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A TCP socket bound to `from` (port 0) and connected to `to` (std cannot bind before
/// connecting).
fn connect_from(from: IpAddr, to: SocketAddr) -> io::Result<TcpStream> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let family = match to {
        SocketAddr::V4(_) => AddressFamily::INET,
        SocketAddr::V6(_) => AddressFamily::INET6,
    };
    let fd: OwnedFd =
        rustix::net::socket_with(family, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    rustix::net::bind(&fd, &SocketAddr::new(from, 0))
        .map_err(|e| ctx(e.into(), format!("bind the client socket to {from}")))?;
    // A blocking connect on loopback completes at once (or is refused).
    rustix::net::connect(&fd, &to).map_err(|e| ctx(e.into(), format!("connect to {to}")))?;
    Ok(TcpStream::from(fd))
}

/// How the ping-pong's two ends wait for a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poll {
    /// Blocking reads: no thread spins.
    Blocking,
    /// Non-blocking reads in a loop: two threads spin (the measuring one and the echo).
    Busy,
}

impl Poll {
    /// The spinning threads, in words (for the tables).
    pub fn spinning(self) -> &'static str {
        match self {
            Poll::Blocking => "0 (blocking reads)",
            Poll::Busy => "2 (the measuring thread and the echo thread busy-poll their sockets)",
        }
    }
}

/// Reads exactly `buf.len()` bytes; with `busy`, by spinning on a non-blocking socket until
/// [`IO_TIMEOUT`] passes without progress.
fn read_full(s: &mut TcpStream, buf: &mut [u8], busy: bool) -> io::Result<()> {
    if !busy {
        return s.read_exact(buf);
    }
    let mut got = 0;
    let mut last = Instant::now();
    let mut spins = 0u32;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                got += n;
                last = Instant::now();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                spins = spins.wrapping_add(1);
                if spins % 1024 == 0 && last.elapsed() > IO_TIMEOUT {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                std::hint::spin_loop();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf` (a non-blocking socket may take it in pieces).
fn write_full(s: &mut TcpStream, buf: &[u8], busy: bool) -> io::Result<()> {
    if !busy {
        return s.write_all(buf);
    }
    let mut sent = 0;
    let mut last = Instant::now();
    while sent < buf.len() {
        match s.write(&buf[sent..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                sent += n;
                last = Instant::now();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if last.elapsed() > IO_TIMEOUT {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                std::hint::spin_loop();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A TCP ping-pong between [`Endpoints`]: the measuring side (this value) and an echo thread.
/// Dropping it closes the connection, which ends the echo thread, and joins it.
pub struct TcpPingPong {
    stream: TcpStream,
    buf: Vec<u8>,
    poll: Poll,
    echo: Option<JoinHandle<io::Result<u64>>>,
    round_trips: u64,
}

impl TcpPingPong {
    /// Connects the two ends and starts the echo thread.
    pub fn start(ends: Endpoints, size: usize, poll: Poll) -> io::Result<TcpPingPong> {
        if size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a ping-pong message needs at least one byte",
            ));
        }
        let (client, mut server) = ends.connect()?;
        let busy = poll == Poll::Busy;
        client.set_nonblocking(busy)?;
        server.set_nonblocking(busy)?;
        let echo = std::thread::Builder::new().name("tcp-echo".into()).spawn(
            move || -> io::Result<u64> {
                let mut buf = vec![0u8; size];
                let mut n = 0u64;
                loop {
                    match read_full(&mut server, &mut buf, busy) {
                        Ok(()) => {}
                        // The measuring side closed: done.
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(n),
                        Err(e) => return Err(e),
                    }
                    write_full(&mut server, &buf, busy)?;
                    n += 1;
                }
            },
        )?;
        Ok(TcpPingPong {
            stream: client,
            buf: (0..size).map(|i| i as u8).collect(),
            poll,
            echo: Some(echo),
            round_trips: 0,
        })
    }

    /// The message size.
    pub fn size(&self) -> usize {
        self.buf.len()
    }

    /// How the two ends wait.
    pub fn poll(&self) -> Poll {
        self.poll
    }

    /// One round trip: the message out, its echo back (checked: the echo must return the
    /// bytes sent).
    pub fn round_trip(&mut self) -> io::Result<()> {
        let busy = self.poll == Poll::Busy;
        self.buf[0] = self.round_trips as u8;
        let sent = self.buf[0];
        write_full(&mut self.stream, &self.buf, busy)?;
        read_full(&mut self.stream, &mut self.buf, busy)?;
        if self.buf[0] != sent {
            return Err(io::Error::other("the echo returned other bytes"));
        }
        self.round_trips += 1;
        Ok(())
    }

    /// `n` round trips back to back; the time they took (for criterion's `iter_custom`).
    pub fn round_trips(&mut self, n: u64) -> io::Result<Duration> {
        let t = Instant::now();
        for _ in 0..n {
            self.round_trip()?;
        }
        Ok(t.elapsed())
    }

    /// Each round trip timed by its own clock reads (as `vrdma-perf` times its latencies):
    /// ns per round trip, at most `max` round trips, and no new one after `time_cap` once 100
    /// are in.
    pub fn per_round_trip(&mut self, max: usize, time_cap: Duration) -> io::Result<Samples> {
        let start = Instant::now();
        let mut s = Samples::default();
        while s.len() < max && (s.len() < 100 || start.elapsed() < time_cap) {
            let t = Instant::now();
            self.round_trip()?;
            s.push(t.elapsed(), 1);
        }
        Ok(s)
    }

    /// Batches of round trips, as the floor is sampled: ns per round trip, one sample per batch.
    pub fn measure(&mut self, batches: Batches) -> io::Result<Samples> {
        let mut err = None;
        let s = batches.run(|n| match self.round_trips(n) {
            Ok(d) => d,
            Err(e) => {
                err.get_or_insert(e);
                Duration::ZERO
            }
        });
        match err {
            Some(e) => Err(e),
            None => Ok(s),
        }
    }

    /// Round trips the echo thread answered, once it ended (closes the connection).
    pub fn finish(mut self) -> io::Result<u64> {
        self.stop()
    }

    fn stop(&mut self) -> io::Result<u64> {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        match self.echo.take() {
            Some(h) => h
                .join()
                .map_err(|_| io::Error::other("the TCP echo thread panicked"))?,
            None => Ok(0),
        }
    }
}

impl Drop for TcpPingPong {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// How a TCP ping-pong is sampled in batches (as the floor is, [`Batches::FLOOR`], with
/// batches of 1 000 round trips: a TCP round trip costs some 100 cache-line ones): one warm-up
/// batch, then 5 to 31 batches, no new one after 1 s.
pub const PINGPONG_BATCHES: Batches = Batches {
    size: 1_000,
    min: 5,
    max: 31,
    time_cap: Duration::from_secs(1),
};

/// The standard batch-sampled TCP ping-pong between `ends` (ns per round trip, one sample per
/// batch of [`PINGPONG_BATCHES`]): the denominator a bench divides an inter-host round trip of
/// the same size by (`report::RatioRecord::of(id, &value, &this)`), with the same `poll` as the
/// figure (busy-polling against [`Poll::Busy`]).
pub fn pingpong_samples(ends: Endpoints, size: usize, poll: Poll) -> io::Result<Samples> {
    let mut pp = TcpPingPong::start(ends, size, poll)?;
    let s = pp.measure(PINGPONG_BATCHES)?;
    pp.finish()?;
    Ok(s)
}

/// What [`stream`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StreamRun {
    pub size: usize,
    pub count: usize,
    /// From the first write to the receiver's answer that it read everything.
    pub elapsed: Duration,
}

impl StreamRun {
    /// Bytes moved.
    pub fn bytes(&self) -> u64 {
        (self.size * self.count) as u64
    }

    /// Bytes per second.
    pub fn bytes_per_sec(&self) -> f64 {
        self.bytes() as f64 / self.elapsed.as_secs_f64().max(1e-12)
    }
}

/// TCP streaming between [`Endpoints`]: `count` writes of `size` bytes from the client to a
/// receiving thread on the server side, which reads until it has them all and answers one
/// byte. Blocking sockets, no thread spins.
pub fn stream(ends: Endpoints, size: usize, count: usize) -> io::Result<StreamRun> {
    let (mut tx, mut rx) = ends.connect()?;
    let total = size as u64 * count as u64;
    let sink =
        std::thread::Builder::new()
            .name("tcp-sink".into())
            .spawn(move || -> io::Result<u64> {
                let mut buf = vec![0u8; (1 << 20).max(size)];
                let mut got = 0u64;
                while got < total {
                    let n = rx.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    got += n as u64;
                }
                rx.write_all(b"k")?;
                Ok(got)
            })?;
    let buf = vec![0x5au8; size];
    let t = Instant::now();
    let sent = (|| -> io::Result<Duration> {
        for _ in 0..count {
            tx.write_all(&buf)?;
        }
        let mut ack = [0u8; 1];
        tx.read_exact(&mut ack)?;
        Ok(t.elapsed())
    })();
    // On an error the sink must not wait for bytes that will never come.
    let _ = tx.shutdown(std::net::Shutdown::Both);
    let got = sink
        .join()
        .map_err(|_| io::Error::other("the TCP sink thread panicked"))?;
    let elapsed = sent?;
    let got = got?;
    if got != total {
        return Err(io::Error::other(format!(
            "the sink read {got} bytes of {total}"
        )));
    }
    Ok(StreamRun {
        size,
        count,
        elapsed,
    })
}

/// Enough messages of `size` bytes to move at least `bytes` (at least `min`).
pub fn count_for(size: usize, bytes: u64, min: usize) -> usize {
    (bytes.div_ceil(size.max(1) as u64) as usize).max(min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_connect_from_the_client_address() {
        let e: Endpoints = "127.0.0.2,127.0.0.3".parse().unwrap();
        assert_eq!(e, Endpoints::TWO_HOSTS);
        assert_eq!(
            "127.0.0.1".parse::<Endpoints>().unwrap(),
            Endpoints::LOOPBACK
        );
        assert!("127.0.0.2,nope".parse::<Endpoints>().is_err());
        let (c, s) = e.connect().unwrap();
        // Without the bind before connect, the kernel picks 127.0.0.1 as the source.
        assert_eq!(c.local_addr().unwrap().ip(), e.client);
        assert_eq!(s.peer_addr().unwrap().ip(), e.client);
        assert_eq!(s.local_addr().unwrap().ip(), e.server);
        assert!(c.nodelay().unwrap() && s.nodelay().unwrap());
    }

    fn ping_pong(poll: Poll) {
        let mut pp = TcpPingPong::start(Endpoints::TWO_HOSTS, 64, poll).unwrap();
        let s = pp.per_round_trip(300, Duration::from_secs(60)).unwrap();
        assert_eq!(s.len(), 300);
        assert!(s.ns().iter().all(|&ns| ns > 0.0));
        let b = pp.measure(Batches::fixed(3, 50)).unwrap();
        assert_eq!(b.len(), 3);
        // Every round trip reached the echo thread: 300 + a warm-up batch and 3 batches of 50.
        assert_eq!(pp.finish().unwrap(), 300 + 4 * 50);
    }

    #[test]
    fn blocking_ping_pong_is_echoed_round_trip_by_round_trip() {
        ping_pong(Poll::Blocking);
    }

    #[test]
    fn busy_ping_pong_is_echoed_round_trip_by_round_trip() {
        ping_pong(Poll::Busy);
    }

    #[test]
    fn stream_moves_every_byte() {
        let r = stream(Endpoints::TWO_HOSTS, 65536, 64).unwrap();
        assert_eq!(r.bytes(), 64 * 65536);
        assert!(r.bytes_per_sec() > 0.0);
        assert_eq!(count_for(1 << 20, 16 << 20, 1), 16);
        assert_eq!(count_for(3, 10, 1), 4);
        assert_eq!(count_for(1 << 20, 1, 5), 5);
    }

    #[test]
    fn standard_pingpong_samples_are_batches() {
        let s = pingpong_samples(Endpoints::TWO_HOSTS, 64, Poll::Blocking).unwrap();
        assert!((5..=31).contains(&s.len()), "{}", s.len());
        assert!(s.median() > 0.0);
    }

    #[test]
    fn zero_byte_messages_are_refused() {
        assert!(TcpPingPong::start(Endpoints::LOOPBACK, 0, Poll::Blocking).is_err());
    }
}
