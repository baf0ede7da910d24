//! Memory shared with another domain: the mappings, and the one conversion into the audited
//! accessor type.
//!
//! **Contract.** Pages shared with (or mapped from) another domain are written by a party we
//! do not trust, at any time, concurrently with us. Creating a Rust reference (`&[u8]`,
//! `&mut [u8]`, `&T`) into them would let the compiler assume the bytes do not change, which is
//! undefined behaviour when they do. So this crate never hands out references into shared pages.
//! Code that reads or writes them turns the owning handle into a [`shared_ring::SharedRegion`]
//! (`SharedPages::into_region`, `ForeignMapping::into_region`, both through [`into_region`]
//! here): `shared_ring::mem` is the audited module that owns every access and its memory
//! ordering and copy rules. For inspection without access there is [`PageSpan`] — a pointer, a
//! length, and whether writing is allowed — valid for as long as the handle that owns the
//! mapping lives (the span borrows it).

use std::marker::PhantomData;
use std::os::fd::AsFd;
use std::ptr::NonNull;

use rustix::mm::{MapFlags, ProtFlags};

use shared_ring::{MemError, SharedRegion};

use crate::error::{Error, Result};

/// Where a handle's pages are mapped: pointer, length, writability, borrowed from the handle.
/// It gives no access to the bytes; see the module docs for the rules of access.
#[derive(Debug, Clone, Copy)]
pub struct PageSpan<'a> {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
    _owner: PhantomData<&'a ()>,
}

impl PageSpan<'_> {
    /// Start of the pages. Valid for `len()` bytes while the owning handle lives. Never make a
    /// Rust reference from it; access the bytes through the handle's `into_region()`.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes (a whole number of pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false for a live mapping; present because `len` is.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether writes are allowed. Writing to read-only pages faults (SIGSEGV): the mapping
    /// is `PROT_READ` and, on the simulated host, the file behind it is opened read-only too.
    pub fn is_writable(&self) -> bool {
        self.writable
    }
}

/// A platform handle that owns one [`Mapping`] (shared pages, a foreign mapping).
pub(crate) trait OwnsMapping {
    fn mapping(&self) -> &Mapping;
}

/// Turns a handle into a [`shared_ring::SharedRegion`] over its pages that keeps the handle (and
/// so the mapping, the grant and any unmap-notify) alive until the region's last clone is
/// dropped. The only place pages of this crate become a `shared_ring` region.
///
/// A read-only mapping gives a region that must only be read: the caller's protocol never
/// writes to it (a write faults, see [`PageSpan::is_writable`]).
pub(crate) fn into_region<H>(handle: H) -> std::result::Result<SharedRegion, MemError>
where
    H: OwnsMapping + Send + Sync + 'static,
{
    let (base, len) = {
        let m = handle.mapping();
        (m.ptr, m.len)
    };
    // SAFETY: `handle` owns the mmap of `len` bytes at `base` (a `Mapping` unmaps only on drop,
    // and moving the handle does not move the mapped pages); it is moved into the region's
    // keep-alive, so the pages stay mapped as long as any clone of the region exists. The pages
    // are readable, and writable unless mapped read-only, in which case the caller only reads
    // (documented above). This crate makes no Rust reference into them, and after this call the
    // process reaches them only through the region's atomic and bulk-copy accessors.
    unsafe { SharedRegion::from_raw_parts(base, len, Box::new(handle)) }
}

/// An owned `mmap` of pages; unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
    /// The pages were handed over as private memory ([`Mapping::release_as_private_copy`]):
    /// not unmapped on drop.
    released: bool,
}

// SAFETY: a Mapping is an address range; it has no thread affinity, and the bytes behind it are
// only ever accessed through raw pointers by callers who follow the module contract.
unsafe impl Send for Mapping {}
// SAFETY: as above; &Mapping only gives out the pointer value.
unsafe impl Sync for Mapping {}

fn prot(writable: bool) -> ProtFlags {
    if writable {
        ProtFlags::READ | ProtFlags::WRITE
    } else {
        ProtFlags::READ
    }
}

impl Mapping {
    /// Map `len` bytes of `fd` at `offset`, shared.
    pub(crate) fn map_fd(fd: impl AsFd, offset: u64, len: usize, writable: bool) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument("mapping of zero bytes".into()));
        }
        // SAFETY: we ask the kernel for a fresh address range (no MAP_FIXED), so no existing
        // Rust object is affected; the result is owned by the returned Mapping.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                prot(writable),
                MapFlags::SHARED,
                fd,
                offset,
            )
        }
        .map_err(|e| Error::os(format!("mmap {len} bytes at offset {offset:#x}"), e.into()))?;
        Ok(Mapping {
            ptr: NonNull::new(p.cast()).expect("mmap returned NULL"),
            len,
            writable,
            released: false,
        })
    }

    /// Reserve `len` bytes of address space (inaccessible) to be filled with [`Mapping::map_fixed`].
    pub(crate) fn reserve(len: usize, writable: bool) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument("mapping of zero bytes".into()));
        }
        // SAFETY: fresh anonymous range, owned by the returned Mapping.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }
        .map_err(|e| Error::os(format!("reserve {len} bytes of address space"), e.into()))?;
        Ok(Mapping {
            ptr: NonNull::new(p.cast()).expect("mmap returned NULL"),
            len,
            writable,
            released: false,
        })
    }

    /// Map `len` bytes of `fd` at `offset` over `[at, at+len)` inside this reservation.
    pub(crate) fn map_fixed(
        &mut self,
        at: usize,
        fd: impl AsFd,
        offset: u64,
        len: usize,
    ) -> Result<()> {
        if at.checked_add(len).map_or(true, |end| end > self.len) {
            return Err(Error::InvalidArgument(format!(
                "segment {at:#x}+{len:#x} outside a {:#x}-byte reservation",
                self.len
            )));
        }
        // SAFETY: [at, at+len) lies inside our own reservation (checked above), which no Rust
        // object references; MAP_FIXED replaces only those pages.
        unsafe {
            rustix::mm::mmap(
                self.ptr.as_ptr().add(at).cast(),
                len,
                prot(self.writable),
                MapFlags::SHARED | MapFlags::FIXED,
                fd,
                offset,
            )
        }
        .map_err(|e| {
            Error::os(
                format!("mmap segment of {len} bytes at offset {offset:#x}"),
                e.into(),
            )
        })?;
        Ok(())
    }

    /// Copies the `len` bytes at `to` into the pages, then moves the pages' mapping over
    /// `[to, to+len)` (`mremap(MREMAP_FIXED)`: the pages that were there are replaced in one
    /// step), so the same addresses now show the same bytes, backed by these pages.
    ///
    /// # Safety
    /// `[to, to+len)` must be page-aligned, mapped readable and writable, and owned by the
    /// caller for as long as this mapping lives there (memory nothing else will unmap or
    /// remap). Nothing may write it during the call.
    pub(crate) unsafe fn adopt_range(&mut self, to: *mut u8) -> Result<()> {
        if !self.writable || (to as usize) % crate::PAGE_SIZE != 0 {
            return Err(Error::InvalidArgument(
                "adopting a range needs writable pages and a page-aligned address".into(),
            ));
        }
        // SAFETY: the caller guarantees [to, to+len) is readable and quiescent; our pages
        // [ptr, ptr+len) are a distinct, writable mapping we own; the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(to, self.ptr.as_ptr(), self.len) };
        // SAFETY: we own the old range; the caller owns the target range and gives it up to
        // this mapping (MREMAP_FIXED replaces whatever was mapped there).
        let p = unsafe {
            rustix::mm::mremap_fixed(
                self.ptr.as_ptr().cast(),
                self.len,
                self.len,
                rustix::mm::MremapFlags::MAYMOVE,
                to.cast(),
            )
        }
        .map_err(|e| Error::os(format!("mremap {} bytes to {to:p}", self.len), e.into()))?;
        self.ptr = NonNull::new(p.cast()).expect("mremap returned NULL");
        Ok(())
    }

    /// Replaces the pages, at the same addresses, by private anonymous memory holding the
    /// same bytes, and gives that memory up (it is not unmapped on drop: it belongs to
    /// whoever owned the range before [`Mapping::adopt_range`]). The pages themselves are
    /// then unmapped (the grant ends when the handle is dropped).
    ///
    /// # Safety
    /// Nothing may write the pages during the call (the peer no longer uses them).
    pub(crate) unsafe fn release_as_private_copy(&mut self) -> Result<()> {
        if self.released {
            return Ok(());
        }
        // SAFETY: a fresh anonymous range, ours until moved below.
        let tmp = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                self.len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }
        .map_err(|e| Error::os(format!("mmap {} private bytes", self.len), e.into()))?;
        // SAFETY: both ranges are mapped (ours and the fresh one), distinct, `len` bytes; the
        // caller guarantees nobody writes the pages meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), tmp.cast::<u8>(), self.len) };
        // SAFETY: moves our fresh private range over our own pages (replacing them).
        let r = unsafe {
            rustix::mm::mremap_fixed(
                tmp,
                self.len,
                self.len,
                rustix::mm::MremapFlags::MAYMOVE,
                self.ptr.as_ptr().cast(),
            )
        };
        if let Err(e) = r {
            // SAFETY: `tmp` is still our fresh range.
            let _ = unsafe { rustix::mm::munmap(tmp, self.len) };
            return Err(Error::os(
                format!("mremap {} bytes back", self.len),
                e.into(),
            ));
        }
        self.released = true;
        Ok(())
    }

    pub(crate) fn span(&self) -> PageSpan<'_> {
        PageSpan {
            ptr: self.ptr,
            len: self.len,
            writable: self.writable,
            _owner: PhantomData,
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // SAFETY: we own [ptr, ptr+len) since mmap gave it to us; nothing references it after
        // the owning handle is dropped (regions borrow the handle).
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) } {
            tracing::warn!("munmap of {} bytes failed: {e}", self.len);
        }
    }
}
