//! Memory shared between the vrdma frontend and backend.
//!
//! * [`mem`] — the one module with raw access to shared memory: bounds-checked regions,
//!   atomic words, slot arrays; objects are copied out, never referenced.
//! * [`xen_ring`] — Xen's `io/ring.h` ring (front and back ends), byte-compatible, with the
//!   exact notification hold-off and the backend hardening of the C macros.
//! * [`queue`] — SPSC slot queues with indexes in shared words (send/receive queues).
//! * [`cq`] — completion queues with an owner/phase bit, and CQ arming.
//! * [`doorbell`] — the per-channel doorbell page and the engine's "kick me" word.
//! * [`event_ring`] — the asynchronous event ring page.
//! * [`abi`] — slot formats: control requests/responses, WQEs, CQEs, events, page lists.
//!
//! Nothing here knows about grants or event channels: callers map pages into
//! [`mem::SharedRegion`]s and send notifications when a `*_check_notify`/`*_needed` call says
//! so. The protocol is documented in `docs/protocol.md`.

pub mod abi;
pub mod cq;
pub mod doorbell;
pub mod event_ring;
pub mod mem;
pub mod queue;
pub mod xen_ring;

pub use abi::PROTOCOL_VERSION;
pub use mem::{MemError, SharedRegion, SharedWord, SlotArray, PAGE_SIZE};
pub use xen_ring::{BackRing, FrontRing, RingError, RingIdx};

/// Front end of a channel's control ring (frontend: requests out, responses in).
pub type ControlFrontRing = FrontRing<{ abi::control::CONTROL_SLOT_LEN }>;
/// Back end of a channel's control ring (backend: requests in, responses out).
pub type ControlBackRing = BackRing<{ abi::control::CONTROL_SLOT_LEN }>;
/// Frontend end of a send or receive queue (create with [`queue::Producer::with_owner`] and
/// [`abi::wqe::field::OWNER`]).
pub type WqProducer = queue::Producer<{ abi::wqe::WQE_LEN }>;
/// Backend (engine) end of a send or receive queue.
pub type WqConsumer = queue::Consumer<{ abi::wqe::WQE_LEN }>;
