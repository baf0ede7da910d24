//! WQEs on arbitrary bytes, as the backend engine reads them: a send queue whose producer
//! index and slots are guest-written is drained through the consumer end, and every slot is
//! parsed, once following the producer index (mediated mode) and once by phase bit (bypass).
//! Whatever parses must re-emit the same slot bytes and parse back to the same meaning; the
//! word parser (`WqeRepr::from_words`, the engine's SQ path) must agree with `from_bytes` on
//! every slot, and `pop_words` must hand out what `pop` hands out.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shared_ring::abi::wqe::{Wqe, WqeData, WqeRepr, MAX_INLINE, MAX_SGE, WQE_LEN};
use shared_ring::{SharedRegion, WqConsumer};

/// Copies `bytes` into `p` at `offset`, zero-padded to the 4-byte multiple shared memory takes.
fn fill(p: &SharedRegion, offset: usize, bytes: &[u8]) {
    let mut v = bytes.to_vec();
    v.resize(bytes.len().next_multiple_of(4), 0);
    p.write(offset, &v).unwrap();
}
const SLOTS: usize = 8;

/// The slot's words as `Consumer::pop_words` hands them out (word `i`: bytes `4 i ..`).
fn words_of(b: &[u8; WQE_LEN]) -> [u32; WQE_LEN / 4] {
    let mut w = [0u32; WQE_LEN / 4];
    for (v, c) in w.iter_mut().zip(b.chunks_exact(4)) {
        *v = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
    }
    w
}

fn check(b: &[u8; WQE_LEN]) {
    let parsed = WqeRepr::from_bytes(b);
    assert_eq!(
        WqeRepr::from_words(&words_of(b)),
        parsed,
        "the word parser (the engine's SQ path) agrees with from_bytes"
    );
    let Ok(w) = parsed else {
        return;
    };
    assert_eq!(WqeRepr::from_words(&w.to_words()), Ok(w));
    match w.data {
        WqeData::Sges { len, .. } => assert!(usize::from(len) <= MAX_SGE),
        WqeData::Inline { len, .. } => assert!(usize::from(len) <= MAX_INLINE),
    }
    let _ = w.data.total_len();
    let again = w.to_bytes();
    assert_eq!(
        WqeRepr::from_bytes(&again).expect("an emitted WQE parses"),
        w
    );
    // The payload past an inline length and unused SGEs are not part of the meaning, so only
    // the header must come back byte for byte.
    assert_eq!(&again[..32], &b[..32], "a parsed WQE re-emits its header");
}

fuzz_target!(|data: &[u8]| {
    let _ = WqeRepr::parse(&Wqe::new_unchecked(data));
    let _ = Wqe::new_checked(data);

    // Index words (prod at 0, cons at 64) and slots at 128, all from the input.
    let page = SharedRegion::alloc(128 + SLOTS * WQE_LEN).unwrap();
    fill(&page, 0, &data[..data.len().min(4)]);
    if data.len() > 4 {
        let slots = &data[4..];
        fill(&page, 128, &slots[..slots.len().min(SLOTS * WQE_LEN)]);
    }
    let start = u32::from(data.get(1).copied().unwrap_or(0));
    let mut q = WqConsumer::new(
        page.slots(128, SLOTS).unwrap(),
        page.word(0).unwrap(),
        page.word(64).unwrap(),
        start,
    );
    let mut n = 0;
    while let Ok(Some(slot)) = q.pop() {
        check(&slot);
        n += 1;
        assert!(
            n <= SLOTS,
            "a consumer never yields more slots than the queue holds"
        );
    }
    q.release();

    // The bypass engine's consumer, by phase bit from index 0: over memory nobody changes it
    // yields at most one pass of slots, each with its owner word zeroed.
    let mut q = WqConsumer::with_owner(
        page.slots(128, SLOTS).unwrap(),
        page.word(0).unwrap(),
        page.word(64).unwrap(),
        0,
        shared_ring::abi::wqe::field::OWNER,
        true,
    );
    // The engine's SQ path pops words from its own consumer of the same slots: it must hand
    // out the same slots, word for word.
    let mut qw = WqConsumer::with_owner(
        page.slots(128, SLOTS).unwrap(),
        page.word(0).unwrap(),
        page.word(64).unwrap(),
        0,
        shared_ring::abi::wqe::field::OWNER,
        true,
    );
    let mut n = 0;
    while let Ok(Some(slot)) = q.pop() {
        assert_eq!(&slot[28..32], &[0; 4], "the owner word is handed out zeroed");
        let mut words = [0u32; WQE_LEN / 4];
        assert_eq!(qw.pop_words(&mut words), Ok(true), "pop_words sees the slot pop saw");
        assert_eq!(words, words_of(&slot), "pop_words hands out pop's bytes as words");
        check(&slot);
        n += 1;
        assert!(n <= SLOTS, "a by-phase consumer stops after one pass over static slots");
    }
    let mut words = [0u32; WQE_LEN / 4];
    assert_eq!(qw.pop_words(&mut words), Ok(false), "pop_words stops where pop stopped");
    q.release();
});
