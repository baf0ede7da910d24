//! Loom models: no lost wake-up in the notification hold-off of the Xen ring (both
//! directions), the engine's "kick me" doorbell word and CQ arming; no torn CQE reads.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p shared-ring --release --test loom`.
//! A blocked thread that nobody will notify is a deadlock, which loom reports as a failure.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use loom::sync::Notify;
use loom::thread;
use std::sync::Arc;

use shared_ring::abi::cqe::{CqeOpcode, CqeRepr, CqeStatus, CQE_LEN};
use shared_ring::cq::{CqPoller, CqWriter};
use shared_ring::doorbell::DoorbellPage;
use shared_ring::queue::{Consumer, Producer};
use shared_ring::xen_ring::{header, BackRing, FrontRing};
use shared_ring::{SharedRegion, SharedWord};

fn model(f: impl Fn() + Sync + Send + 'static) {
    model_bounded(None, f);
}

/// `model` with at most `bound` preemptions per execution (None: exhaustive). Models of
/// three threads besides the main one are bounded: exhaustive, one ran for over 15 minutes.
fn model_bounded(bound: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = bound;
    b.check(f);
}

/// Ring of two 4-byte entries.
fn small_ring() -> SharedRegion {
    SharedRegion::alloc(64 + 2 * 4).unwrap()
}

/// Front end posts requests and notifies only when `push_requests_and_check_notify` says so;
/// the back end consumes and sleeps only when `final_check_for_requests` says nothing is
/// pending. Every request must be consumed.
#[test]
fn ring_requests_have_no_lost_wakeup() {
    model(|| {
        const N: u32 = 2;
        let region = small_ring();
        let mut front = FrontRing::<4>::init(region.clone()).unwrap();
        let mut back = BackRing::<4>::new(region).unwrap();
        let evtchn = Arc::new(Notify::new());
        let e2 = evtchn.clone();
        let backend = thread::spawn(move || {
            let mut seen = 0;
            loop {
                while let Some(r) = back.next_request().unwrap() {
                    assert_eq!(u32::from_le_bytes(r), seen + 100, "payload visible");
                    seen += 1;
                    back.write_response(&r).unwrap();
                }
                if seen == N {
                    break;
                }
                if !back.final_check_for_requests().unwrap() {
                    e2.wait();
                }
            }
        });
        for i in 0..N {
            front.write_request(&(100 + i).to_le_bytes()).unwrap();
            if front.push_requests_and_check_notify() {
                evtchn.notify();
            }
        }
        backend.join().unwrap();
    });
}

/// Preemptions per execution in `ring_requests_passed_on_by_the_engine_have_no_lost_wakeup`.
const PASSED_ON_BOUND: usize = 3;

/// The daemon's channel thread hands the channel's event channel to the device's engine
/// (backend `control::channel::EvtchnKicks`): the engine consumes every notification and
/// wakes the thread only when `req_prod` differs from the `req_cons` the thread published
/// after its last `final_check_for_requests`. No request may be left with the thread asleep.
#[test]
fn ring_requests_passed_on_by_the_engine_have_no_lost_wakeup() {
    model_bounded(Some(PASSED_ON_BOUND), || {
        const N: u32 = 2;
        let region = small_ring();
        let mut front = FrontRing::<4>::init(region.clone()).unwrap();
        let mut back = BackRing::<4>::new(region.clone()).unwrap();
        let evtchn = Arc::new(Notify::new());
        let waker = Arc::new(Notify::new());
        let served = Arc::new(AtomicU32::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let engine = {
            let (evtchn, waker, served, stop) =
                (evtchn.clone(), waker.clone(), served.clone(), stop.clone());
            thread::spawn(move || loop {
                evtchn.wait();
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let prod = region
                    .load_u32(header::REQ_PROD, Ordering::Acquire)
                    .unwrap();
                if prod != served.load(Ordering::Acquire) {
                    waker.notify();
                }
            })
        };
        let channel = thread::spawn(move || {
            let mut seen = 0;
            loop {
                while let Some(r) = back.next_request().unwrap() {
                    assert_eq!(u32::from_le_bytes(r), seen + 100, "payload visible");
                    seen += 1;
                }
                if seen == N {
                    break;
                }
                if !back.final_check_for_requests().unwrap() {
                    served.store(back.req_cons(), Ordering::Release);
                    waker.wait();
                }
            }
        });
        for i in 0..N {
            front.write_request(&(100 + i).to_le_bytes()).unwrap();
            if front.push_requests_and_check_notify() {
                evtchn.notify();
            }
        }
        channel.join().unwrap();
        stop.store(true, Ordering::SeqCst);
        evtchn.notify();
        engine.join().unwrap();
    });
}

/// The mirror image: the back end answers requests that are already queued, notifying per
/// `push_responses_and_check_notify`; the front end sleeps per `final_check_for_responses`.
#[test]
fn ring_responses_have_no_lost_wakeup() {
    model(|| {
        const N: u32 = 2;
        let region = small_ring();
        let mut front = FrontRing::<4>::init(region.clone()).unwrap();
        for i in 0..N {
            front.write_request(&i.to_le_bytes()).unwrap();
        }
        front.push_requests();
        let mut back = BackRing::<4>::new(region).unwrap();
        let evtchn = Arc::new(Notify::new());
        let e2 = evtchn.clone();
        let frontend = thread::spawn(move || {
            let mut seen = 0;
            loop {
                while let Some(r) = front.next_response().unwrap() {
                    assert_eq!(u32::from_le_bytes(r), seen + 200);
                    seen += 1;
                }
                if seen == N {
                    break;
                }
                if !front.final_check_for_responses().unwrap() {
                    e2.wait();
                }
            }
        });
        for _ in 0..N {
            let r = back.next_request().unwrap().unwrap();
            let v = u32::from_le_bytes(r) + 200;
            back.write_response(&v.to_le_bytes()).unwrap();
            if back.push_responses_and_check_notify() {
                evtchn.notify();
            }
        }
        frontend.join().unwrap();
    });
}

/// Frontend posts two WQEs into a 2-slot queue and kicks only when the engine's sleep word says
/// so; the engine drains, announces sleep, re-checks, and blocks. Every WQE must be executed,
/// with the body the frontend wrote. `queues` builds the two ends over the slots and the
/// doorbell slot's index words.
fn kick_model<const N: usize>(
    queues: impl Fn(&SharedRegion, SharedWord, SharedWord) -> (Producer<N>, Consumer<N>)
        + Sync
        + Send
        + 'static,
) {
    kick_model_with(
        queues,
        |p: &mut Producer<N>, s: &[u8; N]| {
            p.write(s).unwrap();
        },
        |c: &mut Consumer<N>| c.pop().unwrap(),
    )
}

/// [`kick_model`] with the producer's slot write given (`Producer::write` or `write_words`)
/// and the engine's pop (`Consumer::pop`, or `pop_words` with the words turned back into
/// bytes).
fn kick_model_with<const N: usize>(
    queues: impl Fn(&SharedRegion, SharedWord, SharedWord) -> (Producer<N>, Consumer<N>)
        + Sync
        + Send
        + 'static,
    write: fn(&mut Producer<N>, &[u8; N]),
    pop: fn(&mut Consumer<N>) -> Option<[u8; N]>,
) {
    model(move || {
        const WQES: u8 = 2;
        let slot = |i: u8| {
            let mut s = [0u8; N];
            s[0] = 7 + i;
            s
        };
        let dbr = SharedRegion::alloc(256 + 128).unwrap();
        let db = DoorbellPage::init(dbr, 1).unwrap();
        let q = db.queue(0).unwrap();
        let mem = SharedRegion::alloc(2 * N).unwrap();
        let (mut sq, mut engine_q) = queues(&mem, q.prod, q.cons);
        let mut engine_word = db.engine_sleep().unwrap();
        let mut front_word = db.engine_kick().unwrap();
        let evtchn = Arc::new(Notify::new());
        let e2 = evtchn.clone();
        let engine = thread::spawn(move || {
            let mut done = 0;
            loop {
                while let Some(w) = pop(&mut engine_q) {
                    assert_eq!(w, slot(done));
                    done += 1;
                    engine_q.release();
                }
                if done == WQES {
                    break;
                }
                engine_word.prepare_sleep();
                if engine_q.available().unwrap() > 0 {
                    engine_word.wake();
                    continue;
                }
                e2.wait();
                engine_word.wake();
            }
        });
        for i in 0..WQES {
            write(&mut sq, &slot(i));
            if sq.publish_and_check_kick(&mut front_word) {
                evtchn.notify();
            }
        }
        engine.join().unwrap();
    });
}

/// The kick protocol with an engine that follows the producer index (mediated mode's way).
#[test]
fn doorbell_kick_has_no_lost_wakeup() {
    kick_model::<4>(|mem, prod, cons| {
        (
            Producer::new(mem.slots(0, 2).unwrap(), prod.clone(), cons.clone(), 0),
            Consumer::new(mem.slots(0, 2).unwrap(), prod, cons, 0),
        )
    });
}

/// The same with the bypass engine's by-phase consumer: the engine polls the next WQE's owner
/// word, not the producer index, before sleeping and after; it must see every WQE's body.
/// (The phase flip on later passes is the CQ's rule, covered by the `phased_queue_*`
/// proptest; a wrapping producer would spin, which loom cannot explore.)
#[test]
fn doorbell_kick_by_phase_has_no_lost_wakeup_and_no_torn_wqe() {
    kick_model::<8>(phased_queues);
}

/// The bypass SQ's two ends: the owner word at byte 4 of each 8-byte slot, the engine's end
/// polling it by phase.
fn phased_queues(
    mem: &SharedRegion,
    prod: SharedWord,
    cons: SharedWord,
) -> (Producer<8>, Consumer<8>) {
    (
        Producer::with_owner(mem.slots(0, 2).unwrap(), prod.clone(), cons.clone(), 0, 4),
        Consumer::with_owner(mem.slots(0, 2).unwrap(), prod, cons, 0, 4, true),
    )
}

/// Posts a slot as the frontend does, stored as its words (`Producer::write_words`).
fn write_as_words(p: &mut Producer<8>, s: &[u8; 8]) {
    let w = |i: usize| u32::from_ne_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    p.write_words(&[w(0), w(4)]).unwrap();
}

/// The same with the slots written by `Producer::write_words` (the frontend's post path): the
/// engine must still never see a published phase before the body.
#[test]
fn doorbell_kick_by_phase_with_words_has_no_lost_wakeup_and_no_torn_wqe() {
    kick_model_with::<8>(phased_queues, write_as_words, |c| c.pop().unwrap());
}

/// The same with the engine's SQ path on both ends: the frontend writes words and the engine
/// pops words (`Consumer::pop_words`, each word loaded once): it must never see a published
/// phase before the body.
#[test]
fn doorbell_kick_by_phase_popping_words_has_no_lost_wakeup_and_no_torn_wqe() {
    kick_model_with::<8>(phased_queues, write_as_words, |c| {
        let mut w = [0u32; 2];
        c.pop_words(&mut w).unwrap().then(|| {
            let (a, b) = (w[0].to_ne_bytes(), w[1].to_ne_bytes());
            [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
        })
    });
}

fn cqe(wr_id: u64) -> [u8; CQE_LEN] {
    CqeRepr {
        wr_id,
        status: CqeStatus::Success,
        opcode: CqeOpcode::RdmaWrite,
        byte_len: 64,
        imm_data: 0,
        qp_num: 3,
        vendor_err: 0,
        flags: 0,
    }
    .to_bytes()
}

/// The backend writes CQEs and notifies only when the CQ is armed; the application polls,
/// arms, and blocks only if no CQE arrived meanwhile. Every CQE must be seen, untorn.
#[test]
fn cq_arm_has_no_lost_wakeup_and_no_torn_cqe() {
    model(|| {
        const N: u64 = 2;
        let dbr = SharedRegion::alloc(256 + 128).unwrap();
        let db = DoorbellPage::init(dbr, 1).unwrap();
        let mem = SharedRegion::alloc(2 * CQE_LEN).unwrap();
        let mut w = CqWriter::new(mem.slots(0, 2).unwrap(), db.cq(0).unwrap());
        let mut p = CqPoller::new(mem.slots(0, 2).unwrap(), db.cq(0).unwrap());
        let evtchn = Arc::new(Notify::new());
        let e2 = evtchn.clone();
        let app = thread::spawn(move || {
            let mut seen = 0;
            loop {
                while let Some(c) = p.poll().unwrap() {
                    assert_eq!(c.wr_id, seen + 1);
                    assert_eq!((c.byte_len, c.qp_num), (64, 3), "CQE body complete");
                    seen += 1;
                }
                if seen == N {
                    break;
                }
                if !p.arm(false) {
                    e2.wait();
                }
            }
        });
        for i in 0..N {
            w.write(&cqe(i + 1)).unwrap();
            if w.notify_needed(false) {
                evtchn.notify();
            }
        }
        app.join().unwrap();
    });
}

/// A CQ smaller than the number of completions: the writer must wait for the poller's
/// consumer index (overrun is reported, never overwritten), and phases flip correctly.
#[test]
fn cq_wraps_without_overwriting_unconsumed_cqes() {
    model(|| {
        let dbr = SharedRegion::alloc(256 + 128).unwrap();
        let db = DoorbellPage::init(dbr, 1).unwrap();
        let mem = SharedRegion::alloc(CQE_LEN).unwrap();
        let mut w = CqWriter::new(mem.slots(0, 1).unwrap(), db.cq(0).unwrap());
        let mut p = CqPoller::new(mem.slots(0, 1).unwrap(), db.cq(0).unwrap());
        let app = thread::spawn(move || {
            let mut seen = 0;
            while seen < 2 {
                match p.poll().unwrap() {
                    Some(c) => {
                        assert_eq!(c.wr_id, seen + 1);
                        seen += 1;
                    }
                    None => thread::yield_now(),
                }
            }
        });
        w.write(&cqe(1)).unwrap();
        while w.write(&cqe(2)).is_err() {
            thread::yield_now();
        }
        app.join().unwrap();
    });
}

/// A model of the backend's per-engine key cache (`backend/src/device/mr.rs`, `KeyCache`; the
/// backend does not build under loom, so the protocol is modelled here): an engine uses the
/// region it cached for a key only while the region's `dead` flag is clear, and
/// `KeyTable::remove` sets the flag (under the table's lock) before the deregistration returns.
/// The cached region is held strongly here — the case where a segment of a message in pieces
/// keeps it alive, so the cache's `Weak` still upgrades. A lookup that starts after the
/// deregistration returned (`done`, which the guest learns before it posts again) must miss,
/// on a cache hit as on the table.
#[test]
fn key_cache_misses_a_key_deregistered_before_the_lookup() {
    use loom::sync::atomic::AtomicBool;
    use loom::sync::Mutex;
    use std::sync::atomic::Ordering::{Acquire, Release};

    struct Mr {
        dead: AtomicBool,
    }
    model(|| {
        let mr = loom::sync::Arc::new(Mr {
            dead: AtomicBool::new(false),
        });
        let table = loom::sync::Arc::new(Mutex::new(Some(mr.clone())));
        let done = loom::sync::Arc::new(AtomicBool::new(false));
        let (t2, d2) = (table.clone(), done.clone());
        let control = thread::spawn(move || {
            if let Some(m) = t2.lock().unwrap().take() {
                m.dead.store(true, Release);
            }
            d2.store(true, Release);
        });
        let cached = mr;
        for _ in 0..2 {
            let after_dereg = done.load(Acquire);
            let hit = !cached.dead.load(Acquire);
            let found = hit || table.lock().unwrap().is_some();
            if after_dereg {
                assert!(!found, "a key resolved after its deregistration returned");
            }
        }
        control.join().unwrap();
    });
}
