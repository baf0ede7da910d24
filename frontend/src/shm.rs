//! Pages shared with the backend, as `shared_ring::mem` regions.
//!
//! The platform's page handles become [`SharedRegion`]s (the audited accessor module of
//! `shared-ring`) through their `into_region()`, which keeps the handle alive inside the region
//! so the memory outlives every access. This module only adds the frontend's bookkeeping (grant
//! references, the mapping address); nothing in the library sees a pointer, and byte copies use
//! the region's own `read_bytes` / `write_bytes` / `fill_bytes`.

use shared_ring::SharedRegion;
use xen_platform::{Access, DomId, Platform, SharedPages};

use crate::error::Result;

/// Pages this domain granted to the backend, as a region, with their grant references.
pub(crate) struct Granted {
    pub region: SharedRegion,
    pub grefs: Vec<u32>,
    /// Where the pages are mapped in this process (the natural iova of a memory region).
    pub addr: u64,
}

/// Allocates `count` zeroed pages granted to `to`. `prepare` runs on the platform handle
/// before it is wrapped (to set an unmap-notify).
pub(crate) fn share(
    platform: &Platform,
    to: DomId,
    count: usize,
    access: Access,
    prepare: impl FnOnce(&SharedPages) -> Result<()>,
) -> Result<Granted> {
    let pages = platform.share_pages(to, count, access)?;
    prepare(&pages)?;
    let grefs = pages.grant_refs().iter().map(|g| g.0).collect();
    let addr = pages.as_ptr() as u64;
    Ok(Granted {
        region: pages.into_region()?,
        grefs,
        addr,
    })
}

/// Maps the backend's grants `refs` (contiguously) as a region. A read-only mapping (the CQ
/// pages) is only ever read: the frontend writes its CQ indexes in the doorbell page.
pub(crate) fn map(
    platform: &Platform,
    from: DomId,
    refs: &[u32],
    access: Access,
) -> Result<SharedRegion> {
    let refs: Vec<_> = refs.iter().map(|&g| xen_platform::GrantRef(g)).collect();
    Ok(platform.map_grants(from, &refs, access)?.into_region()?)
}
