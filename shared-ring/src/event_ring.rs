//! The event ring: one page through which the backend reports asynchronous events (QP fatal,
//! CQ overrun, device lost, ...) to the frontend.
//!
//! ```text
//!    0  prod u32   (backend writes)
//!   64  cons u32   (frontend writes)
//!  128  64 event slots of 32 bytes (see abi::event)
//! ```
//! The backend allocates and zeroes the page, grants it (its gref is in the `Init` reply) and
//! notifies the channel's event channel after publishing events. A full ring means the frontend
//! is not reading its events: the backend drops further events and counts them.

use crate::abi::event::EVENT_LEN;
use crate::mem::{MemError, SharedRegion, PAGE_SIZE};
use crate::queue::{Consumer, Producer};

/// Byte offsets in the event ring page.
pub mod field {
    pub const PROD: usize = 0;
    pub const CONS: usize = 64;
    pub const SLOTS: usize = 128;
}

/// Number of event slots.
pub const EVENT_SLOTS: usize = 64;
/// Size of the event ring.
pub const EVENT_RING_LEN: usize = PAGE_SIZE;

const _: () = assert!(field::SLOTS + EVENT_SLOTS * EVENT_LEN <= EVENT_RING_LEN);

/// The backend's end (producer) of an event ring in a zeroed page.
pub fn producer(page: &SharedRegion) -> Result<Producer<EVENT_LEN>, MemError> {
    Ok(Producer::new(
        page.slots(field::SLOTS, EVENT_SLOTS)?,
        page.word(field::PROD)?,
        page.word(field::CONS)?,
        0,
    ))
}

/// The frontend's end (consumer) of an event ring.
pub fn consumer(page: &SharedRegion) -> Result<Consumer<EVENT_LEN>, MemError> {
    Ok(Consumer::new(
        page.slots(field::SLOTS, EVENT_SLOTS)?,
        page.word(field::PROD)?,
        page.word(field::CONS)?,
        0,
    ))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::abi::event::{EventKind, EventRepr};
    use crate::queue::QueueError;

    #[test]
    fn events_flow_and_full_ring_is_reported() {
        let page = SharedRegion::alloc(EVENT_RING_LEN).unwrap();
        let mut p = producer(&page).unwrap();
        let mut c = consumer(&page).unwrap();
        let ev = EventRepr {
            kind: EventKind::QpFatal,
            handle: 3,
            detail: 0,
        };
        for _ in 0..EVENT_SLOTS {
            p.write(&ev.to_bytes()).unwrap();
        }
        assert_eq!(p.write(&ev.to_bytes()), Err(QueueError::Full { size: 64 }));
        p.publish();
        let got = c.pop().unwrap().unwrap();
        assert_eq!(EventRepr::from_bytes(&got).unwrap(), ev);
        c.release();
        assert!(p.write(&ev.to_bytes()).is_ok());
        // a hostile consumer index is an error, not trusted
        page.store_u32(field::CONS, 1000, std::sync::atomic::Ordering::Relaxed)
            .unwrap();
        assert!(matches!(p.free(), Err(QueueError::BadPeerIndex { .. })));
    }
}
