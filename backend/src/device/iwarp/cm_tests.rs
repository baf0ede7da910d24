//! The MPA handshake of the connection-manager thread, between two engines on 127.0.0.2 and
//! 127.0.0.3 and against raw-socket peers (one that behaves as Linux siw does: CRC off,
//! enhanced, peer-to-peer with a zero-length RDMA Write RTR).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iwarp_proto::mpa::{FrameKind, IrdOrd, MpaRepr, HEADER_LEN};

use super::cm::{CmSink, Cmd, CrcPolicy, MpaPolicy, TcpCm, Upcall};
use super::{Role, Rtr};

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
const WAIT: Duration = Duration::from_secs(10);

struct Collect(Mutex<Sender<Upcall>>);

impl CmSink for Collect {
    fn upcall(&self, u: Upcall) {
        let _ = self.0.lock().unwrap().send(u);
    }
}

fn policy(crc: CrcPolicy) -> MpaPolicy {
    MpaPolicy {
        crc,
        max_ird: 8,
        max_ord: 4,
        timeout: Duration::from_secs(5),
        peer_probe: super::qp::DEFAULT_PEER_PROBE,
    }
}

fn engine(p: MpaPolicy) -> (TcpCm, Receiver<Upcall>) {
    let (tx, rx) = channel();
    let cm = TcpCm::start(p, Arc::new(Collect(Mutex::new(tx)))).expect("cm thread");
    (cm, rx)
}

fn listen(cm: &TcpCm, ip: IpAddr, id: u32) -> SocketAddr {
    let l = TcpListener::bind(SocketAddr::new(ip, 0)).expect("bind");
    l.set_nonblocking(true).unwrap();
    let a = l.local_addr().unwrap();
    cm.send(Cmd::Listen {
        id,
        sockets: vec![l],
    });
    a
}

fn next(rx: &Receiver<Upcall>) -> Upcall {
    rx.recv_timeout(WAIT).expect("an upcall in time")
}

/// B's `[cm] peer-probe-s` in [`handshake`] (A has the default).
const B_PEER_PROBE: Duration = Duration::from_secs(42);

/// Engine A connects to engine B's listener with private data; B accepts with its own.
fn handshake(ia: CrcPolicy, ib: CrcPolicy, accept: bool) -> (Upcall, Upcall) {
    let (a, arx) = engine(policy(ia));
    let (b, brx) = engine(MpaPolicy {
        max_ird: 2,
        max_ord: 16,
        peer_probe: B_PEER_PROBE,
        ..policy(ib)
    });
    let addr = listen(&b, B, 7);
    a.send(Cmd::Connect {
        conn: 100,
        src: A,
        peer: addr,
        private_data: b"hello".to_vec(),
    });
    let Upcall::Request {
        listener,
        conn,
        info,
    } = next(&brx)
    else {
        panic!("B did not get a request");
    };
    assert_eq!(listener, 7);
    assert_eq!(info.private_data, b"hello");
    assert_eq!(info.peer.ip(), A);
    assert_eq!(info.local, addr);
    assert_eq!((info.ird, info.ord), (8, 4), "A's IRD/ORD in the request");
    if accept {
        b.send(Cmd::Accept {
            conn,
            private_data: b"world".to_vec(),
        });
        (next(&arx), next(&brx))
    } else {
        b.send(Cmd::Reject {
            conn,
            private_data: b"go away".to_vec(),
        });
        (next(&arx), Upcall::Failed { conn: 0, why: "" })
    }
}

#[test]
fn vrdma_to_vrdma_handshake_carries_private_data_both_ways() {
    let (ua, ub) = handshake(CrcPolicy::Offer, CrcPolicy::Offer, true);
    let Upcall::Established { conn, est: mut ea } = ua else {
        panic!("A: {ua:?}");
    };
    assert_eq!(conn, 100);
    let Upcall::Established { est: mut eb, .. } = ub else {
        panic!("B: {ub:?}");
    };
    assert_eq!(ea.role, Role::Initiator);
    assert_eq!(eb.role, Role::Responder);
    assert_eq!(ea.peer_private, b"world");
    assert_eq!(eb.peer_private, b"hello");
    assert!(ea.crc && eb.crc);
    assert_eq!((ea.rtr, eb.rtr), (Rtr::Write, Rtr::Write));
    // B accepts 2 reads (its IRD, capped from A's ORD 4) and issues at most A's IRD 8.
    assert_eq!((eb.ird, eb.ord), (2, 8));
    assert_eq!((ea.ird, ea.ord), (8, 2));
    assert_eq!(ea.local, eb.peer);
    assert_eq!(ea.peer, eb.local);
    assert_eq!(ea.local.ip(), A, "A connects from its device address");
    // Each end hands its own peer-probe setting to the data path.
    assert_eq!(
        (ea.peer_probe, eb.peer_probe),
        (super::qp::DEFAULT_PEER_PROBE, B_PEER_PROBE)
    );
    // The streams are in Full Operation, nothing read past the frames, blocking.
    ea.stream.write_all(b"fpdu").unwrap();
    eb.stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut got = [0u8; 4];
    eb.stream.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"fpdu");
}

#[test]
fn crc_is_what_the_reply_says() {
    use CrcPolicy::*;
    // (initiator, responder) -> CRC in use.
    for (ia, ib, want) in [
        (Offer, Offer, true),
        (Decline, Offer, false),
        (Offer, Decline, true),
        (Decline, Require, true),
        (Decline, Decline, false),
        (Require, Decline, true),
    ] {
        let (ua, ub) = handshake(ia, ib, true);
        match (ua, ub) {
            (Upcall::Established { est: ea, .. }, Upcall::Established { est: eb, .. }) => {
                assert_eq!((ea.crc, eb.crc), (want, want), "{ia:?} -> {ib:?}");
            }
            (ua, ub) => panic!("{ia:?} -> {ib:?}: {ua:?} / {ub:?}"),
        }
    }
}

#[test]
fn reject_carries_private_data() {
    let (ua, _) = handshake(CrcPolicy::Offer, CrcPolicy::Offer, false);
    match ua {
        Upcall::Rejected { conn, private_data } => {
            assert_eq!(conn, 100);
            assert_eq!(private_data, b"go away");
        }
        u => panic!("{u:?}"),
    }
}

#[test]
fn closed_port_is_rejected() {
    let (a, arx) = engine(policy(CrcPolicy::Offer));
    let gone = TcpListener::bind(SocketAddr::new(B, 0)).unwrap();
    let addr = gone.local_addr().unwrap();
    drop(gone);
    a.send(Cmd::Connect {
        conn: 1,
        src: A,
        peer: addr,
        private_data: vec![],
    });
    match next(&arx) {
        Upcall::Rejected { conn, private_data } => {
            assert_eq!(conn, 1);
            assert!(private_data.is_empty());
        }
        u => panic!("{u:?}"),
    }
}

/// A raw responder: accepts one connection, reads the request, runs `answer` on it.
fn raw_responder(
    answer: impl FnOnce(&mut TcpStream, Vec<u8>) + Send + 'static,
) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind(SocketAddr::new(B, 0)).unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        let frame = read_frame(&mut s);
        answer(&mut s, frame);
    });
    (addr, t)
}

fn read_frame(s: &mut TcpStream) -> Vec<u8> {
    let mut h = vec![0u8; HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let pd = usize::from(u16::from_be_bytes([h[18], h[19]]));
    let mut rest = vec![0u8; pd];
    s.read_exact(&mut rest).unwrap();
    h.extend_from_slice(&rest);
    h
}

fn connect_to(a: &TcpCm, addr: SocketAddr) {
    a.send(Cmd::Connect {
        conn: 5,
        src: A,
        peer: addr,
        private_data: b"pd".to_vec(),
    });
}

#[test]
fn a_peer_that_never_answers_times_out() {
    let (a, arx) = engine(MpaPolicy {
        timeout: Duration::from_millis(300),
        ..policy(CrcPolicy::Offer)
    });
    let (tx, rx) = channel::<()>();
    let (addr, t) = raw_responder(move |_, _| {
        // Keep the connection open, answer nothing, until the test is done.
        let _ = rx.recv_timeout(WAIT);
    });
    connect_to(&a, addr);
    match next(&arx) {
        Upcall::Failed { conn, why } => assert_eq!((conn, why), (5, "timeout")),
        u => panic!("{u:?}"),
    }
    tx.send(()).unwrap();
    t.join().unwrap();
}

#[test]
fn garbage_and_policy_breaking_replies_fail_the_connect() {
    let bad_replies: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec()),
        ("request key", {
            let mut f = siw_reply(false, 0);
            f[..16].copy_from_slice(b"MPA ID Req Frame");
            f
        }),
        ("markers", {
            let mut f = siw_reply(false, 0);
            f[16] |= 0x80;
            f
        }),
        ("not enhanced", {
            MpaRepr {
                kind: FrameKind::Reply,
                markers: false,
                crc: true,
                reject: false,
                revision: 1,
                ird_ord: None,
                private_data: b"",
            }
            .to_vec()
            .unwrap()
        }),
        ("two RTRs", {
            let mut f = siw_reply(true, 0);
            f[22] |= 0x40;
            f
        }),
    ];
    for (what, reply) in bad_replies {
        let (a, arx) = engine(policy(CrcPolicy::Offer));
        let (addr, t) = raw_responder(move |s, _| {
            s.write_all(&reply).unwrap();
            let mut b = [0u8; 1];
            let _ = s.read(&mut b); // until A closes
        });
        connect_to(&a, addr);
        match next(&arx) {
            Upcall::Failed { conn: 5, .. } => {}
            u => panic!("{what}: {u:?}"),
        }
        t.join().unwrap();
    }
}

#[test]
fn require_refuses_a_peer_that_declines_crc() {
    let (a, arx) = engine(policy(CrcPolicy::Require));
    let (addr, t) = raw_responder(|s, _| {
        s.write_all(&siw_reply(false, 0)).unwrap();
        let _ = s.read(&mut [0u8; 1]);
    });
    connect_to(&a, addr);
    match next(&arx) {
        Upcall::Failed { why, .. } => assert_eq!(why, "the peer declines CRC"),
        u => panic!("{u:?}"),
    }
    t.join().unwrap();
}

/// A reply as siw sends it to a peer-to-peer request: the request's bits with the reply key,
/// enhanced, IRD/ORD word with A and the Write RTR chosen.
fn siw_reply(crc: bool, ird: u16) -> Vec<u8> {
    MpaRepr {
        kind: FrameKind::Reply,
        markers: false,
        crc,
        reject: false,
        revision: 2,
        ird_ord: Some(IrdOrd {
            ird,
            ord: 1,
            p2p: true,
            rtr_b: false,
            rtr_write: true,
            rtr_read: false,
        }),
        private_data: b"siw",
    }
    .to_vec()
    .unwrap()
}

#[test]
fn connects_to_a_siw_like_responder() {
    let (a, arx) = engine(policy(CrcPolicy::Offer));
    let (addr, t) = raw_responder(|s, req| {
        // What vrdma asks: revision 2, enhanced, CRC offered, peer-to-peer, both RTRs.
        assert_eq!(&req[..16], b"MPA ID Req Frame");
        assert_eq!(req[16], 0x40 | 0x10, "C | S, no M");
        assert_eq!(req[17], 2);
        assert_eq!(&req[18..20], &[0, 6]);
        assert_eq!(&req[20..24], &[0x80, 8, 0xC0, 4], "A+IRD 8, C+D+ORD 4");
        assert_eq!(&req[24..], b"pd");
        // siw honours C=1 (RFC 5044: MUST) and picks the Write RTR.
        s.write_all(&siw_reply(true, 4)).unwrap();
        // Then siw waits for the RTR: a zero-length RDMA Write FPDU from the initiator.
        let _ = s.read(&mut [0u8; 1]);
    });
    connect_to(&a, addr);
    match next(&arx) {
        Upcall::Established { est, .. } => {
            assert!(est.crc);
            assert_eq!(est.rtr, Rtr::Write);
            assert_eq!(est.role, Role::Initiator);
            assert_eq!(est.peer_private, b"siw");
            assert_eq!((est.ird, est.ord), (1, 4));
        }
        u => panic!("{u:?}"),
    }
    t.join().unwrap();
}

/// siw as initiator with its defaults: CRC off, revision 2 enhanced, peer-to-peer with the
/// Write RTR, then the RTR FPDU right after the reply.
#[test]
fn accepts_a_siw_like_initiator() {
    let (b, brx) = engine(policy(CrcPolicy::Offer));
    let addr = listen(&b, B, 3);
    let req = MpaRepr {
        kind: FrameKind::Request,
        markers: false,
        crc: false,
        reject: false,
        revision: 2,
        ird_ord: Some(IrdOrd {
            ird: 32,
            ord: 2,
            p2p: true,
            rtr_b: false,
            rtr_write: true,
            rtr_read: false,
        }),
        private_data: b"rping",
    }
    .to_vec()
    .unwrap();
    let mut s = TcpStream::connect_timeout(&addr, WAIT).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(&req).unwrap();
    let Upcall::Request { conn, info, .. } = next(&brx) else {
        panic!("no request");
    };
    assert_eq!(info.private_data, b"rping");
    assert_eq!((info.ird, info.ord), (32, 2));
    b.send(Cmd::Accept {
        conn,
        private_data: b"ok".to_vec(),
    });
    let rep = read_frame(&mut s);
    let r = MpaRepr::from_bytes(&rep).unwrap();
    assert_eq!(r.kind, FrameKind::Reply);
    assert!(!r.crc && !r.markers && !r.reject, "CRC off as siw asked");
    assert_eq!(r.revision, 2);
    let w = r.ird_ord.expect("enhanced reply");
    assert!(w.p2p && w.rtr_write && !w.rtr_read && !w.rtr_b);
    // IRD covers siw's ORD 2 (siw checks it), ORD within siw's IRD 32 and our max 4.
    assert_eq!((w.ird, w.ord), (2, 4));
    assert_eq!(r.private_data, b"ok");
    // The RTR: a zero-length RDMA Write FPDU (MPA length 14, DDP tagged+last, RDMAP v1
    // Write, STag 0, TO 0, pad 0, no CRC) sent right after the reply reaches the data path.
    let rtr: [u8; 16] = [0, 14, 0xC1, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    s.write_all(&rtr).unwrap();
    match next(&brx) {
        Upcall::Established { mut est, .. } => {
            assert!(!est.crc);
            assert_eq!(est.rtr, Rtr::Write);
            assert_eq!(est.role, Role::Responder);
            assert_eq!(est.peer_private, b"rping");
            est.stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut got = [0u8; 16];
            est.stream.read_exact(&mut got).unwrap();
            assert_eq!(
                got, rtr,
                "nothing of the first FPDU was eaten by the handshake"
            );
        }
        u => panic!("{u:?}"),
    }
}

#[test]
fn markers_are_refused_with_a_reject() {
    let (b, brx) = engine(policy(CrcPolicy::Offer));
    let addr = listen(&b, B, 3);
    let mut req = siw_reply(false, 1);
    req[..16].copy_from_slice(b"MPA ID Req Frame");
    req[16] |= 0x80;
    let mut s = TcpStream::connect_timeout(&addr, WAIT).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(&req).unwrap();
    let r = read_frame(&mut s);
    let r = MpaRepr::from_bytes(&r).unwrap();
    assert!(r.reject, "R set");
    assert!(!r.markers, "M cleared");
    // Then the connection closes, and the device never heard of it.
    assert_eq!(s.read(&mut [0u8; 1]).unwrap(), 0);
    assert!(brx.recv_timeout(Duration::from_millis(200)).is_err());
}

#[test]
fn a_garbage_request_is_dropped() {
    let (b, brx) = engine(policy(CrcPolicy::Offer));
    let addr = listen(&b, B, 3);
    let mut s = TcpStream::connect_timeout(&addr, WAIT).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = [0u8; 64];
    // Closed without an answer (or reset).
    assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)));
    assert!(brx.recv_timeout(Duration::from_millis(200)).is_err());
}
