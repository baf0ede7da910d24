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
        // SAFETY: we own [ptr, ptr+len) since mmap gave it to us; nothing references it after
        // the owning handle is dropped (regions borrow the handle).
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) } {
            tracing::warn!("munmap of {} bytes failed: {e}", self.len);
        }
    }
}
