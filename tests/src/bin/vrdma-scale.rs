//! `vrdma-scale`: the scale figures of the targets table (docs/benchmarks.md "Scale"), measured on a simulated Xen host with the real
//! `vrdma-backend` running as its own process (so its memory, CPU time and context switches are
//! its own, read from `/proc/<pid>`).
//!
//! ```text
//! cargo build --release -p vrdma-backend -p vrdma-tests && target/release/vrdma-scale rate
//! ```
//!
//! - `rate`: aggregate message rate of 32 channels × 8 QPs ÷ one QP, in the same run.
//! - `memory`: backend memory per idle QP, from the backend's RSS and PSS before and after the
//!   QPs are created.
//! - `attach`: attach + connect time and backend CPU for 1, 16, 64 and 256 guest domains.
//! - `idle`: an idle backend's wake-ups per second, per thread.
//!
//! The guests (every channel of every simulated domain) are opened in this process with the
//! `vrdma` library; docs/benchmarks.md ("Scale") records the figures and what they mean.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};
use vrdma::{AccessFlags, CompletionQueue, Context, MemoryRegion, QueuePair, WorkCompletion};
use vrdma_tests::procstat;
use vrdma_tests::Lab;
use xen_platform::sim::sock;
use xen_platform::{DomId, Platform, PlatformKind};
use xenstore_proto::client::{Client, XenbusStore};

#[derive(Parser)]
#[command(
    about = "vrdma scale figures (message rate, memory per QP, attach cost, idle wake-ups) on a simulated Xen host"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Aggregate message rate of CHANNELS × QPS self-connected QPs ÷ one QP, same run.
    Rate {
        /// Channels (spread over `--domains` domains).
        #[arg(long, default_value_t = 32)]
        channels: usize,
        /// QPs per channel.
        #[arg(long, default_value_t = 8)]
        qps: usize,
        /// Guest domains the channels are spread over.
        #[arg(long, default_value_t = 4)]
        domains: usize,
        /// WRITEs in flight per QP.
        #[arg(long, default_value_t = 64)]
        depth: usize,
        /// Message size in bytes.
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// Seconds per phase (one QP, all QPs, one QP again).
        #[arg(long, default_value_t = 3.0)]
        secs: f64,
    },
    /// Backend memory per idle QP (RSS and PSS deltas of the backend process).
    Memory {
        #[arg(long, default_value_t = 32)]
        channels: usize,
        /// QPs per channel created in each of the two steps.
        #[arg(long, default_value_t = 8)]
        qps: usize,
        #[arg(long, default_value_t = 4)]
        domains: usize,
    },
    /// Attach + connect time and backend CPU for each number of guest domains.
    Attach {
        /// Comma-separated domain counts; each gets a fresh host and backend.
        #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
        domains: Vec<usize>,
    },
    /// Wake-ups per second of an idle backend serving connected guests, per thread.
    Idle {
        #[arg(long, default_value_t = 2)]
        domains: usize,
        /// Channels per domain, each with one self-connected QP.
        #[arg(long, default_value_t = 2)]
        channels: usize,
        /// Seconds counted.
        #[arg(long, default_value_t = 10.0)]
        secs: f64,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    println!("# {}", uptime());
    match cli.cmd {
        Cmd::Rate {
            channels,
            qps,
            domains,
            depth,
            size,
            secs,
        } => rate(channels, qps, domains, depth, size, secs),
        Cmd::Memory {
            channels,
            qps,
            domains,
        } => memory(channels, qps, domains),
        Cmd::Attach { domains } => {
            println!("| domains | attach (toolstack), ms | connect, ms total | connect, ms per domain (mean / last tenth) | backend CPU, ms | CPU per domain, ms | backend threads | backend RSS, MiB |");
            println!("|---|---|---|---|---|---|---|---|");
            for n in domains {
                attach(n)?;
            }
            Ok(())
        }
        Cmd::Idle {
            domains,
            channels,
            secs,
        } => idle(domains, channels, secs),
    }
}

/// The machine's load, recorded with every figure (`/proc/loadavg`).
fn uptime() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    format!("loadavg {} ({cpus} CPUs)", load.trim())
}

// ---------------------------------------------------------------------------------------------
// The lab: host, backend, guests.

/// The backend's configuration for these runs: quotas that let one domain hold the channels
/// and QPs asked for, and host page budgets split among that many guests.
fn lab(guests: usize, channels_per_domain: usize, qps_per_domain: usize) -> Result<Lab> {
    let config = format!(
        "log-level = \"warn\"\n[quotas]\nmax-channels = {}\nmax-qps = {}\nmax-cqs = {}\n[host]\nguests = {}\n",
        channels_per_domain.max(16),
        qps_per_domain.max(256),
        channels_per_domain.max(256),
        guests.max(8),
    );
    let lab = Lab::start_with_config(&config);
    wait_ready(&lab)?;
    Ok(lab)
}

/// The backend's pid.
fn pid(lab: &Lab) -> Result<u32> {
    lab.backend_pid().context("the backend is not running")
}

/// Waits until the daemon serves: both of its fixed watches have their forwarder thread.
fn wait_ready(lab: &Lab) -> Result<()> {
    let pid = pid(lab)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let watching = procstat::thread_switches(pid)
            .map(|t| t.values().filter(|t| t.name == "xs-watch").count())
            .unwrap_or(0);
        if watching >= 2 {
            // Let the first scan finish.
            std::thread::sleep(Duration::from_millis(300));
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the backend did not start watching XenStore within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One simulated guest domain, as this process sees it.
struct Domain {
    platform: Platform,
    store: Arc<dyn XenbusStore>,
}

impl Domain {
    /// Creates a domain, attaches device 0 (the backend's toolstack code) and connects to its
    /// hypercall and XenStore sockets.
    fn create(lab: &Lab, name: &str) -> Result<(DomId, Domain)> {
        let domid = lab.create_guest(name);
        lab.attach(domid, &[]);
        Ok((domid, Domain::connect(lab, domid)?))
    }

    fn connect(lab: &Lab, domid: DomId) -> Result<Domain> {
        let platform = Platform::open(PlatformKind::Sim {
            dir: lab.host.dir().to_path_buf(),
            domid,
        })
        .context("the domain's hypercall socket")?;
        let store: Arc<dyn XenbusStore> = Arc::new(
            Client::connect(sock::xenstore_socket(lab.host.dir(), domid.0))
                .context("the domain's XenStore socket")?,
        );
        Ok(Domain { platform, store })
    }

    /// Opens one more channel of device 0 (bypass mode).
    fn open(&self) -> Result<Context> {
        Context::builder()
            .platform(self.platform.clone())
            .store(self.store.clone())
            .mode(vrdma::Mode::Bypass)
            .timeout(Duration::from_secs(60))
            .open()
            .context("open a channel")
    }
}

/// A channel with one CQ and one region shared by its QPs, each QP connected to itself.
struct Chan {
    // Declared in teardown order: QPs before the CQ, region and PD they use.
    qps: Vec<QueuePair>,
    cq: CompletionQueue,
    mr: MemoryRegion,
    pd: vrdma::ProtectionDomain,
    _ctx: Context,
}

impl Chan {
    fn new(ctx: Context, cq_size: u32) -> Result<Chan> {
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(cq_size)?;
        let mr = pd.alloc_mr(64 * 1024, AccessFlags::ALL)?;
        Ok(Chan {
            qps: Vec::new(),
            cq,
            mr,
            pd,
            _ctx: ctx,
        })
    }

    /// Adds `n` QPs of `depth` send slots (8 receive slots), each connected to itself.
    fn add_qps(&mut self, n: usize, depth: u32) -> Result<()> {
        for _ in 0..n {
            let mut qp = self
                .pd
                .create_qp(&self.cq, &self.cq)
                .sq_size(depth)
                .rq_size(8)
                .build()?;
            let ep = qp.endpoint();
            qp.connect(&ep)?;
            self.qps.push(qp);
        }
        Ok(())
    }
}

/// Opens `channels` channels spread over `domains` new domains.
fn open_channels(
    lab: &Lab,
    domains: usize,
    channels: usize,
) -> Result<(Vec<Domain>, Vec<Context>)> {
    let doms: Vec<Domain> = (0..domains)
        .map(|i| Domain::create(lab, &format!("guest{i}")).map(|(_, d)| d))
        .collect::<Result<_>>()?;
    let ctxs = (0..channels)
        .map(|c| doms[c % domains].open())
        .collect::<Result<_>>()?;
    Ok((doms, ctxs))
}

// ---------------------------------------------------------------------------------------------
// rate

fn rate(
    channels: usize,
    qps: usize,
    domains: usize,
    depth: usize,
    size: usize,
    secs: f64,
) -> Result<()> {
    if size > 64 * 1024 / depth.max(1) || depth == 0 || channels == 0 || qps == 0 {
        bail!("need channels, qps, depth ≥ 1 and size × depth ≤ 64 KiB");
    }
    let lab = lab(
        domains,
        channels.div_ceil(domains),
        channels.div_ceil(domains) * qps,
    )?;
    let (_doms, ctxs) = open_channels(&lab, domains, channels)?;
    let cq_size = (qps * depth) as u32;
    let mut chans: Vec<Chan> = ctxs
        .into_iter()
        .map(|c| Chan::new(c, cq_size))
        .collect::<Result<_>>()?;
    for ch in &mut chans {
        ch.add_qps(qps, depth as u32)?;
    }
    let total = channels * qps;
    let phase = Duration::from_secs_f64(secs);
    println!(
        "# {channels} channels × {qps} QPs = {total} QPs over {domains} domains; RDMA WRITE {size} B \
         to the QP's own region, {depth} in flight per QP, every WR signaled; one driver thread \
         polls all CQs, the backend has 1 engine thread (2 threads spin on the 2 CPUs)"
    );
    let pid = pid(&lab)?;
    let hz = procstat::clock_ticks() as f64;
    // Messages per second, and the backend's CPU time per message (ns) over the whole phase.
    let measure = |chans: &mut [Chan], per_channel: usize| -> Result<(f64, f64)> {
        let c0 = procstat::cpu_ticks(pid)?;
        let (rate, msgs) = drive(chans, per_channel, depth, size, phase)?;
        let cpu = (procstat::cpu_ticks(pid)? - c0) as f64 / hz;
        Ok((rate, cpu * 1e9 / msgs.max(1) as f64))
    };
    let (one_a, cpu_a) = measure(&mut chans[..1], 1)?;
    let (all, cpu_all) = measure(&mut chans, qps)?;
    let (one_b, cpu_b) = measure(&mut chans[..1], 1)?;
    let one = (one_a + one_b) / 2.0;
    println!("| phase | active QPs | messages/s | backend CPU per message, ns |");
    println!("|---|---|---|---|");
    println!("| one QP (before) | 1 | {one_a:.0} | {cpu_a:.0} |");
    println!("| all QPs | {total} | {all:.0} | {cpu_all:.0} |");
    println!("| one QP (after) | 1 | {one_b:.0} | {cpu_b:.0} |");
    println!(
        "aggregate ÷ one QP = {all:.0} ÷ {one:.0} = {:.3} (target ≥ 0.9)",
        all / one
    );
    Ok(())
}

/// Keeps `depth` WRITEs in flight on the first `per_channel` QPs of every channel in `chans`
/// for `phase` after a warm-up of a tenth of it; the completions per second, and all the
/// completions of the phase (warm-up and drain included, for the CPU time per message).
fn drive(
    chans: &mut [Chan],
    per_channel: usize,
    depth: usize,
    size: usize,
    phase: Duration,
) -> Result<(f64, u64)> {
    let mut wc = [WorkCompletion::default(); 64];
    // Fill every active QP.
    for ch in chans.iter_mut() {
        let remote = ch.mr.remote();
        for (q, qp) in ch.qps.iter_mut().take(per_channel).enumerate() {
            for k in 0..depth {
                let off = k * size;
                qp.post_write(
                    &[ch.mr.slice(off..off + size)],
                    remote.slice(off..off + size),
                    (q * depth + k) as u64,
                )?;
            }
        }
    }
    let warm = phase / 10;
    let start = Instant::now();
    let mut counted_from: Option<Instant> = None;
    let mut done = 0u64;
    let mut all = 0u64;
    let end = start + warm + phase;
    let mut outstanding = chans.len() * per_channel * depth;
    loop {
        let now = Instant::now();
        let stop = now >= end;
        if counted_from.is_none() && now >= start + warm {
            counted_from = Some(now);
            done = 0;
        }
        if stop && outstanding == 0 {
            break;
        }
        if stop && now > end + Duration::from_secs(30) {
            bail!("{outstanding} WRITEs did not complete within 30 s");
        }
        for ch in chans.iter_mut() {
            let remote = ch.mr.remote();
            let got = ch.cq.poll(&mut wc)?;
            for w in got.iter() {
                if !w.is_ok() {
                    bail!("a WRITE completed with {:?}", w.status);
                }
                outstanding -= 1;
                all += 1;
                if !stop {
                    done += 1;
                    let id = w.wr_id as usize;
                    let (q, k) = (id / depth, id % depth);
                    let off = k * size;
                    ch.qps[q].post_write(
                        &[ch.mr.slice(off..off + size)],
                        remote.slice(off..off + size),
                        w.wr_id,
                    )?;
                    outstanding += 1;
                }
            }
        }
    }
    let from = counted_from.unwrap_or(start);
    let elapsed = end.saturating_duration_since(from).as_secs_f64();
    Ok((done as f64 / elapsed, all))
}

// ---------------------------------------------------------------------------------------------
// memory

fn memory(channels: usize, qps: usize, domains: usize) -> Result<()> {
    let per_dom = channels.div_ceil(domains);
    let lab = lab(domains, per_dom, per_dom * qps * 2)?;
    let pid = pid(&lab)?;
    let (_doms, ctxs) = open_channels(&lab, domains, channels)?;
    let mut chans: Vec<Chan> = ctxs
        .into_iter()
        .map(|c| Chan::new(c, 256))
        .collect::<Result<_>>()?;
    let settle = || std::thread::sleep(Duration::from_millis(500));
    settle();
    let m0 = procstat::memory(pid)?;
    let mut rows = vec![("channels open, no QP".to_owned(), 0usize, m0)];
    for step in 1..=2 {
        for ch in &mut chans {
            ch.add_qps(qps, 128)?;
        }
        settle();
        rows.push((
            format!("+{} idle QPs (step {step})", channels * qps),
            channels * qps * step,
            procstat::memory(pid)?,
        ));
    }
    println!(
        "# {channels} channels over {domains} domains, each with a PD, a CQ of 256 and a 64 KiB \
         region; each step adds {qps} QPs per channel (128 send + 8 receive slots, connected \
         to itself, never used)"
    );
    println!("| state | QPs | backend VmRSS, KiB | backend Pss, KiB | backend VmSize, KiB |");
    println!("|---|---|---|---|---|");
    for (what, n, m) in &rows {
        println!(
            "| {what} | {n} | {} | {} | {} |",
            m.rss_kib, m.pss_kib, m.size_kib
        );
    }
    for w in rows.windows(2) {
        let (n0, m0) = (w[0].1, w[0].2);
        let (n1, m1) = (w[1].1, w[1].2);
        let n = (n1 - n0) as f64;
        println!(
            "{} → {} QPs: {:.1} KiB RSS / {:.1} KiB PSS per idle QP (target ≤ 64 KiB); \
             {:.1} KiB of address space mapped per QP",
            n0,
            n1,
            (m1.rss_kib as f64 - m0.rss_kib as f64) / n,
            (m1.pss_kib as f64 - m0.pss_kib as f64) / n,
            (m1.size_kib as f64 - m0.size_kib as f64) / n,
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// attach

fn attach(n: usize) -> Result<()> {
    let lab = lab(n, 1, 1)?;
    let pid = pid(&lab)?;
    let hz = procstat::clock_ticks() as f64;
    let cpu0 = procstat::cpu_ticks(pid)?;
    let t0 = Instant::now();
    let mut doms = Vec::with_capacity(n);
    for i in 0..n {
        // The toolstack's part only: the guest side connects below.
        let domid = lab.create_guest(&format!("guest{i}"));
        lab.attach(domid, &[]);
        doms.push(domid);
    }
    let attached = t0.elapsed();
    let doms: Vec<Domain> = doms
        .into_iter()
        .map(|d| Domain::connect(&lab, d))
        .collect::<Result<_>>()?;
    let t1 = Instant::now();
    let mut each = Vec::with_capacity(n);
    let mut ctxs = Vec::with_capacity(n);
    for d in &doms {
        let t = Instant::now();
        ctxs.push(d.open()?);
        each.push(t.elapsed());
    }
    let connected = t1.elapsed();
    // The backend finishes its side (stats, watches) after the last Connected.
    std::thread::sleep(Duration::from_millis(500));
    let cpu = (procstat::cpu_ticks(pid)? - cpu0) as f64 / hz * 1e3;
    let threads = procstat::thread_switches(pid)?.len();
    let rss = procstat::memory(pid)?.rss_kib as f64 / 1024.0;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mean = each.iter().map(|d| ms(*d)).sum::<f64>() / n as f64;
    let tail = &each[n - n.div_ceil(10)..];
    let tail_mean = tail.iter().map(|d| ms(*d)).sum::<f64>() / tail.len() as f64;
    println!(
        "| {n} | {:.1} | {:.1} | {mean:.2} / {tail_mean:.2} | {cpu:.0} | {:.2} | {threads} | {rss:.1} |",
        ms(attached),
        ms(connected),
        cpu / n as f64,
    );
    drop(ctxs);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// idle

fn idle(domains: usize, channels: usize, secs: f64) -> Result<()> {
    let lab = lab(domains, channels, channels)?;
    let pid = pid(&lab)?;
    let (_doms, ctxs) = open_channels(&lab, domains, domains * channels)?;
    let mut chans: Vec<Chan> = ctxs
        .into_iter()
        .map(|c| Chan::new(c, 16))
        .collect::<Result<_>>()?;
    for ch in &mut chans {
        ch.add_qps(1, 4)?;
    }
    // Let the engine's spin, the stats publication and the pacing run out.
    std::thread::sleep(Duration::from_secs(3));
    let before = procstat::thread_switches(pid)?;
    let cpu0 = procstat::cpu_ticks(pid)?;
    std::thread::sleep(Duration::from_secs_f64(secs));
    let after = procstat::thread_switches(pid)?;
    let cpu = procstat::cpu_ticks(pid)? - cpu0;
    let d = procstat::switches_between(&before, &after);
    let total: u64 = d.iter().map(|(_, _, n)| n).sum();
    println!(
        "# idle backend: {domains} domains × {channels} channels, one connected QP each, nothing \
         posted; {secs} s counted after 3 s of quiet; {} threads before, {} after",
        before.len(),
        after.len()
    );
    println!("| thread | context switches | per second |");
    println!("|---|---|---|");
    let mut by_name: std::collections::BTreeMap<String, (usize, u64)> = Default::default();
    for (_, name, n) in &d {
        let e = by_name.entry(name.clone()).or_default();
        e.0 += 1;
        e.1 += n;
    }
    for (name, (count, n)) in &by_name {
        println!("| {name} (×{count}) | {n} | {:.2} |", *n as f64 / secs);
    }
    println!(
        "total: {total} wake-ups in {secs} s = {:.2}/s; backend CPU {} ticks",
        total as f64 / secs,
        cpu
    );
    Ok(())
}
