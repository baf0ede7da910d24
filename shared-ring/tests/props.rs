//! Property tests: random push/consume interleavings against a model, and slot formats that
//! round-trip and never panic on arbitrary bytes.
#![cfg(not(loom))]

use std::collections::VecDeque;

use proptest::prelude::*;

use shared_ring::abi::control::{
    CmInfoReply, CmTarget, Op, PrivData, Reply, Request, RequestRepr, ResponseRepr, Status,
    CM_SLOTS, CONTROL_SLOT_LEN,
};
use shared_ring::abi::cqe::{CqeRepr, CQE_LEN};
use shared_ring::abi::event::{EventRepr, EVENT_LEN};
use shared_ring::abi::page_dir::{PageList, PAGE_LIST_LEN};
use shared_ring::abi::wqe::{WqeRepr, WQE_LEN};
use shared_ring::abi::AbiError;
use shared_ring::cq::{CqPoller, CqWriter};
use shared_ring::doorbell::DoorbellPage;
use shared_ring::queue::{Consumer, Producer, QueueError};
use shared_ring::xen_ring::{BackRing, FrontRing, RingError};
use shared_ring::SharedRegion;

/// Longest op sequence (shorter under miri, which is ~1000x slower).
const MAX_OPS: usize = if cfg!(miri) { 30 } else { 120 };

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 256 },
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

#[derive(Debug, Clone)]
enum RingOp {
    Push(u8),
    Consume(u8),
    Respond(u8),
    Collect(u8),
    FinalBack,
    FinalFront,
}

fn ring_op() -> impl Strategy<Value = RingOp> {
    prop_oneof![
        (1u8..6).prop_map(RingOp::Push),
        (1u8..6).prop_map(RingOp::Consume),
        (1u8..6).prop_map(RingOp::Respond),
        (1u8..6).prop_map(RingOp::Collect),
        Just(RingOp::FinalBack),
        Just(RingOp::FinalFront),
    ]
}

proptest! {
    #![proptest_config(config())]

    /// Any interleaving of the four ring operations keeps FIFO order, never loses or invents
    /// an entry, and the notify decisions follow the hold-off rule of a simple model.
    #[test]
    fn xen_ring_interleavings(start in any::<u32>(), ops in prop::collection::vec(ring_op(), 1..MAX_OPS)) {
        let region = SharedRegion::alloc(64 + 8 * 8).unwrap();
        FrontRing::<8>::init(region.clone()).unwrap();
        // move both ends (and the shared indexes) to `start` to cover wrap-around
        for (off, v) in [(0, start), (8, start), (4, start.wrapping_add(1)), (12, start.wrapping_add(1))] {
            region.store_u32(off, v, std::sync::atomic::Ordering::Relaxed).unwrap();
        }
        let mut f = FrontRing::<8>::attach(region.clone(), start).unwrap();
        let mut b = BackRing::<8>::attach(region, start).unwrap();
        let size = f.size();
        let mut next_req = 0u64;
        let mut in_ring: VecDeque<u64> = VecDeque::new(); // requests pushed, not consumed
        let mut to_answer: VecDeque<u64> = VecDeque::new(); // consumed, not answered
        let mut answers: VecDeque<u64> = VecDeque::new(); // answered, not collected
        let (mut req_event, mut rsp_event) = (start.wrapping_add(1), start.wrapping_add(1));
        let (mut req_prod, mut rsp_prod) = (start, start);
        for op in ops {
            match op {
                RingOp::Push(n) => {
                    for _ in 0..n {
                        let free = size as usize - (in_ring.len() + to_answer.len() + answers.len());
                        let r = f.write_request(&next_req.to_le_bytes());
                        if free == 0 {
                            prop_assert_eq!(r.err(), Some(RingError::Full { size }));
                        } else {
                            prop_assert!(r.is_ok());
                            in_ring.push_back(next_req);
                            next_req += 1;
                        }
                    }
                    let old = req_prod;
                    req_prod = f.req_prod_pvt();
                    let want = req_prod.wrapping_sub(req_event) < req_prod.wrapping_sub(old);
                    prop_assert_eq!(f.push_requests_and_check_notify(), want);
                }
                RingOp::Consume(n) => {
                    for _ in 0..n {
                        match b.next_request().unwrap() {
                            Some(r) => {
                                let want = in_ring.pop_front();
                                prop_assert_eq!(Some(u64::from_le_bytes(r)), want);
                                to_answer.push_back(want.unwrap());
                            }
                            None => prop_assert!(in_ring.is_empty()),
                        }
                    }
                }
                RingOp::Respond(n) => {
                    for _ in 0..n {
                        match to_answer.pop_front() {
                            Some(v) => {
                                b.write_response(&(!v).to_le_bytes()).unwrap();
                                answers.push_back(v);
                            }
                            None => prop_assert_eq!(
                                b.write_response(&[0; 8]).err(),
                                Some(RingError::NoRequestOutstanding)
                            ),
                        }
                    }
                    let old = rsp_prod;
                    rsp_prod = b.rsp_prod_pvt();
                    let want = rsp_prod.wrapping_sub(rsp_event) < rsp_prod.wrapping_sub(old);
                    prop_assert_eq!(b.push_responses_and_check_notify(), want);
                }
                RingOp::Collect(n) => {
                    for _ in 0..n {
                        match f.next_response().unwrap() {
                            Some(r) => {
                                let want = answers.pop_front().unwrap();
                                prop_assert_eq!(u64::from_le_bytes(r), !want);
                            }
                            None => prop_assert!(answers.is_empty()),
                        }
                    }
                }
                RingOp::FinalBack => {
                    let pending = !in_ring.is_empty();
                    prop_assert_eq!(b.final_check_for_requests().unwrap(), pending);
                    if !pending {
                        req_event = b.req_cons().wrapping_add(1);
                    }
                }
                RingOp::FinalFront => {
                    let pending = !answers.is_empty();
                    prop_assert_eq!(f.final_check_for_responses().unwrap(), pending);
                    if !pending {
                        rsp_event = f.rsp_cons().wrapping_add(1);
                    }
                }
            }
        }
    }

    /// SPSC queue (SQ/RQ/event ring): FIFO, fullness and emptiness follow the model.
    #[test]
    fn spsc_queue_interleavings(ops in prop::collection::vec((any::<bool>(), 1u8..6), 1..MAX_OPS)) {
        let idx = SharedRegion::alloc(128).unwrap();
        let mem = SharedRegion::alloc(4 * 8).unwrap();
        let mut p = Producer::<8>::new(mem.slots(0, 4).unwrap(), idx.word(0).unwrap(), idx.word(64).unwrap(), 0);
        let mut c = Consumer::<8>::new(mem.slots(0, 4).unwrap(), idx.word(0).unwrap(), idx.word(64).unwrap(), 0);
        let mut model = VecDeque::new();
        let mut next = 0u64;
        for (produce, n) in ops {
            for _ in 0..n {
                if produce {
                    match p.write(&next.to_le_bytes()) {
                        Ok(_) => { model.push_back(next); next += 1; }
                        Err(QueueError::Full { .. }) => prop_assert_eq!(model.len(), 4),
                        Err(e) => return Err(TestCaseError::fail(e.to_string())),
                    }
                } else {
                    let got = c.pop().unwrap().map(u64::from_le_bytes);
                    prop_assert_eq!(got, if got.is_some() { model.pop_front() } else { None });
                    c.release();
                }
            }
            p.publish();
        }
    }

    /// SQ/RQ with phase bits: a by-phase consumer (the bypass engine) sees exactly the slots
    /// written, in order, over many passes, whatever the producer index says (it is never
    /// published here, or published with garbage); an index-following consumer (mediated mode)
    /// sees them only once published. Both hand slots out with the owner word zeroed.
    #[test]
    fn phased_queue_interleavings(ops in prop::collection::vec((any::<bool>(), 1u8..6), 1..MAX_OPS), garbage in any::<u32>(), by_phase in any::<bool>()) {
        let idx = SharedRegion::alloc(128).unwrap();
        let mem = SharedRegion::alloc(4 * 16).unwrap();
        let mut p = Producer::<16>::with_owner(mem.slots(0, 4).unwrap(), idx.word(0).unwrap(), idx.word(64).unwrap(), 0, 8);
        let mut c = Consumer::<16>::with_owner(mem.slots(0, 4).unwrap(), idx.word(0).unwrap(), idx.word(64).unwrap(), 0, 8, by_phase);
        let mut model = VecDeque::new();
        let mut published = 0usize;
        let mut next = 0u64;
        for (produce, n) in ops {
            for _ in 0..n {
                if produce {
                    let mut slot = [0xffu8; 16];
                    slot[..8].copy_from_slice(&next.to_le_bytes());
                    match p.write(&slot) {
                        Ok(_) => { model.push_back(next); next += 1; }
                        Err(QueueError::Full { .. }) => prop_assert_eq!(model.len(), 4),
                        Err(e) => return Err(TestCaseError::fail(e.to_string())),
                    }
                } else {
                    let visible = if by_phase { model.len() } else { published };
                    let got = c.pop().unwrap();
                    if visible == 0 {
                        prop_assert_eq!(got, None);
                    } else {
                        let got = got.unwrap();
                        prop_assert_eq!(&got[8..12], &[0u8; 4][..], "owner word handed out");
                        prop_assert_eq!(&got[12..], &[0xffu8; 4][..]);
                        prop_assert_eq!(Some(u64::from_le_bytes(got[..8].try_into().unwrap())), model.pop_front());
                        published = published.saturating_sub(1);
                    }
                    c.release();
                }
            }
            if by_phase {
                // The engine does not read the index: garbage there changes nothing.
                idx.word(0).unwrap().store(garbage, std::sync::atomic::Ordering::Release);
            } else {
                p.publish();
                published = model.len();
            }
        }
    }

    /// CQ: CQEs come out in order with the right phase over many passes; overrun exactly when
    /// the model says the CQ is full.
    #[test]
    fn cq_interleavings(ops in prop::collection::vec((any::<bool>(), 1u8..7), 1..MAX_OPS)) {
        let dbr = SharedRegion::alloc(4096).unwrap();
        let db = DoorbellPage::init(dbr, 1).unwrap();
        let mem = SharedRegion::alloc(4 * CQE_LEN).unwrap();
        let mut w = CqWriter::new(mem.slots(0, 4).unwrap(), db.cq(0).unwrap());
        let mut p = CqPoller::new(mem.slots(0, 4).unwrap(), db.cq(0).unwrap());
        let mut model = VecDeque::new();
        let mut next = 0u64;
        for (write, n) in ops {
            for _ in 0..n {
                if write {
                    let mut cqe = [0u8; CQE_LEN];
                    cqe[..8].copy_from_slice(&next.to_le_bytes());
                    cqe[24] = 1;
                    match w.write(&cqe) {
                        Ok(_) => { model.push_back(next); next += 1; }
                        Err(_) => prop_assert_eq!(model.len(), 4),
                    }
                } else {
                    let got = p.poll().unwrap().map(|c| c.wr_id);
                    prop_assert_eq!(got, model.pop_front());
                }
            }
        }
    }

    /// Slot parsers never panic on arbitrary bytes, and whatever parses re-emits to the same
    /// bytes (canonical forms).
    #[test]
    fn slot_parsers_are_total_and_canonical(bytes in prop::collection::vec(any::<u8>(), 64)) {
        let slot: [u8; CONTROL_SLOT_LEN] = bytes.clone().try_into().unwrap();
        if let Ok(r) = RequestRepr::parse(&slot) {
            prop_assert_eq!(r.to_bytes(), slot);
        }
        if let Ok(r) = ResponseRepr::parse(&slot) {
            prop_assert_eq!(r.to_bytes(), slot);
        }
        let wqe: [u8; WQE_LEN] = slot;
        if let Ok(r) = WqeRepr::from_bytes(&wqe) {
            prop_assert_eq!(WqeRepr::from_bytes(&r.to_bytes()).unwrap(), r);
        }
        let cqe: [u8; CQE_LEN] = bytes[..32].try_into().unwrap();
        if let Ok(r) = CqeRepr::from_bytes(&cqe) {
            let mut again = r.to_bytes();
            again[28..].copy_from_slice(&cqe[28..]);
            prop_assert_eq!(again, cqe);
        }
        let ev: [u8; EVENT_LEN] = bytes[..32].try_into().unwrap();
        if let Ok(r) = EventRepr::from_bytes(&ev) {
            prop_assert_eq!(r.to_bytes(), ev);
        }
        if let Ok(l) = PageList::parse(&bytes[..PAGE_LIST_LEN], u32::MAX) {
            let mut b = [0u8; PAGE_LIST_LEN];
            l.emit(&mut b);
            prop_assert_eq!(&b[..], &bytes[..PAGE_LIST_LEN]);
        }
    }

    /// Near-valid control requests (a valid op byte, the rest random) parse or fail cleanly.
    #[test]
    fn near_valid_requests(op in 1u16..26, req_id in any::<u32>(), args in prop::collection::vec(0u8..3, 56)) {
        let mut b = [0u8; CONTROL_SLOT_LEN];
        b[..4].copy_from_slice(&req_id.to_le_bytes());
        b[4..6].copy_from_slice(&op.to_le_bytes());
        b[8..].copy_from_slice(&args);
        if let Ok(r) = RequestRepr::parse(&b) {
            prop_assert_eq!(r.to_bytes(), b);
            prop_assert_eq!(r.req_id, req_id);
        }
    }

    /// Every connection-management request and reply survives emit → parse unchanged, and
    /// any one byte set in a place the op leaves unused is refused (canonical parsing).
    #[test]
    fn cm_slots_round_trip_and_refuse_stray_bytes(
        req_id in any::<u32>(),
        which in 0u8..7,
        h in any::<u32>(),
        qp in any::<u32>(),
        port in any::<u16>(),
        addr in any::<[u8; 16]>(),
        slot in 0u8..CM_SLOTS,
        len in any::<u8>(),
        stray in 8usize..64,
        stray_val in 1u8..=255,
    ) {
        let private = PrivData { slot, len };
        let request = match which {
            0 => Request::Listen { port, backlog: qp, addr },
            1 => Request::Connect { qp: h, port, addr, remote_qpn: 0, private },
            2 => Request::Accept { request: h, qp, private },
            3 => Request::Reject { request: h, private },
            4 => Request::Disconnect { qp: h },
            5 => Request::CloseListener { listener: h },
            _ => Request::CmInfo {
                target: if qp % 2 == 0 { CmTarget::Request(h) } else { CmTarget::Qp(h) },
                slot,
            },
        };
        let r = RequestRepr { req_id, request };
        let b = r.to_bytes();
        prop_assert_eq!(RequestRepr::parse(&b).unwrap(), r);
        // A byte the encoding leaves zero, made non-zero, never parses to the same request.
        if b[stray] == 0 {
            let mut bad = b;
            bad[stray] = stray_val;
            match RequestRepr::parse(&bad) {
                Ok(again) => prop_assert_ne!(again, r),
                Err(e) => {
                    let clean = matches!(
                        e,
                        AbiError::Reserved { .. } | AbiError::OutOfRange { .. } | AbiError::Unknown { .. }
                    );
                    prop_assert!(clean, "unexpected error {:?}", e);
                }
            }
        }

        let reply = match which {
            0 => (Op::Listen, Reply::Listener { listener: h, port }),
            1 => (Op::CmInfo, Reply::CmInfo(CmInfoReply {
                local_addr: addr,
                local_port: port,
                remote_addr: [len; 16],
                remote_port: port ^ 1,
                private_len: len,
                ird: port ^ 2,
                ord: port ^ 3,
            })),
            _ => (Op::CmPage, Reply::CmPage { gref: h, slots: u32::from(CM_SLOTS), slot_len: 256 }),
        };
        let rsp = ResponseRepr { req_id, op: reply.0, status: Status::Ok, reply: reply.1 };
        let b = rsp.to_bytes();
        prop_assert_eq!(ResponseRepr::parse(&b).unwrap(), rsp);
        if b[stray] == 0 && stray >= 12 {
            let mut bad = b;
            bad[stray] = stray_val;
            match ResponseRepr::parse(&bad) {
                Ok(again) => prop_assert_ne!(again, rsp),
                Err(e) => {
                    let reserved = matches!(e, AbiError::Reserved { .. });
                    prop_assert!(reserved, "unexpected error {:?}", e);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(config())]

    /// `SharedRegion::crc32c_append` over any run of shared bytes — any start alignment, any
    /// length, any seed — is the `crc32c` crate's CRC of the same bytes, whichever path the
    /// CPU takes (the three-way `crc32` rounds and their joins, or the table).
    #[test]
    fn crc32c_append_is_the_crc32c_crates(
        seed in any::<u32>(),
        off in 0usize..96,
        len in prop_oneof![0usize..1100, 0usize..(if cfg!(miri) { 2048 } else { 70_000 })],
        fill in any::<u64>(),
    ) {
        // Regions are page-aligned and a multiple of 4 bytes long: `off` gives every start
        // alignment.
        let r = SharedRegion::alloc((off + len + 4) & !3).unwrap();
        let mut x = fill | 1;
        let data: Vec<u8> = (0..off + len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        r.write_bytes(0, &data).unwrap();
        let want = crc32c::crc32c_append(seed, &data[off..]);
        prop_assert_eq!(r.crc32c_append(seed, off, len).unwrap(), want);
    }
}
