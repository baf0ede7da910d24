//! The simulated Xen host, driven through the platform API: several simulated domains in this
//! process (one hypercall connection each) and, for process death, child processes.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use xen_platform::sim::{SimHost, SimHostConfig};
use xen_platform::{
    Access, DomId, Error, EvtchnPort, GrantRef, Platform, PlatformKind, UnmapNotify,
};

const WAIT: Option<Duration> = Some(Duration::from_secs(20));

struct Host {
    _dir: tempfile::TempDir,
    host: SimHost,
}

impl Host {
    fn new() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let host = SimHost::start(SimHostConfig::new(dir.path())).unwrap();
        Host { _dir: dir, host }
    }

    fn dir(&self) -> PathBuf {
        self.host.dir().to_path_buf()
    }

    fn domain(&self) -> (DomId, Platform) {
        let d = self.host.create_domain(None, None).unwrap();
        (d, self.platform(d))
    }

    fn platform(&self, d: DomId) -> Platform {
        Platform::open(PlatformKind::Sim {
            dir: self.dir(),
            domid: d,
        })
        .unwrap()
    }
}

fn read_byte(p: *mut u8, off: usize) -> u8 {
    // SAFETY: callers pass a pointer into a live mapping at least `off + 1` bytes long; shared
    // memory is read volatile.
    unsafe { p.add(off).read_volatile() }
}

fn write_byte(p: *mut u8, off: usize, v: u8) {
    // SAFETY: as in read_byte, on a writable mapping.
    unsafe { p.add(off).write_volatile(v) }
}

#[test]
fn shared_pages_are_the_same_memory_both_ways() {
    let h = Host::new();
    let (d1, p1) = h.domain();
    let (d2, p2) = h.domain();
    let s = p1.share_pages(d2, 3, Access::ReadWrite).unwrap();
    assert_eq!(s.grant_refs().len(), 3);
    assert_eq!(s.len(), 3 * 4096);
    write_byte(s.as_ptr(), 0, 0x11);
    write_byte(s.as_ptr(), 2 * 4096 + 7, 0x22);
    // Map out of order: the mapping follows the order of the references.
    let refs = [s.grant_refs()[2], s.grant_refs()[0]];
    let m = p2.map_grants(d1, &refs, Access::ReadWrite).unwrap();
    assert!(m.span().is_writable());
    assert_eq!(read_byte(m.as_ptr(), 7), 0x22);
    assert_eq!(read_byte(m.as_ptr(), 4096), 0x11);
    write_byte(m.as_ptr(), 4096 + 1, 0x33);
    assert_eq!(read_byte(s.as_ptr(), 1), 0x33);
}

#[test]
fn mapping_a_grant_for_another_domain_is_eperm() {
    let h = Host::new();
    let (d1, p1) = h.domain();
    let (d2, _p2) = h.domain();
    let (_d3, p3) = h.domain();
    let s = p1.share_pages(d2, 1, Access::ReadWrite).unwrap();
    let e = p3
        .map_grants(d1, s.grant_refs(), Access::ReadOnly)
        .unwrap_err();
    assert!(matches!(e, Error::GrantRefused { errno: 1, .. }), "{e}");
    assert!(e.is_permission_denied());
    assert!(e.to_string().contains("not to domain"), "{e}");
}

#[test]
fn unknown_grants_and_domains_are_refused() {
    let h = Host::new();
    let (d1, _p1) = h.domain();
    let (_d2, p2) = h.domain();
    let e = p2
        .map_grants(d1, &[GrantRef(12345)], Access::ReadOnly)
        .unwrap_err();
    assert!(matches!(e, Error::GrantRefused { .. }), "{e}");
    let e = p2
        .map_grants(DomId(999), &[GrantRef(8)], Access::ReadOnly)
        .unwrap_err();
    assert!(matches!(e, Error::GrantRefused { .. }), "{e}");
}

#[test]
fn read_only_grants_map_read_only() {
    let h = Host::new();
    let (d1, p1) = h.domain();
    let (d2, p2) = h.domain();
    let s = p1.share_pages(d2, 2, Access::ReadOnly).unwrap();
    write_byte(s.as_ptr(), 5, 0x5a);
    let e = p2
        .map_grants(d1, s.grant_refs(), Access::ReadWrite)
        .unwrap_err();
    assert!(matches!(e, Error::GrantRefused { errno: 1, .. }), "{e}");
    let m = p2.map_grants(d1, s.grant_refs(), Access::ReadOnly).unwrap();
    assert!(!m.span().is_writable());
    assert_eq!(read_byte(m.as_ptr(), 5), 0x5a);
    // Not just PROT_READ: the file behind the mapping is read-only, so it cannot be made
    // writable either.
    // SAFETY: changing protection of our own mapping; no references into it exist.
    let r = unsafe {
        rustix::mm::mprotect(
            m.as_ptr().cast(),
            m.len(),
            rustix::mm::MprotectFlags::READ | rustix::mm::MprotectFlags::WRITE,
        )
    };
    assert_eq!(r, Err(rustix::io::Errno::ACCESS));
}

#[test]
fn grant_limit_is_a_clear_error_and_freed_grants_come_back() {
    let h = Host::new();
    let d1 = h.host.create_domain(Some("small"), Some(4)).unwrap();
    let p1 = h.platform(d1);
    let a = p1.share_pages(DomId(0), 3, Access::ReadWrite).unwrap();
    let e = p1.share_pages(DomId(0), 2, Access::ReadWrite).unwrap_err();
    let s = e.to_string();
    assert!(matches!(e, Error::GrantLimit { .. }), "{s}");
    assert!(
        s.contains("--max-grants") && s.contains("3 of its 4"),
        "{s}"
    );
    drop(a);
    let _b = p1.share_pages(DomId(0), 4, Access::ReadWrite).unwrap();
}

#[test]
fn event_channels_connect_only_the_offered_domain() {
    let h = Host::new();
    let (d1, p1) = h.domain();
    let (d2, p2) = h.domain();
    let (_d3, p3) = h.domain();
    let a = p1.alloc_unbound(d2).unwrap();
    assert!(!a.consume().unwrap());
    let e = p3.bind_interdomain(d1, a.local_port()).unwrap_err();
    assert!(matches!(e, Error::Evtchn(_)), "{e}");
    let b = p2.bind_interdomain(d1, a.local_port()).unwrap();
    // A port can be bound once.
    let e = p2.bind_interdomain(d1, a.local_port()).unwrap_err();
    assert!(
        matches!(e, Error::Evtchn(ref m) if m.contains("is not an unbound port offered to")),
        "{e}"
    );
    b.notify().unwrap();
    assert!(a.wait_timeout(WAIT).unwrap());
    assert!(!a.consume().unwrap(), "one notify, one event");
    a.notify().unwrap();
    a.notify().unwrap();
    b.wait().unwrap();
    assert!(!b.consume().unwrap(), "pending events coalesce");
    assert_eq!(a.remote(), d2);
    // Unbinding one end lets the port be bound again, as in Xen.
    drop(b);
    let b2 = p2.bind_interdomain(d1, a.local_port()).unwrap();
    b2.notify().unwrap();
    assert!(a.wait_timeout(WAIT).unwrap());
}

#[test]
fn event_channel_works_with_mio() {
    let h = Host::new();
    let (d1, p1) = h.domain();
    let (d2, p2) = h.domain();
    let mut a = p1.alloc_unbound(d2).unwrap();
    let b = p2.bind_interdomain(d1, a.local_port()).unwrap();
    let mut poll = mio::Poll::new().unwrap();
    poll.registry()
        .register(&mut a, mio::Token(7), mio::Interest::READABLE)
        .unwrap();
    b.notify().unwrap();
    let mut events = mio::Events::with_capacity(4);
    poll.poll(&mut events, Some(Duration::from_secs(20)))
        .unwrap();
    assert!(
        events.iter().any(|e| e.token() == mio::Token(7)),
        "no readiness for a notified event channel"
    );
    assert!(a.consume().unwrap());
}

/// As on Xen (`/dev/xen/evtchn` masks a port when it delivers its event, until the reader
/// consumes it): a notification to a port whose event was not consumed raises nothing new
/// for an edge-triggered poller; once consumed, the next one does.
#[test]
fn an_unconsumed_event_masks_its_port() {
    let h = Host::new();
    let (d1, p1) = h.domain();
    let (d2, p2) = h.domain();
    let mut a = p1.alloc_unbound(d2).unwrap();
    let b = p2.bind_interdomain(d1, a.local_port()).unwrap();
    let mut poll = mio::Poll::new().unwrap();
    poll.registry()
        .register(&mut a, mio::Token(7), mio::Interest::READABLE)
        .unwrap();
    let mut events = mio::Events::with_capacity(4);
    let mut heard = |poll: &mut mio::Poll, wait: Option<Duration>| {
        poll.poll(&mut events, wait).unwrap();
        events.iter().any(|e| e.token() == mio::Token(7))
    };
    b.notify().unwrap();
    assert!(heard(&mut poll, WAIT), "the first notification is heard");
    // Not consumed: masked. The notify is done (synchronously) before this look.
    b.notify().unwrap();
    assert!(
        !heard(&mut poll, Some(Duration::ZERO)),
        "a notification to a masked port raised an event"
    );
    assert!(a.consume().unwrap());
    assert!(
        !a.consume().unwrap(),
        "the masked notification added nothing"
    );
    b.notify().unwrap();
    assert!(heard(&mut poll, WAIT), "the unmasked port hears again");
    assert!(a.consume().unwrap());
}

#[test]
fn unmap_notify_fires_when_the_mapper_unmaps() {
    let h = Host::new();
    let (d1, p1) = h.domain();
    let (d2, p2) = h.domain();
    let s = p1.share_pages(d2, 1, Access::ReadWrite).unwrap();
    let ev1 = p1.alloc_unbound(d2).unwrap();
    let ev2 = p2.bind_interdomain(d1, ev1.local_port()).unwrap();
    write_byte(s.as_ptr(), 64, 1);
    let m = p2
        .map_grants(d1, s.grant_refs(), Access::ReadWrite)
        .unwrap();
    m.set_unmap_notify(UnmapNotify {
        clear_byte: Some(64),
        event: Some(ev2.local_port()),
    })
    .unwrap();
    assert!(!ev1.consume().unwrap());
    assert_eq!(read_byte(s.as_ptr(), 64), 1);
    drop(m);
    assert!(ev1.wait_timeout(WAIT).unwrap());
    assert_eq!(read_byte(s.as_ptr(), 64), 0);
}

#[test]
fn unmap_notify_fires_when_the_sharer_releases() {
    let h = Host::new();
    let (d1, p1) = h.domain();
    let (d2, p2) = h.domain();
    let s = p1.share_pages(d2, 2, Access::ReadWrite).unwrap();
    let ev1 = p1.alloc_unbound(d2).unwrap();
    let ev2 = p2.bind_interdomain(d1, ev1.local_port()).unwrap();
    write_byte(s.as_ptr(), 4096 + 3, 9);
    s.set_unmap_notify(UnmapNotify {
        clear_byte: Some(4096 + 3),
        event: Some(ev1.local_port()),
    })
    .unwrap();
    let m = p2
        .map_grants(d1, s.grant_refs(), Access::ReadWrite)
        .unwrap();
    assert_eq!(read_byte(m.as_ptr(), 4096 + 3), 9);
    let refs = s.grant_refs().to_vec();
    drop(s);
    assert!(ev2.wait_timeout(WAIT).unwrap());
    // The mapper keeps its pages (as with gntalloc), and sees the byte cleared.
    assert_eq!(read_byte(m.as_ptr(), 4096 + 3), 0);
    // The grants are gone for new mappings.
    let e = p2.map_grants(d1, &refs, Access::ReadOnly).unwrap_err();
    assert!(
        matches!(e, Error::GrantRefused { errno: 22, ref reason, .. } if reason.contains("has no grant")),
        "{e}"
    );
}

#[test]
fn bad_unmap_notify_arguments_are_refused() {
    let h = Host::new();
    let (d1, p1) = h.domain();
    let (d2, p2) = h.domain();
    let s = p1.share_pages(d2, 1, Access::ReadOnly).unwrap();
    let e = s
        .set_unmap_notify(UnmapNotify {
            clear_byte: Some(4096),
            event: None,
        })
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(ref m) if m.contains("byte 4096 is outside the 4096-byte region")),
        "{e}"
    );
    let e = s
        .set_unmap_notify(UnmapNotify {
            clear_byte: None,
            event: Some(EvtchnPort(999)),
        })
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(22), "{e}");
    assert!(
        e.to_string()
            .contains("port 999 is not bound in this domain"),
        "{e}"
    );
    let m = p2.map_grants(d1, s.grant_refs(), Access::ReadOnly).unwrap();
    let e = m
        .set_unmap_notify(UnmapNotify {
            clear_byte: Some(0),
            event: None,
        })
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(ref m) if m.contains("cannot clear a byte of a read-only mapping")),
        "{e}"
    );
}

// ---- process death: the children are this test binary, re-run on the test that starts them
// with `XP_TEST_CHILD` set; that test then plays the child instead of running its own body. ----

const CHILD: &str = "XP_TEST_CHILD";

/// In a child started by [`child`]: the numbers it was given.
fn child_args() -> Option<Vec<u32>> {
    let args = std::env::var(CHILD).ok()?;
    Some(
        args.split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect(),
    )
}

/// Starts this binary as a process of `domid`, running only `test` (which plays the child).
fn child(
    test: &str,
    dir: &Path,
    domid: DomId,
    args: &str,
) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD, args)
        .env(xen_platform::ENV_SIM_DIR, dir)
        .env(xen_platform::ENV_SIM_DOMID, domid.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(c.stdout.take().unwrap());
    (c, out)
}

fn ready_line(out: &mut BufReader<std::process::ChildStdout>) -> Vec<u32> {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "child ended before READY"
        );
        // libtest may have printed `test <name> ... ` on the same line.
        if let Some(at) = line.find("READY") {
            return line[at + 5..]
                .split_whitespace()
                .map(|w| w.parse().unwrap())
                .collect();
        }
    }
}

/// The sharing child (args: peer): shares a page and a port with unmap-notify, then waits to
/// be killed (or for the parent to go away: stdin closes).
fn share_then_wait(args: &[u32]) -> ! {
    let p = Platform::detect().unwrap();
    let peer = DomId(args[0] as u16);
    let s = p.share_pages(peer, 1, Access::ReadWrite).unwrap();
    let ev = p.alloc_unbound(peer).unwrap();
    write_byte(s.as_ptr(), 100, 0xaa);
    s.set_unmap_notify(UnmapNotify {
        clear_byte: Some(100),
        event: Some(ev.local_port()),
    })
    .unwrap();
    println!("READY {} {}", s.grant_refs()[0], ev.local_port());
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    std::process::exit(0);
}

/// The mapping child (args: peer gref port): maps and binds with unmap-notify, then dies
/// abruptly.
fn map_then_die(args: &[u32]) -> ! {
    let p = Platform::detect().unwrap();
    let peer = DomId(args[0] as u16);
    let m = p
        .map_grants(peer, &[GrantRef(args[1])], Access::ReadWrite)
        .unwrap();
    let ev = p.bind_interdomain(peer, EvtchnPort(args[2])).unwrap();
    m.set_unmap_notify(UnmapNotify {
        clear_byte: Some(200),
        event: Some(ev.local_port()),
    })
    .unwrap();
    println!("READY");
    std::process::abort();
}

#[test]
fn unmap_notify_fires_when_the_sharing_process_dies() {
    if let Some(args) = child_args() {
        share_then_wait(&args);
    }
    let h = Host::new();
    let (d1, _) = h.domain();
    let (d2, p2) = h.domain();
    let (mut c, mut out) = child(
        "unmap_notify_fires_when_the_sharing_process_dies",
        &h.dir(),
        d1,
        &d2.to_string(),
    );
    let v = ready_line(&mut out);
    let m = p2
        .map_grants(d1, &[GrantRef(v[0])], Access::ReadWrite)
        .unwrap();
    let ev = p2.bind_interdomain(d1, EvtchnPort(v[1])).unwrap();
    assert_eq!(read_byte(m.as_ptr(), 100), 0xaa);
    c.kill().unwrap();
    c.wait().unwrap();
    assert!(
        ev.wait_timeout(WAIT).unwrap(),
        "no event after the sharer died"
    );
    assert_eq!(read_byte(m.as_ptr(), 100), 0);
    // Everything the dead process held is released.
    let info = h.host.list_domains();
    let d1i = info.iter().find(|d| d.domid == d1.0).unwrap();
    assert_eq!((d1i.grants, d1i.ports, d1i.connections), (0, 0, 0));
}

#[test]
fn unmap_notify_fires_when_the_mapping_process_dies() {
    if let Some(args) = child_args() {
        map_then_die(&args);
    }
    let h = Host::new();
    let (d1, p1) = h.domain();
    let (d2, _) = h.domain();
    let s = p1.share_pages(d2, 1, Access::ReadWrite).unwrap();
    let ev = p1.alloc_unbound(d2).unwrap();
    write_byte(s.as_ptr(), 200, 0xbb);
    let args = format!("{} {} {}", d1, s.grant_refs()[0], ev.local_port());
    let (mut c, mut out) = child(
        "unmap_notify_fires_when_the_mapping_process_dies",
        &h.dir(),
        d2,
        &args,
    );
    ready_line(&mut out);
    assert!(!c.wait().unwrap().success());
    assert!(
        ev.wait_timeout(WAIT).unwrap(),
        "no event after the mapper died"
    );
    assert_eq!(read_byte(s.as_ptr(), 200), 0);
    let info = h.host.list_domains();
    let d2i = info.iter().find(|d| d.domid == d2.0).unwrap();
    assert_eq!((d2i.mappings, d2i.ports, d2i.connections), (0, 0, 0));
}

#[test]
fn destroying_a_domain_releases_everything_it_held() {
    let h = Host::new();
    let (d1, p1) = h.domain();
    let (d2, p2) = h.domain();
    let to_d2 = p1.share_pages(d2, 1, Access::ReadWrite).unwrap();
    let from_d2 = p2.share_pages(d1, 2, Access::ReadWrite).unwrap();
    write_byte(from_d2.as_ptr(), 0, 0x77);
    let m1 = p1
        .map_grants(d2, from_d2.grant_refs(), Access::ReadWrite)
        .unwrap();
    let _m2 = p2
        .map_grants(d1, to_d2.grant_refs(), Access::ReadWrite)
        .unwrap();
    let ev1 = p1.alloc_unbound(d2).unwrap();
    let _ev2 = p2.bind_interdomain(d1, ev1.local_port()).unwrap();
    from_d2
        .set_unmap_notify(UnmapNotify {
            clear_byte: Some(0),
            event: Some(_ev2.local_port()),
        })
        .unwrap();

    h.host.destroy_domain(d2).unwrap();
    assert!(h.host.list_domains().iter().all(|d| d.domid != d2.0));
    // Its grant went away with it (unmap-notify fired), pages already mapped stay readable.
    assert!(ev1.wait_timeout(WAIT).unwrap());
    assert_eq!(read_byte(m1.as_ptr(), 0), 0);
    // Its process's connection is gone: further calls fail clearly.
    let e = p2.alloc_unbound(d1).unwrap_err();
    assert!(e.to_string().contains("hung up"), "{e}");
    // New mappings of its grants fail.
    let e = p1
        .map_grants(d2, from_d2.grant_refs(), Access::ReadOnly)
        .unwrap_err();
    assert!(
        matches!(e, Error::GrantRefused { errno: 3, ref reason, .. } if reason.contains("no domain")),
        "{e}"
    );
    // dom1 keeps what it owns.
    let d1i = h
        .host
        .list_domains()
        .into_iter()
        .find(|d| d.domid == d1.0)
        .unwrap();
    assert_eq!((d1i.grants, d1i.mappings, d1i.ports), (1, 1, 1));
    // Its sockets are gone.
    assert!(!xen_platform::sim::sock::hypercall_socket(&h.dir(), d2.0).exists());
    let e = Platform::open(PlatformKind::Sim {
        dir: h.dir(),
        domid: d2,
    })
    .unwrap_err();
    assert!(
        matches!(e, Error::SimHost(ref m) if m.contains(&format!("no domain {d2}"))),
        "{e}"
    );
}

#[test]
fn malformed_hypercalls_get_errors_and_the_host_survives() {
    use xen_platform::sim::{proto, sock, wire};
    let h = Host::new();
    let (d1, _) = h.domain();
    let path = sock::hypercall_socket(&h.dir(), d1.0);
    let s = sock::connect(&path).unwrap();
    let answer = |s: &std::os::fd::OwnedFd| match wire::recv(s).unwrap() {
        wire::Received::Message(m, _) => proto::parse_answer(&m).unwrap(),
        wire::Received::Closed => panic!("host hung up"),
    };
    // An empty packet reads as a hang-up: the host closes that connection, nothing more.
    let s0 = sock::connect(&path).unwrap();
    wire::send(&s0, &[], &[]).unwrap();
    assert!(matches!(wire::recv(&s0).unwrap(), wire::Received::Closed));
    for garbage in [
        &[0xff, 0xff][..],
        &[2, 0, 1][..],
        &[5, 0, 1, 0, 1, 255, 255, 255, 255][..],
    ] {
        wire::send(&s, garbage, &[]).unwrap();
        let a = answer(&s);
        assert!(
            matches!(a, Err(ref f) if f.errno == 22),
            "{garbage:?}: {a:?}"
        );
    }
    // Descriptors sent to the host are dropped, the request still answered.
    let ev = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    use std::os::fd::AsFd;
    wire::send(&s, &proto::Request::Hello.emit(), &[ev.as_fd()]).unwrap();
    assert!(answer(&s).is_ok());
    // Handles of someone else are refused.
    wire::send(&s, &proto::Request::GrantDealloc { handle: 1 }.emit(), &[]).unwrap();
    let a = answer(&s);
    assert!(
        matches!(a, Err(ref f) if f.errno == 22 && f.message == "no grant allocation 1 in this process"),
        "{a:?}"
    );
    // A process that dies mid-request.
    let s2 = sock::connect(&path).unwrap();
    wire::send(
        &s2,
        &proto::Request::GrantAlloc {
            domid: 0,
            writable: true,
            count: 1,
        }
        .emit(),
        &[],
    )
    .unwrap();
    drop(s2);
    // The host still serves.
    wire::send(&s, &proto::Request::Hello.emit(), &[]).unwrap();
    assert!(answer(&s).is_ok());
    let p = h.platform(d1);
    let _x = p.share_pages(DomId(0), 1, Access::ReadWrite).unwrap();
}

#[test]
fn xenstore_per_domain_identity_and_domain_watches() {
    use xen_platform::xenstore_proto::client::Client;
    let h = Host::new();
    let dom0 = Client::from_unix_stream(h.host.xenstore_server().connect(0).unwrap()).unwrap();
    let mut intro = dom0.watch("@introduceDomain").unwrap();
    let mut release = dom0.watch("@releaseDomain").unwrap();
    // The initial fire of each watch.
    intro.next_timeout(WAIT).unwrap().unwrap();
    release.next_timeout(WAIT).unwrap().unwrap();

    let d = h.host.create_domain(Some("guest-a"), None).unwrap();
    assert!(intro.next_timeout(WAIT).unwrap().is_some());
    let p = h.platform(d);
    let xs = p.xenstore().unwrap();
    assert_eq!(xs.read_string("name").unwrap(), "guest-a");
    assert_eq!(xs.read_string("domid").unwrap(), d.to_string());
    xs.write("data/hello", "1").unwrap();
    assert!(xs.write("name", "evil").unwrap_err().is_access_denied());
    assert!(xs
        .read_string("/local/domain/0/name")
        .unwrap_err()
        .is_access_denied());
    assert_eq!(p.domid().unwrap(), d);
    assert_eq!(
        dom0.read_string(&format!("/local/domain/{d}/vm")).unwrap(),
        xen_platform::sim::xenstore::vm_path(d)
    );

    h.host.destroy_domain(d).unwrap();
    assert!(release.next_timeout(WAIT).unwrap().is_some());
    assert!(!dom0.exists(&format!("/local/domain/{d}")).unwrap());
}

#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Platform>();
    check::<xen_platform::SharedPages>();
    check::<xen_platform::ForeignMapping>();
    check::<xen_platform::EventChannel>();
}

#[test]
fn event_channel_ports_are_limited_per_domain() {
    let h = Host::new();
    let (_d1, p1) = h.domain();
    let mut held = Vec::new();
    let e = loop {
        match p1.alloc_unbound(DomId(0)) {
            Ok(c) => held.push(c),
            Err(e) => break e,
        }
        assert!(held.len() <= 1023, "no port limit");
    };
    assert_eq!(held.len(), 1023);
    assert!(e.to_string().contains("max_event_channels"), "{e}");
    held.pop();
    held.push(p1.alloc_unbound(DomId(0)).unwrap());
}
