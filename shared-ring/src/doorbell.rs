//! The doorbell page of a channel (its "BAR"): per-queue producer/consumer indexes, CQ arm
//! words and the engine's "sleeping, kick me" word, each written by one side on its own cache
//! line.
//!
//! ```text
//!    0  header line (backend, once):  0 magic u32 "VRDB"  4 version u32  8 slots u32
//!   64  engine line (backend):  64 engine_sleeping u32 (bit 0 sleeping, bits 1.. sleep number)
//!  128 + 128*k  slot k, front line:
//!               SQ/RQ: +0 producer index (frontend)   CQ: +0 arm word (frontend)
//!  192 + 128*k  slot k, back line:
//!               SQ/RQ: +0 consumer index (backend)    CQ: +0 consumer index (frontend)
//! ```
//! The CQ's two words are written by the frontend but sit on different lines: the engine reads
//! the arm word after every batch of completions, the consumer index only when the CQ looks
//! full, and the frontend stores the consumer index on every poll — on one line, every poll
//! would make the engine's arm-word read a miss.
//! The backend allocates the page (one or more 4 KiB pages), zeroes it, writes the header and
//! assigns slots at `CreateQp` / `CreateCq`.
//!
//! Kick protocol (the `req_event` idea, nfecomm's lesson: never one notification per post):
//! the engine stores `engine_sleeping = (n << 1) | 1` for its n-th sleep, does a full fence and
//! re-checks every producer index before it blocks; the frontend release-stores a producer
//! index, does a full fence and reads `engine_sleeping`; if bit 0 is set and it has not kicked
//! sleep `n` yet, it notifies the event channel. One of the two fences always sees the other
//! side's store: no lost wake-up. Every word has exactly one writer.

use std::sync::atomic::Ordering;

use crate::mem::{full_fence, MemError, SharedRegion, SharedWord, CACHE_LINE};

/// `"VRDB"` little-endian.
pub const DOORBELL_MAGIC: u32 = u32::from_le_bytes(*b"VRDB");

/// Byte offsets in the doorbell page.
pub mod field {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const SLOTS: usize = 8;
    pub const ENGINE_SLEEPING: usize = 64;
    /// First doorbell slot.
    pub const SLOT_BASE: usize = 128;
    /// Size of a doorbell slot: a front line and a back line.
    pub const SLOT_LEN: usize = 128;
    /// Inside a slot: SQ/RQ producer index (front line).
    pub const QUEUE_PROD: usize = 0;
    /// Inside a slot: SQ/RQ consumer index (back line).
    pub const QUEUE_CONS: usize = 64;
    /// Inside a slot: CQ arm word (front line).
    pub const CQ_ARM: usize = 0;
    /// Inside a slot: CQ consumer index (back line; the frontend writes it).
    pub const CQ_CONS: usize = 64;
}

/// `engine_sleeping` values.
pub const ENGINE_AWAKE: u32 = 0;
pub const ENGINE_SLEEPING: u32 = 1;

/// CQ arm word: written only by the frontend, `(arm_number << 1) | solicited_only`. Each
/// `arm` bumps the arm number (never 0 after the first arm); the backend notifies once per
/// arm number it has not notified yet.
pub mod arm {
    /// Notify only for a solicited (or error) completion.
    pub const SOLICITED_ONLY: u32 = 1 << 0;
    /// Shift of the arm number.
    pub const NUMBER_SHIFT: u32 = 1;
}

/// Errors opening a doorbell page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DoorbellError {
    #[error("doorbell page magic is {found:#x}, not {DOORBELL_MAGIC:#x}")]
    BadMagic { found: u32 },
    #[error("doorbell page speaks protocol version {found}, we speak {want}")]
    VersionMismatch { found: u32, want: u32 },
    #[error("doorbell slot {slot} does not exist (the page has {slots})")]
    NoSuchSlot { slot: u32, slots: u32 },
    #[error(transparent)]
    Mem(#[from] MemError),
}

/// Number of doorbell slots a region of `len` bytes holds.
pub const fn slots_in(len: usize) -> u32 {
    if len < field::SLOT_BASE {
        0
    } else {
        let n = (len - field::SLOT_BASE) / field::SLOT_LEN;
        if n > u32::MAX as usize {
            u32::MAX
        } else {
            n as u32
        }
    }
}

/// A channel's doorbell page(s).
#[derive(Debug, Clone)]
pub struct DoorbellPage {
    region: SharedRegion,
    slots: u32,
}

impl DoorbellPage {
    /// Backend: zeroes the page and writes the header.
    pub fn init(region: SharedRegion, version: u32) -> Result<Self, DoorbellError> {
        let slots = slots_in(region.len());
        region.zero(0, region.len())?;
        region.store_u32(field::VERSION, version, Ordering::Relaxed)?;
        region.store_u32(field::SLOTS, slots, Ordering::Relaxed)?;
        region.store_u32(field::MAGIC, DOORBELL_MAGIC, Ordering::Release)?;
        Ok(Self { region, slots })
    }

    /// Frontend: checks the header of a mapped doorbell page. The slot count is taken from the
    /// mapping's size, never trusted from the page beyond it.
    pub fn open(region: SharedRegion, version: u32) -> Result<Self, DoorbellError> {
        let magic = region.load_u32(field::MAGIC, Ordering::Acquire)?;
        if magic != DOORBELL_MAGIC {
            return Err(DoorbellError::BadMagic { found: magic });
        }
        let found = region.load_u32(field::VERSION, Ordering::Relaxed)?;
        if found != version {
            return Err(DoorbellError::VersionMismatch {
                found,
                want: version,
            });
        }
        let claimed = region.load_u32(field::SLOTS, Ordering::Relaxed)?;
        let slots = claimed.min(slots_in(region.len()));
        Ok(Self { region, slots })
    }

    /// Number of doorbell slots.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    fn slot_base(&self, slot: u32) -> Result<usize, DoorbellError> {
        if slot >= self.slots {
            return Err(DoorbellError::NoSuchSlot {
                slot,
                slots: self.slots,
            });
        }
        Ok(field::SLOT_BASE + slot as usize * field::SLOT_LEN)
    }

    /// The engine's side of the sleep word (backend).
    pub fn engine_sleep(&self) -> Result<EngineSleep, DoorbellError> {
        Ok(EngineSleep::from_word(
            self.region.word(field::ENGINE_SLEEPING)?,
        ))
    }

    /// The frontend's side of the sleep word (one per posting context).
    pub fn engine_kick(&self) -> Result<EngineKick, DoorbellError> {
        Ok(EngineKick::from_word(
            self.region.word(field::ENGINE_SLEEPING)?,
        ))
    }

    /// The producer and consumer index words of an SQ/RQ slot.
    pub fn queue(&self, slot: u32) -> Result<QueueDoorbell, DoorbellError> {
        let base = self.slot_base(slot)?;
        Ok(QueueDoorbell {
            prod: self.region.word(base + field::QUEUE_PROD)?,
            cons: self.region.word(base + field::QUEUE_CONS)?,
        })
    }

    /// The arm and consumer-index words of a CQ slot.
    pub fn cq(&self, slot: u32) -> Result<CqDoorbell, DoorbellError> {
        let base = self.slot_base(slot)?;
        Ok(CqDoorbell {
            arm: self.region.word(base + field::CQ_ARM)?,
            cons: self.region.word(base + field::CQ_CONS)?,
        })
    }
}

const _: () = assert!(field::QUEUE_CONS - field::QUEUE_PROD >= CACHE_LINE);
const _: () = assert!(field::SLOT_BASE - field::ENGINE_SLEEPING >= CACHE_LINE);
const _: () = assert!(field::CQ_CONS - field::CQ_ARM >= CACHE_LINE);

/// Index words of a send or receive queue.
#[derive(Debug, Clone)]
pub struct QueueDoorbell {
    /// Producer index (frontend writes).
    pub prod: SharedWord,
    /// Consumer index (backend writes).
    pub cons: SharedWord,
}

/// Words of a completion queue.
#[derive(Debug, Clone)]
pub struct CqDoorbell {
    /// Arm word (frontend writes; see [`arm`]).
    pub arm: SharedWord,
    /// Consumer index (frontend writes).
    pub cons: SharedWord,
}

/// Engine side of the "sleeping, kick me" word. The word is written only by the engine:
/// bit 0 = sleeping, bits 1..32 = sleep sequence number (so a frontend kicks once per sleep).
#[derive(Debug)]
pub struct EngineSleep {
    word: SharedWord,
    seq: u32,
}

impl EngineSleep {
    /// Wraps a word (for layouts other than the doorbell page, and for tests).
    pub fn from_word(word: SharedWord) -> Self {
        Self { word, seq: 0 }
    }

    /// Announce sleep. Afterwards re-check every producer index; if there is work, call
    /// [`Self::wake`] and go on, else block on the event channel.
    pub fn prepare_sleep(&mut self) {
        self.seq = self.seq.wrapping_add(1) & (u32::MAX >> 1);
        self.word
            .store((self.seq << 1) | ENGINE_SLEEPING, Ordering::Relaxed);
        // Our store must be visible before we read the producer indexes.
        full_fence();
    }

    /// Awake again (after a notification or a successful re-check).
    pub fn wake(&mut self) {
        self.word.store(self.seq << 1, Ordering::Relaxed);
    }
}

/// Frontend side of the engine's sleep word: read-only, remembers which sleep it kicked.
#[derive(Debug)]
pub struct EngineKick {
    word: SharedWord,
    last_kicked: u32,
}

impl EngineKick {
    /// Wraps a word (for layouts other than the doorbell page, and for tests).
    pub fn from_word(word: SharedWord) -> Self {
        Self {
            word,
            last_kicked: 0,
        }
    }

    /// After publishing a producer index: whether to notify the engine's event channel.
    /// Returns `true` at most once per engine sleep (per `EngineKick`).
    #[inline]
    pub fn kick_needed(&mut self) -> bool {
        // The producer index must be visible before we read the sleep word.
        full_fence();
        let v = self.word.load(Ordering::Relaxed);
        if v & ENGINE_SLEEPING != 0 && v != self.last_kicked {
            self.last_kicked = v;
            true
        } else {
            false
        }
    }

    /// Raw value (for diagnostics).
    pub fn value(&self) -> u32 {
        self.word.load(Ordering::Relaxed)
    }
}

impl<const N: usize> crate::queue::Producer<N> {
    /// Publishes written slots and says whether the engine must be kicked (notified).
    #[inline]
    pub fn publish_and_check_kick(&mut self, engine: &mut EngineKick) -> bool {
        self.publish();
        engine.kick_needed()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn layout_and_header() {
        let r = SharedRegion::alloc(4096).unwrap();
        let db = DoorbellPage::init(r.clone(), 1).unwrap();
        assert_eq!(db.slots(), 31);
        let mut hdr = [0u8; 12];
        r.read(0, &mut hdr).unwrap();
        assert_eq!(&hdr, b"VRDB\x01\0\0\0\x1f\0\0\0");
        let q = db.queue(2).unwrap();
        assert_eq!((q.prod.offset(), q.cons.offset()), (384, 448));
        let c = db.cq(30).unwrap();
        assert_eq!(
            (c.arm.offset(), c.cons.offset()),
            (128 + 30 * 128, 192 + 30 * 128)
        );
        assert!(matches!(
            db.queue(31),
            Err(DoorbellError::NoSuchSlot { .. })
        ));
        assert_eq!(
            DoorbellPage::open(r.clone(), 2).err(),
            Some(DoorbellError::VersionMismatch { found: 1, want: 2 })
        );
        r.store_u32(field::SLOTS, 1000, Ordering::Relaxed).unwrap();
        assert_eq!(DoorbellPage::open(r.clone(), 1).unwrap().slots(), 31);
        r.store_u32(0, 0, Ordering::Relaxed).unwrap();
        assert!(matches!(
            DoorbellPage::open(r, 1),
            Err(DoorbellError::BadMagic { .. })
        ));
    }

    #[test]
    fn kick_only_when_sleeping_and_only_once() {
        let r = SharedRegion::alloc(4096).unwrap();
        let db = DoorbellPage::init(r, 1).unwrap();
        let mut e = db.engine_sleep().unwrap();
        let mut k = db.engine_kick().unwrap();
        assert!(!k.kick_needed());
        e.prepare_sleep();
        assert!(k.kick_needed());
        assert!(!k.kick_needed(), "one kick per sleep");
        e.wake();
        assert!(!k.kick_needed());
        e.prepare_sleep();
        assert!(k.kick_needed(), "a new sleep needs a new kick");
    }
}
