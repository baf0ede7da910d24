//! Hostile guests, end to end: each case runs an attacker in its own domain (a `vrdma-soak
//! attack ... --once` process, or a `vrdma-guest` driven by the test) beside a good guest pair
//! in two other domains, and asserts the good pair is unaffected: its transfers complete and
//! every byte is checked. docs/security.md maps these cases to the defences they prove.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use vrdma_tests::{Guest, Lab, Wc};
use xen_platform::sim::sock;
use xen_platform::{DomId, ENV_SIM_DIR, ENV_SIM_DOMID};

const GUEST: &str = env!("CARGO_BIN_EXE_vrdma-guest");
const SOAK: &str = env!("CARGO_BIN_EXE_vrdma-soak");
const MR_LEN: usize = 65_536;
/// A hang guard for control-path steps under attack (not a performance target).
const HANG_GUARD: Duration = Duration::from_secs(10);
const FLOOD_THREADS: &str = "8";
const FLOOD_MR_KIB: &str = "2048";

/// Two guests in two domains, QP `q` connected, CQ `c`, region `m` of [`MR_LEN`] each.
struct Pair {
    a: Guest,
    b: Guest,
    /// Endpoints of `q` at a and at b.
    ea: String,
    eb: String,
    /// b's region, as a's RDMA addresses it.
    rb: String,
    /// a's region, as b's RDMA addresses it.
    ra: String,
}

fn guest(lab: &Lab, d: DomId) -> Guest {
    let mut g = lab.spawn_guest(GUEST.as_ref(), d);
    g.cmd("open bypass");
    g
}

fn domain(lab: &Lab, name: &str) -> DomId {
    let d = lab.create_guest(name);
    lab.attach(d, &[]);
    d
}

fn pair(lab: &Lab, names: (&str, &str)) -> Pair {
    let (da, db) = (domain(lab, names.0), domain(lab, names.1));
    let (mut a, mut b) = (guest(lab, da), guest(lab, db));
    for g in [&mut a, &mut b] {
        g.cmd("cq c 64");
    }
    let ea = a.cmd("qp q c c 32 32");
    let eb = b.cmd("qp q c c 32 32");
    a.send_only(&format!("connect q {eb}"));
    b.cmd(&format!("connect q {ea}"));
    a.reply().expect("connect the pair");
    let ra = a.cmd(&format!("mr m {MR_LEN}"));
    let rb = b.cmd(&format!("mr m {MR_LEN}"));
    Pair {
        a,
        b,
        ea,
        eb,
        rb,
        ra,
    }
}

fn one(g: &mut Guest, cq: &str) -> Wc {
    let r = g.cmd(&format!("poll {cq} 1 60000"));
    let wcs = Guest::completions(&r);
    assert_eq!(wcs.len(), 1, "one completion on {cq} expected, got {r:?}");
    wcs.into_iter().next().unwrap()
}

/// `addr:len:rkey` moved `off` bytes in, `len` long.
fn at(remote: &str, off: u64, len: u64) -> String {
    let r: vrdma::RemoteMr = remote.parse().unwrap();
    vrdma::RemoteMr {
        addr: r.addr + off,
        len,
        rkey: r.rkey,
    }
    .to_string()
}

/// One verified round of the good pair: SEND a→b, WRITE a→b, READ b→a, WRITE b→a; every
/// completion Success, every byte checked.
fn good_round(p: &mut Pair, seed: u64, when: &str) {
    let (a, b) = (&mut p.a, &mut p.b);
    let ok = |w: Wc, what: &str| {
        assert!(w.ok(), "the good pair, {when}: {what} completed with {w:?}");
    };
    b.cmd(&format!("recv q m 0 4096 {seed}"));
    a.cmd(&format!("fill m {seed} 0 4096"));
    a.cmd(&format!("send q m 0 4096 {seed}"));
    ok(one(a, "c"), "SEND");
    ok(one(b, "c"), "RECV");
    b.cmd(&format!("check m {seed} 0 4096"));

    let s = seed + 1;
    a.cmd(&format!("fill m {s} 4096 4096"));
    a.cmd(&format!(
        "write q m 4096 4096 {} {s}",
        at(&p.rb, 8192, 4096)
    ));
    ok(one(a, "c"), "WRITE");
    b.cmd(&format!("check m {s} 8192 4096"));

    a.cmd(&format!(
        "read q m 16384 4096 {} {s}",
        at(&p.rb, 8192, 4096)
    ));
    ok(one(a, "c"), "READ");
    a.cmd(&format!("check m {s} 16384 4096"));

    let s = seed + 2;
    b.cmd(&format!("fill m {s} 24576 4096"));
    b.cmd(&format!(
        "write q m 24576 4096 {} {s}",
        at(&p.ra, 32768, 4096)
    ));
    ok(one(b, "c"), "WRITE b→a");
    a.cmd(&format!("check m {s} 32768 4096"));
}

/// The environment that puts a process into `domid` of the lab's simulated host.
fn in_domain(lab: &Lab, cmd: &mut Command, domid: DomId) {
    cmd.env(ENV_SIM_DIR, lab.host.dir())
        .env(ENV_SIM_DOMID, domid.0.to_string())
        .env(
            "XENSTORED_PATH",
            sock::xenstore_socket(lab.host.dir(), domid.0),
        );
}

/// `vrdma-soak attack <kind> --once <args>` in `domid`, started; its stdout lines come on the
/// returned channel.
fn start_attack(
    lab: &Lab,
    domid: DomId,
    kind: &str,
    args: &[&str],
) -> (Child, mpsc::Receiver<String>) {
    let mut cmd = Command::new(SOAK);
    cmd.args(["attack", kind, "--once"]).args(args);
    in_domain(lab, &mut cmd, domid);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start vrdma-soak attack");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Waits for the attacker to finish; its lines. No breach may be among them.
fn finish_attack(mut child: Child, rx: mpsc::Receiver<String>) -> Vec<String> {
    let mut err = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the attacker did not finish");
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = stderr.join().unwrap_or_default();
    println!("attacker stderr: {stderr}");
    // The stdout reader may still be draining: it ends at EOF.
    let mut lines: Vec<String> = Vec::new();
    while let Ok(l) = rx.recv_timeout(Duration::from_secs(5)) {
        lines.push(l);
    }
    assert!(
        !lines.iter().any(|l| l.starts_with("breach")),
        "the attacker got something it must not: {lines:?}"
    );
    assert!(status.success(), "attacker: {status}, {lines:?}\n{stderr}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("done") || l.starts_with("failed")),
        "the attacker ran no round: {lines:?}"
    );
    println!("attacker: {lines:?}");
    lines
}

fn attack(lab: &Lab, domid: DomId, kind: &str, args: &[&str]) -> Vec<String> {
    let (c, rx) = start_attack(lab, domid, kind, args);
    finish_attack(c, rx)
}

/// A half-open Connect from an attacker to both QPs of a connected pair, then the attacker
/// destroys its QP (`close == false`) or closes its channel while the Connect is pending.
fn half_open(kind: &str) {
    let mut lab = Lab::start();
    let mut p = pair(&lab, ("good-a", "good-b"));
    good_round(&mut p, 1, "before the attack");
    let evil = domain(&lab, "attacker");
    for target in [p.eb.clone(), p.ea.clone()] {
        let lines = attack(
            &lab,
            evil,
            kind,
            &["--target", &target, "--connect-wait-ms", "1000"],
        );
        assert!(
            lines.iter().any(|l| l.starts_with("done")),
            "the half-open attack did not run: {lines:?}"
        );
        assert!(lab.backend_alive(), "the backend died");
    }
    for i in 0..3 {
        good_round(&mut p, 10 + 10 * i, "after half-open Connects to its QPs");
    }
}

#[test]
fn half_open_connect_to_a_foreign_qp_then_destroy_leaves_it_connected() {
    half_open("half-open-destroy");
}

#[test]
fn half_open_connect_to_a_foreign_qp_then_close_leaves_it_connected() {
    half_open("half-open-close");
}

/// A (connected to B) uses a valid rkey of C's region: the WRITE and the READ fail with
/// RemoteAccessError, C's bytes are unchanged and none of them reach A.
#[test]
fn a_valid_rkey_of_a_third_domain_is_refused_on_another_connection() {
    let mut lab = Lab::start();
    let mut good = pair(&lab, ("good-a", "good-b"));
    let mut ab = pair(&lab, ("a", "b"));
    let dc = domain(&lab, "c");
    let mut c = guest(&lab, dc);
    let rc = c.cmd(&format!("mr m {MR_LEN}"));
    c.cmd(&format!("fill m 77 0 {MR_LEN}"));

    // WRITE through A↔B with C's rkey and address.
    ab.a.cmd(&format!("fill m 5 0 {MR_LEN}"));
    ab.a.cmd(&format!("write q m 0 4096 {} 1", at(&rc, 0, 4096)));
    let w = one(&mut ab.a, "c");
    assert_eq!(w.status, "RemoteAccessError", "WRITE with C's rkey: {w:?}");
    c.cmd(&format!("check m 77 0 {MR_LEN}"));
    // B's region did not take C's place either.
    ab.b.cmd(&format!("fill m 9 0 {MR_LEN}"));

    // READ of C's region: refused, A's buffer keeps its own bytes. A fresh QP pair: the
    // first one is in Error now.
    let ea2 = ab.a.cmd("qp q2 c c 8 8");
    let eb2 = ab.b.cmd("qp q2 c c 8 8");
    ab.a.send_only(&format!("connect q2 {eb2}"));
    ab.b.cmd(&format!("connect q2 {ea2}"));
    ab.a.reply().expect("connect q2");
    ab.a.cmd(&format!("read q2 m 0 4096 {} 2", at(&rc, 0, 4096)));
    let r = one(&mut ab.a, "c");
    assert_eq!(r.status, "RemoteAccessError", "READ with C's rkey: {r:?}");
    ab.a.cmd("check m 5 0 4096");
    ab.b.cmd(&format!("check m 9 0 {MR_LEN}"));
    c.cmd(&format!("check m 77 0 {MR_LEN}"));
    assert!(lab.backend_alive(), "the backend died");

    good_round(&mut good, 100, "after a foreign-rkey WRITE and READ");
}

/// An attacker floods RegMr/DeregMr from four threads and closes its channel in the middle of
/// it; meanwhile a new process of B opens a channel and connects a QP to A within the hang
/// guard, and the good pair's traffic goes on.
#[test]
fn closing_under_a_regmr_flood_leaves_the_daemon_answering() {
    let lab = Lab::start();
    let mut p = pair(&lab, ("good-a", "good-b"));
    good_round(&mut p, 1, "before the flood");
    let evil = domain(&lab, "attacker");
    let db = p.b.domid;
    p.a.cmd("cq c2 16");
    let ea2 = p.a.cmd("qp q2 c2 c2 8 8");

    // The flood goes on for longer than the hang guard after Closing, unless the backend
    // stops answering the closing channel.
    let (child, rx) = start_attack(
        &lab,
        evil,
        "mr-flood-close",
        &[
            "--flood-ms",
            "500",
            "--flood-after-ms",
            "15000",
            "--flood-threads",
            FLOOD_THREADS,
            "--flood-mr-kib",
            FLOOD_MR_KIB,
        ],
    );
    let said = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the attacker floods and closes");
    assert_eq!(said, "closing", "the attacker's first line");

    // The flood goes on after Closing: B opens and connects meanwhile.
    let start = Instant::now();
    let mut b2 = guest(&lab, db);
    b2.cmd("cq c 16");
    let eb2 = b2.cmd("qp q c c 8 8");
    p.a.send_only(&format!("connect q2 {eb2}"));
    b2.cmd(&format!("connect q {ea2}"));
    p.a.reply().expect("connect q2");
    let took = start.elapsed();
    assert!(
        took < HANG_GUARD,
        "opening a channel and connecting took {took:?} while another guest closed under a \
         RegMr/DeregMr flood (hang guard {HANG_GUARD:?})"
    );
    // The new connection carries data.
    let rb2 = b2.cmd("mr m 8192");
    p.a.cmd("mr m2 8192");
    p.a.cmd("fill m2 31 0 4096");
    p.a.cmd(&format!("write q2 m2 0 4096 {} 5", at(&rb2, 0, 4096)));
    assert!(one(&mut p.a, "c2").ok());
    b2.cmd("check m 31 0 4096");

    finish_attack(child, rx);
    good_round(&mut p, 50, "after a RegMr/DeregMr flood and Closing");
}

/// The soak, short: every attack kind for two seconds each beside the good pair; no error at
/// the good pair, no breach, the backend's descriptors, grants and mappings back at the start.
#[test]
fn short_soak_keeps_the_good_pair_whole() {
    let out = Command::new(SOAK)
        .args([
            "--seconds",
            "24",
            "--phase-secs",
            "2",
            "--attackers",
            "2",
            "--hog-mib",
            "64",
            "--kill-every-ms",
            "1000",
        ])
        .arg("--backend")
        .arg(vrdma_tests::backend_bin())
        .output()
        .expect("run vrdma-soak");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the soak failed: {}\n{text}",
        out.status
    );
    assert!(text.contains("PASS"), "{text}");
}

/// Three attackers storm their own frontend XenStore nodes (ghost channels, garbage states,
/// junk keys) with AllocPd/DeallocPd in between and are SIGKILLed mid-storm; afterwards a new
/// process of B still opens a channel and connects within the hang guard, and the good pair's
/// traffic goes on.
#[test]
fn a_xenstore_storm_leaves_the_daemon_serving_others() {
    let lab = Lab::start();
    let mut p = pair(&lab, ("good-a", "good-b"));
    good_round(&mut p, 1, "before the storm");
    let evil: Vec<DomId> = (0..3)
        .map(|i| domain(&lab, &format!("attacker-{i}")))
        .collect();
    // Rounds back to back for a while; then the attackers are SIGKILLed mid-storm.
    let mut running: Vec<Child> = evil
        .iter()
        .map(|d| {
            let mut cmd = Command::new(SOAK);
            cmd.args(["attack", "xs-storm", "--pace-ms", "0"]);
            in_domain(&lab, &mut cmd, *d);
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            cmd.spawn().expect("start vrdma-soak attack")
        })
        .collect();
    for round in 0..6 {
        std::thread::sleep(Duration::from_millis(500));
        good_round(&mut p, 10 + 10 * round, "during a XenStore storm");
    }
    for c in &mut running {
        let _ = c.kill();
        let _ = c.wait();
    }
    let start = Instant::now();
    let mut b2 = guest(&lab, p.b.domid);
    p.a.cmd("cq c2 16");
    let ea2 = p.a.cmd("qp q2 c2 c2 8 8");
    b2.cmd("cq c 16");
    let eb2 = b2.cmd("qp q c c 8 8");
    p.a.send_only(&format!("connect q2 {eb2}"));
    b2.cmd(&format!("connect q {ea2}"));
    p.a.reply().expect("connect q2");
    let took = start.elapsed();
    assert!(
        took < HANG_GUARD,
        "opening a channel and connecting took {took:?} after a XenStore storm (hang guard \
         {HANG_GUARD:?})"
    );
    good_round(&mut p, 100, "after a XenStore storm");
}
