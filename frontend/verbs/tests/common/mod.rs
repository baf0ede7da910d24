//! Helpers of the verbs tool tests (`tools.rs`: one simulated host; `interhost_tools.rs`: two
//! simulated hosts talking iWARP over loopback): finding the tools, running a program in a
//! guest through `vrdma-exec`, free ports, perftest's output.
#![allow(dead_code)] // each test binary uses a part

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use vrdma_demo::lab::{Guest, Lab};

pub const SKIP_VAR: &str = "VRDMA_SKIP_VERBS_TOOLS";

/// Whether `tool` is on PATH; if not, fails the test (or, with `SKIP_VAR=1`, says loudly that
/// it did not run and returns false).
pub fn have(tool: &str, package: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    if found {
        return true;
    }
    if std::env::var_os(SKIP_VAR).is_some_and(|v| v == "1") {
        eprintln!(
            "\n*** VERBS TOOLS TEST DID NOT RUN: `{tool}` is not installed (Debian package \
             {package}) and {SKIP_VAR}=1 is set ***\n"
        );
        return false;
    }
    panic!(
        "VERBS TOOLS TEST CANNOT RUN: `{tool}` is not installed: apt-get install {package} \
         (or set {SKIP_VAR}=1 to skip it knowingly)"
    );
}

/// Where cargo put this build's binaries and libraries (`target/<profile>`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("exe dir");
    if dir.ends_with("deps") {
        dir.parent().expect("profile dir").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// vrdma-exec, with libvrdma_verbs.so built next to it (cargo builds no cdylib for
/// integration tests: build it once per test process, same profile and target dir).
pub fn vrdma_exec() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let dir = profile_dir();
    BUILT.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "vrdma-verbs", "--lib"]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        if let Some(target) = dir.parent() {
            cmd.env("CARGO_TARGET_DIR", target);
        }
        let st = cmd.status().expect("run cargo build -p vrdma-verbs");
        assert!(st.success(), "cargo build -p vrdma-verbs --lib failed");
    });
    let so = dir.join("libvrdma_verbs.so");
    assert!(so.exists(), "{} missing after the build", so.display());
    PathBuf::from(env!("CARGO_BIN_EXE_vrdma-exec"))
}

/// `vrdma-exec --sim DIR --domain D -- args…` in guest `d` of `lab`.
pub fn exec_in(lab: &Lab, d: xen_platform::DomId, args: &[&str]) -> Guest {
    let mut cmd = Command::new(vrdma_exec());
    cmd.arg("--sim")
        .arg(&lab.dir)
        .args(["--domain", &d.0.to_string(), "--"])
        .args(args);
    lab.spawn(d, cmd).expect("start a program in the guest")
}

/// A TCP port free on 127.0.0.1 right now (the tool's out-of-band exchange uses it).
pub fn free_port() -> u16 {
    free_port_on(Ipv4Addr::LOCALHOST)
}

/// A TCP port free on `a` right now.
pub fn free_port_on(a: Ipv4Addr) -> u16 {
    let l = TcpListener::bind((a, 0)).expect("bind a loopback port");
    l.local_addr().unwrap().port()
}

/// Whether a TCP socket listens on `port` (any address), from /proc/net/tcp{,6}.
pub fn listening(port: &str) -> bool {
    let hex = format!(":{:04X}", port.parse::<u16>().expect("a port"));
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&hex) && cols[3] == "0A"
            })
        })
    })
}

/// Waits (bounded) until something listens on `port`; else ends `server` and panics.
pub fn wait_listening(port: &str, server: &mut Guest, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !listening(port) {
        if std::time::Instant::now() > deadline {
            let (_, out, err) = server.finish(Duration::from_secs(5));
            panic!("{what} server did not listen on port {port}:\n{out}\n{err}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The QP numbers of perftest's `local address: LID … QPN 0x… PSN …` and `remote address:`
/// lines.
pub fn perftest_qpns(out: &str) -> (Option<u32>, Option<u32>) {
    let find = |tag: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(tag))
            .and_then(|l| l.split("QPN 0x").nth(1))
            .and_then(|r| u32::from_str_radix(r.split_whitespace().next()?, 16).ok())
    };
    (find("local address:"), find("remote address:"))
}

/// perftest's result rows: the lines after the `#bytes` header up to the closing rule.
pub fn result_rows(out: &str) -> Vec<&str> {
    out.lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"))
        .skip(1)
        .take_while(|l| !l.starts_with("---"))
        .collect()
}

/// The string rping's client puts in its buffer for ping `i` (`-S 64`: 63 characters): the
/// `rdma-ping-<i>: ` prefix, then letters from `A` + i cycling through `A`..=`z`.
pub fn rping_string(i: usize) -> String {
    let mut s = format!("rdma-ping-{i}: ");
    let mut c = 65 + (i % 58) as u8;
    while s.len() < 63 {
        s.push(c as char);
        c = if c >= 122 { 65 } else { c + 1 };
    }
    s
}

/// Runs an rping client (`client` starts one attempt) until it connects — a connect before
/// the server listens is rejected or unreachable: at most 20 attempts, 0.5 s apart — then
/// waits for the server and checks that each end printed exactly rping's first `count`
/// strings (the client compared each one it got back: `-V`).
pub fn rping_client_then_check(
    server: &mut Guest,
    count: usize,
    mut client: impl FnMut() -> Guest,
) {
    let mut attempt = 0;
    let (cout, cerr) = loop {
        attempt += 1;
        let (cok, cout, cerr) = client().finish(Duration::from_secs(120));
        if cok {
            break (cout, cerr);
        }
        if attempt >= 20 || !(cerr.contains("REJECTED") || cerr.contains("UNREACHABLE")) {
            let (_, sout, serr) = server.finish(Duration::from_secs(5));
            panic!(
                "rping client failed (attempt {attempt})\n--- client:\n{cout}\n{cerr}\n\
                 --- server:\n{sout}\n{serr}"
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let (sok, sout, serr) = server.finish(Duration::from_secs(60));
    assert!(
        sok,
        "rping server failed\n--- server:\n{sout}\n{serr}\n--- client:\n{cout}\n{cerr}"
    );
    let client_lines: Vec<&str> = cout
        .lines()
        .filter(|l| l.starts_with("ping data: "))
        .collect();
    let server_lines: Vec<&str> = sout
        .lines()
        .filter(|l| l.starts_with("server ping data: "))
        .collect();
    let want_client: Vec<String> = (0..count)
        .map(|i| format!("ping data: {}", rping_string(i)))
        .collect();
    let want_server: Vec<String> = (0..count)
        .map(|i| format!("server ping data: {}", rping_string(i)))
        .collect();
    assert_eq!(client_lines, want_client, "client output:\n{cout}\n{cerr}");
    assert_eq!(server_lines, want_server, "server output:\n{sout}\n{serr}");
}

/// Compiles `tests/c/<name>.c` into `dir` (`-Werror`), linking `libs`.
pub fn build_c_with(dir: &Path, name: &str, libs: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let exe = dir.join(name);
    let out = Command::new("gcc")
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(libs)
        .output()
        .unwrap_or_else(|e| {
            panic!("VERBS C TEST CANNOT RUN: gcc: {e} (apt-get install gcc libibverbs-dev)")
        });
    assert!(
        out.status.success(),
        "VERBS C TEST CANNOT RUN: compiling {} failed (libibverbs-dev installed?):\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}
