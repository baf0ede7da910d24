//! A simulated Xen host with the vrdma backend running in this process, guest domains with a
//! vrdma device attached, and processes started in them: what `vrdma-demo` and the C ABI
//! tests stand on.

use std::io::{BufRead, BufReader, Read};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use vrdma_backend::config::{Config, MpaCrc, SIM_DEFAULT_ADDRESS};
use vrdma_backend::control::policy::CmPolicy;
use vrdma_backend::control::ControlOpener;
use vrdma_backend::daemon::host::{self, HostChoice};
use vrdma_backend::daemon::{self, Daemon, ShutdownHandle};
use vrdma_backend::device::{Device, SoftDevice};
use vrdma_backend::toolstack;
use xen_platform::sim::{sock, SimControl};
use xen_platform::{DomId, ENV_SIM_DIR, ENV_SIM_DOMID};

/// The embedded host and the backend daemon running in this process.
pub struct Lab {
    host: Option<host::Host>,
    daemon: Option<(ShutdownHandle, std::thread::JoinHandle<Result<()>>)>,
    domains: Vec<DomId>,
    pub dir: PathBuf,
    /// The host's name in the demo's messages ("" for the one host of the default demo).
    pub name: String,
    /// The backend's address (DESIGN §12: each simulated host its own loopback address).
    pub address: Option<IpAddr>,
    /// Whether the backend's configuration carries [`Lab::address`] (once the backend has an
    /// `address` key; until then the address is the demo's alone).
    pub address_in_config: bool,
    _tmp: Option<tempfile::TempDir>,
}

/// The backend configuration of a host at `address`: the default, with `address =
/// ["..."]` when this build's backend has that key (asked of its own parser: a configuration
/// with an unknown key is refused); whether the address is in. An error if the backend has
/// the key but refuses that form.
pub fn backend_config(address: Option<IpAddr>) -> Result<(Config, bool)> {
    let Some(a) = address else {
        return Ok((Config::default(), false));
    };
    Ok(
        match Config::parse(&format!("address = [\"{a}\"]\n"), "vrdma-demo") {
            Ok(c) => (c, true),
            // An older backend: no such key (the demo says the address is its own).
            Err(e) if e.to_string().contains("unknown field `address`") => {
                (Config::default(), false)
            }
            Err(e) => bail!(
                "the backend configuration has an `address` key but refuses [\"{a}\"]: {e} — \
                 teach vrdma_demo::lab::backend_config its form"
            ),
        },
    )
}

/// Settings of a host's backend that differ from the default configuration.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tuning {
    /// `spin-before-sleep-us`: how long the engine polls after work before it sleeps.
    pub engine_spin_us: Option<u64>,
    /// `[cm] crc`: the MPA CRC policy.
    pub crc: Option<MpaCrc>,
}

/// Progress on stdout.
pub fn step(what: &str) {
    println!("vrdma-demo: {what}");
}

impl Lab {
    pub fn start(dir: Option<&Path>) -> Result<Lab> {
        Lab::start_host(dir, "", None)
    }

    /// A simulated host named `name` (in the demo's messages) whose backend has `address`;
    /// several run side by side in one process, each in its own directory.
    pub fn start_host(dir: Option<&Path>, name: &str, address: Option<IpAddr>) -> Result<Lab> {
        Lab::start_host_with(dir, name, address, Tuning::default())
    }

    /// [`Lab::start_host`] with the backend configuration changed by `tuning`.
    pub fn start_host_with(
        dir: Option<&Path>,
        name: &str,
        address: Option<IpAddr>,
        tuning: Tuning,
    ) -> Result<Lab> {
        let label = if name.is_empty() {
            String::new()
        } else {
            format!(" {name}")
        };
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
            "starting the embedded simulated Xen host{label} in {}",
            dir.display()
        ));
        let host = host::start(HostChoice::Embedded(Some(dir.join("host"))))
            .context("step 1: starting the embedded simulated Xen host")?;
        let dir = host
            .sim_dir()
            .ok_or_else(|| anyhow!("the embedded host is not a simulated host"))?
            .to_path_buf();
        let (config, address_in_config) = backend_config(address)?;
        step(&format!(
            "starting the vrdma backend{label} (software RDMA device) as dom0{}",
            match (address, address_in_config) {
                (Some(a), true) => format!(", address {a}"),
                (Some(a), false) => format!(
                    ", address {a} (the backend has no `address` key yet: its device cannot use it)"
                ),
                (None, _) => String::new(),
            }
        ));
        let mut config = config;
        if let Some(us) = tuning.engine_spin_us {
            config.spin_before_sleep_us = us;
        }
        if let Some(crc) = tuning.crc {
            config.cm.crc = crc;
        }
        // As `vrdma-backend` does: the device's addresses (the config's, else 127.0.0.1 on a
        // simulated host) and its connection manager, with the `[cm]` policy.
        let addrs = config.addresses(&[SIM_DEFAULT_ADDRESS]);
        let cm_policy = Arc::new(CmPolicy::new(config.cm.clone()));
        let device: Arc<dyn Device> = Arc::new(
            SoftDevice::new(config.engine())
                .context("step 2: starting the software device engine")?
                .with_cm(config.cm_device_config(addrs, cm_policy.clone()))
                .context("step 2: starting the software device's connection manager")?,
        );
        let info = daemon::device_info_of("soft-iwarp", &*device);
        let platform = host.platform.clone();
        let dev = device.clone();
        let d = Daemon::new(
            Arc::new(host.store.clone()),
            host.backend_domid,
            info,
            config.quotas,
            daemon::device_stats_source(device.clone()),
            move |faults| {
                Box::new(
                    ControlOpener::new(platform, dev, faults).with_cm_policy(cm_policy.clone()),
                )
            },
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
            name: name.to_string(),
            address,
            address_in_config,
            _tmp: tmp,
        })
    }

    pub fn host(&self) -> &host::Host {
        self.host.as_ref().expect("host running")
    }

    pub fn create_guest(&mut self, name: &str) -> Result<DomId> {
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

    /// Sets the environment that makes a process a guest of `domid` (the sim's
    /// `VRDMA_SIM`, `VRDMA_SIM_DOMID`, `XENSTORED_PATH`).
    pub fn domain_env(&self, cmd: &mut Command, domid: DomId) {
        cmd.env(ENV_SIM_DIR, &self.dir)
            .env(ENV_SIM_DOMID, domid.0.to_string())
            .env("XENSTORED_PATH", sock::xenstore_socket(&self.dir, domid.0));
    }

    /// Starts `cmd` in `domid` (stdout and stderr captured), adopted by the host so a domain
    /// destroy kills it.
    pub fn spawn(&self, domid: DomId, mut cmd: Command) -> Result<Guest> {
        self.domain_env(&mut cmd, domid);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {cmd:?} in domain {}", domid.0))?;
        let ctl =
            SimControl::connect(&self.dir).context("connecting to the host's control socket")?;
        ctl.adopt(domid, child.id())
            .with_context(|| format!("the host adopting {cmd:?} in domain {}", domid.0))?;
        Guest::new(child, ctl)
    }

    pub fn stop(&mut self) -> Result<()> {
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
pub struct Guest {
    child: Child,
    _ctl: SimControl,
    /// Lines the process printed on stdout.
    pub stdout: std::sync::mpsc::Receiver<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Drop for Guest {
    fn drop(&mut self) {
        // Never leave a process behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
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
            stderr: Some(stderr),
        })
    }

    /// Waits for the process to end (killing it after `timeout`); its stdout and stderr.
    pub fn finish(&mut self, timeout: Duration) -> (bool, String, String) {
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
        let err = self
            .stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        (ok, out, err)
    }
}
