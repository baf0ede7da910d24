//! A guest can only hurt itself: a process started in domain D by `vrdma-simhost run` tries to
//! act as dom0 or as another domain — through their XenStore and hypercall sockets and through
//! the host's control socket — and is refused with a clear error, while the legitimate users
//! (processes of the domain itself, the host's user) still work.

mod served;

use served::{Served, BIN};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use xen_platform::sim::{sock, SimControl};
use xen_platform::xenstore_proto::client::Client;
use xen_platform::{Access, DomId, Platform, PlatformKind};

const ACTIONS: &str = "XP_ISOLATION_ACTIONS";

impl Served {
    fn create(&self) -> DomId {
        SimControl::connect(self.dir())
            .unwrap()
            .create_domain("", 0)
            .unwrap()
    }

    /// Runs `actions` (see [`attack`]) in `domid` through `vrdma-simhost run`, as this binary
    /// running only `test`, which plays the attacker there ([`attacker`]); one output line per
    /// action.
    fn attack(&self, test: &str, domid: DomId, actions: &str) -> Vec<String> {
        let out = Command::new(BIN)
            .env(xen_platform::ENV_SIM_DIR, self.dir())
            .args(["run", &domid.0.to_string(), "--"])
            .arg(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(ACTIONS, actions)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{actions}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<String> = stdout
            .lines()
            .filter_map(|l| l.find("ACTION ").map(|at| l[at..].to_string()))
            .collect();
        assert_eq!(lines.len(), actions.split(',').count(), "{stdout}");
        lines
    }
}

fn assert_refused(line: &str, why: &str) {
    assert!(
        line.contains("=> refused:") && line.contains(why),
        "expected a refusal saying {why:?}, got {line:?}"
    );
}

fn assert_allowed(line: &str) {
    assert!(line.contains("=> ok:"), "expected success, got {line:?}");
}

/// In a child that [`Served::attack`] started (the calling test, re-run with
/// `XP_ISOLATION_ACTIONS` set): plays the attacker and returns true. Else false.
fn attacker() -> bool {
    match std::env::var(ACTIONS) {
        Ok(actions) => {
            attack(&actions);
            true
        }
        Err(_) => false,
    }
}

/// What a process inside a domain tries, from `actions` (comma-separated): `xs:<domid>` reads
/// `/local/domain/<domid>/name` on `<domid>`'s XenStore socket; `grant:<domid>` grants a page
/// to dom0 through `<domid>`'s hypercall socket; `destroy:<domid>`, `create`,
/// `adopt:<domid>:<pid>` use the control socket. One line per action.
fn attack(actions: &str) {
    let dir = PathBuf::from(std::env::var(xen_platform::ENV_SIM_DIR).unwrap());
    for action in actions.split(',') {
        let parts: Vec<&str> = action.split(':').collect();
        let dom = |i: usize| DomId(parts[i].parse().unwrap());
        let result: Result<String, String> = match parts[0] {
            "xs" => Client::connect(sock::xenstore_socket(&dir, dom(1).0))
                .map_err(|e| e.to_string())
                .and_then(|c| {
                    c.read_string(&format!("/local/domain/{}/name", dom(1).0))
                        .map_err(|e| e.to_string())
                }),
            "grant" => Platform::open(PlatformKind::Sim {
                dir: dir.clone(),
                domid: dom(1),
            })
            .and_then(|p| p.share_pages(DomId(0), 1, Access::ReadWrite))
            .map(|s| format!("gref {}", s.grant_refs()[0].0))
            .map_err(|e| e.to_string()),
            "destroy" => SimControl::connect(&dir)
                .and_then(|c| c.destroy_domain(dom(1)))
                .map(|()| "destroyed".to_string())
                .map_err(|e| e.to_string()),
            "create" => SimControl::connect(&dir)
                .and_then(|c| c.create_domain("", 0))
                .map(|d| format!("created {d}"))
                .map_err(|e| e.to_string()),
            "adopt" => SimControl::connect(&dir)
                .and_then(|c| c.adopt(dom(1), parts[2].parse().unwrap()))
                .map(|()| "adopted".to_string())
                .map_err(|e| e.to_string()),
            other => Err(format!("unknown action {other}")),
        };
        match result {
            Ok(r) => println!("ACTION {action} => ok: {r}"),
            Err(e) => println!("ACTION {action} => refused: {e}"),
        }
    }
}

#[test]
fn a_domain_process_cannot_use_dom0s_xenstore_socket() {
    if attacker() {
        return;
    }
    let s = Served::start();
    let d = s.create();
    let r = s.attack(
        "a_domain_process_cannot_use_dom0s_xenstore_socket",
        d,
        &format!("xs:0,xs:{}", d.0),
    );
    assert_refused(&r[0], "EACCES");
    assert!(r[1].ends_with("=> ok: sim-guest-1"), "{}", r[1]);
    // dom0 itself still reads its own node.
    let dom0 = Client::connect(sock::xenstore_socket(&s.dir(), 0)).unwrap();
    assert_eq!(
        dom0.read_string("/local/domain/0/name").unwrap(),
        "Domain-0"
    );
}

#[test]
fn a_domain_process_cannot_use_another_domains_sockets() {
    if attacker() {
        return;
    }
    let s = Served::start();
    let d1 = s.create();
    let d2 = s.create();
    let r = s.attack(
        "a_domain_process_cannot_use_another_domains_sockets",
        d1,
        &format!("xs:{},grant:{},grant:0,grant:{}", d2.0, d2.0, d1.0),
    );
    assert_refused(&r[0], "EACCES");
    assert_refused(
        &r[1],
        "belongs to domain 1: it may not use domain 2's hypercall socket",
    );
    assert_refused(
        &r[2],
        "belongs to domain 1: it may not use domain 0's hypercall socket",
    );
    assert_allowed(&r[3]);
    // Domain 2's own process still uses its sockets.
    let r = s.attack(
        "a_domain_process_cannot_use_another_domains_sockets",
        d2,
        &format!("xs:{},grant:{}", d2.0, d2.0),
    );
    assert!(r[0].ends_with("=> ok: sim-guest-2"), "{}", r[0]);
    assert_allowed(&r[1]);
}

#[test]
fn a_domain_process_cannot_create_or_destroy_domains() {
    if attacker() {
        return;
    }
    let s = Served::start();
    let d1 = s.create();
    let d2 = s.create();
    let r = s.attack(
        "a_domain_process_cannot_create_or_destroy_domains",
        d1,
        &format!("destroy:{},create", d2.0),
    );
    for line in &r {
        assert_refused(line, "a domain cannot use the host's control socket");
    }
    let ctl = SimControl::connect(s.dir()).unwrap();
    let ids: Vec<u16> = ctl.list().unwrap().iter().map(|d| d.domid).collect();
    assert_eq!(ids, [0, 1, 2]);
    // The host's user still can.
    ctl.destroy_domain(d2).unwrap();
    assert_eq!(ctl.list().unwrap().len(), 2);
}

/// A process of the host's user, in its own process group; killed when dropped.
struct Sleeper(Child);

impl Sleeper {
    fn start() -> Sleeper {
        use std::os::unix::process::CommandExt;
        Sleeper(
            Command::new("sleep")
                .arg("1000")
                .process_group(0)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    fn alive(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn adopting_a_process_that_is_not_ones_own_child_is_refused() {
    if attacker() {
        return;
    }
    let s = Served::start();
    let d1 = s.create();
    let d2 = s.create();
    // A process of the host's user, in its own process group: a domain process tries to get
    // it killed by having it adopted into a domain that is then destroyed.
    let mut victim = Sleeper::start();
    let r = s.attack(
        "adopting_a_process_that_is_not_ones_own_child_is_refused",
        d1,
        &format!("adopt:{}:{}", d2.0, victim.0.id()),
    );
    assert_refused(&r[0], "a domain cannot use the host's control socket");
    let ctl = SimControl::connect(s.dir()).unwrap();
    ctl.destroy_domain(d2).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(victim.alive(), "the domain's destroy killed the victim");

    // The host's user cannot adopt a process that is not its own child either.
    let parent = rustix::process::getppid().unwrap().as_raw_nonzero().get() as u32;
    let err = ctl.adopt(d1, parent).unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "process {parent} is not a child or descendant of the adopting process"
        )),
        "{err}"
    );
    // Nor the host process (here a child of ours).
    let err = SimControl::connect(s.dir())
        .unwrap()
        .adopt(d1, s.child.id())
        .unwrap_err()
        .to_string();
    assert!(err.contains("runs the simulated host"), "{err}");

    // Its own child: adopted, and a destroy kills it.
    let ctl = SimControl::connect(s.dir()).unwrap();
    ctl.adopt(d1, victim.0.id()).unwrap();
    ctl.destroy_domain(d1).unwrap();
    let st = victim.0.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&st),
        Some(9),
        "{st:?}"
    );
}

/// Whether `pid` runs (exists and is not a zombie).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rfind(')')
            .is_some_and(|at| !s[at + 1..].trim_start().starts_with('Z'))
    })
}

/// Kills `pid` if it still runs (a failed test must not leave processes behind).
fn reap(pid: u32) {
    if running(pid) {
        if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
}

fn wait_gone(pid: u32) -> bool {
    for _ in 0..400 {
        if !running(pid) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    false
}

#[test]
fn a_daemonized_process_stays_in_its_domain() {
    if attacker() {
        return;
    }
    let s = Served::start();
    let d = s.create();
    let out = s.dir().join("daemon.out");
    // `( cmd & )`: the subshell exits at once, so `cmd` is an orphan in a new session — what a
    // daemon is — and then tries dom0's XenStore.
    let script = r#"(setsid "$0" --exact a_daemonized_process_stays_in_its_domain --nocapture --test-threads=1 >"$1" 2>&1 &)
        i=0
        while ! grep -q ACTION "$1" 2>/dev/null && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done"#;
    let st = Command::new(BIN)
        .env(xen_platform::ENV_SIM_DIR, s.dir())
        .env(ACTIONS, "xs:0")
        .args(["run", &d.0.to_string(), "--", "sh", "-c", script])
        .arg(std::env::current_exe().unwrap())
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success(), "{st:?}");
    let text = std::fs::read_to_string(&out).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.find("ACTION ").map(|at| &l[at..]))
        .unwrap_or_else(|| panic!("the daemon printed no result: {text}"));
    assert_refused(line, "EACCES");
}

#[test]
fn a_domains_processes_live_no_longer_than_its_command_or_the_domain() {
    let s = Served::start();
    let d = s.create();
    // A background process left behind when the command exits is killed with it.
    let out = Command::new(BIN)
        .env(xen_platform::ENV_SIM_DIR, s.dir())
        .args(["run", &d.0.to_string(), "--", "sh", "-c"])
        .arg("sleep 1000 >/dev/null 2>&1 & echo $!")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let left: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let gone = wait_gone(left);
    reap(left);
    assert!(gone, "process {left} outlived its command");

    // A daemon of a running command (own session, orphaned) dies with the domain.
    let pidfile = s.dir().join("daemon.pid");
    let mut run = Command::new(BIN)
        .env(xen_platform::ENV_SIM_DIR, s.dir())
        .args(["run", &d.0.to_string(), "--", "sh", "-c"])
        .arg(r#"(setsid sleep 1000 >/dev/null 2>&1 & echo $! >"$0.tmp"; mv "$0.tmp" "$0"); sleep 1000"#)
        .arg(&pidfile)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut daemon = None;
    for _ in 0..1000 {
        if let Ok(t) = std::fs::read_to_string(&pidfile) {
            daemon = t.trim().parse::<u32>().ok();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let daemon = daemon.expect("the command never wrote its daemon's pid");
    assert!(running(daemon));
    SimControl::connect(s.dir())
        .unwrap()
        .destroy_domain(d)
        .unwrap();
    let st = run.wait().unwrap();
    let gone = wait_gone(daemon);
    reap(daemon);
    assert!(gone, "the daemon {daemon} outlived its domain");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&st).or(st.code().map(|c| c - 128)),
        Some(9),
        "{st:?}"
    );
}

#[test]
fn a_process_of_another_user_is_refused_even_where_the_files_let_it_in() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    assert!(
        rustix::process::geteuid().is_root(),
        "TEST DID NOT RUN: starting a process of another uid needs root (CI runs as root)"
    );
    let s = Served::start();
    // The filesystem no longer stops the other user; the host must.
    std::fs::set_permissions(s.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        sock::control_socket(&s.dir()),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    // A copy of the binary the other user can reach (the build tree may sit under a 0700
    // directory, as a checkout in `mktemp -d` does).
    let bin_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(bin_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = bin_dir.path().join("vrdma-simhost");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&bin)
        .uid(65534)
        .gid(65534)
        .args(["domain", "list", "--dir"])
        .arg(s.dir())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        err.contains("runs as uid 65534; this simulated host serves only its own user"),
        "{err}"
    );
    // Root (the host's user here) still can.
    assert_eq!(
        SimControl::connect(s.dir()).unwrap().list().unwrap().len(),
        1
    );
}
