//! The software device's connection manager through the `Device` trait: intra-host
//! listen/connect/accept/reject/disconnect, port ownership, cleanup on channel close, the
//! peer filter, and remote connects between two devices on 127.0.0.2 and 127.0.0.3 (up to
//! the MPA answer; the data path takes over after that).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iwarp_proto::mpa::{FrameKind, IrdOrd, MpaRepr};
use shared_ring::abi::control::{access, QpState};
use shared_ring::abi::cqe::CqeStatus;
use shared_ring::abi::event::{EventKind, EventRepr};
use vrdma_backend::device::testkit::{TestChannel, TestQp, HANG};
use vrdma_backend::device::{
    ChannelMode, CmConfig, ConnRequestId, Device, DeviceError, DomId, EngineConfig, ListenerId,
    SoftDevice, MAX_PRIVATE_DATA,
};

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));

fn device_with(ip: IpAddr, f: impl FnOnce(&mut CmConfig)) -> SoftDevice {
    let mut c = CmConfig {
        addrs: vec![ip],
        connect_timeout: Duration::from_secs(5),
        ..CmConfig::default()
    };
    f(&mut c);
    SoftDevice::new(EngineConfig::default())
        .expect("device")
        .with_cm(c)
        .expect("cm")
}

fn device(ip: IpAddr) -> SoftDevice {
    device_with(ip, |_| {})
}

struct End {
    ch: TestChannel,
    qp: TestQp,
}

fn end(dev: &SoftDevice, dom: u16) -> End {
    let mut ch = TestChannel::open(dev, dom, ChannelMode::Bypass);
    let cq = ch.cq(dev, 6);
    let qp = ch.qp(dev, &cq, &cq, 4);
    End { ch, qp }
}

/// Waits for the next event of the channel.
fn event(ch: &mut TestChannel) -> EventRepr {
    let t0 = Instant::now();
    loop {
        if let Some(e) = ch.take_events().into_iter().next() {
            return e;
        }
        assert!(t0.elapsed() < HANG, "no event");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn no_event(ch: &mut TestChannel) {
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(ch.take_events(), vec![]);
}

fn listen(dev: &SoftDevice, ch: &TestChannel, ip: IpAddr) -> (ListenerId, SocketAddr) {
    let l = dev
        .cm_listen(ch.id, SocketAddr::new(ip, 0), 8)
        .expect("listen");
    let a = dev.cm_listener_addr(ch.id, l).expect("listener addr");
    assert_eq!(a.ip(), ip);
    assert_ne!(a.port(), 0, "the device chose a port");
    (l, a)
}

fn request(ev: EventRepr, l: ListenerId) -> ConnRequestId {
    assert_eq!(ev.kind, EventKind::ConnectRequest);
    assert_eq!(ev.handle, l.0);
    ConnRequestId(u32::try_from(ev.detail).expect("request id"))
}

#[test]
fn without_cm_config_everything_is_not_supported() {
    let dev = SoftDevice::new(EngineConfig::default()).unwrap();
    let e = end(&dev, 1);
    assert!(dev.local_addrs().is_empty());
    assert!(matches!(
        dev.cm_listen(e.ch.id, SocketAddr::new(A, 0), 1),
        Err(DeviceError::NotSupported(_))
    ));
}

#[test]
fn intra_host_connect_accept_and_disconnect() {
    let dev = device(A);
    assert_eq!(dev.local_addrs(), vec![A]);
    let mut s = end(&dev, 1);
    let mut c = end(&dev, 2);
    let (l, addr) = listen(&dev, &s.ch, A);
    dev.cm_connect(c.ch.id, c.qp.num, addr, b"request")
        .expect("connect");
    let req = request(event(&mut s.ch), l);
    let info = dev.cm_request_info(s.ch.id, req).expect("request info");
    assert_eq!(info.private_data, b"request");
    assert_eq!(info.local, addr);
    assert_eq!(info.peer.ip(), A);
    // Another channel cannot answer it.
    assert!(matches!(
        dev.cm_accept(c.ch.id, req, c.qp.num, b""),
        Err(DeviceError::BadHandle { .. })
    ));
    dev.cm_accept(s.ch.id, req, s.qp.num, b"reply")
        .expect("accept");
    let (sn, cn) = (s.qp.num, c.qp.num);
    for (e, peer) in [(&mut s, cn), (&mut c, sn)] {
        let ev = event(&mut e.ch);
        assert_eq!(ev.kind, EventKind::QpEstablished);
        assert_eq!(ev.handle, e.qp.num.0);
        assert_eq!(ev.detail, u64::from(peer.0));
        assert_eq!(dev.qp_state(e.ch.id, e.qp.num).unwrap(), QpState::Rts);
    }
    assert_eq!(
        dev.cm_qp_info(c.ch.id, c.qp.num).unwrap().private_data,
        b"reply"
    );
    assert_eq!(
        dev.cm_qp_info(s.ch.id, s.qp.num).unwrap().private_data,
        b"request"
    );
    // The request is gone once answered.
    assert!(dev.cm_request_info(s.ch.id, req).is_err());
    dev.cm_disconnect(c.ch.id, c.qp.num).expect("disconnect");
    for e in [&mut s, &mut c] {
        let ev = event(&mut e.ch);
        assert_eq!(ev.kind, EventKind::QpDisconnected);
        assert_eq!(ev.handle, e.qp.num.0);
        assert_eq!(dev.qp_state(e.ch.id, e.qp.num).unwrap(), QpState::Error);
    }
}

#[test]
fn intra_host_reject_and_no_listener() {
    let dev = device(A);
    let mut s = end(&dev, 1);
    let mut c = end(&dev, 2);
    let (l, addr) = listen(&dev, &s.ch, A);
    dev.cm_connect(c.ch.id, c.qp.num, addr, b"let me in")
        .expect("connect");
    let req = request(event(&mut s.ch), l);
    dev.cm_reject(s.ch.id, req, b"no").expect("reject");
    let ev = event(&mut c.ch);
    assert_eq!(
        (ev.kind, ev.handle),
        (EventKind::ConnectRejected, c.qp.num.0)
    );
    assert_eq!(
        dev.cm_qp_info(c.ch.id, c.qp.num).unwrap().private_data,
        b"no"
    );
    assert_eq!(dev.qp_state(c.ch.id, c.qp.num).unwrap(), QpState::Error);
    no_event(&mut s.ch);

    // Nobody on that port.
    let mut c2 = end(&dev, 2);
    dev.cm_close_listener(s.ch.id, l).expect("close listener");
    dev.cm_connect(c2.ch.id, c2.qp.num, addr, b"")
        .expect("connect");
    let ev = event(&mut c2.ch);
    assert_eq!(
        (ev.kind, ev.handle),
        (EventKind::ConnectRejected, c2.qp.num.0)
    );
}

#[test]
fn bad_arguments_are_errors() {
    let dev = device(A);
    let s = end(&dev, 1);
    let c = end(&dev, 2);
    let too_long = vec![0u8; MAX_PRIVATE_DATA + 1];
    assert!(matches!(
        dev.cm_connect(c.ch.id, c.qp.num, SocketAddr::new(A, 1), &too_long),
        Err(DeviceError::InvalidArgument(_))
    ));
    assert!(matches!(
        dev.cm_listen(s.ch.id, SocketAddr::new(B, 0), 1),
        Err(DeviceError::InvalidArgument(_))
    ));
    assert!(matches!(
        dev.cm_connect(c.ch.id, s.qp.num, SocketAddr::new(A, 1), b""),
        Err(DeviceError::BadHandle { .. })
    ));
    let (l, addr) = listen(&dev, &s.ch, A);
    assert!(dev.cm_listener_addr(c.ch.id, l).is_err());
    assert!(dev.cm_close_listener(c.ch.id, l).is_err());
    // A QP connects once.
    dev.cm_connect(c.ch.id, c.qp.num, addr, b"").unwrap();
    assert!(matches!(
        dev.cm_connect(c.ch.id, c.qp.num, addr, b""),
        Err(DeviceError::ConnectionRefused(..))
    ));
}

#[test]
fn a_port_belongs_to_one_listener() {
    let dev = device(A);
    let s = end(&dev, 1);
    let other = end(&dev, 2);
    let (l, addr) = listen(&dev, &s.ch, A);
    for ch in [&other.ch, &s.ch] {
        assert_eq!(
            dev.cm_listen(ch.id, addr, 1),
            Err(DeviceError::Busy("port")),
            "squatting"
        );
        assert_eq!(
            dev.cm_listen(
                ch.id,
                SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), addr.port()),
                1
            ),
            Err(DeviceError::Busy("port"))
        );
    }
    // The port is bound on the host too: nobody else takes it.
    assert!(TcpListener::bind(addr).is_err());
    dev.cm_close_listener(s.ch.id, l).unwrap();
    // Free again, at once.
    let l2 = dev
        .cm_listen(other.ch.id, addr, 1)
        .expect("port free again");
    assert_eq!(dev.cm_listener_addr(other.ch.id, l2).unwrap(), addr);
}

#[test]
fn closing_a_channel_closes_its_listeners_and_rejects_waiting_requests() {
    let dev = device(A);
    let mut s = end(&dev, 1);
    let mut c = end(&dev, 2);
    let (l, addr) = listen(&dev, &s.ch, A);
    dev.cm_connect(c.ch.id, c.qp.num, addr, b"").unwrap();
    let _req = request(event(&mut s.ch), l);
    // A remote requester waits at the same listener.
    let mut raw = TcpStream::connect_timeout(&addr, HANG).unwrap();
    raw.set_read_timeout(Some(HANG)).unwrap();
    raw.write_all(&mpa_request(false, b"raw")).unwrap();
    let req2 = request(event(&mut s.ch), l);
    assert_eq!(
        dev.cm_request_info(s.ch.id, req2).unwrap().private_data,
        b"raw"
    );
    dev.close_channel(s.ch.id);
    let ev = event(&mut c.ch);
    assert_eq!(
        (ev.kind, ev.handle),
        (EventKind::ConnectRejected, c.qp.num.0)
    );
    let rep = read_frame(&mut raw);
    assert!(MpaRepr::from_bytes(&rep).unwrap().reject, "MPA reject");
    // The port is free for another channel.
    let d = end(&dev, 3);
    dev.cm_listen(d.ch.id, addr, 1)
        .expect("port free after close");
}

/// As with Linux rdma_cm (a request id the program got survives `rdma_destroy_id` of the
/// listening id): closing a listener rejects the requests the guest has not taken, and keeps
/// those it took (asked their `CmInfo`) until they are answered; accepted, they connect. A
/// kept request of a closing channel is rejected. Until 2026-11-24 every request of a closed
/// listener was rejected.
#[test]
fn a_request_the_guest_took_outlives_its_listener() {
    let dev = device(A);
    let mut s = end(&dev, 1);
    let mut c1 = end(&dev, 2);
    let mut c2 = end(&dev, 3);
    let (l, addr) = listen(&dev, &s.ch, A);
    dev.cm_connect(c1.ch.id, c1.qp.num, addr, b"one").unwrap();
    let req1 = request(event(&mut s.ch), l);
    assert_eq!(
        dev.cm_request_info(s.ch.id, req1).unwrap().private_data,
        b"one"
    );
    dev.cm_connect(c2.ch.id, c2.qp.num, addr, b"two").unwrap();
    let _req2 = request(event(&mut s.ch), l);
    dev.cm_close_listener(s.ch.id, l).expect("close listener");
    // The request nobody took is rejected; the one the guest took is not.
    let ev = event(&mut c2.ch);
    assert_eq!(
        (ev.kind, ev.handle),
        (EventKind::ConnectRejected, c2.qp.num.0)
    );
    no_event(&mut c1.ch);
    dev.cm_accept(s.ch.id, req1, s.qp.num, b"welcome")
        .expect("accept after the listener closed");
    for (ch, qp) in [(&mut s.ch, s.qp.num), (&mut c1.ch, c1.qp.num)] {
        let ev = event(ch);
        assert_eq!((ev.kind, ev.handle), (EventKind::QpEstablished, qp.0));
    }
    assert_eq!(
        dev.cm_qp_info(c1.ch.id, c1.qp.num).unwrap().private_data,
        b"welcome"
    );

    // A kept request goes with its channel.
    let mut t = end(&dev, 4);
    let mut c3 = end(&dev, 5);
    let (l2, addr2) = listen(&dev, &t.ch, A);
    dev.cm_connect(c3.ch.id, c3.qp.num, addr2, b"").unwrap();
    let req3 = request(event(&mut t.ch), l2);
    dev.cm_request_info(t.ch.id, req3).unwrap();
    dev.cm_close_listener(t.ch.id, l2).unwrap();
    no_event(&mut c3.ch);
    dev.close_channel(t.ch.id);
    let ev = event(&mut c3.ch);
    assert_eq!(
        (ev.kind, ev.handle),
        (EventKind::ConnectRejected, c3.qp.num.0)
    );
}

/// A domain keeps at most `max_kept_requests` taken requests of closed listeners, over all
/// its channels (a guest that listens, takes and closes in a loop would keep each one, and
/// its TCP connection when remote; a second channel gives it no more): beyond it, a closing
/// listener's taken requests are rejected as untaken ones are, and the kept ones stay
/// answerable; another domain has its own. Before 2026-11-24 nothing bounded them.
#[test]
fn a_channel_keeps_a_bounded_number_of_taken_requests() {
    let dev = device_with(A, |c| c.max_kept_requests = 2);
    // Rounds 0 and 1 on two channels of domain 1, round 2 on domain 9.
    let mut servers = [end(&dev, 1), end(&dev, 1), end(&dev, 9)];
    let mut clients: Vec<End> = (0..6).map(|i| end(&dev, 2 + i)).collect();
    let mut taken = Vec::new();
    for (round, s) in servers.iter_mut().enumerate() {
        let (l, addr) = listen(&dev, &s.ch, A);
        for c in &mut clients[round * 2..round * 2 + 2] {
            dev.cm_connect(c.ch.id, c.qp.num, addr, b"").unwrap();
            let req = request(event(&mut s.ch), l);
            dev.cm_request_info(s.ch.id, req).unwrap();
            taken.push(req);
        }
        dev.cm_close_listener(s.ch.id, l).unwrap();
    }
    // The first listener's two are kept; the second's (same domain) are over the bound:
    // rejected; the third's (another domain) are kept.
    for i in [0, 1, 4, 5] {
        no_event(&mut clients[i].ch);
    }
    for c in &mut clients[2..4] {
        let ev = event(&mut c.ch);
        assert_eq!(
            (ev.kind, ev.handle),
            (EventKind::ConnectRejected, c.qp.num.0)
        );
    }
    assert!(dev.cm_request_info(servers[1].ch.id, taken[2]).is_err());
    dev.cm_accept(servers[0].ch.id, taken[0], servers[0].qp.num, b"")
        .expect("a kept request is answerable");
    let ev = event(&mut clients[0].ch);
    assert_eq!(
        (ev.kind, ev.handle),
        (EventKind::QpEstablished, clients[0].qp.num.0)
    );
    dev.cm_request_info(servers[2].ch.id, taken[4])
        .expect("another domain's kept request");
}

#[test]
fn destroying_a_connecting_qp_withdraws_its_request() {
    let dev = device(A);
    let mut s = end(&dev, 1);
    let c = end(&dev, 2);
    let (l, addr) = listen(&dev, &s.ch, A);
    dev.cm_connect(c.ch.id, c.qp.num, addr, b"").unwrap();
    let req = request(event(&mut s.ch), l);
    dev.destroy_qp(c.ch.id, c.qp.num).unwrap();
    assert!(matches!(
        dev.cm_accept(s.ch.id, req, s.qp.num, b""),
        Err(DeviceError::BadHandle { .. })
    ));
    assert_eq!(dev.qp_state(s.ch.id, s.qp.num).unwrap(), QpState::Init);
}

#[test]
fn the_peer_filter_refuses() {
    // Domain 2 may not reach 127.0.0.3; domain 1's listener hears from nobody at 127.0.0.2.
    let filter = |dom: DomId, peer: SocketAddr| {
        !(dom == DomId(2) && peer.ip() == B || dom == DomId(1) && peer.ip() == A)
    };
    let dev_a = device_with(A, |c| c.peer_filter = Some(Arc::new(filter)));
    let dev_b = device_with(B, |c| c.peer_filter = Some(Arc::new(filter)));
    let c = end(&dev_a, 2);
    assert!(matches!(
        dev_a.cm_connect(c.ch.id, c.qp.num, SocketAddr::new(B, 4791), b""),
        Err(DeviceError::ConnectionRefused(..))
    ));
    // Incoming: dev_b's listener of domain 1 refuses a peer at 127.0.0.2.
    let mut s = end(&dev_b, 1);
    let (_, addr) = listen(&dev_b, &s.ch, B);
    let mut c3 = end(&dev_a, 3);
    dev_a.cm_connect(c3.ch.id, c3.qp.num, addr, b"").unwrap();
    let ev = event(&mut c3.ch);
    assert_eq!(
        (ev.kind, ev.handle),
        (EventKind::ConnectRejected, c3.qp.num.0)
    );
    no_event(&mut s.ch);
    // Intra-host: domain 1 listening on 127.0.0.2 refuses its own host's address.
    let mut s_a = end(&dev_a, 1);
    let (_, addr_a) = listen(&dev_a, &s_a.ch, A);
    let mut c4 = end(&dev_a, 4);
    dev_a.cm_connect(c4.ch.id, c4.qp.num, addr_a, b"").unwrap();
    let ev = event(&mut c4.ch);
    assert_eq!(ev.kind, EventKind::ConnectRejected);
    no_event(&mut s_a.ch);
}

#[test]
fn remote_request_and_reject_between_two_devices() {
    let dev_a = device(A);
    let dev_b = device(B);
    let mut s = end(&dev_b, 1);
    let mut c = end(&dev_a, 1);
    let (l, addr) = listen(&dev_b, &s.ch, B);
    dev_a
        .cm_connect(c.ch.id, c.qp.num, addr, b"from A")
        .unwrap();
    let req = request(event(&mut s.ch), l);
    let info = dev_b.cm_request_info(s.ch.id, req).unwrap();
    assert_eq!(info.private_data, b"from A");
    assert_eq!(info.peer.ip(), A);
    assert_eq!(info.local, addr);
    dev_b.cm_reject(s.ch.id, req, b"not now").unwrap();
    let ev = event(&mut c.ch);
    assert_eq!(
        (ev.kind, ev.handle),
        (EventKind::ConnectRejected, c.qp.num.0)
    );
    let qi = dev_a.cm_qp_info(c.ch.id, c.qp.num).unwrap();
    assert_eq!(qi.private_data, b"not now");
    assert_eq!(qi.peer, addr);
    assert_eq!(dev_a.qp_state(c.ch.id, c.qp.num).unwrap(), QpState::Error);
}

#[test]
fn remote_closed_port_is_rejected() {
    let dev_a = device(A);
    let mut c = end(&dev_a, 1);
    let gone = TcpListener::bind(SocketAddr::new(B, 0)).unwrap();
    let addr = gone.local_addr().unwrap();
    drop(gone);
    dev_a.cm_connect(c.ch.id, c.qp.num, addr, b"").unwrap();
    let ev = event(&mut c.ch);
    assert_eq!(
        (ev.kind, ev.handle),
        (EventKind::ConnectRejected, c.qp.num.0)
    );
}

#[test]
fn remote_silence_and_garbage_are_unreachable() {
    let dev_a = device_with(A, |c| c.connect_timeout = Duration::from_millis(300));
    for garbage in [None, Some(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n".to_vec())] {
        let l = TcpListener::bind(SocketAddr::new(B, 0)).unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(HANG)).unwrap();
            if let Some(g) = garbage {
                s.write_all(&g).unwrap();
            }
            // Until the initiator gives up and closes.
            let mut b = [0u8; 256];
            while matches!(s.read(&mut b), Ok(n) if n > 0) {}
        });
        let mut c = end(&dev_a, 1);
        dev_a.cm_connect(c.ch.id, c.qp.num, addr, b"").unwrap();
        let ev = event(&mut c.ch);
        assert_eq!(
            (ev.kind, ev.handle),
            (EventKind::ConnectUnreachable, c.qp.num.0)
        );
        assert_eq!(dev_a.qp_state(c.ch.id, c.qp.num).unwrap(), QpState::Error);
        t.join().unwrap();
    }
}

#[test]
fn abandoning_a_remote_connect_is_unreachable_and_closes_tcp() {
    let dev_a = device(A);
    let l = TcpListener::bind(SocketAddr::new(B, 0)).unwrap();
    let addr = l.local_addr().unwrap();
    let mut c = end(&dev_a, 1);
    dev_a.cm_connect(c.ch.id, c.qp.num, addr, b"").unwrap();
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(HANG)).unwrap();
    let _ = read_frame(&mut s);
    dev_a.cm_disconnect(c.ch.id, c.qp.num).unwrap();
    let ev = event(&mut c.ch);
    assert_eq!(ev.kind, EventKind::ConnectUnreachable);
    assert_eq!(s.read(&mut [0u8; 1]).unwrap_or(0), 0, "TCP closed");
}

fn mpa_request(crc: bool, pd: &[u8]) -> Vec<u8> {
    MpaRepr {
        kind: FrameKind::Request,
        markers: false,
        crc,
        reject: false,
        revision: 2,
        ird_ord: Some(IrdOrd {
            ird: 4,
            ord: 4,
            p2p: true,
            rtr_b: false,
            rtr_write: true,
            rtr_read: false,
        }),
        private_data: pd,
    }
    .to_vec()
    .unwrap()
}

fn read_frame(s: &mut TcpStream) -> Vec<u8> {
    let mut h = vec![0u8; 20];
    s.read_exact(&mut h).unwrap();
    let n = usize::from(u16::from_be_bytes([h[18], h[19]]));
    let mut rest = vec![0u8; n];
    s.read_exact(&mut rest).unwrap();
    h.extend_from_slice(&rest);
    h
}

#[test]
fn accepting_a_requester_that_left_init_pairs_nothing() {
    let dev = device(A);
    let mut s = end(&dev, 1);
    let mut c = end(&dev, 2);
    let (l, addr) = listen(&dev, &s.ch, A);
    dev.cm_connect(c.ch.id, c.qp.num, addr, b"").unwrap();
    let req = request(event(&mut s.ch), l);
    dev.modify_qp(c.ch.id, c.qp.num, QpState::Error).unwrap();
    assert!(matches!(
        dev.cm_accept(s.ch.id, req, s.qp.num, b""),
        Err(DeviceError::ConnectionRefused(..))
    ));
    assert_eq!(dev.qp_state(c.ch.id, c.qp.num).unwrap(), QpState::Error);
    assert_eq!(dev.qp_state(s.ch.id, s.qp.num).unwrap(), QpState::Init);
    no_event(&mut s.ch);
    assert!(c
        .ch
        .take_events()
        .iter()
        .all(|e| e.kind != EventKind::QpEstablished));
}

/// Accept between two devices: the MPA exchange carries the private data both ways (the CM
/// info of both QPs says so whatever the data path then does with the stream: with it the
/// QPs get `QpEstablished`, without it — the placeholder that refuses — `ConnectUnreachable`).
#[test]
fn remote_accept_exchanges_private_data_both_ways() {
    let dev_a = device(A);
    let dev_b = device(B);
    let mut s = end(&dev_b, 1);
    let mut c = end(&dev_a, 1);
    let (l, addr) = listen(&dev_b, &s.ch, B);
    dev_a.cm_connect(c.ch.id, c.qp.num, addr, b"ping").unwrap();
    let req = request(event(&mut s.ch), l);
    dev_b.cm_accept(s.ch.id, req, s.qp.num, b"pong").unwrap();
    for e in [&mut c, &mut s] {
        let ev = event(&mut e.ch);
        assert_eq!(ev.handle, e.qp.num.0);
        assert!(
            matches!(
                ev.kind,
                EventKind::QpEstablished | EventKind::ConnectUnreachable
            ),
            "{ev:?}"
        );
    }
    let ci = dev_a.cm_qp_info(c.ch.id, c.qp.num).unwrap();
    assert_eq!(ci.private_data, b"pong");
    assert_eq!(ci.peer, addr);
    assert_eq!(ci.local.ip(), A);
    assert_ne!(ci.local.port(), 0);
    let si = dev_b.cm_qp_info(s.ch.id, s.qp.num).unwrap();
    assert_eq!(si.private_data, b"ping");
    assert_eq!(si.peer, ci.local);
    assert_eq!(si.local, addr);
}

#[test]
fn closing_a_channel_abandons_its_remote_connects() {
    let dev_a = device(A);
    let l = TcpListener::bind(SocketAddr::new(B, 0)).unwrap();
    let addr = l.local_addr().unwrap();
    let c = end(&dev_a, 1);
    dev_a.cm_connect(c.ch.id, c.qp.num, addr, b"").unwrap();
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(HANG)).unwrap();
    let _ = read_frame(&mut s);
    dev_a.close_channel(c.ch.id);
    assert_eq!(s.read(&mut [0u8; 1]).unwrap_or(0), 0, "TCP closed");
}

#[test]
fn a_qp_the_cm_connects_cannot_also_be_paired_by_number() {
    let dev = device(A);
    let s = end(&dev, 1);
    let c = end(&dev, 2);
    let (_, addr) = listen(&dev, &s.ch, A);
    dev.cm_connect(c.ch.id, c.qp.num, addr, b"").unwrap();
    assert!(matches!(
        dev.connect_qp(c.ch.id, c.qp.num, s.qp.num),
        Err(DeviceError::ConnectionRefused(..))
    ));
}

#[test]
fn disconnecting_a_half_paired_qp_fails_it_and_flushes_its_receives() {
    // connect_qp named a peer that has not named this QP back (the pairing waits in Rtr): a
    // Disconnect now (a program's move to ERR right after RTR) abandons the pairing. The QP
    // goes to Error and its receives flush; the peer's late connect_qp pairs with nothing.
    let dev = device(A);
    let mut ch = TestChannel::open(&dev, 1, ChannelMode::Bypass);
    let mut cq = ch.cq(&dev, 6);
    let mut qp = ch.qp(&dev, &cq, &cq, 4);
    let mr = ch.mr(&dev, 4096, access::ALL);
    let b = end(&dev, 2);
    dev.connect_qp(ch.id, qp.num, b.qp.num).unwrap();
    assert_eq!(dev.qp_state(ch.id, qp.num).unwrap(), QpState::Rtr);
    for id in 0..3u64 {
        qp.post_recv(&dev, 100 + id, &[mr.sge(64 * id, 64)]);
    }
    dev.cm_disconnect(ch.id, qp.num)
        .expect("a half-paired QP can be disconnected");
    assert_eq!(dev.qp_state(ch.id, qp.num).unwrap(), QpState::Error);
    for id in 0..3u64 {
        let c = cq.wait(&dev);
        assert_eq!(
            (c.wr_id, c.status),
            (100 + id, CqeStatus::WrFlushError),
            "{c:?}"
        );
    }
    dev.connect_qp(b.ch.id, b.qp.num, qp.num).unwrap();
    assert_eq!(
        dev.qp_state(b.ch.id, b.qp.num).unwrap(),
        QpState::Rtr,
        "paired with a failed QP"
    );
}
