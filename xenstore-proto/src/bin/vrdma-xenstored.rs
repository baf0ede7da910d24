//! `vrdma-xenstored --socket PATH`: the embedded XenStore server on a Unix socket. Every client
//! of the socket is dom0 (privileged), as local clients of xenstored's socket are.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use xenstore_proto::server::{Config, Quotas, Server};

/// The embedded XenStore server (xenstored semantics) on a Unix socket.
#[derive(Debug, Parser)]
#[command(name = "vrdma-xenstored", version)]
struct Args {
    /// Socket to listen on (point libxenstore at it with XENSTORED_PATH).
    #[arg(long)]
    socket: PathBuf,
    /// Additional sockets whose clients speak as a domain: `DOMID:PATH` (repeatable).
    #[arg(long = "domain-socket", value_name = "DOMID:PATH")]
    domain_sockets: Vec<String>,
    /// Hand a released domain's nodes to dom0 instead of deleting them.
    #[arg(long)]
    keep_orphans: bool,
    /// Nodes per unprivileged domain.
    #[arg(long, default_value_t = Quotas::default().nodes)]
    quota_nodes: u32,
    /// Largest value an unprivileged domain may write, in bytes.
    #[arg(long, default_value_t = Quotas::default().node_size)]
    quota_node_size: u32,
    /// Watches per unprivileged domain.
    #[arg(long, default_value_t = Quotas::default().watches)]
    quota_watches: u32,
    /// Open transactions per unprivileged domain (all its connections).
    #[arg(long, default_value_t = Quotas::default().transactions)]
    quota_transactions: u32,
    /// Permission entries per node an unprivileged domain may set.
    #[arg(long, default_value_t = Quotas::default().node_permissions)]
    quota_node_permissions: u32,
    /// Nodes one transaction of an unprivileged domain may read or change.
    #[arg(long, default_value_t = Quotas::default().transaction_nodes)]
    quota_transaction_nodes: u32,
    /// Connections an unprivileged domain may have open at once.
    #[arg(long, default_value_t = Config::default().max_domain_connections)]
    domain_connections: usize,
    /// Requests of an unprivileged domain not yet answered before its sockets stop being read.
    #[arg(long, default_value_t = Config::default().max_outstanding)]
    quota_outstanding: usize,
    /// Bytes queued for an unprivileged domain beyond which its watch events are dropped.
    #[arg(long, default_value_t = Config::default().max_domain_output_bytes)]
    domain_output_bytes: usize,
    /// Seconds after which a watch event not yet sent to an unprivileged domain is dropped.
    #[arg(long, default_value_t = Config::default().watch_event_timeout.as_secs())]
    watch_event_timeout: u64,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let config = Config {
        quotas: Quotas {
            nodes: args.quota_nodes,
            node_size: args.quota_node_size,
            watches: args.quota_watches,
            transactions: args.quota_transactions,
            node_permissions: args.quota_node_permissions,
            transaction_nodes: args.quota_transaction_nodes,
        },
        keep_orphans: args.keep_orphans,
        max_domain_connections: args.domain_connections,
        max_outstanding: args.quota_outstanding,
        max_domain_output_bytes: args.domain_output_bytes,
        watch_event_timeout: std::time::Duration::from_secs(args.watch_event_timeout),
        ..Config::default()
    };
    let server = Server::try_new(config).context("starting the server")?;
    let mut listeners = vec![server
        .listen(&args.socket, 0)
        .with_context(|| format!("listening on {}", args.socket.display()))?];
    for spec in &args.domain_sockets {
        let (domid, path) = spec
            .split_once(':')
            .with_context(|| format!("--domain-socket {spec:?}: expected DOMID:PATH"))?;
        let domid: u32 = domid
            .parse()
            .with_context(|| format!("--domain-socket {spec:?}: bad domid"))?;
        server
            .introduce_domain(domid)
            .with_context(|| format!("introducing domain {domid}"))?;
        listeners.push(
            server
                .listen(path, domid)
                .with_context(|| format!("listening on {path} for domain {domid}"))?,
        );
    }
    tracing::info!(socket = %args.socket.display(), "vrdma-xenstored serving");
    wait_for_signal()?;
    drop(listeners);
    server.shutdown();
    Ok(())
}

/// Blocks until SIGINT or SIGTERM.
fn wait_for_signal() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("signal runtime")?;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    })
    .context("waiting for a signal")?;
    tracing::info!("signal received, stopping");
    Ok(())
}
