//! Xen's own XenStore conformance program, `test-xenstore` (Debian `xen-utils-4.17`,
//! `/usr/lib/xen-4.17/bin/test-xenstore`, built on libxenstore 4.17), run against the
//! `vrdma-xenstored` binary through `XENSTORED_PATH`: every one of its tests must pass, as dom0
//! and as a domU in its own home.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use xenstore_proto::client::Client;
use xenstore_proto::wire::{Perm, PermKind, Perms};

/// The program; fails loudly when the package is missing.
fn test_xenstore() -> PathBuf {
    let p = Path::new("/usr/lib/xen-4.17/bin/test-xenstore");
    if p.exists() {
        return p.to_path_buf();
    }
    panic!(
        "{} not found: install xen-utils-4.17 (apt-get install --no-install-recommends \
         xen-utils-4.17; scripts/test-all.sh does)",
        p.display()
    );
}

/// The names of the program's tests (`--list-tests`), so a run that skips one is noticed.
fn test_names(prog: &Path) -> Vec<String> {
    let out = Command::new(prog).arg("--list-tests").output().unwrap();
    assert!(out.status.success(), "test-xenstore --list-tests failed");
    let names: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once(':').map(|(n, _)| n.trim().to_owned()))
        .collect();
    assert!(names.len() >= 12, "expected its 12 tests: {names:?}");
    names
}

/// `vrdma-xenstored` on a dom0 socket and a socket of domain 5; killed on drop.
struct Daemon {
    child: Child,
    dir: tempfile::TempDir,
}

impl Daemon {
    fn start() -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_vrdma-xenstored"))
            .arg("--socket")
            .arg(dir.path().join("dom0"))
            .arg("--domain-socket")
            .arg(format!("5:{}", dir.path().join("dom5").display()))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut log = BufReader::new(child.stderr.take().unwrap()).lines();
        loop {
            let line = log.next().expect("daemon exited early").unwrap();
            if line.contains("vrdma-xenstored serving") {
                break;
            }
        }
        // Keep draining its log so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in log {});
        Daemon { child, dir }
    }

    fn socket(&self, domid: u32) -> PathBuf {
        self.dir.path().join(format!("dom{domid}"))
    }

    /// Runs test-xenstore as `domid` with `args`; asserts every test passed and returns its
    /// output.
    fn run(&self, domid: u32, args: &[&str]) -> String {
        let prog = test_xenstore();
        let names = test_names(&prog);
        let out = Command::new(&prog)
            .args(args)
            .env("XENSTORED_PATH", self.socket(domid))
            .env_remove("XENSTORE_DOMAIN_INTERFACE")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "test-xenstore {args:?} as dom{domid} failed ({}):\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        for name in &names {
            let line = stdout
                .lines()
                .find(|l| l.split_once(':').is_some_and(|(n, _)| n.trim() == name))
                .unwrap_or_else(|| panic!("test {name:?} did not run:\n{stdout}"));
            assert!(!line.contains("failed"), "{line}");
        }
        assert!(
            !stdout.contains("Exhaustive transaction retries"),
            "transactions kept conflicting:\n{stdout}"
        );
        stdout
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn test_xenstore_passes_in_full_as_dom0() {
    let d = Daemon::start();
    d.run(0, &[]);
    // Repeated, each test several times in a row on the same store.
    d.run(0, &["--iterations", "5"]);
    // It cleaned up after itself.
    let dom0 = Client::connect(d.socket(0)).unwrap();
    assert!(!dom0.exists("/local/domain/0/xenstore-test").unwrap());
}

#[test]
fn test_xenstore_passes_in_full_as_a_domu_under_its_quotas() {
    let d = Daemon::start();
    // The toolstack gives domain 5 its home, as for any guest.
    let dom0 = Client::connect(d.socket(0)).unwrap();
    dom0.mkdir("/local/domain/5").unwrap();
    dom0.set_perms(
        "/local/domain/5",
        &Perms(vec![
            Perm::new(PermKind::None, 5),
            Perm::new(PermKind::Read, 0),
        ]),
    )
    .unwrap();
    d.run(5, &[]);
    d.run(5, &["--iterations", "5"]);
    assert!(!dom0.exists("/local/domain/5/xenstore-test").unwrap());
    assert_eq!(
        dom0.read("/local/domain/5").unwrap(),
        b"",
        "the home is untouched"
    );
}
