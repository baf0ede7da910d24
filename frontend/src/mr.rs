//! Protection domains and memory regions: grant-backed memory the library allocates (Xen cannot
//! grant memory a guest already has), registered with the backend, with a registration cache.

use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex};

use shared_ring::abi::control::{access, Reply, Request};
use shared_ring::abi::page_dir::{dir_pages_needed, write_page_list, PageList, PAGE_LIST_LEN};
use shared_ring::{SharedRegion, PAGE_SIZE};
use xen_platform::Access;

use crate::channel::pages_for;
use crate::context::CtxInner;
use crate::error::{Error, Result};
use crate::qp::QueuePairBuilder;
use crate::CompletionQueue;

/// What a memory region allows (ibverbs' `IBV_ACCESS_*`). Local read is always allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AccessFlags(u32);

impl AccessFlags {
    /// Only local reads (sends from it).
    pub const LOCAL_READ: AccessFlags = AccessFlags(0);
    /// Receives and RDMA READ responses may write it.
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(access::LOCAL_WRITE);
    /// Remote peers may RDMA WRITE it (requires LOCAL_WRITE in ibverbs; implied here).
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(access::REMOTE_WRITE | access::LOCAL_WRITE);
    /// Remote peers may RDMA READ it.
    pub const REMOTE_READ: AccessFlags = AccessFlags(access::REMOTE_READ);
    /// Everything.
    pub const ALL: AccessFlags = AccessFlags(access::ALL);

    /// The protocol bits.
    pub fn bits(self) -> u32 {
        self.0
    }
}

impl std::ops::BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, o: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | o.0)
    }
}

/// A registered, granted allocation (what the cache keeps).
pub(crate) struct MrEntry {
    region: SharedRegion,
    pages: usize,
    handle: u32,
    lkey: u32,
    rkey: u32,
    iova: u64,
    access: AccessFlags,
}

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
        Ok(MemoryRegion {
            entry: Some(entry),
            pd: self.inner.clone(),
            len,
        })
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

/// Memory registered with the device: grant-backed pages mapped into this process and into
/// the backend.
///
/// The bytes are shared with another domain and may change at any time (RDMA WRITE, READ
/// responses, receives), so they are never exposed as a Rust slice: copy in with
/// [`MemoryRegion::write`], copy out with [`MemoryRegion::read`]. Work requests name parts of
/// the region with [`MemoryRegion::slice`]; peers address it with [`MemoryRegion::remote`].
///
/// Keep a region alive until the work requests that use it have completed: dropping it
/// deregisters it (or returns it to the cache, where its keys stay valid), and a request
/// still in flight then fails or touches the recycled memory — never this process's other
/// memory.
pub struct MemoryRegion {
    entry: Option<MrEntry>,
    pd: Arc<PdInner>,
    len: usize,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = self.e();
        f.debug_struct("MemoryRegion")
            .field("len", &self.len)
            .field("lkey", &e.lkey)
            .field("rkey", &e.rkey)
            .field("iova", &format_args!("{:#x}", e.iova))
            .finish()
    }
}

impl MemoryRegion {
    #[inline]
    fn e(&self) -> &MrEntry {
        self.entry.as_ref().expect("entry lives until drop")
    }
    /// Length in bytes (as asked; the registration covers whole pages).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Never true.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Local key (for SGEs).
    pub fn lkey(&self) -> u32 {
        self.e().lkey
    }
    /// Remote key (for peers' RDMA).
    pub fn rkey(&self) -> u32 {
        self.e().rkey
    }
    /// The address peers use for byte 0 of the region.
    pub fn iova(&self) -> u64 {
        self.e().iova
    }
    /// The access it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.e().access
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "{len} bytes at offset {offset} are outside the {}-byte memory region",
                self.len
            ))),
        }
    }

    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        Ok(self.e().region.write_bytes(offset, data)?)
    }

    /// Copies bytes at `offset` out of the region into `buf`.
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len())?;
        Ok(self.e().region.read_bytes(offset, buf)?)
    }

    /// Sets `len` bytes at `offset` to `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        self.check(offset, len)?;
        Ok(self.e().region.fill_bytes(offset, len, byte)?)
    }

    /// A copy of the whole region.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        // In bounds by construction.
        let _ = self.e().region.read_bytes(0, &mut v);
        v
    }

    /// The part `range` of the region, for a work request's scatter/gather list.
    ///
    /// # Panics
    /// If `range` is outside the region or longer than 4 GiB, like slice indexing.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> MrSlice<'_> {
        let (start, end) = bounds(range, self.len);
        let len = u32::try_from(end - start).expect("an SGE covers at most 4 GiB - 1");
        MrSlice {
            mr: self,
            offset: start as u64,
            len,
        }
    }

    /// What a peer needs to RDMA READ/WRITE this region.
    pub fn remote(&self) -> RemoteMr {
        RemoteMr {
            addr: self.iova(),
            len: self.len as u64,
            rkey: self.rkey(),
        }
    }
}

fn bounds(range: impl RangeBounds<usize>, len: usize) -> (usize, usize) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1).expect("range start overflows"),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1).expect("range end overflows"),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    assert!(
        start <= end && end <= len,
        "range {start}..{end} is outside the {len}-byte memory region"
    );
    (start, end)
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        let Some(e) = self.entry.take() else { return };
        let limit = self.pd.ctx.mr_cache_pages;
        if !self.pd.ctx.chan.is_lost() {
            let mut c = self.pd.cache.lock().unwrap_or_else(|e| e.into_inner());
            if c.pages + e.pages <= limit {
                c.pages += e.pages;
                c.entries.push(e);
                return;
            }
        }
        self.pd.dereg(e);
    }
}

/// A part of a local memory region, as a work request's scatter/gather entry.
#[derive(Clone, Copy)]
pub struct MrSlice<'a> {
    pub(crate) mr: &'a MemoryRegion,
    pub(crate) offset: u64,
    pub(crate) len: u32,
}

impl std::fmt::Debug for MrSlice<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrSlice")
            .field("lkey", &self.mr.lkey())
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl MrSlice<'_> {
    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }
    /// True for an empty slice.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub(crate) fn sge(&self) -> shared_ring::abi::wqe::Sge {
        shared_ring::abi::wqe::Sge {
            offset: self.offset,
            length: self.len,
            lkey: self.mr.lkey(),
        }
    }
}

/// A peer's memory region (or part of it), as RDMA READ/WRITE address it. Plain data: send
/// it to the peer any way you like (`Display`/`FromStr` give `addr:len:rkey` in hex).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteMr {
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
}

impl RemoteMr {
    /// The part `range` (byte offsets into this remote region).
    ///
    /// # Panics
    /// If `range` is outside the region.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> RemoteMr {
        let len = usize::try_from(self.len).expect("remote region fits the address space");
        let (s, e) = bounds(range, len);
        RemoteMr {
            addr: self.addr + s as u64,
            len: (e - s) as u64,
            rkey: self.rkey,
        }
    }
}

impl std::fmt::Display for RemoteMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:x}:{:x}:{:x}", self.addr, self.len, self.rkey)
    }
}

impl std::str::FromStr for RemoteMr {
    type Err = Error;
    fn from_str(s: &str) -> Result<RemoteMr> {
        let bad = || Error::InvalidArgument(format!("{s:?} is not addr:len:rkey (hex)"));
        let mut it = s.trim().split(':');
        let mut next = || it.next().ok_or_else(bad);
        let addr = u64::from_str_radix(next()?, 16).map_err(|_| bad())?;
        let len = u64::from_str_radix(next()?, 16).map_err(|_| bad())?;
        let rkey = u32::from_str_radix(next()?, 16).map_err(|_| bad())?;
        Ok(RemoteMr { addr, len, rkey })
    }
}
