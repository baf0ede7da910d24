//! `vrdma-demo`: the one-command tour. On a machine without Xen it starts an embedded
//! simulated Xen host and the vrdma backend (in this process), creates two guest domains,
//! attaches a vrdma device to each as the toolstack does, runs `vrdma-perf` server and client
//! in the two domains (this binary re-executed as `vrdma-demo __perf ...`), for latency and
//! bandwidth, bypass and mediated, with in-run baselines, prints the tables and a summary of
//! the DESIGN §10 ratios, then shuts everything down (guests closed, domains destroyed,
//! backend stopped, host sockets and directory removed).
//!
//! `cargo run --release --bin vrdma-demo` (add `-- --quick` for a few seconds' version).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use clap::Parser;
use vrdma_backend::config::Config;
use vrdma_backend::control::ControlOpener;
use vrdma_backend::daemon::host::{self, HostChoice};
use vrdma_backend::daemon::{self, Daemon, ShutdownHandle};
use vrdma_backend::device::{Device, SoftDevice};
use vrdma_backend::toolstack;
use vrdma_perf::PerfArgs;
use xen_platform::sim::{sock, SimControl};
use xen_platform::{DomId, ENV_SIM_DIR, ENV_SIM_DOMID};

/// How long one vrdma-perf run may take before the demo calls it a hang.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

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
    /// Where to put the simulated host (default: a fresh directory under /tmp, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
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
    match demo(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vrdma-demo: FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The embedded host and the backend daemon running in this process.
struct Lab {
    host: Option<host::Host>,
    daemon: Option<(ShutdownHandle, std::thread::JoinHandle<Result<()>>)>,
    domains: Vec<DomId>,
    dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

fn step(what: &str) {
    println!("vrdma-demo: {what}");
}

impl Lab {
    fn start(dir: Option<&Path>) -> Result<Lab> {
        let (dir, tmp) = match dir {
            Some(d) => (d.to_path_buf(), None),
            None => {
                // Short path: Unix socket paths must fit in 108 bytes.
                let t = tempfile::Builder::new()
                    .prefix("vrdma-demo-")
                    .tempdir_in("/tmp")
                    .context("creating a directory for the simulated host")?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        step(&format!(
            "starting the embedded simulated Xen host in {}",
            dir.display()
        ));
        let host = host::start(HostChoice::Embedded(Some(dir.join("host"))))
            .context("step 1: starting the embedded simulated Xen host")?;
        let dir = host
            .sim_dir()
            .ok_or_else(|| anyhow!("the embedded host is not a simulated host"))?
            .to_path_buf();
        step("starting the vrdma backend (software RDMA device) as dom0");
        let config = Config::default();
        let device: Arc<dyn Device> = Arc::new(
            SoftDevice::new(config.engine())
                .context("step 2: starting the software device engine")?,
        );
        let info = daemon::device_info("soft-iwarp", &device.attrs());
        let platform = host.platform.clone();
        let dev = device.clone();
        let d = Daemon::new(
            Arc::new(host.store.clone()),
            host.backend_domid,
            info,
            config.quotas,
            daemon::device_stats_source(device.clone()),
            move |faults| Box::new(ControlOpener::new(platform, dev, faults)),
        );
        let shutdown = d.shutdown_handle();
        let thread = std::thread::Builder::new()
            .name("vrdma-backend".into())
            .spawn(move || {
                let r = d
                    .run()
                    .map_err(|e| anyhow!("the backend daemon stopped: {e}"));
                drop(device);
                r
            })
            .context("step 2: starting the backend thread")?;
        Ok(Lab {
            host: Some(host),
            daemon: Some((shutdown, thread)),
            domains: Vec::new(),
            dir,
            _tmp: tmp,
        })
    }

    fn host(&self) -> &host::Host {
        self.host.as_ref().expect("host running")
    }

    fn create_guest(&mut self, name: &str) -> Result<DomId> {
        let sim = self
            .host()
            .embedded
            .as_ref()
            .ok_or_else(|| anyhow!("no embedded host"))?;
        let d = sim
            .create_domain(Some(name), None)
            .with_context(|| format!("step 3: creating guest domain {name}"))?;
        self.domains.push(d);
        let h = self.host();
        toolstack::attach_device(
            &h.store,
            u32::from(d.0),
            h.backend_domid,
            0,
            &Config::default().quotas,
        )
        .with_context(|| format!("step 4: attaching a vrdma device to domain {}", d.0))?;
        step(&format!(
            "created domain {} ({name}) and attached vrdma device 0 to it",
            d.0
        ));
        Ok(d)
    }

    /// This binary as `vrdma-perf` in `domid`, adopted by the host (a domain destroy kills it).
    fn spawn_perf(&self, domid: DomId, args: &[String]) -> Result<Guest> {
        let exe = std::env::current_exe().context("finding this executable")?;
        let mut cmd = Command::new(exe);
        cmd.arg("__perf")
            .args(args)
            .env(ENV_SIM_DIR, &self.dir)
            .env(ENV_SIM_DOMID, domid.0.to_string())
            .env("XENSTORED_PATH", sock::xenstore_socket(&self.dir, domid.0))
            .env_remove("VRDMA_MODE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd
            .spawn()
            .with_context(|| format!("starting vrdma-perf in domain {}", domid.0))?;
        let ctl =
            SimControl::connect(&self.dir).context("connecting to the host's control socket")?;
        ctl.adopt(domid, child.id())
            .with_context(|| format!("the host adopting vrdma-perf in domain {}", domid.0))?;
        Guest::new(child, ctl)
    }

    fn stop(&mut self) -> Result<()> {
        let mut first_err = None;
        if let Some(h) = &self.host {
            if let Some(sim) = &h.embedded {
                for d in self.domains.drain(..) {
                    if let Err(e) = sim.destroy_domain(d) {
                        first_err.get_or_insert(anyhow!("destroying domain {}: {e}", d.0));
                    }
                }
            }
        }
        if let Some((shutdown, thread)) = self.daemon.take() {
            shutdown.shutdown();
            match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(anyhow!("the backend thread panicked"));
                }
            }
        }
        if let Some(h) = self.host.take() {
            drop(h);
        }
        let top = match self._tmp.take() {
            Some(t) => t.path().to_path_buf(),
            None => self.dir.clone(),
        };
        if let Err(e) = std::fs::remove_dir_all(&top) {
            if e.kind() != std::io::ErrorKind::NotFound {
                first_err.get_or_insert(anyhow!("removing {}: {e}", top.display()));
            }
        }
        self.dir = top;
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.host.is_some() {
            let _ = self.stop();
        }
    }
}

/// A vrdma-perf process in a guest domain.
struct Guest {
    child: Child,
    _ctl: SimControl,
    stdout: std::sync::mpsc::Receiver<String>,
    stderr: std::thread::JoinHandle<String>,
}

impl Guest {
    fn new(mut child: Child, ctl: SimControl) -> Result<Guest> {
        let out = child.stdout.take().expect("piped stdout");
        let mut err = child.stderr.take().expect("piped stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Ok(Guest {
            child,
            _ctl: ctl,
            stdout: rx,
            stderr,
        })
    }

    /// Waits for the process to end (killing it after `timeout`); its stdout and stderr.
    fn finish(mut self, timeout: Duration) -> (bool, String, String) {
        let deadline = Instant::now() + timeout;
        let ok = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break s.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break false;
                }
            }
        };
        let out: Vec<String> = self.stdout.try_iter().collect();
        let mut out = out.join("\n");
        // The reader thread may still be draining: give it a moment.
        while let Ok(l) = self.stdout.recv_timeout(Duration::from_millis(200)) {
            out.push('\n');
            out.push_str(&l);
        }
        let err = self.stderr.join().unwrap_or_default();
        (ok, out, err)
    }
}

/// One vrdma-perf run between the two domains; returns the client's report (text) and JSON.
fn perf(
    lab: &Lab,
    server: DomId,
    client: DomId,
    test: &str,
    mode: &str,
    sizes: &str,
    iters: usize,
) -> Result<(String, serde_json::Value)> {
    let what = format!("{test} ({mode}, sizes {sizes}, {iters} iterations)");
    let common = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = vec![test.into(), "--mode".into(), mode.into()];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let srv = lab.spawn_perf(server, &common(&["--port", "0"]))?;
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
    let json_path = lab.dir.join(format!("{test}-{mode}.json"));
    let port_s = port.to_string();
    let cli_args = common(&[
        "127.0.0.1",
        "--port",
        &port_s,
        "--size",
        sizes,
        "--iters",
        &iters.to_string(),
        "--baseline",
        "--json-out",
        json_path.to_str().expect("utf-8 path"),
    ]);
    let cl = lab.spawn_perf(client, &cli_args)?;
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
    Ok((cout, serde_json::from_str(&json)?))
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
                2000,
                3000,
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
        let mut results = Vec::new();
        for test in tests {
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
                let (text, json) = perf(&lab, a, b, test, mode, sizes, iters)?;
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
    println!("=== summary: DESIGN §10 ratios measured in this run ===");
    if let Some(by) = get("send_lat", "bypass") {
        if let (Some(t), Some(cl)) = (
            first_row(by, "latency", 64, "t_typical_usec"),
            by["baselines"]["cache_line_rtt"]["t_typical_usec"].as_f64(),
        ) {
            println!(
                "bypass SEND 64 B one-way {t:.2} usec ÷ cache-line one-way {:.3} usec = {:.1}  (target ≤ 2.0 for post→CQE vs cache line)",
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
