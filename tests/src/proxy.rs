//! A loopback TCP proxy that breaks connections on purpose, for the inter-host tests: it
//! listens on `127.0.0.x:0`, forwards every connection it accepts to a target, and applies one
//! [`Fault`] to each connection, counted in one [`Dir`]ection:
//!
//! * [`Fault::Pass`] — forwards everything;
//! * [`Fault::ResetAfter`]`(n)` — forwards `n` bytes, then resets **both** sides (each gets a
//!   TCP RST: `SO_LINGER` 0 and close, so their reads and writes fail with
//!   `ConnectionReset`, never a clean end of stream);
//! * [`Fault::StallAfter`]`(n)` — forwards `n` bytes, then stops forwarding in both
//!   directions, keeping both connections open (a peer that hangs, not one that dies);
//! * [`Fault::FlipByte`]`(n)` — forwards everything, with the byte at offset `n` XORed with
//!   0xff (a corrupted byte that TCP's own checksum did not catch: MPA's CRC must).
//!
//! Offsets and counts are of the connection's byte stream in that direction from its first
//! byte (for iWARP: the MPA request or reply included), per connection.
//!
//! [`Proxy::recording`] (or [`Proxy::start_recording`] with a fault) also keeps every byte it
//! forwards, per connection and direction in forwarding order ([`Proxy::recorded`]), for a
//! capture file ([`crate::pcap`]).
//!
//! [`Proxy::cut`] resets every open connection at once (a cable cut mid-transfer, whatever the
//! fault). [`Proxy::in_front_of`] listens on the target's own address (another port), so the
//! side that connects still talks to the target's host address.
//!
//! Bounded: at most [`MAX_CONNECTIONS`] connections (more are refused: accepted and closed),
//! every socket has a read timeout of [`TICK`] (the threads look at the stop flag between
//! reads) and a write timeout of [`WRITE_TIMEOUT`] (a receiver that stops reading fails the
//! connection instead of blocking a thread forever). Threads: one accepting, two per
//! connection (one per direction); dropping the proxy stops them all and joins them, closing
//! every connection.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a proxy thread blocks in a read (or accept poll) before it looks at its flags.
pub const TICK: Duration = Duration::from_millis(20);
/// How long a forwarding write may block before the connection is given up.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections one proxy serves; more are closed as they come.
pub const MAX_CONNECTIONS: usize = 64;

/// What the proxy does to each connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything.
    Pass,
    /// Forward this many bytes (in the fault's direction), then reset both sides.
    ResetAfter(u64),
    /// Forward this many bytes (in the fault's direction), then forward nothing more either way.
    StallAfter(u64),
    /// XOR the byte at this offset (in the fault's direction) with 0xff.
    FlipByte(u64),
}

/// A direction through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// From the side that connected to the proxy to the target.
    ToTarget,
    /// From the target back to the side that connected.
    FromTarget,
}

/// Bytes the proxy forwarded in one piece (when recording).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The connection (0 for the first accepted, counting up).
    pub conn: u64,
    pub dir: Dir,
    pub bytes: Vec<u8>,
}

/// A running proxy. Dropping it closes every connection and joins every thread.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

struct Shared {
    target: SocketAddr,
    fault: Fault,
    dir: Dir,
    stop: AtomicBool,
    conns: Mutex<Vec<Arc<Conn>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    accepted: AtomicU64,
    refused: AtomicU64,
    fired: AtomicU64,
    forwarded: [AtomicU64; 2],
    /// Proxy threads running (counted before they start, uncounted as they end).
    live: AtomicU64,
    /// What was forwarded, when recording.
    record: Option<Mutex<Vec<Chunk>>>,
}

/// One proxied connection: the accepted socket and the one to the target.
struct Conn {
    outer: TcpStream,
    inner: TcpStream,
    /// Bytes seen in the fault's direction (forwarded or not).
    counted: Mutex<u64>,
    /// Its number, in accepting order.
    id: u64,
    /// Set once the fault fired (reset or stall), or the connection ended.
    reset: AtomicBool,
    stalled: AtomicBool,
    /// The pumps that are still running; the last one out closes the sockets.
    open_pumps: AtomicU64,
}

impl Proxy {
    /// Listens on `listen_ip`, port 0, and forwards each connection to `target`, applying
    /// `fault` in direction `dir`.
    pub fn start(
        listen_ip: IpAddr,
        target: SocketAddr,
        fault: Fault,
        dir: Dir,
    ) -> io::Result<Proxy> {
        Proxy::launch(listen_ip, target, fault, dir, false)
    }

    /// [`Proxy::start`], keeping every forwarded byte ([`Proxy::recorded`]).
    pub fn start_recording(
        listen_ip: IpAddr,
        target: SocketAddr,
        fault: Fault,
        dir: Dir,
    ) -> io::Result<Proxy> {
        Proxy::launch(listen_ip, target, fault, dir, true)
    }

    /// A proxy in front of `target` (on its address) that forwards everything and records it.
    pub fn recording(target: SocketAddr) -> io::Result<Proxy> {
        Proxy::start_recording(target.ip(), target, Fault::Pass, Dir::ToTarget)
    }

    /// What was forwarded so far, in forwarding order (empty unless recording).
    pub fn recorded(&self) -> Vec<Chunk> {
        match &self.shared.record {
            Some(r) => r.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            None => Vec::new(),
        }
    }

    fn launch(
        listen_ip: IpAddr,
        target: SocketAddr,
        fault: Fault,
        dir: Dir,
        record: bool,
    ) -> io::Result<Proxy> {
        let listener = TcpListener::bind(SocketAddr::new(listen_ip, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target,
            fault,
            dir,
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            fired: AtomicU64::new(0),
            live: AtomicU64::new(1),
            forwarded: [AtomicU64::new(0), AtomicU64::new(0)],
            record: record.then(|| Mutex::new(Vec::new())),
        });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("proxy-accept".into())
            .spawn(move || {
                accept_loop(&s, listener);
                s.live.fetch_sub(1, Ordering::SeqCst);
            })?;
        Ok(Proxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// A proxy that forwards everything.
    pub fn pass(listen_ip: IpAddr, target: SocketAddr) -> io::Result<Proxy> {
        Proxy::start(listen_ip, target, Fault::Pass, Dir::ToTarget)
    }

    /// A proxy listening on the target's own address (another port): to the side that
    /// connects, the proxy is the target's host — host A's backend reaching host B at
    /// 127.0.0.3 through it still talks to 127.0.0.3, which B's allowed-peer lists and
    /// addresses expect.
    pub fn in_front_of(target: SocketAddr, fault: Fault, dir: Dir) -> io::Result<Proxy> {
        Proxy::start(target.ip(), target, fault, dir)
    }

    /// Where to connect to go through the proxy.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted and forwarded so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections refused (over [`MAX_CONNECTIONS`], or the target did not answer).
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Bytes forwarded in `dir`, all connections together.
    pub fn forwarded(&self, dir: Dir) -> u64 {
        self.shared.forwarded[dir as usize].load(Ordering::SeqCst)
    }

    /// On how many connections the fault fired (a reset done, a stall begun, a byte flipped).
    pub fn faults_fired(&self) -> u64 {
        self.shared.fired.load(Ordering::SeqCst)
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.shared
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Resets every open connection now (both sides get an RST).
    pub fn cut(&self) {
        for c in self
            .shared
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            c.reset_both();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
        // Wake pumps blocked in a write to a peer that stopped reading (they would otherwise
        // wait out WRITE_TIMEOUT) and in reads.
        for c in self
            .shared
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = c.outer.shutdown(Shutdown::Both);
            let _ = c.inner.shutdown(Shutdown::Both);
        }
        // The acceptor is gone: nobody adds threads any more.
        let threads = std::mem::take(
            &mut *self
                .shared
                .threads
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for h in threads {
            let _ = h.join();
        }
    }
}

fn accept_loop(s: &Arc<Shared>, listener: TcpListener) {
    while !s.stop.load(Ordering::SeqCst) {
        let outer = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!("proxy: accept failed: {e}");
                std::thread::sleep(TICK);
                continue;
            }
        };
        let full = s.conns.lock().unwrap_or_else(|e| e.into_inner()).len() >= MAX_CONNECTIONS;
        let inner = if full {
            None
        } else {
            TcpStream::connect_timeout(&s.target, WRITE_TIMEOUT).ok()
        };
        let Some(inner) = inner else {
            s.refused.fetch_add(1, Ordering::SeqCst);
            drop(outer);
            continue;
        };
        if let Err(e) = start_conn(s, outer, inner) {
            tracing::warn!("proxy: cannot set up a connection: {e}");
            s.refused.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn start_conn(s: &Arc<Shared>, outer: TcpStream, inner: TcpStream) -> io::Result<()> {
    for c in [&outer, &inner] {
        c.set_nonblocking(false)?;
        c.set_nodelay(true)?;
        c.set_read_timeout(Some(TICK))?;
        c.set_write_timeout(Some(WRITE_TIMEOUT))?;
    }
    let conn = Arc::new(Conn {
        id: s.accepted.load(Ordering::SeqCst),
        outer,
        inner,
        counted: Mutex::new(0),
        reset: AtomicBool::new(false),
        stalled: AtomicBool::new(false),
        open_pumps: AtomicU64::new(2),
    });
    // Listed before its pumps start: the last pump out removes it, and `cut` must see it
    // as soon as data flows.
    s.conns
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(conn.clone());
    s.accepted.fetch_add(1, Ordering::SeqCst);
    for dir in [Dir::ToTarget, Dir::FromTarget] {
        let (sh, c) = (s.clone(), conn.clone());
        s.live.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new()
            .name("proxy-pump".into())
            .spawn(move || {
                pump(&sh, &c, dir);
                sh.live.fetch_sub(1, Ordering::SeqCst);
            });
        match spawned {
            Ok(h) => {
                let mut t = s.threads.lock().unwrap_or_else(|e| e.into_inner());
                // Handles of pumps that ended are dropped (their threads are gone).
                t.retain(|h| !h.is_finished());
                t.push(h);
            }
            Err(e) => {
                // The pump that did start sees the reset and ends; this one never will.
                s.live.fetch_sub(1, Ordering::SeqCst);
                conn.open_pumps.fetch_sub(1, Ordering::SeqCst);
                conn.reset_both();
                return Err(e);
            }
        }
    }
    Ok(())
}

impl Conn {
    fn sockets(&self, dir: Dir) -> (&TcpStream, &TcpStream) {
        match dir {
            Dir::ToTarget => (&self.outer, &self.inner),
            Dir::FromTarget => (&self.inner, &self.outer),
        }
    }

    /// Linger 0 on both sockets, then shut both down: the closes that follow (when the pumps
    /// end) send RSTs. Shutting down wakes the other pump's read at once.
    fn reset_both(&self) {
        if self.reset.swap(true, Ordering::SeqCst) {
            return;
        }
        for c in [&self.outer, &self.inner] {
            let _ = rustix::net::sockopt::set_socket_linger(c, Some(Duration::ZERO));
        }
        // SHUT_RD only: it wakes a blocked read without sending a FIN (SHUT_WR would).
        for c in [&self.outer, &self.inner] {
            let _ = c.shutdown(Shutdown::Read);
        }
    }
}

/// Forwards `dir` of `c` until the connection ends, the fault says stop, or the proxy stops.
fn pump(s: &Shared, c: &Conn, dir: Dir) {
    let (mut from, mut to) = c.sockets(dir);
    let faulty = dir == s.dir;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        if s.stop.load(Ordering::SeqCst) || c.reset.load(Ordering::SeqCst) {
            break;
        }
        if c.stalled.load(Ordering::SeqCst) {
            std::thread::sleep(TICK);
            continue;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => {
                // A clean end of stream: pass the FIN on — unless this read ended because the
                // connection is being reset (a FIN before the RST would look like a close).
                if !c.reset.load(Ordering::SeqCst) {
                    let _ = to.shutdown(Shutdown::Write);
                }
                break;
            }
            // Stalled while this read waited: what it got is never delivered.
            Ok(_) if c.stalled.load(Ordering::SeqCst) => continue,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(_) => {
                // The peer reset (or worse): the other side learns it the same way.
                c.reset_both();
                break;
            }
        };
        let (mut send, mut fire) = (n, None);
        if faulty {
            let mut counted = c.counted.lock().unwrap_or_else(|e| e.into_inner());
            let start = *counted;
            *counted += n as u64;
            match s.fault {
                Fault::Pass => {}
                Fault::FlipByte(at) => {
                    if (start..start + n as u64).contains(&at) {
                        buf[(at - start) as usize] ^= 0xff;
                        s.fired.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Fault::ResetAfter(limit) | Fault::StallAfter(limit) => {
                    if start + n as u64 >= limit {
                        send = limit.saturating_sub(start) as usize;
                        fire = Some(s.fault);
                    }
                }
            }
        }
        if send > 0 {
            // Recorded before it is written: what the target answers is recorded after it.
            if let Some(r) = &s.record {
                r.lock().unwrap_or_else(|e| e.into_inner()).push(Chunk {
                    conn: c.id,
                    dir,
                    bytes: buf[..send].to_vec(),
                });
            }
            if to.write_all(&buf[..send]).is_err() {
                c.reset_both();
                break;
            }
            s.forwarded[dir as usize].fetch_add(send as u64, Ordering::SeqCst);
        }
        if fire.is_some() {
            s.fired.fetch_add(1, Ordering::SeqCst);
        }
        match fire {
            Some(Fault::ResetAfter(_)) => {
                c.reset_both();
                break;
            }
            Some(Fault::StallAfter(_)) => c.stalled.store(true, Ordering::SeqCst),
            _ => {}
        }
    }
    if c.open_pumps.fetch_sub(1, Ordering::SeqCst) == 1 {
        // The last pump out: the connection is over. Without a reset, shut both sockets down
        // (a FIN each way); then drop the proxy's reference, so the sockets close when this
        // thread's reference goes (with linger 0 after a reset: that close sends the RSTs).
        if !c.reset.load(Ordering::SeqCst) {
            let _ = c.outer.shutdown(Shutdown::Both);
            let _ = c.inner.shutdown(Shutdown::Both);
        }
        s.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|x| !std::ptr::eq(Arc::as_ptr(x), c));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::time::Instant;

    const HOST_A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    const HOST_B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
    const T: Duration = Duration::from_secs(5);

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 8) as u8)
            .collect()
    }

    /// A target listening on host B, a proxy on host A with `fault`, a client connected
    /// through it; (client, the target's accepted socket, proxy).
    fn through(fault: Fault, dir: Dir) -> (TcpStream, TcpStream, Proxy) {
        let target = TcpListener::bind(SocketAddr::new(HOST_B, 0)).unwrap();
        let proxy = Proxy::start(HOST_A, target.local_addr().unwrap(), fault, dir).unwrap();
        let client = TcpStream::connect_timeout(&proxy.addr(), T).unwrap();
        let server = accept_within(&target);
        for s in [&client, &server] {
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(T)).unwrap();
            s.set_write_timeout(Some(T)).unwrap();
        }
        (client, server, proxy)
    }

    /// The proxy's connection to `target`, within [`T`].
    fn accept_within(target: &TcpListener) -> TcpStream {
        target.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + T;
        loop {
            match target.accept() {
                Ok((s, _)) => return s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                Err(e) => panic!("the proxy did not connect to the target: {e}"),
            }
        }
    }

    /// Reads until end of stream or an error: what came, and how it ended (`None`: a clean
    /// end of stream).
    fn read_to_end_or_err(mut s: &TcpStream) -> (Vec<u8>, Option<io::ErrorKind>) {
        let mut got = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return (got, None),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => return (got, Some(e.kind())),
            }
        }
    }

    fn read_n(mut s: &TcpStream, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        s.read_exact(&mut v).unwrap();
        v
    }

    #[test]
    fn pass_forwards_both_ways_and_passes_the_close_on() {
        let (mut c, mut s, proxy) = through(Fault::Pass, Dir::ToTarget);
        let up = pattern(1 << 20, 1);
        let down = pattern(300_000, 2);
        let writer = {
            let mut c = c.try_clone().unwrap();
            let up = up.clone();
            std::thread::spawn(move || c.write_all(&up).unwrap())
        };
        assert_eq!(read_n(&s, up.len()), up);
        writer.join().unwrap();
        s.write_all(&down).unwrap();
        assert_eq!(read_n(&c, down.len()), down);
        c.shutdown(Shutdown::Write).unwrap();
        assert_eq!(
            read_to_end_or_err(&s),
            (vec![], None),
            "the FIN is passed on"
        );
        s.shutdown(Shutdown::Write).unwrap();
        assert_eq!(read_to_end_or_err(&c), (vec![], None));
        assert_eq!(proxy.forwarded(Dir::ToTarget), up.len() as u64);
        assert_eq!(proxy.forwarded(Dir::FromTarget), down.len() as u64);
        assert_eq!((proxy.accepted(), proxy.faults_fired()), (1, 0));
        let _ = c.write(b"x");
    }

    #[test]
    fn reset_after_n_bytes_resets_both_sides() {
        let (mut c, s, proxy) = through(Fault::ResetAfter(1000), Dir::ToTarget);
        let up = pattern(5000, 3);
        c.write_all(&up).unwrap();
        let (got, end) = read_to_end_or_err(&s);
        assert_eq!(
            got,
            up[..1000],
            "exactly the first 1000 bytes, then the reset"
        );
        assert_eq!(
            end,
            Some(io::ErrorKind::ConnectionReset),
            "a reset, not a close"
        );
        let (got, end) = read_to_end_or_err(&c);
        assert!(got.is_empty());
        assert_eq!(end, Some(io::ErrorKind::ConnectionReset));
        assert_eq!(proxy.forwarded(Dir::ToTarget), 1000);
        assert_eq!(proxy.faults_fired(), 1);
    }

    #[test]
    fn reset_counts_only_its_direction() {
        let (mut c, mut s, proxy) = through(Fault::ResetAfter(10), Dir::FromTarget);
        let up = pattern(5000, 4);
        c.write_all(&up).unwrap();
        assert_eq!(read_n(&s, 5000), up, "the other direction passes whole");
        s.write_all(&pattern(100, 5)).unwrap();
        let (got, end) = read_to_end_or_err(&c);
        assert_eq!(got, pattern(100, 5)[..10]);
        assert_eq!(end, Some(io::ErrorKind::ConnectionReset));
        let (_, end) = read_to_end_or_err(&s);
        assert_eq!(end, Some(io::ErrorKind::ConnectionReset));
        assert_eq!(proxy.faults_fired(), 1);
    }

    #[test]
    fn stall_after_n_bytes_forwards_nothing_more_and_drop_closes() {
        let (mut c, mut s, proxy) = through(Fault::StallAfter(1000), Dir::ToTarget);
        let up = pattern(5000, 6);
        c.write_all(&up).unwrap();
        assert_eq!(read_n(&s, 1000), up[..1000]);
        let quiet = Duration::from_millis(300);
        s.set_read_timeout(Some(quiet)).unwrap();
        c.set_read_timeout(Some(quiet)).unwrap();
        let (got, end) = read_to_end_or_err(&s);
        assert!(got.is_empty(), "{} bytes after the stall", got.len());
        assert_eq!(
            end,
            Some(io::ErrorKind::WouldBlock),
            "still open, just silent"
        );
        // Nothing goes the other way either.
        s.write_all(b"hello").unwrap();
        let (got, end) = read_to_end_or_err(&c);
        assert!(got.is_empty());
        assert_eq!(end, Some(io::ErrorKind::WouldBlock));
        assert_eq!(proxy.faults_fired(), 1);
        assert_eq!(proxy.open_connections(), 1);
        let shared = proxy.shared.clone();
        assert_eq!(
            shared.live.load(Ordering::SeqCst),
            3,
            "the acceptor and two pumps"
        );
        // Dropping the proxy ends its threads (joined: none is left running when it returns)
        // and closes both connections.
        drop(proxy);
        assert_eq!(shared.live.load(Ordering::SeqCst), 0);
        c.set_read_timeout(Some(T)).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        assert_eq!(read_to_end_or_err(&c), (vec![], None));
        assert_eq!(read_to_end_or_err(&s), (vec![], None));
    }

    #[test]
    fn flip_changes_exactly_one_byte_in_one_direction() {
        // Offset 70 000: past the first 64 KiB read of the pump.
        let (mut c, mut s, proxy) = through(Fault::FlipByte(70_000), Dir::ToTarget);
        let up = pattern(128 << 10, 7);
        let writer = {
            let mut c = c.try_clone().unwrap();
            let up = up.clone();
            std::thread::spawn(move || c.write_all(&up).unwrap())
        };
        let got = read_n(&s, up.len());
        writer.join().unwrap();
        let diff: Vec<usize> = (0..up.len()).filter(|&i| got[i] != up[i]).collect();
        assert_eq!(diff, [70_000]);
        assert_eq!(got[70_000], up[70_000] ^ 0xff);
        let down = pattern(128 << 10, 8);
        s.write_all(&down).unwrap();
        assert_eq!(
            read_n(&c, down.len()),
            down,
            "the other direction is untouched"
        );
        assert_eq!(proxy.faults_fired(), 1);
        c.write_all(b"more").unwrap();
        assert_eq!(read_n(&s, 4), b"more", "still forwarding after the flip");
    }

    #[test]
    fn cut_resets_every_open_connection() {
        let (mut c, s, proxy) = through(Fault::Pass, Dir::ToTarget);
        c.write_all(b"before").unwrap();
        assert_eq!(read_n(&s, 6), b"before");
        proxy.cut();
        assert_eq!(
            read_to_end_or_err(&s).1,
            Some(io::ErrorKind::ConnectionReset)
        );
        assert_eq!(
            read_to_end_or_err(&c).1,
            Some(io::ErrorKind::ConnectionReset)
        );
    }

    #[test]
    fn in_front_of_listens_on_the_targets_address() {
        let target = TcpListener::bind(SocketAddr::new(HOST_B, 0)).unwrap();
        let t = target.local_addr().unwrap();
        let proxy = Proxy::in_front_of(t, Fault::Pass, Dir::ToTarget).unwrap();
        assert_eq!(proxy.addr().ip(), HOST_B);
        assert_ne!(proxy.addr().port(), t.port());
        let mut c = TcpStream::connect_timeout(&proxy.addr(), T).unwrap();
        let s = accept_within(&target);
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        c.write_all(b"ping").unwrap();
        assert_eq!(read_n(&s, 4), b"ping");
    }

    #[test]
    fn a_dead_target_is_refused_with_a_close() {
        let port = {
            let l = TcpListener::bind(SocketAddr::new(HOST_B, 0)).unwrap();
            l.local_addr().unwrap()
        };
        let proxy = Proxy::pass(HOST_A, port).unwrap();
        let c = TcpStream::connect_timeout(&proxy.addr(), T).unwrap();
        c.set_read_timeout(Some(T)).unwrap();
        let (got, _) = read_to_end_or_err(&c);
        assert!(got.is_empty());
        assert_eq!((proxy.accepted(), proxy.refused()), (0, 1));
    }
}
