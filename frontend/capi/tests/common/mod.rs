//! Finding (or building) libvrdma and compiling C against it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The crate folder (`frontend/capi`).
pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where cargo put this build's libraries (`target/<profile>`).
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("exe dir");
    if dir.ends_with("deps") {
        dir.parent().expect("profile dir").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// libvrdma.so and libvrdma.a of this build. Cargo does not build a cdylib/staticlib for
/// integration tests, so run `cargo build -p libvrdma --lib` (same profile and target dir;
/// a no-op when they are fresh) once per test process.
pub fn libvrdma() -> (PathBuf, PathBuf) {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let dir = lib_dir();
    BUILT.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "libvrdma", "--lib"]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        if let Some(target) = dir.parent() {
            cmd.env("CARGO_TARGET_DIR", target);
        }
        let st = cmd.status().expect("run cargo build -p libvrdma");
        assert!(st.success(), "cargo build -p libvrdma failed");
    });
    let (so, a) = (dir.join("libvrdma.so"), dir.join("libvrdma.a"));
    assert!(so.exists(), "{} missing after the build", so.display());
    assert!(a.exists(), "{} missing after the build", a.display());
    (so, a)
}

/// Runs gcc with `args`; panics with its output on failure.
pub fn gcc(args: &[&str]) {
    let out = Command::new("gcc")
        .args(args)
        .output()
        .expect("gcc is needed for the C ABI tests (apt-get install gcc)");
    assert!(
        out.status.success(),
        "gcc {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes a vrdma.pc for this build into `dir` from the template.
pub fn write_pc(dir: &Path) -> PathBuf {
    let t = std::fs::read_to_string(crate_dir().join("vrdma.pc.in")).expect("vrdma.pc.in");
    let libdir = lib_dir();
    let pc = t
        .replace("@PREFIX@", &crate_dir().display().to_string())
        .replace("@LIBDIR@", &libdir.display().to_string())
        .replace(
            "@INCLUDEDIR@",
            &crate_dir().join("include").display().to_string(),
        )
        .replace("@VERSION@", env!("CARGO_PKG_VERSION"));
    let p = dir.join("vrdma.pc");
    std::fs::write(&p, pc).expect("write vrdma.pc");
    p
}

/// `pkg-config --cflags --libs vrdma` with `dir` on the search path, split into words.
pub fn pkg_config(dir: &Path) -> Vec<String> {
    let out = Command::new("pkg-config")
        .args(["--cflags", "--libs", "vrdma"])
        .env("PKG_CONFIG_PATH", dir)
        .output()
        .expect("pkg-config is needed for the C ABI tests (apt-get install pkg-config)");
    assert!(
        out.status.success(),
        "pkg-config failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .map(String::from)
        .collect()
}
