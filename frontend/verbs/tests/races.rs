//! Races through the library, many rounds each, in guests of a simulated host: rdma_cm
//! (`tests/c/cm_race_check.c`, librdmacm's API: an id destroyed while it connects, an
//! acceptor whose peer disconnects as soon as it is established) and the CQ locks of
//! `ibv_create_qp` (`tests/c/cq_lock_check.c`). A test binary of their own: they run busy
//! threads, which would disturb timing-sensitive tests (perftest's cycle calibration)
//! running beside them in one process.
//!
//! Needs `gcc`, `libibverbs-dev`, `librdmacm-dev` (scripts/host-packages.txt).

use std::time::Duration;

use vrdma_demo::lab::Lab;

mod common;
use common::{build_c_with, exec_in, free_port, have};

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
