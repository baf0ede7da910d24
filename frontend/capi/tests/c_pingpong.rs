//! The C example (examples/pingpong.c), built with gcc through the pkg-config file, runs as
//! server and client in two simulated guest domains against the real backend: SEND/RECV and
//! RDMA WRITE ping-pong with the data checked on both sides, in bypass and in mediated mode.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use vrdma_demo::lab::Lab;

fn build_pingpong(dir: &std::path::Path) -> std::path::PathBuf {
    libvrdma();
    write_pc(dir);
    let exe = dir.join("pingpong");
    let src = crate_dir().join("examples/pingpong.c");
    let mut args: Vec<String> = vec![
        "-std=c11".into(),
        "-Wall".into(),
        "-Wextra".into(),
        "-Werror".into(),
        "-O2".into(),
        src.display().to_string(),
        "-o".into(),
        exe.display().to_string(),
    ];
    args.extend(pkg_config(dir));
    args.push(format!("-Wl,-rpath,{}", lib_dir().display()));
    gcc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    exe
}

fn pingpong_across_two_domains(mode: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let exe = build_pingpong(tmp.path());
    let mut lab = Lab::start(None).expect("start the simulated host and the backend");
    let a = lab.create_guest("c-server").expect("guest a");
    let b = lab.create_guest("c-client").expect("guest b");
    let iters = "200";

    let mut cmd = Command::new(&exe);
    cmd.args(["server", "0", iters]).env("VRDMA_MODE", mode);
    let mut server = lab.spawn(a, cmd).expect("start the server");
    let first = server.stdout.recv_timeout(Duration::from_secs(60));
    let port = match first
        .as_deref()
        .ok()
        .and_then(|l| l.strip_prefix("listening on "))
    {
        Some(p) => p.to_string(),
        None => {
            let (_, out, err) = server.finish(Duration::from_secs(5));
            panic!("server did not listen: {first:?}\n{out}\n{err}");
        }
    };
    let mut cmd = Command::new(&exe);
    cmd.args(["client", "127.0.0.1", &port, iters])
        .env("VRDMA_MODE", mode);
    let mut client = lab.spawn(b, cmd).expect("start the client");
    let (cok, cout, cerr) = client.finish(Duration::from_secs(300));
    let (sok, sout, serr) = server.finish(Duration::from_secs(if cok { 60 } else { 2 }));
    assert!(
        cok && sok,
        "pingpong ({mode}) failed\n--- client: {cout}\n{cerr}\n--- server: {sout}\n{serr}"
    );
    for (who, out, dom) in [("client", &cout, b), ("server", &sout, a)] {
        assert!(
            out.contains(&format!("domain {}, mode {mode}", dom.0)),
            "{who} ran in domain {} with mode {mode}:\n{out}",
            dom.0
        );
        assert!(
            out.contains("send/recv: 200 round trips of 64 bytes ok"),
            "{who}:\n{out}"
        );
        assert!(
            out.contains("rdma write: 200 round trips of 64 bytes ok"),
            "{who}:\n{out}"
        );
    }
    lab.stop().expect("clean shutdown");
}

#[test]
fn c_pingpong_bypass() {
    pingpong_across_two_domains("bypass");
}

#[test]
fn c_pingpong_mediated() {
    pingpong_across_two_domains("mediated");
}
