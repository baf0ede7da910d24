//! A hostile peer: garbage indexes, overflowing producer counts, torn and concurrent writes.
//! Every outcome must be a value or a typed error: no panic, no out-of-bounds access (miri
//! runs this file to check the latter).
#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use shared_ring::abi::control::{RequestRepr, CONTROL_SLOT_LEN};
use shared_ring::abi::cqe::CQE_LEN;
use shared_ring::abi::wqe::{WqeRepr, WQE_LEN};
use shared_ring::cq::{CqError, CqWriter};
use shared_ring::doorbell::{field as db_field, DoorbellError, DoorbellPage};
use shared_ring::queue::{Consumer, QueueError};
use shared_ring::xen_ring::{header, BackRing, FrontRing, RingError};
use shared_ring::SharedRegion;

const ITERS: u32 = if cfg!(miri) { 40 } else { 20_000 };

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 16) as u32
    }
}

#[test]
fn overflowing_producer_index_is_a_protocol_error() {
    let region = SharedRegion::alloc(4096).unwrap();
    FrontRing::<64>::init(region.clone()).unwrap();
    let mut back = BackRing::<64>::new(region.clone()).unwrap();
    // 33 requests claimed on a 32-entry ring
    region
        .store_u32(header::REQ_PROD, 33, Ordering::Release)
        .unwrap();
    assert_eq!(
        back.next_request(),
        Err(RingError::ProducerOverflow {
            prod: 33,
            cons: 0,
            size: 32
        })
    );
    // exactly full is legal
    region
        .store_u32(header::REQ_PROD, 32, Ordering::Release)
        .unwrap();
    for _ in 0..32 {
        assert!(back.next_request().unwrap().is_some());
    }
    // the consumer cannot run ahead of its responses even if the producer index says so
    region
        .store_u32(header::REQ_PROD, 40, Ordering::Release)
        .unwrap();
    assert_eq!(
        back.next_request().err(),
        Some(RingError::ProducerOverflow {
            prod: 40,
            cons: 32,
            size: 32
        })
    );
    // producer moved backwards
    region
        .store_u32(header::REQ_PROD, 5, Ordering::Release)
        .unwrap();
    assert!(matches!(
        back.next_request(),
        Err(RingError::ProducerBackwards { .. })
    ));
    assert!(matches!(
        back.final_check_for_requests(),
        Err(RingError::ProducerBackwards { .. })
    ));
}

#[test]
fn garbage_producer_indexes_never_yield_more_than_the_ring_holds() {
    let mut rng = Rng(0x1234_5678);
    for _ in 0..ITERS {
        let region = SharedRegion::alloc(4096).unwrap();
        FrontRing::<64>::init(region.clone()).unwrap();
        let start = rng.next();
        let back = BackRing::<64>::attach(region.clone(), start).unwrap();
        let prod = match rng.next() % 3 {
            0 => rng.next(),
            1 => start.wrapping_add(rng.next() % 64),
            _ => start.wrapping_sub(rng.next() % 64),
        };
        region
            .store_u32(header::REQ_PROD, prod, Ordering::Release)
            .unwrap();
        match back.unconsumed_requests() {
            Ok(n) => {
                assert!(n <= back.size());
                assert_eq!(n, prod.wrapping_sub(start));
            }
            Err(RingError::ProducerOverflow { .. } | RingError::ProducerBackwards { .. }) => {
                assert!(prod.wrapping_sub(start) > back.size());
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
}

#[test]
fn front_end_rejects_overflowing_response_producer() {
    let region = SharedRegion::alloc(4096).unwrap();
    let mut front = FrontRing::<64>::init(region.clone()).unwrap();
    region
        .store_u32(header::RSP_PROD, 1000, Ordering::Release)
        .unwrap();
    assert!(matches!(
        front.next_response(),
        Err(RingError::ProducerOverflow { .. })
    ));
    assert_eq!(
        front.final_check_for_responses().err(),
        Some(RingError::ProducerOverflow {
            prod: 1000,
            cons: 0,
            size: 32
        })
    );
}

/// A guest scribbling over the whole ring page while the backend consumes: the backend only
/// ever sees copies, and every step is a value or a typed error.
#[test]
fn concurrent_scribbling_over_the_ring_page() {
    let region = SharedRegion::alloc(4096).unwrap();
    FrontRing::<64>::init(region.clone()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let scribbler = {
        let region = region.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rng = Rng(99);
            while !stop.load(Ordering::Relaxed) {
                let off = (rng.next() as usize % 1024) * 4;
                let v = if rng.next() % 4 == 0 {
                    rng.next() % 40
                } else {
                    rng.next()
                };
                region.store_u32(off, v, Ordering::Relaxed).unwrap();
            }
        })
    };
    let mut back = BackRing::<CONTROL_SLOT_LEN>::new(region).unwrap();
    let (mut ok, mut errs) = (0u32, 0u32);
    // At least ITERS steps, and on until the scribbler has been seen at least once (on a
    // loaded machine it may not have been scheduled yet); the deadline only guards a hang.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut steps = 0;
    while steps < ITERS || (ok + errs == 0 && !cfg!(miri) && std::time::Instant::now() < deadline) {
        steps += 1;
        match back.next_request() {
            Ok(Some(slot)) => {
                // parse may fail, but only with a typed error
                let _ = RequestRepr::parse(&slot);
                if back.write_response(&slot).is_ok() {
                    back.push_responses_and_check_notify();
                }
                ok += 1;
            }
            Ok(None) => {
                let _ = back.final_check_for_requests();
            }
            Err(_) => {
                // a real backend closes the channel here
                errs += 1;
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    scribbler.join().unwrap();
    // (under miri the scribbler may barely run; natively it always hits the ring)
    assert!(cfg!(miri) || ok + errs > 0);
}

/// Torn WQE: a guest rewrites a WQE word by word while the engine copies it out.
#[test]
fn torn_wqe_writes_parse_or_fail_cleanly() {
    let mem = SharedRegion::alloc(4 * WQE_LEN).unwrap();
    let dbr = SharedRegion::alloc(4096).unwrap();
    let db = DoorbellPage::init(dbr.clone(), 1).unwrap();
    let q = db.queue(0).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let mem = mem.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rng = Rng(7);
            while !stop.load(Ordering::Relaxed) {
                let off = (rng.next() as usize % (4 * WQE_LEN / 4)) * 4;
                mem.store_u32(off, rng.next() & 0x0707_0307, Ordering::Relaxed)
                    .unwrap();
            }
        })
    };
    let mut engine = Consumer::<WQE_LEN>::new(mem.slots(0, 4).unwrap(), q.prod, q.cons, 0);
    let mut rng = Rng(3);
    for _ in 0..ITERS {
        // the guest also publishes garbage producer indexes
        dbr.store_u32(
            db_field::SLOT_BASE + db_field::QUEUE_PROD,
            engine.cons_pvt().wrapping_add(rng.next() % 8),
            Ordering::Release,
        )
        .unwrap();
        match engine.pop() {
            Ok(Some(w)) => {
                let _ = WqeRepr::from_bytes(&w);
                engine.release();
            }
            Ok(None) => {}
            Err(QueueError::BadPeerIndex { distance, size, .. }) => assert!(distance > size),
            Err(e) => panic!("unexpected {e}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
}

#[test]
fn hostile_cq_consumer_index_and_arm_word() {
    let dbr = SharedRegion::alloc(4096).unwrap();
    let db = DoorbellPage::init(dbr.clone(), 1).unwrap();
    let mem = SharedRegion::alloc(4 * CQE_LEN).unwrap();
    let mut w = CqWriter::new(mem.slots(0, 4).unwrap(), db.cq(0).unwrap());
    let cons_off = db_field::SLOT_BASE + db_field::CQ_CONS;
    let arm_off = db_field::SLOT_BASE + db_field::CQ_ARM;
    for _ in 0..4 {
        w.write(&[0u8; CQE_LEN]).unwrap();
    }
    // consumer index claiming more consumed than produced
    dbr.store_u32(cons_off, 10, Ordering::Release).unwrap();
    assert!(matches!(
        w.write(&[0u8; CQE_LEN]),
        Err(CqError::BadConsumerIndex { .. })
    ));
    // an honest "nothing consumed" is an overrun, not a protocol error
    dbr.store_u32(cons_off, 0, Ordering::Release).unwrap();
    assert_eq!(w.write(&[0u8; CQE_LEN]), Err(CqError::Overrun { size: 4 }));
    // a garbage arm word yields at most one notification per distinct value
    dbr.store_u32(arm_off, 0xdead_bee0, Ordering::Relaxed)
        .unwrap();
    assert!(w.notify_needed(true));
    assert!(!w.notify_needed(true));
    assert!(!w.notify_needed(false));
}

#[test]
fn garbage_doorbell_page_is_rejected_or_bounded() {
    let r = SharedRegion::alloc(4096).unwrap();
    assert_eq!(
        DoorbellPage::open(r.clone(), 1).err(),
        Some(DoorbellError::BadMagic { found: 0 })
    );
    DoorbellPage::init(r.clone(), 1).unwrap();
    r.store_u32(db_field::SLOTS, u32::MAX, Ordering::Relaxed)
        .unwrap();
    let db = DoorbellPage::open(r, 1).unwrap();
    assert_eq!(db.slots(), 31);
    assert_eq!(
        db.queue(u32::MAX).err(),
        Some(DoorbellError::NoSuchSlot {
            slot: u32::MAX,
            slots: 31
        })
    );
    assert_eq!(
        db.cq(31).err(),
        Some(DoorbellError::NoSuchSlot {
            slot: 31,
            slots: 31
        })
    );
}
