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
        self.slots.write(idx, slot);
        self.prod_pvt = idx.wrapping_add(1);
        Ok(idx)
    }
    /// Publishes written slots: release-stores the producer index.
    #[inline]
    pub fn publish(&mut self) {
        self.prod.store(self.prod_pvt, Ordering::Release);
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
    /// Published slots not yet consumed, reading the producer's index (validated).
    pub fn available(&mut self) -> Result<u32, QueueError> {
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
        if self.prod_seen == self.cons_pvt && self.available()? == 0 {
            return Ok(None);
        }
        let slot = self.slots.read(self.cons_pvt);
        self.cons_pvt = self.cons_pvt.wrapping_add(1);
        Ok(Some(slot))
    }
    /// Returns consumed slots to the producer: release-stores the consumer index.
    #[inline]
    pub fn release(&mut self) {
        self.cons.store(self.cons_pvt, Ordering::Release);
    }
}
