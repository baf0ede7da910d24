//! Completion queues: CQEs with an owner/phase bit, so a poller reads one cache line and no
//! shared index.
//!
//! The CQ is a power-of-two array of 32-byte CQEs in zeroed pages. The CQE for free-running
//! index `i` carries phase `((i / size) & 1) ^ 1` in bit 0 of its owner word: 1 on the first
//! pass over the zeroed ring, 0 on the second, and so on (consistent across `u32` wrap since
//! `size` divides 2^32). The backend writes the 28-byte body, then release-stores the owner
//! word; the frontend acquire-loads the owner word of its next slot and, if the phase matches,
//! copies the CQE out. The frontend stores its consumer index in the doorbell page so the
//! backend can tell a full CQ (overrun) from a free slot; it never writes the CQ pages, which
//! the backend may grant read-only.
//!
//! Arming: the frontend writes a new arm number into the arm word, does a full fence and
//! re-checks for a CQE; the backend, after writing CQEs, does a full fence and reads the arm
//! word; if it holds an arm number it has not notified yet (and the solicited condition holds)
//! it notifies once for it. The arm word has one writer, the frontend.

use std::sync::atomic::Ordering;

use crate::abi::cqe::{field, CqeRepr, CQE_BODY_LEN, CQE_LEN, OWNER_PHASE};
use crate::abi::AbiError;
use crate::doorbell::{arm, CqDoorbell};
use crate::mem::{full_fence, SharedWord, SlotArray};

/// Errors of the CQ writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CqError {
    /// Every CQE is unconsumed: the completion cannot be written (report `CqOverrun`).
    #[error("completion queue overrun ({size} CQEs unconsumed)")]
    Overrun { size: u32 },
    #[error("protocol error: consumer index {cons} is {distance} behind producer {prod}, beyond the {size}-entry CQ")]
    BadConsumerIndex {
        cons: u32,
        prod: u32,
        distance: u32,
        size: u32,
    },
}

#[inline]
fn phase(idx: u32, shift: u32) -> u32 {
    ((idx >> shift) & 1) ^ 1
}

/// The backend's end of a CQ.
#[derive(Debug)]
pub struct CqWriter {
    slots: SlotArray<CQE_LEN>,
    db: CqDoorbell,
    prod_pvt: u32,
    cons_seen: u32,
    shift: u32,
    notified_arm: u32,
}

impl CqWriter {
    /// A writer over zeroed CQ pages, starting at index 0.
    pub fn new(slots: SlotArray<CQE_LEN>, db: CqDoorbell) -> Self {
        let shift = slots.count().trailing_zeros();
        Self {
            slots,
            db,
            prod_pvt: 0,
            cons_seen: 0,
            shift,
            notified_arm: 0,
        }
    }
    /// Number of CQEs.
    pub fn size(&self) -> u32 {
        self.slots.count()
    }
    /// Index of the next CQE to write.
    pub fn prod_pvt(&self) -> u32 {
        self.prod_pvt
    }
    /// Free CQEs, reading the frontend's consumer index (validated).
    pub fn free(&mut self) -> Result<u32, CqError> {
        let cons = self.db.cons.load(Ordering::Acquire);
        let used = self.prod_pvt.wrapping_sub(cons);
        if used > self.size() {
            return Err(CqError::BadConsumerIndex {
                cons,
                prod: self.prod_pvt,
                distance: used,
                size: self.size(),
            });
        }
        self.cons_seen = cons;
        Ok(self.size() - used)
    }
    /// Writes a CQE body (the owner word of `cqe` is ignored) and publishes it with the right
    /// phase. Returns the CQE's index.
    #[inline]
    pub fn write(&mut self, cqe: &[u8; CQE_LEN]) -> Result<u32, CqError> {
        let idx = self.next_free()?;
        let mut body = [0u8; CQE_BODY_LEN];
        body.copy_from_slice(&cqe[..CQE_BODY_LEN]);
        self.slots.write_head(idx, &body);
        Ok(self.publish(idx))
    }
    /// Writes a CQE from its repr: the same bytes as [`Self::write`] of
    /// [`CqeRepr::to_bytes`], stored as the body's seven words without building them as
    /// bytes first (the engine's per-completion path).
    #[inline]
    pub fn write_repr(&mut self, cqe: &CqeRepr) -> Result<u32, CqError> {
        let idx = self.next_free()?;
        self.slots.write_head_words(idx, &cqe.body_words());
        Ok(self.publish(idx))
    }
    /// The index of the next CQE if its slot is free (else an overrun or a bad consumer index).
    #[inline]
    fn next_free(&mut self) -> Result<u32, CqError> {
        if self.prod_pvt.wrapping_sub(self.cons_seen) >= self.size() && self.free()? == 0 {
            return Err(CqError::Overrun { size: self.size() });
        }
        Ok(self.prod_pvt)
    }
    /// Publishes CQE `idx`, whose body is written: release-stores its owner word with the
    /// phase of `idx`.
    #[inline]
    fn publish(&mut self, idx: u32) -> u32 {
        self.slots
            .store_word::<{ field::OWNER }>(idx, phase(idx, self.shift), Ordering::Release);
        self.prod_pvt = idx.wrapping_add(1);
        idx
    }
    /// After writing CQEs: whether to notify the CQ's event channel. `solicited` says whether a
    /// solicited or error completion was among them. Returns `true` once per arm.
    #[inline]
    pub fn notify_needed(&mut self, solicited: bool) -> bool {
        // Our owner-word stores must be visible before we read the arm word.
        full_fence();
        let a = self.db.arm.load(Ordering::Relaxed);
        let number = a >> arm::NUMBER_SHIFT;
        if number == self.notified_arm || (a & arm::SOLICITED_ONLY != 0 && !solicited) {
            return false;
        }
        self.notified_arm = number;
        true
    }
}

/// The frontend's end of a CQ.
#[derive(Debug)]
pub struct CqPoller {
    slots: SlotArray<CQE_LEN>,
    db: CqDoorbell,
    cons_pvt: u32,
    shift: u32,
    arm_number: u32,
}

impl CqPoller {
    /// A poller over a freshly created CQ, starting at index 0.
    pub fn new(slots: SlotArray<CQE_LEN>, db: CqDoorbell) -> Self {
        let shift = slots.count().trailing_zeros();
        Self {
            slots,
            db,
            cons_pvt: 0,
            shift,
            arm_number: 0,
        }
    }
    /// Number of CQEs.
    pub fn size(&self) -> u32 {
        self.slots.count()
    }
    /// Index of the next CQE to poll.
    pub fn cons_pvt(&self) -> u32 {
        self.cons_pvt
    }
    /// Whether the next CQE is present (one acquire load of its owner word).
    #[inline]
    pub fn ready(&self) -> bool {
        let owner = self
            .slots
            .load_word::<{ field::OWNER }>(self.cons_pvt, Ordering::Acquire);
        owner & OWNER_PHASE == phase(self.cons_pvt, self.shift)
    }
    /// Copies the next CQE out (raw bytes, owner word included) and consumes it.
    #[inline]
    pub fn poll_raw(&mut self) -> Option<[u8; CQE_LEN]> {
        if !self.ready() {
            return None;
        }
        let cqe = self.slots.read(self.cons_pvt);
        self.cons_pvt = self.cons_pvt.wrapping_add(1);
        // The copy is done: the backend may reuse the slot.
        self.db.cons.store(self.cons_pvt, Ordering::Release);
        Some(cqe)
    }
    /// Polls and parses the next CQE.
    pub fn poll(&mut self) -> Result<Option<CqeRepr>, AbiError> {
        match self.poll_raw() {
            None => Ok(None),
            Some(b) => CqeRepr::from_bytes(&b).map(Some),
        }
    }
    /// Arms the CQ for one notification; returns `true` if a CQE is already waiting (then do
    /// not block: poll instead).
    pub fn arm(&mut self, solicited_only: bool) -> bool {
        self.arm_number = match self.arm_number.wrapping_add(1) & (u32::MAX >> arm::NUMBER_SHIFT) {
            0 => 1,
            n => n,
        };
        let word = (self.arm_number << arm::NUMBER_SHIFT)
            | if solicited_only {
                arm::SOLICITED_ONLY
            } else {
                0
            };
        self.db.arm.store(word, Ordering::Relaxed);
        // The arm must be visible before we look for a CQE the backend wrote meanwhile.
        full_fence();
        self.ready()
    }
    /// The arm word (for tests and diagnostics).
    pub fn arm_word(&self) -> &SharedWord {
        &self.db.arm
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::abi::cqe::{CqeOpcode, CqeStatus};
    use crate::doorbell::DoorbellPage;
    use crate::mem::SharedRegion;

    fn cq(size: usize) -> (CqWriter, CqPoller, SharedRegion) {
        let dbr = SharedRegion::alloc(4096).unwrap();
        let db = DoorbellPage::init(dbr, 1).unwrap();
        let mem = SharedRegion::alloc(size * CQE_LEN).unwrap();
        let w = CqWriter::new(mem.slots(0, size).unwrap(), db.cq(0).unwrap());
        let p = CqPoller::new(mem.slots(0, size).unwrap(), db.cq(0).unwrap());
        (w, p, mem)
    }

    fn cqe(wr_id: u64) -> CqeRepr {
        CqeRepr {
            wr_id,
            status: CqeStatus::Success,
            opcode: CqeOpcode::Send,
            byte_len: 0,
            imm_data: 0,
            qp_num: 1,
            vendor_err: 0,
            flags: 0,
        }
    }

    #[test]
    fn phase_flips_each_pass_and_overrun_is_detected() {
        let (mut w, mut p, mem) = cq(4);
        for pass in 0..5u64 {
            for i in 0..4 {
                w.write_repr(&cqe(pass * 4 + i)).unwrap();
            }
            assert_eq!(w.write_repr(&cqe(99)), Err(CqError::Overrun { size: 4 }));
            let owner = mem.load_u32(28, Ordering::Relaxed).unwrap();
            assert_eq!(owner, (pass as u32 & 1) ^ 1);
            for i in 0..4 {
                assert_eq!(p.poll().unwrap().unwrap().wr_id, pass * 4 + i);
            }
            assert_eq!(p.poll().unwrap(), None);
        }
    }

    #[test]
    fn write_repr_stores_the_bytes_of_to_bytes() {
        let (mut w, mut p, _mem) = cq(2);
        let c = CqeRepr {
            wr_id: 0x0102_0304_0506_0708,
            status: CqeStatus::RemoteAccessError,
            opcode: CqeOpcode::RecvRdmaWithImm,
            byte_len: 0x1112_1314,
            imm_data: 0x2122_2324,
            qp_num: 0x3132_3334,
            vendor_err: 0x4142_4344,
            flags: crate::abi::cqe::flags::ALL,
        };
        for pass in 0..2u32 {
            let mut bytes = [0u8; CQE_LEN];
            w.write(&c.to_bytes()).unwrap();
            w.write_repr(&c).unwrap();
            let by_bytes = p.poll_raw().unwrap();
            let by_repr = p.poll_raw().unwrap();
            assert_eq!(by_repr, by_bytes, "pass {pass}");
            bytes[..CQE_BODY_LEN].copy_from_slice(&c.to_bytes()[..CQE_BODY_LEN]);
            bytes[28..].copy_from_slice(&((pass & 1) ^ 1).to_ne_bytes());
            assert_eq!(by_repr, bytes, "pass {pass}");
        }
    }

    #[test]
    fn arm_notifies_once() {
        let (mut w, mut p, _mem) = cq(4);
        assert!(!p.arm(false));
        w.write_repr(&cqe(1)).unwrap();
        assert!(w.notify_needed(false));
        assert!(!w.notify_needed(false));
        assert!(p.arm(true), "a CQE is already waiting");
        assert!(
            !w.notify_needed(false),
            "solicited-only arm ignores plain CQEs"
        );
        assert!(w.notify_needed(true));
    }
}
