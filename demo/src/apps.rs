//! `vrdma-demo --apps`: Debian's unmodified verbs programs between the demo's two guests
//! (issue 14) — `ibv_rc_pingpong -g 0`, `rping`, `ib_send_lat` and `ib_write_bw` — each run
//! through `vrdma-exec` (libvrdma_verbs.so preloaded, docs/verbs.md), their output printed.
//! Installs nothing: when a tool is absent it names the Debian packages to install.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use xen_platform::DomId;

use crate::lab::{step, Guest, Lab};

/// The tools `--apps` runs and the Debian package of each.
pub const TOOLS: [(&str, &str); 4] = [
    ("ibv_rc_pingpong", "ibverbs-utils"),
    ("rping", "rdmacm-utils"),
    ("ib_send_lat", "perftest"),
    ("ib_write_bw", "perftest"),
];

/// How long one program may run.
const RUN: Duration = Duration::from_secs(120);

/// The packages (deduplicated, in order) of the tools in `TOOLS` not found on `path`.
pub fn missing_packages(path: Option<&std::ffi::OsStr>) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for (tool, pkg) in TOOLS {
        let found = path.is_some_and(|p| std::env::split_paths(p).any(|d| d.join(tool).is_file()));
        if !found && !out.contains(&pkg) {
            out.push(pkg);
        }
    }
    out
}

/// `vrdma-exec` next to this executable (with `libvrdma_verbs.so` beside it), or an error
/// with the command that builds them.
fn vrdma_exec() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let dir = exe.parent().context("this executable has no directory")?;
    let (bin, lib) = (dir.join("vrdma-exec"), dir.join("libvrdma_verbs.so"));
    if bin.is_file() && lib.is_file() {
        return Ok(bin);
    }
    let release = if dir.ends_with("release") {
        " --release"
    } else {
        ""
    };
    bail!(
        "no {} or {}: build them with `cargo build{release} -p vrdma-verbs`",
        bin.display(),
        lib.display()
    )
}

/// Whether a TCP socket listens on `port` (any address), from /proc/net/tcp{,6}.
fn listening(port: u16) -> bool {
    let hex = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let c: Vec<&str> = l.split_whitespace().collect();
                c.len() > 3 && c[1].ends_with(&hex) && c[3] == "0A"
            })
        })
    })
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding a loopback port")?;
    Ok(l.local_addr()?.port())
}

struct Apps<'a> {
    lab: &'a Lab,
    exec: PathBuf,
    server: DomId,
    client: DomId,
}

impl Apps<'_> {
    fn spawn(&self, d: DomId, args: &[&str]) -> Result<Guest> {
        let mut cmd = Command::new(&self.exec);
        cmd.arg("--sim")
            .arg(&self.lab.dir)
            .args(["--domain", &d.0.to_string(), "--"])
            .args(args);
        self.lab.spawn(d, cmd)
    }

    /// Server `args` in one guest, then (once `ready` says so) the client `args` + `to` in the
    /// other, a bounded number of tries while `retry` accepts the client's failure; prints
    /// both outputs; an error if either failed.
    fn pair(
        &self,
        title: &str,
        server_args: &[&str],
        client_args: &[&str],
        ready: &dyn Fn() -> bool,
        retry: &dyn Fn(&str) -> bool,
    ) -> Result<()> {
        println!("\n=== {title} ===");
        println!(
            "server, guest {}: vrdma-exec -- {}",
            self.server.0,
            server_args.join(" ")
        );
        println!(
            "client, guest {}: vrdma-exec -- {}",
            self.client.0,
            client_args.join(" ")
        );
        let mut server = self.spawn(self.server, server_args)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready() {
            if Instant::now() > deadline {
                let (_, out, err) = server.finish(Duration::from_secs(5));
                bail!("{title}: the server did not get ready:\n{out}\n{err}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut tries = 0;
        let (cok, cout, cerr) = loop {
            tries += 1;
            let r = self.spawn(self.client, client_args)?.finish(RUN);
            if r.0 || tries >= 20 || !retry(&r.2) {
                break r;
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        let (sok, sout, serr) = server.finish(if cok { RUN } else { Duration::from_secs(5) });
        for (who, out, err) in [("server", &sout, &serr), ("client", &cout, &cerr)] {
            println!("--- {who} (guest) output:");
            println!("{}", out.trim_end());
            if !err.trim().is_empty() {
                println!("--- {who} stderr:\n{}", err.trim_end());
            }
        }
        if !(cok && sok) {
            bail!("{title} failed (client ok: {cok}, server ok: {sok})");
        }
        step(&format!("{title}: both ends finished"));
        Ok(())
    }
}

/// Runs the four programs between two guests of a fresh simulated host (in `dir`, else a
/// fresh directory under /tmp).
pub fn run(dir: Option<&Path>) -> Result<()> {
    let missing = missing_packages(std::env::var_os("PATH").as_deref());
    if !missing.is_empty() {
        bail!(
            "--apps runs Debian's unmodified tools, and some are not installed: apt-get install \
             {} (tools: {})",
            missing.join(" "),
            TOOLS.map(|(t, _)| t).join(", ")
        );
    }
    let exec = vrdma_exec()?;
    let mut lab = Lab::start(dir)?;
    let server = lab.create_guest("apps-server")?;
    let client = lab.create_guest("apps-client")?;
    step(&format!(
        "unmodified verbs programs: server in domain {}, client in domain {}, through {} \
         (libvrdma_verbs.so preloaded)",
        server.0,
        client.0,
        exec.display()
    ));
    let apps = Apps {
        lab: &lab,
        exec,
        server,
        client,
    };
    let t0 = Instant::now();
    let no_retry = |_: &str| false;

    let p = free_port()?;
    let ps = p.to_string();
    let pp = ["ibv_rc_pingpong", "-g", "0", "-p", &ps, "-n", "100", "-c"];
    let mut ppc = pp.to_vec();
    ppc.push("127.0.0.1");
    apps.pair(
        "ibv_rc_pingpong -g 0 (address vectors, buffer validation on)",
        &pp,
        &ppc,
        &|| listening(p),
        &no_retry,
    )?;

    let p = free_port()?;
    let ps = p.to_string();
    apps.pair(
        "rping (librdmacm; the client verifies every string: -V)",
        &[
            "rping",
            "-s",
            "-v",
            "-C",
            "10",
            "-a",
            "127.0.0.1",
            "-p",
            &ps,
        ],
        &[
            "rping",
            "-c",
            "-v",
            "-V",
            "-C",
            "10",
            "-a",
            "127.0.0.1",
            "-p",
            &ps,
        ],
        &|| true,
        // Until the server listens its port refuses the connect: try again.
        &|err| err.contains("REJECTED") || err.contains("UNREACHABLE"),
    )?;

    for (tool, size) in [("ib_send_lat", "64"), ("ib_write_bw", "65536")] {
        let p = free_port()?;
        let ps = p.to_string();
        // `-F`: on a loaded machine perftest's cycle calibration can fail, and the tool then
        // exits 1 after its test ("Can't produce a report") unless told not to.
        let args = [tool, "-F", "-p", &ps, "-s", size, "-n", "1000"];
        let mut c = args.to_vec();
        c.push("127.0.0.1");
        apps.pair(
            &format!("perftest {tool} -s {size}"),
            &args,
            &c,
            &|| listening(p),
            &no_retry,
        )?;
    }
    step(&format!(
        "the unmodified programs ran in {:.1} s",
        t0.elapsed().as_secs_f64()
    ));
    drop(apps);
    lab.stop()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_packages_names_each_package_once() {
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            missing_packages(Some(empty.path().as_os_str())),
            ["ibverbs-utils", "rdmacm-utils", "perftest"]
        );
        assert_eq!(
            missing_packages(None),
            ["ibverbs-utils", "rdmacm-utils", "perftest"]
        );
        let some = tempfile::tempdir().unwrap();
        for t in ["ibv_rc_pingpong", "ib_send_lat", "ib_write_bw"] {
            std::fs::write(some.path().join(t), "").unwrap();
        }
        assert_eq!(
            missing_packages(Some(some.path().as_os_str())),
            ["rdmacm-utils"]
        );
    }
}
