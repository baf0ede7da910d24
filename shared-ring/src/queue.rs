//! Single-producer single-consumer queues of fixed-size slots whose indexes live in shared
//! words: the send and receive queues (indexes in the doorbell page) and the event ring.
//!
//! The producer writes a slot, then release-stores the free-running producer index; the
//! consumer acquire-loads it, copies slots out, and release-stores its consumer index once it
//! no longer needs them, which frees them for the producer. Each side validates the other's
//! index: a count larger than the queue is a protocol error, never trusted.

use std::sync::atomic::Ordering;

use crate::mem::{SharedWord, SlotArray};

/// Errors of a queue end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error("queue is full ({size} slots in use)")]
    Full { size: u32 },
    #[error(
        "protocol error: peer's index {peer} is {distance} away from ours ({ours}), beyond the {size}-slot queue"
    )]
    BadPeerIndex {
        peer: u32,
        ours: u32,
        distance: u32,
        size: u32,
    },
}

/// The producing end (frontend for SQ/RQ, backend for the event ring).
#[derive(Debug)]
pub struct Producer<const N: usize> {
    slots: SlotArray<N>,
    prod: SharedWord,
    cons: SharedWord,
    prod_pvt: u32,
    cons_seen: u32,
    /// Byte offset of the owner (phase) word in a slot, if the queue has one.
    owner: Option<usize>,
}

/// Phase of free-running slot index `idx` in a queue of `2^shift` slots.
#[inline]
fn phase(idx: u32, shift: u32) -> u32 {
    ((idx >> shift) & 1) ^ 1
}

fn check_owner<const N: usize>(owner: usize) -> usize {
    assert!(
        owner % 4 == 0 && owner + 4 <= N,
        "owner word at {owner} does not fit a {N}-byte slot"
    );
    owner
}

impl<const N: usize> Producer<N> {
    /// Attaches to a queue whose indexes are both at `idx` (0 for a new queue).
    pub fn new(slots: SlotArray<N>, prod: SharedWord, cons: SharedWord, idx: u32) -> Self {
        Self {
            slots,
            prod,
            cons,
            prod_pvt: idx,
            cons_seen: idx,
            owner: None,
        }
    }
    /// Like [`Self::new`], for a queue whose slots carry a phase bit in the owner word at byte
    /// `owner` (panics unless it is a word inside the slot: a constant of the caller's ABI).
    pub fn with_owner(
        slots: SlotArray<N>,
        prod: SharedWord,
        cons: SharedWord,
        idx: u32,
        owner: usize,
    ) -> Self {
        Self {
            owner: Some(check_owner::<N>(owner)),
            ..Self::new(slots, prod, cons, idx)
        }
    }
    /// Number of slots.
    pub fn size(&self) -> u32 {
        self.slots.count()
    }
    /// Index of the next slot to write.
    pub fn prod_pvt(&self) -> u32 {
        self.prod_pvt
    }
    /// Free slots, reading the consumer's index (validated).
    pub fn free(&mut self) -> Result<u32, QueueError> {
        let cons = self.cons.load(Ordering::Acquire);
        let used = self.prod_pvt.wrapping_sub(cons);
        if used > self.size() {
            return Err(QueueError::BadPeerIndex {
                peer: cons,
                ours: self.prod_pvt,
                distance: used,
                size: self.size(),
            });
        }
        self.cons_seen = cons;
        Ok(self.size() - used)
    }
    /// Writes a slot (visible to the consumer after [`Self::publish`]); returns its index.
    #[inline]
    pub fn write(&mut self, slot: &[u8; N]) -> Result<u32, QueueError> {
        if self.prod_pvt.wrapping_sub(self.cons_seen) >= self.size() && self.free()? == 0 {
            return Err(QueueError::Full { size: self.size() });
        }
        let idx = self.prod_pvt;
        match self.owner {
            None => self.slots.write(idx, slot),
            Some(off) => {
                // The body with the owner word still saying "not yet" (the previous pass's
                // phase), then the phase, released: a consumer that sees it sees the body.
                let ph = phase(idx, self.slots.count().trailing_zeros());
                let mut body = *slot;
                body[off..off + 4].copy_from_slice(&(ph ^ 1).to_ne_bytes());
                self.slots.write(idx, &body);
                self.slots.store_word_at(idx, off, ph, Ordering::Release);
            }
        }
        self.prod_pvt = idx.wrapping_add(1);
        Ok(idx)
    }
    /// [`Self::write`] of a slot given as its `W = N / 4` words (word `i` holds bytes
    /// `4 i .. 4 i + 4` in native order): the same stores in the same order, without a
    /// slot-sized byte buffer (the frontend's post path builds the WQE in registers).
    #[inline]
    pub fn write_words<const W: usize>(&mut self, words: &[u32; W]) -> Result<u32, QueueError> {
        const { assert!(W * 4 == N, "a slot's words") };
        if self.prod_pvt.wrapping_sub(self.cons_seen) >= self.size() && self.free()? == 0 {
            return Err(QueueError::Full { size: self.size() });
        }
        let idx = self.prod_pvt;
        match self.owner {
            None => self.slots.write_head_words(idx, words),
            Some(off) => {
                // As in `write`: the body with the owner word saying "not yet", then the
                // phase, released.
                let ph = phase(idx, self.slots.count().trailing_zeros());
                self.slots
                    .write_head_words_with(idx, words, off / 4, ph ^ 1);
                self.slots.store_word_at(idx, off, ph, Ordering::Release);
            }
        }
        self.prod_pvt = idx.wrapping_add(1);
        Ok(idx)
    }
    /// Publishes written slots: release-stores the producer index.
    #[inline]
    pub fn publish(&mut self) {
        self.prod.store(self.prod_pvt, Ordering::Release);
    }
}

/// A lock-free look at whether a slot of a by-phase queue is published (see
/// [`Consumer::phase_probe`]).
#[derive(Debug, Clone)]
pub struct PhaseProbe<const N: usize> {
    slots: SlotArray<N>,
    owner: usize,
}

impl<const N: usize> PhaseProbe<N> {
    /// Whether free-running slot `idx` holds a published slot of its pass.
    #[inline]
    pub fn published(&self, idx: u32) -> bool {
        let w = self.slots.load_word_at(idx, self.owner, Ordering::Acquire);
        w & 1 == phase(idx, self.slots.count().trailing_zeros())
    }
}

/// The consuming end (backend engine for SQ/RQ, frontend for the event ring).
#[derive(Debug)]
pub struct Consumer<const N: usize> {
    slots: SlotArray<N>,
    prod: SharedWord,
    cons: SharedWord,
    cons_pvt: u32,
    prod_seen: u32,
    /// Byte offset of the owner (phase) word in a slot, if the queue has one.
    owner: Option<usize>,
    /// Whether a slot is published when its phase says so (else: when the producer index
    /// says so).
    by_phase: bool,
}

impl<const N: usize> Consumer<N> {
    /// Attaches to a queue whose indexes are both at `idx` (0 for a new queue).
    pub fn new(slots: SlotArray<N>, prod: SharedWord, cons: SharedWord, idx: u32) -> Self {
        Self {
            slots,
            prod,
            cons,
            cons_pvt: idx,
            prod_seen: idx,
            owner: None,
            by_phase: false,
        }
    }
    /// Like [`Self::new`], for a queue whose slots carry a phase bit in the owner word at byte
    /// `owner` (panics unless it is a word inside the slot). With `by_phase` a slot counts as
    /// published when its phase matches, whatever the producer index says (the bypass
    /// engine); without, the producer index decides (mediated mode follows a private index).
    /// Either way slots are handed out with the owner word zeroed.
    pub fn with_owner(
        slots: SlotArray<N>,
        prod: SharedWord,
        cons: SharedWord,
        idx: u32,
        owner: usize,
        by_phase: bool,
    ) -> Self {
        Self {
            owner: Some(check_owner::<N>(owner)),
            by_phase,
            ..Self::new(slots, prod, cons, idx)
        }
    }
    /// Whether slots are found by their phase bit.
    pub fn is_by_phase(&self) -> bool {
        self.by_phase && self.owner.is_some()
    }
    /// By phase: whether the next slot is published (one acquire load of its owner word).
    #[inline]
    fn next_published(&self) -> bool {
        match self.owner {
            Some(off) if self.by_phase => {
                let w = self
                    .slots
                    .load_word_at(self.cons_pvt, off, Ordering::Acquire);
                w & 1 == phase(self.cons_pvt, self.slots.count().trailing_zeros())
            }
            _ => false,
        }
    }
    /// Number of slots.
    pub fn size(&self) -> u32 {
        self.slots.count()
    }
    /// Index of the next slot to consume.
    pub fn cons_pvt(&self) -> u32 {
        self.cons_pvt
    }
    /// The producer's index word, for a look at it without this end (an engine that keeps
    /// the end under a lock can tell from it that nothing new was published, lock-free).
    pub fn prod_word(&self) -> &SharedWord {
        &self.prod
    }
    /// Published slots not yet consumed, reading the producer's index (validated). By phase:
    /// 1 if the next slot is published, else 0 (the producer index is not read).
    pub fn available(&mut self) -> Result<u32, QueueError> {
        if self.is_by_phase() {
            return Ok(u32::from(self.next_published()));
        }
        let prod = self.prod.load(Ordering::Acquire);
        let n = prod.wrapping_sub(self.cons_pvt);
        if n > self.size() {
            return Err(QueueError::BadPeerIndex {
                peer: prod,
                ours: self.cons_pvt,
                distance: n,
                size: self.size(),
            });
        }
        self.prod_seen = prod;
        Ok(n)
    }
    /// Copies the next published slot out and consumes it; `None` when there is none.
    #[inline]
    pub fn pop(&mut self) -> Result<Option<[u8; N]>, QueueError> {
        let mut slot = [0u8; N];
        Ok(self.pop_into(&mut slot)?.then_some(slot))
    }
    /// [`Self::pop`] into `slot` (a hot path's own buffer, so no slot-sized value is moved
    /// around): `true` if the next published slot was copied there and consumed, `false`
    /// (and `slot` untouched) when there is none.
    #[inline]
    pub fn pop_into(&mut self, slot: &mut [u8; N]) -> Result<bool, QueueError> {
        if !self.next_ready()? {
            return Ok(false);
        }
        self.slots.read_into(self.cons_pvt, slot);
        if let Some(off) = self.owner {
            slot[off..off + 4].fill(0);
        }
        self.cons_pvt = self.cons_pvt.wrapping_add(1);
        Ok(true)
    }
    /// [`Self::pop_into`] of the slot as its `W = N / 4` words (word `i` holds bytes
    /// `4 i .. 4 i + 4` in native order, as `pop_into` copies them): each word of shared
    /// memory is loaded once, into `words`, with the owner word zeroed there, so a parser of
    /// words (`WqeRepr::from_words`) reads the caller's copy, never shared memory, and never
    /// a byte buffer built from it. `false` (and `words` untouched) when there is none.
    #[inline]
    pub fn pop_words<const W: usize>(&mut self, words: &mut [u32; W]) -> Result<bool, QueueError> {
        const { assert!(W * 4 == N, "a slot's words") };
        if !self.next_ready()? {
            return Ok(false);
        }
        self.slots.read_words_into(self.cons_pvt, words);
        if let Some(off) = self.owner {
            words[off / 4] = 0;
        }
        self.cons_pvt = self.cons_pvt.wrapping_add(1);
        Ok(true)
    }
    /// Whether the slot at `cons_pvt` is published: by phase (one acquire load of its owner
    /// word), else by the producer index (read, validated, only once the slots seen are used).
    #[inline]
    fn next_ready(&mut self) -> Result<bool, QueueError> {
        if self.is_by_phase() {
            Ok(self.next_published())
        } else {
            Ok(self.prod_seen != self.cons_pvt || self.available()? != 0)
        }
    }
    /// By phase, for a look without this end (an engine that keeps the end under a lock):
    /// whether slot `idx` is published — see [`Self::is_by_phase`]; `None` when the queue is
    /// not polled by phase.
    pub fn phase_probe(&self) -> Option<PhaseProbe<N>> {
        match self.owner {
            Some(owner) if self.by_phase => Some(PhaseProbe {
                slots: self.slots.clone(),
                owner,
            }),
            _ => None,
        }
    }
    /// Returns consumed slots to the producer: release-stores the consumer index.
    #[inline]
    pub fn release(&mut self) {
        self.cons.store(self.cons_pvt, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::mem::SharedRegion;

    /// `write_words` leaves the same bytes in shared memory as `write` of those bytes, with
    /// and without an owner word, over several passes of the ring (phases 1, 0, 1, ...).
    #[test]
    fn write_words_stores_what_write_stores() {
        const N: usize = 64;
        for owner in [None, Some(28)] {
            let (ra, rb) = (
                SharedRegion::alloc(4 * N + 8).unwrap(),
                SharedRegion::alloc(4 * N + 8).unwrap(),
            );
            let end = |r: &SharedRegion, o: Option<usize>| {
                let (slots, prod, cons) = (
                    r.slots::<N>(8, 4).unwrap(),
                    r.word(0).unwrap(),
                    r.word(4).unwrap(),
                );
                match o {
                    None => Producer::<N>::new(slots, prod, cons, 0),
                    Some(off) => Producer::with_owner(slots, prod, cons, 0, off),
                }
            };
            let (mut a, mut b) = (end(&ra, owner), end(&rb, owner));
            let mut x = 0x2545_f491_4f6c_dd1du64;
            for i in 0..12u32 {
                let mut words = [0u32; N / 4];
                for w in &mut words {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    *w = x as u32;
                }
                let mut bytes = [0u8; N];
                for (c, w) in bytes.chunks_exact_mut(4).zip(&words) {
                    c.copy_from_slice(&w.to_ne_bytes());
                }
                assert_eq!(a.write(&bytes), Ok(i));
                assert_eq!(b.write_words(&words), Ok(i));
                a.publish();
                b.publish();
                let (mut ma, mut mb) = ([0u8; 4 * N + 8], [0u8; 4 * N + 8]);
                ra.read(0, &mut ma).unwrap();
                rb.read(0, &mut mb).unwrap();
                assert_eq!(ma, mb, "slot {i}, owner {owner:?}");
                // The consumer's index follows, so the ring wraps.
                ra.store_u32(4, i + 1, Ordering::Relaxed).unwrap();
                rb.store_u32(4, i + 1, Ordering::Relaxed).unwrap();
            }
        }
    }

    /// `pop_words` hands out what `pop_into` hands out (the same slots, word `i` = bytes
    /// `4 i ..`, the owner word zeroed), and nothing when `pop_into` finds nothing: by
    /// producer index and by phase, with and without an owner word, over several passes.
    #[test]
    fn pop_words_hands_out_what_pop_into_does() {
        const N: usize = 64;
        for (owner, by_phase) in [(None, false), (Some(28), false), (Some(28), true)] {
            let r = SharedRegion::alloc(4 * N + 8).unwrap();
            let (slots, prod, cons) = (
                r.slots::<N>(8, 4).unwrap(),
                r.word(0).unwrap(),
                r.word(4).unwrap(),
            );
            let mut p = match owner {
                None => Producer::<N>::new(slots.clone(), prod.clone(), cons.clone(), 0),
                Some(o) => Producer::with_owner(slots.clone(), prod.clone(), cons.clone(), 0, o),
            };
            let end = || match owner {
                None => Consumer::<N>::new(slots.clone(), prod.clone(), cons.clone(), 0),
                Some(o) => {
                    Consumer::with_owner(slots.clone(), prod.clone(), cons.clone(), 0, o, by_phase)
                }
            };
            let (mut a, mut b) = (end(), end());
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for i in 0..12u32 {
                let (mut bytes, mut words) = ([0u8; N], [0u32; N / 4]);
                assert_eq!(a.pop_into(&mut bytes), Ok(false));
                assert_eq!(b.pop_words(&mut words), Ok(false), "nothing published yet");
                let mut slot = [0u8; N];
                for c in slot.chunks_exact_mut(8) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    c.copy_from_slice(&x.to_le_bytes());
                }
                assert_eq!(p.write(&slot), Ok(i));
                p.publish();
                assert_eq!(a.pop_into(&mut bytes), Ok(true));
                assert_eq!(b.pop_words(&mut words), Ok(true), "slot {i}");
                for (k, w) in words.iter().enumerate() {
                    assert_eq!(
                        w.to_ne_bytes(),
                        bytes[4 * k..4 * k + 4],
                        "slot {i} word {k}"
                    );
                }
                if let Some(o) = owner {
                    assert_eq!(words[o / 4], 0, "the owner word is handed out zeroed");
                }
                a.release();
                b.release();
            }
        }
    }
}
