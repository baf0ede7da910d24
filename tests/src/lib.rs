//! Helpers shared by the end-to-end tests in `tests/tests/`: a simulated Xen host embedded in
//! the test process (grants, event channels and XenStore), the vrdma backend serving it, and
//! guest processes (`vrdma-guest`) running in simulated domains, driven line by line.
//!
//! [`Lab`] is one such host; [`TwoHosts`] is two of them side by side on this machine, whose
//! backends have their own loopback addresses (127.0.0.2 and 127.0.0.3), for the inter-host
//! tests; [`proxy`] is a TCP proxy that resets, stalls or corrupts a connection between them.
//!
//! An inter-host test, once guests can connect across hosts (the `vrdma-guest` commands for
//! listen/connect-to come with that API):
//!
//! ```text
//! let hosts = TwoHosts::start();                         // A: 127.0.0.2, B: 127.0.0.3
//! let (mut a, mut b) = hosts.guests(GUEST.as_ref(), "bypass");
//! // b listens on a port of 127.0.0.3; a proxy in front of it cuts the connection after 1 MiB
//! // of a's traffic (the MPA request counts), still at 127.0.0.3 for a's backend:
//! let proxy = Proxy::in_front_of("127.0.0.3:PORT".parse()?, Fault::ResetAfter(1 << 20), Dir::ToTarget)?;
//! // a connects to proxy.addr(); its WRITEs fail with flush errors, both get a disconnect event;
//! hosts.a.stats(a.domid) / hosts.b.stats(b.domid) drain to zero.
//! ```
//!
//! Nothing here skips: when something the tests need is missing (the backend binary, a
//! domain), the helpers panic with a sentence saying what to do.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use vrdma_backend::resources::{Quotas, Resource};
use vrdma_backend::toolstack::attach_device;
use xen_platform::sim::{sock, SimControl, SimHost, SimHostConfig};
use xen_platform::{DomId, ENV_SIM_DIR, ENV_SIM_DOMID};
use xenstore_proto::client::Client;

pub mod pcap;
pub mod procstat;
pub mod proxy;

/// How long one guest command may take before the test calls it a hang.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// Environment variable naming the backend binary (default: `vrdma-backend` next to the test
/// executable's target directory).
pub const BACKEND_BIN_ENV: &str = "VRDMA_BACKEND_BIN";

/// A simulated host with the vrdma backend running as dom0.
pub struct Lab {
    pub host: SimHost,
    pub dom0: Client,
    backend: Option<Child>,
    config: PathBuf,
    name: String,
    address: Option<IpAddr>,
    address_in_config: bool,
    _tmp: tempfile::TempDir,
}

/// Host A of the two simulated hosts: its backend's address.
pub const HOST_A_ADDR: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// Host B of the two simulated hosts: its backend's address.
pub const HOST_B_ADDR: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));

/// The backend configuration key naming the address(es) its device listens and connects
/// from (DESIGN §12: each simulated host gets its own loopback address).
pub const ADDRESS_KEY: &str = "address";

/// The forms of the [`ADDRESS_KEY`] line tried, in order: a list (`address = ["127.0.0.2"]`,
/// the backend's form), then a single string.
fn address_forms(a: IpAddr) -> [String; 2] {
    [
        format!("{ADDRESS_KEY} = [\"{a}\"]"),
        format!("{ADDRESS_KEY} = \"{a}\""),
    ]
}

/// The [`ADDRESS_KEY`] line this build's backend takes for `a`, or `None` if its
/// configuration has no such key: asked of the backend's own parser, so the harness passes the
/// address as soon as the key exists, and never writes a key an older backend would refuse
/// (its configuration denies unknown keys, and a refused configuration stops the daemon).
/// Panics if the key exists but refuses every known form, so a change of form fails the tests
/// instead of silently leaving the address out.
pub fn address_line(a: IpAddr) -> Option<String> {
    address_line_with(a, |text| {
        vrdma_backend::config::Config::parse(text, "probe")
            .map(drop)
            .map_err(|e| e.to_string())
    })
}

/// [`address_line`] with this configuration parser.
fn address_line_with(a: IpAddr, parse: impl Fn(&str) -> Result<(), String>) -> Option<String> {
    let mut refusals = Vec::new();
    for line in address_forms(a) {
        match parse(&format!("{line}\n")) {
            Ok(()) => return Some(line),
            Err(e) if e.contains(&format!("unknown field `{ADDRESS_KEY}`")) => return None,
            Err(e) => refusals.push(format!("{line:?}: {e}")),
        }
    }
    panic!(
        "the backend configuration has an `{ADDRESS_KEY}` key but refuses every form the \
         harness knows ({}) — teach vrdma_tests::address_forms its form",
        refusals.join("; ")
    )
}

#[cfg(test)]
mod address_tests {
    use super::*;

    #[test]
    fn the_address_line_is_the_first_form_the_backend_takes() {
        let list = |t: &str| {
            if t.contains('[') {
                Ok(())
            } else {
                Err("invalid type: string, expected a sequence".to_string())
            }
        };
        assert_eq!(
            address_line_with(HOST_B_ADDR, list).as_deref(),
            Some("address = [\"127.0.0.3\"]")
        );
        let string = |t: &str| {
            if t.contains('[') {
                Err("invalid type: sequence, expected a string".to_string())
            } else {
                Ok(())
            }
        };
        assert_eq!(
            address_line_with(HOST_B_ADDR, string).as_deref(),
            Some("address = \"127.0.0.3\"")
        );
        let older = |_: &str| Err("unknown field `address`, expected one of `log-level`".into());
        assert_eq!(address_line_with(HOST_B_ADDR, older), None);
    }

    #[test]
    #[should_panic(expected = "refuses every form the harness knows")]
    fn an_address_key_of_another_form_fails_loudly() {
        address_line_with(
            HOST_A_ADDR,
            |_| Err("invalid type: expected a table".into()),
        );
    }

    #[test]
    fn the_config_gets_the_line_first_unless_it_sets_the_address_itself() {
        let (text, _) = config_with_address("[quotas]\nmax-qps = 2\n", Some(HOST_A_ADDR));
        assert!(text.ends_with("[quotas]\nmax-qps = 2\n"), "{text}");
        assert_eq!(
            text.starts_with("address"),
            backend_takes_address(),
            "{text}"
        );
        let own = "address = [\"127.0.0.9\"]\n";
        assert_eq!(
            config_with_address(own, Some(HOST_A_ADDR)),
            (own.to_string(), true)
        );
        assert_eq!(config_with_address("", None), (String::new(), false));
    }
}

/// Whether this build's backend configuration has the [`ADDRESS_KEY`] key.
pub fn backend_takes_address() -> bool {
    address_line(HOST_A_ADDR).is_some()
}

/// The configuration text of a backend at `address`: `config` with the [`ADDRESS_KEY`] line
/// first (top-level keys precede tables in TOML) when the backend has the key and `config`
/// does not set it already; whether the address line is in.
pub fn config_with_address(config: &str, address: Option<IpAddr>) -> (String, bool) {
    let sets_it = config.lines().any(|l| {
        l.trim_start()
            .strip_prefix(ADDRESS_KEY)
            .is_some_and(|r| r.trim_start().starts_with('='))
    });
    match address.filter(|_| !sets_it).and_then(address_line) {
        Some(line) => (format!("{line}\n{config}"), true),
        None => (config.to_string(), sets_it),
    }
}

/// Where cargo put the binaries of this build (`target/<profile>`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("exe dir");
    if dir.ends_with("deps") {
        dir.parent().expect("profile dir").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// The backend binary, or a panic saying how to build it.
pub fn backend_bin() -> PathBuf {
    if let Some(p) = std::env::var_os(BACKEND_BIN_ENV) {
        return p.into();
    }
    let p = bin_dir().join("vrdma-backend");
    assert!(
        p.exists(),
        "the vrdma-backend binary is not at {} — build it first (`cargo build -p vrdma-backend`, \
         or run the whole workspace's tests), or set {BACKEND_BIN_ENV}",
        p.display()
    );
    p
}

impl Lab {
    /// Starts a host in a fresh directory and the backend as dom0.
    pub fn start() -> Lab {
        Lab::start_with_config("")
    }

    /// [`Lab::start`] with a backend configuration file of this TOML text (docs/backend.md).
    pub fn start_with_config(config: &str) -> Lab {
        Lab::start_host("e2e", None, config)
    }

    /// A complete simulated host named `name` (its own directory, hypervisor, XenStore and
    /// backend process) whose backend has `address` (through the [`ADDRESS_KEY`]
    /// configuration key when the backend has it, see [`config_with_address`]; the address is
    /// kept here either way, [`Lab::address`]). Several run side by side on one machine:
    /// nothing of one host is at a fixed path, port or name ([`TwoHosts`]).
    pub fn start_host(name: &str, address: Option<IpAddr>, config: &str) -> Lab {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("vrdma-{name}-"))
            .tempdir()
            .expect("tempdir");
        let host = SimHost::start(SimHostConfig::new(tmp.path().join("host")))
            .unwrap_or_else(|e| panic!("start simulated host {name}: {e}"));
        let dom0 = Client::connect(sock::xenstore_socket(host.dir(), 0)).expect("dom0 xenstore");
        let cfg = tmp.path().join("backend.toml");
        let (text, address_in_config) = config_with_address(config, address);
        std::fs::write(&cfg, text).expect("write the backend config");
        let mut lab = Lab {
            host,
            dom0,
            backend: None,
            config: cfg,
            name: name.to_string(),
            address,
            address_in_config,
            _tmp: tmp,
        };
        lab.start_backend();
        lab
    }

    /// The host's name (in its directory's name and in panics).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address of the host's backend, if it was given one.
    pub fn address(&self) -> Option<IpAddr> {
        self.address
    }

    /// Whether the backend's configuration file names its address (see [`config_with_address`]).
    pub fn address_in_config(&self) -> bool {
        self.address_in_config
    }

    /// The backend's configuration file.
    pub fn config_path(&self) -> &Path {
        &self.config
    }

    fn domain_env(&self, cmd: &mut Command, domid: DomId) {
        cmd.env(ENV_SIM_DIR, self.host.dir())
            .env(ENV_SIM_DOMID, domid.0.to_string())
            .env(
                "XENSTORED_PATH",
                sock::xenstore_socket(self.host.dir(), domid.0),
            );
    }

    fn start_backend(&mut self) {
        let mut cmd = Command::new(backend_bin());
        self.domain_env(&mut cmd, DomId(0));
        cmd.arg("--config").arg(&self.config);
        cmd.stdin(Stdio::null());
        let child = cmd.spawn().expect("spawn vrdma-backend");
        self.backend = Some(child);
    }

    /// Kills the backend process with SIGKILL (no cleanup of any kind) and reaps it.
    pub fn kill_backend(&mut self) {
        let mut c = self.backend.take().expect("the backend is running");
        c.kill().expect("SIGKILL the backend");
        c.wait().expect("reap the backend");
    }

    /// Starts a new backend process (after [`Lab::kill_backend`]), with the same configuration.
    pub fn restart_backend(&mut self) {
        assert!(self.backend.is_none(), "a backend is still running");
        self.start_backend();
    }

    /// The backend process's id (while it runs).
    pub fn backend_pid(&self) -> Option<u32> {
        self.backend.as_ref().map(Child::id)
    }

    /// Whether the backend process is still running.
    pub fn backend_alive(&mut self) -> bool {
        match &mut self.backend {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// A new guest domain.
    pub fn create_guest(&self, name: &str) -> DomId {
        self.host
            .create_domain(Some(name), None)
            .expect("create a domain")
    }

    /// The backend's device directory of `domid`'s device 0.
    pub fn back_dir(&self, domid: DomId) -> String {
        format!("/local/domain/0/backend/vrdma/{}/0", domid.0)
    }

    /// Attaches device 0 to `domid` with the backend's toolstack code
    /// (`vrdma_backend::toolstack::attach_device`: one transaction, libxl's permissions), with
    /// quota overrides such as `("max-qps", "2")` on top of the defaults.
    pub fn attach(&self, domid: DomId, quotas: &[(&str, &str)]) {
        let mut q = Quotas::default();
        for (k, v) in quotas {
            let r = Resource::ALL
                .into_iter()
                .find(|r| r.quota_key() == *k)
                .unwrap_or_else(|| panic!("{k} is not a quota"));
            q.set(r, v.parse().unwrap_or_else(|_| panic!("{k} = {v:?}")));
        }
        attach_device(&self.dom0, u32::from(domid.0), 0, 0, &q).expect("attach the device");
    }

    /// A command running `exe` in `domid` (the simulated domain's environment set), for guest
    /// programs other than `vrdma-guest` (e.g. `vrdma-rping`).
    pub fn command_in(&self, exe: &Path, domid: DomId) -> Command {
        let mut cmd = Command::new(exe);
        self.domain_env(&mut cmd, domid);
        cmd
    }

    /// Starts `vrdma-guest` (at `exe`) in `domid`, adopted by the host so a domain destroy
    /// kills it.
    pub fn spawn_guest(&self, exe: &Path, domid: DomId) -> Guest {
        let mut cmd = Command::new(exe);
        self.domain_env(&mut cmd, domid);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn vrdma-guest");
        if let Ok(ctl) = SimControl::connect(self.host.dir()) {
            let _ = ctl.adopt(domid, child.id());
        }
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Guest {
            child,
            stdin,
            lines: rx,
            domid,
            host: match self.address {
                Some(a) => format!("{} ({a})", self.name),
                None => self.name.clone(),
            },
        }
    }

    /// A XenStore node as dom0 reads it, `None` when it does not exist (yet).
    pub fn read(&self, path: &str) -> Option<String> {
        self.dom0.read_string(path).ok()
    }

    /// A new domain named `name` with device 0 attached (default quotas) and `vrdma-guest` (at
    /// `exe`) running in it with its device open in `mode` (`bypass` or `mediated`).
    pub fn start_guest(&self, exe: &Path, name: &str, mode: &str) -> Guest {
        let d = self.create_guest(name);
        self.attach(d, &[]);
        let mut g = self.spawn_guest(exe, d);
        g.cmd(&format!("open {mode}"));
        g
    }

    /// The numeric nodes under the backend's stats node of the domain's device 0
    /// (`/local/domain/0/vrdma-stats/<D>/0`),
    /// as (name, value).
    pub fn stats(&self, domid: DomId) -> Vec<(String, u64)> {
        let dir = vrdma_backend::xenbus::device_stats_path(
            0,
            vrdma_backend::xenbus::DeviceId {
                domid: u32::from(domid.0),
                devid: 0,
            },
        );
        let names = self.dom0.directory(&dir).unwrap_or_default();
        names
            .into_iter()
            .filter_map(|n| {
                let v = self.dom0.read_string(&format!("{dir}/{n}")).ok()?;
                Some((n, v.trim().parse().ok()?))
            })
            .collect()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut c) = self.backend.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A `vrdma-guest` process in a simulated domain.
pub struct Guest {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    pub domid: DomId,
    /// The host it runs on, for messages: its name and address (`host-a (127.0.0.2)`); two
    /// hosts number their guests alike.
    pub host: String,
}

impl Guest {
    /// Sends one command; `Ok(rest)` for `ok rest`, `Err(message)` for `err message`.
    pub fn try_cmd(&mut self, line: &str) -> Result<String, String> {
        writeln!(self.stdin, "{line}")
            .and_then(|_| self.stdin.flush())
            .unwrap_or_else(|e| panic!("guest in domain {} is gone: {e}", self.domid));
        self.read_reply(line)
    }

    fn read_reply(&mut self, line: &str) -> Result<String, String> {
        let reply = self
            .lines
            .recv_timeout(COMMAND_TIMEOUT)
            .unwrap_or_else(|e| {
                panic!("guest in domain {}: no answer to {line:?}: {e}", self.domid)
            });
        if let Some(rest) = reply.strip_prefix("ok") {
            Ok(rest.trim().to_string())
        } else if let Some(rest) = reply.strip_prefix("err") {
            Err(rest.trim().to_string())
        } else {
            panic!("guest in domain {}: unexpected line {reply:?}", self.domid)
        }
    }

    /// Sends one command that must succeed; returns what follows `ok`.
    pub fn cmd(&mut self, line: &str) -> String {
        match self.try_cmd(line) {
            Ok(s) => s,
            Err(e) => panic!("guest in domain {}: {line:?} failed: {e}", self.domid),
        }
    }

    /// Sends a command without waiting for its answer.
    pub fn send_only(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write to guest");
        self.stdin.flush().expect("flush");
    }

    /// Waits for the next reply line (after [`Guest::send_only`]).
    pub fn reply(&mut self) -> Result<String, String> {
        self.read_reply("(previous command)")
    }

    /// Parses a `poll`/`wait` answer into work completions.
    pub fn completions(reply: &str) -> Vec<Wc> {
        reply
            .split(';')
            .filter(|s| !s.is_empty())
            .map(|s| {
                let f: Vec<&str> = s.split(',').collect();
                Wc {
                    wr_id: f[0].parse().unwrap(),
                    status: f[1].to_string(),
                    opcode: f[2].to_string(),
                    byte_len: f[3].parse().unwrap(),
                    imm: f[4].parse().ok(),
                }
            })
            .collect()
    }

    /// Kills the process (SIGKILL: no polite close).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Asks the guest to exit (closing its channel politely) and waits for it.
    pub fn exit(mut self) -> std::process::ExitStatus {
        let _ = writeln!(self.stdin, "exit");
        let _ = self.stdin.flush();
        let _ = self.lines.recv_timeout(COMMAND_TIMEOUT);
        wait_timeout(&mut self.child, COMMAND_TIMEOUT)
    }
}

fn wait_timeout(child: &mut Child, t: Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + t;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            return child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = writeln!(self.stdin, "exit");
            let _ = self.stdin.flush();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A work completion as `vrdma-guest` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wc {
    pub wr_id: u64,
    pub status: String,
    pub opcode: String,
    pub byte_len: u32,
    pub imm: Option<u32>,
}

impl Wc {
    pub fn ok(&self) -> bool {
        self.status == "Success"
    }
}

/// Two complete simulated hosts on this machine, A and B: each its own directory, simulated
/// hypervisor, XenStore and backend process, the backends at [`HOST_A_ADDR`] (127.0.0.2) and
/// [`HOST_B_ADDR`] (127.0.0.3). Guests run on either host with [`Lab::spawn_guest`] on
/// `hosts.a` or `hosts.b`. Dropping it stops both (backends killed, hosts stopped, directories
/// removed).
pub struct TwoHosts {
    pub a: Lab,
    pub b: Lab,
}

impl TwoHosts {
    /// Both hosts with the default backend configuration.
    pub fn start() -> TwoHosts {
        TwoHosts::start_with_config("")
    }

    /// Both hosts, each backend with this configuration text (plus its address).
    pub fn start_with_config(config: &str) -> TwoHosts {
        TwoHosts {
            a: Lab::start_host("host-a", Some(HOST_A_ADDR), config),
            b: Lab::start_host("host-b", Some(HOST_B_ADDR), config),
        }
    }

    /// Both hosts, A then B.
    pub fn both(&mut self) -> [&mut Lab; 2] {
        [&mut self.a, &mut self.b]
    }

    /// A guest on each host (domains named `a` and `b`, see [`Lab::start_guest`]): the two
    /// ends of an inter-host test.
    pub fn guests(&self, exe: &Path, mode: &str) -> (Guest, Guest) {
        (
            self.a.start_guest(exe, "a", mode),
            self.b.start_guest(exe, "b", mode),
        )
    }
}
