//! Control-ring slots on arbitrary bytes, from both sides. The backend reads requests out of a
//! ring page whose header and slots are the input (a guest writes all of it) and answers each;
//! the frontend reads responses whose `rsp_prod` and slots are the input (a hostile backend).
//! Whatever parses must emit the same slot bytes and parse back to the same meaning.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shared_ring::abi::control::{
    Op, RequestRepr, ResponseRepr, Status, CONTROL_RING_LEN, CONTROL_SLOT_LEN,
};
use shared_ring::xen_ring::header;
use shared_ring::{ControlBackRing, ControlFrontRing, SharedRegion};

/// Copies `bytes` into `p` at `offset`, zero-padded to the 4-byte multiple shared memory takes.
fn fill(p: &SharedRegion, offset: usize, bytes: &[u8]) {
    let mut v = bytes.to_vec();
    v.resize(bytes.len().next_multiple_of(4), 0);
    p.write(offset, &v).unwrap();
}
fn check_request(b: &[u8]) {
    if let Ok(req) = RequestRepr::parse(b) {
        let bytes = req.to_bytes();
        assert_eq!(
            &bytes[..],
            &b[..CONTROL_SLOT_LEN],
            "a parsed request re-emits its slot"
        );
        assert_eq!(
            RequestRepr::parse(&bytes).expect("an emitted request parses"),
            req
        );
    }
}

fn check_response(b: &[u8]) {
    if let Ok(rsp) = ResponseRepr::parse(b) {
        let bytes = rsp.to_bytes();
        assert_eq!(
            &bytes[..],
            &b[..CONTROL_SLOT_LEN],
            "a parsed response re-emits its slot"
        );
        assert_eq!(
            ResponseRepr::parse(&bytes).expect("an emitted response parses"),
            rsp
        );
    }
}

fuzz_target!(|data: &[u8]| {
    // Short and long slices are errors, not panics.
    let _ = RequestRepr::parse(data);
    let _ = ResponseRepr::parse(data);

    // Backend: the whole ring page is guest-written.
    let page = SharedRegion::alloc(CONTROL_RING_LEN).unwrap();
    fill(&page, 0, &data[..data.len().min(CONTROL_RING_LEN)]);
    let mut back = ControlBackRing::new(page.clone()).unwrap();
    for _ in 0..2 * back.size() {
        match back.next_request() {
            Ok(Some(slot)) => {
                check_request(&slot);
                let rsp = match RequestRepr::parse(&slot) {
                    Ok(r) => ResponseRepr::error(r.req_id, r.request.op(), Status::NotSupported),
                    Err(_) => ResponseRepr::error(0, Op::Stats, Status::InvalidArgument),
                };
                back.write_response(&rsp.to_bytes())
                    .expect("a consumed request has a slot");
                back.push_responses_and_check_notify();
            }
            Ok(None) | Err(_) => break,
        }
    }

    // Frontend: a ring it initialised, with some requests out; then the backend writes
    // `rsp_prod` and every slot.
    let page = SharedRegion::alloc(CONTROL_RING_LEN).unwrap();
    let mut front = ControlFrontRing::init(page.clone()).unwrap();
    let outstanding = u32::from(data.first().copied().unwrap_or(0)) % (front.size() + 1);
    for _ in 0..outstanding {
        front.write_request(&[0; CONTROL_SLOT_LEN]).unwrap();
    }
    front.push_requests();
    if data.len() > 4 {
        fill(&page, header::RSP_PROD, &data[1..5]);
        let slots = &data[5..];
        fill(
            &page,
            header::ENTRIES,
            &slots[..slots.len().min(CONTROL_RING_LEN - header::ENTRIES)],
        );
    }
    for _ in 0..2 * front.size() {
        match front.next_response() {
            Ok(Some(slot)) => check_response(&slot),
            Ok(None) | Err(_) => break,
        }
    }
});
