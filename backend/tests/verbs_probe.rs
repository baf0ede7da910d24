//! `vrdmactl verbs-probe` on the host running the tests: it loads libibverbs at run time,
//! lists what the kernel offers (nothing on a host without RDMA modules, and says so), and a
//! missing library is a clear error naming the Debian packages.

use std::process::Command;

use verbs_common::kernel_devices;

mod verbs_common;

fn vrdmactl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vrdmactl"))
}

#[test]
fn probe_lists_the_kernels_devices() {
    let out = vrdmactl()
        .arg("verbs-probe")
        .env_remove("VRDMA_LIBIBVERBS")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    let kernel = kernel_devices();
    let n = kernel.len();
    let head = format!("{n} RDMA device{}", if n == 1 { "" } else { "s" });
    assert!(
        stdout.lines().next().unwrap_or("").ends_with(&head),
        "{stdout}"
    );
    if kernel.is_empty() {
        assert!(stdout.contains("no RDMA devices"), "{stdout}");
    }
    for d in &kernel {
        assert!(
            stdout.contains(&format!("\n{d}: transport ")),
            "{d} missing: {stdout}"
        );
    }
}

#[test]
fn missing_library_is_a_clear_error() {
    let out = vrdmactl()
        .arg("verbs-probe")
        .env(
            "VRDMA_LIBIBVERBS",
            "/nonexistent/vrdma-test/libibverbs.so.1",
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("libibverbs1"), "{stderr}");
    assert!(stderr.contains("ibverbs-providers"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn self_test_on_an_unknown_device_fails_naming_it() {
    let out = vrdmactl()
        .args(["verbs-probe", "--device", "vrdma-no-such-dev"])
        .env_remove("VRDMA_LIBIBVERBS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("no RDMA device named \"vrdma-no-such-dev\""),
        "{stderr}"
    );
}

fn backend() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vrdma-backend"))
}

#[test]
fn backend_verbs_device_without_the_library_names_the_packages() {
    let out = backend()
        .args(["--device", "verbs:rxe0"])
        .env(
            "VRDMA_LIBIBVERBS",
            "/nonexistent/vrdma-test/libibverbs.so.1",
        )
        .env_remove("VRDMA_SIM")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("libibverbs1"), "{stderr}");
    assert!(stderr.contains("ibverbs-providers"), "{stderr}");
}

#[test]
fn backend_verbs_device_that_does_not_exist_is_named() {
    let out = backend()
        .args(["--device", "verbs:vrdma_no_such_dev0:1"])
        .env_remove("VRDMA_LIBIBVERBS")
        .env_remove("VRDMA_SIM")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("vrdma_no_such_dev0"), "{stderr}");
    let bad = backend().args(["--device", "verbs:x:0"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not 1..=255"));
}
