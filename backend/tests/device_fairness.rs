//! The engine is fair by bytes (issue 10): big messages move in pieces over several passes and
//! arrive whole, in order, and a channel moving huge messages does not hold up another
//! channel's small one until it is done. Tested by completion order, never by timing (the
//! figures are in `benches/fairness.rs`).

use shared_ring::abi::control::{access, QpState};
use shared_ring::abi::cqe::{CqeOpcode, CqeStatus};
use shared_ring::abi::wqe::WqeOpcode;
use vrdma_backend::device::testkit::{wqe, TestChannel, TestPair};
use vrdma_backend::device::{ChannelMode, Device, EngineConfig, SoftDevice};

const ALL: u32 = access::ALL;

fn pair(dev: &SoftDevice, doms: (u16, u16)) -> TestPair {
    TestPair::connected(dev, doms, ChannelMode::Bypass)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect()
}

#[test]
fn big_writes_reads_and_writes_with_immediate_arrive_whole_and_in_order() {
    let dev = SoftDevice::new(EngineConfig::default()).unwrap();
    let mut p = pair(&dev, (1, 2));
    let amr = p.a.mr(&dev, 16 << 20, ALL);
    let bmr = p.b.mr(&dev, 8 << 20, ALL);
    for (i, &len) in [(32usize << 10) + 1, (3 << 20) + 7].iter().enumerate() {
        let i = i as u64;
        let data = pattern(len, i as u8);
        let half = (len / 3) as u32;
        amr.fill(5, &data);
        // WRITE from two local SGEs, then WRITE with immediate, then READ back into two SGEs;
        // all posted at once: they complete in order.
        p.bqp.post_recv(&dev, 50 + i, &[]);
        let sges = [
            amr.sge(5, half),
            amr.sge(5 + u64::from(half), len as u32 - half),
        ];
        p.aqp.post_send(
            &dev,
            &wqe(
                WqeOpcode::RdmaWrite,
                10 * i,
                &sges,
                (bmr.iova + 3, bmr.keys.rkey),
                0,
            ),
        );
        p.aqp.post_send(
            &dev,
            &wqe(
                WqeOpcode::RdmaWriteWithImm,
                10 * i + 1,
                &sges,
                (bmr.iova + (4 << 20), bmr.keys.rkey),
                0xabc0 + i as u32,
            ),
        );
        let back = [
            amr.sge(8 << 20, half + 1),
            amr.sge((12 << 20) + 9, len as u32 - half - 1),
        ];
        p.aqp.post_send(
            &dev,
            &wqe(
                WqeOpcode::RdmaRead,
                10 * i + 2,
                &back,
                (bmr.iova + 3, bmr.keys.rkey),
                0,
            ),
        );
        for k in 0..3 {
            let c = p.acq.wait(&dev);
            assert_eq!((c.wr_id, c.status), (10 * i + k, CqeStatus::Success));
            assert_eq!(c.byte_len as usize, len);
        }
        let r = p.bcq.wait(&dev);
        assert_eq!(
            (r.wr_id, r.status, r.opcode, r.imm_data),
            (
                50 + i,
                CqeStatus::Success,
                CqeOpcode::RecvRdmaWithImm,
                0xabc0 + i as u32
            )
        );
        assert!(bmr.read(3, len) == data, "WRITE of {len}");
        assert_eq!(
            bmr.read(4 << 20, len),
            data,
            "WRITE with immediate of {len}"
        );
        let mut got = amr.read(8 << 20, half as usize + 1);
        got.extend(amr.read((12 << 20) + 9, len - half as usize - 1));
        assert!(got == data, "READ of {len}");
    }
}

#[test]
fn a_receiver_that_fails_mid_message_gets_its_recv_flushed_once() {
    // A 256 MiB SEND is moving when the receiver moves its QP to Error: either the message
    // made it first (both succeed) or the RECV is flushed and the sender told RetryExceeded;
    // the RECV completes exactly once either way.
    let dev = SoftDevice::new(EngineConfig::default()).unwrap();
    let mut p = pair(&dev, (1, 2));
    let len = 256usize << 20;
    let amr = p.a.mr(&dev, len as u64, ALL);
    let bmr = p.b.mr(&dev, len as u64, ALL);
    p.bqp.post_recv(&dev, 7, &[bmr.sge(0, len as u32)]);
    p.bqp.post_recv(&dev, 8, &[bmr.sge(0, 64)]);
    p.aqp.post_send(
        &dev,
        &wqe(WqeOpcode::Send, 1, &[amr.sge(0, len as u32)], (0, 0), 0),
    );
    dev.modify_qp(p.b.id, p.bqp.num, QpState::Error).unwrap();
    let s = p.acq.wait(&dev);
    let r1 = p.bcq.wait(&dev);
    let r2 = p.bcq.wait(&dev);
    assert_eq!(
        (r1.wr_id, r2.wr_id),
        (7, 8),
        "RECVs complete once, in order"
    );
    assert_eq!(r2.status, CqeStatus::WrFlushError);
    match r1.status {
        CqeStatus::Success => assert_eq!(s.status, CqeStatus::Success),
        CqeStatus::WrFlushError => assert_eq!(s.status, CqeStatus::RetryExceeded),
        other => panic!("RECV completed with {other:?}"),
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(p.bcq.poll(&dev).is_none(), "a RECV completed twice");
}

#[test]
fn a_hog_of_huge_writes_does_not_hold_up_another_channel() {
    // One engine for both channels. The hog queues 32 RDMA WRITEs of 64 MiB (2 GiB of
    // copying); once it has started, the good pair's 64-byte SEND completes while most of the
    // hog's WRITEs are still outstanding. (Before: a pass ran up to 32 WQEs of a QP whatever
    // their size, so the SEND waited for all 2 GiB.)
    let dev = SoftDevice::new(EngineConfig {
        threads: 1,
        ..EngineConfig::default()
    })
    .unwrap();
    let mut hog = TestChannel::open(&dev, 9, ChannelMode::Bypass);
    let mut hcq = hog.cq(&dev, 8);
    let mut hqp = hog.qp(&dev, &hcq, &hcq, 6);
    dev.connect_qp(hog.id, hqp.num, hqp.num).unwrap();
    let len = 64u32 << 20;
    let src = hog.mr(&dev, u64::from(len), ALL); // never written: reads the zero page
    let dst = hog.mr(&dev, u64::from(len), ALL);
    dst.fill(0, &[0xee; 64]);
    let mut g = pair(&dev, (1, 2));
    let gm = g.a.mr(&dev, 4096, ALL);
    let hm = g.b.mr(&dev, 4096, ALL);
    gm.fill(0, &[0x42; 64]);
    g.bqp.post_recv(&dev, 1, &[hm.sge(0, 64)]);
    for i in 0..32 {
        hqp.post_send(
            &dev,
            &wqe(
                WqeOpcode::RdmaWrite,
                i,
                &[src.sge(0, len)],
                (dst.iova, dst.keys.rkey),
                0,
            ),
        );
    }
    // The hog is under way once its first bytes land.
    let start = std::time::Instant::now();
    while dst.read(0, 1)[0] != 0 {
        assert!(start.elapsed() < vrdma_backend::device::testkit::HANG);
        std::thread::yield_now();
    }
    g.aqp
        .post_send(&dev, &wqe(WqeOpcode::Send, 2, &[gm.sge(0, 64)], (0, 0), 0));
    assert_eq!(g.acq.wait(&dev).status, CqeStatus::Success);
    assert_eq!(g.bcq.wait(&dev).status, CqeStatus::Success);
    let mut hog_done = 0;
    while hcq.poll(&dev).is_some() {
        hog_done += 1;
    }
    assert!(
        hog_done < 16,
        "the small SEND waited for {hog_done} of the hog's 32 WRITEs"
    );
    assert_eq!(hm.read(0, 64), vec![0x42; 64]);
    // The hog's own work completes, in order.
    for i in hog_done..32 {
        let c = hcq.wait(&dev);
        assert_eq!((c.wr_id, c.status), (i, CqeStatus::Success));
    }
}
