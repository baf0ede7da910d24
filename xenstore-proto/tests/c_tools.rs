//! Xen's C client tools (Debian `xenstore-utils`, libxenstore 4.17) against the embedded
//! server, pointed at it with `XENSTORED_PATH`: they must behave as against xenstored.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use xenstore_proto::server::{Config, Listener, Server};

/// Path of a C tool; fails loudly when the package is missing.
fn tool(name: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/sbin", "/usr/local/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} not found: install xenstore-utils (apt-get install xenstore-utils)");
}

struct Host {
    server: Server,
    dir: tempfile::TempDir,
    _listeners: Vec<Listener>,
}

impl Host {
    /// A server with a dom0 socket and one socket per listed domain.
    fn new(domus: &[u32]) -> Host {
        let server = Server::new(Config::default());
        let dir = tempfile::tempdir().unwrap();
        let mut listeners = vec![server.listen(dir.path().join("dom0"), 0).unwrap()];
        for &d in domus {
            server.introduce_domain(d).unwrap();
            listeners.push(
                server
                    .listen(dir.path().join(format!("dom{d}")), d)
                    .unwrap(),
            );
        }
        Host {
            server,
            dir,
            _listeners: listeners,
        }
    }

    fn socket(&self, domid: u32) -> PathBuf {
        self.dir.path().join(format!("dom{domid}"))
    }

    fn cmd(&self, domid: u32, name: &str) -> Command {
        let mut c = Command::new(tool(name));
        c.env("XENSTORED_PATH", self.socket(domid));
        c.env_remove("XENSTORE_DOMAIN_INTERFACE");
        c
    }

    fn run(&self, domid: u32, name: &str, args: &[&str]) -> Output {
        self.cmd(domid, name).args(args).output().unwrap()
    }

    /// Runs a tool that must succeed; returns its stdout.
    fn ok(&self, domid: u32, name: &str, args: &[&str]) -> String {
        let out = self.run(domid, name, args);
        assert!(
            out.status.success(),
            "{name} {args:?} as dom{domid} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.server.shutdown();
    }
}

#[test]
fn write_read_exists_list_rm() {
    let h = Host::new(&[]);
    h.ok(0, "xenstore-write", &["/vm/a", "hello", "/vm/b", "world"]);
    assert_eq!(h.ok(0, "xenstore-read", &["/vm/a"]), "hello\n");
    assert_eq!(
        h.ok(0, "xenstore-read", &["/vm/a", "/vm/b"]),
        "hello\nworld\n"
    );
    assert_eq!(h.ok(0, "xenstore-list", &["/vm"]), "a\nb\n");
    h.ok(0, "xenstore-exists", &["/vm/a"]);
    assert!(!h.run(0, "xenstore-exists", &["/vm/none"]).status.success());
    let missing = h.run(0, "xenstore-read", &["/vm/none"]);
    assert!(!missing.status.success());
    h.ok(0, "xenstore-rm", &["/vm/a"]);
    assert_eq!(h.ok(0, "xenstore-list", &["/vm"]), "b\n");
    h.ok(0, "xenstore-rm", &["/vm"]);
    assert!(!h.run(0, "xenstore-exists", &["/vm"]).status.success());
    // Relative paths are under /local/domain/0.
    h.ok(0, "xenstore-write", &["name", "Domain-0"]);
    assert_eq!(
        h.ok(0, "xenstore-read", &["/local/domain/0/name"]),
        "Domain-0\n"
    );
}

#[test]
fn ls_shows_tree_and_permissions() {
    let h = Host::new(&[]);
    h.ok(0, "xenstore-write", &["/t/x", "1", "/t/y/z", "2"]);
    h.ok(0, "xenstore-chmod", &["/t/x", "n0", "r3"]);
    let ls = h.ok(0, "xenstore-ls", &["/t"]);
    assert_eq!(ls, "x = \"1\"\ny = \"\"\n z = \"2\"\n");
    let lsp = h.ok(0, "xenstore-ls", &["-p", "/t"]);
    let xline = lsp.lines().next().unwrap();
    assert!(
        xline.starts_with("x = \"1\"") && xline.ends_with("(n0,r3)"),
        "{lsp}"
    );
}

#[test]
fn domu_is_refused_what_it_may_not_read() {
    let h = Host::new(&[5]);
    h.ok(0, "xenstore-write", &["/secret", "s3cr3t", "/public", "p"]);
    h.ok(0, "xenstore-chmod", &["/public", "n0", "r5"]);
    assert_eq!(h.ok(5, "xenstore-read", &["/public"]), "p\n");
    let refused = h.run(5, "xenstore-read", &["/secret"]);
    assert!(!refused.status.success(), "domU read /secret");
    assert!(refused.stdout.is_empty());
    assert!(!h
        .run(5, "xenstore-write", &["/public", "changed"])
        .status
        .success());
    assert_eq!(h.ok(0, "xenstore-read", &["/public"]), "p\n");
    // Its own home, prepared by the toolstack, with relative paths.
    h.ok(0, "xenstore-write", &["/local/domain/5", ""]);
    h.ok(0, "xenstore-chmod", &["/local/domain/5", "n5"]);
    h.ok(5, "xenstore-write", &["data/key", "v"]);
    assert_eq!(h.ok(5, "xenstore-read", &["data/key"]), "v\n");
    assert_eq!(
        h.ok(0, "xenstore-read", &["/local/domain/5/data/key"]),
        "v\n"
    );
    // The domU may not hand its node to someone else.
    assert!(!h
        .run(5, "xenstore-chmod", &["data/key", "n0"])
        .status
        .success());
}

#[test]
fn ls_of_a_directory_larger_than_one_message() {
    let h = Host::new(&[]);
    let names: Vec<String> = (0..300)
        .map(|i| format!("a-rather-long-child-name-{i:04}"))
        .collect();
    let total: usize = names.iter().map(|n| n.len() + 1).sum();
    assert!(
        total > 4096,
        "children list must exceed XENSTORE_PAYLOAD_MAX"
    );
    let mut args = Vec::new();
    for n in &names {
        args.push(format!("/big/{n}"));
        args.push("v".to_owned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    h.ok(0, "xenstore-write", &args);
    let list = h.ok(0, "xenstore-list", &["/big"]);
    assert_eq!(list.lines().collect::<Vec<_>>(), names);
    let ls = h.ok(0, "xenstore-ls", &["/big"]);
    let expected: Vec<String> = names.iter().map(|n| format!("{n} = \"v\"")).collect();
    assert_eq!(ls.lines().collect::<Vec<_>>(), expected);
}

#[test]
fn watch_reports_initial_and_later_events() {
    let h = Host::new(&[]);
    h.ok(0, "xenstore-write", &["/w", ""]);
    let mut child = h
        .cmd(0, "xenstore-watch")
        .args(["-n", "3", "/w"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // The first event fires as soon as the watch is set: then it is safe to write.
    assert_eq!(lines.next().unwrap().unwrap(), "/w");
    h.ok(0, "xenstore-write", &["/w/a", "1"]);
    assert_eq!(lines.next().unwrap().unwrap(), "/w/a");
    h.ok(0, "xenstore-rm", &["/w"]);
    assert_eq!(lines.next().unwrap().unwrap(), "/w");
    assert!(child.wait().unwrap().success(), "-n 3 exits after 3 events");
}

#[test]
fn watch_n1_exits_after_the_initial_event() {
    let h = Host::new(&[]);
    let out = h.run(0, "xenstore-watch", &["-n", "1", "/anything"]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "/anything\n");
}

#[test]
fn chmod_recursive_and_get_perms() {
    let h = Host::new(&[2]);
    h.ok(0, "xenstore-write", &["/r/a/b", "x"]);
    h.ok(0, "xenstore-chmod", &["-r", "/r", "n0", "b2"]);
    assert_eq!(h.ok(2, "xenstore-read", &["/r/a/b"]), "x\n");
    h.ok(2, "xenstore-write", &["/r/a/b", "y"]);
    assert_eq!(h.ok(0, "xenstore-read", &["/r/a/b"]), "y\n");
}

#[test]
fn the_binary_serves_the_c_tools() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("sock");
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_vrdma-xenstored"))
        .arg("--socket")
        .arg(&sock)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the "serving" log line: the socket is bound by then.
    let mut log = BufReader::new(daemon.stderr.take().unwrap()).lines();
    loop {
        let line = log.next().expect("daemon exited early").unwrap();
        if line.contains("vrdma-xenstored serving") {
            break;
        }
    }
    let run = |name: &str, args: &[&str]| {
        Command::new(tool(name))
            .args(args)
            .env("XENSTORED_PATH", &sock)
            .output()
            .unwrap()
    };
    assert!(run("xenstore-write", &["/k", "v"]).status.success());
    assert_eq!(run("xenstore-read", &["/k"]).stdout, b"v\n");
    // Stop it as an init system would.
    let pid = daemon.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    assert!(daemon.wait().unwrap().success(), "clean exit on SIGTERM");
}
