//! RDMA between two hosts (issue 12's proof): two complete simulated hosts on this machine
//! (`TwoHosts`: own hypervisor, XenStore and `vrdma-backend` process each, at 127.0.0.2 and
//! 127.0.0.3), a guest on each; the guest on B listens, the guest on A connects through the
//! connection manager, and the backends run the QPs over iWARP (MPA/DDP/RDMAP over TCP).
//!
//! Data: SEND/RECV, RDMA WRITE and RDMA READ of 1 B, 4 KiB, 1 MiB and 16 MiB both ways,
//! verified byte by byte, bypass and mediated; eight QPs between the same two guests at once;
//! eight READs outstanding. Failures: disconnect from either side, a killed guest, a killed
//! backend, and a fault proxy in front of B's listener that resets, stalls or corrupts a byte
//! — each side's completion statuses and events asserted by name, nothing hangs (every wait is
//! bounded), and nothing leaks (the backends' stats return to zero, their sockets close).
//! Wire: the proxy records a run's byte streams, they become a pcap, and Wireshark's own
//! iWARP dissectors (`tshark`) must read every FPDU with a good CRC (CRC on) and clean (CRC
//! off). Without `tshark` that test fails unless `VRDMA_SKIP_TSHARK=1`.

use std::net::{SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use tshark_support::tshark::{self, dissect, expert, TempPcap};
use vrdma_tests::pcap::{Capture, Unit};
use vrdma_tests::proxy::{Dir, Fault, Proxy};
use vrdma_tests::{Guest, Lab, TwoHosts, Wc};

const GUEST: &str = env!("CARGO_BIN_EXE_vrdma-guest");
const MIB: usize = 1 << 20;
/// The largest transfer, and the guests' region size (two halves: send from / receive into).
const BIG: usize = 16 * MIB;
/// Per-command bound of the waits in this file (ms).
const WAIT_MS: u64 = 60_000;

/// Both backends: connects time out after 3 s, any loopback peer; CRC per `crc`.
fn config(crc: &str) -> String {
    format!("[cm]\nallowed-peers = [\"127.0.0.0/8\"]\nconnect-timeout-ms = 3000\ncrc = \"{crc}\"\n")
}

/// Guest `g` with CQ `c` (1024 entries) and region `m` of `mr` bytes; its remote string.
fn setup(g: &mut Guest, mr: usize) -> String {
    g.cmd("cq c 1024");
    g.cmd(&format!("mr m {mr}"))
}

/// Both hosts (MPA CRC policy `crc`, see [`config`]) and a guest on each (device open in
/// `mode`), each [`setup`] with a region of `mr` bytes; A's and B's remote strings.
fn start(crc: &str, mode: &str, mr: usize) -> (TwoHosts, Guest, Guest, String, String) {
    let hosts = TwoHosts::start_with_config(&config(crc));
    let (mut a, mut b) = hosts.guests(GUEST.as_ref(), mode);
    let ra = setup(&mut a, mr);
    let rb = setup(&mut b, mr);
    (hosts, a, b, ra, rb)
}

/// `n` QPs `q0..` on each guest, connected A → B (B's listener `l` on a kernel-chosen port),
/// each with private data both ways. Returns B's listener address and what A's connect of
/// `q0` answered (IRD, ORD, B's private data).
fn connect(a: &mut Guest, b: &mut Guest, n: usize) -> (SocketAddr, String) {
    let listen: SocketAddr = b.cmd("listen l 0 16").parse().expect("listener address");
    let to = listen;
    let mut first = String::new();
    for i in 0..n {
        a.cmd(&format!("qp q{i} c c 128 128"));
        b.cmd(&format!("qp q{i} c c 128 128"));
        a.send_only(&format!("connect_to q{i} {to} 10000 a1{i:02x}"));
        let acc = b.cmd(&format!("accept l q{i} 10000 b2{i:02x}"));
        let got = a.reply().unwrap_or_else(|e| panic!("connect q{i}: {e}"));
        // Each side got the other's private data.
        assert!(got.ends_with(&format!("b2{i:02x}")), "{got}");
        assert!(acc.ends_with(&format!("a1{i:02x}")), "{acc}");
        if i == 0 {
            first = got;
        }
    }
    (listen, first)
}

/// The guest and its host, for messages (both hosts number their guests from 1).
fn who(g: &Guest) -> String {
    format!("guest {} on {}", g.domid, g.host)
}

/// What helps with a hang: the events `g`'s device reported (`kind:QP:detail`; a QP that
/// failed or disconnected says so there).
fn events(g: &mut Guest) -> String {
    match g.try_cmd("events") {
        Ok(e) => format!("its events: [{e}]"),
        Err(e) => format!("no events: {e}"),
    }
}

/// Exactly `n` completions on `g`'s CQ `c` within the bound.
fn wcs(g: &mut Guest, n: usize) -> Vec<Wc> {
    let w = Guest::completions(&g.cmd(&format!("poll c {n} {WAIT_MS}")));
    if w.len() != n {
        panic!(
            "{}: {} of {n} completions in {WAIT_MS} ms: {w:?}; {}",
            who(g),
            w.len(),
            events(g)
        );
    }
    w
}

/// One completion on `g`'s CQ `c` within the bound, successful (`what` names it).
fn one_ok(g: &mut Guest, what: &str) -> Wc {
    one_ok_within(g, what, WAIT_MS)
}

fn one_ok_within(g: &mut Guest, what: &str, ms: u64) -> Wc {
    let w = Guest::completions(&g.cmd(&format!("poll c 1 {ms}")));
    let Some(w) = w.into_iter().next() else {
        panic!(
            "{}: no completion of the {what} in {ms} ms; {}",
            who(g),
            events(g)
        )
    };
    assert!(w.ok(), "{}: {what}: {w:?}", who(g));
    w
}

/// SEND, WRITE and READ of `size` bytes from `x` to `y` (remote region `ry`) on QP `q`, each
/// verified byte by byte with patterns from `seed`. Data goes from `x`'s low half to `y`'s
/// high half (and back for the READ), so no byte is where it was before by chance.
fn traffic(x: &mut Guest, y: &mut Guest, ry: &str, q: &str, size: usize, seed: u64) {
    let hi = BIG;
    y.cmd(&format!("recv {q} m {hi} {size} 11"));
    x.cmd(&format!("fill m {seed} 0 {size}"));
    x.cmd(&format!("send {q} m 0 {size} 12"));
    one_ok(x, &format!("SEND of {size} B"));
    let r = one_ok(y, &format!("RECV of {size} B"));
    assert_eq!((r.opcode.as_str(), r.byte_len as usize), ("Recv", size));
    y.cmd(&format!("check m {seed} {hi} {size}"));

    x.cmd(&format!("fill m {} 0 {size}", seed + 1));
    let (addr, len, key) = split_remote(ry);
    let dst = format!("{:x}:{:x}:{key}", addr + hi as u64, len - hi as u64);
    x.cmd(&format!("write {q} m 0 {size} {dst} 13"));
    one_ok(x, &format!("WRITE of {size} B"));
    fence(x, q, ry, 2 * BIG, 15);
    one_ok(x, &format!("1-byte READ after a WRITE of {size} B"));
    y.cmd(&format!("check m {} {hi} {size}", seed + 1));

    y.cmd(&format!("fill m {} {hi} {size}", seed + 2));
    x.cmd(&format!("fill m 0 0 {size}"));
    x.cmd(&format!("read {q} m 0 {size} {dst} 14"));
    let r = one_ok(x, &format!("READ of {size} B"));
    assert_eq!(r.opcode, "RdmaRead");
    x.cmd(&format!("check m {} 0 {size}", seed + 2));
}

/// Waits until every WRITE posted on `q` before it was placed at the peer: a WRITE completes
/// when the transport took its bytes (iWARP has no acknowledgement, as in siw), and a READ
/// behind it on the same QP completes only after the peer placed them (RDMAP ordering). The
/// 1-byte READ lands in the last byte of `x`'s region `m` of `len` bytes.
fn fence(x: &mut Guest, q: &str, ry: &str, len: usize, wr_id: u64) {
    x.cmd(&format!("read {q} m {} 1 {ry} {wr_id}", len - 1));
}

/// `addr:len:rkey` of a remote region.
fn split_remote(r: &str) -> (u64, u64, String) {
    let f: Vec<&str> = r.split(':').collect();
    let h = |x: &str| u64::from_str_radix(x, 16).unwrap();
    (h(f[0]), h(f[1]), f[2].to_string())
}

fn remote_at(r: &str, off: usize) -> String {
    let (a, l, k) = split_remote(r);
    format!("{:x}:{:x}:{k}", a + off as u64, l - off as u64)
}

fn all_sizes_both_ways(mode: &str) {
    let (_hosts, mut a, mut b, ra, rb) = start("offer", mode, 2 * BIG);
    let (_, negotiated) = connect(&mut a, &mut b, 1);
    eprintln!("{mode}: connected, A's ird/ord/private: {negotiated}");
    for (i, size) in [1usize, 4096, MIB, BIG].into_iter().enumerate() {
        traffic(&mut a, &mut b, &rb, "q0", size, 100 + 10 * i as u64);
        traffic(&mut b, &mut a, &ra, "q0", size, 500 + 10 * i as u64);
    }
}

#[test]
fn send_write_read_1b_to_16mib_both_ways_bypass() {
    all_sizes_both_ways("bypass");
}

#[test]
fn send_write_read_1b_to_16mib_both_ways_mediated() {
    all_sizes_both_ways("mediated");
}

/// Eight QPs between the same two guests, all busy at once: a 1 MiB WRITE on each posted
/// before any completion is polled (A → B), then a 64 KiB SEND on each the other way; every
/// byte lands in its QP's own range.
#[test]
fn eight_qps_between_two_guests_at_once() {
    let (_hosts, mut a, mut b, _, rb) = start("offer", "bypass", 2 * BIG);
    connect(&mut a, &mut b, 8);
    for i in 0..8usize {
        a.cmd(&format!("fill m {} {} {MIB}", 1000 + i, i * MIB));
    }
    for i in 0..8usize {
        let dst = remote_at(&rb, i * MIB);
        a.cmd(&format!("write q{i} m {} {MIB} {dst} {i}", i * MIB));
    }
    let done = wcs(&mut a, 8);
    assert!(
        done.iter().all(|w| w.ok() && w.opcode == "RdmaWrite"),
        "{done:?}"
    );
    let mut ids: Vec<u64> = done.iter().map(|w| w.wr_id).collect();
    ids.sort();
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
    for i in 0..8usize {
        fence(&mut a, &format!("q{i}"), &rb, 2 * BIG, 50 + i as u64);
    }
    assert!(wcs(&mut a, 8).iter().all(|w| w.ok()));
    for i in 0..8usize {
        b.cmd(&format!("check m {} {} {MIB}", 1000 + i, i * MIB));
    }
    let k = 64 << 10;
    for i in 0..8usize {
        a.cmd(&format!("recv q{i} m {} {k} {}", BIG + i * k, 100 + i));
        b.cmd(&format!("fill m {} {} {k}", 2000 + i, BIG + i * k));
    }
    for i in 0..8usize {
        b.cmd(&format!("send q{i} m {} {k} {}", BIG + i * k, 200 + i));
    }
    let sent = wcs(&mut b, 8);
    assert!(
        sent.iter().all(|w| w.ok() && w.opcode == "Send"),
        "{sent:?}"
    );
    let got = wcs(&mut a, 8);
    assert!(
        got.iter().all(|w| w.ok() && w.byte_len as usize == k),
        "{got:?}"
    );
    for i in 0..8usize {
        a.cmd(&format!("check m {} {} {k}", 2000 + i, BIG + i * k));
    }
}

/// Eight RDMA READs outstanding on one QP (posted back to back, none polled in between),
/// each 512 KiB from its own range of B's region: all complete, in order, each range right.
/// The negotiated ORD is printed; READs beyond it wait their turn in the backend.
#[test]
fn eight_reads_outstanding_complete_in_order() {
    let (_hosts, mut a, mut b, _, rb) = start("offer", "bypass", 8 * MIB);
    let (_, negotiated) = connect(&mut a, &mut b, 1);
    eprintln!("ird ord private at A: {negotiated}");
    // Both ends may have all eight outstanding at once.
    let f: Vec<u32> = negotiated
        .split(' ')
        .take(2)
        .map(|x| x.parse().unwrap())
        .collect();
    assert!(f.iter().all(|&x| x >= 8), "IRD/ORD {f:?}");
    let k = 512 << 10;
    for i in 0..8usize {
        b.cmd(&format!("fill m {} {} {k}", 3000 + i, i * k));
    }
    for i in 0..8usize {
        let src = remote_at(&rb, i * k);
        a.cmd(&format!("read q0 m {} {k} {src} {i}", i * k));
    }
    let done = wcs(&mut a, 8);
    let ids: Vec<u64> = done.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..8).collect::<Vec<_>>(), "{done:?}");
    assert!(
        done.iter().all(|w| w.ok() && w.opcode == "RdmaRead"),
        "{done:?}"
    );
    for i in 0..8usize {
        a.cmd(&format!("check m {} {} {k}", 3000 + i, i * k));
    }
}

/// Waits (bounded) until `g` saw event `kind` on QP `q`; the kinds seen on it.
fn event(g: &mut Guest, q: &str, kind: &str) -> String {
    match g.try_cmd(&format!("event {q} {kind} 30000")) {
        Ok(s) => s,
        Err(e) => panic!("{}: {e}; {}", who(g), events(g)),
    }
}

/// `n` RECVs posted on `q` (wr_ids 900..), then all flushed: `WrFlushError`.
fn post_recvs(g: &mut Guest, q: &str, n: usize) {
    for i in 0..n {
        g.cmd(&format!("recv {q} m {} 4096 {}", i * 4096, 900 + i));
    }
}

fn assert_flushed(g: &mut Guest, n: usize) {
    let w = wcs(g, n);
    assert!(
        w.iter().all(|w| w.status == "WrFlushError"),
        "{}: {w:?}",
        who(g)
    );
    let mut ids: Vec<u64> = w.iter().map(|w| w.wr_id).collect();
    ids.sort();
    assert_eq!(ids, (900..900 + n as u64).collect::<Vec<_>>());
}

/// One stat of a domain's device on a host (0 when the node is gone).
fn stat(lab: &Lab, g: &Guest, name: &str) -> u64 {
    lab.stats(g.domid)
        .into_iter()
        .find(|(k, _)| k == name)
        .map_or(0, |(_, v)| v)
}

/// The backend process's open file descriptors, by target (`socket:[…]`, …).
fn fds(lab: &Lab) -> Vec<String> {
    let pid = lab.backend_pid().expect("backend running");
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the backend's fds")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.display().to_string())
        .collect();
    v.sort();
    v
}

fn sockets(lab: &Lab) -> usize {
    fds(lab).iter().filter(|f| f.starts_with("socket:")).count()
}

/// Polls `done` every 20 ms for up to 30 s; whether it came true.
fn within_30s(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if done() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (bounded) until `lab`'s backend holds no more sockets than `base`; its socket count.
fn sockets_back_to(lab: &Lab, base: usize) -> usize {
    within_30s(|| sockets(lab) <= base);
    sockets(lab)
}

/// Waits (bounded) until domain `g`'s device on `lab` counts no QPs, MRs or channels; what
/// it still counts.
fn drained(lab: &Lab, d: xen_platform::DomId) -> Vec<(String, u64)> {
    let left = || -> Vec<(String, u64)> {
        lab.stats(d)
            .into_iter()
            .filter(|(k, v)| {
                ["qps", "mrs", "channels", "cqs", "pds"].contains(&k.as_str()) && *v != 0
            })
            .collect()
    };
    within_30s(|| left().is_empty());
    left()
}

/// Disconnect from B, then (a new connection) from A: both ends see `QpDisconnected` and their
/// posted RECVs come back `WrFlushError`; a new connection after each works.
#[test]
fn disconnect_from_either_side_flushes_both() {
    let (_hosts, mut a, mut b, ra, rb) = start("offer", "bypass", 2 * BIG);
    connect(&mut a, &mut b, 1);
    traffic(&mut a, &mut b, &rb, "q0", 4096, 1);
    post_recvs(&mut a, "q0", 3);
    post_recvs(&mut b, "q0", 2);
    b.cmd("disconnect q0");
    let seen_b = event(&mut b, "q0", "QpDisconnected");
    let seen_a = event(&mut a, "q0", "QpDisconnected");
    assert_flushed(&mut a, 3);
    assert_flushed(&mut b, 2);
    eprintln!("B disconnected: A saw {seen_a}, B saw {seen_b}");
    assert!(
        !seen_a.contains("QpFatal") && !seen_b.contains("QpFatal"),
        "{seen_a} / {seen_b}"
    );

    // Again, A disconnecting this time (new QPs, same listener).
    for g in [&mut a, &mut b] {
        g.cmd("drop q0");
        g.cmd("qp q1 c c 16 16");
    }
    let l = b.cmd("listen l2 0");
    a.send_only(&format!("connect_to q1 {l} 10000"));
    b.cmd("accept l2 q1 10000");
    a.reply().expect("second connect");
    traffic(&mut b, &mut a, &ra, "q1", 4096, 2);
    post_recvs(&mut a, "q1", 1);
    post_recvs(&mut b, "q1", 4);
    a.cmd("disconnect q1");
    let seen_a = event(&mut a, "q1", "QpDisconnected");
    let seen_b = event(&mut b, "q1", "QpDisconnected");
    assert_flushed(&mut a, 1);
    assert_flushed(&mut b, 4);
    eprintln!("A disconnected: A saw {seen_a}, B saw {seen_b}");
}

/// One more QP `q` on each guest, connected A → B at `to` (B's listener `l`).
fn connect_one(a: &mut Guest, b: &mut Guest, l: &str, to: SocketAddr, q: &str) {
    a.cmd(&format!("qp {q} c c 128 128"));
    b.cmd(&format!("qp {q} c c 128 128"));
    a.send_only(&format!("connect_to {q} {to} 10000"));
    b.cmd(&format!("accept {l} {q} 10000"));
    a.reply().unwrap_or_else(|e| panic!("connect {q}: {e}"));
}

/// B listens (`l`), a proxy made by `proxy` stands in front of its listener, and QP `q0`
/// connects A → B through it. Returns B's listener address and the proxy.
fn connect_through(
    a: &mut Guest,
    b: &mut Guest,
    proxy: impl FnOnce(SocketAddr) -> std::io::Result<Proxy>,
) -> (SocketAddr, Proxy) {
    let listen: SocketAddr = b.cmd("listen l 0").parse().unwrap();
    let proxy = proxy(listen).expect("proxy");
    connect_one(a, b, "l", proxy.addr(), "q0");
    (listen, proxy)
}

/// QP `q` of both guests and B's listener `l` dropped, then [`assert_no_leak`].
fn drop_and_assert_no_leak(
    hosts: &mut TwoHosts,
    base: Baseline,
    mut a: Guest,
    mut b: Guest,
    q: &str,
) {
    for g in [&mut a, &mut b] {
        g.cmd(&format!("drop {q}"));
    }
    b.cmd("drop l");
    assert_no_leak(hosts, base, vec![(true, a), (false, b)]);
}

/// What the leak check compares: each backend's sockets with the guests' channels open and
/// no connection.
struct Baseline {
    a: usize,
    b: usize,
}

fn baseline(hosts: &TwoHosts) -> Baseline {
    Baseline {
        a: sockets(&hosts.a),
        b: sockets(&hosts.b),
    }
}

/// The guests' QPs and listeners are gone: each live backend's sockets are back to `base`
/// (its TCP connections and listeners closed); then the guests exit and their devices count
/// no QP, MR, CQ, PD or channel.
fn assert_no_leak(hosts: &mut TwoHosts, base: Baseline, guests: Vec<(bool, Guest)>) {
    for (on_a, g) in guests {
        let lab = if on_a { &mut hosts.a } else { &mut hosts.b };
        if !lab.backend_alive() {
            continue;
        }
        let d = g.domid;
        let _ = g.exit();
        let left = drained(lab, d);
        assert!(
            left.is_empty(),
            "host {}: left after the guest closed: {left:?}",
            lab.name()
        );
    }
    for (lab, base) in [(&mut hosts.a, base.a), (&mut hosts.b, base.b)] {
        if !lab.backend_alive() {
            continue;
        }
        let n = sockets_back_to(lab, base);
        assert!(
            n <= base,
            "host {}: {n} sockets, {base} before: {:?}",
            lab.name(),
            fds(lab)
        );
    }
}

/// The device of `g` on `lab` counts `name` ≥ 1 now (the stats the leak check reads exist).
fn assert_counted(lab: &Lab, g: &Guest, name: &str) {
    assert!(
        within_30s(|| stat(lab, g, name) > 0),
        "no {name} in {:?}",
        lab.stats(g.domid)
    );
}

/// A guest process killed (SIGKILL) while it RDMA WRITEs to B in a loop: B's QP gets
/// `QpDisconnected` and its posted RECVs `WrFlushError`; B's backend keeps serving (a new
/// guest on A connects to the same listener and moves verified data); nothing leaks.
#[test]
fn a_killed_guest_disconnects_its_peer_and_both_backends_keep_serving() {
    let (mut hosts, mut a, mut b, _, rb) = start("offer", "bypass", 4 * MIB);
    let base = baseline(&hosts);
    let (listen, _) = connect(&mut a, &mut b, 1);
    assert_counted(&hosts.b, &b, "qps");
    assert_counted(&hosts.b, &b, "mrs");
    post_recvs(&mut b, "q0", 3);
    a.send_only(&format!("loop q0 c m {} {rb}", 256 << 10));
    assert_eq!(a.reply(), Ok("looping".into()));
    a.kill();
    let seen = event(&mut b, "q0", "QpDisconnected");
    assert_flushed(&mut b, 3);
    eprintln!("B saw {seen} after A's guest was killed");

    let mut a2 = hosts.a.start_guest(GUEST.as_ref(), "a2", "bypass");
    setup(&mut a2, 2 * BIG);
    b.cmd("drop m");
    let rb = b.cmd(&format!("mr m {}", 2 * BIG));
    connect_one(&mut a2, &mut b, "l", listen, "q1");
    traffic(&mut a2, &mut b, &rb, "q1", MIB, 7);
    b.cmd("drop q0");
    drop_and_assert_no_leak(&mut hosts, base, a2, b, "q1");
}

/// Host A's backend killed (SIGKILL) with a connection up: B's QP gets `QpDisconnected` and
/// its RECVs `WrFlushError`; A's guest is told its device is lost; nothing hangs; B leaks
/// nothing.
#[test]
fn a_killed_backend_disconnects_the_other_host() {
    let (mut hosts, mut a, mut b, _, rb) = start("offer", "mediated", 2 * BIG);
    let base = baseline(&hosts);
    connect(&mut a, &mut b, 1);
    traffic(&mut a, &mut b, &rb, "q0", 4096, 3);
    post_recvs(&mut b, "q0", 2);
    hosts.a.kill_backend();
    let seen = event(&mut b, "q0", "QpDisconnected");
    assert_flushed(&mut b, 2);
    eprintln!("B saw {seen} after A's backend was killed");
    let lost = format!("{:?}", a.try_cmd("poll c 1 10000"));
    assert!(lost.contains("device lost"), "A's guest: {lost}");
    b.cmd("drop q0");
    b.cmd("drop l");
    assert_no_leak(&mut hosts, base, vec![(false, b)]);
}

/// A proxy in front of B's listener resets both TCP connections after 4 MiB of A's 16 MiB
/// WRITE: A's WRITE completes `WrFlushError` (it never got all its bytes out), both QPs
/// get `QpDisconnected`, B's RECVs are flushed; nothing leaks (the proxy is gone too).
#[test]
fn a_reset_mid_transfer_flushes_both_sides() {
    let (mut hosts, mut a, mut b, _, rb) = start("offer", "bypass", 2 * BIG);
    let base = baseline(&hosts);
    let (_, proxy) = connect_through(&mut a, &mut b, |l| {
        Proxy::in_front_of(l, Fault::ResetAfter(4 * MIB as u64), Dir::ToTarget)
    });
    post_recvs(&mut b, "q0", 2);
    a.cmd(&format!("write q0 m 0 {BIG} {rb} 1"));
    let w = wcs(&mut a, 1).remove(0);
    assert_eq!((w.wr_id, w.status.as_str()), (1, "WrFlushError"), "{w:?}");
    let seen_b = event(&mut b, "q0", "QpDisconnected");
    assert_flushed(&mut b, 2);
    eprintln!("reset: B saw {seen_b}");
    let seen_a = event(&mut a, "q0", "QpDisconnected");
    assert_eq!(proxy.faults_fired(), 1);
    eprintln!("reset: A saw {seen_a}, B saw {seen_b}");
    drop(proxy);
    drop_and_assert_no_leak(&mut hosts, base, a, b, "q0");
}

/// A byte flipped (XOR 0xff) in the middle of A's 1 MiB WRITE, CRC on: B finds the CRC
/// wrong, sends a Terminate and fails its QP; A's QP fails on the Terminate; each side's
/// status and events by name; nothing leaks.
#[test]
fn a_corrupted_byte_with_crc_terminates_both_sides() {
    let (mut hosts, mut a, mut b, _, rb) = start("require", "bypass", 2 * MIB);
    let base = baseline(&hosts);
    let (_, proxy) = connect_through(&mut a, &mut b, |l| {
        Proxy::in_front_of(l, Fault::FlipByte(300_000), Dir::ToTarget)
    });
    post_recvs(&mut b, "q0", 2);
    a.cmd(&format!("fill m 5 0 {MIB}"));
    a.cmd(&format!("write q0 m 0 {MIB} {rb} 1"));
    fence(&mut a, "q0", &rb, 2 * MIB, 2);
    let w = wcs(&mut a, 2);
    let seen_b = event(&mut b, "q0", "QpFatal");
    let seen_a = event(&mut a, "q0", "QpDisconnected");
    let flushed = wcs(&mut b, 2);
    eprintln!("flip: A's WCs {w:?}, A saw {seen_a}, B saw {seen_b}, B's RECVs {flushed:?}");
    assert_eq!(proxy.faults_fired(), 1);
    // The WRITE may have left whole before the Terminate came back (iWARP completes a WRITE
    // when the transport took it); the READ behind it cannot complete without B.
    // The oldest WQE still running fails `RemoteOperationError`, the ones behind it flush —
    // and the READ flushes too when the Terminate arrives before A's engine sent its request
    // (a WQE not started when the QP goes to Error is flushed): which one is a race.
    let statuses: Vec<&str> = w.iter().map(|w| w.status.as_str()).collect();
    assert!(
        statuses == ["Success", "RemoteOperationError"]
            || statuses == ["Success", "WrFlushError"]
            || statuses == ["RemoteOperationError", "WrFlushError"],
        "{w:?}"
    );
    assert!(seen_a.contains("QpFatal"), "A: {seen_a}");
    assert!(
        flushed.iter().all(|w| w.status == "WrFlushError"),
        "{flushed:?}"
    );
    drop(proxy);
    drop_and_assert_no_leak(&mut hosts, base, a, b, "q0");
}

/// The proxy stops forwarding (both ways, both connections kept open) after 1 MiB of A's
/// 16 MiB WRITE. A's stream stops taking bytes; `TCP_USER_TIMEOUT` (the data path sets 20 s)
/// fails A's socket: A's WRITE `WrFlushError`, `QpDisconnected`. B's socket is idle and open
/// (the proxy's kernel answers its keepalive probes), so B learns only when the proxy closes.
/// Prints how long A took.
#[test]
fn a_stalled_connection_fails_at_the_tcp_timeout() {
    let (mut hosts, mut a, mut b, _, rb) = start("offer", "bypass", 2 * BIG);
    let base = baseline(&hosts);
    let (_, proxy) = connect_through(&mut a, &mut b, |l| {
        Proxy::in_front_of(l, Fault::StallAfter(MIB as u64), Dir::ToTarget)
    });
    post_recvs(&mut b, "q0", 2);
    let t = Instant::now();
    a.cmd(&format!("write q0 m 0 {BIG} {rb} 1"));
    let w = Guest::completions(&a.cmd("poll c 1 90000"));
    let took = t.elapsed();
    eprintln!("stall: A's WRITE after {took:?}: {w:?}");
    assert_eq!(w.len(), 1, "A's WRITE still running after {took:?}");
    assert_eq!(w[0].status, "WrFlushError", "{w:?}");
    let seen_a = event(&mut a, "q0", "QpDisconnected");
    assert_eq!(stat(&hosts.b, &b, "qps"), 1);
    drop(proxy);
    let seen_b = event(&mut b, "q0", "QpDisconnected");
    assert_flushed(&mut b, 2);
    eprintln!("stall: A saw {seen_a}, B saw {seen_b} once the proxy closed");
    drop_and_assert_no_leak(&mut hosts, base, a, b, "q0");
}

/// A run between the hosts through a recording proxy (MPA `crc` policy on both backends):
/// SEND, WRITE and READ of 1 B, 4 KiB and 256 KiB each way, then a disconnect. Returns the
/// capture of the one connection.
fn recorded_run(crc: &str) -> Capture {
    let (_hosts, mut a, mut b, ra, rb) = start(crc, "bypass", 2 * BIG);
    let (listen, proxy) = connect_through(&mut a, &mut b, Proxy::recording);
    for (i, size) in [1usize, 4096, 256 << 10].into_iter().enumerate() {
        traffic(&mut a, &mut b, &rb, "q0", size, 40 + i as u64);
        traffic(&mut b, &mut a, &ra, "q0", size, 80 + i as u64);
    }
    a.cmd("disconnect q0");
    event(&mut b, "q0", "QpDisconnected");
    // Both ends closed their streams: the proxy's connection ends (bounded wait).
    assert!(
        within_30s(|| proxy.open_connections() == 0),
        "the proxied connection stays open"
    );
    let chunks = proxy.recorded();
    assert_eq!(proxy.accepted(), 1);
    let mut cap = Capture::new();
    let SocketAddr::V4(responder) = listen else {
        panic!("B's listener is not IPv4: {listen}")
    };
    let initiator = SocketAddrV4::new(std::net::Ipv4Addr::new(127, 0, 0, 2), 40_000);
    let left = cap.add_connection(&chunks, 0, initiator, responder);
    assert_eq!(left, [0, 0], "the recorded streams end on a frame boundary");
    cap
}

/// Checks a recorded run with tshark: every frame read, the MPA request and reply dissected,
/// every FPDU `iwarp_mpa` + `iwarp_ddp_rdmap` with a good CRC (`crc`) or a zero, unchecked
/// CRC field (not `crc`), no malformed frame, no expert error, warnings only on the MPA
/// frames (Wireshark calls the Enhanced flag reserved); SEND, WRITE, Read Request and Read
/// Response all present.
fn check_with_tshark(cap: &Capture, crc: bool, name: &str) {
    let path = TempPcap::write(&format!("interhost-{name}"), cap.bytes());
    let frames = dissect(path.path());
    assert_eq!(frames.len(), cap.frames.len(), "tshark read every frame");
    let fpdus = cap.count(Unit::Fpdu);
    assert!(fpdus > 20, "only {fpdus} FPDUs recorded");
    let mut mpa = 0;
    for &(n, unit, _, forward) in &cap.frames {
        let f = &frames[n - 1];
        match unit {
            Unit::Mpa => {
                mpa += 1;
                let want = if forward {
                    "Request frame header"
                } else {
                    "Reply frame header"
                };
                assert!(f.contains(want), "frame {n}: no {want}:\n{f}");
            }
            Unit::Fpdu => {
                assert!(
                    f.contains("iwarp_mpa") && f.contains("iwarp_ddp_rdmap"),
                    "frame {n} is not dissected as an FPDU:\n{f}"
                );
                assert!(
                    !f.contains("Bad CRC32") && !f.contains("Malformed"),
                    "frame {n}:\n{f}"
                );
                if crc {
                    assert!(f.contains("(Good CRC32)"), "frame {n}: no good CRC:\n{f}");
                } else {
                    assert!(
                        f.contains("CRC: 0x00000000") && !f.contains("CRC32"),
                        "frame {n} (CRC off):\n{f}"
                    );
                }
            }
            Unit::Handshake => {}
            Unit::Partial => panic!("frame {n} is a partial frame"),
        }
    }
    assert_eq!(mpa, 2, "one MPA request and one reply");
    let all = frames.concat();
    for op in [
        "Write (0x0)",
        "Read Request (0x1)",
        "Read Response (0x2)",
        "Send (0x3)",
    ] {
        assert!(
            all.contains(&format!("OpCode: {op}")),
            "no {op} in the capture"
        );
    }
    let mpa_frames: Vec<usize> = cap
        .frames
        .iter()
        .filter(|f| f.1 == Unit::Mpa)
        .map(|f| f.0)
        .collect();
    for (frame, sev, msg) in expert(path.path()) {
        assert!(
            sev != "Error" && !msg.contains("Malformed"),
            "frame {frame}: {sev} {msg}"
        );
        if sev == "Warning" {
            assert!(mpa_frames.contains(&frame), "frame {frame}: warning {msg}");
        }
    }
    eprintln!(
        "{name}: {} frames, {fpdus} FPDUs dissected clean by tshark",
        frames.len()
    );

    // The check can fail: one byte flipped in the 10th FPDU (past its MPA length, inside
    // every FPDU this run sends) is a bad CRC on that frame and no other (CRC on).
    if crc {
        let target = cap
            .frames
            .iter()
            .filter(|f| f.1 == Unit::Fpdu)
            .nth(9)
            .unwrap()
            .0;
        let bad = TempPcap::write(
            &format!("interhost-{name}-bad"),
            &cap.with_flipped(target, 21),
        );
        let frames = dissect(bad.path());
        for &(n, unit, _, _) in &cap.frames {
            if unit == Unit::Fpdu {
                let f = &frames[n - 1];
                let want = if n == target {
                    "Bad CRC32"
                } else {
                    "(Good CRC32)"
                };
                assert!(
                    f.contains(want),
                    "flipped frame {target}: frame {n} has no {want}:\n{f}"
                );
            }
        }
    }
}

/// Wireshark on real traffic, CRC on (both backends offer it): the proxy in front of B's
/// listener records both directions of a run; as a pcap, tshark reads every FPDU with
/// "Good CRC32" and nothing malformed.
#[test]
fn tshark_reads_recorded_traffic_with_good_crc() {
    if tshark::need("tshark_reads_recorded_traffic_with_good_crc") {
        let cap = recorded_run("offer");
        check_with_tshark(&cap, true, "crc");
    }
}

/// The same with CRC off (both backends decline it, siw's default): every FPDU dissects clean,
/// its CRC field zero and not checked.
#[test]
fn tshark_reads_recorded_traffic_without_crc() {
    if tshark::need("tshark_reads_recorded_traffic_without_crc") {
        let cap = recorded_run("decline");
        check_with_tshark(&cap, false, "nocrc");
    }
}

/// One `QpDisconnected` per end for one disconnect (rdma_cm's one DISCONNECTED event; the
/// data path's own rule, "QpDisconnected once"): the end that disconnects and the peer each
/// see exactly one, however long they look after it.
#[test]
fn a_disconnect_is_reported_once_at_each_end() {
    let (_hosts, mut a, mut b, _, _) = start("offer", "bypass", 4 * MIB);
    connect(&mut a, &mut b, 1);
    b.cmd("disconnect q0");
    event(&mut b, "q0", "QpDisconnected");
    event(&mut a, "q0", "QpDisconnected");
    std::thread::sleep(Duration::from_secs(1));
    for (end, g) in [("B (disconnecting)", &mut b), ("A (peer)", &mut a)] {
        let seen = event(g, "q0", "QpDisconnected");
        let n = seen.split(',').filter(|k| *k == "QpDisconnected").count();
        assert_eq!(n, 1, "{end} saw {seen}");
    }
}

/// A completion that never comes is reported with the guest's host (both hosts have a guest
/// 1) and the events its device reported.
#[test]
#[should_panic(
    expected = "guest 1 on host-b (127.0.0.3): no completion of the RECV in 200 ms; \
                           its events: ["
)]
fn a_missing_completion_names_the_host_and_its_events() {
    let (_hosts, mut a, mut b, _, _) = start("offer", "bypass", MIB);
    connect(&mut a, &mut b, 1);
    b.cmd("recv q0 m 0 16 1");
    one_ok_within(&mut b, "RECV", 200);
}
