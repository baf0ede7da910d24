//! `vrdma-guest`: a frontend application driven line by line on stdin, for the end-to-end
//! tests. It runs inside a simulated domain (the test sets `VRDMA_SIM`, `VRDMA_SIM_DOMID`,
//! `XENSTORED_PATH`) and answers every command with one line on stdout: `ok ...` or
//! `err <message>`. Objects are named by the test.
//!
//! ```text
//! open [bypass|mediated]             -> ok <domid> <channel>   (closes an open one first)
//! close                              -> ok            (drops every object and the channel)
//! cycle <n> [bypass|mediated]        -> ok <n>        (n back-to-back open + AllocPd + close)
//! cq <name> <entries>                -> ok <handle>
//! qp <name> <send-cq> <recv-cq> <sq> <rq>   -> ok <endpoint>
//! mr <name> <len>                    -> ok <remote addr:len:rkey>
//! connect <qp> <endpoint> [<qp> <endpoint>...]  -> ok   (several: concurrently, one thread each)
//! fill <mr> <seed> <off> <len>       -> ok          (pattern bytes)
//! check <mr> <seed> <off> <len>      -> ok | err mismatch at <i>
//! recv <qp> <mr> <off> <len> <wr_id>
//! send <qp> <mr> <off> <len> <wr_id> [imm]
//! inline <qp> <hex-bytes> <wr_id>
//! write <qp> <mr> <off> <len> <remote> <wr_id> [imm]
//! read <qp> <mr> <off> <len> <remote> <wr_id>
//! rawsend <qp> <hex 64 bytes>        -> ok            (a garbage WQE)
//! poll <cq> <n> <timeout_ms>         -> ok <wc>;<wc>... (busy-polls until n or timeout)
//! wait <cq> <n> <timeout_ms>         -> ok <wc>;...    (blocking waits on the event channel)
//! pingpong <qp> <cq> <mr> <len> <iters> <role:first|second>  -> ok <ns per round trip>
//! loop <qp> <cq> <mr> <len> [remote] -> (SENDs, or RDMA WRITEs to `remote`, forever; for kill
//!                                        tests; prints "ok looping", then "err ..." when it fails)
//! burst <qp> <mr> <len> <n>         -> ok            (n SENDs back to back)
//! notifications                      -> ok <n>
//! listen <name> <port> [backlog]     -> ok <addr:port>   (connection manager: a listener)
//! accept <listener> <qp> <timeout_ms> [hex private]  -> ok <peer> <ird> <ord> <hex peer private>
//! reject <listener> <timeout_ms> [hex private]       -> ok <peer>
//! connect_to <qp> <ip:port> <timeout_ms> [hex private] -> ok <ird> <ord> <hex peer private>
//!                                       (err rejected|unreachable|timeout|lost: <message>)
//! disconnect <qp>                    -> ok
//! event <qp> <Kind> <timeout_ms>     -> ok <kinds seen for qp>  (waits for an async event of
//!                                       that kind on the QP, e.g. QpDisconnected, QpFatal)
//! events                             -> ok <Kind:handle:detail>;...  (every event seen so far)
//! drop <name>                        -> ok
//! exit                               -> ok (then exits)
//! ```
//! A work completion prints as `wr_id,status,opcode,byte_len,imm` (imm `-` when absent).

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use vrdma::{
    AccessFlags, AsyncEvent, CompletionQueue, ConnRequest, Context, Listener, MemoryRegion, Mode,
    ProtectionDomain, QueuePair, RemoteMr, WorkCompletion,
};

#[derive(Default)]
struct Guest {
    ctx: Option<Context>,
    pd: Option<ProtectionDomain>,
    cqs: HashMap<String, CompletionQueue>,
    qps: HashMap<String, QueuePair>,
    mrs: HashMap<String, MemoryRegion>,
    listeners: HashMap<String, Listener>,
    /// Every asynchronous event taken from the context so far, in order.
    events: Vec<AsyncEvent>,
}

/// The byte at index `i` of pattern `seed`.
fn pattern(seed: u64, i: usize) -> u8 {
    let x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed.wrapping_mul(31);
    (x >> 29) as u8 ^ (i as u8)
}

fn wc_text(w: &WorkCompletion) -> String {
    format!(
        "{},{:?},{:?},{},{}",
        w.wr_id,
        w.status,
        w.opcode,
        w.byte_len,
        w.imm_data.map_or("-".to_string(), |i| i.to_string())
    )
}

fn num<T: std::str::FromStr>(a: &[&str], i: usize) -> Result<T> {
    a.get(i)
        .ok_or_else(|| anyhow!("missing argument {i}"))?
        .parse()
        .map_err(|_| anyhow!("argument {i} ({:?}) is not a number", a[i]))
}

fn to_hex(b: &[u8]) -> String {
    if b.is_empty() {
        return "-".into();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The CM error's class first, for the tests to match on.
fn cm_error(e: vrdma::Error) -> anyhow::Error {
    let class = match &e {
        vrdma::Error::ConnectRejected { .. } => "rejected",
        vrdma::Error::Unreachable { .. } => "unreachable",
        vrdma::Error::Timeout { .. } => "timeout",
        vrdma::Error::ConnectionLost { .. } => "lost",
        _ => "failed",
    };
    anyhow!("{class}: {e}")
}

fn hex(s: &str) -> Result<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(Into::into))
        .collect()
}

impl Guest {
    fn ctx(&self) -> Result<&Context> {
        self.ctx.as_ref().context("open first")
    }
    fn cq(&mut self, n: &str) -> Result<&mut CompletionQueue> {
        self.cqs.get_mut(n).with_context(|| format!("no CQ {n}"))
    }
    fn qp(&mut self, n: &str) -> Result<&mut QueuePair> {
        self.qps.get_mut(n).with_context(|| format!("no QP {n}"))
    }
    fn mr(&self, n: &str) -> Result<&MemoryRegion> {
        self.mrs.get(n).with_context(|| format!("no MR {n}"))
    }

    fn run(&mut self, a: &[&str]) -> Result<String> {
        match a[0] {
            "open" => {
                // Objects of an earlier (lost) channel go first: this is a reopen.
                *self = Guest::default();
                let ctx = builder(a.get(1))?.open()?;
                let out = format!("{} {}", ctx.domid().0, ctx.channel());
                self.pd = Some(ctx.alloc_pd()?);
                self.ctx = Some(ctx);
                Ok(out)
            }
            "close" => {
                *self = Guest::default();
                Ok(String::new())
            }
            "cycle" => {
                let n: u32 = num(a, 1)?;
                for i in 0..n {
                    let ctx = builder(a.get(2))?
                        .open()
                        .with_context(|| format!("open {} of {n}", i + 1))?;
                    drop(
                        ctx.alloc_pd()
                            .with_context(|| format!("AllocPd on open {} of {n}", i + 1))?,
                    );
                }
                Ok(n.to_string())
            }
            "cq" => {
                let cq = self.ctx()?.create_cq(num(a, 2)?)?;
                let h = cq.handle();
                self.cqs.insert(a[1].into(), cq);
                Ok(h.to_string())
            }
            "qp" => {
                let pd = self.pd.as_ref().context("open first")?;
                let s = self.cqs.get(a[2]).context("no send CQ")?;
                let r = self.cqs.get(a[3]).context("no recv CQ")?;
                let qp = pd
                    .create_qp(s, r)
                    .sq_size(num(a, 4)?)
                    .rq_size(num(a, 5)?)
                    .build()?;
                let ep = qp.endpoint().to_string();
                self.qps.insert(a[1].into(), qp);
                Ok(ep)
            }
            "mr" => {
                let pd = self.pd.as_ref().context("open first")?;
                let mr = pd.alloc_mr(num(a, 2)?, AccessFlags::ALL)?;
                let r = mr.remote().to_string();
                self.mrs.insert(a[1].into(), mr);
                Ok(r)
            }
            "connect" => {
                // Several pairs connect from one thread each: the backend answers a Connect
                // only when both ends connected, so a process pairing two of its own QPs
                // must have both requests in flight at once.
                let mut jobs = Vec::new();
                for pair in a[1..].chunks(2) {
                    let [name, ep] = pair else {
                        bail!("connect takes <qp> <endpoint> pairs");
                    };
                    let ep: vrdma::QpEndpoint = ep.parse()?;
                    let qp = self
                        .qps
                        .remove(*name)
                        .with_context(|| format!("no QP {name} (or named twice)"))?;
                    jobs.push((name.to_string(), qp, ep));
                }
                let results: Vec<(String, QueuePair, vrdma::Result<()>)> =
                    std::thread::scope(|s| {
                        let handles: Vec<_> = jobs
                            .into_iter()
                            .map(|(name, mut qp, ep)| {
                                s.spawn(move || {
                                    let r = qp.connect(&ep);
                                    (name, qp, r)
                                })
                            })
                            .collect();
                        handles
                            .into_iter()
                            .map(|h| h.join().expect("connect thread"))
                            .collect()
                    });
                let mut first_err = None;
                for (name, qp, r) in results {
                    self.qps.insert(name.clone(), qp);
                    if let Err(e) = r {
                        first_err.get_or_insert(anyhow!("connect {name}: {e}"));
                    }
                }
                match first_err {
                    Some(e) => Err(e),
                    None => Ok(String::new()),
                }
            }
            "fill" => {
                let (seed, off, len): (u64, usize, usize) = (num(a, 2)?, num(a, 3)?, num(a, 4)?);
                let data: Vec<u8> = (0..len).map(|i| pattern(seed, i)).collect();
                self.mr(a[1])?.write(off, &data)?;
                Ok(String::new())
            }
            "check" => {
                let (seed, off, len): (u64, usize, usize) = (num(a, 2)?, num(a, 3)?, num(a, 4)?);
                let mut buf = vec![0u8; len];
                self.mr(a[1])?.read(off, &mut buf)?;
                match (0..len).find(|&i| buf[i] != pattern(seed, i)) {
                    None => Ok(String::new()),
                    Some(i) => bail!("mismatch at {i}: {:#x} != {:#x}", buf[i], pattern(seed, i)),
                }
            }
            "recv" | "send" => {
                let (off, len, wr_id): (usize, usize, u64) = (num(a, 3)?, num(a, 4)?, num(a, 5)?);
                let mr = self.mrs.get(a[2]).context("no MR")?;
                let qp = self.qps.get_mut(a[1]).context("no QP")?;
                let s = [mr.slice(off..off + len)];
                let sl: &[_] = if len == 0 { &[] } else { &s };
                match (a[0], a.get(6)) {
                    ("recv", _) => qp.post_recv(sl, wr_id)?,
                    (_, Some(imm)) => qp.post_send_with_imm(sl, imm.parse()?, wr_id)?,
                    _ => qp.post_send(sl, wr_id)?,
                }
                Ok(String::new())
            }
            "inline" => {
                let data = hex(a[2])?;
                let wr_id = num(a, 3)?;
                self.qp(a[1])?.post_send_inline(&data, wr_id)?;
                Ok(String::new())
            }
            "write" | "read" => {
                let (off, len): (usize, usize) = (num(a, 3)?, num(a, 4)?);
                let remote: RemoteMr = a[5].parse()?;
                let wr_id = num(a, 6)?;
                let mr = self.mrs.get(a[2]).context("no MR")?;
                let qp = self.qps.get_mut(a[1]).context("no QP")?;
                let s = [mr.slice(off..off + len)];
                match (a[0], a.get(7)) {
                    ("read", _) => qp.post_read(&s, remote, wr_id)?,
                    (_, Some(imm)) => qp.post_write_with_imm(&s, remote, imm.parse()?, wr_id)?,
                    _ => qp.post_write(&s, remote, wr_id)?,
                }
                Ok(String::new())
            }
            "rawsend" => {
                let b = hex(a[2])?;
                let slot: [u8; 64] = b.try_into().map_err(|_| anyhow!("need 64 bytes"))?;
                self.qp(a[1])?.post_raw_send_slot(&slot)?;
                Ok(String::new())
            }
            "poll" | "wait" => {
                let n: usize = num(a, 2)?;
                let deadline = Instant::now() + Duration::from_millis(num(a, 3)?);
                let blocking = a[0] == "wait";
                let cq = self.cq(a[1])?;
                let mut got = Vec::new();
                let mut wc = [WorkCompletion::default(); 16];
                while got.len() < n && Instant::now() < deadline {
                    let done = if blocking {
                        let left = deadline.saturating_duration_since(Instant::now());
                        cq.wait(&mut wc[..(n - got.len()).min(16)], Some(left))?
                    } else {
                        cq.poll(&mut wc[..(n - got.len()).min(16)])?
                    };
                    got.extend(done.iter().map(wc_text));
                }
                Ok(got.join(";"))
            }
            "pingpong" => {
                let (len, iters): (usize, u64) = (num(a, 4)?, num(a, 5)?);
                let first = a[6] == "first";
                let mr = self.mrs.get(a[3]).context("no MR")?;
                let qp = self.qps.get_mut(a[1]).context("no QP")?;
                let cq = self.cqs.get_mut(a[2]).context("no CQ")?;
                pingpong(qp, cq, mr, len, iters, first)
            }
            "burst" => {
                // n back-to-back SENDs of `len` bytes from offset 0 (no polling in between).
                let (len, n): (usize, u64) = (num(a, 3)?, num(a, 4)?);
                let mr = self.mrs.get(a[2]).context("no MR")?;
                let qp = self.qps.get_mut(a[1]).context("no QP")?;
                for i in 0..n {
                    qp.post_send(&[mr.slice(0..len)], i)?;
                }
                Ok(String::new())
            }
            "notifications" => Ok(self.ctx()?.notifications_sent().to_string()),
            "listen" => {
                let backlog = if a.len() > 3 { num(a, 3)? } else { 0 };
                let l = self.ctx()?.listen(num(a, 2)?, backlog)?;
                let addr = l.local_addr();
                self.listeners.insert(a[1].into(), l);
                Ok(addr.to_string())
            }
            "accept" | "reject" => {
                let t: u64 = num(a, if a[0] == "accept" { 3 } else { 2 })?;
                let private = match a.get(if a[0] == "accept" { 4 } else { 3 }) {
                    Some(h) => hex(h)?,
                    None => Vec::new(),
                };
                let l = self.listeners.get(a[1]).context("no listener")?;
                let req: ConnRequest = l
                    .get_request(Some(Duration::from_millis(t)))
                    .map_err(cm_error)?;
                let peer = req.peer();
                if a[0] == "reject" {
                    req.reject(&private)?;
                    return Ok(peer.to_string());
                }
                let qp = self.qps.get_mut(a[2]).context("no QP")?;
                let info = req.accept(qp, &private).map_err(cm_error)?;
                Ok(format!(
                    "{peer} {} {} {}",
                    info.ird,
                    info.ord,
                    to_hex(&info.private_data)
                ))
            }
            "connect_to" => {
                let peer: std::net::SocketAddr = a.get(2).context("address")?.parse()?;
                let t: u64 = num(a, 3)?;
                let private = match a.get(4) {
                    Some(h) => hex(h)?,
                    None => Vec::new(),
                };
                let qp = self.qps.get_mut(a[1]).context("no QP")?;
                let info = qp
                    .connect_to(peer, &private, Duration::from_millis(t))
                    .map_err(cm_error)?;
                Ok(format!(
                    "{} {} {}",
                    info.ird,
                    info.ord,
                    to_hex(&info.private_data)
                ))
            }
            "disconnect" => {
                self.qp(a[1])?.disconnect()?;
                Ok(String::new())
            }
            "event" => {
                let handle = self.qps.get(a[1]).context("no QP")?.handle();
                let kind = a.get(2).context("event kind")?.to_string();
                let deadline = Instant::now() + Duration::from_millis(num(a, 3)?);
                let seen = |evs: &[AsyncEvent]| -> Vec<String> {
                    evs.iter()
                        .filter(|e| e.handle == handle)
                        .map(|e| format!("{:?}", e.kind))
                        .collect()
                };
                loop {
                    let new = self.ctx()?.async_events()?;
                    self.events.extend(new);
                    let kinds = seen(&self.events);
                    if kinds.contains(&kind) {
                        return Ok(kinds.join(","));
                    }
                    if Instant::now() >= deadline {
                        bail!("no {kind} on QP {handle}; seen: {}", kinds.join(","));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            "events" => {
                let new = self.ctx()?.async_events()?;
                self.events.extend(new);
                Ok(self
                    .events
                    .iter()
                    .map(|e| format!("{:?}:{}:{}", e.kind, e.handle, e.detail))
                    .collect::<Vec<_>>()
                    .join(";"))
            }
            "drop" => {
                let n = a[1];
                let found = self.qps.remove(n).is_some()
                    | self.mrs.remove(n).is_some()
                    | self.listeners.remove(n).is_some()
                    | self.cqs.remove(n).is_some();
                if !found {
                    bail!("nothing named {n}");
                }
                Ok(String::new())
            }
            other => bail!("unknown command {other:?}"),
        }
    }
}

/// A context builder for the mode named by `arg` (`bypass`, `mediated`, or the default).
/// `VRDMA_GUEST_TIMEOUT_S` overrides the handshake and control timeout (the Xen lab under a
/// loaded TCG host needs more than the default 10 s).
fn builder(arg: Option<&&str>) -> Result<vrdma::ContextBuilder> {
    let mut b = Context::builder();
    if let Ok(v) = std::env::var("VRDMA_GUEST_TIMEOUT_S") {
        let s: u64 = v
            .parse()
            .map_err(|_| anyhow!("VRDMA_GUEST_TIMEOUT_S={v:?} is not a number of seconds"))?;
        b = b.timeout(Duration::from_secs(s));
    }
    Ok(match arg {
        Some(&"mediated") => b.mode(Mode::Mediated),
        Some(&"bypass") => b.mode(Mode::Bypass),
        None => b,
        Some(other) => bail!("unknown mode {other:?}"),
    })
}

/// SEND ping-pong: each side keeps one receive posted; `first` sends first. Returns the mean
/// round trip in ns (busy-polling).
fn pingpong(
    qp: &mut QueuePair,
    cq: &mut CompletionQueue,
    mr: &MemoryRegion,
    len: usize,
    iters: u64,
    first: bool,
) -> Result<String> {
    let mut wc = [WorkCompletion::default(); 4];
    let send = mr.slice(0..len);
    let recv = mr.slice(len..2 * len);
    let mut wait_for = |cq: &mut CompletionQueue, want: vrdma::WcOpcode| -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for w in cq.poll(&mut wc)?.iter() {
                if !w.is_ok() {
                    bail!("completion failed: {}", wc_text(w));
                }
                if w.opcode == want {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("pingpong: no completion in 30 s");
            }
        }
    };
    qp.post_recv(&[recv], 0)?;
    let start = Instant::now();
    for i in 0..iters {
        if first {
            qp.post_send(&[send], i)?;
            wait_for(cq, vrdma::WcOpcode::Send)?;
            wait_for(cq, vrdma::WcOpcode::Recv)?;
            qp.post_recv(&[recv], i)?;
        } else {
            wait_for(cq, vrdma::WcOpcode::Recv)?;
            qp.post_recv(&[recv], i)?;
            qp.post_send(&[send], i)?;
            wait_for(cq, vrdma::WcOpcode::Send)?;
        }
    }
    Ok(format!(
        "{}",
        start.elapsed().as_nanos() / u128::from(iters.max(1))
    ))
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut g = Guest::default();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let args: Vec<&str> = line.split_whitespace().collect();
        if args.is_empty() {
            continue;
        }
        if args[0] == "exit" {
            let _ = writeln!(out, "ok");
            break;
        }
        if args[0] == "loop" {
            let r = send_loop(&mut g, &args, &mut out);
            let _ = writeln!(out, "err {:#}", r.unwrap_err());
            continue;
        }
        let reply = match g.run(&args) {
            Ok(s) if s.is_empty() => "ok".to_string(),
            Ok(s) => format!("ok {s}"),
            Err(e) => format!("err {e:#}"),
        };
        let _ = writeln!(out, "{reply}");
        let _ = out.flush();
    }
    // Dropping everything closes the channel politely.
    drop(g);
}

/// Sends `len`-byte messages on `qp` forever (the peer must keep receives posted), or RDMA
/// WRITEs them to `remote` if given, reporting `ok looping` once the first completion
/// arrived. Only returns on error.
fn send_loop(g: &mut Guest, a: &[&str], out: &mut std::io::Stdout) -> Result<()> {
    let len: usize = num(a, 4)?;
    let remote: Option<RemoteMr> = a.get(5).map(|r| r.parse()).transpose()?;
    let mr = g.mrs.get(a[3]).context("no MR")?;
    let qp = g.qps.get_mut(a[1]).context("no QP")?;
    let cq = g.cqs.get_mut(a[2]).context("no CQ")?;
    let mut wc = [WorkCompletion::default(); 16];
    let mut outstanding = 0u32;
    let mut told = false;
    let mut i = 0u64;
    loop {
        while outstanding < 8 {
            let posted = match remote {
                Some(r) => qp.post_write(&[mr.slice(0..len)], r, i),
                None => qp.post_send(&[mr.slice(0..len)], i),
            };
            match posted {
                Ok(()) => {
                    outstanding += 1;
                    i += 1;
                }
                Err(vrdma::Error::QueueFull { .. }) => break,
                Err(e) => return Err(e.into()),
            }
        }
        for w in cq.poll(&mut wc)?.iter() {
            if !w.is_ok() {
                bail!("completion failed: {}", wc_text(w));
            }
            outstanding -= 1;
            if !told {
                writeln!(out, "ok looping")?;
                out.flush()?;
                told = true;
            }
        }
    }
}
