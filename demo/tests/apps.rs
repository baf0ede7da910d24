//! `vrdma-demo --apps`: Debian's unmodified ibv_rc_pingpong, rping, ib_send_lat and
//! ib_write_bw between the demo's two guests through vrdma-exec; and, without the tools, the
//! Debian packages to install (nothing installed).

use std::path::PathBuf;
use std::process::Command;

/// Builds vrdma-exec and libvrdma_verbs.so next to the demo binary (same profile and
/// target dir: cargo builds no other package's binaries for this test).
fn build_verbs() {
    let demo = PathBuf::from(env!("CARGO_BIN_EXE_vrdma-demo"));
    let dir = demo.parent().expect("bin dir");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "vrdma-verbs"]);
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    if let Some(target) = dir.parent() {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    assert!(cmd.status().expect("run cargo build").success());
}

#[test]
fn apps_runs_the_unmodified_tools_between_two_guests() {
    let have = |t: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()))
    };
    for (t, pkg) in [
        ("ibv_rc_pingpong", "ibverbs-utils"),
        ("rping", "rdmacm-utils"),
        ("ib_send_lat", "perftest"),
    ] {
        assert!(
            have(t),
            "`{t}` is not installed: apt-get install {pkg} (scripts/host-packages.txt)"
        );
    }
    build_verbs();
    let out = Command::new(env!("CARGO_BIN_EXE_vrdma-demo"))
        .arg("--apps")
        .output()
        .expect("run vrdma-demo --apps");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for want in [
        "=== ibv_rc_pingpong -g 0",
        "100 iters in",
        "=== rping",
        "ping data: rdma-ping-9: ",
        "server ping data: rdma-ping-9: ",
        "=== perftest ib_send_lat -s 64",
        "=== perftest ib_write_bw -s 65536",
        "the unmodified programs ran in",
    ] {
        assert!(stdout.contains(want), "no {want:?} in:\n{stdout}\n{stderr}");
    }
    // Each perftest run printed its result row for its size, 1000 iterations.
    for size in ["64", "65536"] {
        assert!(
            stdout.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[0] == size && f[1] == "1000"
            }),
            "no result row for {size} B:\n{stdout}"
        );
    }
}

#[test]
fn apps_without_the_tools_names_the_packages_and_installs_nothing() {
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vrdma-demo"))
        .arg("--apps")
        .env("PATH", empty.path())
        .output()
        .expect("run vrdma-demo --apps");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("apt-get install ibverbs-utils rdmacm-utils perftest"),
        "{stderr}"
    );
    // It stopped before starting a host.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("starting the embedded"), "{stdout}");
}
