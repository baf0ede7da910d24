//! Memory regions: grant-backed memory the library allocates (Xen cannot grant memory a guest
//! already has), registered with the backend in a protection domain (`pd.rs`, which keeps
//! the registration cache).

use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use shared_ring::abi::control::access;
use shared_ring::SharedRegion;

use crate::error::{Error, Result};
use crate::pd::PdInner;

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
    pub(crate) region: SharedRegion,
    pub(crate) pages: usize,
    pub(crate) handle: u32,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    pub(crate) iova: u64,
    pub(crate) access: AccessFlags,
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
    /// A region of `len` bytes over `entry`, registered in `pd` (which takes it back on drop).
    pub(crate) fn new(entry: MrEntry, pd: Arc<PdInner>, len: usize) -> MemoryRegion {
        MemoryRegion {
            entry: Some(entry),
            pd,
            len,
        }
    }

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
    #[inline]
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
        if let Some(e) = self.entry.take() {
            self.pd.recycle(e);
        }
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
    #[inline]
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
