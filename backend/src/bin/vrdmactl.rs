//! `vrdmactl`: the toolstack side of vrdma. Attaches and detaches vrdma devices to guest
//! domains exactly as libxl attaches a PV device, lists devices and channels, and shows the
//! counters the backend publishes. Runs in dom0 against xenstored, or against a simulated
//! host (`--sim DIR` / `VRDMA_SIM`) as its dom0. See docs/operations.md.
//!
//! Guest-written text reaches the terminal escaped: the reports of `toolstack::inspect` are
//! escaped as they are read, and error messages are escaped here before they are printed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use vrdma_backend::escape::escape_str;
use vrdma_backend::resources::Resource;
use vrdma_backend::toolstack::inspect::{self, state_name, DeviceReport, DeviceStats};
use vrdma_backend::toolstack::{self, AttachRequest, ToolstackError};
use xen_platform::{DomId, Platform, PlatformKind};
use xenstore_proto::client::Client;

#[derive(Parser)]
#[command(
    version,
    about = "vrdma toolstack: attach, detach, list and inspect vrdma devices of Xen guests"
)]
struct Cli {
    /// Use the simulated Xen host serving DIR (as its dom0) instead of real Xen.
    #[arg(long, global = true, env = "VRDMA_SIM", value_name = "DIR")]
    sim: Option<PathBuf>,
    /// Log filter (RUST_LOG overrides it).
    #[arg(long, global = true, default_value = "warn")]
    log_level: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Attach a vrdma device to a domain and wait for the backend's InitWait.
    Attach(AttachArgs),
    /// Detach a vrdma device: ask the backend to close it, wait for Closed, remove the nodes.
    Detach(DetachArgs),
    /// List vrdma devices, their states and channels.
    List(ListArgs),
    /// Show the counters the backend publishes for each device.
    Stats(StatsArgs),
    /// List the RDMA devices rdma-core's libibverbs sees on this host (attributes, ports,
    /// GIDs); with --device, run a loopback self-test on it. Needs no XenStore.
    VerbsProbe(VerbsProbeArgs),
}

#[derive(Args)]
struct VerbsProbeArgs {
    /// Run the self-test on this device (e.g. rxe0): PD, MR, CQs, two RC QPs connected to
    /// each other, an RDMA WRITE and a SEND/RECV with the data checked.
    #[arg(long)]
    device: Option<String>,
    /// The port of the self-test.
    #[arg(long, default_value_t = 1)]
    port: u8,
    /// The GID index of the self-test (default: the first non-zero GID on RoCE, none on IB).
    #[arg(long)]
    gid_index: Option<i32>,
}

#[derive(Args)]
struct AttachArgs {
    /// The guest domain.
    domid: u32,
    /// Device id (the N of device/vrdma/N).
    #[arg(long, default_value_t = 0)]
    devid: u32,
    /// The domain running vrdma-backend.
    #[arg(long, default_value_t = 0)]
    backend_domid: u32,
    /// Seconds to wait for the backend's InitWait (libxl waits 10).
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    timeout: f64,
    /// Write the nodes and return without waiting (for a backend started later).
    #[arg(long)]
    no_wait: bool,
    #[command(flatten)]
    quotas: QuotaArgs,
}

/// Per-device quotas written to the backend node; those not given take the backend's
/// configured defaults.
#[derive(Args)]
struct QuotaArgs {
    /// Channels (processes with the device open) at once.
    #[arg(long)]
    max_channels: Option<u32>,
    /// Queue pairs.
    #[arg(long)]
    max_qps: Option<u32>,
    /// Completion queues.
    #[arg(long)]
    max_cqs: Option<u32>,
    /// Memory regions.
    #[arg(long)]
    max_mrs: Option<u32>,
    /// 4 KiB pages registered in all memory regions together.
    #[arg(long)]
    max_mr_pages: Option<u32>,
    /// Protection domains.
    #[arg(long)]
    max_pds: Option<u32>,
    /// 4 KiB pages the backend grants to the guest (doorbells, queues, CQs).
    #[arg(long)]
    max_granted_pages: Option<u32>,
}

impl QuotaArgs {
    fn to_list(&self) -> Vec<(Resource, u32)> {
        [
            (Resource::Channels, self.max_channels),
            (Resource::Pds, self.max_pds),
            (Resource::Mrs, self.max_mrs),
            (Resource::MrPages, self.max_mr_pages),
            (Resource::Cqs, self.max_cqs),
            (Resource::Qps, self.max_qps),
            (Resource::GrantedPages, self.max_granted_pages),
        ]
        .into_iter()
        .filter_map(|(r, v)| v.map(|v| (r, v)))
        .collect()
    }
}

#[derive(Args)]
struct DetachArgs {
    /// The guest domain (it may already be gone).
    domid: u32,
    /// Device id.
    #[arg(long, default_value_t = 0, conflicts_with = "all")]
    devid: u32,
    /// Every vrdma device of the domain.
    #[arg(long)]
    all: bool,
    /// The domain running vrdma-backend.
    #[arg(long, default_value_t = 0)]
    backend_domid: u32,
    /// Seconds to wait for the backend's Closed (libxl waits 10).
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    timeout: f64,
    /// Remove the nodes even if the backend does not answer Closed in time.
    #[arg(long)]
    force: bool,
}

#[derive(Args)]
struct ListArgs {
    /// Only this guest domain.
    domid: Option<u32>,
    /// The domain running vrdma-backend.
    #[arg(long, default_value_t = 0)]
    backend_domid: u32,
    /// JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct StatsArgs {
    /// Only this guest domain.
    domid: Option<u32>,
    /// Only this device id.
    #[arg(long)]
    devid: Option<u32>,
    /// The domain running vrdma-backend.
    #[arg(long, default_value_t = 0)]
    backend_domid: u32,
    /// JSON instead of tables.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cli.log_level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Errors can quote what a guest wrote (a state, a path it made): escaped.
            eprintln!("vrdmactl: {}", escape_str(&format!("{e:#}")));
            ExitCode::from(1)
        }
    }
}

/// XenStore as dom0: the simulated host's dom0 socket, or xenstored on real Xen.
fn connect(sim: Option<PathBuf>) -> Result<Client> {
    let kind = match sim {
        Some(dir) => PlatformKind::Sim {
            dir,
            domid: DomId::DOM0,
        },
        None => match xen_platform::detect().context("finding Xen")? {
            PlatformKind::Xen {
                control_domain: false,
            } => bail!(
                "this is not the control domain: run vrdmactl in dom0 (or use --sim DIR for a \
                 simulated host)"
            ),
            kind @ PlatformKind::Xen { .. } => kind,
            PlatformKind::Sim { dir, .. } => PlatformKind::Sim {
                dir,
                domid: DomId::DOM0,
            },
        },
    };
    let what = match &kind {
        PlatformKind::Sim { dir, .. } => format!("the simulated host at {}", dir.display()),
        PlatformKind::Xen { .. } => "xenstored".to_owned(),
    };
    let platform = Platform::open(kind).with_context(|| format!("opening {what}"))?;
    platform
        .xenstore()
        .with_context(|| format!("connecting to XenStore of {what}"))
}

fn seconds(s: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| anyhow::anyhow!("bad timeout {s}"))
}

fn run(cli: Cli) -> Result<()> {
    if let Cmd::VerbsProbe(a) = &cli.cmd {
        return verbs_probe(a);
    }
    let store = connect(cli.sim)?;
    match cli.cmd {
        Cmd::Attach(a) => attach(&store, a),
        Cmd::Detach(a) => detach(&store, a),
        Cmd::List(a) => list(&store, a),
        Cmd::Stats(a) => stats(&store, a),
        Cmd::VerbsProbe(_) => unreachable!("handled before connecting"),
    }
}

fn attach(store: &Client, a: AttachArgs) -> Result<()> {
    let timeout = seconds(a.timeout)?;
    let req = AttachRequest {
        frontend_domid: a.domid,
        backend_domid: a.backend_domid,
        devid: a.devid,
        quotas: a.quotas.to_list(),
    };
    let paths = toolstack::attach(store, &req).with_context(|| {
        format!(
            "cannot attach vrdma device {} to domain {}",
            a.devid, a.domid
        )
    })?;
    if a.no_wait {
        println!("attached {} (not waiting for the backend)", paths.backend);
        return Ok(());
    }
    match toolstack::wait_backend_ready(store, &paths, a.backend_domid, timeout) {
        Ok(state) => {
            println!("attached {} (backend {})", paths.backend, state);
            Ok(())
        }
        Err(e) => {
            // As libxl: a device whose backend never came is not left half-attached.
            let cleanup =
                toolstack::remove_device_nodes(store, &paths, a.domid, a.backend_domid, a.devid);
            let note = match cleanup {
                Ok(()) => "; the device nodes were removed (use --no-wait to attach before the \
                           backend starts)"
                    .to_owned(),
                Err(c) => format!("; removing the device nodes failed too: {c}"),
            };
            Err(anyhow::Error::new(e).context(format!(
                "attaching vrdma device {} to domain {} failed{note}",
                a.devid, a.domid
            )))
        }
    }
}

fn detach(store: &Client, a: DetachArgs) -> Result<()> {
    let timeout = seconds(a.timeout)?;
    let devids: Vec<u32> = if a.all {
        let ids = inspect::device_ids(store, a.backend_domid, Some(a.domid))?;
        if ids.is_empty() {
            if !store_exists(store, &format!("/local/domain/{}", a.domid))? {
                return Err(ToolstackError::UnknownDomain(a.domid).into());
            }
            println!("domain {} has no vrdma device", a.domid);
            return Ok(());
        }
        ids.into_iter().map(|(_, d)| d).collect()
    } else {
        vec![a.devid]
    };
    let mut failed = 0;
    for devid in devids {
        match toolstack::detach(store, a.domid, a.backend_domid, devid, timeout, a.force) {
            Ok(out) if out.closed => println!("detached {}", out.paths.backend),
            Ok(out) => println!(
                "removed {} (the backend did not answer Closed in time)",
                out.paths.backend
            ),
            Err(ToolstackError::NotAttached(path)) => {
                eprintln!(
                    "vrdmactl: domain {} has no vrdma device {devid} (no {path})",
                    a.domid
                );
                failed += 1;
            }
            Err(e) => {
                eprintln!(
                    "vrdmactl: cannot detach vrdma device {devid} of domain {}: {}",
                    a.domid,
                    escape_str(&e.to_string())
                );
                failed += 1;
            }
        }
    }
    match failed {
        0 => {}
        // The one device's reason is already printed above.
        1 if !a.all => return Err(anyhow::anyhow!("detach failed")),
        n => bail!("{n} devices not detached"),
    }
    Ok(())
}

fn store_exists(store: &Client, path: &str) -> Result<bool> {
    use xenstore_proto::client::NodeOps;
    Ok(NodeOps::exists(store, path)?)
}

fn list(store: &Client, a: ListArgs) -> Result<()> {
    let devices = inspect::list_devices(store, a.backend_domid, a.domid)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&devices)?);
        return Ok(());
    }
    if devices.is_empty() {
        println!("no vrdma devices");
        return Ok(());
    }
    print!("{}", device_table(&devices));
    Ok(())
}

fn device_table(devices: &[DeviceReport]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>5} {:>5} {:>7} {:<12} {:<12} {:>6} {:>8}  quotas",
        "domid", "devid", "backend", "be-state", "fe-state", "online", "channels"
    );
    for d in devices {
        let quotas: Vec<String> = d.quotas.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let fe_state = if d.domain_exists {
            state_name(d.frontend_state)
        } else {
            "(domain gone)".to_owned()
        };
        let _ = writeln!(
            out,
            "{:>5} {:>5} {:>7} {:<12} {:<12} {:>6} {:>8}  {}",
            d.domid,
            d.devid,
            d.backend_domid,
            state_name(d.backend_state),
            fe_state,
            match d.online {
                Some(true) => "1",
                Some(false) => "0",
                None => "-",
            },
            d.channels.len(),
            if quotas.is_empty() {
                "(backend defaults)".to_owned()
            } else {
                quotas.join(" ")
            }
        );
        for c in &d.channels {
            let _ = writeln!(
                out,
                "{:>11} channel {:<3} fe {:<12} be {:<12} pid {:<8} {}{}",
                "",
                c.channel,
                state_name(c.frontend_state),
                state_name(c.backend_state),
                c.pid.map_or("-".to_owned(), |p| p.to_string()),
                c.mode.as_deref().unwrap_or("bypass"),
                c.error
                    .as_deref()
                    .map_or(String::new(), |e| format!("  error: {e}")),
            );
        }
    }
    out
}

fn stats(store: &Client, a: StatsArgs) -> Result<()> {
    let mut ids = inspect::device_ids(store, a.backend_domid, a.domid)?;
    if let Some(devid) = a.devid {
        ids.retain(|&(_, d)| d == devid);
    }
    if ids.is_empty() {
        match a.domid {
            Some(d) if !store_exists(store, &format!("/local/domain/{d}"))? => {
                return Err(ToolstackError::UnknownDomain(d).into())
            }
            Some(d) => bail!("domain {d} has no vrdma device"),
            None if !a.json => {
                println!("no vrdma devices");
                return Ok(());
            }
            None => {}
        }
    }
    let all = ids
        .into_iter()
        .map(|(d, devid)| inspect::device_stats(store, a.backend_domid, d, devid))
        .collect::<Result<Vec<_>, _>>()?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    print!("{}", stats_table(&all));
    Ok(())
}

fn stats_table(all: &[DeviceStats]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for s in all {
        let _ = writeln!(out, "domain {} device {}", s.domid, s.devid);
        let counters = s.ordered_counters();
        if counters.is_empty() {
            let _ = writeln!(out, "  (no counters published yet)");
        }
        for (k, v) in counters {
            let _ = writeln!(out, "  {k:<14} {v:>14}");
        }
        for (group, members) in &s.groups {
            // Well-known columns first, then any others by name.
            const FIRST: [&str; 5] = ["state", "ops", "bytes", "errors", "recvs"];
            let present: std::collections::BTreeSet<&str> = members
                .values()
                .flat_map(|m| m.keys().map(String::as_str))
                .collect();
            let mut keys: Vec<&str> = FIRST
                .iter()
                .copied()
                .filter(|k| present.contains(k))
                .collect();
            keys.extend(present.iter().filter(|k| !FIRST.contains(k)));
            // Numeric ids in numeric order.
            let mut ids: Vec<&String> = members.keys().collect();
            ids.sort_by_key(|id| (id.parse::<u64>().unwrap_or(u64::MAX), id.as_str()));
            let _ = write!(out, "  {group:<8}");
            for k in &keys {
                let _ = write!(out, " {k:>14}");
            }
            let _ = writeln!(out);
            for id in ids {
                let m = &members[id];
                let _ = write!(out, "  {id:<8}");
                for k in &keys {
                    let _ = write!(
                        out,
                        " {:>14}",
                        m.get(*k).map_or("-".to_owned(), |v| v.to_string())
                    );
                }
                let _ = writeln!(out);
            }
        }
    }
    out
}

fn verbs_probe(a: &VerbsProbeArgs) -> Result<()> {
    use vrdma_backend::device::verbs::{probe, VerbsLib};
    let lib = VerbsLib::open().context("loading rdma-core's libibverbs")?;
    let (devs, why) = probe::list(&lib).context("listing RDMA devices")?;
    print!("{}", probe::render(&lib, &devs, why.as_deref()));
    if let Some(name) = &a.device {
        let ctx = lib
            .open_device(name)
            .with_context(|| format!("opening {name}"))?;
        let r = probe::self_test(&ctx, a.port, a.gid_index)
            .with_context(|| format!("self-test on {name} port {}", a.port))?;
        println!(
            "self-test {} port {} (gid index {}): QPs {:#x} <-> {:#x} connected; RDMA WRITE \
             {} bytes verified; SEND/RECV {} bytes verified: ok",
            r.device,
            r.port,
            r.gid_index
                .map_or("none (LID)".to_owned(), |i| i.to_string()),
            r.qpn_a,
            r.qpn_b,
            r.write_bytes,
            r.send_bytes
        );
    }
    Ok(())
}
