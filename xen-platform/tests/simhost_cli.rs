//! `vrdma-simhost` as a user runs it: serve, domain create/list/destroy, run, Xen's C XenStore
//! tools inside a domain, and two processes in two domains playing ping-pong.

#[path = "common/pingpong.rs"]
mod pingpong;

mod served;

use served::{Served, BIN};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

impl Served {
    fn cmd(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env(xen_platform::ENV_SIM_DIR, self.dir.path())
            .env_remove(xen_platform::ENV_SIM_DOMID);
        c
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd().args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }
}

fn need_tool(name: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "TEST DID NOT RUN: {name} is not installed (apt-get install xenstore-utils; \
         scripts/test-all.sh installs it)"
    );
}

#[test]
fn domains_are_created_listed_and_destroyed() {
    let s = Served::start();
    let id = s.ok(&["domain", "create", "--name", "alpha"]);
    assert_eq!(id.trim(), "1");
    let id2 = s.ok(&["domain", "create"]);
    assert_eq!(id2.trim(), "2");
    let list = s.ok(&["domain", "list"]);
    assert!(
        list.contains("Domain-0") && list.contains("alpha") && list.contains("sim-guest-2"),
        "{list}"
    );
    // Names are unique, dom0 stays, unknown domains are errors.
    assert!(!s
        .run(&["domain", "create", "--name", "alpha"])
        .status
        .success());
    let out = s.run(&["domain", "destroy", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be destroyed"));
    assert!(!s.run(&["domain", "destroy", "9"]).status.success());
    s.ok(&["domain", "destroy", "1"]);
    let list = s.ok(&["domain", "list"]);
    assert!(!list.contains("alpha"), "{list}");
    assert!(!s.dir().join("domains/1").exists());
}

#[test]
fn a_missing_host_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["domain", "list", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("vrdma-simhost serve"), "{err}");
    let out = Command::new(BIN)
        .args(["domain", "list"])
        .env_remove(xen_platform::ENV_SIM_DIR)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("VRDMA_SIM"));
}

#[test]
fn run_puts_the_process_in_the_domain() {
    let s = Served::start();
    s.ok(&["domain", "create"]);
    let out = s.ok(&[
        "run",
        "1",
        "--",
        "sh",
        "-c",
        "echo $VRDMA_SIM_DOMID $XENSTORED_PATH",
    ]);
    let want = format!("1 {}", s.dir().join("domains/1/xenstored.sock").display());
    assert_eq!(out.trim(), want);
    // The exit status comes through.
    let out = s.run(&["run", "1", "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    assert!(!s.run(&["run", "5", "--", "true"]).status.success());
}

#[test]
fn xen_c_tools_inside_a_domain_act_as_that_domain() {
    need_tool("xenstore-read");
    let s = Served::start();
    s.ok(&["domain", "create", "--name", "guest-a"]);
    assert_eq!(
        s.ok(&["run", "1", "--", "xenstore-read", "name"]).trim(),
        "guest-a"
    );
    assert_eq!(
        s.ok(&["run", "1", "--", "xenstore-read", "domid"]).trim(),
        "1"
    );
    // The guest may not read dom0's nodes, nor write its own name.
    let out = s.run(&["run", "1", "--", "xenstore-read", "/local/domain/0/name"]);
    assert!(!out.status.success(), "guest read dom0's name");
    let out = s.run(&["run", "1", "--", "xenstore-write", "name", "evil"]);
    assert!(!out.status.success(), "guest wrote its name");
    s.ok(&["run", "1", "--", "xenstore-write", "data/x", "1"]);
    // dom0 may read everything, and sees the permissions xl sets.
    assert_eq!(
        s.ok(&["run", "0", "--", "xenstore-read", "/local/domain/1/data/x"])
            .trim(),
        "1"
    );
    let perms = s.ok(&["run", "0", "--", "xenstore-ls", "-p", "/local/domain/1"]);
    assert!(
        perms.contains("name = \"guest-a\"") && perms.contains("(n0,r1)"),
        "{perms}"
    );
    assert!(
        perms.contains("data = \"\"") && perms.contains("(n1)"),
        "{perms}"
    );
}

#[test]
fn destroy_kills_the_domains_processes() {
    let s = Served::start();
    s.ok(&["domain", "create"]);
    let mut sleeper = s
        .cmd()
        .args(["run", "1", "--", "sleep", "1000"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the host has adopted it (the list says so), then destroy.
    let mut adopted = false;
    for _ in 0..2000 {
        let list = s.ok(&["domain", "list"]);
        let row = list
            .lines()
            .find(|l| l.contains("sim-guest-1"))
            .unwrap()
            .to_string();
        if row.split_whitespace().last() == Some("1") {
            adopted = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(adopted, "the run never showed up in domain list");
    s.ok(&["domain", "destroy", "1"]);
    let st = sleeper.wait().unwrap();
    assert_eq!(st.code(), Some(128 + 9), "{st:?}");
}

const ROLE: &str = "XP_CLI_ROLE";

/// A ping-pong side, in a child that `role_in_domain` started inside a domain.
fn play_pingpong(role: &str) {
    let file = PathBuf::from(std::env::var("XP_CLI_FILE").unwrap());
    let r = match role {
        "offer" => pingpong::offer(
            xen_platform::DomId(std::env::var("XP_CLI_PEER").unwrap().parse().unwrap()),
            &file,
            1000,
        ),
        "map" => pingpong::map(&file, 1000),
        other => Err(format!("unknown role {other}")),
    };
    r.unwrap();
}

/// Runs this binary in `domid` through `vrdma-simhost run`, running only the ping-pong test,
/// which plays `role` there.
fn role_in_domain(s: &Served, domid: &str, role: &str, file: &Path, peer: &str) -> Child {
    s.cmd()
        .args(["run", domid, "--"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "two_processes_in_two_domains_ping_pong",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env("XP_CLI_FILE", file)
        .env("XP_CLI_PEER", peer)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn two_processes_in_two_domains_ping_pong() {
    // The two sides are this test, re-run inside the domains with `XP_CLI_ROLE` set.
    if let Ok(role) = std::env::var(ROLE) {
        return play_pingpong(&role);
    }
    let s = Served::start();
    let a = s
        .ok(&["domain", "create", "--name", "front"])
        .trim()
        .to_string();
    let b = s
        .ok(&["domain", "create", "--name", "back"])
        .trim()
        .to_string();
    let file = s.dir().join("offer.txt");
    let offer = role_in_domain(&s, &a, "offer", &file, &b);
    let map = role_in_domain(&s, &b, "map", &file, &a);
    let mo = map.wait_with_output().unwrap();
    let oo = offer.wait_with_output().unwrap();
    let (ms, os) = (
        String::from_utf8_lossy(&mo.stdout),
        String::from_utf8_lossy(&oo.stdout),
    );
    assert!(
        mo.status.success() && oo.status.success(),
        "map: {ms}\noffer: {os}"
    );
    assert!(ms.contains("MAP: 1000 rounds done, counter 2000"), "{ms}");
    assert!(os.contains("OFFER: 1000 rounds done"), "{os}");
}

#[test]
fn a_second_host_on_the_same_dir_is_refused_and_a_dead_ones_leftovers_are_cleaned() {
    let mut s = Served::start();
    s.ok(&["domain", "create"]);
    let out = Command::new(BIN)
        .args(["serve", "--dir"])
        .arg(s.dir())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already serves"));
    // Kill the host: its sockets stay behind; a new host replaces them.
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    assert!(s.dir().join("domains/1/hypercall.sock").exists());
    let dir = std::mem::replace(&mut s.dir, tempfile::tempdir().unwrap());
    let s2 = Served::start_in(dir);
    assert!(!s2.dir().join("domains/1").exists());
    assert_eq!(s2.ok(&["domain", "create"]).trim(), "1");
}
