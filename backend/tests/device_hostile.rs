//! A hostile guest: garbage and half-plausible WQEs, random producer indexes. The device must
//! not panic, and must never write memory outside what the keys in the WQEs legitimately name.

use std::sync::atomic::Ordering;
use std::time::Instant;

use proptest::prelude::*;
use shared_ring::abi::control::{access, QpState};
use shared_ring::abi::wqe::{Sge, WqeData, WqeOpcode, WqeRepr, WQE_LEN};
use vrdma_backend::device::testkit::{connect, wqe, TestChannel, HANG};
use vrdma_backend::device::{ChannelMode, Device, EngineConfig, SoftDevice};

#[derive(Debug, Clone)]
enum Slot {
    Raw([u8; WQE_LEN]),
    Plausible {
        op: u8,
        flags: u8,
        sges: Vec<(u8, u64, u32)>,
        rkey: u8,
        addr: u64,
        imm: u32,
    },
}

fn slot() -> impl Strategy<Value = Slot> {
    prop_oneof![
        any::<[u8; 32]>().prop_flat_map(|a| any::<[u8; 32]>().prop_map(move |b| {
            let mut s = [0u8; WQE_LEN];
            s[..32].copy_from_slice(&a);
            s[32..].copy_from_slice(&b);
            Slot::Raw(s)
        })),
        (
            1u8..=6,
            0u8..16,
            prop::collection::vec((0u8..4, 0u64..70_000, 0u32..70_000), 0..=2),
            0u8..4,
            0u64..0x3000_0000,
            any::<u32>()
        )
            .prop_map(|(op, flags, sges, rkey, addr, imm)| Slot::Plausible {
                op,
                flags,
                sges,
                rkey,
                addr,
                imm
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn garbage_never_escapes(slots in prop::collection::vec(slot(), 1..24), prod_skew in prop_oneof![Just(0u32), any::<u32>()], recvs in 0usize..4) {
        let dev = SoftDevice::new(EngineConfig::default()).unwrap();
        let mut a = TestChannel::open(&dev, 1, ChannelMode::Bypass);
        let mut b = TestChannel::open(&dev, 2, ChannelMode::Bypass);
        let mut c = TestChannel::open(&dev, 3, ChannelMode::Bypass);
        let acq = a.cq(&dev, 6);
        let bcq = b.cq(&dev, 6);
        let mut aqp = a.qp(&dev, &acq, &acq, 5);
        let mut bqp = b.qp(&dev, &bcq, &bcq, 5);
        connect(&dev, &aqp, &bqp);
        let own = a.mr(&dev, 65536, access::ALL);
        let peer = b.mr(&dev, 65536, access::ALL);
        // Registered by a third domain with every access bit: its rkey is valid, but names a
        // region of neither end of the connection, so nothing may reach it.
        let canary = c.mr(&dev, 65536, access::ALL);
        canary.fill(0, &[0xa5; 65536]);
        let other_b = b.mr(&dev, 4096, access::REMOTE_READ); // read-only for the peer
        other_b.fill(0, &[0x5a; 4096]);
        for i in 0..recvs {
            bqp.post_recv(&dev, i as u64, &[peer.sge(i as u64 * 100, 70_000)]);
        }
        let lkeys = [own.keys.lkey, peer.keys.lkey, canary.keys.lkey, 0x1234_5678];
        let rkeys = [peer.keys.rkey, canary.keys.rkey, other_b.keys.rkey, own.keys.rkey];
        let iovas = [peer.iova, canary.iova, other_b.iova, own.iova];
        for s in &slots {
            let bytes = match s {
                Slot::Raw(b) => *b,
                Slot::Plausible { op, flags, sges, rkey, addr, imm } => {
                    let op = WqeOpcode::from_u8(*op).unwrap();
                    let list: Vec<Sge> = sges.iter().map(|&(k, off, len)| Sge { offset: off, length: len, lkey: lkeys[k as usize] }).collect();
                    let mut w: WqeRepr = wqe(op, 7, &list, (0, 0), 0);
                    w.flags = flags & 0xb; // no INLINE bit: data are SGEs
                    if op.is_rdma() {
                        w.rkey = rkeys[*rkey as usize];
                        w.remote_addr = iovas[*rkey as usize].wrapping_add(*addr % 70_000);
                    }
                    if op.has_imm() {
                        w.imm_data = *imm;
                    }
                    if *imm % 5 == 0 && matches!(op, WqeOpcode::Send | WqeOpcode::RdmaWrite) {
                        w.data = WqeData::inline(&imm.to_le_bytes()).unwrap();
                    }
                    w.to_bytes()
                }
            };
            if aqp.sq.write(&bytes).is_err() {
                break;
            }
        }
        // Publish, possibly with a garbage producer index (testkit slots: CQ 0, SQ 1, RQ 2).
        let prod = aqp.sq.prod_pvt().wrapping_add(prod_skew);
        aqp.sq.publish();
        if prod_skew != 0 {
            let q = a.db.queue(1).unwrap();
            q.prod.store(prod, Ordering::Release);
        }
        dev.kick(a.id);
        // Let it run until it stops making progress: then tear the peer down so everything
        // flushes.
        let start = Instant::now();
        loop {
            let q = a.db.queue(1).unwrap();
            let done = q.cons.load(Ordering::Acquire) == q.prod.load(Ordering::Acquire);
            if done || dev.qp_state(a.id, aqp.num) == Ok(QpState::Error) || start.elapsed() > std::time::Duration::from_millis(200) {
                break;
            }
            std::thread::yield_now();
        }
        dev.destroy_qp(b.id, bqp.num).unwrap();
        let start = Instant::now();
        while dev.qp_state(a.id, aqp.num) != Ok(QpState::Error) {
            prop_assert!(start.elapsed() < HANG);
            std::thread::yield_now();
        }
        prop_assert_eq!(canary.read(0, 65536), vec![0xa5; 65536]);
        prop_assert_eq!(other_b.read(0, 4096), vec![0x5a; 4096]);
        // The device still works for others.
        let mut d = TestChannel::open(&dev, 4, ChannelMode::Bypass);
        let mut dcq = d.cq(&dev, 4);
        let mut dqp = d.qp(&dev, &dcq, &dcq, 4);
        dev.connect_qp(d.id, dqp.num, dqp.num).unwrap();
        let m = d.mr(&dev, 4096, access::ALL);
        dqp.post_send(&dev, &wqe(WqeOpcode::RdmaWrite, 1, &[m.sge(0, 8)], (m.iova + 8, m.keys.rkey), 0));
        prop_assert_eq!(dcq.wait(&dev).wr_id, 1);
        let _ = &mut bqp;
    }
}
