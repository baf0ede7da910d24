//! What ships beside vrdmactl (`dist/`): the example config is the daemon's real config, and
//! the xl wrappers attach at domain creation and detach at destruction, run against the
//! simulated host with a fake `xl` that creates domains with `vrdma-simhost`.

mod daemon_common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use daemon_common::*;
use vrdma_backend::config::Config;
use xenstore_proto::client::NodeOps;

fn dist(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../dist")
        .join(name)
}

#[test]
fn example_config_is_the_daemons_defaults() {
    let text = std::fs::read_to_string(dist("backend.toml")).unwrap();
    assert_eq!(
        Config::parse(&text, "dist/backend.toml").unwrap(),
        Config::default()
    );
}

#[test]
fn service_unit_starts_the_daemon_after_xenstore() {
    let unit = std::fs::read_to_string(dist("vrdma-backend.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/sbin/vrdma-backend"), "{unit}");
    let after = unit.lines().find(|l| l.starts_with("After=")).unwrap();
    assert!(after.contains("xenstored.service"), "{after}");
    assert!(after.contains("xen.service"), "{after}");
}

/// The simulated host's CLI (built with the workspace; `VRDMA_SIMHOST_BIN` overrides).
fn simhost_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("VRDMA_SIMHOST_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    let mut dir = exe.parent().unwrap().to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let p = dir.join("vrdma-simhost");
    assert!(
        p.exists(),
        "vrdma-simhost is not at {} — build it first (`cargo build -p xen-platform`, or run \
         the whole workspace's tests), or set VRDMA_SIMHOST_BIN",
        p.display()
    );
    p
}

const FAKE_XL: &str = r#"#!/bin/sh
# A fake xl for the tests: domains are the simulated host's.
set -eu
cmd=$1; shift
case $cmd in
create)
    [ "$1" = -p ] && shift
    name=$(sed -n 's/^name *= *"\(.*\)"/\1/p' "$1")
    "$SIMHOST" domain create --name "$name" >/dev/null
    echo "create $name" >> "$XL_LOG" ;;
domid)
    id=$("$SIMHOST" domain list | awk -v n="$1" '$1 == n { print $2 }')
    [ -n "$id" ] || { echo "no domain $1" >&2; exit 1; }
    echo "$id" ;;
unpause)
    echo "unpause $1 devices: $("$VRDMACTL" list "$1" | tail -n +2 | wc -l)" >> "$XL_LOG" ;;
destroy)
    "$SIMHOST" domain destroy "$1"; echo "destroy $1" >> "$XL_LOG" ;;
shutdown)
    [ "$1" = -w ] && shift
    "$SIMHOST" domain destroy "$1"; echo "shutdown $1" >> "$XL_LOG" ;;
*) echo "fake xl: $cmd not supported" >&2; exit 1 ;;
esac
"#;

struct Env {
    tmp: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let xl = tmp.path().join("xl");
        std::fs::write(&xl, FAKE_XL).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&xl, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(
            tmp.path().join("guest.cfg"),
            "name = \"guest-a\"\nmemory = 512\n",
        )
        .unwrap();
        Env { tmp }
    }

    fn run(&self, s: &Stack, script: &str, args: &[&str]) -> Output {
        Command::new(dist(script))
            .args(args)
            .env("XL", self.tmp.path().join("xl"))
            .env("VRDMACTL", env!("CARGO_BIN_EXE_vrdmactl"))
            .env("SIMHOST", simhost_bin())
            .env("XL_LOG", self.tmp.path().join("xl.log"))
            .env("VRDMA_SIM", s.host.dir())
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    }

    fn cfg(&self) -> String {
        self.tmp.path().join("guest.cfg").display().to_string()
    }

    fn log(&self) -> Vec<String> {
        std::fs::read_to_string(self.tmp.path().join("xl.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

fn domid_of(s: &Stack, name: &str) -> Option<u32> {
    s.dom0
        .directory("/local/domain")
        .unwrap()
        .iter()
        .filter_map(|d| d.parse::<u32>().ok())
        .find(|d| {
            s.dom0
                .read_opt(&format!("/local/domain/{d}/name"))
                .unwrap()
                .as_deref()
                == Some(name.as_bytes())
        })
}

#[test]
fn xl_wrappers_attach_before_unpause_and_detach_before_destroy() {
    let s = Stack::start();
    let env = Env::new();
    let out = env.run(&s, "xl-vrdma-create", &["--max-qps", "7", "--", &env.cfg()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = domid_of(&s, "guest-a").expect("the domain was created");
    assert_eq!(
        s.dom0.read_string(&s.backend_node(d, "max-qps")).unwrap(),
        "7"
    );
    assert_eq!(
        s.dom0.read_string(&s.backend_node(d, "state")).unwrap(),
        "2"
    );
    // Unpaused only once the device was there.
    assert_eq!(
        env.log(),
        vec![
            "create guest-a".to_owned(),
            format!("unpause {d} devices: 1")
        ]
    );

    let out = env.run(&s, "xl-vrdma-destroy", &["guest-a"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(env.log().last().unwrap(), &format!("destroy {d}"));
    assert_eq!(domid_of(&s, "guest-a"), None);
    assert!(!s
        .dom0
        .exists(&format!("/local/domain/0/backend/vrdma/{d}"))
        .unwrap());
}

#[test]
fn xl_create_wrapper_destroys_the_domain_when_attach_fails() {
    let mut s = Stack::start();
    s.stop_daemon();
    let env = Env::new();
    let out = env.run(
        &s,
        "xl-vrdma-create",
        &["--timeout", "0.3", "--", &env.cfg()],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no backend answered"), "{err}");
    assert!(err.contains("destroying it"), "{err}");
    let log = env.log();
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(log[1].starts_with("destroy "), "{log:?}");
    assert_eq!(domid_of(&s, "guest-a"), None);
}
