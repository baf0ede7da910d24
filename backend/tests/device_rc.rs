//! RC semantics of the software device, driven like a frontend on plain memory.

use shared_ring::abi::control::{access, QpState};
use shared_ring::abi::cqe::{flags as cqe_flags, CqeOpcode, CqeStatus};
use shared_ring::abi::event::EventKind;
use shared_ring::abi::wqe::{flags, WqeData, WqeOpcode, WqeRepr};
use vrdma_backend::device::testkit::{connect, wqe, TestChannel, TestCq, TestQp};
use vrdma_backend::device::{ChannelMode, Device, DeviceError, EngineConfig, SoftDevice};

const ALL: u32 = access::ALL;

struct Pair {
    a: TestChannel,
    b: TestChannel,
    acq: TestCq,
    bcq: TestCq,
    aqp: TestQp,
    bqp: TestQp,
}

fn device() -> SoftDevice {
    SoftDevice::new(EngineConfig::default()).expect("device")
}

fn pair_mode(dev: &SoftDevice, mode: ChannelMode) -> Pair {
    let mut a = TestChannel::open(dev, 1, mode);
    let mut b = TestChannel::open(dev, 2, mode);
    let acq = a.cq(dev, 8);
    let bcq = b.cq(dev, 8);
    let aqp = a.qp(dev, &acq, &acq, 6);
    let bqp = b.qp(dev, &bcq, &bcq, 6);
    connect(dev, &aqp, &bqp);
    assert_eq!(dev.qp_state(a.id, aqp.num), Ok(QpState::Rts));
    assert_eq!(dev.qp_state(b.id, bqp.num), Ok(QpState::Rts));
    Pair {
        a,
        b,
        acq,
        bcq,
        aqp,
        bqp,
    }
}

fn pair(dev: &SoftDevice) -> Pair {
    pair_mode(dev, ChannelMode::Bypass)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

#[test]
fn send_recv_every_size_with_sge_lists() {
    let dev = device();
    let mut p = pair(&dev);
    let src = p.a.mr(&dev, 8 << 20, ALL);
    let dst = p.b.mr(&dev, 8 << 20, ALL);
    for (i, &len) in [1usize, 3, 64, 4095, 4096, 65537, 1 << 20, 4 << 20]
        .iter()
        .enumerate()
    {
        let data = pattern(len, i as u8);
        src.fill(7, &data);
        // Receive into two SGEs, the split point inside the message.
        let first = (len / 3) as u32;
        let rest = len as u32 - first + 5;
        p.bqp.post_recv(
            &dev,
            100 + i as u64,
            &[dst.sge(1, first), dst.sge(4_000_000, rest)],
        );
        // Send from two SGEs.
        let half = (len / 2) as u32;
        let w = wqe(
            WqeOpcode::Send,
            i as u64,
            &[
                src.sge(7, half),
                src.sge(7 + half as u64, len as u32 - half),
            ],
            (0, 0),
            0,
        );
        p.aqp.post_send(&dev, &w);
        let c = p.acq.wait(&dev);
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (i as u64, CqeStatus::Success, CqeOpcode::Send)
        );
        let r = p.bcq.wait(&dev);
        assert_eq!(
            (r.wr_id, r.status, r.opcode),
            (100 + i as u64, CqeStatus::Success, CqeOpcode::Recv)
        );
        assert_eq!(r.byte_len as usize, len);
        assert_eq!(r.qp_num, p.bqp.num.0);
        let mut got = dst.read(1, first as usize);
        got.extend(dst.read(4_000_000, len - first as usize));
        assert_eq!(got, data, "len {len}");
    }
    let s = dev.stats(p.b.id);
    assert_eq!(s.ops, 8);
    assert!(s.bytes > 5 << 20);
}

#[test]
fn inline_send_with_immediate_and_solicited() {
    let dev = device();
    let mut p = pair(&dev);
    let dst = p.b.mr(&dev, 4096, ALL);
    p.bqp.post_recv(&dev, 9, &[dst.sge(0, 64)]);
    let w = WqeRepr {
        opcode: WqeOpcode::SendWithImm,
        flags: flags::SIGNALED | flags::SOLICITED,
        wr_id: 1,
        imm_data: 0xdead_beef,
        remote_addr: 0,
        rkey: 0,
        data: WqeData::inline(b"hello, inline world, 32 bytes!!!").unwrap(),
    };
    p.aqp.post_send(&dev, &w);
    assert_eq!(p.acq.wait(&dev).status, CqeStatus::Success);
    let r = p.bcq.wait(&dev);
    assert_eq!(r.imm_data, 0xdead_beef);
    assert_eq!(r.flags, cqe_flags::WITH_IMM | cqe_flags::SOLICITED);
    assert_eq!(r.byte_len, 32);
    assert_eq!(dst.read(0, 32), b"hello, inline world, 32 bytes!!!");
}

#[test]
fn rdma_write_read_and_write_with_immediate() {
    let dev = device();
    let mut p = pair(&dev);
    let local = p.a.mr_at(&dev, (4 << 20) + 4096, ALL, 123);
    let remote = p.b.mr_at(&dev, 4 << 20, ALL, 3001);
    for (i, &len) in [1usize, 64, 4097, 1 << 20, 4 << 20].iter().enumerate() {
        let data = pattern(len, 50 + i as u8);
        local.fill(0, &data);
        let w = wqe(
            WqeOpcode::RdmaWrite,
            i as u64,
            &[local.sge(0, len as u32)],
            (remote.iova, remote.keys.rkey),
            0,
        );
        p.aqp.post_send(&dev, &w);
        let c = p.acq.wait(&dev);
        assert_eq!(
            (c.status, c.opcode),
            (CqeStatus::Success, CqeOpcode::RdmaWrite)
        );
        assert_eq!(remote.read(0, len), data);
        // Read it back into another place, through two SGEs.
        let h = (len / 2) as u32;
        let w = wqe(
            WqeOpcode::RdmaRead,
            10 + i as u64,
            &[
                local.sge(len as u64 / 2 + 1, len as u32 - h),
                local.sge(0, h),
            ],
            (remote.iova, remote.keys.rkey),
            0,
        );
        local.fill(0, &vec![0; len]);
        p.aqp.post_send(&dev, &w);
        let c = p.acq.wait(&dev);
        assert_eq!(
            (c.status, c.opcode, c.byte_len as usize),
            (CqeStatus::Success, CqeOpcode::RdmaRead, len)
        );
        let mut got = local.read(len / 2 + 1, len - h as usize);
        got.extend(local.read(0, h as usize));
        assert_eq!(got, data);
    }
    // No receive consumed by plain WRITE; WRITE with immediate consumes one.
    assert!(p.bcq.poll(&dev).is_none());
    p.bqp.post_recv(&dev, 77, &[]);
    let w = wqe(
        WqeOpcode::RdmaWriteWithImm,
        5,
        &[local.sge(0, 16)],
        (remote.iova + 100, remote.keys.rkey),
        42,
    );
    local.fill(0, &[9; 16]);
    p.aqp.post_send(&dev, &w);
    assert_eq!(p.acq.wait(&dev).status, CqeStatus::Success);
    let r = p.bcq.wait(&dev);
    assert_eq!(
        (r.wr_id, r.opcode, r.imm_data, r.byte_len),
        (77, CqeOpcode::RecvRdmaWithImm, 42, 16)
    );
    assert_eq!(remote.read(100, 16), vec![9; 16]);
}

#[test]
fn per_qp_ordering_and_unsignaled() {
    let dev = device();
    let mut p = pair(&dev);
    let src = p.a.mr(&dev, 4096, ALL);
    let dst = p.b.mr(&dev, 64 * 64, ALL);
    for i in 0..40u64 {
        p.bqp.post_recv(&dev, i, &[dst.sge(i * 64, 64)]);
    }
    for i in 0..40u64 {
        src.fill(0, &[i as u8; 8]);
        let mut w = wqe(WqeOpcode::Send, i, &[src.sge(0, 8)], (0, 0), 0);
        if i % 2 == 1 {
            w.flags = 0; // unsignaled: no CQE on success
        }
        p.aqp.post_send(&dev, &w);
        // wait for each so the source buffer can be reused
        if i % 2 == 0 {
            assert_eq!(p.acq.wait(&dev).wr_id, i);
        } else {
            let r = loop {
                let r = p.bcq.wait(&dev);
                if r.wr_id == i {
                    break r;
                }
                assert_eq!(r.wr_id, i - 1);
            };
            assert_eq!(r.status, CqeStatus::Success);
        }
    }
    for i in 0..40u64 {
        assert_eq!(dst.read(i as usize * 64, 8), vec![i as u8; 8]);
    }
}

#[test]
fn send_waits_for_a_receive_in_order() {
    let dev = device();
    let mut p = pair(&dev);
    let src = p.a.mr(&dev, 4096, ALL);
    let dst = p.b.mr(&dev, 4096, ALL);
    src.fill(0, b"first...second..");
    p.aqp
        .post_send(&dev, &wqe(WqeOpcode::Send, 1, &[src.sge(0, 8)], (0, 0), 0));
    // an RDMA WRITE behind the blocked SEND must not overtake it
    p.aqp.post_send(
        &dev,
        &wqe(
            WqeOpcode::RdmaWrite,
            2,
            &[src.sge(8, 8)],
            (dst.iova + 100, dst.keys.rkey),
            0,
        ),
    );
    for _ in 0..1000 {
        std::thread::yield_now();
    }
    assert!(p.acq.poll(&dev).is_none(), "SEND completed without a RECV");
    assert_eq!(
        dst.read(100, 8),
        vec![0; 8],
        "WRITE overtook the blocked SEND"
    );
    assert_eq!(dev.qp_state(p.a.id, p.aqp.num), Ok(QpState::Rts));
    p.bqp.post_recv(&dev, 50, &[dst.sge(0, 8)]);
    assert_eq!(p.acq.wait(&dev).wr_id, 1);
    assert_eq!(p.acq.wait(&dev).wr_id, 2);
    assert_eq!(dst.read(0, 8), b"first...");
    assert_eq!(dst.read(100, 8), b"second..");
    assert_eq!(p.bcq.wait(&dev).wr_id, 50);
}

/// Posts `n` more signaled SENDs behind the failing one and checks they flush in order.
fn expect_error_then_flush(dev: &SoftDevice, p: &mut Pair, status: CqeStatus, wr: u64) {
    let c = p.acq.wait(dev);
    assert_eq!((c.wr_id, c.status), (wr, status));
    for i in 1..=3 {
        let c = p.acq.wait(dev);
        assert_eq!((c.wr_id, c.status), (wr + i, CqeStatus::WrFlushError));
    }
    assert_eq!(dev.qp_state(p.a.id, p.aqp.num), Ok(QpState::Error));
    // posting to an Error QP flushes too
    p.aqp
        .post_send(dev, &wqe(WqeOpcode::Send, 999, &[], (0, 0), 0));
    assert_eq!(p.acq.wait(dev).status, CqeStatus::WrFlushError);
}

fn post_tail(dev: &SoftDevice, p: &mut Pair, wr: u64) {
    for i in 1..=3 {
        p.aqp
            .post_send(dev, &wqe(WqeOpcode::Send, wr + i, &[], (0, 0), 0));
    }
}

#[test]
fn remote_violations_error_and_flush() {
    type Case = fn(
        &TestChannel,
        &vrdma_backend::device::testkit::TestMr,
        &vrdma_backend::device::testkit::TestMr,
    ) -> WqeRepr;
    let cases: [(&str, Case); 6] = [
        ("bad rkey", |_, l, r| {
            wqe(
                WqeOpcode::RdmaWrite,
                1,
                &[l.sge(0, 8)],
                (r.iova, r.keys.rkey ^ 0x100),
                0,
            )
        }),
        ("lkey as rkey", |_, l, r| {
            wqe(
                WqeOpcode::RdmaWrite,
                1,
                &[l.sge(0, 8)],
                (r.iova, r.keys.lkey),
                0,
            )
        }),
        ("past the end", |_, l, r| {
            wqe(
                WqeOpcode::RdmaWrite,
                1,
                &[l.sge(0, 8)],
                (r.iova + r.len - 4, r.keys.rkey),
                0,
            )
        }),
        ("below the start", |_, l, r| {
            wqe(
                WqeOpcode::RdmaRead,
                1,
                &[l.sge(0, 8)],
                (r.iova - 1, r.keys.rkey),
                0,
            )
        }),
        ("address overflow", |_, l, r| {
            wqe(
                WqeOpcode::RdmaRead,
                1,
                &[l.sge(0, 8)],
                (u64::MAX - 2, r.keys.rkey),
                0,
            )
        }),
        ("own rkey", |_, l, _| {
            wqe(
                WqeOpcode::RdmaWrite,
                1,
                &[l.sge(0, 8)],
                (l.iova, l.keys.rkey),
                0,
            )
        }),
    ];
    for (name, case) in cases {
        let dev = device();
        let mut p = pair(&dev);
        let l = p.a.mr(&dev, 4096, ALL);
        let r = p.b.mr(&dev, 4096, ALL);
        let w = case(&p.a, &l, &r);
        p.aqp.post_send(&dev, &w);
        post_tail(&dev, &mut p, 1);
        expect_error_then_flush(&dev, &mut p, CqeStatus::RemoteAccessError, 1);
        assert_eq!(
            dev.qp_state(p.b.id, p.bqp.num),
            Ok(QpState::Rts),
            "{name}: responder unaffected"
        );
        assert_eq!(r.read(0, 4096), vec![0; 4096], "{name}");
        assert_eq!(dev.stats(p.a.id).errors, 1, "{name}");
    }
    // access flags: read-only target refuses WRITE, write-only refuses READ
    for (acc, op) in [
        (access::REMOTE_READ, WqeOpcode::RdmaWrite),
        (
            access::REMOTE_WRITE | access::LOCAL_WRITE,
            WqeOpcode::RdmaRead,
        ),
    ] {
        let dev = device();
        let mut p = pair(&dev);
        let l = p.a.mr(&dev, 4096, ALL);
        let r = p.b.mr(&dev, 4096, acc);
        p.aqp
            .post_send(&dev, &wqe(op, 1, &[l.sge(0, 8)], (r.iova, r.keys.rkey), 0));
        post_tail(&dev, &mut p, 1);
        expect_error_then_flush(&dev, &mut p, CqeStatus::RemoteAccessError, 1);
    }
}

#[test]
fn local_violations_error_and_flush() {
    for case in 0..4 {
        let dev = device();
        let mut p = pair(&dev);
        let l = p.a.mr(&dev, 4096, access::REMOTE_READ); // no LOCAL_WRITE
        let other = p.b.mr(&dev, 4096, ALL); // another channel's key
        let r = p.b.mr(&dev, 4096, ALL);
        let w = match case {
            0 => wqe(WqeOpcode::Send, 1, &[l.sge(4000, 100)], (0, 0), 0),
            1 => wqe(WqeOpcode::Send, 1, &[other.sge(0, 8)], (0, 0), 0),
            2 => wqe(
                WqeOpcode::RdmaRead,
                1,
                &[l.sge(0, 8)],
                (r.iova, r.keys.rkey),
                0,
            ),
            _ => wqe(WqeOpcode::Send, 1, &[l.sge(u64::MAX - 1, 8)], (0, 0), 0),
        };
        p.aqp.post_send(&dev, &w);
        post_tail(&dev, &mut p, 1);
        expect_error_then_flush(&dev, &mut p, CqeStatus::LocalProtectionError, 1);
    }
}

#[test]
fn receive_too_small_fails_both_sides() {
    let dev = device();
    let mut p = pair(&dev);
    let l = p.a.mr(&dev, 4096, ALL);
    let r = p.b.mr(&dev, 4096, ALL);
    p.bqp.post_recv(&dev, 7, &[r.sge(0, 4)]);
    p.bqp.post_recv(&dev, 8, &[r.sge(0, 4)]);
    p.aqp
        .post_send(&dev, &wqe(WqeOpcode::Send, 1, &[l.sge(0, 8)], (0, 0), 0));
    post_tail(&dev, &mut p, 1);
    expect_error_then_flush(&dev, &mut p, CqeStatus::RemoteInvalidRequest, 1);
    let c = p.bcq.wait(&dev);
    assert_eq!((c.wr_id, c.status), (7, CqeStatus::LocalLengthError));
    let c = p.bcq.wait(&dev);
    assert_eq!((c.wr_id, c.status), (8, CqeStatus::WrFlushError));
    assert_eq!(dev.qp_state(p.b.id, p.bqp.num), Ok(QpState::Error));
}

#[test]
fn cq_overrun_raises_an_event() {
    let dev = device();
    let mut a = TestChannel::open(&dev, 1, ChannelMode::Bypass);
    let mut cq = a.cq(&dev, 2); // 4 CQEs
    let mut qp = a.qp(&dev, &cq, &cq, 4);
    dev.connect_qp(a.id, qp.num, qp.num).unwrap(); // loopback
    let m = a.mr(&dev, 4096, ALL);
    a.take_events();
    for i in 0..6 {
        qp.post_send(
            &dev,
            &wqe(
                WqeOpcode::RdmaWrite,
                i,
                &[m.sge(0, 8)],
                (m.iova, m.keys.rkey),
                0,
            ),
        );
    }
    let start = std::time::Instant::now();
    let evs = loop {
        let evs = a.take_events();
        if !evs.is_empty() {
            break evs;
        }
        assert!(start.elapsed() < vrdma_backend::device::testkit::HANG);
        std::thread::yield_now();
    };
    assert_eq!(evs[0].kind, EventKind::CqOverrun);
    assert_eq!(evs[0].handle, cq.id.0);
    for i in 0..4 {
        assert_eq!(cq.poll(&dev).unwrap().wr_id, i);
    }
    assert!(a.notified.load(std::sync::atomic::Ordering::SeqCst) >= 1);
}

#[test]
fn armed_cq_notifies_once() {
    let dev = device();
    let mut p = pair(&dev);
    let m = p.b.mr(&dev, 4096, ALL);
    let before = p.b.notified.load(std::sync::atomic::Ordering::SeqCst);
    assert!(!p.bcq.poller.arm(false));
    for i in 0..3 {
        p.bqp.post_recv(&dev, i, &[m.sge(0, 8)]);
        p.aqp
            .post_send(&dev, &wqe(WqeOpcode::Send, i, &[], (0, 0), 0));
    }
    for _ in 0..3 {
        p.bcq.wait(&dev);
    }
    assert_eq!(
        p.b.notified.load(std::sync::atomic::Ordering::SeqCst),
        before + 1
    );
    // re-arm: one more notification for the next completion
    assert!(!p.bcq.poller.arm(false));
    p.bqp.post_recv(&dev, 9, &[m.sge(0, 8)]);
    p.aqp
        .post_send(&dev, &wqe(WqeOpcode::Send, 9, &[], (0, 0), 0));
    p.bcq.wait(&dev);
    assert_eq!(
        p.b.notified.load(std::sync::atomic::Ordering::SeqCst),
        before + 2
    );
}

#[test]
fn destroying_a_peer_fails_the_qp_and_close_frees_everything() {
    let dev = device();
    let mut p = pair(&dev);
    let m = p.a.mr(&dev, 1 << 20, ALL);
    let _m2 = p.b.mr(&dev, 1 << 16, ALL);
    p.aqp.post_recv(&dev, 5, &[m.sge(0, 8)]);
    let held = dev.stats(p.b.id);
    assert_eq!(
        (
            held.channels,
            held.pds,
            held.mrs,
            held.cqs,
            held.qps,
            held.mr_bytes
        ),
        (1, 1, 1, 1, 1, 1 << 16)
    );
    dev.close_channel(p.b.id);
    assert_eq!(dev.stats(p.b.id), Default::default());
    let d = dev.domain_stats(vrdma_backend::device::DomId(2));
    assert_eq!(
        (d.channels, d.pds, d.mrs, d.mr_bytes, d.cqs, d.qps),
        (0, 0, 0, 0, 0, 0)
    );
    // the survivor's QP is in Error, its receive flushed, and it got QpDisconnected
    let c = p.acq.wait(&dev);
    assert_eq!((c.wr_id, c.status), (5, CqeStatus::WrFlushError));
    assert_eq!(dev.qp_state(p.a.id, p.aqp.num), Ok(QpState::Error));
    assert!(p
        .a
        .take_events()
        .iter()
        .any(|e| e.kind == EventKind::QpDisconnected));
    // busy rules
    let e = dev.destroy_cq(p.a.id, p.acq.id).unwrap_err();
    assert!(matches!(e, DeviceError::Busy(_)), "{e:?}");
    dev.destroy_qp(p.a.id, p.aqp.num).unwrap();
    let e = dev.dealloc_pd(p.a.id, p.a.pd).unwrap_err();
    assert!(matches!(e, DeviceError::Busy(_)), "{e:?}");
    dev.dereg_mr(p.a.id, m.keys.handle).unwrap();
    dev.destroy_cq(p.a.id, p.acq.id).unwrap();
    dev.dealloc_pd(p.a.id, p.a.pd).unwrap();
    let s = dev.stats(p.a.id);
    assert_eq!(
        (s.pds, s.mrs, s.cqs, s.qps, s.mr_bytes, s.channels),
        (0, 0, 0, 0, 0, 1)
    );
    dev.close_channel(p.a.id);
    assert_eq!(
        dev.domain_stats(vrdma_backend::device::DomId(1)).channels,
        0
    );
}

#[test]
fn foreign_handles_are_refused() {
    let dev = device();
    let mut p = pair(&dev);
    let m = p.b.mr(&dev, 4096, ALL);
    let bad_handle = |r: Result<(), DeviceError>| {
        let e = r.unwrap_err();
        assert!(matches!(e, DeviceError::BadHandle { .. }), "{e:?}");
    };
    bad_handle(dev.dereg_mr(p.a.id, m.keys.handle));
    bad_handle(dev.destroy_qp(p.a.id, p.bqp.num));
    bad_handle(dev.destroy_cq(p.a.id, p.bcq.id));
    bad_handle(dev.dealloc_pd(p.a.id, p.b.pd));
    bad_handle(dev.connect_qp(p.a.id, p.bqp.num, p.aqp.num));
    let e = dev.poll_cq_mediated(p.a.id, p.acq.id).unwrap_err();
    assert!(
        matches!(e, DeviceError::NotMediated),
        "bypass channel: {e:?}"
    );
}

#[test]
fn mediated_mode_serves_posts_and_polls() {
    let dev = device();
    let mut p = pair_mode(&dev, ChannelMode::Mediated);
    let src = p.a.mr(&dev, 1 << 16, ALL);
    let dst = p.b.mr(&dev, 1 << 16, ALL);
    let data = pattern(5000, 3);
    src.fill(0, &data);
    p.bqp.post_recv(&dev, 1, &[dst.sge(0, 8000)]);
    p.aqp.post_send(
        &dev,
        &wqe(WqeOpcode::Send, 2, &[src.sge(0, 5000)], (0, 0), 0),
    );
    assert_eq!(p.acq.wait(&dev).wr_id, 2);
    let r = p.bcq.wait(&dev);
    assert_eq!((r.wr_id, r.byte_len), (1, 5000));
    assert_eq!(dst.read(0, 5000), data);
    // arm through the device: the next completion notifies
    let before = p.a.notified.load(std::sync::atomic::Ordering::SeqCst);
    dev.arm_cq(p.a.id, p.acq.id, false).unwrap();
    p.aqp.post_send(
        &dev,
        &wqe(
            WqeOpcode::RdmaWrite,
            3,
            &[src.sge(0, 8)],
            (dst.iova, dst.keys.rkey),
            0,
        ),
    );
    assert_eq!(p.acq.wait(&dev).wr_id, 3);
    assert_eq!(
        p.a.notified.load(std::sync::atomic::Ordering::SeqCst),
        before + 1
    );
    // a producer index beyond the queue puts the QP in Error
    dev.post_mediated(
        p.a.id,
        p.aqp.num,
        vrdma_backend::device::WorkQueue::Sq,
        1_000_000,
    )
    .unwrap();
    let start = std::time::Instant::now();
    while dev.qp_state(p.a.id, p.aqp.num) != Ok(QpState::Error) {
        assert!(start.elapsed() < vrdma_backend::device::testkit::HANG);
        std::thread::yield_now();
    }
}

#[test]
fn per_qp_counters_follow_the_work_and_go_with_the_qp() {
    use vrdma_backend::device::{DomId, QpStats};
    let dev = device();
    let mut p = pair(&dev);
    // A second, idle QP on a's channel: its counters stay at zero.
    let idle = p.a.qp(&dev, &p.acq, &p.acq, 4);
    let local = p.a.mr(&dev, 1 << 16, ALL);
    let remote = p.b.mr(&dev, 1 << 16, ALL);
    // SEND 100 bytes into a RECV.
    p.bqp.post_recv(&dev, 1, &[remote.sge(0, 4096)]);
    p.aqp.post_send(
        &dev,
        &wqe(WqeOpcode::Send, 1, &[local.sge(0, 100)], (0, 0), 0),
    );
    assert_eq!(p.acq.wait(&dev).status, CqeStatus::Success);
    assert_eq!(p.bcq.wait(&dev).status, CqeStatus::Success);
    // RDMA WRITE 4096, RDMA READ 512: no RECV consumed.
    for (op, len) in [(WqeOpcode::RdmaWrite, 4096), (WqeOpcode::RdmaRead, 512)] {
        let w = wqe(
            op,
            2,
            &[local.sge(0, len)],
            (remote.iova, remote.keys.rkey),
            0,
        );
        p.aqp.post_send(&dev, &w);
        assert_eq!(p.acq.wait(&dev).status, CqeStatus::Success);
    }
    let stats = |ch| -> Vec<QpStats> { dev.qp_stats(ch) };
    let a = stats(p.a.id);
    assert_eq!(a.len(), 2);
    let aq = a.iter().find(|s| s.qp == p.aqp.num).expect("a's QP listed");
    assert_eq!(
        (aq.state, aq.ops, aq.bytes, aq.errors, aq.recvs),
        (QpState::Rts, 3, 100 + 4096 + 512, 0, 0)
    );
    let iq = a.iter().find(|s| s.qp == idle.num).expect("idle QP listed");
    assert_eq!(
        (iq.state, iq.ops, iq.bytes, iq.errors, iq.recvs),
        (QpState::Init, 0, 0, 0, 0)
    );
    let b = stats(p.b.id);
    assert_eq!(b.len(), 1);
    assert_eq!(
        (b[0].qp, b[0].ops, b[0].bytes, b[0].errors, b[0].recvs),
        (p.bqp.num, 1, 100, 0, 1)
    );
    // A SEND larger than the RECV: an error completion on both sides.
    p.bqp.post_recv(&dev, 3, &[remote.sge(0, 4)]);
    p.aqp.post_send(
        &dev,
        &wqe(WqeOpcode::Send, 3, &[local.sge(0, 8)], (0, 0), 0),
    );
    assert_eq!(p.acq.wait(&dev).status, CqeStatus::RemoteInvalidRequest);
    assert_eq!(p.bcq.wait(&dev).status, CqeStatus::LocalLengthError);
    let aq = stats(p.a.id)
        .into_iter()
        .find(|s| s.qp == p.aqp.num)
        .unwrap();
    assert_eq!(
        (aq.state, aq.ops, aq.bytes, aq.errors),
        (QpState::Error, 4, 100 + 4096 + 512, 1)
    );
    let bq = stats(p.b.id)[0];
    assert_eq!(
        (bq.state, bq.ops, bq.bytes, bq.errors, bq.recvs),
        (QpState::Error, 2, 100, 1, 2)
    );
    // The QPs of a channel add up to the channel's work counters.
    for ch in [p.a.id, p.b.id] {
        let c = dev.stats(ch);
        let q = stats(ch);
        assert_eq!(
            (
                q.iter().map(|s| s.ops).sum::<u64>(),
                q.iter().map(|s| s.bytes).sum::<u64>(),
                q.iter().map(|s| s.errors).sum::<u64>()
            ),
            (c.ops, c.bytes, c.errors)
        );
    }
    assert_eq!(dev.domain_qp_stats(DomId(2)), stats(p.b.id));
    // Destroyed QPs and closed channels leave nothing behind.
    dev.destroy_qp(p.a.id, idle.num).unwrap();
    assert_eq!(
        stats(p.a.id).iter().map(|s| s.qp).collect::<Vec<_>>(),
        vec![p.aqp.num]
    );
    dev.close_channel(p.b.id);
    assert!(stats(p.b.id).is_empty());
    assert!(dev.domain_qp_stats(DomId(2)).is_empty());
    dev.close_channel(p.a.id);
    assert!(dev.domain_qp_stats(DomId(1)).is_empty());
}

/// A domain whose channels three engines serve: each engine counts the domain's WRITEs in its
/// own shard, and the domain's counters, read right after each CQE is polled, include every
/// engine's (docs/benchmarks.md, "Seventh round").
#[test]
fn domain_counters_add_every_engines_writes_right_after_the_cqe() {
    use vrdma_backend::device::DomId;
    let dev = SoftDevice::new(EngineConfig {
        threads: 3,
        ..EngineConfig::default()
    })
    .expect("device");
    // Channels go to the engines round-robin: three of domain 1 (with a QP pair each: local
    // to the channel, so one engine executes each WRITE) land on engines 0, 1 and 2.
    let mut chans: Vec<_> = (0..3)
        .map(|_| TestChannel::open(&dev, 1, ChannelMode::Bypass))
        .collect();
    let mut total = (0u64, 0u64);
    for (i, c) in chans.iter_mut().enumerate() {
        let mut cq = c.cq(&dev, 8);
        let mut a = c.qp(&dev, &cq, &cq, 4);
        let b = c.qp(&dev, &cq, &cq, 4);
        connect(&dev, &a, &b);
        let local = c.mr(&dev, 4096, ALL);
        let remote = c.mr(&dev, 4096, ALL);
        for k in 0..=i as u32 {
            let len = 64 + 8 * (i as u32) + k;
            let w = wqe(
                WqeOpcode::RdmaWrite,
                u64::from(k),
                &[local.sge(0, len)],
                (remote.iova, remote.keys.rkey),
                0,
            );
            a.post_send(&dev, &w);
            assert_eq!(cq.wait(&dev).status, CqeStatus::Success);
            total = (total.0 + 1, total.1 + u64::from(len));
            let d = dev.domain_stats(DomId(1));
            assert_eq!((d.ops, d.bytes), total, "channel {i}, WRITE {k}");
            let s = dev.stats(c.id);
            assert_eq!(
                (s.ops, s.bytes),
                (
                    u64::from(k) + 1,
                    (0..=k).map(|j| u64::from(64 + 8 * i as u32 + j)).sum()
                )
            );
        }
    }
    assert_eq!(total.0, 6);
}
