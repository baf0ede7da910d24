//! The symbol versions of libvrdma_verbs.so are libibverbs.so.1's: every symbol of
//! `exports.txt` is exported by the built library as `name@@VERSION`, and Debian's
//! libibverbs.so.1 (rdma-core 44) exports the same name with the same default version.
//! A program linked against Debian's library asks for exactly those; a wrong version would
//! bind it to Debian's function with this library's objects (a crash).
//!
//! The same holds for librdmacm's calls (`RDMACM_1.x`) against Debian's librdmacm.so.1.
//!
//! Needs `objdump` (binutils), `libibverbs1` and `librdmacm1` (scripts/host-packages.txt).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const LIBIBVERBS: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";
const LIBRDMACM: &str = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";

/// Default-version dynamic symbols of `lib`: name → version (`objdump -T`, lines whose
/// version is not parenthesized, i.e. not hidden).
fn exports(lib: &Path) -> BTreeMap<String, String> {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(lib)
        .output()
        .unwrap_or_else(|e| panic!("objdump (binutils) is needed: {e}"));
    assert!(out.status.success(), "objdump -T {} failed", lib.display());
    let mut m = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 4 || !line.contains(" DF ") || line.contains("*UND*") {
            continue;
        }
        let (ver, name) = (cols[cols.len() - 2], cols[cols.len() - 1]);
        if ver.starts_with('(') {
            continue;
        }
        m.insert(name.to_string(), ver.to_string());
    }
    m
}

fn built_lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let mut dir = exe.parent().unwrap().to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "vrdma-verbs", "--lib"]);
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    if let Some(target) = dir.parent() {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    assert!(
        cmd.status().unwrap().success(),
        "cargo build -p vrdma-verbs --lib"
    );
    dir.join("libvrdma_verbs.so")
}

#[test]
fn symbol_versions_are_libibverbs_ones() {
    let list =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("exports.txt")).unwrap();
    let wanted: Vec<(&str, &str)> = list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split_once(' ').expect("`name VERSION`"))
        .collect();
    assert!(wanted.len() > 50, "exports.txt lists the entry points");
    let ours = exports(&built_lib());
    let debian = exports(Path::new(LIBIBVERBS));
    let debian_cm = exports(Path::new(LIBRDMACM));
    for (name, ver) in wanted {
        let (debian, lib) = if ver.starts_with("RDMACM_") {
            (&debian_cm, "librdmacm.so.1")
        } else {
            (&debian, "libibverbs.so.1")
        };
        assert_eq!(
            ours.get(name).map(String::as_str),
            Some(ver),
            "libvrdma_verbs.so must export {name}@@{ver}"
        );
        assert_eq!(
            debian.get(name).map(String::as_str),
            Some(ver),
            "Debian's {lib} exports {name} with another default version"
        );
    }
    // What verbs programs call most is among them.
    for must in [
        "ibv_get_device_list",
        "ibv_open_device",
        "ibv_query_device",
        "ibv_query_port",
        "ibv_reg_mr",
        "ibv_reg_mr_iova2",
        "ibv_create_qp",
        "ibv_modify_qp",
        "ibv_get_cq_event",
        "ibv_query_gid_type",
        "rdma_create_id",
        "rdma_connect",
        "rdma_get_cm_event",
    ] {
        assert!(ours.contains_key(must), "{must} not exported");
    }
}
