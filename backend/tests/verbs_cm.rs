//! The verbs device's connection manager (rdma_cm on librdmacm) on a real RDMA device of the
//! host running the tests: two channels' QPs connect through rdma_cm on the device's own
//! address (request and reply private data, the HCA's QP numbers in the events) and move
//! SEND, RDMA WRITE and RDMA READ with the data checked, then disconnect; a connect to a port
//! nobody listens on, and a rejected one, fail with the event the software device gives; a
//! peer the backend configuration does not allow for a domain is refused, both ways.
//!
//! As `verbs_device.rs`: on a host without an RDMA device they print `NOT RUN` and pass.
//! `VRDMA_TEST_IBDEV=<ibdev>[:<port>]` picks the device (default: the first one, port 1).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shared_ring::abi::control::QpState;
use shared_ring::abi::cqe::CqeStatus;
use shared_ring::abi::event::{EventKind, EventRepr};
use shared_ring::abi::wqe::WqeOpcode;
use verbs_common::{send_write_read, Side};
use vrdma_backend::config::Config;
use vrdma_backend::control::policy::CmPolicy;
use vrdma_backend::device::testkit::{wqe, TestChannel, TestCq, TestQp, HANG};
use vrdma_backend::device::verbs::VerbsDevice;
use vrdma_backend::device::{
    ChannelMode, CmConfig, ConnRequestId, Device, DeviceError, ListenerId,
};

mod verbs_common;

fn device_with(config: CmConfig) -> Option<VerbsDevice> {
    let (dev, name) = verbs_common::open_device()?;
    let dev = dev
        .with_cm(config)
        .unwrap_or_else(|e| panic!("rdma_cm on {name}: {e}"));
    assert!(
        !dev.local_addrs().is_empty(),
        "{name} has an IP address (its netdev's, in its GID table)"
    );
    Some(dev)
}

/// `VRDMA_TEST_CM_ADDR`: the device's address when its GIDs are not IP addresses (iWARP:
/// siw's GID is its netdev's MAC).
fn test_addrs() -> Vec<std::net::IpAddr> {
    match std::env::var("VRDMA_TEST_CM_ADDR") {
        Ok(a) if !a.is_empty() => vec![a.parse().expect("VRDMA_TEST_CM_ADDR is an IP address")],
        _ => Vec::new(),
    }
}

fn device() -> Option<VerbsDevice> {
    device_with(CmConfig {
        addrs: test_addrs(),
        connect_timeout: Duration::from_secs(10),
        ..CmConfig::default()
    })
}

struct End {
    ch: TestChannel,
    cq: TestCq,
    qp: TestQp,
}

impl End {
    fn side(&mut self) -> Side<'_> {
        Side {
            ch: &mut self.ch,
            cq: &mut self.cq,
            qp: &mut self.qp,
        }
    }
}

fn end(dev: &VerbsDevice, dom: u16) -> End {
    let mut ch = TestChannel::open(dev, dom, ChannelMode::Bypass);
    let cq = ch.cq(dev, 6);
    let qp = ch.qp(dev, &cq, &cq, 4);
    End { ch, cq, qp }
}

fn event(ch: &mut TestChannel) -> EventRepr {
    let t0 = Instant::now();
    loop {
        if let Some(e) = ch.take_events().into_iter().next() {
            return e;
        }
        assert!(t0.elapsed() < HANG, "no event");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn listen(dev: &VerbsDevice, ch: &TestChannel) -> (ListenerId, SocketAddr) {
    let ip = dev.local_addrs()[0];
    let l = dev
        .cm_listen(ch.id, SocketAddr::new(ip, 0), 8)
        .expect("listen");
    let a = dev.cm_listener_addr(ch.id, l).expect("listener addr");
    assert_eq!(a.ip(), ip);
    assert_ne!(a.port(), 0, "rdma_cm chose a port");
    (l, a)
}

fn request(ev: EventRepr, l: ListenerId) -> ConnRequestId {
    assert_eq!(ev.kind, EventKind::ConnectRequest, "{ev:?}");
    assert_eq!(ev.handle, l.0);
    ConnRequestId(u32::try_from(ev.detail).expect("request id"))
}

/// IB CM hands over the whole private-data field: the sender's bytes, then zeros.
fn assert_private(got: &[u8], sent: &[u8]) {
    assert!(got.len() >= sent.len(), "{got:?}");
    assert_eq!(&got[..sent.len()], sent);
    assert!(got[sent.len()..].iter().all(|&b| b == 0), "{got:?}");
}

#[test]
fn two_guests_connect_through_rdma_cm_and_send_write_read() {
    let Some(dev) = device() else { return };
    let mut s = end(&dev, 1);
    let mut c = end(&dev, 2);
    let (l, addr) = listen(&dev, &s.ch);
    dev.cm_connect(c.ch.id, c.qp.num, addr, b"request")
        .expect("connect");
    let req = request(event(&mut s.ch), l);
    let info = dev.cm_request_info(s.ch.id, req).expect("request info");
    assert_private(&info.private_data, b"request");
    assert_eq!(info.local, addr);
    assert_eq!(info.peer.ip(), addr.ip());
    // Another channel cannot answer it.
    assert!(matches!(
        dev.cm_accept(c.ch.id, req, c.qp.num, b""),
        Err(DeviceError::BadHandle { .. })
    ));
    dev.cm_accept(s.ch.id, req, s.qp.num, b"reply")
        .expect("accept");
    // IB CM carries QP numbers (the peer's real one is the detail); iWARP's MPA does not (0).
    let iwarp = dev.cm_private_data_limits().expect("limits").0 == 255;
    let (sn, cn) = (s.qp.num, c.qp.num);
    for (e, peer) in [(&mut s, cn), (&mut c, sn)] {
        let ev = event(&mut e.ch);
        assert_eq!(ev.kind, EventKind::QpEstablished, "{ev:?}");
        assert_eq!(ev.handle, e.qp.num.0);
        let want = if iwarp { 0 } else { u64::from(peer.0) };
        assert_eq!(ev.detail, want, "the peer's HCA QP number");
        assert_eq!(dev.qp_state(e.ch.id, e.qp.num).unwrap(), QpState::Rts);
    }
    assert_private(
        &dev.cm_qp_info(c.ch.id, c.qp.num).unwrap().private_data,
        b"reply",
    );
    assert_private(
        &dev.cm_qp_info(s.ch.id, s.qp.num).unwrap().private_data,
        b"request",
    );
    assert!(dev.cm_request_info(s.ch.id, req).is_err(), "answered");

    // SEND, RDMA WRITE and RDMA READ from c, then the accepting side as initiator: s
    // WRITEs into c.
    let (mc, ms) = send_write_read(&dev, c.side(), s.side());
    ms.fill(6000, b"from the acceptor");
    s.qp.post_send(
        &dev,
        &wqe(
            WqeOpcode::RdmaWrite,
            4,
            &[ms.sge(6000, 17)],
            (mc.iova + 7000, mc.keys.rkey),
            0,
        ),
    );
    let x = s.cq.wait(&dev);
    assert_eq!((x.wr_id, x.status), (4, CqeStatus::Success));
    assert_eq!(mc.read(7000, 17), b"from the acceptor");

    // Disconnect: both ends hear it, both QPs are in Error.
    dev.cm_disconnect(c.ch.id, c.qp.num).expect("disconnect");
    for e in [&mut s, &mut c] {
        let ev = event(&mut e.ch);
        assert_eq!(ev.kind, EventKind::QpDisconnected, "{ev:?}");
        assert_eq!(ev.handle, e.qp.num.0);
        assert_eq!(dev.qp_state(e.ch.id, e.qp.num).unwrap(), QpState::Error);
    }
    dev.cm_close_listener(s.ch.id, l).expect("close listener");
}

#[test]
fn a_connect_nobody_listens_for_or_rejected_fails_with_an_event() {
    let Some(dev) = device() else { return };
    let mut s = end(&dev, 1);
    let mut c = end(&dev, 2);
    // A port nobody listens on any more.
    let (l, addr) = listen(&dev, &s.ch);
    dev.cm_close_listener(s.ch.id, l).expect("close");
    dev.cm_connect(c.ch.id, c.qp.num, addr, b"anyone?")
        .expect("connect");
    let ev = event(&mut c.ch);
    assert!(
        matches!(
            ev.kind,
            EventKind::ConnectRejected | EventKind::ConnectUnreachable
        ),
        "{ev:?}"
    );
    assert_eq!(ev.handle, c.qp.num.0);
    assert_eq!(dev.qp_state(c.ch.id, c.qp.num).unwrap(), QpState::Error);
    assert!(s.ch.take_events().is_empty());
    // A listener that rejects, with private data.
    let mut c2 = end(&dev, 2);
    let (l, addr) = listen(&dev, &s.ch);
    dev.cm_connect(c2.ch.id, c2.qp.num, addr, b"let me in")
        .expect("connect");
    let req = request(event(&mut s.ch), l);
    dev.cm_reject(s.ch.id, req, b"no").expect("reject");
    let ev = event(&mut c2.ch);
    assert_eq!(
        (ev.kind, ev.handle),
        (EventKind::ConnectRejected, c2.qp.num.0)
    );
    assert_private(
        &dev.cm_qp_info(c2.ch.id, c2.qp.num).unwrap().private_data,
        b"no",
    );
    assert_eq!(dev.qp_state(c2.ch.id, c2.qp.num).unwrap(), QpState::Error);
    // Too much private data for a request (IB CM: 56 bytes; iWARP: 255): refused at once, the
    // QP untouched; a QP with no connection has nothing to disconnect.
    let c3 = end(&dev, 2);
    assert!(matches!(
        dev.cm_disconnect(c3.ch.id, c3.qp.num),
        Err(DeviceError::InvalidArgument(_))
    ));
    let (max_req, _, _) = dev.cm_private_data_limits().expect("limits");
    assert!(max_req == 56 || max_req == 255, "IB CM's or iWARP's");
    let too_long = max_req + 1;
    assert!(matches!(
        dev.cm_connect(c3.ch.id, c3.qp.num, addr, &vec![1; too_long]),
        Err(DeviceError::InvalidArgument(_))
    ));
    assert_eq!(dev.qp_state(c3.ch.id, c3.qp.num).unwrap(), QpState::Init);
}

#[test]
fn a_peer_the_configuration_does_not_allow_is_refused_both_ways() {
    // Domain 7 may talk to 192.0.2.0/24 only ([cm.domain.7] allowed-peers): not to the
    // device's own address, which the other domains may reach. The device's filter is the
    // daemon's, built from the same policy (`Config::cm_device_config`).
    let config = Config::parse(
        "[cm.domain.7]\nallowed-peers = [\"192.0.2.0/24\"]\n",
        "verbs_cm test",
    )
    .expect("config");
    let policy = Arc::new(CmPolicy::new(config.cm.clone()));
    let mut cm = config.cm_device_config(test_addrs(), policy);
    cm.connect_timeout = Duration::from_secs(10);
    let Some(dev) = device_with(cm) else { return };
    // Connecting from domain 7: refused at once, the QP stays as it was.
    let mut s = end(&dev, 1);
    let (l, addr) = listen(&dev, &s.ch);
    let mut c7 = end(&dev, 7);
    assert!(matches!(
        dev.cm_connect(c7.ch.id, c7.qp.num, addr, b""),
        Err(DeviceError::ConnectionRefused(..))
    ));
    assert_eq!(dev.qp_state(c7.ch.id, c7.qp.num).unwrap(), QpState::Init);
    assert!(c7.ch.take_events().is_empty());
    assert!(
        s.ch.take_events().is_empty(),
        "no request reached the listener"
    );
    dev.cm_close_listener(s.ch.id, l).unwrap();
    // Domain 7 listening: a request from the device's address never reaches it; the
    // requester is rejected.
    let (l7, addr7) = listen(&dev, &c7.ch);
    let mut c = end(&dev, 2);
    dev.cm_connect(c.ch.id, c.qp.num, addr7, b"hi")
        .expect("connect");
    let ev = event(&mut c.ch);
    assert_eq!(
        (ev.kind, ev.handle),
        (EventKind::ConnectRejected, c.qp.num.0)
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        c7.ch.take_events().is_empty(),
        "no ConnectRequest at domain 7"
    );
    dev.cm_close_listener(c7.ch.id, l7).unwrap();
    // Domain 2 to domain 1 still connects.
    let mut s = end(&dev, 1);
    let mut c = end(&dev, 2);
    let (l, addr) = listen(&dev, &s.ch);
    dev.cm_connect(c.ch.id, c.qp.num, addr, b"")
        .expect("connect");
    let req = request(event(&mut s.ch), l);
    dev.cm_accept(s.ch.id, req, s.qp.num, b"").expect("accept");
    assert_eq!(event(&mut s.ch).kind, EventKind::QpEstablished);
    assert_eq!(event(&mut c.ch).kind, EventKind::QpEstablished);
}
