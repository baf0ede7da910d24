//! `vrdma-rping`: rdma-core's `rping` ping-pong (librdmacm/examples/rping.c) on the vrdma
//! library and its connection manager, so a vrdma guest can talk to stock `rping` on any
//! iWARP stack (Linux siw in the Xen lab) — and to itself between two simulated hosts.
//!
//! ```text
//! vrdma-rping -s [-a ADDR] [-p PORT] [-C COUNT] [-S SIZE] [-v] [-V]     server (listens)
//! vrdma-rping -c  -a ADDR  [-p PORT] [-C COUNT] [-S SIZE] [-v] [-V]     client (connects)
//! ```
//!
//! The application protocol is rping's (read for facts, not copied): the client SENDs a
//! 16-byte `rping_rdma_info` (`buf` u64, `rkey` u32, `size` u32, network byte order) naming
//! its source buffer, filled with rping's printable pattern; the server RDMA READs it, SENDs
//! a 16-byte go-ahead; the client SENDs the info of its sink buffer; the server RDMA WRITEs
//! what it read there (the string and its NUL) and SENDs a go-ahead again. Repeat `-C` times
//! (0: until interrupted), then the client disconnects. Every receive must be exactly 16
//! bytes, as rping checks.
//!
//! - `-v` prints `ping data: ...` (client) / `server ping data: ...` (server) per ping, as
//!   rping does;
//! - `-V` validates: the client compares what came back with what it sent (rping's check);
//!   the server compares what it READ with rping's pattern for that ping (stock rping's
//!   server does not), so both directions of the data are checked whichever end is stock;
//! - the server with `-C N` fails if the client leaves before N pings (rping's server ignores
//!   its count);
//! - `-s` prints `vrdma-rping: listening on ADDR:PORT` on stdout once it listens (port 0:
//!   the backend picks one);
//! - every wait has a timeout (`-t`, seconds), exit status 0 only if every ping completed.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use clap::Parser;
use vrdma::{
    AccessFlags, CompletionQueue, Context, MemoryRegion, Mode, QueuePair, RemoteMr, WcOpcode,
    WcStatus, WorkCompletion,
};

/// rping's wire message (`struct rping_rdma_info`): 16 bytes.
const INFO_LEN: usize = 16;
/// rping's default port.
const RPING_PORT: u16 = 7174;
/// rping's size bounds: `sizeof("2147483647") + sizeof("rdma-ping-%d: ")`, and its buffer
/// size less one.
const MIN_SIZE: usize = 11 + 15;
const MAX_SIZE: usize = 64 * 1024 - 1;
/// Work request ids.
const WR_SEND: u64 = 1;
const WR_RECV: u64 = 2;
const WR_RDMA: u64 = 3;

#[derive(Parser, Debug)]
#[command(
    name = "vrdma-rping",
    about = "rping's ping-pong (SEND / RDMA READ / RDMA WRITE) over vrdma's connection manager"
)]
struct Args {
    /// Server: listen and answer pings.
    #[arg(
        short = 's',
        conflicts_with = "client",
        required_unless_present = "client"
    )]
    server: bool,
    /// Client: connect to -a ADDR and ping.
    #[arg(short = 'c', requires = "addr")]
    client: bool,
    /// The server's address (client); the backend address to listen on (server, default:
    /// the backend's first).
    #[arg(short = 'a')]
    addr: Option<IpAddr>,
    /// Port (server: 0 lets the backend choose).
    #[arg(short = 'p', default_value_t = RPING_PORT)]
    port: u16,
    /// Pings (0: until interrupted).
    #[arg(short = 'C', default_value_t = 0)]
    count: u32,
    /// Ping data size in bytes.
    #[arg(short = 'S', default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(MIN_SIZE as i64..=MAX_SIZE as i64))]
    size: u32,
    /// Print the ping data.
    #[arg(short = 'v')]
    verbose: bool,
    /// Validate the ping data.
    #[arg(short = 'V')]
    validate: bool,
    /// Seconds any one step may take (connection request, connect, each completion).
    #[arg(short = 't', default_value_t = 60)]
    timeout_s: u64,
    /// Channel mode (default: VRDMA_MODE, else bypass).
    #[arg(short = 'm', value_parser = ["bypass", "mediated"])]
    mode: Option<String>,
}

/// rping's source buffer for ping `ping`: "rdma-ping-<ping>: " then letters from 'A' + the
/// ping number (mod 58), each the next, wrapping from 'z' (122) back to 'A' (65); the last
/// byte is NUL.
fn rping_pattern(ping: u32, size: usize) -> Vec<u8> {
    let mut b = format!("rdma-ping-{ping}: ").into_bytes();
    b.truncate(size);
    let mut c = 65 + (ping % 58) as u8;
    while b.len() < size {
        b.push(c);
        c = if c >= 122 { 65 } else { c + 1 };
    }
    if let Some(last) = b.last_mut() {
        *last = 0;
    }
    b
}

/// The bytes up to (not including) the first NUL, as rping's `%s` prints them.
fn c_str(b: &[u8]) -> &[u8] {
    &b[..b.iter().position(|&x| x == 0).unwrap_or(b.len())]
}

/// A `rping_rdma_info` in network byte order.
fn info_bytes(r: &RemoteMr, size: u32) -> [u8; INFO_LEN] {
    let mut b = [0u8; INFO_LEN];
    b[..8].copy_from_slice(&r.addr.to_be_bytes());
    b[8..12].copy_from_slice(&r.rkey.to_be_bytes());
    b[12..].copy_from_slice(&size.to_be_bytes());
    b
}

fn parse_info(b: &[u8; INFO_LEN]) -> RemoteMr {
    let u64_at = u64::from_be_bytes(b[..8].try_into().expect("8 bytes"));
    let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    RemoteMr {
        addr: u64_at,
        rkey: u32_at(8),
        len: u64::from(u32_at(12)),
    }
}

/// What a wait for a completion got.
enum Got {
    Done(WorkCompletion),
    /// A flushed work request: the QP went to Error (the peer disconnected).
    Flushed(WorkCompletion),
}

/// One end's verbs objects: the channel, a CQ, the connection's QP and rping's buffers (the
/// 16-byte receive and send messages in one region, the RDMA buffer, the client's source).
struct End {
    cq: CompletionQueue,
    qp: QueuePair,
    /// Receive message at 0, send message at `INFO_LEN`.
    ctrl: MemoryRegion,
    rdma: MemoryRegion,
    timeout: Duration,
    size: u32,
}

impl End {
    fn post_recv(&mut self) -> Result<()> {
        self.qp
            .post_recv(&[self.ctrl.slice(0..INFO_LEN)], WR_RECV)
            .context("post the receive")
    }

    fn post_send(&mut self, msg: &[u8; INFO_LEN]) -> Result<()> {
        self.ctrl.write(INFO_LEN, msg)?;
        self.qp
            .post_send(&[self.ctrl.slice(INFO_LEN..2 * INFO_LEN)], WR_SEND)
            .context("post a send")
    }

    /// The next completion of `op`, within the timeout. Successful SEND completions on the
    /// way are skipped (rping signals its sends and ignores their completions); any other
    /// failure is an error.
    fn wait_for(&mut self, op: WcOpcode, what: &str) -> Result<Got> {
        let deadline = Instant::now() + self.timeout;
        let mut wc = [WorkCompletion::default(); 1];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("no {what} within {} s", self.timeout.as_secs());
            }
            let got = self
                .cq
                .wait(&mut wc, Some(left))
                .context("wait on the CQ")?;
            let Some(w) = got.first().copied() else {
                continue;
            };
            if w.status == WcStatus::WrFlushError {
                return Ok(Got::Flushed(w));
            }
            if !w.is_ok() {
                bail!(
                    "{what}: a {:?} completed with {:?} ({w:?})",
                    w.opcode,
                    w.status
                );
            }
            if w.opcode == op {
                return Ok(Got::Done(w));
            }
            if w.opcode != WcOpcode::Send {
                bail!("{what}: unexpected {:?} completion ({w:?})", w.opcode);
            }
        }
    }

    /// The next rping message received (exactly 16 bytes, as rping insists), the receive
    /// posted again; `None` if the receive was flushed (the peer disconnected).
    fn recv_msg(&mut self, what: &str) -> Result<Option<[u8; INFO_LEN]>> {
        let w = match self.wait_for(WcOpcode::Recv, what)? {
            Got::Done(w) => w,
            Got::Flushed(_) => return Ok(None),
        };
        if w.byte_len as usize != INFO_LEN {
            bail!(
                "{what}: received bogus data, size {} (rping's message is {INFO_LEN})",
                w.byte_len
            );
        }
        let mut m = [0u8; INFO_LEN];
        self.ctrl.read(0, &mut m)?;
        self.post_recv()?;
        Ok(Some(m))
    }

    /// Waits for the RDMA READ or WRITE just posted.
    fn rdma_done(&mut self, op: WcOpcode, what: &str) -> Result<()> {
        match self.wait_for(op, what)? {
            Got::Done(_) => Ok(()),
            Got::Flushed(w) => bail!("{what}: flushed, the connection ended ({w:?})"),
        }
    }
}

/// The channel, protection domain and `End` (QP not connected yet, its receive posted).
fn setup(a: &Args, extra_region: bool) -> Result<(Context, End, Option<MemoryRegion>)> {
    let timeout = Duration::from_secs(a.timeout_s);
    let mut b = Context::builder().timeout(timeout);
    match a.mode.as_deref() {
        Some("mediated") => b = b.mode(Mode::Mediated),
        Some("bypass") => b = b.mode(Mode::Bypass),
        _ => {}
    }
    let ctx = b.open().context("open the vrdma device")?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(32)?;
    // rping's QP: 16 send slots, 2 receive slots.
    let qp = pd.create_qp(&cq, &cq).sq_size(16).rq_size(2).build()?;
    let size = a.size as usize;
    let ctrl = pd.alloc_mr(2 * INFO_LEN, AccessFlags::LOCAL_WRITE)?;
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let rdma = pd.alloc_mr(size, rw)?;
    let start = if extra_region {
        Some(pd.alloc_mr(size, rw)?)
    } else {
        None
    };
    let mut end = End {
        cq,
        qp,
        ctrl,
        rdma,
        timeout,
        size: a.size,
    };
    end.post_recv()?;
    Ok((ctx, end, start))
}

fn client(a: &Args) -> Result<()> {
    let peer = SocketAddr::new(a.addr.ok_or_else(|| anyhow!("-c needs -a ADDR"))?, a.port);
    let (_ctx, mut e, start) = setup(a, true)?;
    let start = start.expect("the client's source region");
    let size = a.size as usize;
    let info =
        e.qp.connect_to(peer, &[], e.timeout)
            .with_context(|| format!("connect to {peer}"))?;
    eprintln!(
        "vrdma-rping: connected {} -> {} (IRD {} ORD {})",
        info.local, info.peer, info.ird, info.ord
    );
    let mut ping = 0u32;
    while a.count == 0 || ping < a.count {
        let pattern = rping_pattern(ping, size);
        start.write(0, &pattern)?;
        e.post_send(&info_bytes(&start.remote(), e.size))?;
        let step = format!("ping {ping}: the server's go-ahead after its RDMA READ");
        e.recv_msg(&step)?
            .ok_or_else(|| anyhow!("{step}: the connection ended"))?;
        e.post_send(&info_bytes(&e.rdma.remote(), e.size))?;
        let step = format!("ping {ping}: the server's go-ahead after its RDMA WRITE");
        e.recv_msg(&step)?
            .ok_or_else(|| anyhow!("{step}: the connection ended"))?;
        let mut back = vec![0u8; size];
        e.rdma.read(0, &mut back)?;
        if a.validate && back != pattern {
            let at = back.iter().zip(&pattern).position(|(x, y)| x != y);
            bail!("ping {ping}: data mismatch at byte {at:?}");
        }
        if a.verbose {
            println!("ping data: {}", String::from_utf8_lossy(c_str(&back)));
            std::io::stdout().flush()?;
        }
        // A fresh sink per ping: what the next WRITE places must not be last ping's bytes.
        e.rdma.fill(0, size, 0)?;
        ping += 1;
    }
    e.qp.disconnect().context("disconnect")?;
    eprintln!(
        "vrdma-rping: client: {ping} pings{}",
        if a.validate { ", data verified" } else { "" }
    );
    Ok(())
}

fn server(a: &Args) -> Result<()> {
    let (ctx, mut e, _) = setup(a, false)?;
    let listener = match a.addr {
        Some(ip) => ctx.listen_on(SocketAddr::new(ip, a.port), 1),
        None => ctx.listen(a.port, 1),
    }
    .context("listen")?;
    println!("vrdma-rping: listening on {}", listener.local_addr());
    std::io::stdout().flush()?;
    let req = listener
        .get_request(Some(e.timeout))
        .context("wait for a connection request")?;
    let peer = req.peer();
    let info = req.accept(&mut e.qp, &[]).context("accept")?;
    eprintln!(
        "vrdma-rping: accepted {} from {peer} (IRD {} ORD {})",
        info.local, info.ird, info.ord
    );
    let size = a.size as usize;
    let go_ahead = [0u8; INFO_LEN];
    let mut ping = 0u32;
    loop {
        let step = format!("ping {ping}: the client's source buffer");
        let Some(m) = e.recv_msg(&step)? else {
            break;
        };
        let src = parse_info(&m);
        let len = usize::try_from(src.len).unwrap_or(usize::MAX);
        if len == 0 || len > size {
            bail!("{step}: {len} bytes asked, this server's buffer is {size} (-S)");
        }
        e.qp.post_read(&[e.rdma.slice(0..len)], src, WR_RDMA)?;
        e.rdma_done(WcOpcode::RdmaRead, &format!("ping {ping}: the RDMA READ"))?;
        let mut got = vec![0u8; len];
        e.rdma.read(0, &mut got)?;
        if a.validate {
            let want = rping_pattern(ping, len);
            if got != want {
                let at = got.iter().zip(&want).position(|(x, y)| x != y);
                bail!("ping {ping}: the data READ differs from rping's pattern at byte {at:?}");
            }
        }
        if a.verbose {
            println!("server ping data: {}", String::from_utf8_lossy(c_str(&got)));
            std::io::stdout().flush()?;
        }
        e.post_send(&go_ahead)?;
        let step = format!("ping {ping}: the client's sink buffer");
        let sink = parse_info(
            &e.recv_msg(&step)?
                .ok_or_else(|| anyhow!("{step}: the connection ended"))?,
        );
        // rping writes the string and its NUL.
        let n = (c_str(&got).len() + 1).min(len);
        if (n as u64) > sink.len {
            bail!("{step}: {} bytes, the echo is {n}", sink.len);
        }
        e.qp.post_write(&[e.rdma.slice(0..n)], sink, WR_RDMA)?;
        e.rdma_done(WcOpcode::RdmaWrite, &format!("ping {ping}: the RDMA WRITE"))?;
        e.post_send(&go_ahead)?;
        ping += 1;
    }
    if a.count != 0 && ping < a.count {
        bail!("the client left after {ping} of {} pings", a.count);
    }
    eprintln!(
        "vrdma-rping: server: {ping} pings, client disconnected{}",
        if a.validate { ", data verified" } else { "" }
    );
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let a = Args::parse();
    let r = if a.server { server(&a) } else { client(&a) };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "vrdma-rping {}: {e:#}",
                if a.server { "server" } else { "client" }
            );
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_rpings() {
        // rping.c: snprintf "rdma-ping-%d: ", then letters from 65 + ping, wrapping after
        // 'z' (122) to 'A' (65), the last byte NUL.
        assert_eq!(rping_pattern(0, 32), b"rdma-ping-0: ABCDEFGHIJKLMNOPQR\0");
        assert_eq!(&rping_pattern(3, 26)[13..], b"DEFGHIJKLMNO\0");
        let p = rping_pattern(57, 80);
        assert_eq!(&p[14..18], b"zABC");
        // The 59th ping starts at 'A' again.
        assert_eq!(rping_pattern(58, 40)[14], b'A');
        assert_eq!(c_str(&rping_pattern(0, 64)).len(), 63);
    }

    #[test]
    fn info_is_network_byte_order() {
        let r = RemoteMr {
            addr: 0x0102_0304_0506_0708,
            len: 64,
            rkey: 0x0a0b_0c0d,
        };
        let b = info_bytes(&r, 64);
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 0, 0, 0, 64]);
        assert_eq!(parse_info(&b), r);
    }
}
