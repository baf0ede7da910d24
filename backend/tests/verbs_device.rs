//! The verbs device on a real RDMA device of the host running the tests, driven through the
//! same test frontend as the software device (`device::testkit`): two guests' QPs connected
//! as a loopback pair on the HCA, SEND/RECV, RDMA WRITE and READ with the data checked, a
//! foreign lkey refused, resources released on close.
//!
//! These tests need an RDMA device (`rxe0` in the lab's dom0: docs/operations.md). On a host
//! without one they print `NOT RUN` and why, and pass: there is nothing to test them on.
//! `VRDMA_TEST_IBDEV=<ibdev>[:<port>]` picks the device (default: the first one the kernel
//! lists, port 1).

use shared_ring::abi::control::QpState;
use shared_ring::abi::cqe::CqeStatus;
use shared_ring::abi::wqe::{WqeData, WqeOpcode};
use verbs_common::Side;
use vrdma_backend::device::testkit::{wqe, TestChannel, TestPair};
use vrdma_backend::device::verbs::VerbsDevice;
use vrdma_backend::device::{access, ChannelMode, Device, DomId, EngineConfig};

mod verbs_common;

fn device() -> Option<VerbsDevice> {
    verbs_common::open_device().map(|(dev, _)| dev)
}

fn send_write_read(mode: ChannelMode) {
    let Some(dev) = device() else { return };
    let mut p = TestPair::connected(&dev, (1, 2), mode);
    let a = Side {
        ch: &mut p.a,
        cq: &mut p.acq,
        qp: &mut p.aqp,
    };
    let b = Side {
        ch: &mut p.b,
        cq: &mut p.bcq,
        qp: &mut p.bqp,
    };
    let (_ma, mb) = verbs_common::send_write_read(&dev, a, b);
    // Zero-copy: the HCA moved all of that between the two guests' pages; the backend copied
    // nothing (its copy counter is what the lab's `rxe` scenario asserts on).
    for (ch, dom) in [(p.a.id, 1), (p.b.id, 2)] {
        assert_eq!(dev.stats(ch).copied_bytes, 0);
        assert_eq!(dev.domain_stats(DomId(dom)).copied_bytes, 0);
    }
    // An inline SEND is the one copy: its bytes come out of the guest's WQE.
    p.bqp.post_recv(&dev, 78, &[mb.sge(0, 64)]);
    let mut w = wqe(WqeOpcode::Send, 4, &[], (0, 0), 0);
    w.data = WqeData::inline(b"twenty inline bytes!").expect("fits inline");
    p.aqp.post_send(&dev, &w);
    assert_eq!(p.acq.wait(&dev).status, CqeStatus::Success);
    let c = p.bcq.wait(&dev);
    assert_eq!(
        (c.wr_id, c.status, c.byte_len),
        (78, CqeStatus::Success, 20)
    );
    assert_eq!(mb.read(0, 20), b"twenty inline bytes!");
    assert_eq!(dev.stats(p.a.id).copied_bytes, 20);
    assert_eq!(dev.domain_stats(DomId(1)).copied_bytes, 20);
    assert_eq!(dev.stats(p.b.id).copied_bytes, 0);
}

#[test]
fn send_write_read_between_two_guests_bypass() {
    send_write_read(ChannelMode::Bypass);
}

#[test]
fn send_write_read_between_two_guests_mediated() {
    send_write_read(ChannelMode::Mediated);
}

#[test]
fn a_foreign_lkey_is_refused_and_the_qp_flushes() {
    let Some(dev) = device() else { return };
    let mut p = TestPair::connected(&dev, (1, 2), ChannelMode::Bypass);
    let ma = p.a.mr(&dev, 4096, access::ALL);
    let mb = p.b.mr(&dev, 4096, access::ALL);
    // b's lkey used on a's QP: refused before the HCA sees it.
    let foreign = mb.sge(0, 8);
    p.aqp
        .post_send(&dev, &wqe(WqeOpcode::Send, 9, &[foreign], (0, 0), 0));
    let c = p.acq.wait(&dev);
    assert_eq!((c.wr_id, c.status), (9, CqeStatus::LocalProtectionError));
    p.aqp
        .post_send(&dev, &wqe(WqeOpcode::Send, 10, &[ma.sge(0, 8)], (0, 0), 0));
    let c = p.acq.wait(&dev);
    assert_eq!((c.wr_id, c.status), (10, CqeStatus::WrFlushError));
}

#[test]
fn closing_channels_releases_everything() {
    let Some(dev) = device() else { return };
    let mut a = TestChannel::open(&dev, 3, ChannelMode::Bypass);
    let cq = a.cq(&dev, 4);
    let _qp = a.qp(&dev, &cq, &cq, 4);
    let _mr = a.mr(&dev, 16384, access::ALL);
    let s = dev.stats(a.id);
    assert_eq!((s.pds, s.mrs, s.cqs, s.qps), (1, 1, 1, 1));
    dev.close_channel(a.id);
    let d = dev.domain_stats(vrdma_backend::device::DomId(3));
    assert_eq!((d.channels, d.pds, d.mrs, d.cqs, d.qps), (0, 0, 0, 0, 0));
}

#[test]
fn qps_connect_by_address_vector_and_send() {
    let Some(dev) = device() else { return };
    let mut a = TestChannel::open(&dev, 4, ChannelMode::Bypass);
    let mut b = TestChannel::open(&dev, 5, ChannelMode::Bypass);
    let (mut acq, mut bcq) = (a.cq(&dev, 6), b.cq(&dev, 6));
    let mut aqp = a.qp(&dev, &acq, &acq, 4);
    let mut bqp = b.qp(&dev, &bcq, &bcq, 4);
    let me = dev.local_av().expect("a verbs device has an address");
    let av = |qpn: u32, psn: u32| vrdma_backend::device::RemoteAv {
        gid: me.gid,
        lid: me.lid,
        qpn,
        psn,
        mtu: 0,
    };
    // a in two steps (RTR, then RTS), as ibv_modify_qp; b in one.
    dev.connect_qp_av(a.id, aqp.num, av(bqp.num.0, 0x222), None)
        .expect("a → b: RTR");
    assert_eq!(dev.qp_state(a.id, aqp.num).unwrap(), QpState::Rtr);
    dev.connect_qp_av(a.id, aqp.num, av(bqp.num.0, 0x222), Some(0x111))
        .expect("a → b: RTS");
    dev.connect_qp_av(b.id, bqp.num, av(aqp.num.0, 0x111), Some(0x222))
        .expect("b → a");
    // Repeating a step towards the same peer is no error; another peer is refused.
    dev.connect_qp_av(a.id, aqp.num, av(bqp.num.0, 0x222), None)
        .expect("a late RTR");
    assert!(dev
        .connect_qp_av(a.id, aqp.num, av(bqp.num.0 ^ 1, 0x222), Some(0x111))
        .is_err());
    let ma = a.mr(&dev, 4096, access::ALL);
    let mb = b.mr(&dev, 4096, access::ALL);
    ma.fill(0, b"by address vector");
    bqp.post_recv(&dev, 5, &[mb.sge(0, 64)]);
    aqp.post_send(&dev, &wqe(WqeOpcode::Send, 6, &[ma.sge(0, 17)], (0, 0), 0));
    assert_eq!(acq.wait(&dev).status, CqeStatus::Success);
    let c = bcq.wait(&dev);
    assert_eq!((c.wr_id, c.status, c.byte_len), (5, CqeStatus::Success, 17));
    assert_eq!(mb.read(0, 17), b"by address vector");
}

#[test]
fn the_software_device_has_no_address_vectors() {
    let dev = vrdma_backend::device::SoftDevice::new(EngineConfig::default()).unwrap();
    let mut a = TestChannel::open(&dev, 1, ChannelMode::Bypass);
    let cq = a.cq(&dev, 4);
    let qp = a.qp(&dev, &cq, &cq, 4);
    assert_eq!(dev.local_av(), None);
    let av = vrdma_backend::device::RemoteAv {
        gid: [0; 16],
        lid: 0,
        qpn: 1,
        psn: 0,
        mtu: 0,
    };
    assert!(matches!(
        dev.connect_qp_av(a.id, qp.num, av, Some(0)),
        Err(vrdma_backend::device::DeviceError::NotSupported(_))
    ));
}
