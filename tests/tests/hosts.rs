//! Two complete simulated hosts on one machine (`vrdma_tests::TwoHosts`): each its own
//! directory, hypervisor, XenStore and backend process, the backends at 127.0.0.2 and
//! 127.0.0.3. This shows that the two run side by side without seeing each other: guests on
//! each host talk intra-host at the same time, the hosts' domain ids, XenStores and backends
//! are their own, and killing one host's backend leaves the other's guests working. Guests of
//! the two hosts talking to each other (iWARP) are `interhost.rs`.

use vrdma_tests::{backend_takes_address, Guest, Lab, TwoHosts, HOST_A_ADDR, HOST_B_ADDR};
use xen_platform::DomId;

const GUEST: &str = env!("CARGO_BIN_EXE_vrdma-guest");
const MR: usize = 1 << 20;

/// Two guests on `lab`, each with CQ `c`, QP `q` (connected to the other's) and region `m`;
/// the second's remote region string.
fn pair(lab: &Lab, mode: &str) -> (Guest, Guest, String) {
    let mut a = lab.start_guest(GUEST.as_ref(), "a", mode);
    let mut b = lab.start_guest(GUEST.as_ref(), "b", mode);
    for x in [&mut a, &mut b] {
        x.cmd("cq c 64");
    }
    let ea = a.cmd("qp q c c 32 32");
    let eb = b.cmd("qp q c c 32 32");
    a.send_only(&format!("connect q {eb}"));
    b.cmd(&format!("connect q {ea}"));
    a.reply().expect("connect");
    a.cmd(&format!("mr m {MR}"));
    let rb = b.cmd(&format!("mr m {MR}"));
    (a, b, rb)
}

fn one(g: &mut Guest) -> vrdma_tests::Wc {
    let wcs = Guest::completions(&g.cmd("poll c 1 60000"));
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    wcs.into_iter().next().unwrap()
}

/// A SEND, a WRITE and a READ of `size` bytes from `a` to `b`, each checked byte by byte,
/// with patterns from `seed`.
fn traffic(a: &mut Guest, b: &mut Guest, rb: &str, size: usize, seed: u64) {
    b.cmd(&format!("recv q m 0 {size} 1"));
    a.cmd(&format!("fill m {seed} 0 {size}"));
    a.cmd(&format!("send q m 0 {size} 2"));
    assert!(one(a).ok());
    let r = one(b);
    assert!(r.ok() && r.byte_len as usize == size, "{r:?}");
    b.cmd(&format!("check m {seed} 0 {size}"));
    a.cmd(&format!("fill m {} 0 {size}", seed + 1));
    a.cmd(&format!("write q m 0 {size} {rb} 3"));
    assert!(one(a).ok());
    b.cmd(&format!("check m {} 0 {size}", seed + 1));
    b.cmd(&format!("fill m {} 0 {size}", seed + 2));
    a.cmd(&format!("read q m 0 {size} {rb} 4"));
    assert!(one(a).ok());
    a.cmd(&format!("check m {} 0 {size}", seed + 2));
}

#[test]
fn two_hosts_run_guests_side_by_side_independently() {
    let mut hosts = TwoHosts::start();
    assert_eq!(hosts.a.address(), Some(HOST_A_ADDR));
    assert_eq!(hosts.b.address(), Some(HOST_B_ADDR));
    let config_b = std::fs::read_to_string(hosts.b.config_path()).unwrap();
    assert_eq!(
        config_b.contains(&format!("\"{HOST_B_ADDR}\"")),
        backend_takes_address(),
        "host B's backend configuration names its address exactly when the backend has the \
         key:\n{config_b}"
    );
    assert_ne!(hosts.a.host.dir(), hosts.b.host.dir());
    assert_ne!(hosts.a.backend_pid(), hosts.b.backend_pid());

    // Host A's guests in bypass mode, host B's in mediated mode, all four at once.
    let (mut a1, mut a2, ra) = pair(&hosts.a, "bypass");
    let (mut b1, mut b2, rb) = pair(&hosts.b, "mediated");
    // Each host numbered its own domains: the same ids on both (one shared domain table
    // would have given host B 3 and 4).
    assert_eq!((a1.domid, a2.domid), (b1.domid, b2.domid));
    assert_eq!((a1.domid, a2.domid), (DomId(1), DomId(2)));

    // Traffic on both hosts interleaved, different patterns per host.
    for (i, size) in [1usize, 4096, 65_539, MR].into_iter().enumerate() {
        traffic(&mut a1, &mut a2, &ra, size, 10 + 10 * i as u64);
        traffic(&mut b1, &mut b2, &rb, size, 500 + 10 * i as u64);
    }

    // Each XenStore holds its own host's devices only, and a node written on one is not on
    // the other.
    for lab in hosts.both() {
        let mut devs = lab.dom0.directory("/local/domain/0/backend/vrdma").unwrap();
        devs.sort();
        assert_eq!(devs, ["1", "2"], "host {}", lab.name());
    }
    hosts
        .a
        .dom0
        .write("/local/domain/0/only-on-a", b"1")
        .unwrap();
    assert!(hosts.b.dom0.read("/local/domain/0/only-on-a").is_err());

    // Host A's backend dies: host A's guests lose their device, host B's do not notice.
    hosts.a.kill_backend();
    for (i, size) in [64usize, 65_536].into_iter().enumerate() {
        traffic(&mut b1, &mut b2, &rb, size, 900 + 10 * i as u64);
    }
    assert!(hosts.b.backend_alive());
    let _ = a2.try_cmd("recv q m 0 64 7");
    let sent = a1.try_cmd("send q m 0 64 8");
    let polled = a1.try_cmd("poll c 1 10000");
    let completed =
        matches!(&polled, Ok(r) if Guest::completions(r).first().is_some_and(|w| w.ok()));
    assert!(
        !completed,
        "a SEND on host A completed without host A's backend: {sent:?} {polled:?}"
    );
    let lost = format!("{sent:?} {polled:?}");
    assert!(
        lost.contains("device lost"),
        "host A's guest is told: {lost}"
    );
}

/// `TwoHosts::guests`: one guest on each host, each served by its own host's backend (its
/// device opens, and its objects are counted in that host's stats only).
#[test]
fn a_guest_on_each_host_is_served_by_its_own_backend() {
    let hosts = TwoHosts::start();
    let (mut ga, mut gb) = hosts.guests(GUEST.as_ref(), "bypass");
    assert_eq!(ga.domid, gb.domid, "both hosts' first guest domain");
    for _ in 0..3 {
        ga.cmd("cq c 16");
        ga.cmd("drop c");
    }
    ga.cmd("cq keep 16");
    gb.cmd("cq k1 16");
    gb.cmd("cq k2 16");
    let cqs = |lab: &Lab, d| {
        lab.stats(d)
            .into_iter()
            .find(|(k, _)| k == "cqs")
            .map(|(_, v)| v)
    };
    // The counters are published as the backends get to it: look until both say what each
    // host's guest holds (bounded).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let got = (cqs(&hosts.a, ga.domid), cqs(&hosts.b, gb.domid));
        if got == (Some(1), Some(2)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "CQs held (host A, host B): {got:?}, expected 1 and 2"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
