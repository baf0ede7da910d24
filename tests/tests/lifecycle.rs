//! Channel lifecycles across processes on the simulated host: channels opened and closed back
//! to back by several processes at once are never refused by the ghost of an earlier channel
//! at the same index, and a backend killed with SIGKILL is "device lost" for its guests —
//! blocked in a wait, spinning on a CQ, or in a control call — not a hang; a new backend
//! serves them again.

use std::time::{Duration, Instant};

use vrdma_tests::{Guest, Lab};
use xen_platform::DomId;

const GUEST: &str = env!("CARGO_BIN_EXE_vrdma-guest");

/// How long a guest may take to learn its backend died before the test calls it a hang (the
/// design's figure is about a second; this bound only guards against hanging).
const LOST_WITHIN: Duration = Duration::from_secs(5);

fn guest(lab: &Lab, d: DomId, mode: &str) -> Guest {
    let mut g = lab.spawn_guest(GUEST.as_ref(), d);
    g.cmd(&format!("open {mode}"));
    g
}

/// CQ `c`, QP `q` connected between `a` and `b`, a 64 KiB region `m` each; returns b's
/// region as a remote string.
fn connect(a: &mut Guest, b: &mut Guest) -> String {
    for g in [&mut *a, &mut *b] {
        g.cmd("cq c 64");
    }
    let ea = a.cmd("qp q c c 32 32");
    let eb = b.cmd("qp q c c 32 32");
    a.send_only(&format!("connect q {eb}"));
    b.cmd(&format!("connect q {ea}"));
    a.reply().expect("connect");
    a.cmd("mr m 65536");
    b.cmd("mr m 65536")
}

/// SEND and RDMA WRITE from a to b, data checked at b.
fn verified_transfer(a: &mut Guest, b: &mut Guest, rb: &str, seed: u64) {
    b.cmd("recv q m 0 4096 1");
    a.cmd(&format!("fill m {seed} 0 4096"));
    a.cmd("send q m 0 4096 2");
    let wcs = Guest::completions(&a.cmd("poll c 1 30000"));
    assert!(wcs.len() == 1 && wcs[0].ok(), "{wcs:?}");
    let wcs = Guest::completions(&b.cmd("poll c 1 30000"));
    assert!(
        wcs.len() == 1 && wcs[0].ok() && wcs[0].byte_len == 4096,
        "{wcs:?}"
    );
    b.cmd(&format!("check m {seed} 0 4096"));
    let seed = seed + 1;
    a.cmd(&format!("fill m {seed} 8192 8192"));
    let r: vrdma::RemoteMr = rb.parse().unwrap();
    let at = vrdma::RemoteMr {
        addr: r.addr + 16384,
        len: 8192,
        rkey: r.rkey,
    };
    a.cmd(&format!("write q m 8192 8192 {at} 3"));
    let wcs = Guest::completions(&a.cmd("poll c 1 30000"));
    assert!(wcs.len() == 1 && wcs[0].ok(), "{wcs:?}");
    b.cmd(&format!("check m {seed} 16384 8192"));
}

/// Four processes of one domain open and close channels back to back, 50 times each (200
/// channels, their indexes reused as soon as they are free): none is refused or times out.
#[test]
fn back_to_back_channels_of_several_processes_are_never_refused() {
    let lab = Lab::start();
    let d = lab.create_guest("churn");
    lab.attach(d, &[]);
    let mut gs: Vec<Guest> = (0..4).map(|_| lab.spawn_guest(GUEST.as_ref(), d)).collect();
    for (i, g) in gs.iter_mut().enumerate() {
        let mode = if i % 2 == 0 { "bypass" } else { "mediated" };
        g.send_only(&format!("cycle 50 {mode}"));
    }
    for g in &mut gs {
        assert_eq!(g.reply(), Ok("50".into()));
    }
    // The backend kept up: every channel was reclaimed, and a new one works.
    let deadline = Instant::now() + Duration::from_secs(30);
    while lab.stats(d).iter().any(|(k, v)| k == "channels" && *v != 0) {
        assert!(
            Instant::now() < deadline,
            "channels left: {:?}",
            lab.stats(d)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut g = guest(&lab, d, "bypass");
    g.cmd("cq c 4");
}

/// SIGKILL of the backend under traffic: a guest RDMA WRITEing in a loop (bypass, spinning on
/// its CQ), one blocked in a wait (mediated: a control call per poll), and one blocked in a
/// wait (bypass) all get
/// "device lost" within [`LOST_WITHIN`] (the measured times are printed); after a new backend
/// starts, the guests reopen the device, reconnect, and move verified data.
#[test]
fn a_killed_backend_is_device_lost_and_guests_reconnect_to_a_new_one() {
    let mut lab = Lab::start();
    let (da, db, dc) = (
        lab.create_guest("a"),
        lab.create_guest("b"),
        lab.create_guest("c"),
    );
    for d in [da, db, dc] {
        lab.attach(d, &[]);
    }
    let (mut a, mut b, mut c) = (
        guest(&lab, da, "bypass"),
        guest(&lab, db, "mediated"),
        guest(&lab, dc, "bypass"),
    );
    let rb = connect(&mut a, &mut b);
    verified_transfer(&mut a, &mut b, &rb, 1);
    c.cmd("cq c 4");

    // Traffic: a RDMA WRITEs to b in a loop, spinning on its CQ; b and c block in waits.
    a.send_only(&format!("loop q c m 4096 {rb}"));
    assert_eq!(a.reply(), Ok("looping".into()));
    b.send_only("wait c 1 60000");
    c.send_only("wait c 1 60000");
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    lab.kill_backend();
    for (name, g) in [
        ("a (bypass, WRITE loop)", &mut a),
        ("b (mediated, wait)", &mut b),
        ("c (bypass, blocked wait)", &mut c),
    ] {
        let r = g.reply();
        let took = t0.elapsed();
        eprintln!("{name}: {r:?} after {took:?}");
        let e = r.expect_err("a dead backend must be an error, not an empty poll");
        assert!(e.contains("device lost"), "{name}: {e}");
        assert!(took < LOST_WITHIN, "{name} learned after {took:?}");
    }

    // A new backend: the guests reopen, reconnect and move data again.
    lab.restart_backend();
    let t1 = Instant::now();
    for g in [&mut a, &mut b, &mut c] {
        g.cmd("open bypass");
    }
    eprintln!("reopened after {:?}", t1.elapsed());
    let rb = connect(&mut a, &mut b);
    verified_transfer(&mut a, &mut b, &rb, 10);
    c.cmd("cq c 4");
}

/// The backend publishes its address in every device's backend node: the configuration's
/// first `address`, 127.0.0.1 on the simulated host without one (the guests hand it to their
/// peers; the connection manager listens on it).
#[test]
fn the_backend_publishes_its_address() {
    for (config, want) in [
        ("", "127.0.0.1"),
        ("address = [\"127.0.0.7\"]", "127.0.0.7"),
    ] {
        let lab = Lab::start_with_config(config);
        let d = lab.create_guest("a");
        lab.attach(d, &[]);
        let path = format!("{}/address", lab.back_dir(d));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while lab.read(&path).is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(lab.read(&path).as_deref(), Some(want), "{config:?}");
    }
}
