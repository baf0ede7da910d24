//! The perftest-style tests: server and client set up a context, a QP and a memory region,
//! exchange endpoints and the region's address/rkey over TCP (perftest's out-of-band
//! exchange, default port 18515), connect, and run one test per message size.
//!
//! With `--cm` (both sides) the QPs connect through the connection manager instead, as
//! rdma_cm applications do and as they must between hosts (iWARP): the server listens on a
//! port of its backend's address and sends that address over the TCP exchange; the client
//! `connect_to`s it. The MRs' address/rkey travel as the CM private data (the client's in its
//! connect, the server's in its accept); the TCP exchange still carries the test's parameters
//! and the per-size synchronisation, as perftest's does.
//!
//! Wire of the TCP exchange (lines of text):
//! ```text
//! client -> server   vrdma-perf 1 <test> <sizes,comma> <iters> <tx-depth> [cm]
//! server -> client   ok <endpoint> <addr:len:rkey>      | ok cm <ip:port>   | err <sentence>
//! client -> server   <endpoint> <addr:len:rkey>         (without cm; with cm: the CM connect)
//! per size:  client -> "go <size>", server -> "ready"; test; client -> "done", server -> "done"
//! client -> server   bye
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use clap::{Parser, ValueEnum};
use vrdma::{
    AccessFlags, CompletionQueue, Context, MemoryRegion, Mode, QpEndpoint, QueuePair, RemoteMr,
    WcOpcode, WorkCompletion, MAX_INLINE,
};

use crate::baseline::{halve, Baselines};
use crate::stats::{bw_table, latency_table, BwRow, LatencyRow};

/// perftest's default port.
pub const DEFAULT_PORT: u16 = 18515;
/// How long a test may see no progress before it is called a hang.
pub const STALL: Duration = Duration::from_secs(30);
/// How long a CM connect (client) or the wait for it (server) may take.
pub const CM_TIMEOUT: Duration = Duration::from_secs(30);

/// The tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Test {
    SendLat,
    WriteLat,
    ReadLat,
    SendBw,
    WriteBw,
    ReadBw,
    /// Baseline only, no vrdma: raw TCP ping-pong between `--between`'s two addresses (both
    /// ends in this process), blocking and busy-polled.
    #[value(alias = "tcp-pingpong")]
    TcpPingpong,
    /// Baseline only, no vrdma: raw TCP streaming between `--between`'s two addresses.
    #[value(alias = "tcp-stream")]
    TcpStream,
}

impl Test {
    pub fn name(self) -> &'static str {
        match self {
            Test::SendLat => "send_lat",
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
            Test::SendBw => "send_bw",
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::TcpPingpong => "tcp_pingpong",
            Test::TcpStream => "tcp_stream",
        }
    }
    pub fn is_latency(self) -> bool {
        matches!(
            self,
            Test::SendLat | Test::WriteLat | Test::ReadLat | Test::TcpPingpong
        )
    }
    /// A TCP baseline run on its own (no vrdma device, both ends in this process).
    pub fn is_baseline(self) -> bool {
        matches!(self, Test::TcpPingpong | Test::TcpStream)
    }
    fn parse(s: &str) -> Result<Test> {
        Test::from_str(s, false).map_err(|e| anyhow!("unknown test {s:?}: {e}"))
    }
    /// perftest reports one-way latency (RTT/2) for SEND and WRITE, the round trip for READ.
    fn halves(self) -> bool {
        matches!(self, Test::SendLat | Test::WriteLat)
    }
}

/// Data-path mode on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    Bypass,
    Mediated,
}

/// `vrdma-perf` command line (also what `vrdma-demo` runs inside the guest domains).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "vrdma-perf",
    version,
    about = "perftest-style RDMA benchmarks over vrdma (server: no HOST; client: HOST)",
    after_help = "Run the server first (`vrdma-perf send_lat`), then the client \
                  (`vrdma-perf send_lat 127.0.0.1`) in another guest. The client's --size, \
                  --iters and --tx-depth rule; each side picks its own --mode. \
                  `tcp_pingpong` and `tcp_stream` (also spelt `--baseline tcp-pingpong`) run \
                  only the raw TCP baseline, both ends in this process, between the \
                  addresses of --between (e.g. 127.0.0.2,127.0.0.3: the two simulated hosts). \
                  Between guests of two hosts, give both sides --cm: the QPs connect through \
                  the connection manager (iWARP), e.g. server `vrdma-perf write_bw --cm`, \
                  client `vrdma-perf write_bw SERVER-GUEST --cm --baseline`."
)]
pub struct PerfArgs {
    /// The test.
    #[arg(value_enum)]
    pub test: Test,
    /// Server to connect to (client); absent: be the server.
    pub host: Option<String>,
    /// TCP port of the endpoint exchange (0 for the server: any free port, printed).
    #[arg(short, long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Message sizes in bytes, comma-separated (default 2 for latency, 65536 for bandwidth).
    #[arg(short, long, value_delimiter = ',')]
    pub size: Vec<usize>,
    /// Every power of two from 2 bytes to 8 MiB (perftest's -a).
    #[arg(short, long)]
    pub all: bool,
    /// Iterations per size (default 1000 for latency, 5000 for bandwidth).
    #[arg(short = 'n', long)]
    pub iters: Option<usize>,
    /// Work requests in flight in bandwidth tests.
    #[arg(short, long, default_value_t = 128)]
    pub tx_depth: usize,
    /// Data path: bypass (default, or $VRDMA_MODE) or mediated.
    #[arg(short, long, value_enum)]
    pub mode: Option<ModeArg>,
    /// Block on the CQ's event channel instead of busy-polling (perftest's -e).
    #[arg(short, long, conflicts_with = "yield_poll")]
    pub events: bool,
    /// Busy-poll, but give the CPU away (sched_yield) after every empty poll: for machines
    /// with fewer cores than spinning threads (the library's post/poll stay syscall-free).
    #[arg(short, long)]
    pub yield_poll: bool,
    /// Also measure, in the same run, a cache-line ping-pong, memcpy and TCP (between
    /// --between's addresses) with the same sizes, and print every figure as a ratio to them
    /// (client side).
    #[arg(short, long)]
    pub baseline: bool,
    /// The TCP baselines' addresses: CLIENT,SERVER (the client socket is bound to CLIENT, the
    /// listener is on SERVER; both in this process), or one address for both. Default
    /// 127.0.0.1; with --cm, the connection's two backend addresses (the same endpoints as
    /// the RDMA traffic).
    #[arg(long, value_name = "CLIENT,SERVER")]
    pub between: Option<crate::baseline::Endpoints>,
    /// Connect the QPs through the connection manager (both sides; the only way between
    /// hosts): the server listens on --cm-port of its backend's address, the client connects
    /// to it; the MR address/rkey travel as CM private data. Without it the QPs are paired by
    /// exchanging QP numbers (intra-host only).
    #[arg(long)]
    pub cm: bool,
    /// The server's CM port on its backend's address (0: the backend chooses).
    #[arg(long, default_value_t = 0, value_name = "PORT")]
    pub cm_port: u16,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON object to this file (client; used by vrdma-demo).
    #[arg(long, hide = true)]
    pub json_out: Option<std::path::PathBuf>,
}

impl PerfArgs {
    /// The TCP baselines' addresses: `--between`'s, else 127.0.0.1.
    pub fn endpoints(&self) -> crate::baseline::Endpoints {
        self.between.unwrap_or(crate::baseline::Endpoints::LOOPBACK)
    }
    fn sizes(&self) -> Vec<usize> {
        if self.all {
            (1..=23).map(|i| 1usize << i).collect()
        } else if self.size.is_empty() {
            match self.test {
                // The inter-host rows of the targets table: 64 B latency, 64 KiB and 1 MiB
                // bandwidth.
                Test::TcpPingpong => vec![64],
                Test::TcpStream => vec![65536, 1 << 20],
                t if t.is_latency() => vec![2],
                _ => vec![65536],
            }
        } else {
            self.size.clone()
        }
    }
    fn iters(&self) -> usize {
        self.iters
            .unwrap_or(if self.test.is_latency() { 1000 } else { 5000 })
    }
}

/// What a client run measured.
#[derive(Debug, Clone)]
pub struct Report {
    pub test: Test,
    pub mode: Mode,
    pub events: bool,
    pub yield_poll: bool,
    pub latency: Vec<LatencyRow>,
    pub bandwidth: Vec<BwRow>,
    pub baselines: Option<Baselines>,
    /// How the QPs were connected: `Some` through the connection manager (this end, the peer).
    pub cm: Option<(SocketAddr, SocketAddr)>,
}

/// Runs `args` as server or client, printing tables (or JSON) to stdout.
pub fn run(args: &PerfArgs) -> Result<()> {
    if args.tx_depth == 0 || args.tx_depth > 1024 {
        bail!("--tx-depth must be 1..=1024");
    }
    if args.test.is_baseline() {
        if let Some(h) = &args.host {
            bail!(
                "{} runs both ends in this process: give its addresses with --between \
                 (e.g. --between 127.0.0.2,{h}), not a HOST",
                args.test.name()
            );
        }
        let report = crate::tcp::run(args, &args.sizes(), args.iters)?;
        if let Some(p) = &args.json_out {
            std::fs::write(p, serde_json::to_string(&report.to_json())?)
                .with_context(|| format!("writing {}", p.display()))?;
        }
        let out = if args.json {
            serde_json::to_string_pretty(&report.to_json())? + "\n"
        } else {
            report.text()
        };
        print!("{out}");
        std::io::stdout().flush()?;
        return Ok(());
    }
    match &args.host {
        None => serve(args),
        Some(h) => {
            let report = client(args, h)?;
            if let Some(p) = &args.json_out {
                std::fs::write(p, serde_json::to_string(&report.to_json())?)
                    .with_context(|| format!("writing {}", p.display()))?;
            }
            let out = if args.json {
                serde_json::to_string_pretty(&report.to_json())? + "\n"
            } else {
                report.text()
            };
            print!("{out}");
            std::io::stdout().flush()?;
            Ok(())
        }
    }
}

fn open_context(mode: Option<ModeArg>) -> Result<Context> {
    let mut b = Context::builder();
    match mode {
        Some(ModeArg::Bypass) => b = b.mode(Mode::Bypass),
        Some(ModeArg::Mediated) => b = b.mode(Mode::Mediated),
        None => {}
    }
    b.open().context("opening the vrdma device")
}

/// Everything one side holds.
struct Side {
    ctx: Context,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
    /// Offset of the landing area (where the peer writes) in `mr`.
    landing: usize,
    events: bool,
    yield_poll: bool,
    inline_max: usize,
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

impl Side {
    fn new(args: &PerfArgs, max_size: usize, depth: usize) -> Result<Side> {
        let (mode, events, yield_poll) = (args.mode, args.events, args.yield_poll);
        let ctx = open_context(mode)?;
        let pd = ctx.alloc_pd().context("alloc PD")?;
        let q = (depth.max(16) * 2).next_power_of_two() as u32;
        let cq = ctx.create_cq(q * 2).context("create CQ")?;
        let qp = pd
            .create_qp(&cq, &cq)
            .sq_size(q)
            .rq_size(q)
            .max_inline(MAX_INLINE as u32)
            .build()
            .context("create QP")?;
        let landing = round_up(max_size, 4096);
        let mr = pd
            .alloc_mr(landing * 2, AccessFlags::ALL)
            .with_context(|| format!("alloc MR of {} bytes", landing * 2))?;
        Ok(Side {
            ctx,
            cq,
            qp,
            mr,
            landing,
            events,
            yield_poll,
            inline_max: MAX_INLINE,
        })
    }

    fn line(&self) -> String {
        format!("{} {}", self.qp.endpoint(), self.mr.remote())
    }

    /// Polls (or waits, with `--events`) until one completion arrives; errors on a failed
    /// completion or a stall.
    fn next_wc(&mut self, wc: &mut [WorkCompletion]) -> Result<usize> {
        let t = Instant::now();
        loop {
            let got = if self.events {
                self.cq.wait(wc, Some(Duration::from_millis(100)))?
            } else {
                self.cq.poll(wc)?
            };
            if !got.is_empty() {
                if let Some(bad) = got.iter().find(|w| !w.is_ok()) {
                    bail!("work request failed: {bad:?}");
                }
                return Ok(got.len());
            }
            if t.elapsed() > STALL {
                bail!("no completion for {} s", STALL.as_secs());
            }
            if self.yield_poll {
                std::thread::yield_now();
            }
        }
    }

    /// Waits for a completion of opcode `want`, counting the others (signaled sends) away.
    fn wait_for(&mut self, want: WcOpcode) -> Result<()> {
        let mut wc = [WorkCompletion::default(); 1];
        loop {
            self.next_wc(&mut wc)?;
            if wc[0].opcode == want {
                return Ok(());
            }
        }
    }

    fn post_send(&mut self, size: usize, wr_id: u64) -> Result<()> {
        if size <= self.inline_max {
            let mut buf = [0u8; MAX_INLINE];
            self.mr.read(0, &mut buf[..size])?;
            self.qp.post_send_inline(&buf[..size], wr_id)?;
        } else {
            self.qp.post_send(&[self.mr.slice(0..size)], wr_id)?;
        }
        Ok(())
    }

    fn post_recv(&mut self, size: usize, wr_id: u64) -> Result<()> {
        let l = self.landing;
        self.qp.post_recv(&[self.mr.slice(l..l + size)], wr_id)?;
        Ok(())
    }

    /// Spins (reading a copy of one byte) until the landing area's last byte is `tag`.
    fn spin_landing(&self, size: usize, tag: u8) -> Result<()> {
        let t = Instant::now();
        let mut b = [0u8; 1];
        let mut n = 0u32;
        loop {
            self.mr.read(self.landing + size - 1, &mut b)?;
            if b[0] == tag {
                return Ok(());
            }
            n = n.wrapping_add(1);
            if n % 4096 == 0 && t.elapsed() > STALL {
                bail!(
                    "the peer's RDMA WRITE did not land in {} s",
                    STALL.as_secs()
                );
            }
            if self.events || self.yield_poll {
                // Nothing to block on (a WRITE raises no completion at the target): poll
                // politely, giving the CPU to whoever must run for the write to land.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Posts a signaled WRITE of `size` bytes from offset 0 to `remote`, first draining
    /// completions so the send queue never fills.
    fn post_write_tagged(&mut self, size: usize, remote: RemoteMr, tag: u8, i: u64) -> Result<()> {
        self.mr.write(size - 1, &[tag])?;
        self.drain()?;
        self.qp.post_write(&[self.mr.slice(0..size)], remote, i)?;
        Ok(())
    }

    fn drain(&mut self) -> Result<()> {
        let mut wc = [WorkCompletion::default(); 16];
        for w in self.cq.poll(&mut wc)?.iter() {
            if !w.is_ok() {
                bail!("work request failed: {w:?}");
            }
        }
        Ok(())
    }
}

fn tag(i: usize) -> u8 {
    (i % 255) as u8 + 1
}

struct Link {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Link {
    fn new(s: TcpStream) -> Result<Link> {
        s.set_nodelay(true)?;
        Ok(Link {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }
    fn send(&mut self, line: &str) -> Result<()> {
        writeln!(self.w, "{line}").context("writing to the peer")?;
        Ok(())
    }
    fn recv(&mut self) -> Result<String> {
        let mut s = String::new();
        if self.r.read_line(&mut s).context("reading from the peer")? == 0 {
            bail!("the peer closed the TCP connection");
        }
        Ok(s.trim_end().to_string())
    }
    fn expect(&mut self, want: &str) -> Result<()> {
        let got = self.recv()?;
        if got != want {
            bail!("expected {want:?} from the peer, got {got:?}");
        }
        Ok(())
    }
}

fn parse_peer(line: &str) -> Result<(QpEndpoint, RemoteMr)> {
    let mut it = line.split_whitespace();
    let ep = it
        .next()
        .ok_or_else(|| anyhow!("no endpoint in {line:?}"))?;
    let mr = it.next().ok_or_else(|| anyhow!("no MR in {line:?}"))?;
    Ok((ep.parse()?, mr.parse()?))
}

/// The peer's MR (`addr:len:rkey`) from CM private data.
fn parse_mr_private(data: &[u8]) -> Result<RemoteMr> {
    let s = std::str::from_utf8(data)
        .map_err(|_| anyhow!("the peer's CM private data is not text: {data:?}"))?;
    s.parse()
        .with_context(|| format!("the peer's CM private data {s:?} is not its MR"))
}

fn serve(args: &PerfArgs) -> Result<()> {
    let l = TcpListener::bind(("0.0.0.0", args.port))
        .with_context(|| format!("listening on TCP port {}", args.port))?;
    let port = l.local_addr()?.port();
    println!(
        "# vrdma-perf {} server listening on port {port}",
        args.test.name()
    );
    std::io::stdout().flush()?;
    let (s, peer) = l.accept()?;
    let mut link = Link::new(s)?;
    let hello = link.recv()?;
    let f: Vec<&str> = hello.split_whitespace().collect();
    if !(f.len() == 6 || f.len() == 7 && f[6] == "cm") || f[0] != "vrdma-perf" || f[1] != "1" {
        bail!("{peer} is not a vrdma-perf client: {hello:?}");
    }
    let client_cm = f.len() == 7;
    if client_cm != args.cm {
        let (srv, cl) = if args.cm {
            (
                "connects through the connection manager (--cm)",
                "without --cm",
            )
        } else {
            ("exchanges QP numbers (no --cm)", "with --cm")
        };
        link.send(&format!("err the server {srv}: run both sides alike"))?;
        bail!("the client runs {cl} but this server {srv}: run both sides alike");
    }
    let test = Test::parse(f[2])?;
    if test.is_baseline() {
        link.send("err a TCP baseline needs no server")?;
        bail!("client asked for {}, which needs no server", test.name());
    }
    if test != args.test {
        link.send(&format!("err the server runs {}", args.test.name()))?;
        bail!(
            "client asked for {} but this server runs {}",
            f[2],
            args.test.name()
        );
    }
    let sizes: Vec<usize> = f[3]
        .split(',')
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let iters: usize = f[4].parse()?;
    let depth: usize = f[5].parse()?;
    let max = *sizes.iter().max().ok_or_else(|| anyhow!("no sizes"))?;
    let mut side = match Side::new(args, max, depth) {
        Ok(s) => s,
        Err(e) => {
            link.send(&format!("err {e:#}"))?;
            return Err(e);
        }
    };
    let remote = if args.cm {
        let l = side
            .ctx
            .listen(args.cm_port, 1)
            .with_context(|| format!("CM listen on port {}", args.cm_port))?;
        link.send(&format!("ok cm {}", l.local_addr()))?;
        let req = l
            .get_request(Some(CM_TIMEOUT))
            .context("waiting for the client's CM connect")?;
        let remote = parse_mr_private(req.private_data())?;
        let info = req
            .accept(&mut side.qp, side.mr.remote().to_string().as_bytes())
            .context("CM accept")?;
        println!(
            "# connected through the connection manager: {} (here) <- {}",
            info.local, info.peer
        );
        std::io::stdout().flush()?;
        remote
    } else {
        link.send(&format!("ok {}", side.line()))?;
        let (ep, remote) = parse_peer(&link.recv()?)?;
        side.qp.connect(&ep).context("connect QP")?;
        remote
    };
    loop {
        let cmd = link.recv()?;
        if cmd == "bye" {
            break;
        }
        let size: usize = cmd
            .strip_prefix("go ")
            .ok_or_else(|| anyhow!("unexpected {cmd:?}"))?
            .parse()?;
        let rl = remote.slice(side.landing..side.landing + size);
        match test {
            Test::SendLat => {
                side.post_recv(size, 0)?;
                link.send("ready")?;
                for i in 0..iters {
                    side.wait_for(WcOpcode::Recv)?;
                    // No receive left behind for the next size's (larger) messages.
                    if i + 1 < iters {
                        side.post_recv(size, i as u64)?;
                    }
                    side.post_send(size, i as u64)?;
                }
            }
            Test::WriteLat => {
                side.mr.fill(side.landing, size, 0)?;
                link.send("ready")?;
                for i in 0..iters {
                    side.spin_landing(size, tag(i))?;
                    side.post_write_tagged(size, rl, tag(i), i as u64)?;
                }
            }
            Test::SendBw => {
                let first = iters.min(depth.max(16) * 2);
                for i in 0..first {
                    side.post_recv(size, i as u64)?;
                }
                link.send("ready")?;
                let (mut posted, mut got) = (first, 0);
                let mut wc = [WorkCompletion::default(); 32];
                while got < iters {
                    let n = side.next_wc(&mut wc)?;
                    for w in &wc[..n] {
                        if w.opcode == WcOpcode::Recv {
                            got += 1;
                            if posted < iters {
                                side.post_recv(size, posted as u64)?;
                                posted += 1;
                            }
                        }
                    }
                }
            }
            // Passive side: the client's READs and WRITEs need nothing from us.
            Test::ReadLat | Test::WriteBw | Test::ReadBw => link.send("ready")?,
            Test::TcpPingpong | Test::TcpStream => bail!("{} needs no server", test.name()),
        }
        link.expect("done")?;
        side.drain()?;
        link.send("done")?;
    }
    println!("# vrdma-perf {} server: done", test.name());
    Ok(())
}

/// Runs the client side and returns what it measured.
pub fn client(args: &PerfArgs, host: &str) -> Result<Report> {
    let sizes = args.sizes();
    if sizes.contains(&0) {
        bail!("--size 0 is not supported");
    }
    let iters = args.iters().max(1);
    let addr = if host.contains(':') && !host.starts_with('[') {
        host.to_string()
    } else {
        format!("{host}:{}", args.port)
    };
    // Without --cm the baselines go first, as always; with it, once the connection says
    // between which addresses the RDMA traffic runs (when --between does not say).
    let mut baselines = if args.baseline && !args.cm {
        Some(
            Baselines::measure(&sizes, iters, args.endpoints())
                .context("measuring the baselines")?,
        )
    } else {
        None
    };
    let s = connect_retry(&addr)?;
    let mut link = Link::new(s)?;
    let list: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
    link.send(&format!(
        "vrdma-perf 1 {} {} {iters} {}{}",
        args.test.name(),
        list.join(","),
        args.tx_depth,
        if args.cm { " cm" } else { "" }
    ))?;
    let max = *sizes.iter().max().expect("sizes");
    let mut side = Side::new(args, max, args.tx_depth)?;
    let answer = link.recv()?;
    let Some(peer) = answer.strip_prefix("ok ") else {
        bail!("the server refused: {answer}");
    };
    let (remote, cm) = match (args.cm, peer.strip_prefix("cm ")) {
        (true, Some(at)) => {
            let at: SocketAddr = at
                .parse()
                .with_context(|| format!("the server's CM address {at:?}"))?;
            let info = side
                .qp
                .connect_to(at, side.mr.remote().to_string().as_bytes(), CM_TIMEOUT)
                .with_context(|| format!("CM connect to {at}"))?;
            (
                parse_mr_private(&info.private_data)?,
                Some((info.local, info.peer)),
            )
        }
        (false, None) => {
            let (ep, remote) = parse_peer(peer)?;
            link.send(&side.line())?;
            side.qp.connect(&ep).context("connect QP")?;
            (remote, None)
        }
        (true, None) => {
            bail!("the server exchanges QP numbers (it runs without --cm): run both sides alike")
        }
        (false, Some(_)) => {
            bail!("the server connects through the connection manager (--cm): run both sides alike")
        }
    };
    if args.baseline && baselines.is_none() {
        let ends = match (args.between, cm) {
            (Some(e), _) => e,
            (None, Some((local, peer))) => crate::baseline::Endpoints {
                client: local.ip(),
                server: peer.ip(),
            },
            (None, None) => args.endpoints(),
        };
        baselines =
            Some(Baselines::measure(&sizes, iters, ends).context("measuring the baselines")?);
    }
    let mode = side.ctx.mode();
    let mut report = Report {
        test: args.test,
        mode,
        events: args.events,
        yield_poll: args.yield_poll,
        latency: Vec::new(),
        bandwidth: Vec::new(),
        baselines,
        cm,
    };
    for &size in &sizes {
        link.send(&format!("go {size}"))?;
        if args.test == Test::WriteLat {
            side.mr.fill(side.landing, size, 0)?;
        }
        link.expect("ready")?;
        let rl = remote.slice(side.landing..side.landing + size);
        if args.test.is_latency() {
            let rtts = latency_test(&mut side, args.test, size, iters, rl)?;
            let samples = if args.test.halves() {
                halve(&rtts)
            } else {
                rtts
            };
            report
                .latency
                .push(LatencyRow::from_samples(size, iters, &samples));
        } else {
            let row = bw_test(&mut side, args.test, size, iters, args.tx_depth, rl)?;
            report.bandwidth.push(row);
        }
        link.send("done")?;
        link.expect("done")?;
    }
    link.send("bye")?;
    Ok(report)
}

fn connect_retry(addr: &str) -> Result<TcpStream> {
    let t = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) if t.elapsed() > Duration::from_secs(10) => {
                return Err(e).with_context(|| format!("connecting to the server at {addr}"))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Round trips in µs, one per iteration.
fn latency_test(
    side: &mut Side,
    test: Test,
    size: usize,
    iters: usize,
    remote: RemoteMr,
) -> Result<Vec<f64>> {
    let mut rtts = Vec::with_capacity(iters);
    match test {
        Test::SendLat => {
            side.post_recv(size, 0)?;
            for i in 0..iters {
                let t = Instant::now();
                side.post_send(size, i as u64)?;
                side.wait_for(WcOpcode::Recv)?;
                rtts.push(t.elapsed().as_secs_f64() * 1e6);
                if i + 1 < iters {
                    side.post_recv(size, i as u64)?;
                }
            }
            side.drain()?;
        }
        Test::WriteLat => {
            for i in 0..iters {
                let t = Instant::now();
                side.post_write_tagged(size, remote, tag(i), i as u64)?;
                side.spin_landing(size, tag(i))?;
                rtts.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        Test::ReadLat => {
            for i in 0..iters {
                let t = Instant::now();
                side.qp
                    .post_read(&[side.mr.slice(0..size)], remote, i as u64)?;
                side.wait_for(WcOpcode::RdmaRead)?;
                rtts.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        _ => unreachable!("not a latency test"),
    }
    Ok(rtts)
}

fn bw_test(
    side: &mut Side,
    test: Test,
    size: usize,
    iters: usize,
    depth: usize,
    remote: RemoteMr,
) -> Result<BwRow> {
    let mut wc = [WorkCompletion::default(); 32];
    let (mut posted, mut done) = (0usize, 0usize);
    let mut windows = Vec::new();
    let start = Instant::now();
    let mut mark = start;
    while done < iters {
        while posted < iters && posted - done < depth {
            let r = match test {
                Test::SendBw => side.post_send(size, posted as u64),
                Test::WriteBw => side
                    .qp
                    .post_write(&[side.mr.slice(0..size)], remote, posted as u64)
                    .map_err(Into::into),
                Test::ReadBw => side
                    .qp
                    .post_read(&[side.mr.slice(0..size)], remote, posted as u64)
                    .map_err(Into::into),
                _ => unreachable!("not a bandwidth test"),
            };
            match r {
                Ok(()) => posted += 1,
                Err(e) if matches!(e.downcast_ref(), Some(vrdma::Error::QueueFull { .. })) => break,
                Err(e) => return Err(e),
            }
        }
        let n = side.next_wc(&mut wc)?;
        for _ in 0..n {
            done += 1;
            if done % depth == 0 {
                let now = Instant::now();
                windows.push((now - mark).as_secs_f64());
                mark = now;
            }
        }
    }
    let total = start.elapsed().as_secs_f64();
    Ok(BwRow::new(size, iters, total, depth, &windows))
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Bypass => "bypass",
        Mode::Mediated => "mediated",
    }
}

impl Report {
    /// How the client waited for completions.
    pub fn polling(&self) -> &'static str {
        if self.events {
            "events"
        } else if self.yield_poll {
            "yield-poll"
        } else {
            "busy-poll"
        }
    }

    /// Which threads busy-poll during the vrdma figures.
    pub fn spinning(&self) -> String {
        let (client, server) = match (self.test, self.polling()) {
            (Test::WriteLat, "busy-poll") => ("1 (memory poll)", "1 (memory poll)"),
            (Test::WriteLat, _) => (
                "1 (memory poll, yielding after each check)",
                "1 (memory poll, yielding)",
            ),
            (Test::SendLat | Test::SendBw, "events") => ("0 (blocks on CQ events)", "0 (events)"),
            (Test::SendLat | Test::SendBw, "busy-poll") => ("1 (CQ busy-poll)", "1 (CQ busy-poll)"),
            (Test::SendLat | Test::SendBw, _) => ("1 (CQ poll, yielding)", "1 (CQ poll, yielding)"),
            (_, "events") => ("0 (blocks on CQ events)", "0 (passive)"),
            (_, "busy-poll") => ("1 (CQ busy-poll)", "0 (passive)"),
            (_, _) => ("1 (CQ poll, yielding)", "0 (passive)"),
        };
        let poller = format!("client {client}");
        let server = format!("server {server}, if it polls like the client");
        let engine = match (self.mode, self.between_hosts()) {
            (Mode::Bypass, false) => {
                "the backend's engine thread(s) (doorbell busy-poll while work flows)"
            }
            (Mode::Mediated, false) => {
                "the backend's engine thread(s) while work flows; the poster spins briefly per \
                 control request, then blocks"
            }
            (Mode::Bypass, true) => {
                "the engine thread(s) of BOTH hosts' backends (each polls its doorbells and \
                 sockets for its spin-before-sleep after work, then sleeps in epoll)"
            }
            (Mode::Mediated, true) => {
                "the engine thread(s) of both hosts' backends while work flows; the poster \
                 spins briefly per control request, then blocks"
            }
        };
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        format!("{poller} + {server} + {engine}; this machine has {cores} cores")
    }

    /// Whether the QPs were connected through the CM to another backend's address (iWARP).
    pub fn between_hosts(&self) -> bool {
        self.cm.is_some_and(|(local, peer)| local.ip() != peer.ip())
    }

    /// How the QPs were connected, in words.
    pub fn connection(&self) -> String {
        match self.cm {
            Some((local, peer)) if local.ip() != peer.ip() => format!(
                "connection manager, {local} -> {peer} (between two hosts' backends: iWARP over TCP)"
            ),
            Some((local, peer)) => format!(
                "connection manager, {local} -> {peer} (the backend's own address: paired on this host)"
            ),
            None => "QP numbers exchanged (this host)".into(),
        }
    }

    /// perftest-style text.
    pub fn text(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "# vrdma-perf {}  mode: {}  polling: {}\n# connection: {}\n# spinning threads: {}\n",
            self.test.name(),
            mode_name(self.mode),
            self.polling(),
            self.connection(),
            self.spinning()
        ));
        if self.test.is_latency() {
            if self.test.halves() {
                s.push_str("# latency is one-way: round trip / 2 (as perftest)\n");
            } else {
                s.push_str("# latency is the round trip (as perftest for READ)\n");
            }
            s.push_str(&latency_table(&self.latency));
        } else {
            s.push_str(&bw_table(&self.bandwidth));
        }
        if let Some(b) = &self.baselines {
            s.push_str(&self.baseline_text(b));
        }
        s
    }

    fn baseline_text(&self, b: &Baselines) -> String {
        let mut s = format!(
            "# baselines, same process and run: cache-line ping-pong (2 threads spin), \
             memcpy (1 thread), TCP {} ping-pong blocking (0 spin) and busy-polled (2 spin) / \
             stream (blocking, 0 spin)\n",
            b.tcp_endpoints
        );
        let cl = b.cache_line_rtt.t_typical;
        if self.test.is_latency() {
            let k = if self.test.halves() { 0.5 } else { 1.0 };
            s.push_str(&format!(
                " {:<7} {:>16} {:>16} {:>10} {:>18} {:>10} {:>18} {:>10}\n",
                "#bytes",
                "vrdma[usec]",
                "cache-line[usec]",
                "ratio",
                "TCP ping-pong[usec]",
                "ratio",
                "TCP busy-poll[usec]",
                "ratio"
            ));
            for r in &self.latency {
                let (tcp, busy) = b.size(r.bytes).map_or((f64::NAN, f64::NAN), |x| {
                    (
                        x.tcp_pingpong.t_typical * k,
                        x.tcp_pingpong_busy.t_typical * k,
                    )
                });
                s.push_str(&format!(
                    " {:<7} {:>16.3} {:>16.3} {:>10.2} {:>18.3} {:>10.3} {:>18.3} {:>10.3}\n",
                    r.bytes,
                    r.t_typical,
                    cl * k,
                    r.t_typical / (cl * k),
                    tcp,
                    r.t_typical / tcp,
                    busy,
                    r.t_typical / busy
                ));
            }
            s.push_str(&format!(
                "# t_typical (median) each; {} for {}\n",
                if self.test.halves() {
                    "one-way = RTT/2"
                } else {
                    "round trips"
                },
                self.test.name()
            ));
        } else {
            s.push_str(&format!(
                " {:<10} {:>16} {:>16} {:>8} {:>18} {:>8}\n",
                "#bytes", "vrdma[MB/sec]", "memcpy[MB/sec]", "ratio", "TCP stream[MB/sec]", "ratio"
            ));
            for r in &self.bandwidth {
                let (mc, tcp) = b.size(r.bytes).map_or((f64::NAN, f64::NAN), |x| {
                    (x.memcpy.bw_avg_mb, x.tcp_stream.bw_avg_mb)
                });
                s.push_str(&format!(
                    " {:<10} {:>16.2} {:>16.2} {:>8.3} {:>18.2} {:>8.3}\n",
                    r.bytes,
                    r.bw_avg_mb,
                    mc,
                    r.bw_avg_mb / mc,
                    tcp,
                    r.bw_avg_mb / tcp
                ));
            }
            s.push_str("# BW average each\n");
        }
        s
    }

    /// The same as one JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        let lat = LatencyRow::to_json;
        let bw = BwRow::to_json;
        let base = self.baselines.as_ref().map(|b| {
            json!({
                "cache_line_rtt": lat(&b.cache_line_rtt),
                "tcp_endpoints": {
                    "client": b.tcp_endpoints.client.to_string(),
                    "server": b.tcp_endpoints.server.to_string(),
                },
                "sizes": b.sizes.iter().map(|x| json!({
                    "bytes": x.bytes,
                    "tcp_pingpong_rtt": lat(&x.tcp_pingpong),
                    "tcp_pingpong_busy_rtt": lat(&x.tcp_pingpong_busy),
                    "tcp_stream": bw(&x.tcp_stream),
                    "memcpy": bw(&x.memcpy),
                })).collect::<Vec<_>>(),
            })
        });
        json!({
            "test": self.test.name(),
            "mode": mode_name(self.mode),
            "polling": self.polling(),
            "connection": match self.cm {
                Some((local, peer)) => json!({
                    "how": "cm",
                    "local": local.to_string(),
                    "peer": peer.to_string(),
                    "between_hosts": self.between_hosts(),
                }),
                None => json!({ "how": "qpn" }),
            },
            "one_way": self.test.halves(),
            "spinning_threads": self.spinning(),
            "latency": self.latency.iter().map(lat).collect::<Vec<_>>(),
            "bandwidth": self.bandwidth.iter().map(bw).collect::<Vec<_>>(),
            "baselines": base,
        })
    }
}
