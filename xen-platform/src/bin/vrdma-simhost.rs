//! `vrdma-simhost`: the simulated Xen host. It plays the hypervisor (grant tables, event
//! channels) and, with XenStore, the toolstack's view of domains, for processes on one machine.

use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use xen_platform::sim::{peer, sock, SimControl, SimHost, SimHostConfig, DEFAULT_MAX_GRANTS};
use xen_platform::{DomId, ENV_SIM_DIR, ENV_SIM_DOMID};

#[derive(Parser)]
#[command(
    version,
    about = "Simulated Xen host for vrdma: domains, grants, event channels, XenStore"
)]
struct Cli {
    /// The host's directory (its sockets live there).
    #[arg(long, global = true, env = ENV_SIM_DIR)]
    dir: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve a simulated host in --dir until killed (dom0 is created at start).
    Serve {
        /// Grant limit of each domain unless `domain create --max-grants` says otherwise.
        #[arg(long, default_value_t = DEFAULT_MAX_GRANTS)]
        max_grants: u32,
    },
    /// Create, destroy and list domains.
    Domain {
        #[command(subcommand)]
        cmd: DomainCmd,
    },
    /// Run a command inside domain ID (it talks to that domain's XenStore and hypercall
    /// sockets, through XENSTORED_PATH, VRDMA_SIM and VRDMA_SIM_DOMID).
    Run {
        /// The domain.
        id: u16,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// (internal) Wait for the host to adopt this process, then run the command as its child.
    #[command(name = "__gate", hide = true)]
    Gate {
        /// The gate pipe's read end.
        fd: i32,
        /// The command.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

#[derive(Subcommand)]
enum DomainCmd {
    /// Create a domain and print its id.
    Create {
        /// Its name (default sim-guest-ID).
        #[arg(long)]
        name: Option<String>,
        /// Its grant limit (default: the host's).
        #[arg(long)]
        max_grants: Option<u32>,
    },
    /// Destroy a domain: kill its processes, release what it held.
    Destroy {
        /// The domain.
        id: u16,
    },
    /// List domains.
    List,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vrdma-simhost: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    if let Cmd::Gate { fd, command } = &cli.cmd {
        return gate(*fd, command);
    }
    let dir = cli
        .dir
        .context("no host directory: pass --dir DIR or set VRDMA_SIM=DIR")?;
    match cli.cmd {
        Cmd::Serve { max_grants } => {
            let host = SimHost::start(SimHostConfig {
                dir: dir.clone(),
                default_max_grants: max_grants,
            })
            .with_context(|| format!("starting a simulated host in {}", dir.display()))?;
            println!("vrdma-simhost: serving {}", host.dir().display());
            loop {
                std::thread::park();
            }
        }
        Cmd::Domain { cmd } => {
            let ctl = SimControl::connect(&dir)?;
            match cmd {
                DomainCmd::Create { name, max_grants } => {
                    let id =
                        ctl.create_domain(name.as_deref().unwrap_or(""), max_grants.unwrap_or(0))?;
                    println!("{id}");
                }
                DomainCmd::Destroy { id } => ctl.destroy_domain(DomId(id))?,
                DomainCmd::List => {
                    println!(
                        "{:<24} {:>5} {:>7} {:>10} {:>8} {:>5} {:>5} {:>5}",
                        "Name", "ID", "grants", "max-grants", "mappings", "ports", "conns", "procs"
                    );
                    for d in ctl.list()? {
                        println!(
                            "{:<24} {:>5} {:>7} {:>10} {:>8} {:>5} {:>5} {:>5}",
                            d.name,
                            d.domid,
                            d.grants,
                            d.max_grants,
                            d.mappings,
                            d.ports,
                            d.connections,
                            d.processes
                        );
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run { id, command } => run_in_domain(&dir, id, &command),
        Cmd::Gate { .. } => unreachable!("handled above"),
    }
}

/// Start `command` in its own process group, held at a gate until the host has adopted it into
/// the domain (so a destroy cannot miss it), then wait for it and exit as it did. The gate is
/// this program re-executed (`__gate`): it is the adopted process, waits on a pipe, then runs the
/// command as its child (see [`gate`]).
fn run_in_domain(dir: &std::path::Path, id: u16, command: &[String]) -> Result<ExitCode> {
    let dir = std::path::absolute(dir)?;
    let ctl = SimControl::connect(&dir)?;
    if !ctl.list()?.iter().any(|d| d.domid == id) {
        bail!("no domain {id} on the host at {}", dir.display());
    }
    // The read end is inherited by the gate; the write end stays here.
    let (gate_r, gate_w) = rustix::pipe::pipe().context("pipe")?;
    rustix::io::fcntl_setfd(&gate_w, rustix::io::FdFlags::CLOEXEC).context("fcntl")?;
    let me = std::env::current_exe().context("finding this program")?;
    let mut cmd = Command::new(me);
    cmd.arg("__gate")
        .arg(gate_r.as_raw_fd().to_string())
        .arg("--")
        .args(command)
        .env(ENV_SIM_DIR, &dir)
        .env(ENV_SIM_DOMID, id.to_string())
        .env("XENSTORED_PATH", sock::xenstore_socket(&dir, id))
        .process_group(0);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {:?}", command[0]))?;
    drop(gate_r);
    if let Err(e) = ctl.adopt(DomId(id), child.id()) {
        drop(gate_w);
        let _ = child.kill();
        let _ = child.wait();
        return Err(e).context(format!("putting the process into domain {id}"));
    }
    // A child that already died leaves EPIPE here; its status tells the story.
    let _ = rustix::io::write(&gate_w, &[1]);
    drop(gate_w);
    let status = child.wait().context("waiting for the command")?;
    drop(ctl);
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c as u8),
        (None, Some(sig)) => {
            eprintln!("vrdma-simhost: command killed by signal {sig}");
            ExitCode::from(128u8.wrapping_add(sig as u8))
        }
        _ => ExitCode::from(1),
    })
}

fn gate(fd: i32, command: &[String]) -> Result<ExitCode> {
    // SAFETY: `fd` is the pipe read end our parent passed on purpose; we take ownership once.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut b = [0u8; 1];
    loop {
        match rustix::io::read(&fd, &mut b) {
            Err(rustix::io::Errno::INTR) => continue,
            Ok(1) => break,
            _ => bail!("the simulated host did not adopt this process; not running it"),
        }
    }
    drop(fd);
    // Orphans of the domain are re-parented here rather than to init, so they stay descendants
    // of the adopted process — the host's test of which domain a process is in.
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .context("becoming the domain's child subreaper")?;
    let child = Command::new(&command[0])
        .args(&command[1..])
        .spawn()
        .with_context(|| format!("starting {:?}", command[0]))?;
    let child = rustix::process::Pid::from_child(&child);
    // Reap orphans as they die, until the command itself exits.
    let status = loop {
        match rustix::process::wait(rustix::process::WaitOptions::empty()) {
            Ok(Some((pid, st))) if pid == child => break st,
            Ok(_) | Err(rustix::io::Errno::INTR) => continue,
            Err(e) => bail!("waiting for the command: {e}"),
        }
    };
    // The domain's processes live no longer than its command: none is left to outlive this
    // gate and so leave the domain.
    kill_descendants();
    Ok(match (status.exit_status(), status.terminating_signal()) {
        (Some(c), _) => ExitCode::from(c as u8),
        (None, Some(sig)) => {
            eprintln!("vrdma-simhost: command killed by signal {sig}");
            ExitCode::from(128u8.wrapping_add(sig as u8))
        }
        _ => ExitCode::from(1),
    })
}

/// SIGKILL every descendant of this process and reap them (as a subreaper, the orphans of
/// killed ones come back here, so repeat until none is left).
fn kill_descendants() {
    use rustix::process::{kill_process, wait, Pid, Signal, WaitOptions};
    let me = std::process::id();
    for _ in 0..1000 {
        let left: Vec<u32> = peer::descendants(&peer::process_tree(), &[me])
            .into_iter()
            .filter(|&p| p != me)
            .collect();
        if left.is_empty() {
            break;
        }
        for p in left {
            if let Some(pid) = Pid::from_raw(p as i32) {
                let _ = kill_process(pid, Signal::KILL);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        // `wait`, not `waitpid(None)`: orphans in other process groups are ours to reap too.
        while let Ok(Some(_)) = wait(WaitOptions::NOHANG) {}
    }
}
