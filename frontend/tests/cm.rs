//! Connection management end to end on one simulated host: the real backend daemon (in this
//! process, wired as `vrdma-backend` wires it: `address`, `[cm]` policy, the software device's
//! connection manager) and two guest domains using the library. Guest A listens, guest B
//! connects to the backend's published address with private data; accept, SEND/RECV, reject,
//! disconnect from either side, and the policy's refusals. Bypass and mediated mode.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use vrdma::{AccessFlags, Context, Error, Mode, Status, WorkCompletion};
use vrdma_backend::config::Config;
use vrdma_backend::control::policy::CmPolicy;
use vrdma_backend::control::ControlOpener;
use vrdma_backend::daemon::{self, Daemon, ShutdownHandle};
use vrdma_backend::device::{Device, EngineConfig, SoftDevice};
use vrdma_backend::resources::Quotas;
use xen_platform::sim::{SimHost, SimHostConfig};
use xen_platform::{DomId, Platform, PlatformKind};

const T: Duration = Duration::from_secs(20);

const CONFIG: &str = r#"
address = ["127.0.0.2"]
[cm]
allowed-peers = ["127.0.0.0/8"]
connect-timeout-ms = 3000
"#;

struct Host {
    _tmp: tempfile::TempDir,
    host: SimHost,
    shutdown: ShutdownHandle,
    daemon: Option<std::thread::JoinHandle<Result<(), daemon::DaemonError>>>,
}

impl Host {
    fn start() -> Host {
        Host::start_with(CONFIG)
    }

    fn start_with(config: &str) -> Host {
        let tmp = tempfile::Builder::new()
            .prefix("vcm")
            .tempdir_in("/tmp")
            .unwrap();
        let host = SimHost::start(SimHostConfig::new(tmp.path())).unwrap();
        let p0 = platform(&host, DomId::DOM0);
        let config = Config::parse(config, "test").unwrap();
        let policy = Arc::new(CmPolicy::new(config.cm.clone()));
        let addrs = config.addresses(&[]);
        let device: Arc<dyn Device> = Arc::new(
            SoftDevice::new(EngineConfig::default())
                .unwrap()
                .with_cm(config.cm_device_config(addrs, policy.clone()))
                .unwrap(),
        );
        let d = Daemon::new(
            Arc::new(p0.xenstore().unwrap()),
            0,
            daemon::device_info_of("soft-iwarp", &*device),
            Quotas::default(),
            daemon::device_stats_source(device.clone()),
            move |faults| {
                Box::new(
                    ControlOpener::new(p0.clone(), device.clone(), faults)
                        .with_cm_policy(policy.clone()),
                )
            },
        );
        let shutdown = d.shutdown_handle();
        let daemon = Some(std::thread::spawn(move || d.run()));
        Host {
            _tmp: tmp,
            host,
            shutdown,
            daemon,
        }
    }

    fn guest(&self, name: &str, mode: Mode) -> Context {
        let d = self.host.create_domain(Some(name), None).unwrap();
        self.open(d, mode)
    }

    fn open(&self, d: DomId, mode: Mode) -> Context {
        let dom0 = platform(&self.host, DomId::DOM0).xenstore().unwrap();
        vrdma_backend::toolstack::attach_device(&dom0, u32::from(d.0), 0, 0, &Quotas::default())
            .unwrap();
        let pg = platform(&self.host, d);
        Context::builder()
            .store(Arc::new(pg.xenstore().unwrap()))
            .platform(pg)
            .mode(mode)
            .timeout(T)
            .open()
            .unwrap()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.shutdown.shutdown();
        if let Some(d) = self.daemon.take() {
            let _ = d.join();
        }
    }
}

fn platform(host: &SimHost, d: DomId) -> Platform {
    Platform::open(PlatformKind::Sim {
        dir: host.dir().to_path_buf(),
        domid: d,
    })
    .unwrap()
}

fn one(cq: &mut vrdma::CompletionQueue) -> WorkCompletion {
    let mut wc = [WorkCompletion::default(); 1];
    let got = cq.wait(&mut wc, Some(T)).unwrap();
    assert_eq!(got.len(), 1, "a completion within {T:?}");
    got[0]
}

fn scenario(mode: Mode) {
    let host = Host::start();
    let a = host.guest("a", mode);
    let b = host.guest("b", mode);
    let backend: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    assert_eq!(a.backend_addr(), Some(backend), "the published address");

    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (mut ca, mut cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let listener = a.listen(0, 4).unwrap();
    let at = listener.local_addr();
    assert_eq!(at.ip(), backend);
    assert_ne!(at.port(), 0);

    // 1. Connect with private data both ways, accept, SEND/RECV.
    let mut qa = pa.create_qp(&ca, &ca).build().unwrap();
    let mut qb = pb.create_qp(&cb, &cb).build().unwrap();
    let hello: Vec<u8> = (0..255u32).map(|i| (i * 3 + 7) as u8).collect();
    let info_b = std::thread::scope(|s| {
        let hello = &hello;
        let active = s.spawn(|| qb.connect_to(at, hello, T));
        let req = listener.get_request(Some(T)).unwrap();
        assert_eq!(req.private_data(), &hello[..]);
        assert_eq!(req.peer().ip(), backend);
        let info_a = req.accept(&mut qa, b"welcome, B").unwrap();
        assert_eq!(info_a.local.ip(), backend);
        active.join().unwrap().unwrap()
    });
    assert_eq!(info_b.private_data, b"welcome, B");
    assert_eq!(info_b.peer, at);

    let ma = pa.alloc_mr(8192, AccessFlags::ALL).unwrap();
    let mb = pb.alloc_mr(8192, AccessFlags::ALL).unwrap();
    let msg: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    mb.write(0, &msg).unwrap();
    qa.post_recv(&[ma.slice(0..8192)], 11).unwrap();
    qb.post_send(&[mb.slice(0..msg.len())], 12).unwrap();
    let s = one(&mut cb);
    assert!(s.is_ok() && s.wr_id == 12, "{s:?}");
    let r = one(&mut ca);
    assert!(
        r.is_ok() && r.wr_id == 11 && r.byte_len as usize == msg.len(),
        "{r:?}"
    );
    let mut got = vec![0u8; msg.len()];
    ma.read(0, &mut got).unwrap();
    assert_eq!(got, msg);

    // 2. Disconnect from the connecting side: the accepting side learns it.
    qb.disconnect().unwrap();
    assert!(
        qa.wait_disconnected(Some(T)).unwrap(),
        "A sees B's disconnect"
    );

    // 3. Reject with private data.
    let mut qb2 = pb.create_qp(&cb, &cb).build().unwrap();
    let rejected = std::thread::scope(|s| {
        let active = s.spawn(|| qb2.connect_to(at, b"again?", T));
        let req = listener.get_request(Some(T)).unwrap();
        assert_eq!(req.private_data(), b"again?");
        req.reject(b"no, thanks").unwrap();
        active.join().unwrap()
    });
    match rejected {
        Err(Error::ConnectRejected { peer, private_data }) => {
            assert_eq!((peer, &private_data[..]), (at, &b"no, thanks"[..]))
        }
        r => panic!("a rejected connect: {r:?}"),
    }

    // 4. Disconnect from the accepting side: the connecting side learns it.
    let mut qa3 = pa.create_qp(&ca, &ca).build().unwrap();
    let mut qb3 = pb.create_qp(&cb, &cb).build().unwrap();
    std::thread::scope(|s| {
        let active = s.spawn(|| qb3.connect_to(at, b"", T));
        let req = listener.get_request(Some(T)).unwrap();
        assert!(req.private_data().is_empty());
        req.accept(&mut qa3, b"").unwrap();
        active.join().unwrap().unwrap();
    });
    qa3.disconnect().unwrap();
    assert!(
        qb3.wait_disconnected(Some(T)).unwrap(),
        "B sees A's disconnect"
    );

    // 5. Nobody listens on a port: rejected, no private data.
    let mut qb4 = pb.create_qp(&cb, &cb).build().unwrap();
    let closed = SocketAddr::new(backend, at.port().wrapping_add(1).max(1024));
    match qb4.connect_to(closed, b"anyone?", T) {
        Err(Error::ConnectRejected { private_data, .. }) => assert!(private_data.is_empty()),
        r => panic!("a connect to a closed port: {r:?}"),
    }

    // 6. The policy: peers outside allowed-peers, privileged ports.
    let mut qb5 = pb.create_qp(&cb, &cb).build().unwrap();
    let e = qb5
        .connect_to("10.1.2.3:4791".parse().unwrap(), b"", T)
        .unwrap_err();
    assert_eq!(e.status(), Some(Status::NotPermitted), "{e}");
    let e = b.listen(80, 1).unwrap_err();
    assert_eq!(e.status(), Some(Status::NotPermitted), "{e}");
    // A's port is A's.
    let e = b.listen(at.port(), 1).unwrap_err();
    assert_eq!(e.status(), Some(Status::AddressInUse), "{e}");
    // Oversize private data never leaves the library.
    assert!(matches!(
        qb5.connect_to(at, &[0u8; 256], T),
        Err(Error::InvalidArgument(_))
    ));
    drop(listener);
}

#[test]
fn listen_connect_accept_reject_disconnect_bypass() {
    scenario(Mode::Bypass);
}

#[test]
fn listen_connect_accept_reject_disconnect_mediated() {
    scenario(Mode::Mediated);
}

#[test]
fn an_unanswered_request_and_a_dropped_listener_leave_nothing_behind() {
    let host = Host::start();
    let a = host.guest("a", Mode::Bypass);
    let b = host.guest("b", Mode::Bypass);
    let pb = b.alloc_pd().unwrap();
    let cb = b.create_cq(16).unwrap();
    let listener = a.listen(0, 4).unwrap();
    let at = listener.local_addr();
    let mut qb = pb.create_qp(&cb, &cb).build().unwrap();
    let r = std::thread::scope(|s| {
        let active = s.spawn(|| qb.connect_to(at, b"x", T));
        // Dropped unanswered: rejected.
        drop(listener.get_request(Some(T)).unwrap());
        active.join().unwrap()
    });
    assert!(matches!(r, Err(Error::ConnectRejected { .. })), "{r:?}");
    assert!(matches!(
        listener.get_request(Some(Duration::from_millis(50))),
        Err(Error::Timeout { .. })
    ));
    // A connect nobody answers in time is a timeout (and abandoned).
    let mut qb2 = pb.create_qp(&cb, &cb).build().unwrap();
    match qb2.connect_to(at, b"y", Duration::from_millis(300)) {
        Err(Error::Timeout { .. }) => {}
        r => panic!("an unanswered connect: {r:?}"),
    }
    let port = at.port();
    drop(listener);
    // The port is free again (for another domain too).
    let again = b.listen(port, 1).unwrap();
    assert_eq!(again.local_addr().port(), port);
}

#[test]
fn a_destroyed_guest_gives_its_port_back() {
    let host = Host::start();
    let da = host.host.create_domain(Some("a"), None).unwrap();
    let a = host.open(da, Mode::Bypass);
    let b = host.guest("b", Mode::Bypass);
    let listener = a.listen(0, 4).unwrap();
    let port = listener.local_addr().port();
    assert_eq!(
        b.listen(port, 1).unwrap_err().status(),
        Some(Status::AddressInUse)
    );
    // The guest's domain goes away with its listener open: the backend reclaims the channel
    // and the device closes the listener.
    host.host.destroy_domain(da).unwrap();
    let deadline = std::time::Instant::now() + T;
    let again = loop {
        match b.listen(port, 1) {
            Ok(l) => break l,
            Err(e) if e.status() == Some(Status::AddressInUse) => {
                assert!(std::time::Instant::now() < deadline, "the port stays taken");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(again.local_addr().port(), port);
    drop((listener, a)); // their domain is gone: nothing to close
}

/// Two simulated hosts (two backends, 127.0.0.2 and 127.0.0.3): the connect request, its
/// private data and the reject's cross the MPA exchange; each host's `allowed-peers` holds.
#[test]
fn between_two_hosts_requests_and_rejects_carry_private_data_and_peers_are_filtered() {
    let h2 = Host::start_with(
        "address = [\"127.0.0.2\"]\n[cm]\nconnect-timeout-ms = 5000\n[cm.domain.2]\nallowed-peers = [\"127.0.0.2\"]",
    );
    let h3 = Host::start_with(
        "address = [\"127.0.0.3\"]\n[cm]\nconnect-timeout-ms = 5000\nallowed-peers = [\"127.0.0.2\"]",
    );
    let a = h2.guest("a", Mode::Bypass); // domain 1 on host 2: any peer
    let c = h2.guest("c", Mode::Bypass); // domain 2 on host 2: only its own host
    let b = h3.guest("b", Mode::Bypass); // on host 3: only host 2
    assert_eq!(b.backend_addr(), Some("127.0.0.3".parse().unwrap()));
    let listener = a.listen(0, 4).unwrap();
    let at = listener.local_addr();
    let pb = b.alloc_pd().unwrap();
    let cb = b.create_cq(16).unwrap();
    let mut qb = pb.create_qp(&cb, &cb).build().unwrap();
    let r = std::thread::scope(|s| {
        let active = s.spawn(|| qb.connect_to(at, b"from host 3", T));
        let req = listener.get_request(Some(T)).unwrap();
        assert_eq!(req.private_data(), b"from host 3");
        assert_eq!(
            req.peer().ip(),
            "127.0.0.3".parse::<std::net::IpAddr>().unwrap()
        );
        req.reject(b"not today").unwrap();
        active.join().unwrap()
    });
    match r {
        Err(Error::ConnectRejected { peer, private_data }) => {
            assert_eq!((peer, &private_data[..]), (at, &b"not today"[..]))
        }
        r => panic!("a rejected connect: {r:?}"),
    }
    // Host 3's domain may reach host 2 only: a listener of its own host is not allowed.
    let local = b.listen(0, 1).unwrap();
    let mut qb2 = pb.create_qp(&cb, &cb).build().unwrap();
    let e = qb2.connect_to(local.local_addr(), b"", T).unwrap_err();
    assert_eq!(e.status(), Some(Status::NotPermitted), "{e}");
    // Domain 2 of host 2 may not hear from host 3: its listener never sees the request,
    // and the connecting side is rejected.
    let lc = c.listen(0, 4).unwrap();
    let mut qb3 = pb.create_qp(&cb, &cb).build().unwrap();
    match qb3.connect_to(lc.local_addr(), b"let me in", T) {
        Err(Error::ConnectRejected { .. }) => {}
        r => panic!("a connect the peer filter refuses: {r:?}"),
    }
    assert!(matches!(
        lc.get_request(Some(Duration::from_millis(200))),
        Err(Error::Timeout { .. })
    ));
}

/// Many connects of one guest at once, each with its own private data: every call holds its
/// own CM page slot, so nothing mixes; the listener answers each with data derived from the
/// request's, and each connecting QP gets exactly its answer.
#[test]
fn concurrent_connects_keep_their_private_data_apart() {
    const N: usize = 12;
    let host = Host::start();
    let a = host.guest("a", Mode::Bypass);
    let b = host.guest("b", Mode::Bypass);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let listener = a.listen(0, 16).unwrap();
    let at = listener.local_addr();
    let mut qas: Vec<_> = (0..N)
        .map(|_| pa.create_qp(&ca, &ca).build().unwrap())
        .collect();
    let mut qbs: Vec<_> = (0..N)
        .map(|_| pb.create_qp(&cb, &cb).build().unwrap())
        .collect();
    let data = |i: usize| -> Vec<u8> { (0..(40 + 17 * i)).map(|k| (i * 31 + k) as u8).collect() };
    std::thread::scope(|s| {
        let actives: Vec<_> = qbs
            .iter_mut()
            .enumerate()
            .map(|(i, q)| s.spawn(move || (i, q.connect_to(at, &data(i), T))))
            .collect();
        for qa in qas.iter_mut() {
            let req = listener.get_request(Some(T)).unwrap();
            let mut answer = req.private_data().to_vec();
            answer.reverse();
            req.accept(qa, &answer).unwrap();
        }
        for h in actives {
            let (i, r) = h.join().unwrap();
            let mut want = data(i);
            want.reverse();
            assert_eq!(r.unwrap().private_data, want, "connect {i}");
        }
    });
}
