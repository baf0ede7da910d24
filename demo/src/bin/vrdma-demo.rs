//! `vrdma-demo`: the one-command tour. On a machine without Xen it starts an embedded
//! simulated Xen host and the vrdma backend (in this process), creates two guest domains,
//! attaches a vrdma device to each as the toolstack does, runs `vrdma-perf` server and client
//! in the two domains (this binary re-executed as `vrdma-demo __perf ...`), for latency and
//! bandwidth, bypass and mediated, with in-run baselines, prints the tables and a summary of
//! the speed-target ratios (the targets table of docs/benchmarks.md), then shuts everything
//! down (guests closed, domains destroyed, backend stopped, host sockets and directory removed).
//!
//! `cargo run --release --bin vrdma-demo` (add `-- --quick` for a few seconds' version;
//! `-- --apps`: Debian's unmodified verbs tools between the two guests instead, `apps.rs`).
//!
//! The default run does both parts, the intra-host tour and then the inter-host case
//! (`--hosts 1` or `--hosts 2`: one of them). The inter-host case (issue 12): two embedded
//! simulated hosts in this process,
//! host A with its backend at 127.0.0.2 and host B at 127.0.0.3, a guest domain on each, and
//! the inter-host rows of the targets table: `vrdma-perf --cm` between guest-a (client, host A)
//! and guest-b (server, host B) — the QPs connected through the two backends' connection
//! managers, the traffic iWARP over TCP from 127.0.0.2 to 127.0.0.3 — SEND 64 B latency and
//! RDMA WRITE 64 KiB and 1 MiB bandwidth, each right after the raw TCP baseline it is divided
//! by, between the same two addresses (`vrdma-perf tcp_pingpong` / `tcp_stream` in guest-a:
//! ping-pong 64 B, blocking and busy-polled; stream 64 KiB and 1 MiB), and the ratios against
//! the targets with the threads that spin.

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use vrdma_demo::lab::{step, Guest, Lab, Tuning};
use vrdma_perf::PerfArgs;
use xen_platform::DomId;

/// How long one vrdma-perf run may take before the demo calls it a hang.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Polling {
    Auto,
    Busy,
    Yield,
    Events,
}

#[derive(Parser)]
#[command(
    version,
    about = "vrdma demo: embedded simulated Xen host, backend, two guests, vrdma-perf between them"
)]
struct Cli {
    /// A short run (a few seconds): fewer tests, sizes and iterations.
    #[arg(long)]
    quick: bool,
    /// Only this mode (default: both).
    #[arg(long, value_enum)]
    mode: Option<vrdma_perf::run::ModeArg>,
    /// How server and client wait for completions: busy (perftest's default: the client, the
    /// server and the backend engine all spin), yield (they poll but sched_yield after each
    /// empty poll), events (they block on their CQ's event channel), or auto: yield when this
    /// machine has fewer than 3 cores (3 spinning threads on 2 cores measure the scheduler's
    /// time slice), else busy.
    #[arg(long, value_enum, default_value = "auto")]
    polling: Polling,
    /// Only these tests (comma-separated; default: all, or send_lat,write_bw with --quick).
    #[arg(long, value_delimiter = ',')]
    tests: Vec<String>,
    /// Where to put the intra-host tour's simulated host (default: a fresh directory under
    /// /tmp, removed at the end; the inter-host case's two hosts always get fresh ones).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// 1: only the intra-host tour (two guests on one host). 2: only the inter-host case (two
    /// simulated hosts, 127.0.0.2 and 127.0.0.3, vrdma between their guests beside raw TCP
    /// between the two addresses). Default: both, one after the other.
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=2))]
    hosts: Option<u8>,
    /// With --hosts 2: how long each backend's engine keeps polling after work before it
    /// sleeps in epoll (µs; the backend's `spin-before-sleep-us`). Default: the backend's own
    /// (200) when this machine has at least 4 cores, else 0 — two engines, a client and a
    /// server all spinning on fewer cores wait for each other's time slices.
    #[arg(long, value_name = "US")]
    engine_spin_us: Option<u64>,
    /// With --hosts 2: the backends' MPA CRC policy (`[cm] crc`; default offer: CRC32c on
    /// every FPDU between two vrdma backends). `decline` on both: no CRC.
    #[arg(long, value_enum, value_name = "POLICY")]
    mpa_crc: Option<Crc>,
    /// Instead of the tour: Debian's unmodified ibv_rc_pingpong, rping, ib_send_lat and
    /// ib_write_bw between two guests, through vrdma-exec (build it: `cargo build --release
    /// -p vrdma-verbs`), their output printed. Installs nothing: names the Debian packages
    /// to install when a tool is absent.
    #[arg(long, conflicts_with_all = ["hosts", "quick", "tests", "mode"])]
    apps: bool,
}

/// `[cm] crc` on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Crc {
    Offer,
    Require,
    Decline,
}

impl From<Crc> for vrdma_backend::config::MpaCrc {
    fn from(c: Crc) -> Self {
        match c {
            Crc::Offer => Self::Offer,
            Crc::Require => Self::Require,
            Crc::Decline => Self::Decline,
        }
    }
}

fn main() -> ExitCode {
    let mut argv = std::env::args_os();
    let _ = argv.next();
    if argv.next().is_some_and(|a| a == "__perf") {
        // Inside a guest domain: be vrdma-perf.
        vrdma_perf::init_tracing();
        let args = PerfArgs::parse_from(
            std::iter::once(std::ffi::OsString::from("vrdma-perf")).chain(argv),
        );
        return match vrdma_perf::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("vrdma-perf: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    vrdma_perf::init_tracing();
    let cli = Cli::parse();
    let r = match cli.hosts {
        _ if cli.apps => vrdma_demo::apps::run(cli.dir.as_deref()),
        Some(1) => demo(&cli),
        Some(_) => inter_host(&cli),
        // Both: the inter-host rows add a few seconds to the tour (docs/benchmarks.md).
        None => {
            let t0 = Instant::now();
            demo(&cli).and_then(|()| {
                println!();
                inter_host(&cli)?;
                step(&format!(
                    "intra-host tour and inter-host rows done in {:.1} s",
                    t0.elapsed().as_secs_f64()
                ));
                Ok(())
            })
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vrdma-demo: FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// This binary as `vrdma-perf` in `domid`.
fn spawn_perf(lab: &Lab, domid: DomId, args: &[String]) -> Result<Guest> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("__perf").args(args).env_remove("VRDMA_MODE");
    lab.spawn(domid, cmd)
}

/// One vrdma-perf run between the two domains; returns the client's report (text) and JSON.
fn perf(
    lab: &Lab,
    (server, client): (DomId, DomId),
    test: &str,
    mode: &str,
    sizes: &str,
    iters: usize,
    polling: Polling,
) -> Result<(String, serde_json::Value)> {
    let run = PerfRun {
        test,
        mode,
        sizes,
        iters,
        polling,
        cm: false,
        baseline: true,
    };
    perf_between((lab, server), (lab, client), "127.0.0.1", &run).map(|(c, _, j)| (c, j))
}

/// What one vrdma-perf server/client pair runs.
struct PerfRun<'a> {
    test: &'a str,
    mode: &'a str,
    sizes: &'a str,
    iters: usize,
    polling: Polling,
    /// Connect through the connection manager (`--cm`; between hosts).
    cm: bool,
    /// The client's in-run baselines (`--baseline`).
    baseline: bool,
}

/// One vrdma-perf run, the server in `server`'s domain of its lab, the client in `client`'s
/// (the same lab, or another host's), the client reaching the server's TCP exchange at
/// `server_host`; the client's report (text), the server's output and the client's JSON.
fn perf_between(
    (slab, server): (&Lab, DomId),
    (clab, client): (&Lab, DomId),
    server_host: &str,
    run: &PerfRun,
) -> Result<(String, String, serde_json::Value)> {
    let PerfRun {
        test,
        mode,
        sizes,
        iters,
        polling,
        cm,
        baseline,
    } = *run;
    let mut flag: Vec<&str> = match polling {
        Polling::Events => vec!["--events"],
        Polling::Yield => vec!["--yield-poll"],
        _ => vec![],
    };
    if cm {
        flag.push("--cm");
    }
    let what = format!("{test} ({mode}, sizes {sizes}, {iters} iterations)");
    let common = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = vec![test.into(), "--mode".into(), mode.into()];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let mut srv_args = vec!["--port", "0"];
    srv_args.extend_from_slice(&flag);
    let mut srv = spawn_perf(slab, server, &common(&srv_args))?;
    let first = srv.stdout.recv_timeout(Duration::from_secs(30));
    let port = match first
        .as_deref()
        .ok()
        .and_then(|l| l.rsplit(' ').next()?.parse::<u16>().ok())
    {
        Some(p) => p,
        None => {
            let (_, out, err) = srv.finish(Duration::from_secs(5));
            bail!(
                "{what}: the server in domain {} did not start listening\n--- its stdout:\n{}{out}\n--- its stderr:\n{err}",
                server.0,
                first.unwrap_or_default()
            );
        }
    };
    let json_path = clab.dir.join(format!("{test}-{mode}.json"));
    let port_s = port.to_string();
    let mut cli_args = common(&[
        server_host,
        "--port",
        &port_s,
        "--size",
        sizes,
        "--iters",
        &iters.to_string(),
        "--json-out",
        json_path.to_str().expect("utf-8 path"),
    ]);
    if baseline {
        cli_args.push("--baseline".into());
    }
    cli_args.extend(flag.iter().map(|s| s.to_string()));
    let mut cl = spawn_perf(clab, client, &cli_args)?;
    let (cok, cout, cerr) = cl.finish(RUN_TIMEOUT);
    let (sok, sout, serr) = srv.finish(Duration::from_secs(if cok { 30 } else { 2 }));
    if !cok || !sok {
        bail!(
            "{what} failed\n--- client (domain {}) {}:\n{cout}\n{cerr}\n--- server (domain {}) {}:\n{sout}\n{serr}",
            client.0,
            if cok { "succeeded" } else { "FAILED" },
            server.0,
            if sok { "succeeded" } else { "FAILED" },
        );
    }
    let json = std::fs::read_to_string(&json_path)
        .with_context(|| format!("{what}: reading the client's {}", json_path.display()))?;
    let _ = std::fs::remove_file(&json_path);
    Ok((cout, sout, serde_json::from_str(&json)?))
}

fn first_row(v: &serde_json::Value, table: &str, bytes: usize, key: &str) -> Option<f64> {
    v[table]
        .as_array()?
        .iter()
        .find(|r| r["bytes"].as_u64() == Some(bytes as u64))?[key]
        .as_f64()
}

fn base_size(v: &serde_json::Value, bytes: usize, which: &str, key: &str) -> Option<f64> {
    v["baselines"]["sizes"]
        .as_array()?
        .iter()
        .find(|r| r["bytes"].as_u64() == Some(bytes as u64))?[which][key]
        .as_f64()
}

fn demo(cli: &Cli) -> Result<()> {
    let t0 = Instant::now();
    let mut lab = Lab::start(cli.dir.as_deref())?;
    let result = (|| -> Result<()> {
        let a = lab.create_guest("guest-a")?;
        let b = lab.create_guest("guest-b")?;
        let modes: Vec<&str> = match cli.mode {
            Some(vrdma_perf::run::ModeArg::Bypass) => vec!["bypass"],
            Some(vrdma_perf::run::ModeArg::Mediated) => vec!["mediated"],
            None => vec!["bypass", "mediated"],
        };
        let (lat_sizes, bw_sizes, lat_iters, bw_iters, tests): (_, _, _, _, &[&str]) = if cli.quick
        {
            (
                "64,4096",
                "65536,1048576",
                300,
                300,
                &["send_lat", "write_bw"],
            )
        } else {
            (
                "64,4096,65536",
                "4096,65536,1048576",
                1000,
                2000,
                &[
                    "send_lat",
                    "write_lat",
                    "read_lat",
                    "send_bw",
                    "write_bw",
                    "read_bw",
                ],
            )
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let polling = match cli.polling {
            Polling::Auto if cores < 3 => Polling::Yield,
            Polling::Auto => Polling::Busy,
            p => p,
        };
        step(&format!(
            "completions: {} ({cores} cores{})",
            match polling {
                Polling::Events => "server and client block on CQ events; only the backend engine spins",
                Polling::Yield => "server and client poll, yielding the CPU after each empty poll; the backend engine spins",
                _ => "server and client busy-poll, the backend engine spins: 3 spinning threads",
            },
            if cli.polling == Polling::Auto {
                "; --polling busy for perftest's pure busy-polling"
            } else {
                ""
            }
        ));
        let chosen: Vec<&str> = if cli.tests.is_empty() {
            tests.to_vec()
        } else {
            cli.tests.iter().map(String::as_str).collect()
        };
        let mut results = Vec::new();
        for test in &chosen {
            for mode in &modes {
                let lat = test.ends_with("_lat");
                let (sizes, iters) = if lat {
                    (lat_sizes, lat_iters)
                } else {
                    (bw_sizes, bw_iters)
                };
                println!(
                    "\n=== {test}, {mode}: server in domain {}, client in domain {} ===",
                    a.0, b.0
                );
                let (text, json) = perf(&lab, (a, b), test, mode, sizes, iters, polling)?;
                println!("{text}");
                results.push((test.to_string(), mode.to_string(), json));
            }
        }
        summary(&results);
        Ok(())
    })();
    step("shutting down: guests, domains, backend, host");
    let stopped = lab.stop();
    result?;
    stopped.context("shutting down")?;
    step(&format!(
        "done in {:.1} s; nothing left running, {} removed",
        t0.elapsed().as_secs_f64(),
        lab.dir.display()
    ));
    Ok(())
}

fn summary(results: &[(String, String, serde_json::Value)]) {
    let get = |t: &str, m: &str| {
        results
            .iter()
            .find(|(tt, mm, _)| tt == t && mm == m)
            .map(|(_, _, j)| j)
    };
    println!(
        "=== summary: the speed targets (docs/benchmarks.md, the targets table), measured in this run ==="
    );
    if let Some(by) = get("send_lat", "bypass") {
        if let (Some(t), Some(cl)) = (
            first_row(by, "latency", 64, "t_typical_usec"),
            by["baselines"]["cache_line_rtt"]["t_typical_usec"].as_f64(),
        ) {
            println!(
                "bypass SEND 64 B one-way {t:.2} usec ÷ cache-line one-way {:.3} usec = {:.1}  (a two-process ping-pong through the engine; the ≤ 2.0 target is for a single post→CQE round trip)",
                cl / 2.0,
                t / (cl / 2.0)
            );
        }
        if let Some(me) = get("send_lat", "mediated") {
            if let (Some(tb), Some(tm)) = (
                first_row(by, "latency", 64, "t_typical_usec"),
                first_row(me, "latency", 64, "t_typical_usec"),
            ) {
                println!(
                    "mediated ÷ bypass SEND 64 B latency = {tm:.2} / {tb:.2} = {:.1}  (target ≥ 20)",
                    tm / tb
                );
            }
        }
    }
    if let Some(by) = get("write_bw", "bypass") {
        for size in [65536usize, 1048576] {
            if let (Some(bw), Some(mc), Some(tcp)) = (
                first_row(by, "bandwidth", size, "bw_avg_mb_sec"),
                base_size(by, size, "memcpy", "bw_avg_mb_sec"),
                base_size(by, size, "tcp_stream", "bw_avg_mb_sec"),
            ) {
                println!(
                    "bypass WRITE {size} B: {bw:.0} MB/s = {:.2} × memcpy ({mc:.0} MB/s), {:.2} × TCP loopback stream ({tcp:.0} MB/s)",
                    bw / mc,
                    bw / tcp
                );
            }
        }
    }
    println!(
        "(every figure above comes from this run on this machine; spinning threads are listed \
         with each table; the machine has {} cores)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
}

/// Host A's and host B's backend addresses (DESIGN §12).
const HOST_A: &str = "127.0.0.2";
const HOST_B: &str = "127.0.0.3";

/// Runs `vrdma-perf` (this binary) in `domid` to the end; its stdout and JSON report.
fn perf_alone(
    lab: &Lab,
    domid: DomId,
    args: &[String],
    what: &str,
) -> Result<(String, serde_json::Value)> {
    let json_path = lab.dir.join(format!("{what}.json"));
    let mut a = args.to_vec();
    a.push("--json-out".into());
    a.push(json_path.to_str().expect("utf-8 path").into());
    let mut g = spawn_perf(lab, domid, &a)?;
    let (ok, out, err) = g.finish(RUN_TIMEOUT);
    if !ok {
        bail!("{what} in domain {} failed:\n{out}\n{err}", domid.0);
    }
    let json = std::fs::read_to_string(&json_path)
        .with_context(|| format!("{what}: reading {}", json_path.display()))?;
    let _ = std::fs::remove_file(&json_path);
    Ok((out, serde_json::from_str(&json)?))
}

/// Which polling a like-for-like TCP ping-pong uses: blocking beside vrdma blocking on CQ
/// events, busy-polled beside vrdma polling.
fn tcp_like(polling: Polling) -> &'static str {
    match polling {
        Polling::Events => "blocking",
        _ => "busy-poll",
    }
}

fn inter_host(cli: &Cli) -> Result<()> {
    let t0 = Instant::now();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let default_spin = vrdma_backend::config::Config::default().spin_before_sleep_us;
    let spin = cli
        .engine_spin_us
        .unwrap_or(if cores >= 4 { default_spin } else { 0 });
    let polling = match cli.polling {
        Polling::Auto if cores < 3 => Polling::Yield,
        Polling::Auto => Polling::Busy,
        p => p,
    };
    let mode = match cli.mode {
        Some(vrdma_perf::run::ModeArg::Mediated) => "mediated",
        _ => "bypass",
    };
    step(&format!(
        "inter-host: two simulated hosts on this machine, host A (backend at {HOST_A}) and host B (backend at {HOST_B})"
    ));
    let tuning = Tuning {
        engine_spin_us: Some(spin),
        crc: cli.mpa_crc.map(Into::into),
    };
    let mut a = Lab::start_host_with(None, "A", Some(HOST_A.parse()?), tuning)?;
    let mut b = match Lab::start_host_with(None, "B", Some(HOST_B.parse()?), tuning) {
        Ok(b) => b,
        Err(e) => {
            let _ = a.stop();
            return Err(e);
        }
    };
    let result = (|| -> Result<()> {
        let ga = a.create_guest("guest-a")?;
        let gb = b.create_guest("guest-b")?;
        step(&format!(
            "guest-a is domain {} on host A, guest-b is domain {} on host B",
            ga.0, gb.0
        ));
        step(&format!(
            "MPA CRC policy of both backends: {}",
            match cli.mpa_crc {
                None | Some(Crc::Offer) => "offer (the default: CRC32c on every FPDU between them)",
                Some(Crc::Require) => "require (CRC32c on every FPDU)",
                Some(Crc::Decline) => "decline (no CRC: neither asks)",
            }
        ));
        step(&format!(
            "each backend's engine polls {spin} µs after work, then sleeps in epoll{}; \
             completions: {} ({cores} cores)",
            if cli.engine_spin_us.is_none() {
                if cores >= 4 {
                    " (the backend's default)"
                } else {
                    " (0 below 4 cores: --engine-spin-us to change)"
                }
            } else {
                ""
            },
            match polling {
                Polling::Events => "server and client block on CQ events",
                Polling::Yield => "server and client poll, yielding the CPU after each empty poll",
                _ => "server and client busy-poll",
            },
        ));
        let between = format!("{HOST_A},{HOST_B}");
        let (pp_iters, stream_iters, lat_iters, bw_iters) = if cli.quick {
            (300, 256, 300, 300)
        } else {
            (1000, 4096, 1000, 2000)
        };
        let vrdma = |test: &str,
                     sizes: &str,
                     iters: usize|
         -> Result<(String, String, serde_json::Value)> {
            println!(
                "=== inter-host vrdma {test} ({mode}): client guest-a on host A -> server guest-b on host B, --cm ==="
            );
            let run = PerfRun {
                test,
                mode,
                sizes,
                iters,
                polling,
                cm: true,
                baseline: false,
            };
            let (text, server, json) = perf_between((&b, gb), (&a, ga), HOST_B, &run)?;
            for l in server.lines().filter(|l| l.starts_with("# connected")) {
                println!("{l}  [server]");
            }
            println!("{text}");
            Ok((text, server, json))
        };
        println!("\n=== TCP baselines between the two hosts' addresses ({HOST_A} -> {HOST_B}), measured in guest-a ===");
        let (pp_text, pp) = perf_alone(
            &a,
            ga,
            &[
                "tcp_pingpong".into(),
                "--between".into(),
                between.clone(),
                "--size".into(),
                "64".into(),
                "--iters".into(),
                pp_iters.to_string(),
            ],
            "tcp_pingpong",
        )?;
        println!("{pp_text}");
        let (_, _, send) = vrdma("send_lat", "64", lat_iters)?;
        println!("=== TCP stream between the two hosts' addresses ({HOST_A} -> {HOST_B}), measured in guest-a ===");
        let (st_text, st) = perf_alone(
            &a,
            ga,
            &[
                "tcp_stream".into(),
                "--between".into(),
                between.clone(),
                "--size".into(),
                "65536,1048576".into(),
                "--iters".into(),
                stream_iters.to_string(),
            ],
            "tcp_stream",
        )?;
        println!("{st_text}");
        let (_, _, write) = vrdma("write_bw", "65536,1048576", bw_iters)?;
        inter_host_summary(&InterHost {
            pp: &pp,
            st: &st,
            send: &send,
            write: &write,
            polling,
            spin,
        });
        Ok(())
    })();
    step("shutting down: guests, domains, backends, hosts");
    let stopped = (a.stop(), b.stop());
    result?;
    stopped.0.context("shutting down host A")?;
    stopped.1.context("shutting down host B")?;
    step(&format!(
        "done in {:.1} s; nothing left running, {} and {} removed",
        t0.elapsed().as_secs_f64(),
        a.dir.display(),
        b.dir.display()
    ));
    Ok(())
}

/// What the inter-host summary is made of: the reports (JSON) of this run.
struct InterHost<'a> {
    pp: &'a serde_json::Value,
    st: &'a serde_json::Value,
    send: &'a serde_json::Value,
    write: &'a serde_json::Value,
    polling: Polling,
    /// Each engine's spin after work, µs.
    spin: u64,
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

fn inter_host_summary(r: &InterHost) {
    println!(
        "=== summary: the inter-host speed targets (docs/benchmarks.md, the targets table), measured in this run ==="
    );
    let c = &r.send["connection"];
    println!(
        "vrdma connection: {} -> {} through both backends' connection managers (iWARP over TCP), between_hosts={}",
        c["local"].as_str().unwrap_or("?"),
        c["peer"].as_str().unwrap_or("?"),
        c["between_hosts"]
    );
    let (client, server) = match r.polling {
        Polling::Events => ("0 (blocks on CQ events)", "0 (events)"),
        Polling::Yield => (
            "1 (CQ poll, yielding)",
            "1 (yielding) for SEND, 0 for WRITE",
        ),
        _ => ("1 (CQ busy-poll)", "1 for SEND, 0 for WRITE (passive)"),
    };
    println!(
        "spinning threads, vrdma: client {client}, server {server}, + the engine of each of the 2 backends for {} µs after work; TCP: ping-pong blocking 0, busy-poll 2; stream 0; this machine has {} cores",
        r.spin,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let rtt = |polling: &str| {
        r.pp["pingpong_rtt"].as_array().and_then(|v| {
            v.iter().find(|x| x["polling"] == polling)?["latency"][0]["t_typical_usec"].as_f64()
        })
    };
    let like = tcp_like(r.polling);
    let send = first_row(r.send, "latency", 64, "t_typical_usec");
    match (send, rtt(like)) {
        (Some(v), Some(t)) => {
            let ratio = v / (t / 2.0);
            println!(
                "inter-host SEND 64 B latency, one-way: vrdma {v:.2} usec ÷ raw TCP ping-pong {like} {:.2} usec = {ratio:.2}  (target ≤ 1.1: {})",
                t / 2.0,
                verdict(ratio <= 1.1)
            );
            let other = if like == "blocking" {
                "busy-poll"
            } else {
                "blocking"
            };
            if let Some(o) = rtt(other) {
                println!(
                    "    (÷ raw TCP ping-pong {other} {:.2} usec one-way = {:.2})",
                    o / 2.0,
                    v / (o / 2.0)
                );
            }
        }
        _ => println!("inter-host SEND 64 B latency: a figure is missing from this run's reports"),
    }
    for (size, target) in [(65536usize, 0.9), (1048576, 0.95)] {
        let tcp = r.st["stream"]["bandwidth"].as_array().and_then(|v| {
            v.iter()
                .find(|x| x["bytes"].as_u64() == Some(size as u64))?["bw_avg_mb_sec"]
                .as_f64()
        });
        match (first_row(r.write, "bandwidth", size, "bw_avg_mb_sec"), tcp) {
            (Some(v), Some(t)) => {
                let ratio = v / t;
                println!(
                    "inter-host RDMA WRITE {size} B bandwidth: vrdma {v:.0} MB/s ÷ raw TCP stream {t:.0} MB/s = {ratio:.2}  (target ≥ {target}: {})",
                    verdict(ratio >= target)
                );
            }
            _ => println!(
                "inter-host RDMA WRITE {size} B: a figure is missing from this run's reports"
            ),
        }
    }
    println!(
        "(every figure above comes from this run on this machine, {HOST_A} -> {HOST_B}; on a loaded machine the ratios mean little)"
    );
}
