//! `vrdma`: RDMA verbs for Xen guests, over memory shared with the vrdma backend.
//!
//! The shape is that of the `ibverbs` crate: a [`Context`] (one channel to the device) gives
//! [`ProtectionDomain`]s and [`CompletionQueue`]s; a protection domain gives
//! [`MemoryRegion`]s and [`QueuePair`]s. Privileged verbs (create, register, connect) go to the
//! backend over the channel's control ring. Posting and polling do not: in [`Mode::Bypass`]
//! (the default) a post writes a WQE into a granted queue page and release-stores the producer
//! index in the doorbell page, and a poll reads the next CQE's phase bit — **no system call on
//! either path**. The event channel is notified only when the doorbell page's sleep word says
//! the backend's engine sleeps, at most once per sleep. [`Mode::Mediated`] sends every post and
//! poll over the control ring instead (the "basic split driver" baseline); same API.
//!
//! ```no_run
//! use vrdma::{AccessFlags, Context};
//! # fn main() -> vrdma::Result<()> {
//! let ctx = Context::open()?;                      // XenStore handshake, channel, pages
//! let pd = ctx.alloc_pd()?;
//! let mut cq = ctx.create_cq(64)?;
//! let mut qp = pd.create_qp(&cq, &cq).build()?;
//! let mr = pd.alloc_mr(4096, AccessFlags::ALL)?;   // grant-backed, registered
//! # let peer = qp.endpoint();
//! qp.connect(&peer)?;                              // the peer's `endpoint()`
//! mr.write(0, b"hello")?;                          // copy-in: no &mut [u8] into shared memory
//! qp.post_send(&[mr.slice(0..5)], 1)?;
//! let mut wc = [vrdma::WorkCompletion::default(); 8];
//! let done = cq.wait(&mut wc, Some(std::time::Duration::from_secs(1)))?;
//! assert!(done.iter().all(|c| c.is_ok()));
//! # Ok(()) }
//! ```
//!
//! **Memory safety.** A memory region's pages are shared with another domain and written by
//! RDMA at any time, so the library never hands out `&[u8]`/`&mut [u8]` into them (that would
//! let the compiler assume bytes do not change under it: undefined behaviour). Access is by
//! copy-in/copy-out ([`MemoryRegion::write`], [`MemoryRegion::read`]), implemented with
//! atomic word accesses in `shared_ring::mem`, the only module that touches shared memory.
//! See `docs/frontend.md`.

mod channel;
mod cm;
mod context;
mod control;
mod cq;
mod error;
mod mr;
mod pd;
mod qp;
mod shm;
mod signal;

pub use cm::{CmInfo, ConnRequest, Listener, MAX_PRIVATE_DATA};
pub use context::{Context, ContextBuilder, GidEntry, Mode, MODE_ENV};
pub use cq::{CompletionQueue, WorkCompletion};
pub use error::{Error, Result};
pub use mr::{AccessFlags, MemoryRegion, MrSlice, RemoteMr};
pub use pd::{MrCacheStats, ProtectionDomain, RawMr};
pub use qp::{
    AddressVector, QpConnector, QpEndpoint, QueuePair, QueuePairBuilder, SendOp, SendWr, WrData,
};

pub use shared_ring::abi::control::{ChannelStats, DeviceAttrs, Op, Status};
pub use shared_ring::abi::cqe::{CqeOpcode as WcOpcode, CqeStatus as WcStatus};
pub use shared_ring::abi::event::EventKind;
pub use shared_ring::abi::wqe::{Sge, MAX_INLINE, MAX_SGE};

/// An asynchronous event from the backend (QP fatal, CQ overrun, device lost, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    pub kind: EventKind,
    /// The backend handle of the QP, CQ or listener concerned (0 for device events).
    pub handle: u32,
    /// Kind-specific detail.
    pub detail: u64,
}

impl From<shared_ring::abi::event::EventRepr> for AsyncEvent {
    fn from(e: shared_ring::abi::event::EventRepr) -> Self {
        AsyncEvent {
            kind: e.kind,
            handle: e.handle,
            detail: e.detail,
        }
    }
}
