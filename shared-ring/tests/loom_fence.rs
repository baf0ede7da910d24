//! Shows that loom can fail the hold-off models: with the full fence between publishing a
//! producer index and reading the peer's event index turned into a no-op (Release/Acquire
//! only), the request model loses a wake-up and loom reports the deadlock.
//! A separate test binary, because the switch is process-wide.
#![cfg(loom)]

use loom::sync::Notify;
use loom::thread;
use std::sync::Arc;

use shared_ring::mem::loom_knobs::disable_full_fences;
use shared_ring::xen_ring::{BackRing, FrontRing};
use shared_ring::SharedRegion;

#[test]
#[should_panic(expected = "deadlock")]
fn without_the_full_fence_a_wakeup_is_lost() {
    disable_full_fences(true);
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        const N: u32 = 2;
        let region = SharedRegion::alloc(64 + 2 * 4).unwrap();
        let mut front = FrontRing::<4>::init(region.clone()).unwrap();
        let mut back = BackRing::<4>::new(region).unwrap();
        let evtchn = Arc::new(Notify::new());
        let e2 = evtchn.clone();
        let backend = thread::spawn(move || {
            let mut seen = 0;
            loop {
                while let Some(r) = back.next_request().unwrap() {
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
            front.write_request(&i.to_le_bytes()).unwrap();
            if front.push_requests_and_check_notify() {
                evtchn.notify();
            }
        }
        backend.join().unwrap();
    });
}
