//! `vrdma-rping` (rping's ping-pong on vrdma's connection manager) between two simulated
//! hosts: the server in a domain of host B (127.0.0.3), the client in a domain of host A
//! (127.0.0.2), over the backends' iWARP connection. The same program runs in the Xen lab
//! against stock `rping` on Linux siw (tests/xen-lab/scenarios/siw).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use vrdma_tests::{Lab, TwoHosts, HOST_B_ADDR};
use xen_platform::DomId;

const RPING: &str = env!("CARGO_BIN_EXE_vrdma-rping");
/// A whole rping run may take this long before the test calls it a hang.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// A running `vrdma-rping`: its stdout lines as they come, stderr read at the end.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
    what: String,
}

fn spawn(lab: &Lab, domid: DomId, args: &[&str]) -> Proc {
    let mut cmd = lab.command_in(Path::new(RPING), domid);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn vrdma-rping");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Proc {
        child,
        lines: rx,
        what: format!("vrdma-rping {}", args.join(" ")),
    }
}

impl Proc {
    /// The next stdout line (within `RUN_LIMIT`).
    fn line(&mut self) -> String {
        match self.lines.recv_timeout(RUN_LIMIT) {
            Ok(l) => l,
            Err(e) => {
                let _ = self.child.kill();
                let out = self.finish();
                panic!("{}: no output line ({e}); {out:?}", self.what)
            }
        }
    }

    /// Waits (bounded) for the exit: (success, stdout lines not read yet, stderr).
    fn finish(&mut self) -> (bool, Vec<String>, String) {
        let deadline = Instant::now() + RUN_LIMIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("{}: still running after {RUN_LIMIT:?}", self.what);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let mut out = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            out.push(l);
        }
        (status.success(), out, err)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A domain with device 0 attached on `lab`.
fn domain(lab: &Lab, name: &str) -> DomId {
    let d = lab.create_guest(name);
    lab.attach(d, &[]);
    d
}

/// A server on host B listening on a port its backend picks; its address.
fn serve(hosts: &TwoHosts, d: DomId, args: &[&str]) -> (Proc, String) {
    let mut all = vec!["-s", "-p", "0"];
    all.extend_from_slice(args);
    let mut s = spawn(&hosts.b, d, &all);
    let l = s.line();
    let addr = l
        .strip_prefix("vrdma-rping: listening on ")
        .unwrap_or_else(|| panic!("server's first line: {l:?}"))
        .to_string();
    assert!(
        addr.starts_with(&format!("{HOST_B_ADDR}:")),
        "host B's server listens on {addr}"
    );
    (s, addr)
}

/// The ping data rping's client prints for ping `i` of `size` bytes (its pattern without
/// the final NUL).
fn rping_line(i: usize, size: usize) -> String {
    let mut s = format!("rdma-ping-{i}: ");
    let mut c = 65 + (i % 58) as u8;
    while s.len() < size - 1 {
        s.push(c as char);
        c = if c >= 122 { 65 } else { c + 1 };
    }
    s
}

/// Client on host A against a server on host B: `count` pings of `size` bytes, validated
/// and printed on both ends; both exit 0 and print every ping's data.
fn ping(hosts: &TwoHosts, da: DomId, db: DomId, mode: &str, size: usize, count: usize) {
    let (sz, n) = (size.to_string(), count.to_string());
    let common = ["-v", "-V", "-m", mode, "-S", &sz, "-C", &n];
    let (mut s, addr) = serve(hosts, db, &common);
    let (ip, port) = addr.rsplit_once(':').expect("addr:port");
    let mut args = vec!["-c", "-a", ip, "-p", port];
    args.extend_from_slice(&common);
    let mut c = spawn(&hosts.a, da, &args);
    let (c_ok, c_out, c_err) = c.finish();
    let (s_ok, s_out, s_err) = s.finish();
    let ctx =
        format!("{mode} {size} B x {count}\nclient: {c_out:?} {c_err}\nserver: {s_out:?} {s_err}");
    assert!(c_ok && s_ok, "both exit 0: {ctx}");
    let want: Vec<String> = (0..count).map(|i| rping_line(i, size)).collect();
    let client_data: Vec<&str> = c_out
        .iter()
        .filter_map(|l| l.strip_prefix("ping data: "))
        .collect();
    let server_data: Vec<&str> = s_out
        .iter()
        .filter_map(|l| l.strip_prefix("server ping data: "))
        .collect();
    assert_eq!(client_data, want, "{ctx}");
    assert_eq!(server_data, want, "{ctx}");
    assert!(
        c_err.contains(&format!("client: {count} pings, data verified")),
        "{ctx}"
    );
    assert!(
        s_err.contains(&format!(
            "server: {count} pings, client disconnected, data verified"
        )),
        "{ctx}"
    );
}

/// rping's ping-pong between guests on two hosts, MPA CRC on (vrdma's default between vrdma
/// hosts) and off (both backends `crc = "decline"`, as siw by default), bypass and mediated
/// channels, rping's smallest, default and largest sizes.
#[test]
fn vrdma_rping_between_two_hosts_with_and_without_crc() {
    for config in ["", "[cm]\ncrc = \"decline\"\n"] {
        let hosts = TwoHosts::start_with_config(config);
        let da = domain(&hosts.a, "a");
        let db = domain(&hosts.b, "b");
        ping(&hosts, da, db, "bypass", 64, 5);
        ping(&hosts, da, db, "mediated", 26, 3);
        ping(&hosts, da, db, "bypass", 65_535, 2);
    }
}

/// The server checks its count (rping's does not): a client that leaves after 3 of 5 pings
/// fails it; a client whose server is not there fails with the reason.
#[test]
fn vrdma_rping_reports_a_short_run_and_an_absent_server() {
    let hosts = TwoHosts::start();
    let da = domain(&hosts.a, "a");
    let db = domain(&hosts.b, "b");
    let (mut s, addr) = serve(&hosts, db, &["-V", "-C", "5"]);
    let (ip, port) = addr.rsplit_once(':').unwrap();
    let mut c = spawn(&hosts.a, da, &["-c", "-a", ip, "-p", port, "-V", "-C", "3"]);
    let (c_ok, _, c_err) = c.finish();
    let (s_ok, _, s_err) = s.finish();
    assert!(c_ok, "the client did its 3 pings: {c_err}");
    assert!(!s_ok, "the server wanted 5: {s_err}");
    assert!(
        s_err.contains("the client left after 3 of 5 pings"),
        "{s_err}"
    );

    // Nobody listens on that port any more.
    let mut c = spawn(
        &hosts.a,
        da,
        &["-c", "-a", ip, "-p", port, "-C", "1", "-t", "20"],
    );
    let (c_ok, _, c_err) = c.finish();
    assert!(!c_ok, "a connect to no listener fails");
    assert!(c_err.contains(&format!("connect to {addr}")), "{c_err}");
}
