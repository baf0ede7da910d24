//! `vrdma-soak`: hostile guests against one good guest pair, for minutes, on a simulated host.
//!
//! ```text
//! cargo run --release --bin vrdma-soak -- --minutes 10
//! ```
//!
//! The command starts a simulated Xen host in this process and the real `vrdma-backend` as a
//! separate process (dom0), creates two good domains and `--attackers` attacker domains, and
//! starts one process per domain (this same binary in a hidden role: `good` or `attack`).
//!
//! - The **good pair** transfers continuously and checks every byte: SEND echoed back, RDMA
//!   WRITE with immediate checked by the target, RDMA READ checked by the reader, a control
//!   request per round, and now and then a fresh channel with a self-connected QP pair.
//! - The **attackers** run one attack kind at a time, all of them, rotating every
//!   `--phase-secs` (see [`Kind`]); one attacker process is SIGKILLed every `--kill-every-ms`
//!   (mean) and respawned.
//!
//! At the end it prints what the good guest did and saw per attack kind, and the backend's RSS,
//! open descriptors and the host's grant/mapping counts at the start (before any attacker) and
//! at the end (after every attacker process is gone). It exits non-zero when the good guest saw
//! an error, an attacker got something it must not (a breach), the backend died, or the counts
//! did not come back to the baseline within the tolerance (docs/security.md, "Soak").

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use vrdma::{
    AccessFlags, CompletionQueue, Context, MemoryRegion, QpEndpoint, QueuePair, RemoteMr, WcOpcode,
    WorkCompletion,
};
use vrdma_backend::resources::{Quotas, Resource};
use vrdma_backend::toolstack::attach_device;
use xen_platform::sim::{sock, SimHost, SimHostConfig};
use xen_platform::{DomId, ENV_SIM_DIR, ENV_SIM_DOMID};
use xenstore_proto::client::Client;

#[derive(Parser)]
#[command(
    about = "Hostile guests against a good guest pair on a simulated Xen host",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    role: Option<Role>,
    #[command(flatten)]
    soak: SoakArgs,
}

#[derive(Subcommand)]
enum Role {
    /// (internal) One of the good pair: `a` drives, `b` answers.
    #[command(hide = true)]
    Good(GoodArgs),
    /// Runs one attack kind in a loop (or once): the attacker process of the soak and of
    /// tests/tests/hostile.rs. Runs in a simulated domain (VRDMA_SIM, VRDMA_SIM_DOMID).
    Attack(AttackArgs),
}

#[derive(Args, Clone)]
struct SoakArgs {
    /// Minutes to run (added to --seconds; 1 minute when neither is given).
    #[arg(long, default_value_t = 0.0)]
    minutes: f64,
    /// Seconds to run (added to --minutes).
    #[arg(long, default_value_t = 0.0)]
    seconds: f64,
    /// Attacker domains (one process each).
    #[arg(long, default_value_t = 3)]
    attackers: usize,
    /// Seconds each attack kind runs before the next one (all attackers run the same kind).
    #[arg(long, default_value_t = 5.0)]
    phase_secs: f64,
    /// Attack kinds to rotate through (comma-separated; default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    kinds: Vec<Kind>,
    /// Pause of an attacker between two attack rounds (ms).
    #[arg(long, default_value_t = 50)]
    pace_ms: u64,
    /// Mean time between two SIGKILLs of a random attacker process (ms; 0: never).
    #[arg(long, default_value_t = 1500)]
    kill_every_ms: u64,
    /// Size of one hogging RDMA WRITE (MiB); capped to what the machine's memory allows.
    #[arg(long, default_value_t = 1024)]
    hog_mib: u64,
    /// Pause of the good guest between two rounds (microseconds).
    #[arg(long, default_value_t = 1000)]
    good_pace_us: u64,
    /// How long one good-guest step may take before it counts as an error (a hang guard).
    #[arg(long, default_value_t = 10)]
    op_timeout_secs: u64,
    /// Seconds to wait, after the attackers are gone, for the counts to come back.
    #[arg(long, default_value_t = 30)]
    settle_secs: u64,
    /// Allowed growth of the backend's RSS at the end over the start (MiB) ...
    #[arg(long, default_value_t = 32)]
    rss_tolerance_mib: u64,
    /// ... or this percentage of the start RSS, whichever is larger.
    #[arg(long, default_value_t = 25)]
    rss_tolerance_pct: u64,
    /// Engine threads of the backend's software device.
    #[arg(long, default_value_t = 1)]
    engine_threads: usize,
    /// The vrdma-backend binary (default: VRDMA_BACKEND_BIN, else next to this binary, else
    /// built with cargo).
    #[arg(long)]
    backend: Option<PathBuf>,
    /// Where the backend's and the guests' logs go (default: a temporary directory, kept and
    /// named when the soak fails).
    #[arg(long)]
    log_dir: Option<PathBuf>,
}

/// One kind of attack; the number in brackets is the item of issue 10 it aims at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Kind {
    /// [1] Connect an own QP to another domain's connected QP (half-open), then destroy it.
    HalfOpenDestroy,
    /// [1] Same, then close the channel (XenStore Closing) while the Connect is pending.
    HalfOpenClose,
    /// [2] Allocate MRs (pages), CQs and QPs until the quotas refuse, hold, release.
    QuotaFill,
    /// [3] Storm of writes to the own frontend XenStore nodes, AllocPd/DeallocPd loops.
    XsStorm,
    /// [4] RegMr/DeregMr flood from several threads, then Closing in the middle of it.
    MrFloodClose,
    /// [5] Huge RDMA WRITEs (--hog-mib) on a self-connected QP.
    Hog,
    /// [6] Create/destroy churn of every object (handles move fast).
    Churn,
    /// [7] RDMA WRITEs with rkeys of deregistered MRs and near-misses of foreign rkeys.
    StaleRkey,
    /// [8] Garbage WQEs, random rkeys, foreign rkeys, out-of-bounds addresses.
    Garbage,
    /// [12] Rapid open/close of channels, more at once than max-channels allows.
    OpenClose,
}

impl Kind {
    const ALL: [Kind; 10] = [
        Kind::HalfOpenDestroy,
        Kind::HalfOpenClose,
        Kind::QuotaFill,
        Kind::XsStorm,
        Kind::MrFloodClose,
        Kind::Hog,
        Kind::Churn,
        Kind::StaleRkey,
        Kind::Garbage,
        Kind::OpenClose,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::HalfOpenDestroy => "half-open-destroy",
            Kind::HalfOpenClose => "half-open-close",
            Kind::QuotaFill => "quota-fill",
            Kind::XsStorm => "xs-storm",
            Kind::MrFloodClose => "mr-flood-close",
            Kind::Hog => "hog",
            Kind::Churn => "churn",
            Kind::StaleRkey => "stale-rkey",
            Kind::Garbage => "garbage",
            Kind::OpenClose => "open-close",
        }
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let r = match cli.role {
        Some(Role::Good(a)) => good::run(&a),
        Some(Role::Attack(a)) => attack::run(&a),
        None => soak::run(&cli.soak),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("vrdma-soak: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The byte at index `i` of pattern `seed` (the same as vrdma-guest's).
fn pattern(seed: u64, i: usize) -> u8 {
    let x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed.wrapping_mul(31);
    (x >> 29) as u8 ^ (i as u8)
}

fn pattern_vec(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern(seed, i)).collect()
}

/// Stdin lines of a role process, read on a thread; EOF ends the channel.
fn stdin_lines() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Prints one line to the orchestrator and flushes it.
fn say(line: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// A small xorshift generator: the soak needs varied, not cryptographic, numbers.
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Rng(t ^ (u64::from(std::process::id()) << 32) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        for c in b.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
        b
    }
}

/// Waits on `cq` until one completion arrives or `deadline` passes.
fn next_wc(cq: &mut CompletionQueue, deadline: Instant) -> Result<WorkCompletion> {
    let mut wc = [WorkCompletion::default(); 1];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("no completion within the deadline");
        }
        let n = cq.wait(&mut wc, Some(left))?.len();
        if n == 1 {
            return Ok(wc[0]);
        }
    }
}

/// Connects `a` to `b` and `b` to `a` at once (the backend answers when both ends connected).
fn connect_pair(a: &mut QueuePair, b: &mut QueuePair) -> Result<()> {
    let (ea, eb) = (a.endpoint(), b.endpoint());
    std::thread::scope(|s| {
        let t = s.spawn(|| b.connect(&ea));
        let ra = a.connect(&eb);
        let rb = t.join().map_err(|_| anyhow!("connect thread panicked"))?;
        ra?;
        rb?;
        Ok(())
    })
}

/// This process's frontend device node (`/local/domain/<d>/device/vrdma/0`).
fn front_dev(ctx: &Context) -> String {
    format!(
        "/local/domain/{}/device/vrdma/{}",
        ctx.domid().0,
        ctx.devid()
    )
}

// ---------------------------------------------------------------------------------------------
// The good pair.

mod good {
    use super::*;

    /// Sizes the pair cycles through (bytes).
    pub const SIZES: [usize; 7] = [1, 63, 4096, 4099, 65_539, 262_144, 1 << 20];
    /// The largest size: every buffer slot of the layout below is this big.
    pub const SLOT: usize = 1 << 20;
    // A: [0] send source, [1] echo receive, [2] read destination, [3] ack receive.
    // B: [0] receive 0, [1] receive 1, [2] WRITE target, [3] ack source.
    pub const MR_LEN: usize = 4 * SLOT;
    /// WRITE patterns use seed `round + WRITE_SEED`.
    const WRITE_SEED: u64 = 1 << 40;

    pub fn run(a: &GoodArgs) -> Result<bool> {
        let lines = stdin_lines();
        let timeout = Duration::from_secs(a.op_timeout_secs);
        let ctx = Context::builder()
            .timeout(timeout)
            .open()
            .context("opening the device")?;
        let pd = ctx.alloc_pd()?;
        let mut cq = ctx.create_cq(64)?;
        let mut qp = pd.create_qp(&cq, &cq).sq_size(16).rq_size(16).build()?;
        let mr = pd.alloc_mr(MR_LEN, AccessFlags::ALL)?;
        say(format!("ready {} {}", qp.endpoint(), mr.remote()));
        let peer = lines
            .recv_timeout(Duration::from_secs(60))
            .context("no peer line")?;
        let f: Vec<&str> = peer.split_whitespace().collect();
        let [_, ep, remote] = f[..] else {
            bail!("expected `peer <endpoint> <remote>`, got {peer:?}");
        };
        let ep: QpEndpoint = ep.parse()?;
        let remote: RemoteMr = remote.parse()?;
        if a.side == Side::B {
            // B's receives are posted before it connects, so A's first SEND finds one.
            qp.post_recv(&[mr.slice(0..SLOT)], 0)?;
            qp.post_recv(&[mr.slice(SLOT..2 * SLOT)], 1)?;
        }
        qp.connect(&ep).context("connecting the good pair")?;
        say("connected");
        let r = match a.side {
            Side::A => drive(a, &ctx, &mut cq, &mut qp, &mr, remote, &lines),
            Side::B => answer(a, &mut cq, &mut qp, &mr, &lines),
        };
        match r {
            Ok(()) => Ok(true),
            Err(e) => {
                say(format!("error {e:#}"));
                Ok(false)
            }
        }
    }

    fn check(mr: &MemoryRegion, off: usize, seed: u64, len: usize, what: &str) -> Result<()> {
        let mut buf = vec![0u8; len];
        mr.read(off, &mut buf)?;
        if let Some(i) = (0..len).find(|&i| buf[i] != pattern(seed, i)) {
            bail!(
                "{what}: byte {i} of {len} is {:#04x}, expected {:#04x}",
                buf[i],
                pattern(seed, i)
            );
        }
        Ok(())
    }

    /// Waits until one completion of each opcode in `want` arrived (any order), all Success.
    fn expect(cq: &mut CompletionQueue, want: &[WcOpcode], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut left: Vec<WcOpcode> = want.to_vec();
        while !left.is_empty() {
            let w = next_wc(cq, deadline)
                .with_context(|| format!("waiting for {left:?} (hang guard {timeout:?})"))?;
            if !w.is_ok() {
                bail!(
                    "{:?} completed with {:?} (wr_id {})",
                    w.opcode,
                    w.status,
                    w.wr_id
                );
            }
            let Some(i) = left.iter().position(|o| *o == w.opcode) else {
                bail!("unexpected {:?} completion (wanted {left:?})", w.opcode);
            };
            left.swap_remove(i);
        }
        Ok(())
    }

    /// A's loop: SEND + echo, WRITE-with-immediate + ack, READ, a Stats request per round, a
    /// fresh channel every 2 s.
    fn drive(
        a: &GoodArgs,
        ctx: &Context,
        cq: &mut CompletionQueue,
        qp: &mut QueuePair,
        mr: &MemoryRegion,
        remote: RemoteMr,
        lines: &mpsc::Receiver<String>,
    ) -> Result<()> {
        let timeout = Duration::from_secs(a.op_timeout_secs);
        let pace = Duration::from_micros(a.pace_us);
        let mut ops: u64 = 0;
        let mut max_round = Duration::ZERO;
        let mut last_report = Instant::now();
        let mut last_probe = Instant::now();
        for round in 0u64.. {
            match lines.try_recv() {
                Ok(l) if l == "pause" => {
                    say("paused");
                    loop {
                        match lines.recv() {
                            Ok(l) if l == "resume" => break,
                            Ok(_) => {}
                            Err(_) => return Ok(()),
                        }
                    }
                }
                Ok(l) if l == "exit" => return Ok(()),
                Err(mpsc::TryRecvError::Disconnected) => return Ok(()),
                _ => {}
            }
            let start = Instant::now();
            let len = SIZES[(round % SIZES.len() as u64) as usize];

            // SEND, which B checks and echoes back.
            mr.write(0, &pattern_vec(round, len))?;
            qp.post_recv(&[mr.slice(SLOT..SLOT + len)], round)?;
            qp.post_send(&[mr.slice(0..len)], round)?;
            expect(cq, &[WcOpcode::Send, WcOpcode::Recv], timeout).context("SEND + echo")?;
            check(mr, SLOT, round, len, "echo of a SEND")?;
            ops += 2;

            // WRITE with immediate `round`, which B checks and acknowledges.
            let wseed = round + WRITE_SEED;
            mr.write(0, &pattern_vec(wseed, len))?;
            qp.post_recv(&[mr.slice(3 * SLOT..3 * SLOT + 8)], round)?;
            let target = remote.slice(2 * SLOT..2 * SLOT + len);
            qp.post_write_with_imm(&[mr.slice(0..len)], target, round as u32, round)?;
            expect(cq, &[WcOpcode::RdmaWrite, WcOpcode::Recv], timeout).context("WRITE + ack")?;
            let mut ack = [0u8; 8];
            mr.read(3 * SLOT, &mut ack)?;
            if u64::from_le_bytes(ack) != round {
                bail!(
                    "B acknowledged round {} for {round}",
                    u64::from_le_bytes(ack)
                );
            }
            ops += 1;

            // READ back what was written.
            qp.post_read(&[mr.slice(2 * SLOT..2 * SLOT + len)], target, round)?;
            expect(cq, &[WcOpcode::RdmaRead], timeout).context("READ")?;
            check(mr, 2 * SLOT, wseed, len, "READ of the WRITE target")?;
            ops += 1;

            // The control path answers (a stalled daemon shows here, not on the data path).
            ctx.stats().context("Stats request")?;

            if last_probe.elapsed() > Duration::from_secs(2) {
                probe(timeout, round).context("a fresh channel")?;
                ops += 1;
                last_probe = Instant::now();
            }
            max_round = max_round.max(start.elapsed());
            if last_report.elapsed() > Duration::from_millis(250) {
                say(format!("progress {ops} {}", max_round.as_micros()));
                max_round = Duration::ZERO;
                last_report = Instant::now();
            }
            if !pace.is_zero() {
                std::thread::sleep(pace);
            }
        }
        Ok(())
    }

    /// Opens a new channel, connects two QPs of it to each other, checks one SEND, closes.
    fn probe(timeout: Duration, seed: u64) -> Result<()> {
        let ctx = Context::builder().timeout(timeout).open()?;
        let pd = ctx.alloc_pd()?;
        let mut cq = ctx.create_cq(16)?;
        let mut q1 = pd.create_qp(&cq, &cq).sq_size(4).rq_size(4).build()?;
        let mut q2 = pd.create_qp(&cq, &cq).sq_size(4).rq_size(4).build()?;
        connect_pair(&mut q1, &mut q2)?;
        let mr = pd.alloc_mr(8192, AccessFlags::ALL)?;
        mr.write(0, &pattern_vec(seed, 4096))?;
        q2.post_recv(&[mr.slice(4096..8192)], 1)?;
        q1.post_send(&[mr.slice(0..4096)], 2)?;
        expect(&mut cq, &[WcOpcode::Send, WcOpcode::Recv], timeout)?;
        check(&mr, 4096, seed, 4096, "SEND on a fresh channel")
    }

    /// B's loop: check each SEND and echo it; check each WRITE and acknowledge it.
    fn answer(
        a: &GoodArgs,
        cq: &mut CompletionQueue,
        qp: &mut QueuePair,
        mr: &MemoryRegion,
        lines: &mpsc::Receiver<String>,
    ) -> Result<()> {
        let timeout = Duration::from_secs(a.op_timeout_secs);
        let mut sends: u64 = 0;
        let mut wc = [WorkCompletion::default(); 4];
        loop {
            match lines.try_recv() {
                Ok(l) if l == "exit" => return Ok(()),
                Err(mpsc::TryRecvError::Disconnected) => return Ok(()),
                _ => {}
            }
            let got: Vec<WorkCompletion> =
                cq.wait(&mut wc, Some(Duration::from_millis(200)))?.to_vec();
            for w in got {
                if !w.is_ok() {
                    bail!(
                        "{:?} completed with {:?} (wr_id {})",
                        w.opcode,
                        w.status,
                        w.wr_id
                    );
                }
                match w.opcode {
                    WcOpcode::Recv => {
                        let slot = w.wr_id as usize & 1;
                        let round = sends;
                        sends += 1;
                        let len = SIZES[(round % SIZES.len() as u64) as usize];
                        if w.byte_len as usize != len {
                            bail!(
                                "SEND of round {round}: {} bytes, expected {len}",
                                w.byte_len
                            );
                        }
                        check(mr, slot * SLOT, round, len, "a received SEND")?;
                        let off = slot * SLOT;
                        qp.post_send(&[mr.slice(off..off + len)], round)?;
                        expect(cq, &[WcOpcode::Send], timeout).context("echo")?;
                        qp.post_recv(&[mr.slice(off..off + SLOT)], w.wr_id)?;
                    }
                    WcOpcode::RecvRdmaWithImm => {
                        let round = u64::from(w.imm_data.unwrap_or(u32::MAX));
                        let len = SIZES[(round % SIZES.len() as u64) as usize];
                        check(mr, 2 * SLOT, round + WRITE_SEED, len, "the WRITE target")?;
                        mr.write(3 * SLOT, &round.to_le_bytes())?;
                        qp.post_send(&[mr.slice(3 * SLOT..3 * SLOT + 8)], round)?;
                        expect(cq, &[WcOpcode::Send], timeout).context("ack")?;
                        let slot = w.wr_id as usize & 1;
                        let off = slot * SLOT;
                        qp.post_recv(&[mr.slice(off..off + SLOT)], w.wr_id)?;
                    }
                    WcOpcode::Send => {}
                    other => bail!("unexpected {other:?} completion at B"),
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Side {
    A,
    B,
}

#[derive(Args, Clone)]
struct GoodArgs {
    #[arg(long, value_enum)]
    side: Side,
    #[arg(long, default_value_t = 10)]
    op_timeout_secs: u64,
    #[arg(long, default_value_t = 1000)]
    pace_us: u64,
}

// ---------------------------------------------------------------------------------------------
// The attacks.

#[derive(Args, Clone)]
struct AttackArgs {
    #[arg(value_enum)]
    kind: Kind,
    /// Other domains' QPs (`addr/qpn`), for the half-open connects.
    #[arg(long = "target")]
    targets: Vec<String>,
    /// Other domains' MRs (`addr:len:rkey`), for the foreign-rkey writes.
    #[arg(long = "foreign")]
    foreign: Vec<String>,
    /// Run one round and exit (status 0 unless a breach was seen).
    #[arg(long)]
    once: bool,
    /// Pause between rounds (ms).
    #[arg(long, default_value_t = 50)]
    pace_ms: u64,
    /// Size of one hogging WRITE (MiB).
    #[arg(long, default_value_t = 1024)]
    hog_mib: u64,
    /// How long a half-open Connect waits before the attacker gives up on it (ms).
    #[arg(long, default_value_t = 1000)]
    connect_wait_ms: u64,
    /// How long the RegMr/DeregMr flood runs before Closing (ms) ...
    #[arg(long, default_value_t = 400)]
    flood_ms: u64,
    /// ... and after it (ms), unless the backend stops answering first.
    #[arg(long, default_value_t = 4000)]
    flood_after_ms: u64,
    /// Threads registering and deregistering regions in the flood (as many again allocate
    /// and deallocate PDs).
    #[arg(long, default_value_t = 4)]
    flood_threads: usize,
    /// Size of the flood's regions (KiB; a size of 0 cycles through 4..64 KiB).
    #[arg(long, default_value_t = 0)]
    flood_mr_kib: usize,
}

mod attack {
    use super::*;

    /// What one round found that the attacker must not have been able to do.
    type Breaches = Vec<String>;

    pub fn run(a: &AttackArgs) -> Result<bool> {
        let lines = stdin_lines();
        let stop = Arc::new(AtomicBool::new(false));
        if !a.once {
            let stop = stop.clone();
            std::thread::spawn(move || {
                // "stop" or EOF: finish the round and leave.
                while let Ok(l) = lines.recv() {
                    if l == "stop" {
                        break;
                    }
                }
                stop.store(true, Ordering::SeqCst);
            });
        }
        let targets: Vec<QpEndpoint> = a
            .targets
            .iter()
            .map(|t| t.parse())
            .collect::<vrdma::Result<_>>()?;
        let foreign: Vec<RemoteMr> = a
            .foreign
            .iter()
            .map(|t| t.parse())
            .collect::<vrdma::Result<_>>()?;
        let mut rng = Rng::seeded();
        let mut hog: Option<Hog> = None;
        let mut clean = true;
        loop {
            let r = match a.kind {
                Kind::HalfOpenDestroy => half_open(a, &targets, &mut rng, false),
                Kind::HalfOpenClose => half_open(a, &targets, &mut rng, true),
                Kind::QuotaFill => quota_fill(),
                Kind::XsStorm => xs_storm(&mut rng),
                Kind::MrFloodClose => mr_flood_close(a),
                Kind::Hog => hog_round(a, &mut hog),
                Kind::Churn => churn(),
                Kind::StaleRkey => stale_rkey(&foreign, &mut rng),
                Kind::Garbage => garbage(&foreign, &mut rng),
                Kind::OpenClose => open_close(&mut rng),
            };
            match r {
                Ok((detail, breaches)) => {
                    for b in &breaches {
                        say(format!("breach {} {b}", a.kind.name()));
                        clean = false;
                    }
                    say(format!("done {} {detail}", a.kind.name()));
                }
                // An attacker's own failures are its own business: counted, not fatal.
                Err(e) => say(format!("failed {} {e:#}", a.kind.name())),
            }
            if a.once || stop.load(Ordering::SeqCst) {
                return Ok(clean);
            }
            std::thread::sleep(Duration::from_millis(a.pace_ms));
        }
    }

    /// Opens a channel whose control requests wait `timeout` (tries three times: a short
    /// timeout may also cut the handshake short on a loaded machine).
    fn open(timeout: Duration) -> Result<Context> {
        let mut tries = 0;
        loop {
            tries += 1;
            match Context::builder().timeout(timeout).mr_cache_pages(0).open() {
                Ok(c) => return Ok(c),
                Err(e @ vrdma::Error::Timeout { .. }) if tries < 3 => {
                    tracing::debug!("open: {e}; again");
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Asks the backend to close this process's channel (the frontend node's state Closing),
    /// behind the library's back.
    fn write_closing(ctx: &Context) -> Result<()> {
        let xs = Client::from_env()?;
        xs.write(
            &format!("{}/channel/{}/state", front_dev(ctx), ctx.channel()),
            b"5",
        )?;
        Ok(())
    }

    /// [1] Connect to someone else's QP, then destroy the own QP or close the channel while
    /// the backend still holds the half-open connection.
    fn half_open(
        a: &AttackArgs,
        targets: &[QpEndpoint],
        rng: &mut Rng,
        close: bool,
    ) -> Result<(String, Breaches)> {
        let Some(target) =
            (!targets.is_empty()).then(|| targets[rng.below(targets.len() as u64) as usize])
        else {
            bail!("no --target QP to connect to");
        };
        // Destroy: the Connect times out on our side (the backend keeps it half-open), then
        // the QP goes. Close: the channel is closed while the Connect is still waiting.
        let wait = Duration::from_millis(a.connect_wait_ms);
        let ctx = open(if close { 5 * wait } else { wait })?;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(8)?;
        let mut qp = pd.create_qp(&cq, &cq).sq_size(4).rq_size(4).build()?;
        if !close {
            let r = qp.connect(&target);
            drop(qp); // DestroyQp of the half-open QP
            drop((cq, pd, ctx));
            return match r {
                Ok(()) => Ok((
                    format!("connected to {target} (!)"),
                    vec![format!("a Connect to the foreign QP {target} completed")],
                )),
                Err(e) => Ok((format!("connect {target}: {e}; destroyed"), vec![])),
            };
        }
        let (r, closed) = std::thread::scope(|s| {
            let t = s.spawn(|| qp.connect(&target));
            std::thread::sleep(Duration::from_millis(100));
            let closed = write_closing(&ctx);
            (t.join(), closed)
        });
        let r = r.map_err(|_| anyhow!("connect thread panicked"))?;
        closed?;
        drop((qp, cq, pd, ctx));
        match r {
            Ok(()) => Ok((
                format!("connected to {target} (!)"),
                vec![format!("a Connect to the foreign QP {target} completed")],
            )),
            Err(e) => Ok((format!("connect {target}: {e}; closed"), vec![])),
        }
    }

    fn quota(ctx: &Context, r: Resource) -> Option<u64> {
        let xs = Client::from_env().ok()?;
        let back = xs
            .read_string(&format!("{}/backend", front_dev(ctx)))
            .ok()?;
        xs.read_string(&format!("{}/{}", back.trim(), r.quota_key()))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// [2] Takes everything the quotas allow, holds it, lets go.
    fn quota_fill() -> Result<(String, Breaches)> {
        let ctx = open(Duration::from_secs(10))?;
        let pd = ctx.alloc_pd()?;
        let mut breaches = Vec::new();
        // Regions of 64 MiB, then smaller ones down to one page when a big one is refused.
        let mut chunk: usize = 64 << 20;
        let mut mrs = Vec::new();
        let mut bytes = 0usize;
        let mr_stop = loop {
            match pd.alloc_mr(chunk, AccessFlags::ALL) {
                Ok(m) => {
                    bytes += chunk;
                    mrs.push(m);
                }
                Err(e) if chunk <= 4096 => break e.to_string(),
                Err(_) => chunk /= 4,
            }
            if mrs.len() > 8192 {
                break "no limit".into();
            }
        };
        say(format!(
            "step quota-fill {} MiB in {} MRs ({mr_stop})",
            bytes >> 20,
            mrs.len()
        ));
        let mut cqs = Vec::new();
        let cq_stop = loop {
            match ctx.create_cq(4) {
                Ok(c) => cqs.push(c),
                Err(e) => break e.to_string(),
            }
            if cqs.len() > 4096 {
                break "no limit".into();
            }
        };
        say(format!("step quota-fill {} CQs ({cq_stop})", cqs.len()));
        let mut qps = Vec::new();
        let qp_stop = match cqs.first() {
            None => "no CQ".to_string(),
            Some(cq) => loop {
                match pd.create_qp(cq, cq).sq_size(4).rq_size(4).build() {
                    Ok(q) => qps.push(q),
                    Err(e) => break e.to_string(),
                }
                if qps.len() > 4096 {
                    break "no limit".into();
                }
            },
        };
        let pages = (bytes / 4096) as u64;
        for (r, n) in [
            (Resource::MrPages, pages),
            (Resource::Cqs, cqs.len() as u64),
            (Resource::Qps, qps.len() as u64),
        ] {
            if let Some(q) = quota(&ctx, r) {
                if n > q {
                    breaches.push(format!(
                        "{n} {} with {} = {q}",
                        r.stats_key(),
                        r.quota_key()
                    ));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        let detail = format!(
            "{} MiB in {} MRs ({mr_stop}), {} CQs ({cq_stop}), {} QPs ({qp_stop})",
            bytes >> 20,
            mrs.len(),
            cqs.len(),
            qps.len()
        );
        drop(qps);
        drop(cqs);
        drop(mrs);
        Ok((detail, breaches))
    }

    /// [3] Writes to the own frontend nodes as fast as XenStore takes them (ghost channels,
    /// junk keys, garbage states), with AllocPd/DeallocPd in between.
    fn xs_storm(rng: &mut Rng) -> Result<(String, Breaches)> {
        let ctx = open(Duration::from_secs(10))?;
        let xs = Client::from_env()?;
        let dev = front_dev(&ctx);
        let mut writes = 0u32;
        let mut pds = 0u32;
        let garbage_states = ["0", "3", "4", "7", "-1", "banana", "99999999999", ""];
        for k in 0..300u32 {
            let ghost = 100 + rng.below(8);
            let key = match k % 5 {
                0 => format!("{dev}/channel/{ghost}/state"),
                1 => format!("{dev}/channel/{ghost}/ring-ref"),
                2 => format!("{dev}/channel/{ghost}/event-channel"),
                3 => format!("{dev}/junk-{}", rng.below(16)),
                _ => format!("{dev}/channel/{ghost}/version"),
            };
            let value = if k % 5 == 0 {
                garbage_states[rng.below(garbage_states.len() as u64) as usize].to_string()
            } else {
                rng.next().to_string()
            };
            if xs.write(&key, value.as_bytes()).is_ok() {
                writes += 1;
            }
            if k % 10 == 0 && ctx.alloc_pd().is_ok() {
                pds += 1;
            }
        }
        // Garbage into the live channel's state, last: the backend may close it.
        let own = format!("{dev}/channel/{}/state", ctx.channel());
        let _ = xs.write(&own, b"banana");
        let _ = xs.write(&own, b"4");
        for g in 100..108 {
            let _ = xs.rm(&format!("{dev}/channel/{g}"));
        }
        for j in 0..16 {
            let _ = xs.rm(&format!("{dev}/junk-{j}"));
        }
        Ok((format!("{writes} writes, {pds} AllocPd/DeallocPd"), vec![]))
    }

    /// [4] Several threads register and deregister MRs as fast as they can; the channel is
    /// closed (Closing) in the middle of it.
    fn mr_flood_close(a: &AttackArgs) -> Result<(String, Breaches)> {
        // Requests after the Closing may go unanswered: give up on them soon.
        let ctx = open(Duration::from_secs(2))?;
        let pd = ctx.alloc_pd()?;
        let flood = Duration::from_millis(a.flood_ms);
        let end = Instant::now() + flood + Duration::from_millis(a.flood_after_ms);
        let ops = std::sync::atomic::AtomicU64::new(0);
        let mut before = 0;
        let closed = std::thread::scope(|s| {
            // RegMr/DeregMr (each with grant calls in between), and AllocPd/DeallocPd beside
            // them so the control ring is never empty for long.
            let n = a.flood_threads;
            for t in 0..2 * n {
                let (ctx, pd, ops) = (&ctx, &pd, &ops);
                s.spawn(move || {
                    let mut k = t;
                    while Instant::now() < end {
                        k += 1;
                        let len = match a.flood_mr_kib {
                            0 => 4096 * (1 + k % 16),
                            kib => kib << 10,
                        };
                        let r = if t < n {
                            pd.alloc_mr(len, AccessFlags::ALL).map(drop)
                        } else {
                            ctx.alloc_pd().map(drop)
                        };
                        if r.is_err() {
                            break;
                        }
                        ops.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            std::thread::sleep(flood);
            before = ops.load(Ordering::Relaxed);
            say("closing");
            write_closing(&ctx)
        });
        closed?;
        let all = ops.into_inner();
        Ok((
            format!(
                "{before} RegMr/DeregMr + AllocPd/DeallocPd before Closing, {} after",
                all - before
            ),
            vec![],
        ))
    }

    /// A self-connected QP with one big region, kept between rounds (allocating it each
    /// round would measure the allocator, not the engine).
    struct Hog {
        _ctx: Context,
        cq: CompletionQueue,
        qp: QueuePair,
        src: MemoryRegion,
        dst: MemoryRegion,
        /// WRITEs per round: together they move `--hog-mib`.
        writes: u64,
    }

    /// The hog's region size: its two regions must fit the domain's share of mapped pages
    /// (with the backend's defaults `[host] mapped-pages` 131072 ÷ `guests` 8 = 16384 pages,
    /// 64 MiB for both), and one grant call shares at most 16384 pages on the simulated host.
    const HOG_REGION_MAX: u64 = 16 << 20;

    /// [5] Huge WRITEs from one own region to another: `--hog-mib` per round, posted back to
    /// back as WRITEs of [`HOG_REGION_MAX`] each.
    fn hog_round(a: &AttackArgs, state: &mut Option<Hog>) -> Result<(String, Breaches)> {
        if state.is_none() {
            let ctx = open(Duration::from_secs(10))?;
            let pd = ctx.alloc_pd()?;
            let total = (a.hog_mib << 20).max(4096);
            let len = total.min(HOG_REGION_MAX);
            let writes = total.div_ceil(len).min(256);
            let cq = ctx.create_cq(writes as u32 + 4)?;
            let mut qp = pd
                .create_qp(&cq, &cq)
                .sq_size((writes as u32).max(4))
                .rq_size(4)
                .build()?;
            let ep = qp.endpoint();
            qp.connect(&ep)?;
            let region = || {
                pd.alloc_mr(usize::try_from(len)?, AccessFlags::ALL)
                    .with_context(|| format!("a {} MiB region", len >> 20))
            };
            let (src, dst) = (region()?, region()?);
            // Real bytes: the source pages exist, so every WRITE copies them.
            src.fill(0, src.len(), 0x5a)?;
            *state = Some(Hog {
                _ctx: ctx,
                cq,
                qp,
                src,
                dst,
                writes,
            });
        }
        let h = state.as_mut().expect("set above");
        let start = Instant::now();
        let r = (|| -> Result<()> {
            let remote = h.dst.remote();
            for i in 0..h.writes {
                h.qp.post_write(&[h.src.slice(..)], remote, i)?;
            }
            let deadline = Instant::now() + Duration::from_secs(120);
            for _ in 0..h.writes {
                let w = next_wc(&mut h.cq, deadline)?;
                if !w.is_ok() {
                    bail!("hog WRITE: {:?}", w.status);
                }
            }
            Ok(())
        })();
        let detail = format!(
            "{} x {} MiB WRITEs back to back in {} ms",
            h.writes,
            h.src.len() >> 20,
            start.elapsed().as_millis()
        );
        if let Err(e) = r {
            *state = None;
            return Err(e);
        }
        Ok((detail, vec![]))
    }

    /// [6] Every object created and destroyed, fast.
    fn churn() -> Result<(String, Breaches)> {
        let ctx = open(Duration::from_secs(10))?;
        let mut n = 0;
        for _ in 0..20 {
            let pd = ctx.alloc_pd()?;
            let cq = ctx.create_cq(4)?;
            let qp = pd.create_qp(&cq, &cq).sq_size(4).rq_size(4).build()?;
            let mr = pd.alloc_mr(4096, AccessFlags::ALL)?;
            drop((mr, qp, cq, pd));
            n += 1;
        }
        Ok((format!("{n} x PD+CQ+QP+MR created and destroyed"), vec![]))
    }

    /// A QP connected to itself (every RDMA op targets the attacker's own PD), a CQ, a region.
    struct Loop {
        ctx: Context,
        pd: vrdma::ProtectionDomain,
        cq: CompletionQueue,
        qp: QueuePair,
        mr: MemoryRegion,
    }

    fn self_loop() -> Result<Loop> {
        let ctx = open(Duration::from_secs(10))?;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(16)?;
        let qp = new_qp(&pd, &cq)?;
        let mr = pd.alloc_mr(8192, AccessFlags::ALL)?;
        Ok(Loop {
            ctx,
            pd,
            cq,
            qp,
            mr,
        })
    }

    fn new_qp(pd: &vrdma::ProtectionDomain, cq: &CompletionQueue) -> Result<QueuePair> {
        let mut qp = pd.create_qp(cq, cq).sq_size(4).rq_size(4).build()?;
        let ep = qp.endpoint();
        qp.connect(&ep)?;
        Ok(qp)
    }

    impl Loop {
        /// Posts one WRITE (or READ) of 64 bytes to `remote`; whether it completed Success.
        /// A failed op leaves the QP in Error: the loop gets a fresh QP.
        fn try_op(&mut self, remote: RemoteMr, read: bool) -> Result<bool> {
            let s = [self.mr.slice(0..64)];
            if read {
                self.qp.post_read(&s, remote, 7)?;
            } else {
                self.qp.post_write(&s, remote, 7)?;
            }
            let w = next_wc(&mut self.cq, Instant::now() + Duration::from_secs(10))?;
            if !w.is_ok() {
                self.qp = new_qp(&self.pd, &self.cq)?;
            }
            Ok(w.is_ok())
        }
    }

    /// [7] WRITEs through stale rkeys (of the attacker's own deregistered regions) and through
    /// near-misses of foreign rkeys.
    fn stale_rkey(foreign: &[RemoteMr], rng: &mut Rng) -> Result<(String, Breaches)> {
        let mut l = self_loop()?;
        let mut breaches = Vec::new();
        let mut tries = 0;
        l.mr.write(0, &[0xa5; 64])?;
        for _ in 0..4 {
            let old = l.pd.alloc_mr(4096, AccessFlags::ALL)?;
            let stale = old.remote();
            drop(old); // DeregMr: the rkey must be dead now
            let new = l.pd.alloc_mr(4096, AccessFlags::ALL)?;
            tries += 1;
            if l.try_op(stale.slice(0..64), false)? {
                let mut b = [0u8; 64];
                new.read(0, &mut b)?;
                let hit = if b == [0xa5; 64] {
                    " and landed in the region registered after it"
                } else {
                    ""
                };
                breaches.push(format!(
                    "a WRITE through the stale rkey {:#x} succeeded{hit}",
                    stale.rkey
                ));
            }
        }
        for f in foreign {
            for delta in [0u32, 1, 2, 0x100, 0x1_0000, 0x100_0000] {
                let rkey = if delta == 0 {
                    f.rkey
                } else if rng.below(2) == 0 {
                    f.rkey.wrapping_add(delta)
                } else {
                    f.rkey.wrapping_sub(delta)
                };
                let target = RemoteMr {
                    rkey,
                    len: 64,
                    ..*f
                };
                tries += 1;
                if l.try_op(target, false)? {
                    breaches.push(format!(
                        "a WRITE to {target} (near the foreign rkey {:#x}) succeeded",
                        f.rkey
                    ));
                }
            }
        }
        drop(l.ctx);
        Ok((
            format!("{tries} WRITEs through dead or foreign rkeys"),
            breaches,
        ))
    }

    /// [8] Garbage WQEs, random rkeys and addresses, foreign rkeys, out-of-bounds access.
    fn garbage(foreign: &[RemoteMr], rng: &mut Rng) -> Result<(String, Breaches)> {
        let mut l = self_loop()?;
        let mut breaches = Vec::new();
        let mut n = 0;
        for _ in 0..4 {
            let slot: [u8; 64] = rng.bytes();
            l.qp.post_raw_send_slot(&slot)?;
            let w = next_wc(&mut l.cq, Instant::now() + Duration::from_secs(10));
            // A garbage WQE that happens to parse may succeed on the own loop: not a breach.
            if !matches!(w, Ok(w) if w.is_ok()) {
                l.qp = new_qp(&l.pd, &l.cq)?;
            }
            n += 1;
        }
        for _ in 0..4 {
            let r = RemoteMr {
                addr: rng.next(),
                len: 64,
                rkey: rng.next() as u32,
            };
            n += 1;
            if l.try_op(r, rng.below(2) == 0)? {
                breaches.push(format!("an RDMA op on the random {r} succeeded"));
            }
        }
        for f in foreign {
            for read in [false, true] {
                n += 1;
                if l.try_op(f.slice(0..64), read)? {
                    let op = if read { "READ" } else { "WRITE" };
                    breaches.push(format!(
                        "an RDMA {op} with the foreign rkey of {f} succeeded"
                    ));
                }
            }
        }
        let own = l.mr.remote();
        let beyond = RemoteMr {
            addr: own.addr + own.len - 16,
            len: 64,
            rkey: own.rkey,
        };
        n += 1;
        if l.try_op(beyond, false)? {
            breaches.push(format!(
                "a WRITE past the end of the own region ({beyond}) succeeded"
            ));
        }
        drop(l.ctx);
        Ok((format!("{n} garbage or foreign work requests"), breaches))
    }

    /// [12] Channels opened and closed fast, more at once than max-channels allows.
    fn open_close(rng: &mut Rng) -> Result<(String, Breaches)> {
        let mut held = Vec::new();
        let mut refused = 0;
        for _ in 0..(4 + rng.below(16)) {
            match open(Duration::from_secs(10)) {
                Ok(c) => held.push(c),
                Err(_) => refused += 1,
            }
        }
        let mut breaches = Vec::new();
        if let Some(c) = held.first() {
            if let Some(q) = quota(c, Resource::Channels) {
                if held.len() as u64 > q {
                    breaches.push(format!(
                        "{} channels open with max-channels = {q}",
                        held.len()
                    ));
                }
            }
        }
        let at_once = held.len();
        drop(held);
        let mut quick = 0;
        for _ in 0..8 {
            if open(Duration::from_secs(10)).is_ok() {
                quick += 1;
            }
        }
        Ok((
            format!("{at_once} open at once ({refused} refused), {quick}/8 quick reopen"),
            breaches,
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// The orchestrator.

mod soak {
    use super::*;

    /// Who sent a line.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Who {
        Good(Side, u64),
        Attacker(usize, u64),
    }

    struct Msg {
        who: Who,
        /// `None`: the process closed its stdout (exited).
        line: Option<String>,
    }

    /// A role process in a domain.
    struct Proc {
        child: Child,
        stdin: Option<ChildStdin>,
    }

    impl Proc {
        fn tell(&mut self, line: &str) {
            if let Some(s) = &mut self.stdin {
                let _ = writeln!(s, "{line}").and_then(|_| s.flush());
            }
        }
        fn kill(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        /// Asks it to stop; kills it after `grace`.
        fn stop(self, grace: Duration) {
            stop_all(vec![self], grace.as_secs());
        }
    }

    /// Asks every process to stop (they finish their round), kills those still there after
    /// `grace_secs`.
    fn stop_all(mut procs: Vec<Proc>, grace_secs: u64) {
        for p in &mut procs {
            p.tell("stop");
            p.tell("exit");
            p.stdin = None;
        }
        let end = Instant::now() + Duration::from_secs(grace_secs);
        while Instant::now() < end {
            procs.retain_mut(|p| !matches!(p.child.try_wait(), Ok(Some(_))));
            if procs.is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for p in &mut procs {
            p.kill();
        }
    }

    impl Drop for Proc {
        fn drop(&mut self) {
            if let Ok(None) = self.child.try_wait() {
                self.kill();
            }
        }
    }

    /// The simulated host, the backend process, the domains.
    struct World {
        host: SimHost,
        dom0: Client,
        backend: Child,
        exe: PathBuf,
        logs: PathBuf,
        tx: mpsc::Sender<Msg>,
    }

    impl World {
        fn spawn(&self, domid: DomId, who: Who, args: &[String], log: &str) -> Result<Proc> {
            let log = File::options()
                .create(true)
                .append(true)
                .open(self.logs.join(log))?;
            let mut child = Command::new(&self.exe)
                .args(args)
                .env(ENV_SIM_DIR, self.host.dir())
                .env(ENV_SIM_DOMID, domid.0.to_string())
                .env(
                    "XENSTORED_PATH",
                    sock::xenstore_socket(self.host.dir(), domid.0),
                )
                .env("RUST_LOG", "warn")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::from(log))
                .spawn()
                .with_context(|| format!("starting {} in domain {}", self.exe.display(), domid))?;
            let stdout = child.stdout.take().expect("piped");
            let tx = self.tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx
                        .send(Msg {
                            who,
                            line: Some(line),
                        })
                        .is_err()
                    {
                        return;
                    }
                }
                let _ = tx.send(Msg { who, line: None });
            });
            let stdin = child.stdin.take();
            Ok(Proc { child, stdin })
        }

        fn backend_alive(&mut self) -> bool {
            matches!(self.backend.try_wait(), Ok(None))
        }
    }

    impl Drop for World {
        fn drop(&mut self) {
            let _ = self.backend.kill();
            let _ = self.backend.wait();
        }
    }

    /// Finds the backend binary, building it when it is not there.
    fn backend_bin(args: &SoakArgs) -> Result<PathBuf> {
        if let Some(p) = &args.backend {
            return Ok(p.clone());
        }
        if let Some(p) = std::env::var_os("VRDMA_BACKEND_BIN") {
            return Ok(p.into());
        }
        let exe = std::env::current_exe()?;
        let dir = exe.parent().context("exe dir")?;
        let dir = if dir.ends_with("deps") {
            dir.parent().context("profile dir")?
        } else {
            dir
        };
        let p = dir.join("vrdma-backend");
        if p.exists() {
            return Ok(p);
        }
        eprintln!("vrdma-soak: {} is missing; building it", p.display());
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args([
            "build",
            "-p",
            "vrdma-backend",
            "--bin",
            "vrdma-backend",
        ]);
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        let st = cmd.status().context("running cargo build")?;
        if !st.success() || !p.exists() {
            bail!(
                "could not build {} (try `cargo build --release -p vrdma-backend`, or pass \
                 --backend)",
                p.display()
            );
        }
        Ok(p)
    }

    /// What the machine and the backend hold, at one moment.
    #[derive(Debug, Clone, Default)]
    struct Snapshot {
        rss_kib: u64,
        fds: u64,
        /// dom0's grants (pages the backend granted to guests) and mappings (guest pages it
        /// mapped).
        dom0_grants: u32,
        dom0_mappings: u32,
        dom0_ports: u32,
        /// Grants and mappings held by the attacker domains.
        attacker_grants: u32,
        attacker_mappings: u32,
        /// The backend's resource counters (`stats/<resource>`) summed over attacker domains.
        attacker_held: u64,
        /// The non-zero ones, as `domain <d>: <resource>=<n>`.
        attacker_leftovers: Vec<String>,
    }

    fn snapshot(w: &World, attackers: &[DomId]) -> Snapshot {
        let pid = w.backend.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let rss_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.count() as u64)
            .unwrap_or(0);
        let mut s = Snapshot {
            rss_kib,
            fds,
            ..Snapshot::default()
        };
        for d in w.host.list_domains() {
            if d.domid == 0 {
                s.dom0_grants = d.grants;
                s.dom0_mappings = d.mappings;
                s.dom0_ports = d.ports;
            } else if attackers.contains(&DomId(d.domid)) {
                s.attacker_grants += d.grants;
                s.attacker_mappings += d.mappings;
            }
        }
        let keys: Vec<&str> = Resource::ALL.iter().map(|r| r.stats_key()).collect();
        for d in attackers {
            let dir = format!("/local/domain/0/backend/vrdma/{}/0/stats", d.0);
            for k in &keys {
                if let Ok(v) = w.dom0.read_string(&format!("{dir}/{k}")) {
                    let n = v.trim().parse::<u64>().unwrap_or(0);
                    s.attacker_held += n;
                    if n > 0 {
                        s.attacker_leftovers
                            .push(format!("domain {}: {k}={n}", d.0));
                    }
                }
            }
        }
        s
    }

    /// Per attack kind: what the attackers did and what the good guest saw meanwhile.
    #[derive(Default)]
    struct Tally {
        rounds: u64,
        failed_rounds: u64,
        kills: u64,
        breaches: Vec<String>,
        good_ops: u64,
        good_errors: Vec<String>,
        max_round_us: u64,
        seconds: f64,
        last_detail: String,
        first_failure: Option<String>,
    }

    /// The good pair and what it was told about itself.
    struct Pair {
        a: Proc,
        b: Proc,
        gen: u64,
        targets: Vec<String>,
        foreign: Vec<String>,
    }

    fn wait_line(
        rx: &mpsc::Receiver<Msg>,
        pending: &mut Vec<Msg>,
        who: Who,
        prefix: &str,
        timeout: Duration,
    ) -> Result<String> {
        let end = Instant::now() + timeout;
        // What arrived while we waited for someone else comes first.
        let mut early: std::collections::VecDeque<Msg> = std::collections::VecDeque::new();
        let mut i = 0;
        while i < pending.len() {
            if pending[i].who == who {
                early.push_back(pending.remove(i));
            } else {
                i += 1;
            }
        }
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let m = match early.pop_front() {
                Some(m) => m,
                None => rx
                    .recv_timeout(left)
                    .map_err(|_| anyhow!("{who:?} did not say {prefix:?} within {timeout:?}"))?,
            };
            if m.who != who {
                pending.push(m);
                continue;
            }
            match m.line {
                None => bail!("{who:?} exited before saying {prefix:?}"),
                Some(l) => {
                    if let Some(rest) = l.strip_prefix(prefix) {
                        return Ok(rest.trim().to_string());
                    }
                    if let Some(e) = l.strip_prefix("error") {
                        bail!("{who:?}: {}", e.trim());
                    }
                }
            }
        }
    }

    fn start_pair(
        w: &World,
        args: &SoakArgs,
        doms: (DomId, DomId),
        gen: u64,
        rx: &mpsc::Receiver<Msg>,
        pending: &mut Vec<Msg>,
    ) -> Result<Pair> {
        let common = |side: &str| -> Vec<String> {
            vec![
                "good".into(),
                "--side".into(),
                side.into(),
                "--op-timeout-secs".into(),
                args.op_timeout_secs.to_string(),
                "--pace-us".into(),
                args.good_pace_us.to_string(),
            ]
        };
        let (wa, wb) = (Who::Good(Side::A, gen), Who::Good(Side::B, gen));
        let mut b = w.spawn(doms.1, wb, &common("b"), "good-b.log")?;
        let mut a = w.spawn(doms.0, wa, &common("a"), "good-a.log")?;
        let t = Duration::from_secs(args.op_timeout_secs * 3);
        let ra = wait_line(rx, pending, wa, "ready", t)?;
        let rb = wait_line(rx, pending, wb, "ready", t)?;
        a.tell(&format!("peer {rb}"));
        b.tell(&format!("peer {ra}"));
        wait_line(rx, pending, wa, "connected", t)?;
        wait_line(rx, pending, wb, "connected", t)?;
        let (ea, ma) = ra.split_once(' ').context("ready line")?;
        let (eb, mb) = rb.split_once(' ').context("ready line")?;
        Ok(Pair {
            a,
            b,
            gen,
            targets: vec![ea.into(), eb.into()],
            foreign: vec![ma.into(), mb.into()],
        })
    }

    fn attacker_args(
        args: &SoakArgs,
        kind: Kind,
        pair: Option<&Pair>,
        hog_mib: u64,
    ) -> Vec<String> {
        let mut v = vec![
            "attack".to_string(),
            kind.name().to_string(),
            "--pace-ms".into(),
            args.pace_ms.to_string(),
            "--hog-mib".into(),
            hog_mib.to_string(),
        ];
        if let Some(p) = pair {
            for t in &p.targets {
                v.push("--target".into());
                v.push(t.clone());
            }
            for f in &p.foreign {
                v.push("--foreign".into());
                v.push(f.clone());
            }
        }
        v
    }

    /// The hog size the machine can afford: every attacker may hold one region of it.
    fn hog_mib(args: &SoakArgs) -> u64 {
        let avail_mib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemAvailable:"))
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            })
            .map(|kib| kib / 1024)
            .unwrap_or(4096);
        let cap = (avail_mib / (4 * args.attackers.max(1) as u64)).max(16);
        if args.hog_mib > cap {
            println!(
                "vrdma-soak: hog WRITEs of {cap} MiB instead of {} MiB ({avail_mib} MiB available)",
                args.hog_mib
            );
            cap
        } else {
            args.hog_mib
        }
    }

    pub fn run(args: &SoakArgs) -> Result<bool> {
        let mut secs = args.minutes * 60.0 + args.seconds;
        if secs <= 0.0 {
            secs = 60.0;
        }
        let duration = Duration::from_secs_f64(secs);
        let kinds: Vec<Kind> = if args.kinds.is_empty() {
            Kind::ALL.to_vec()
        } else {
            args.kinds.clone()
        };
        let hog = hog_mib(args);
        let backend = backend_bin(args)?;
        let tmp = tempfile::Builder::new()
            .prefix("vrdma-soak-")
            .tempdir_in("/tmp")
            .context("a directory for the simulated host")?;
        let logs = match &args.log_dir {
            Some(d) => {
                std::fs::create_dir_all(d)?;
                d.clone()
            }
            None => tmp.path().join("logs"),
        };
        std::fs::create_dir_all(&logs)?;
        let host = SimHost::start(SimHostConfig::new(tmp.path().join("host")))
            .context("starting the simulated host")?;
        let dom0 = Client::connect(sock::xenstore_socket(host.dir(), 0))?;
        let config = tmp.path().join("backend.toml");
        std::fs::write(
            &config,
            format!(
                "engine-threads = {}\nlog-level = \"warn\"\n",
                args.engine_threads
            ),
        )?;
        let backend_log = File::create(logs.join("backend.log"))?;
        let backend_child = Command::new(&backend)
            .arg("--config")
            .arg(&config)
            .env(ENV_SIM_DIR, host.dir())
            .env(ENV_SIM_DOMID, "0")
            .env("XENSTORED_PATH", sock::xenstore_socket(host.dir(), 0))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(backend_log))
            .spawn()
            .with_context(|| format!("starting {}", backend.display()))?;
        let (tx, rx) = mpsc::channel();
        let mut w = World {
            host,
            dom0,
            backend: backend_child,
            exe: std::env::current_exe()?,
            logs: logs.clone(),
            tx,
        };
        println!(
            "vrdma-soak: {:.0} s, {} attackers, kinds {}, phases of {} s, hog {} MiB; backend \
             pid {}; logs in {}",
            secs,
            args.attackers,
            kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(","),
            args.phase_secs,
            hog,
            w.backend.id(),
            logs.display()
        );

        // Domains: the good pair with default quotas, the attackers with the backend's
        // defaults too (what any guest gets), so "as much as the quotas allow" is real.
        // An attacker's grant table holds its whole MR-page quota (plus directory pages and
        // queues): the backend's quota, not the platform, is what stops it.
        let attacker_grants = Quotas::default().max_mr_pages + 65_536;
        let ga = w.host.create_domain(Some("good-a"), None)?;
        let gb = w.host.create_domain(Some("good-b"), None)?;
        let attackers: Vec<DomId> = (0..args.attackers)
            .map(|i| {
                w.host
                    .create_domain(Some(&format!("attacker-{i}")), Some(attacker_grants))
            })
            .collect::<xen_platform::Result<_>>()?;
        for d in [ga, gb].iter().chain(&attackers) {
            attach_device(&w.dom0, u32::from(d.0), 0, 0, &Quotas::default())
                .with_context(|| format!("attaching a device to domain {d}"))?;
        }

        let mut pending: Vec<Msg> = Vec::new();
        let mut gen = 0u64;
        let mut pair = start_pair(&w, args, (ga, gb), gen, &rx, &mut pending)
            .context("starting the good pair")?;
        let paused_pair =
            |pair: &mut Pair, rx: &mpsc::Receiver<Msg>, pending: &mut Vec<Msg>| -> Result<()> {
                pair.a.tell("pause");
                wait_line(
                    rx,
                    pending,
                    Who::Good(Side::A, pair.gen),
                    "paused",
                    Duration::from_secs(args.op_timeout_secs * 2),
                )
                .map(|_| ())
            };
        // Let the pair warm up (first rounds, first probe) before the baseline.
        std::thread::sleep(Duration::from_secs(3));
        paused_pair(&mut pair, &rx, &mut pending).context("pausing the good pair")?;
        std::thread::sleep(Duration::from_millis(500));
        let base = snapshot(&w, &attackers);
        pair.a.tell("resume");

        let mut tallies: BTreeMap<Kind, Tally> = BTreeMap::new();
        let mut rng = Rng::seeded();
        let mut good_ops_done = 0u64; // of finished pair generations
        let mut good_ops_now = 0u64; // of the running generation
        let mut restart_pair = false;
        let mut backend_died = false;
        let start = Instant::now();
        let phase = Duration::from_secs_f64(args.phase_secs.max(0.5));
        let mut phase_idx = 0usize;
        let mut phase_start = Instant::now();
        let mut kind = kinds[0];
        let mut agen = vec![0u64; attackers.len()];
        let spawn_attacker = |w: &World, i: usize, g: u64, kind: Kind, pair: &Pair| {
            w.spawn(
                attackers[i],
                Who::Attacker(i, g),
                &attacker_args(args, kind, Some(pair), hog),
                &format!("attacker-{i}.log"),
            )
        };
        let mut procs: Vec<Option<Proc>> = (0..attackers.len())
            .map(|i| spawn_attacker(&w, i, 0, kind, &pair).ok())
            .collect();
        let mean_kill = args.kill_every_ms;
        let mut next_kill = Instant::now() + Duration::from_millis(rng.below(2 * mean_kill + 1));
        let mut good_ops_phase_start = 0u64;
        let mut phase_max_round = 0u64;

        while start.elapsed() < duration {
            // Lines from everybody.
            let mut msgs: Vec<Msg> = std::mem::take(&mut pending);
            if let Ok(m) = rx.recv_timeout(Duration::from_millis(20)) {
                msgs.push(m);
            }
            msgs.extend(rx.try_iter());
            for m in msgs {
                match (m.who, m.line) {
                    (Who::Good(side, g), line) if g == pair.gen => match line {
                        Some(l) if l.starts_with("progress") => {
                            let f: Vec<u64> = l
                                .split_whitespace()
                                .skip(1)
                                .filter_map(|x| x.parse().ok())
                                .collect();
                            if let [ops, max_us] = f[..] {
                                good_ops_now = ops;
                                phase_max_round = phase_max_round.max(max_us);
                            }
                        }
                        // One error per incident: once a side failed, the other side's
                        // failure (its peer QP going away) is the same incident.
                        Some(l) if l.starts_with("error") => {
                            if !restart_pair {
                                let t = tallies.entry(kind).or_default();
                                t.good_errors.push(format!("{side:?}: {}", l[5..].trim()));
                                restart_pair = true;
                            }
                        }
                        Some(_) => {}
                        None => {
                            if !restart_pair {
                                let t = tallies.entry(kind).or_default();
                                t.good_errors.push(format!("{side:?}: the process exited"));
                                restart_pair = true;
                            }
                        }
                    },
                    (Who::Attacker(i, g), line) => {
                        let live = agen[i] == g;
                        match line {
                            Some(l) => {
                                let mut f = l.splitn(3, ' ');
                                let (verb, k) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
                                let rest = f.next().unwrap_or("").to_string();
                                let Some(k) = Kind::ALL.into_iter().find(|x| x.name() == k) else {
                                    continue;
                                };
                                let t = tallies.entry(k).or_default();
                                match verb {
                                    "done" => {
                                        t.rounds += 1;
                                        t.last_detail = rest;
                                    }
                                    "failed" => {
                                        t.failed_rounds += 1;
                                        t.last_detail = format!("failed: {rest}");
                                        t.first_failure.get_or_insert(rest);
                                    }
                                    "step" => t.last_detail = rest,
                                    "breach" => t.breaches.push(rest),
                                    _ => {}
                                }
                            }
                            None if live => {
                                // Exited on its own (or was stopped): start a fresh one.
                                agen[i] += 1;
                                procs[i] = spawn_attacker(&w, i, agen[i], kind, &pair).ok();
                            }
                            None => {}
                        }
                    }
                    _ => {} // a stale good generation
                }
            }

            if !w.backend_alive() {
                backend_died = true;
                tallies
                    .entry(kind)
                    .or_default()
                    .good_errors
                    .push("the backend process died".into());
                break;
            }

            if restart_pair {
                restart_pair = false;
                good_ops_done += good_ops_now;
                good_ops_now = 0;
                gen += 1;
                pair.a.kill();
                pair.b.kill();
                match start_pair(&w, args, (ga, gb), gen, &rx, &mut pending) {
                    Ok(p) => pair = p,
                    Err(e) => {
                        tallies
                            .entry(kind)
                            .or_default()
                            .good_errors
                            .push(format!("restarting the good pair: {e:#}"));
                        restart_pair = true;
                        std::thread::sleep(Duration::from_millis(500));
                    }
                }
            }

            // Random SIGKILL of an attacker, respawned at once.
            if mean_kill > 0 && Instant::now() >= next_kill && !procs.is_empty() {
                let i = rng.below(procs.len() as u64) as usize;
                if let Some(mut p) = procs[i].take() {
                    p.kill();
                    tallies.entry(kind).or_default().kills += 1;
                }
                agen[i] += 1;
                procs[i] = spawn_attacker(&w, i, agen[i], kind, &pair).ok();
                next_kill = Instant::now() + Duration::from_millis(rng.below(2 * mean_kill + 1));
            }

            // Next phase: every attacker stops and comes back with the next kind.
            if phase_start.elapsed() >= phase {
                let t = tallies.entry(kind).or_default();
                let ops = good_ops_done + good_ops_now;
                t.good_ops += ops - good_ops_phase_start;
                t.max_round_us = t.max_round_us.max(phase_max_round);
                t.seconds += phase_start.elapsed().as_secs_f64();
                good_ops_phase_start = ops;
                phase_max_round = 0;
                phase_idx += 1;
                kind = kinds[phase_idx % kinds.len()];
                phase_start = Instant::now();
                for g in agen.iter_mut() {
                    *g += 1;
                }
                stop_all(procs.iter_mut().filter_map(Option::take).collect(), 3);
                for (i, p) in procs.iter_mut().enumerate() {
                    *p = spawn_attacker(&w, i, agen[i], kind, &pair).ok();
                }
            }
        }
        {
            let t = tallies.entry(kind).or_default();
            let ops = good_ops_done + good_ops_now;
            t.good_ops += ops - good_ops_phase_start;
            t.max_round_us = t.max_round_us.max(phase_max_round);
            t.seconds += phase_start.elapsed().as_secs_f64();
        }
        let elapsed = start.elapsed();

        // The attackers go; half politely, half by SIGKILL.
        let mut polite = Vec::new();
        for (i, p) in procs.iter_mut().enumerate() {
            agen[i] += 1;
            if let Some(mut p) = p.take() {
                if i % 2 == 0 {
                    polite.push(p);
                } else {
                    p.kill();
                }
            }
        }
        stop_all(polite, 5);
        // Lines still in flight (last rounds, last progress).
        std::thread::sleep(Duration::from_millis(300));
        let in_flight: Vec<Msg> = pending.drain(..).chain(rx.try_iter()).collect();
        for m in in_flight {
            let Who::Good(side, g) = m.who else { continue };
            if g != pair.gen {
                continue;
            }
            match m.line {
                Some(l) if l.starts_with("progress") && side == Side::A => {
                    if let Some(ops) = l.split_whitespace().nth(1).and_then(|x| x.parse().ok()) {
                        good_ops_now = ops;
                    }
                }
                Some(l) if l.starts_with("error") && !restart_pair => {
                    let t = tallies.entry(kind).or_default();
                    t.good_errors.push(format!("{side:?}: {}", l[5..].trim()));
                    restart_pair = true;
                }
                None => restart_pair = true,
                _ => {}
            }
        }
        let total_ops = good_ops_done + good_ops_now;
        // A pair broken at the very end is started again, so the end counts compare like
        // with like.
        if restart_pair && !backend_died {
            pair.a.kill();
            pair.b.kill();
            for attempt in 1..=5 {
                gen += 1;
                match start_pair(&w, args, (ga, gb), gen, &rx, &mut pending) {
                    Ok(p) => {
                        pair = p;
                        break;
                    }
                    Err(e) => {
                        tallies.entry(kind).or_default().good_errors.push(format!(
                            "restarting the good pair at the end ({attempt}/5): {e:#}"
                        ));
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            }
        }

        // Back to baseline? Give reclaim time; the good pair is paused while we look.
        let settle_start = Instant::now();
        let mut end = snapshot(&w, &attackers);
        let paused = !backend_died && paused_pair(&mut pair, &rx, &mut pending).is_ok();
        let rss_tol_kib =
            (args.rss_tolerance_mib * 1024).max(base.rss_kib * args.rss_tolerance_pct / 100);
        let settled = |e: &Snapshot| {
            e.fds <= base.fds
                && e.dom0_grants == base.dom0_grants
                && e.dom0_mappings == base.dom0_mappings
                && e.dom0_ports == base.dom0_ports
                && e.attacker_grants == base.attacker_grants
                && e.attacker_mappings == base.attacker_mappings
                && e.attacker_held == 0
        };
        while !backend_died && settle_start.elapsed() < Duration::from_secs(args.settle_secs) {
            end = snapshot(&w, &attackers);
            if settled(&end) {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let backend_alive = w.backend_alive();
        let settle_time = settle_start.elapsed();
        if paused {
            pair.a.tell("resume");
        }

        // The report.
        let good_errors: usize = tallies.values().map(|t| t.good_errors.len()).sum();
        let breaches: usize = tallies.values().map(|t| t.breaches.len()).sum();
        println!();
        println!(
            "good guest: {total_ops} verified transfers in {:.0} s, {good_errors} errors, {} \
             restarts of the pair",
            elapsed.as_secs_f64(),
            gen
        );
        println!();
        println!(
            "{:<18} {:>6} {:>7} {:>6} {:>9} {:>8} {:>11} {:>9}  last round",
            "attack", "secs", "rounds", "failed", "kills", "good ops", "good errors", "max ms"
        );
        for k in &kinds {
            let t = tallies.entry(*k).or_default();
            println!(
                "{:<18} {:>6.0} {:>7} {:>6} {:>9} {:>8} {:>11} {:>9.1}  {}",
                k.name(),
                t.seconds,
                t.rounds,
                t.failed_rounds,
                t.kills,
                t.good_ops,
                t.good_errors.len(),
                t.max_round_us as f64 / 1000.0,
                t.last_detail.chars().take(70).collect::<String>()
            );
        }
        for (k, t) in &tallies {
            for e in t.good_errors.iter().take(3) {
                println!("  good guest during {}: {e}", k.name());
            }
            if t.good_errors.len() > 3 {
                println!(
                    "  ... and {} more during {}",
                    t.good_errors.len() - 3,
                    k.name()
                );
            }
            if let Some(f) = &t.first_failure {
                println!("  first failed round of {}: {f}", k.name());
            }
            for b in t.breaches.iter().take(3) {
                println!("  BREACH by {}: {b}", k.name());
            }
        }
        println!();
        println!("{:<34} {:>12} {:>12}", "backend and host", "start", "end");
        let rows: [(&str, u64, u64); 9] = [
            ("backend RSS (KiB)", base.rss_kib, end.rss_kib),
            ("backend open fds", base.fds, end.fds),
            (
                "dom0 grants (to guests)",
                base.dom0_grants.into(),
                end.dom0_grants.into(),
            ),
            (
                "dom0 mappings (guest pages)",
                base.dom0_mappings.into(),
                end.dom0_mappings.into(),
            ),
            (
                "dom0 event channels",
                base.dom0_ports.into(),
                end.dom0_ports.into(),
            ),
            (
                "attacker domains' grants",
                base.attacker_grants.into(),
                end.attacker_grants.into(),
            ),
            (
                "attacker domains' mappings",
                base.attacker_mappings.into(),
                end.attacker_mappings.into(),
            ),
            (
                "attackers' backend resources",
                base.attacker_held,
                end.attacker_held,
            ),
            ("RSS tolerance (KiB)", rss_tol_kib, rss_tol_kib),
        ];
        for (name, a, b) in rows {
            println!("{name:<34} {a:>12} {b:>12}");
        }
        println!(
            "(end counts read {:.1} s after the attackers went)",
            settle_time.as_secs_f64()
        );
        for l in &end.attacker_leftovers {
            println!("  still held by an attacker domain: {l}");
        }

        let mut ok = true;
        let mut fail = |why: String| {
            println!("FAIL: {why}");
            ok = false;
        };
        if good_errors > 0 {
            fail(format!("the good guest saw {good_errors} errors"));
        }
        if breaches > 0 {
            fail(format!("attackers got {breaches} things they must not"));
        }
        if backend_died || !backend_alive {
            fail("the backend process died".into());
        }
        // An attack whose every round failed was not run at all: say so rather than pass.
        for (k, t) in &tallies {
            if t.seconds >= 1.0 && t.rounds == 0 {
                fail(format!(
                    "attack {k:?} never completed a round ({} failed: {})",
                    t.failed_rounds,
                    t.first_failure.as_deref().unwrap_or("no detail")
                ));
            }
        }
        if !settled(&end) {
            fail(
                "descriptors, grants, mappings or attacker resources did not return to the start"
                    .into(),
            );
        }
        if end.rss_kib > base.rss_kib + rss_tol_kib {
            fail(format!(
                "backend RSS grew by {} KiB (tolerance {rss_tol_kib} KiB)",
                end.rss_kib - base.rss_kib
            ));
        }
        if ok {
            println!("PASS");
        } else {
            println!("logs kept in {}", logs.display());
            if args.log_dir.is_none() {
                // Keep the logs: the temporary directory would take them along.
                let _ = tmp.keep();
            }
        }
        pair.a.stop(Duration::from_secs(5));
        pair.b.stop(Duration::from_secs(5));
        drop(w);
        Ok(ok)
    }
}
