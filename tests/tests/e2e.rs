//! End to end: guests in two simulated domains (`vrdma-guest` processes) talk through the
//! vrdma backend running as dom0 on a simulated host embedded in the test. Every scenario runs
//! in bypass and in mediated mode.

use vrdma_backend::resources::Resource;
use vrdma_tests::{Guest, Lab, Wc};
use xen_platform::DomId;

const GUEST: &str = env!("CARGO_BIN_EXE_vrdma-guest");
const MAX_MSG: usize = 4 << 20;
const SIZES: [usize; 8] = [1, 63, 64, 4095, 4096, 65_539, 1 << 20, MAX_MSG];

fn guest(lab: &Lab, d: DomId, mode: &str) -> Guest {
    let mut g = lab.spawn_guest(GUEST.as_ref(), d);
    g.cmd(&format!("open {mode}"));
    g
}

/// Two guests in two domains, each with CQ `c`, QP `q` (connected to the other) and a
/// `MAX_MSG` region `m`. Returns the remote strings of the regions.
fn pair(mode: &str) -> (Lab, Guest, Guest, String, String) {
    pair_on(Lab::start(), mode)
}

fn pair_on(lab: Lab, mode: &str) -> (Lab, Guest, Guest, String, String) {
    let (da, db) = (lab.create_guest("a"), lab.create_guest("b"));
    lab.attach(da, &[]);
    lab.attach(db, &[]);
    let (mut a, mut b) = (guest(&lab, da, mode), guest(&lab, db, mode));
    let (ra, rb) = connect(&mut a, &mut b, "q", "c", "m");
    (lab, a, b, ra, rb)
}

fn connect(a: &mut Guest, b: &mut Guest, q: &str, c: &str, m: &str) -> (String, String) {
    for g in [&mut *a, &mut *b] {
        g.cmd(&format!("cq {c} 64"));
    }
    let ea = a.cmd(&format!("qp {q} {c} {c} 32 32"));
    let eb = b.cmd(&format!("qp {q} {c} {c} 32 32"));
    // The backend answers Connect when both sides connected: a waits while b connects.
    a.send_only(&format!("connect {q} {eb}"));
    b.cmd(&format!("connect {q} {ea}"));
    a.reply().expect("connect");
    let ra = a.cmd(&format!("mr {m} {MAX_MSG}"));
    let rb = b.cmd(&format!("mr {m} {MAX_MSG}"));
    (ra, rb)
}

fn one(g: &mut Guest, cq: &str) -> Wc {
    let r = g.cmd(&format!("poll {cq} 1 60000"));
    let wcs = Guest::completions(&r);
    assert_eq!(wcs.len(), 1, "one completion on {cq} expected, got {r:?}");
    wcs.into_iter().next().unwrap()
}

fn data_path(mode: &str) {
    let (_lab, mut a, mut b, _ra, rb) = pair(mode);
    for (i, &size) in SIZES.iter().enumerate() {
        let seed = i as u64 + 1;
        // SEND / RECV
        b.cmd(&format!("recv q m 0 {size} {}", 100 + i));
        a.cmd(&format!("fill m {seed} 0 {size}"));
        a.cmd(&format!("send q m 0 {size} {}", 200 + i));
        let s = one(&mut a, "c");
        assert!(
            s.ok() && s.opcode == "Send" && s.wr_id == 200 + i as u64,
            "{s:?}"
        );
        let r = one(&mut b, "c");
        assert!(r.ok() && r.opcode == "Recv", "{r:?}");
        assert_eq!((r.wr_id, r.byte_len as usize), (100 + i as u64, size));
        b.cmd(&format!("check m {seed} 0 {size}"));

        // SEND with immediate
        b.cmd(&format!("recv q m 0 {size} {}", 300 + i));
        a.cmd(&format!("send q m 0 {size} {} {}", 400 + i, 0xabc0 + i));
        assert!(one(&mut a, "c").ok());
        let r = one(&mut b, "c");
        assert_eq!(r.imm, Some(0xabc0 + i as u32), "{r:?}");

        // RDMA WRITE with immediate (consumes a receive at b)
        let seed = seed + 1000;
        a.cmd(&format!("fill m {seed} 0 {size}"));
        b.cmd(&format!("recv q m 0 0 {}", 500 + i));
        a.cmd(&format!("write q m 0 {size} {rb} {} {}", 600 + i, 7 + i));
        let w = one(&mut a, "c");
        assert!(w.ok() && w.opcode == "RdmaWrite", "{w:?}");
        let r = one(&mut b, "c");
        assert!(r.ok() && r.opcode == "RecvRdmaWithImm", "{r:?}");
        assert_eq!(r.imm, Some(7 + i as u32));
        b.cmd(&format!("check m {seed} 0 {size}"));

        // RDMA WRITE (no immediate) at an offset
        let seed = seed + 1000;
        a.cmd(&format!("fill m {seed} 0 {size}"));
        let rb_at = rb_offset(&rb, (MAX_MSG - size) as u64);
        a.cmd(&format!("write q m 0 {size} {rb_at} {}", 700 + i));
        assert!(one(&mut a, "c").ok());
        b.cmd(&format!("check m {seed} {} {size}", MAX_MSG - size));

        // RDMA READ
        let seed = seed + 1000;
        b.cmd(&format!("fill m {seed} 0 {size}"));
        a.cmd(&format!("read q m 0 {size} {rb} {}", 800 + i));
        let rd = one(&mut a, "c");
        assert!(rd.ok() && rd.opcode == "RdmaRead", "{rd:?}");
        a.cmd(&format!("check m {seed} 0 {size}"));
    }
}

/// `addr:len:rkey` moved `off` bytes in.
fn rb_offset(remote: &str, off: u64) -> String {
    let r: vrdma::RemoteMr = remote.parse().unwrap();
    vrdma::RemoteMr {
        addr: r.addr + off,
        len: r.len - off,
        rkey: r.rkey,
    }
    .to_string()
}

#[test]
fn send_write_read_and_immediates_all_sizes_bypass() {
    data_path("bypass");
}

#[test]
fn send_write_read_and_immediates_all_sizes_mediated() {
    data_path("mediated");
}

fn blocking(mode: &str) {
    let (_lab, mut a, mut b, _ra, _rb) = pair(mode);
    b.cmd("recv q m 0 64 1");
    // b blocks on its event channel; a sends while it waits.
    b.send_only("wait c 1 60000");
    std::thread::sleep(std::time::Duration::from_millis(50));
    a.cmd("send q m 0 64 2");
    let r = Guest::completions(&b.reply().expect("wait"));
    assert_eq!(r.len(), 1);
    assert!(r[0].ok() && r[0].opcode == "Recv");
    // Timeout: nothing comes.
    assert_eq!(b.cmd("wait c 1 100"), "");
}

#[test]
fn blocking_wait_bypass() {
    blocking("bypass");
}

#[test]
fn blocking_wait_mediated() {
    blocking("mediated");
}

fn many(mode: &str) {
    let (lab, mut a, mut b, _ra, _rb) = pair(mode);
    let _ = lab;
    // 40 QPs and 40 CQs per process: 120 doorbell slots, more than one doorbell page holds
    // (31), so the backend grants more pages on demand.
    const N: usize = 40;
    for k in 0..N {
        let (q, c) = (format!("q{k}"), format!("c{k}"));
        for g in [&mut a, &mut b] {
            g.cmd(&format!("cq {c} 16"));
        }
        let ea = a.cmd(&format!("qp {q} {c} {c} 8 8"));
        let eb = b.cmd(&format!("qp {q} {c} {c} 8 8"));
        a.send_only(&format!("connect {q} {eb}"));
        b.cmd(&format!("connect {q} {ea}"));
        a.reply().expect("connect");
    }
    for k in 0..N {
        b.cmd(&format!("recv q{k} m {} 100 {k}", k * 100));
    }
    for k in 0..N {
        a.cmd(&format!("fill m {k} {} 100", k * 100));
        a.cmd(&format!("send q{k} m {} 100 {k}", k * 100));
    }
    for k in 0..N {
        assert!(one(&mut a, &format!("c{k}")).ok());
        let r = one(&mut b, &format!("c{k}"));
        assert_eq!((r.wr_id, r.byte_len), (k as u64, 100));
        b.cmd(&format!("check m {k} {} 100", k * 100));
    }
}

#[test]
fn many_qps_and_cqs_bypass() {
    many("bypass");
}

#[test]
fn many_qps_and_cqs_mediated() {
    many("mediated");
}

fn self_talk(mode: &str) {
    let lab = Lab::start();
    let d = lab.create_guest("solo");
    lab.attach(d, &[]);
    let mut g = guest(&lab, d, mode);
    g.cmd("cq c 64");
    let e1 = g.cmd("qp q1 c c 16 16");
    let e2 = g.cmd("qp q2 c c 16 16");
    // Both Connects in flight at once (the backend answers when both ends connected).
    g.cmd(&format!("connect q1 {e2} q2 {e1}"));
    let r = g.cmd("mr m 8192");
    g.cmd("recv q2 m 4096 4096 1");
    g.cmd("fill m 9 0 4096");
    g.cmd("send q1 m 0 4096 2");
    let wcs = Guest::completions(&g.cmd("poll c 2 60000"));
    assert_eq!(wcs.len(), 2, "{wcs:?}");
    assert!(wcs.iter().all(Wc::ok));
    g.cmd("check m 9 4096 4096");
    // RDMA READ of its own region through the loop.
    g.cmd(&format!("read q1 m 4096 4096 {r} 3"));
    assert!(one(&mut g, "c").ok());
    g.cmd("check m 9 4096 4096");
}

#[test]
fn a_guest_talks_to_itself_bypass() {
    self_talk("bypass");
}

#[test]
fn a_guest_talks_to_itself_mediated() {
    self_talk("mediated");
}

#[test]
fn bad_keys_out_of_bounds_and_garbage_wqes_fail_alone() {
    let (mut lab, mut a, mut b, _ra, rb) = pair("bypass");
    let r: vrdma::RemoteMr = rb.parse().unwrap();
    // Foreign rkey.
    let bad = vrdma::RemoteMr {
        rkey: r.rkey ^ 0x5555,
        ..r
    };
    a.cmd(&format!("write q m 0 64 {bad} 1"));
    let w = one(&mut a, "c");
    assert!(!w.ok(), "a write with a foreign rkey must fail: {w:?}");
    assert!(lab.backend_alive(), "the backend survived a bad rkey");

    // The QP is in error now; use a fresh pair of QPs for the next cases.
    connect(&mut a, &mut b, "q2", "c2", "m2");
    let beyond = vrdma::RemoteMr {
        addr: r.addr + r.len - 16,
        len: 64,
        rkey: r.rkey,
    };
    a.cmd(&format!("write q2 m2 0 64 {beyond} 2"));
    let w = one(&mut a, "c2");
    assert!(!w.ok(), "a write past the region's end must fail: {w:?}");

    // Garbage WQE: opcode 0xee, junk everywhere.
    connect(&mut a, &mut b, "q3", "c3", "m3");
    a.cmd(&format!("rawsend q3 {}", "ee".repeat(64)));
    let reply = a.cmd("poll c3 1 10000");
    let wcs = Guest::completions(&reply);
    assert!(
        wcs.iter().all(|w| !w.ok()),
        "a garbage WQE gives an error completion (or closes the channel): {wcs:?}"
    );
    assert!(lab.backend_alive(), "the backend survived a garbage WQE");

    // Traffic of a fresh pair still flows.
    connect(&mut a, &mut b, "q4", "c4", "m4");
    b.cmd("recv q4 m4 0 64 9");
    a.cmd("send q4 m4 0 64 9");
    assert!(one(&mut a, "c4").ok());
    assert!(one(&mut b, "c4").ok());
}

#[test]
fn quota_exhaustion_is_a_clear_error() {
    let lab = Lab::start();
    let d = lab.create_guest("q");
    lab.attach(d, &[("max-qps", "2"), ("max-cqs", "4")]);
    let mut g = guest(&lab, d, "bypass");
    g.cmd("cq c 16");
    g.cmd("qp q1 c c 8 8");
    g.cmd("qp q2 c c 8 8");
    let e = g.try_cmd("qp q3 c c 8 8").unwrap_err();
    assert!(e.contains("QuotaExceeded") && e.contains("max-qps"), "{e}");
}

#[test]
fn killing_a_guest_leaves_others_intact_and_counters_at_zero() {
    let (lab, mut a, mut b, _ra, _rb) = pair("bypass");
    let dc = lab.create_guest("victim");
    lab.attach(dc, &[]);
    let mut c = guest(&lab, dc, "bypass");
    // c sends to b's QP "v" as fast as it can.
    let (_rc, _rb2) = connect(&mut c, &mut b, "v", "cv", "mv");
    for i in 0..32 {
        b.cmd(&format!("recv v mv 0 4096 {i}"));
    }
    c.send_only("loop v cv mv 4096");
    assert_eq!(c.reply(), Ok("looping".into()));
    c.kill();

    // a <-> b still works.
    for i in 0..10 {
        b.cmd(&format!("recv q m 0 1000 {i}"));
        a.cmd(&format!("fill m {i} 0 1000"));
        a.cmd(&format!("send q m 0 1000 {i}"));
        assert!(one(&mut a, "c").ok());
        assert!(one(&mut b, "c").ok());
        b.cmd(&format!("check m {i} 0 1000"));
    }
    // The victim's resource counters drain to zero (reclaim is asynchronous: poll, bounded).
    // `ops`, `bytes`, `errors`, `notifications`, `events` are cumulative work counters of the
    // domain (docs/backend.md): they keep what the victim did and are not expected to drop.
    let resources: Vec<&str> = Resource::ALL.iter().map(|r| r.stats_key()).collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let stats = lab.stats(dc);
        let held: Vec<_> = stats
            .iter()
            .filter(|(k, _)| resources.contains(&k.as_str()))
            .collect();
        if held.len() == resources.len() && held.iter().all(|(_, v)| *v == 0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "domain {} still holds resources after its process died (or publishes no \
             counters): {stats:?}",
            dc.0
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // b's end of the victim's connection was flushed, and b's other QP still works.
    b.cmd("recv q m 0 64 77");
    a.cmd("send q m 0 64 78");
    assert!(one(&mut a, "c").ok());
    let r = one(&mut b, "c");
    assert!(r.ok() && r.wr_id == 77, "{r:?}");
}

#[test]
fn a_busy_engine_is_not_notified_per_post() {
    // The engine stays awake 50 ms after its last work (default 200 us), so descheduling of
    // the guest on a loaded machine does not put it to sleep between two posts of the burst.
    let lab = Lab::start_with_config("spin-before-sleep-us = 50000\n");
    let (_lab, mut a, mut b, _ra, _rb) = pair_on(lab, "bypass");
    for i in 0..32 {
        b.cmd(&format!("recv q m 0 64 {i}"));
    }
    let before: u64 = a.cmd("notifications").parse().unwrap();
    a.cmd("burst q m 64 32");
    let wcs = Guest::completions(&a.cmd("poll c 32 60000"));
    assert_eq!(wcs.len(), 32);
    let after: u64 = a.cmd("notifications").parse().unwrap();
    assert!(
        after - before < 32,
        "{} notifications for 32 posts: the frontend must kick only a sleeping engine",
        after - before
    );
}

/// SGE `offset` is relative to the region its lkey names, `remote_addr` is in the target
/// region's iova space: odd offsets on both sides land exactly where they should.
fn odd_offsets(mode: &str) {
    let (_lab, mut a, mut b, ra, rb) = pair(mode);
    for (i, len) in [1usize, 7, 4093, 70_001].into_iter().enumerate() {
        let seed = 50 + i as u64;
        // SEND from offset 13 into a receive at offset 7.
        a.cmd(&format!("fill m {seed} 13 {len}"));
        b.cmd(&format!("recv q m 7 {len} {i}"));
        a.cmd(&format!("send q m 13 {len} {i}"));
        assert!(one(&mut a, "c").ok());
        let r = one(&mut b, "c");
        assert!(r.ok() && r.byte_len as usize == len, "{r:?}");
        b.cmd(&format!("check m {seed} 7 {len}"));
        // WRITE from local offset 5 to remote offset 4099.
        let seed = seed + 100;
        a.cmd(&format!("fill m {seed} 5 {len}"));
        a.cmd(&format!("write q m 5 {len} {} {i}", rb_offset(&rb, 4099)));
        assert!(one(&mut a, "c").ok());
        b.cmd(&format!("check m {seed} 4099 {len}"));
        // READ of remote offset 8191 into local offset 3.
        let seed = seed + 100;
        b.cmd(&format!("fill m {seed} 8191 {len}"));
        a.cmd(&format!("read q m 3 {len} {} {i}", rb_offset(&rb, 8191)));
        assert!(one(&mut a, "c").ok());
        a.cmd(&format!("check m {seed} 3 {len}"));
        // And the other way: b WRITEs into a at an odd remote offset.
        let seed = seed + 100;
        b.cmd(&format!("fill m {seed} 1 {len}"));
        b.cmd(&format!("write q m 1 {len} {} {i}", rb_offset(&ra, 333)));
        assert!(one(&mut b, "c").ok());
        a.cmd(&format!("check m {seed} 333 {len}"));
    }
}

#[test]
fn odd_local_and_remote_offsets_bypass() {
    odd_offsets("bypass");
}

#[test]
fn odd_local_and_remote_offsets_mediated() {
    odd_offsets("mediated");
}
