//! `vrdma-backend`: the vrdma backend daemon (dom0 or a driver domain).
//!
//! On real Xen it serves the host's guests; with `--sim DIR` (or `VRDMA_SIM`) it joins a
//! simulated host; with no Xen and nothing given it starts an embedded simulated host and says
//! where its sockets are. See docs/backend.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use vrdma_backend::config::{Config, DeviceChoice, SIM_DEFAULT_ADDRESS};
use vrdma_backend::control::policy::CmPolicy;
use vrdma_backend::control::ControlOpener;
use vrdma_backend::daemon::host::{self, HostChoice};
use vrdma_backend::daemon::{self, signals, Daemon};
use vrdma_backend::device::verbs::{VerbsDevice, VerbsLib};
use vrdma_backend::device::{Device, SoftDevice};
use vrdma_backend::resources::budget::{HostBudget, Pool};

#[derive(Parser)]
#[command(version, about = "vrdma backend daemon: RDMA for Xen guests")]
struct Cli {
    /// Configuration file (TOML); default /etc/vrdma/backend.toml if it exists.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Join the simulated Xen host serving DIR (`vrdma-simhost serve --dir DIR`).
    #[arg(long, env = "VRDMA_SIM", conflicts_with = "embedded")]
    sim: Option<PathBuf>,
    /// Start an embedded simulated host in DIR (the default when there is no Xen).
    #[arg(long, value_name = "DIR")]
    embedded: Option<PathBuf>,
    /// Log filter (overrides the config file; RUST_LOG overrides both).
    #[arg(long)]
    log_level: Option<String>,
    /// The device: `soft` (the software device) or `verbs:<ibdev>[:<port>]`, an RDMA device
    /// of this host through rdma-core (overrides the config file's `device`).
    #[arg(long, value_name = "DEVICE")]
    device: Option<DeviceChoice>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match Config::load_or_default(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vrdma-backend: {e}");
            return ExitCode::from(2);
        }
    };
    let level = cli.log_level.clone().unwrap_or(config.log_level.clone());
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match run(cli, config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("vrdma-backend: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli, config: Config) -> Result<()> {
    let origin = cli
        .config
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "the configuration".into());
    let choice = match cli.device {
        Some(d) => d,
        None => config
            .device_choice()
            .map_err(|e| anyhow::anyhow!("{origin}: {e}"))?,
    };
    // An RDMA device is opened before anything else starts: a host without rdma-core or
    // without that device fails at once, saying what is missing.
    let verbs = match &choice {
        DeviceChoice::Soft => None,
        DeviceChoice::Verbs { ibdev, port } => {
            // The library error names the packages (libibverbs1, ibverbs-providers).
            let lib = VerbsLib::open().context("--device verbs needs rdma-core's libibverbs")?;
            let dev = VerbsDevice::open(&lib, ibdev, *port, config.engine())
                .with_context(|| format!("opening RDMA device {ibdev} port {port}"))?;
            tracing::info!(
                "device verbs:{ibdev}:{port} (rdma-core; connections: rdma_cm, loopback pairs)"
            );
            Some(dev)
        }
    };
    let host_choice = match (cli.sim, cli.embedded) {
        (Some(dir), _) => HostChoice::Sim(dir),
        (None, Some(dir)) => HostChoice::Embedded(Some(dir)),
        (None, None) => HostChoice::Auto,
    };
    let host = host::start(host_choice).context("starting the platform")?;
    tracing::info!(
        "vrdma-backend on {} as domain {}",
        host.description,
        host.backend_domid
    );
    if let (Some(dir), true) = (host.sim_dir(), host.embedded.is_some()) {
        println!("vrdma-backend: embedded simulated Xen host");
        for line in host::join_instructions(dir) {
            println!("  {line}");
            tracing::info!("{line}");
        }
    }
    // The host's real limits are known only now: refuse budgets that oversubscribe them.
    let host_limits = host.platform.grant_limits();
    if host_limits.grant_pages.is_none() {
        tracing::warn!(
            "cannot read the host's grant limit ({} absent: is xen_gntalloc loaded?); \
             [host] granted-pages is not checked against it",
            xen_platform::xen::GNTALLOC_LIMIT_KNOB
        );
    }
    let limits = config.host_budget(&origin, &host_limits)?;
    tracing::info!(
        "page budgets: {} granted and {} mapped pages for the host, split among {} guests \
         ({} and {} per domain; per device also max-granted-pages {} and max-mr-pages {})",
        limits.granted_pages,
        limits.mapped_pages,
        limits.guests,
        limits.share(Pool::Granted),
        limits.share(Pool::Mapped),
        config.quotas.max_granted_pages,
        config.quotas.max_mr_pages,
    );
    let budget = Arc::new(HostBudget::new(limits));
    // The backend's addresses: the file's, else 127.0.0.1 on a simulated host (on real Xen
    // none: connections stay on this host until `address` names one).
    let default_addrs: &[std::net::IpAddr] = if host.sim_dir().is_some() {
        &[SIM_DEFAULT_ADDRESS]
    } else {
        &[]
    };
    let addrs = config.addresses(default_addrs);
    let cm_policy = Arc::new(CmPolicy::new(config.cm.clone()));
    let (device, kind): (Arc<dyn Device>, &str) = match verbs {
        None => (
            Arc::new(
                SoftDevice::new(config.engine())
                    .context("starting the software device engine")?
                    .with_cm(config.cm_device_config(addrs.clone(), cm_policy.clone()))
                    .context("starting the software device's connection manager")?,
            ),
            "soft-iwarp",
        ),
        // rdma_cm on librdmacm: the configured addresses, else the device's own (its GIDs
        // that are IP addresses); the same peer policy as the software device's.
        Some(dev) => (
            Arc::new(
                dev.with_cm(config.cm_device_config(config.addresses(&[]), cm_policy.clone()))
                    .context("starting the verbs device's connection manager (rdma_cm)")?,
            ),
            "verbs",
        ),
    };
    tracing::info!(
        "addresses {:?}; [cm] max-listeners {}, max-connects {}, allowed-ports {:?}, \
         allowed-peers {:?}, {} domain overrides",
        device.local_addrs(),
        config.cm.max_listeners,
        config.cm.max_connects,
        config.cm.allowed_ports,
        config.cm.allowed_peers,
        config.cm.domain.len()
    );
    let info = daemon::device_info_of(kind, &*device);
    let store = Arc::new(host.store.clone());
    let platform = host.platform.clone();
    let dev = device.clone();
    let daemon = Daemon::new(
        store,
        host.backend_domid,
        info,
        config.quotas,
        daemon::device_stats_source(device.clone()),
        move |faults| {
            Box::new(
                ControlOpener::with_budget(platform, dev, faults, budget)
                    .with_cm_policy(cm_policy.clone()),
            )
        },
    );
    signals::install(daemon.shutdown_handle()).context("installing signal handlers")?;
    let outcome = daemon.run();
    drop(host);
    outcome.context("the daemon stopped")
}
