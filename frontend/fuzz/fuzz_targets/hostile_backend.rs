//! A hostile backend must not crash a guest: everything the frontend reads from memory the
//! backend writes, on arbitrary bytes, through the frontend's read paths.
//!
//! * the doorbell page header (`DoorbellPage::open`, with the CQ slot the backend named),
//! * the CQ ring (`CqPoller` polling as `CompletionQueue::poll` does in bypass mode: raw copy,
//!   then `CqeRepr::from_bytes`, an error ending the poll; interleaved with `arm`),
//! * the event ring (`event_ring::consumer` drained as the channel's `pump_events` does, each
//!   entry through `EventRepr::from_bytes` into the public `vrdma::AsyncEvent`),
//! * mediated `PollCq` replies (the response slot, then the CQE body it carries).
#![no_main]

use libfuzzer_sys::fuzz_target;
use shared_ring::abi::control::{Reply, ResponseRepr, CONTROL_SLOT_LEN};
use shared_ring::abi::cqe::{self, CqeRepr, CQE_LEN};
use shared_ring::abi::event::{EventRepr, EVENT_LEN};
use shared_ring::cq::CqPoller;
use shared_ring::doorbell::DoorbellPage;
use shared_ring::event_ring::{self, EVENT_RING_LEN, EVENT_SLOTS};
use shared_ring::{SharedRegion, PAGE_SIZE, PROTOCOL_VERSION};

/// Copies `bytes` into `p` at `offset`, zero-padded to the 4-byte multiple shared memory takes.
fn fill(p: &SharedRegion, offset: usize, bytes: &[u8]) {
    let mut v = bytes.to_vec();
    v.resize(bytes.len().next_multiple_of(4), 0);
    p.write(offset, &v).unwrap();
}
/// Splits off the next `n` input bytes (fewer at the end).
fn take<'a>(data: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, tail) = data.split_at(n.min(data.len()));
    *data = tail;
    head
}

fn page_from(bytes: &[u8]) -> SharedRegion {
    let p = SharedRegion::alloc(PAGE_SIZE).unwrap();
    fill(&p, 0, bytes);
    p
}

fn cq_poll(data: &mut &[u8]) {
    let ctl = take(data, 3);
    let log2 = u32::from(ctl.first().copied().unwrap_or(0)) % 8;
    let slot = u32::from(ctl.get(1).copied().unwrap_or(0));
    let arm_every = usize::from(ctl.get(2).copied().unwrap_or(0)) % 7 + 1;

    // A doorbell page the backend wrote; a header the frontend rejects ends the channel,
    // so polling then goes on over a well-formed page to reach the CQ code.
    let db_page = page_from(take(data, 256));
    let db = match DoorbellPage::open(db_page, PROTOCOL_VERSION) {
        Ok(db) => {
            assert!(db.slots() as usize <= PAGE_SIZE / 128);
            db.cq(slot).ok()
        }
        Err(_) => None,
    };
    let db = db.unwrap_or_else(|| {
        DoorbellPage::init(SharedRegion::alloc(PAGE_SIZE).unwrap(), PROTOCOL_VERSION)
            .unwrap()
            .cq(0)
            .unwrap()
    });

    let size = 1usize << log2;
    let ring = SharedRegion::alloc(size * CQE_LEN).unwrap();
    fill(&ring, 0, take(data, size * CQE_LEN));
    let mut poller = CqPoller::new(ring.slots(0, size).unwrap(), db);
    // Each CQE is consumed at most once per pass; bound the passes.
    for i in 0..4 * size {
        if i % arm_every == 0 {
            poller.arm(i % 2 == 0);
        }
        let Some(raw) = poller.poll_raw() else {
            break;
        };
        match CqeRepr::from_bytes(&raw) {
            Ok(c) => {
                let again = c.to_bytes();
                assert_eq!(
                    CqeRepr::from_bytes(&again).expect("an emitted CQE parses"),
                    c
                );
                assert_eq!(&again[..cqe::CQE_BODY_LEN], &raw[..cqe::CQE_BODY_LEN]);
            }
            Err(_) => break,
        }
    }
}

fn events(data: &mut &[u8]) {
    let page = SharedRegion::alloc(EVENT_RING_LEN).unwrap();
    fill(&page, 0, take(data, EVENT_RING_LEN));
    let mut c = event_ring::consumer(&page).unwrap();
    let mut n = 0;
    while let Ok(Some(raw)) = c.pop() {
        n += 1;
        assert!(n <= EVENT_SLOTS, "never more events than the ring holds");
        if let Ok(ev) = EventRepr::from_bytes(&raw) {
            assert_eq!(EventRepr::from_bytes(&ev.to_bytes()).unwrap(), ev);
            let ev = vrdma::AsyncEvent::from(ev);
            let _ = format!("{ev:?}");
        }
        let _: [u8; EVENT_LEN] = raw;
    }
    c.release();
}

fn mediated_poll(data: &mut &[u8]) {
    let slot = take(data, CONTROL_SLOT_LEN);
    if let Ok(ResponseRepr {
        reply: Reply::Poll(Some(body)),
        ..
    }) = ResponseRepr::parse(slot)
    {
        let mut b = [0u8; CQE_LEN];
        b.copy_from_slice(&body);
        b[cqe::field::OWNER..].fill(0);
        let _ = CqeRepr::from_bytes(&b);
    }
}

fuzz_target!(|input: &[u8]| {
    let mut data = input;
    // The first byte orders the three readers, so each can get the bulk of the input.
    let order = take(&mut data, 1).first().copied().unwrap_or(0) % 3;
    for k in 0..3 {
        match (order + k) % 3 {
            0 => cq_poll(&mut data),
            1 => events(&mut data),
            _ => mediated_poll(&mut data),
        }
    }
});
