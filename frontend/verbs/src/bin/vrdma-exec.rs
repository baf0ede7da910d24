//! `vrdma-exec [--sim DIR --domain D] [--lib PATH] -- CMD ARGS…`: runs an unmodified verbs
//! program with `libvrdma_verbs.so` preloaded, so its libibverbs calls reach the guest's vrdma
//! device. Debian's libibverbs stays loaded for what the library does not define (docs/verbs.md).
//!
//! `--sim DIR --domain D` runs it as domain D of the simulated host in DIR (the environment
//! `vrdma-simhost run` gives); without them the program runs in this domain (a Xen guest, or
//! an environment that already names a simulated domain).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

const LIB: &str = "libvrdma_verbs.so";

const USAGE: &str = "usage: vrdma-exec [--sim DIR --domain D] [--lib PATH] -- CMD [ARGS...]";

/// The library next to this executable (cargo's target dir), or in `../lib` of it (an install).
fn find_lib() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("where is vrdma-exec")?;
    let dir = exe.parent().context("vrdma-exec has no directory")?;
    let mut tried = Vec::new();
    for cand in [
        dir.join(LIB),
        dir.join("../lib").join(LIB),
        dir.join("../lib/vrdma").join(LIB),
    ] {
        if cand.exists() {
            return Ok(cand);
        }
        tried.push(cand.display().to_string());
    }
    bail!(
        "{LIB} not found (looked at {}); build it with `cargo build -p vrdma-verbs` or pass --lib",
        tried.join(", ")
    )
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut sim, mut domain, mut lib) = (None::<PathBuf>, None::<u16>, None::<PathBuf>);
    let mut cmd: Vec<String> = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--sim" => sim = Some(args.next().context("--sim needs a directory")?.into()),
            "--domain" => {
                let d = args.next().context("--domain needs a domain id")?;
                domain = Some(d.parse().with_context(|| format!("domain id {d:?}"))?);
            }
            "--lib" => lib = Some(args.next().context("--lib needs a path")?.into()),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            "--" => {
                cmd.extend(args.by_ref());
                break;
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    if cmd.is_empty() {
        bail!("no command given\n{USAGE}");
    }
    let lib = match lib {
        Some(l) => l,
        None => find_lib()?,
    };
    let lib = std::fs::canonicalize(&lib).with_context(|| format!("{}", lib.display()))?;
    let mut c = Command::new(&cmd[0]);
    c.args(&cmd[1..]);
    match (sim, domain) {
        (Some(dir), Some(d)) => {
            c.env(xen_platform::ENV_SIM_DIR, &dir)
                .env(xen_platform::ENV_SIM_DOMID, d.to_string())
                .env(
                    "XENSTORED_PATH",
                    xen_platform::sim::sock::xenstore_socket(&dir, d),
                );
        }
        (None, None) => {}
        _ => bail!("--sim and --domain go together\n{USAGE}"),
    }
    let preload = match std::env::var_os("LD_PRELOAD") {
        Some(p) if !p.is_empty() => format!("{}:{}", lib.display(), p.to_string_lossy()),
        _ => lib.display().to_string(),
    };
    c.env("LD_PRELOAD", preload);
    let err = c.exec();
    Err(err).with_context(|| format!("running {}", Path::new(&cmd[0]).display()))
}
