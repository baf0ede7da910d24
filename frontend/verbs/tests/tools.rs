//! Unmodified verbs programs in simulated guests, through `vrdma-exec` (LD_PRELOAD of
//! libvrdma_verbs.so) against the real backend (`vrdma_demo::lab`):
//!
//! - Debian's `ibv_devinfo -v` lists the vrdma device with its port active;
//! - Debian's `ibv_rc_pingpong -g 0` runs between two guests (server and client), buffer
//!   validation on (`-c`), polling and with completion events (`-e`);
//! - Debian's perftest `ib_{send,write,read}_{lat,bw}` (address vectors, no `-R`), 50
//!   iterations each, between two guests;
//! - `tests/c/verbs_check.c`, compiled against rdma-core's verbs.h, checks what the tools do
//!   not: data RDMA-written into malloc'd memory, `ibv_dereg_mr` revoking the rkey at once
//!   (the next write with it fails with a remote access error), the bytes staying in place
//!   after deregistration, bad work requests refused with EINVAL, and the unsupported verbs
//!   failing with EOPNOTSUPP.
//!
//! Needs `ibverbs-utils` and `perftest` (the tools), `libibverbs-dev` and `gcc` (scripts/host-packages.txt).
//! Without them the tests FAIL and say why, unless `VRDMA_SKIP_VERBS_TOOLS=1` is set, in which
//! case they print loudly that they did not run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use vrdma_demo::lab::Lab;

mod common;
use common::{exec_in, free_port, have, listening, perftest_qpns, rping_client_then_check};

#[test]
fn ibv_devinfo_lists_the_vrdma_device_with_an_active_port() {
    if !have("ibv_devinfo", "ibverbs-utils") {
        return;
    }
    let mut lab = Lab::start(None).expect("start the simulated host and the backend");
    let d = lab.create_guest("devinfo").expect("guest");
    let (ok, out, err) = exec_in(&lab, d, &["ibv_devinfo", "-v"]).finish(Duration::from_secs(60));
    assert!(ok, "ibv_devinfo -v failed:\n{out}\n{err}");
    for want in [
        "hca_id:\tvrdma0",
        "transport:\t\t\tInfiniBand (0)",
        "phys_port_cnt:\t\t\t1",
        "port:\t1",
        "state:\t\t\tPORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "active_mtu:\t\t4096 (5)",
        "GID[  0]:",
        "RoCE v2",
        "num_comp_vectors:\t\t1",
    ] {
        assert!(
            out.contains(want),
            "ibv_devinfo -v lacks {want:?}:\n{out}\n{err}"
        );
    }
    // The node GUID carries the guest's domain id (0276:7264:DDDD:0000).
    let guid = format!("node_guid:\t\t\t0276:7264:{:04x}:0000", d.0);
    assert!(out.contains(&guid), "no {guid:?} in:\n{out}");
}

/// The `QPN 0x…` values of a pingpong's "local address" and "remote address" lines.
fn qpns(out: &str) -> (Option<u32>, Option<u32>) {
    let find = |tag: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(tag))
            .and_then(|l| l.split("QPN 0x").nth(1))
            .and_then(|r| u32::from_str_radix(r.split(',').next()?.trim(), 16).ok())
    };
    (find("local address:"), find("remote address:"))
}

#[test]
fn ibv_rc_pingpong_runs_between_two_guests() {
    pingpong(&[]);
}

/// `-e`: the tool sleeps on its completion channel (`ibv_get_cq_event`) instead of polling.
#[test]
fn ibv_rc_pingpong_with_completion_events_runs_between_two_guests() {
    pingpong(&["-e"]);
}

fn pingpong(extra: &[&str]) {
    if !have("ibv_rc_pingpong", "ibverbs-utils") {
        return;
    }
    let mut lab = Lab::start(None).expect("start the simulated host and the backend");
    let a = lab.create_guest("pp-server").expect("guest a");
    let b = lab.create_guest("pp-client").expect("guest b");
    let port = free_port().to_string();
    let iters = "200";
    let mut common = vec!["-g", "0", "-p", &port, "-n", iters, "-s", "4096", "-c"];
    common.extend_from_slice(extra);
    let mut server_args = vec!["ibv_rc_pingpong"];
    server_args.extend(&common);
    let mut server = exec_in(&lab, a, &server_args);
    // The server listens once its QP exists (its stdout is a pipe, so fully buffered: watch
    // the socket table, not its output; a probing connection would be taken for the client).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !listening(&port) {
        if std::time::Instant::now() > deadline {
            let (_, out, err) = server.finish(Duration::from_secs(5));
            panic!("the server did not listen on port {port}:\n{out}\n{err}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut client_args = vec!["ibv_rc_pingpong"];
    client_args.extend(&common);
    client_args.push("127.0.0.1");
    let mut client = exec_in(&lab, b, &client_args);
    let (cok, cout, cerr) = client.finish(Duration::from_secs(240));
    let (sok, sout, serr) = server.finish(Duration::from_secs(if cok { 60 } else { 5 }));
    assert!(
        cok && sok,
        "ibv_rc_pingpong failed\n--- client:\n{cout}\n{cerr}\n--- server:\n{sout}\n{serr}"
    );
    for (who, out) in [("client", &cout), ("server", &sout)] {
        assert!(
            out.contains(&format!("{iters} iters in")),
            "{who} did not finish its {iters} iterations:\n{out}"
        );
        assert!(
            out.contains("GID ::ffff:127.0.0.1") || out.contains("GID fe80::276:72ff:fe00:"),
            "{who} did not use a vrdma GID:\n{out}"
        );
    }
    // Each side reached the other's QP number (24-bit, as InfiniBand's).
    let (cl, cr) = qpns(&cout);
    let (sl, sr) = qpns(&sout);
    assert!(
        cl.is_some() && sl.is_some(),
        "QPNs missing:\n{cout}\n{sout}"
    );
    assert_eq!((cl, cr), (sr, sl), "QPNs do not match:\n{cout}\n{sout}");
    assert!(cl.unwrap() < 1 << 24 && sl.unwrap() < 1 << 24);
    for e in [&cerr, &serr] {
        assert!(!e.contains("Failed status"), "a completion failed:\n{e}");
    }
}

/// Debian's perftest tool `tool` (AV mode, no `-R`) between two guests: both ends finish, the
/// client prints a result row, and so does the server unless it is passive (`ib_read_lat`).
fn perftest(tool: &str, extra: &[&str]) {
    if !have(tool, "perftest") {
        return;
    }
    let mut lab = Lab::start(None).expect("start the simulated host and the backend");
    let a = lab.create_guest("pt-server").expect("guest a");
    let b = lab.create_guest("pt-client").expect("guest b");
    let port = free_port().to_string();
    let iters = if extra.contains(&"-a") { "5" } else { "50" };
    let mut common = vec![tool, "-p", &port, "-n", iters];
    common.extend_from_slice(extra);
    let mut server = exec_in(&lab, a, &common);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !listening(&port) {
        if std::time::Instant::now() > deadline {
            let (_, out, err) = server.finish(Duration::from_secs(5));
            panic!("{tool} server did not listen on port {port}:\n{out}\n{err}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut client_args = common.clone();
    client_args.push("127.0.0.1");
    let mut client = exec_in(&lab, b, &client_args);
    let (cok, cout, cerr) = client.finish(Duration::from_secs(240));
    let (sok, sout, serr) = server.finish(Duration::from_secs(if cok { 60 } else { 5 }));
    assert!(
        cok && sok,
        "{tool} failed\n--- client:\n{cout}\n{cerr}\n--- server:\n{sout}\n{serr}"
    );
    for (who, out) in [("client", &cout), ("server", &sout)] {
        assert!(out.contains("Link type       : Ethernet"), "{who}:\n{out}");
        if who == "server" && tool == "ib_read_lat" {
            continue;
        }
        // The header, then a row per size: size, iterations, figures.
        let rows: Vec<&str> = out
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("#bytes"))
            .skip(1)
            .take_while(|l| !l.starts_with("---"))
            .collect();
        assert!(
            !rows.is_empty()
                && rows
                    .iter()
                    .all(|r| r.split_whitespace().nth(1) == Some(iters)),
            "{who} printed no result rows for {iters} iterations:\n{out}"
        );
        if extra.contains(&"-a") {
            assert!(
                rows.last()
                    .is_some_and(|r| r.trim_start().starts_with("8388608 ")),
                "{who} did not reach 8 MiB:\n{out}"
            );
        }
    }
}

#[test]
fn perftest_send_lat() {
    perftest("ib_send_lat", &[]);
}

#[test]
fn perftest_write_lat() {
    perftest("ib_write_lat", &[]);
}

#[test]
fn perftest_read_lat() {
    perftest("ib_read_lat", &[]);
}

#[test]
fn perftest_send_bw() {
    perftest("ib_send_bw", &[]);
}

#[test]
fn perftest_write_bw() {
    perftest("ib_write_bw", &[]);
}

#[test]
fn perftest_read_bw() {
    perftest("ib_read_bw", &[]);
}

/// `-a`: every size from 2 B to 8 MiB (buffers of 2 × 8 MiB registered: page directories),
/// 5 iterations each.
#[test]
fn perftest_write_bw_all_sizes() {
    perftest("ib_write_bw", &["-a"]);
}

#[test]
fn perftest_send_lat_all_sizes() {
    perftest("ib_send_lat", &["-a"]);
}

#[test]
fn perftest_write_lat_all_sizes() {
    perftest("ib_write_lat", &["-a"]);
}

#[test]
fn perftest_read_lat_all_sizes() {
    perftest("ib_read_lat", &["-a"]);
}

#[test]
fn perftest_send_bw_all_sizes() {
    perftest("ib_send_bw", &["-a"]);
}

#[test]
fn perftest_read_bw_all_sizes() {
    perftest("ib_read_bw", &["-a"]);
}

fn build_c(dir: &Path, name: &str) -> PathBuf {
    build_c_with(dir, name, &["-libverbs"])
}

/// [`build_c`] linking `libs`.
fn build_c_with(dir: &Path, name: &str, libs: &[&str]) -> PathBuf {
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

#[test]
fn dereg_mr_revokes_the_rkey_at_once_and_app_memory_works() {
    if !have("gcc", "gcc") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let exe = build_c(tmp.path(), "verbs_check");
    let mut lab = Lab::start(None).expect("start the simulated host and the backend");
    let d = lab.create_guest("verbs-check").expect("guest");
    let exe = exe.display().to_string();
    let (ok, out, err) = exec_in(&lab, d, &[&exe]).finish(Duration::from_secs(120));
    assert!(ok, "verbs_check failed:\n{out}\n{err}");
    for want in [
        "write into malloc'd memory: ok",
        "write into stack memory: ok",
        "two regions on one page: ok",
        "async event on CQ overrun: ",
        "bad work requests: EINVAL",
        "move to ERR flushes receives: ok",
        "write after dereg: remote access error",
        "bytes kept after dereg: ok",
        "UD QP: EOPNOTSUPP",
        "atomic access: EOPNOTSUPP",
        "all checks passed",
    ] {
        assert!(
            out.contains(want),
            "verbs_check lacks {want:?}:\n{out}\n{err}"
        );
    }
}

/// `tests/c/cq_lock_check.c`: two threads create and destroy QPs on the same two CQs with
/// send and receive CQ swapped (1000 rounds each, two more threads polling the CQs). `ibv_create_qp` holds both CQs' locks
/// while the backend creates the QP; until 2026-11-24 it took them in argument order, and
/// the two threads deadlocked (the helper's alarm ends a hung run with "hung").
#[test]
fn qps_created_on_two_cqs_in_both_orders_do_not_deadlock() {
    if !have("gcc", "gcc") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let exe = build_c_with(tmp.path(), "cq_lock_check", &["-pthread", "-libverbs"]);
    let mut lab = Lab::start(None).expect("start the simulated host and the backend");
    let d = lab.create_guest("cq-lock").expect("guest");
    let exe = exe.display().to_string();
    let (ok, out, err) = exec_in(&lab, d, &[&exe]).finish(Duration::from_secs(180));
    assert!(
        ok && out.contains("both threads finished 1000 rounds"),
        "cq_lock_check failed:\n{out}\n{err}"
    );
}

/// `tests/c/cm_accept_check.c`: a server that destroys its listening id right after
/// `rdma_accept` (perftest `-R` does, in `rdma_server_connect`) still gets its connection:
/// `rdma_accept` returns once the backend has established it (its `ESTABLISHED` is queued
/// then), and the client gets `ESTABLISHED`. Until 2026-11-24 `rdma_accept` left the
/// backend's `Accept` to a thread: a listener destroyed first took the request with it and the
/// client was rejected (a perftest -R client in the Xen lab then exited 1 before its
/// exchange).
#[test]
fn a_listener_destroyed_right_after_rdma_accept_keeps_the_connection() {
    cm_accept_check(&[]);
}

/// `tests/c/cm_accept_check.c` with `early`: the server destroys its listening id as soon as
/// it has the `CONNECT_REQUEST`, before `rdma_accept`; as with Linux rdma_cm the request id it
/// got survives and its accept connects (the client gets `ESTABLISHED` and the server's
/// message). Until 2026-11-24 the backend rejected every request of a closed listener, also
/// those already handed to the guest: the accept failed and the client got `REJECTED`.
#[test]
fn a_request_survives_its_listener_destroyed_before_rdma_accept() {
    if !have("gcc", "gcc") {
        return;
    }
    let out = cm_accept_check(&["early"]);
    assert!(
        out.contains("server: listening id destroyed before rdma_accept"),
        "{out}"
    );
}

/// Runs `cm_accept_check server … extra` and its client in two guests; both must pass.
/// Returns both outputs.
fn cm_accept_check(extra: &[&str]) -> String {
    if !have("gcc", "gcc") {
        return String::new();
    }
    let tmp = tempfile::tempdir().unwrap();
    let exe = build_c_with(tmp.path(), "cm_accept_check", &["-lrdmacm", "-libverbs"]);
    let exe = exe.display().to_string();
    let mut lab = Lab::start(None).expect("start the simulated host and the backend");
    let a = lab.create_guest("accept-server").expect("guest a");
    let b = lab.create_guest("accept-client").expect("guest b");
    let port = free_port().to_string();
    let mut args = vec![exe.as_str(), "server", "127.0.0.1", &port];
    args.extend_from_slice(extra);
    let mut server = exec_in(&lab, a, &args);
    common::wait_listening(&port, &mut server, "cm_accept_check");
    let (cok, cout, cerr) =
        exec_in(&lab, b, &[&exe, "client", "127.0.0.1", &port]).finish(Duration::from_secs(120));
    let (sok, sout, serr) = server.finish(Duration::from_secs(60));
    let both = format!("--- server:\n{sout}\n{serr}\n--- client:\n{cout}\n{cerr}");
    assert!(
        sout.contains("ESTABLISHED queued when rdma_accept returned: yes"),
        "rdma_accept returned before the connection was established:\n{both}"
    );
    assert!(
        cout.contains("client: RDMA_CM_EVENT_ESTABLISHED"),
        "the client was not connected:\n{both}"
    );
    assert!(
        sok && cok && sout.contains("server: done") && cout.contains("client: done"),
        "{both}"
    );
    both
}

/// Runs `tests/c/cm_race_check.c`: `server ADDR PORT rounds server_mode` in one guest,
/// `client_mode ADDR PORT rounds` in another; both must exit 0. Returns both outputs.
fn cm_race(server_mode: &str, client_mode: &str, rounds: u32) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let exe = build_c_with(tmp.path(), "cm_race_check", &["-lrdmacm", "-libverbs"]);
    let exe = exe.display().to_string();
    let mut lab = Lab::start(None).expect("start the simulated host and the backend");
    let a = lab.create_guest("race-server").expect("guest a");
    let b = lab.create_guest("race-client").expect("guest b");
    let port = free_port().to_string();
    let n = rounds.to_string();
    let mut server = exec_in(
        &lab,
        a,
        &[&exe, "server", "127.0.0.1", &port, &n, server_mode],
    );
    common::wait_listening(&port, &mut server, "cm_race_check");
    let (cok, cout, cerr) = exec_in(&lab, b, &[&exe, client_mode, "127.0.0.1", &port, &n])
        .finish(Duration::from_secs(300));
    let (sok, sout, serr) = server.finish(Duration::from_secs(60));
    let both = format!("--- server:\n{sout}\n{serr}\n--- client:\n{cout}\n{cerr}");
    assert!(
        sok && cok,
        "cm_race_check {server_mode}/{client_mode} failed:\n{both}"
    );
    both
}

/// `rdma_destroy_id` while the id's connection is being set up (`tests/c/cm_race_check.c`
/// `destroy`, 150 rounds, the destroy swept across the connect thread's last steps, the
/// server disconnecting at once): no destroyed id gets an event afterwards, and nothing
/// crashes. Until 2026-11-24 the connect thread could start the id's disconnection thread
/// after `rdma_destroy_id` had collected the id's threads: that thread outlived the id and
/// queued `DISCONNECTED` for (read the channel of) the freed id.
#[test]
fn destroying_an_id_while_it_connects_leaves_no_thread_behind() {
    if !have("gcc", "gcc") {
        return;
    }
    let out = cm_race("drop", "destroy", 150);
    assert!(out.contains("client: 0 events of destroyed ids"), "{out}");
}

/// An acceptor whose peer disconnects as soon as it is established gets `ESTABLISHED` then
/// `DISCONNECTED`, as with rdma_cm (`cm_race_check` `quick`, 200 rounds). Until 2026-11-24 its
/// `rdma_accept` could end in `CONNECT_ERROR`: the connection's info query failed once the
/// connection was gone.
#[test]
fn an_acceptor_whose_peer_disconnects_at_once_sees_established_then_disconnected() {
    if !have("gcc", "gcc") {
        return;
    }
    // The race is between the backend telling the two ends: busy threads competing for the
    // cores (this process runs the backend) make it preempted there more often. They stop
    // with the test.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spinners: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let out = std::panic::catch_unwind(|| cm_race("expect", "quick", 200));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in spinners {
        t.join().unwrap();
    }
    let out = out.unwrap_or_else(|e| std::panic::resume_unwind(e));
    assert!(out.contains("server: 0 of 200 rounds wrong"), "{out}");
    assert!(out.contains("client: 0 of 200 rounds wrong"), "{out}");
}

/// Debian's `rping` (librdmacm's rdma_cm API: listen, resolve, connect, accept, disconnect)
/// between two guests: the server RDMA-READs each ping string from the client and
/// RDMA-WRITEs it back; both print every string (`-v`), the client checks them (`-V`).
#[test]
fn rping_runs_between_two_guests() {
    if !have("rping", "rdmacm-utils") {
        return;
    }
    let mut lab = Lab::start(None).expect("start the simulated host and the backend");
    let a = lab.create_guest("rping-server").expect("guest a");
    let b = lab.create_guest("rping-client").expect("guest b");
    let port = free_port().to_string();
    let count = 10;
    let count_s = count.to_string();
    let mut server = exec_in(
        &lab,
        a,
        &[
            "rping",
            "-s",
            "-v",
            "-C",
            &count_s,
            "-a",
            "127.0.0.1",
            "-p",
            &port,
        ],
    );
    // The server listens once it has bound its id; until then a connect is rejected (nobody
    // listens at that port): try again, a bounded number of times.
    let client_args = [
        "rping",
        "-c",
        "-v",
        "-V",
        "-C",
        &count_s,
        "-a",
        "127.0.0.1",
        "-p",
        &port,
    ];
    rping_client_then_check(&mut server, count, || exec_in(&lab, b, &client_args));
}

/// Debian's perftest with `-R` (connection through librdmacm: rdma_getaddrinfo, listen,
/// connect, accept) between two guests, 50 iterations: both ends print their result row.
fn perftest_cm(tool: &str) {
    if !have(tool, "perftest") {
        return;
    }
    let mut lab = Lab::start(None).expect("start the simulated host and the backend");
    let a = lab.create_guest("ptcm-server").expect("guest a");
    let b = lab.create_guest("ptcm-client").expect("guest b");
    let iters = "50";
    let mut earlier = String::new();
    // perftest -R connects twice: a connection for its own exchange, then the test QPs'. A
    // client whose first connect comes before the server listens is rejected at once: try the
    // client again. A client whose second connect comes before the server listens again is
    // rejected too, and perftest's own retry then uses the ids it destroyed ("Failed to
    // resolve RDMA CM address"; it would with Debian's librdmacm too): start a new pair.
    for round in 1..=5 {
        let port = free_port().to_string();
        let common = [tool, "-R", "-p", &port, "-n", iters];
        let mut server = exec_in(&lab, a, &common);
        let mut client_args = common.to_vec();
        client_args.push("127.0.0.1");
        let mut done = None;
        for attempt in 1..=20 {
            let (cok, cout, cerr) = exec_in(&lab, b, &client_args).finish(Duration::from_secs(120));
            if cok {
                done = Some((cout, cerr));
                break;
            }
            earlier.push_str(&format!(
                "round {round} attempt {attempt}:\n{cout}\n{cerr}\n"
            ));
            if cerr.contains("Failed to connect RDMA CM events") {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let Some((cout, cerr)) = done else {
            let (_, sout, serr) = server.finish(Duration::from_secs(5));
            earlier.push_str(&format!("round {round} server:\n{sout}\n{serr}\n"));
            continue;
        };
        let (sok, sout, serr) = server.finish(Duration::from_secs(60));
        assert!(
            sok,
            "{tool} -R server failed\n--- server:\n{sout}\n{serr}\n--- client:\n{cout}\n{cerr}"
        );
        // Each end names the other's QP (the connection the CM made).
        let (cl, cr) = perftest_qpns(&cout);
        let (sl, sr) = perftest_qpns(&sout);
        assert!(
            cl.is_some() && cl == sr && sl.is_some() && sl == cr,
            "the ends do not name each other's QP:\n{cout}\n{sout}"
        );
        for (who, out) in [("client", &cout), ("server", &sout)] {
            assert!(
                out.contains("Data ex. method : rdma_cm"),
                "{who} did not use rdma_cm:\n{out}"
            );
            let rows: Vec<&str> = out
                .lines()
                .skip_while(|l| !l.trim_start().starts_with("#bytes"))
                .skip(1)
                .take_while(|l| !l.starts_with("---"))
                .collect();
            assert!(
                !rows.is_empty()
                    && rows
                        .iter()
                        .all(|r| r.split_whitespace().nth(1) == Some(iters)),
                "{who} printed no result rows for {iters} iterations:\n{out}"
            );
        }
        return;
    }
    panic!("{tool} -R did not connect in 5 rounds:\n{earlier}");
}

#[test]
fn perftest_send_lat_through_rdma_cm() {
    perftest_cm("ib_send_lat");
}

#[test]
fn perftest_write_bw_through_rdma_cm() {
    perftest_cm("ib_write_bw");
}
