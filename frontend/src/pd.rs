//! Protection domains: the scope of memory regions and queue pairs, and the registration
//! cache of freed memory regions (reused without new grants or control requests).

use std::sync::{Arc, Mutex};

use shared_ring::abi::control::{Reply, Request};
use shared_ring::abi::page_dir::{dir_pages_needed, write_page_list, PageList, PAGE_LIST_LEN};
use shared_ring::{SharedRegion, PAGE_SIZE};
use xen_platform::Access;

use crate::channel::pages_for;
use crate::context::CtxInner;
use crate::error::{Error, Result};
use crate::mr::{AccessFlags, MemoryRegion, MrEntry};
use crate::qp::QueuePairBuilder;
use crate::CompletionQueue;

#[derive(Default)]
struct MrCache {
    entries: Vec<MrEntry>,
    pages: usize,
    stats: MrCacheStats,
}

/// Counters of a protection domain's registration cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MrCacheStats {
    /// `alloc_mr` calls served from the cache (no grant, no control request).
    pub hits: u64,
    /// `alloc_mr` calls that granted and registered new pages.
    pub misses: u64,
    /// Regions currently cached.
    pub cached_regions: usize,
    /// Pages currently cached.
    pub cached_pages: usize,
}

pub(crate) struct PdInner {
    pub ctx: Arc<CtxInner>,
    pub handle: u32,
    cache: Mutex<MrCache>,
}

impl PdInner {
    /// Takes back the registration of a dropped memory region: into the cache while it has
    /// room (and the channel lives), else deregistered.
    pub(crate) fn recycle(&self, e: MrEntry) {
        let limit = self.ctx.mr_cache_pages;
        if !self.ctx.chan.is_lost() {
            let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if c.pages + e.pages <= limit {
                c.pages += e.pages;
                c.entries.push(e);
                return;
            }
        }
        self.dereg(e);
    }

    fn dereg(&self, e: MrEntry) {
        if !self.ctx.chan.is_lost() {
            if let Err(err) = self.ctx.chan.call(Request::DeregMr { mr: e.handle }) {
                tracing::warn!(mr = e.handle, "deregistering a memory region: {err}");
            }
        }
        // Dropping the region ends the grants.
        drop(e);
    }
}

impl Drop for PdInner {
    fn drop(&mut self) {
        let entries = std::mem::take(
            &mut self
                .cache
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .entries,
        );
        for e in entries {
            self.dereg(e);
        }
        if !self.ctx.chan.is_lost() {
            if let Err(e) = self.ctx.chan.call(Request::DeallocPd { pd: self.handle }) {
                tracing::warn!(pd = self.handle, "deallocating a protection domain: {e}");
            }
        }
    }
}

/// A region registered with [`ProtectionDomain::reg_grants`]: the backend's handle and keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawMr {
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// A protection domain: the scope of memory regions and queue pairs.
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

impl ProtectionDomain {
    pub(crate) fn alloc(ctx: Arc<CtxInner>) -> Result<ProtectionDomain> {
        let handle = match ctx.chan.call(Request::AllocPd)? {
            Reply::Handle(h) => h,
            r => return Err(Error::protocol(format!("AllocPd answered with {r:?}"))),
        };
        Ok(ProtectionDomain {
            inner: Arc::new(PdInner {
                ctx,
                handle,
                cache: Mutex::new(MrCache::default()),
            }),
        })
    }

    /// The backend's handle.
    pub fn handle(&self) -> u32 {
        self.inner.handle
    }

    /// Allocates `len` bytes of grant-backed memory (whole pages, zeroed) and registers it.
    /// A freed region of the same page count and access is reused from the cache when there
    /// is one: no new grants and no control request.
    pub fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "a memory region needs at least one byte".into(),
            ));
        }
        let pages = pages_for(len);
        let cached = {
            let mut c = self.inner.cache.lock().unwrap_or_else(|e| e.into_inner());
            let hit = c
                .entries
                .iter()
                .position(|e| e.pages == pages && e.access == access);
            match hit {
                Some(i) => {
                    let e = c.entries.swap_remove(i);
                    c.pages -= e.pages;
                    c.stats.hits += 1;
                    Some(e)
                }
                None => {
                    c.stats.misses += 1;
                    None
                }
            }
        };
        let entry = match cached {
            Some(e) => {
                // A recycled region starts zeroed, like a fresh one.
                e.region.zero(0, e.region.len())?;
                e
            }
            None => self.register(pages, access)?,
        };
        Ok(MemoryRegion::new(entry, self.inner.clone(), len))
    }

    fn register(&self, pages: usize, access: AccessFlags) -> Result<MrEntry> {
        let ctx = &self.inner.ctx;
        let chan = &ctx.chan;
        chan.check_lost()?;
        let g = crate::shm::share(
            &chan.platform,
            chan.backend,
            pages,
            Access::ReadWrite,
            |_| Ok(()),
        )?;
        // Long page lists travel in directory pages, granted read-only for the request.
        let ndir = dir_pages_needed(pages);
        let dir = if ndir > 0 {
            Some(crate::shm::share(
                &chan.platform,
                chan.backend,
                ndir,
                Access::ReadOnly,
                |_| Ok(()),
            )?)
        } else {
            None
        };
        let list: PageList = match &dir {
            None => PageList::inline(&g.grefs)?,
            Some(d) => {
                let pages: Vec<SharedRegion> = (0..ndir)
                    .map(|i| d.region.subregion(i * PAGE_SIZE, PAGE_SIZE))
                    .collect::<std::result::Result<_, _>>()?;
                write_page_list(&g.grefs, &pages, &d.grefs)
                    .map_err(|e| Error::protocol(format!("page directory: {e}")))?
            }
        };
        let _ = PAGE_LIST_LEN;
        let reply = chan.call(Request::RegMr {
            pd: self.inner.handle,
            access: access.bits(),
            length: (pages * PAGE_SIZE) as u64,
            iova: g.addr,
            first_page_offset: 0,
            pages: list,
        })?;
        drop(dir);
        match reply {
            Reply::Mr { mr, lkey, rkey } => Ok(MrEntry {
                region: g.region,
                pages,
                handle: mr,
                lkey,
                rkey,
                iova: g.addr,
                access,
            }),
            r => Err(Error::protocol(format!("RegMr answered with {r:?}"))),
        }
    }

    /// Registers pages the caller granted itself (`grefs`, one per page, in order, granted
    /// read-write to the backend — [`Context::platform`](crate::Context::platform)): a region
    /// of `length` bytes starting `first_page_offset` bytes into the first page, addressed by
    /// peers as `iova`. No cache is involved: [`ProtectionDomain::dereg_raw`] ends the keys at
    /// once. The caller keeps the pages granted until then. Work requests name such a region
    /// with [`QueuePair::post_send_sges`](crate::QueuePair::post_send_sges) (SGE offsets count
    /// from the region's first byte).
    pub fn reg_grants(
        &self,
        grefs: &[u32],
        first_page_offset: u32,
        length: u64,
        iova: u64,
        access: AccessFlags,
    ) -> Result<RawMr> {
        let chan = &self.inner.ctx.chan;
        chan.check_lost()?;
        if grefs.is_empty() || first_page_offset as usize >= PAGE_SIZE || length == 0 {
            return Err(Error::InvalidArgument(format!(
                "a region of {length} bytes at page offset {first_page_offset} over {} pages",
                grefs.len()
            )));
        }
        let ndir = dir_pages_needed(grefs.len());
        let dir = if ndir > 0 {
            Some(crate::shm::share(
                &chan.platform,
                chan.backend,
                ndir,
                Access::ReadOnly,
                |_| Ok(()),
            )?)
        } else {
            None
        };
        let list: PageList = match &dir {
            None => PageList::inline(grefs)?,
            Some(d) => {
                let pages: Vec<SharedRegion> = (0..ndir)
                    .map(|i| d.region.subregion(i * PAGE_SIZE, PAGE_SIZE))
                    .collect::<std::result::Result<_, _>>()?;
                write_page_list(grefs, &pages, &d.grefs)
                    .map_err(|e| Error::protocol(format!("page directory: {e}")))?
            }
        };
        let reply = chan.call(Request::RegMr {
            pd: self.inner.handle,
            access: access.bits(),
            length,
            iova,
            first_page_offset,
            pages: list,
        })?;
        drop(dir);
        match reply {
            Reply::Mr { mr, lkey, rkey } => Ok(RawMr {
                handle: mr,
                lkey,
                rkey,
            }),
            r => Err(Error::protocol(format!("RegMr answered with {r:?}"))),
        }
    }

    /// Deregisters a region of [`ProtectionDomain::reg_grants`]: its keys are invalid when
    /// this returns (a peer's RDMA with the old rkey fails with a remote access error).
    pub fn dereg_raw(&self, mr: RawMr) -> Result<()> {
        self.inner.ctx.chan.check_lost()?;
        match self
            .inner
            .ctx
            .chan
            .call(Request::DeregMr { mr: mr.handle })?
        {
            Reply::Empty => Ok(()),
            r => Err(Error::protocol(format!("DeregMr answered with {r:?}"))),
        }
    }

    /// Registration-cache counters.
    pub fn mr_cache_stats(&self) -> MrCacheStats {
        let c = self.inner.cache.lock().unwrap_or_else(|e| e.into_inner());
        MrCacheStats {
            cached_regions: c.entries.len(),
            cached_pages: c.pages,
            ..c.stats
        }
    }

    /// Deregisters every cached region (their grants end).
    pub fn flush_mr_cache(&self) {
        let entries = {
            let mut c = self.inner.cache.lock().unwrap_or_else(|e| e.into_inner());
            c.pages = 0;
            std::mem::take(&mut c.entries)
        };
        for e in entries {
            self.inner.dereg(e);
        }
    }

    /// A queue pair builder: sends complete on `send_cq`, receives on `recv_cq`.
    pub fn create_qp<'a>(
        &'a self,
        send_cq: &'a CompletionQueue,
        recv_cq: &'a CompletionQueue,
    ) -> QueuePairBuilder<'a> {
        QueuePairBuilder::new(self, send_cq, recv_cq)
    }
}
