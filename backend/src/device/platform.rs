//! Glue between `xen_platform` handles and the device's inputs.
//!
//! The device takes every piece of shared memory as a [`shared_ring::SharedRegion`] that owns
//! its mapping; these helpers wrap granted pages and foreign mappings accordingly, and let an
//! event channel be the channel's [`Notifier`].

use std::ptr::NonNull;

use shared_ring::{MemError, SharedRegion};
use xen_platform::{EventChannel, ForeignMapping, SharedPages};

use super::Notifier;

/// A region over pages this backend allocated and granted (doorbell, event ring, queues, CQs).
/// The region keeps the pages (and their grant) alive until its last clone is dropped.
pub fn shared_pages_region(pages: SharedPages) -> Result<SharedRegion, MemError> {
    let len = pages.len();
    let base = NonNull::new(pages.as_ptr()).ok_or(MemError::BadRegionLength { len: 0 })?;
    // SAFETY: `pages` owns a live mapping of `len` bytes at `base`, readable and writable by
    // this process (the sharer's mapping is always read-write), and is moved into the region's
    // keep-alive, so the mapping outlives every access. The pages are shared with a guest and
    // accessed here only through the region's accessors, never through references.
    unsafe { SharedRegion::from_raw_parts(base, len, Box::new(pages)) }
}

/// A region over a guest's grants mapped by the daemon (memory regions). Returns the region and
/// whether it is writable (pass it as [`super::MrSetup::writable`]).
pub fn foreign_mapping_region(mapping: ForeignMapping) -> Result<(SharedRegion, bool), MemError> {
    let len = mapping.len();
    let writable = mapping.access().is_writable();
    let base = NonNull::new(mapping.as_ptr()).ok_or(MemError::BadRegionLength { len: 0 })?;
    // SAFETY: `mapping` owns a live mapping of `len` bytes at `base`, readable (and writable
    // when `writable`; the device never writes a region registered without write access, and
    // refuses write access on a read-only mapping), moved into the keep-alive so it outlives
    // every access. Access goes through the region's accessors only.
    let region = unsafe { SharedRegion::from_raw_parts(base, len, Box::new(mapping)) }?;
    Ok((region, writable))
}

impl Notifier for EventChannel {
    fn notify(&self) {
        if let Err(e) = EventChannel::notify(self) {
            tracing::warn!(port = %self.local_port(), "event channel notify failed: {e}");
        }
    }
}
