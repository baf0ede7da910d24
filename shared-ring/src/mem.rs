//! The one module that touches shared memory.
//!
//! Memory shared with another domain is untrusted and concurrently written, so it is never seen
//! as a Rust reference to data. Every access here is an atomic operation on one aligned 32-bit
//! word: index words with the ordering the caller asks for, payload copies as relaxed word
//! loads/stores. A racing peer can therefore make us read a torn *object*, never cause a data
//! race in the Rust memory model; objects are copied out and validated after the copy.
//! The one exception is bulk payload ([`SharedRegion::copy_from`], `read_bytes`,
//! `write_bytes`, `fill_bytes`): plain bytes copied at `memcpy` speed, at any alignment, which a
//! racing writer can only garble. These are the only two copy rules: structured slots go word by
//! word, payload goes by bytes; no other crate copies to or from shared memory by other means.
//! Payload is also checksummed in place ([`SharedRegion::crc32c_append`]: each byte read once
//! by volatile loads, never copied or referenced), so a CRC over guest memory needs no bounce.
//!
//! Platform pages enter through `from_raw_parts` in one place only (tests aside): xen-platform's
//! `into_region()` on its page handles (`SharedPages`, `ForeignMapping`).
//!
//! Bounds and alignment are checked once, when a [`SharedWord`] or [`SlotArray`] is carved out
//! of a [`SharedRegion`]; after that every access is in bounds by construction (slot indexes are
//! masked by a power-of-two count), so the hot paths are infallible and panic-free.
//!
//! Under `cfg(loom)` the same API is backed by an array of loom atomics so that the ring
//! protocols above can be model-checked unchanged.

use std::sync::atomic::Ordering;
use std::sync::Arc;

#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicU32};
#[cfg(not(loom))]
use std::sync::atomic::{fence, AtomicU32};

/// Size of a Xen page, the unit in which memory is granted.
pub const PAGE_SIZE: usize = 4096;
/// Size of a cache line on the hosts we target; shared words written by different parties are
/// kept on different lines.
pub const CACHE_LINE: usize = 64;

/// An access outside a shared region, or not aligned as shared words must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    #[error(
        "access of {len} bytes at offset {offset} is outside a {region_len}-byte shared region"
    )]
    OutOfBounds {
        offset: usize,
        len: usize,
        region_len: usize,
    },
    #[error("access of {len} bytes at offset {offset} is not 4-byte aligned")]
    Misaligned { offset: usize, len: usize },
    #[error("slot array of {count} slots: the count must be a non-zero power of two")]
    BadSlotCount { count: usize },
    #[error("shared region length {len} is zero or not a multiple of 4")]
    BadRegionLength { len: usize },
    #[error("shared region base address {addr:#x} is not 4-byte aligned")]
    MisalignedBase { addr: usize },
}

/// Full two-way fence between a store to one shared word and a later load of another.
///
/// This is the `xen_mb()` of `io/ring.h`: publishing a producer index and then reading the
/// peer's event/sleep word needs it (store→load order), which Release/Acquire do not give.
#[inline]
pub fn full_fence() {
    #[cfg(loom)]
    if loom_knobs::fences_disabled() {
        return;
    }
    fence(Ordering::SeqCst);
}

/// Loom-only switch that turns [`full_fence`] into a no-op, so a model can show that the fence
/// is what prevents a lost wake-up. Never compiled outside `cfg(loom)`.
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_knobs {
    use std::sync::atomic::{AtomicBool, Ordering};
    static DISABLED: AtomicBool = AtomicBool::new(false);
    pub fn disable_full_fences(disabled: bool) {
        DISABLED.store(disabled, Ordering::SeqCst);
    }
    pub(crate) fn fences_disabled() -> bool {
        DISABLED.load(Ordering::SeqCst)
    }
}

// ----------------------------------------------------------------------------------------------
// Backing store
// ----------------------------------------------------------------------------------------------

#[cfg(not(loom))]
struct Backing {
    base: std::ptr::NonNull<u8>,
    len: usize,
    owner: Owner,
}

#[cfg(not(loom))]
enum Owner {
    /// Zeroed, page-aligned heap memory allocated by [`SharedRegion::alloc`].
    Heap(std::alloc::Layout),
    /// Memory owned by someone else (a grant mapping, an mmap), kept alive by this value.
    External(#[allow(dead_code)] Box<dyn std::any::Any + Send + Sync>),
}

// SAFETY: the backing is a base pointer, a length and an owner that is itself `Send + Sync`
// (the heap layout, or a `Send + Sync` keep-alive). The memory behind the pointer belongs to no
// thread, and this module reaches it only through `SharedRegion::with_word` (atomic word
// accesses) and `SharedRegion::byte_ptr` (bulk copies of plain bytes, which another domain may
// race with anyway), so moving the backing to another thread cannot create a data race on it.
#[cfg(not(loom))]
unsafe impl Send for Backing {}
// SAFETY: as above: `&Backing` gives out nothing but the pointer, used only by those two
// accessors.
#[cfg(not(loom))]
unsafe impl Sync for Backing {}

#[cfg(not(loom))]
impl Drop for Backing {
    fn drop(&mut self) {
        if let Owner::Heap(layout) = self.owner {
            // SAFETY: `base` was returned by `alloc_zeroed(layout)` in `SharedRegion::alloc`
            // and is freed exactly once, here, when the last region handle goes away.
            unsafe { std::alloc::dealloc(self.base.as_ptr(), layout) };
        }
    }
}

#[cfg(loom)]
struct Backing {
    words: Box<[AtomicU32]>,
}

/// A bounds-checked window onto memory shared with another party (a granted page, a mapping
/// of several pages, or heap memory in tests and the simulator).
///
/// Cheap to clone; clones share the memory. Offsets are relative to the window.
#[derive(Clone)]
pub struct SharedRegion {
    backing: Arc<Backing>,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRegion")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl SharedRegion {
    /// Allocates `len` bytes of zeroed, page-aligned memory (for the side that creates a ring,
    /// for tests and for the simulated host).
    pub fn alloc(len: usize) -> Result<Self, MemError> {
        if len == 0 || len % 4 != 0 {
            return Err(MemError::BadRegionLength { len });
        }
        #[cfg(not(loom))]
        {
            let layout = std::alloc::Layout::from_size_align(len, PAGE_SIZE)
                .map_err(|_| MemError::BadRegionLength { len })?;
            // SAFETY: `layout` has non-zero size (checked above).
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
            let Some(base) = std::ptr::NonNull::new(ptr) else {
                std::alloc::handle_alloc_error(layout);
            };
            Ok(Self {
                backing: Arc::new(Backing {
                    base,
                    len,
                    owner: Owner::Heap(layout),
                }),
                offset: 0,
                len,
            })
        }
        #[cfg(loom)]
        {
            let words = (0..len / 4).map(|_| AtomicU32::new(0)).collect();
            Ok(Self {
                backing: Arc::new(Backing { words }),
                offset: 0,
                len,
            })
        }
    }

    /// Wraps memory mapped by someone else (a grant mapping, a shared mmap).
    ///
    /// `keep_alive` is dropped when the last handle to the region goes away; put the mapping
    /// object in it so the memory outlives every access.
    ///
    /// # Safety
    /// `base` must be valid for reads and writes of `len` bytes for as long as `keep_alive` is
    /// alive (or, for memory mapped read-only, valid for reads, and the caller never writes
    /// through the region), and in this process that memory must only ever be accessed through
    /// this module (never through Rust references or other accesses).
    #[cfg(not(loom))]
    pub unsafe fn from_raw_parts(
        base: std::ptr::NonNull<u8>,
        len: usize,
        keep_alive: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Self, MemError> {
        if len == 0 || len % 4 != 0 {
            return Err(MemError::BadRegionLength { len });
        }
        let addr = base.as_ptr() as usize;
        if addr % 4 != 0 {
            return Err(MemError::MisalignedBase { addr });
        }
        Ok(Self {
            backing: Arc::new(Backing {
                base,
                len,
                owner: Owner::External(keep_alive),
            }),
            offset: 0,
            len,
        })
    }

    /// Length of the window in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a region is never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), MemError> {
        if offset % 4 != 0 || len % 4 != 0 {
            return Err(MemError::Misaligned { offset, len });
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(MemError::OutOfBounds {
                offset,
                len,
                region_len: self.len,
            }),
        }
    }

    /// The address of the window's first byte in this process, for handing the memory to a
    /// device that DMAs into it (`ibv_reg_mr` of a guest's mapped pages). The pointer is only
    /// valid while a handle to the region (or a clone) is alive: whoever registers it keeps a
    /// clone until the registration is gone. This module's rules still hold for this process:
    /// the memory is read and written only through the region's accessors, never through the
    /// pointer.
    #[cfg(not(loom))]
    pub fn dma_addr(&self) -> std::ptr::NonNull<u8> {
        let b = &*self.backing;
        // SAFETY: `self.offset <= b.len` (windows are only created inside their parent, checked
        // by `subregion`), so the result is within or one past the end of the backing memory;
        // `add` of an in-bounds offset to a non-null pointer is non-null.
        unsafe { std::ptr::NonNull::new_unchecked(b.base.as_ptr().add(self.offset)) }
    }

    /// A sub-window `[offset, offset + len)` of this one, sharing the memory.
    pub fn subregion(&self, offset: usize, len: usize) -> Result<SharedRegion, MemError> {
        self.check(offset, len)?;
        if len == 0 {
            return Err(MemError::BadRegionLength { len });
        }
        Ok(SharedRegion {
            backing: self.backing.clone(),
            offset: self.offset + offset,
            len,
        })
    }

    /// The shared word at `offset` (4-byte aligned, in bounds).
    pub fn word(&self, offset: usize) -> Result<SharedWord, MemError> {
        self.check(offset, 4)?;
        Ok(SharedWord {
            region: self.clone(),
            offset,
        })
    }

    /// `count` slots of `N` bytes starting at `offset`; `count` must be a power of two so that
    /// free-running indexes can be masked.
    pub fn slots<const N: usize>(
        &self,
        offset: usize,
        count: usize,
    ) -> Result<SlotArray<N>, MemError> {
        if count == 0 || !count.is_power_of_two() || count > (1 << 31) {
            return Err(MemError::BadSlotCount { count });
        }
        let len = N
            .checked_mul(count)
            .ok_or(MemError::BadSlotCount { count })?;
        if N == 0 {
            return Err(MemError::Misaligned { offset, len: N });
        }
        self.check(offset, len)?;
        Ok(SlotArray {
            region: self.clone(),
            offset,
            mask: (count - 1) as u32,
        })
    }

    /// Copies `buf.len()` bytes out of the region at `offset` (both multiples of 4).
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), MemError> {
        self.check(offset, buf.len())?;
        self.read_unchecked(offset, buf);
        Ok(())
    }

    /// Copies `data` into the region at `offset` (both multiples of 4).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), MemError> {
        self.check(offset, data.len())?;
        self.write_unchecked(offset, data);
        Ok(())
    }

    /// Sets `len` bytes at `offset` to zero.
    pub fn zero(&self, offset: usize, len: usize) -> Result<(), MemError> {
        self.check(offset, len)?;
        for i in (0..len).step_by(4) {
            self.with_word(offset + i, |w| w.store(0, Ordering::Relaxed));
        }
        Ok(())
    }

    /// Loads the word at `offset`.
    pub fn load_u32(&self, offset: usize, order: Ordering) -> Result<u32, MemError> {
        self.check(offset, 4)?;
        Ok(self.with_word(offset, |w| w.load(order)))
    }

    /// Stores the word at `offset`.
    pub fn store_u32(&self, offset: usize, value: u32, order: Ordering) -> Result<(), MemError> {
        self.check(offset, 4)?;
        self.with_word(offset, |w| w.store(value, order));
        Ok(())
    }

    fn check_bytes(&self, offset: usize, len: usize) -> Result<(), MemError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(MemError::OutOfBounds {
                offset,
                len,
                region_len: self.len,
            }),
        }
    }

    /// Copies `buf.len()` bytes out of the region at any `offset` (no alignment needed): bulk
    /// data such as RDMA payloads. See [`Self::copy_from`] for what a racing writer can do.
    pub fn read_bytes(&self, offset: usize, buf: &mut [u8]) -> Result<(), MemError> {
        self.check_bytes(offset, buf.len())?;
        #[cfg(not(loom))]
        // SAFETY: `[offset, offset + len)` is inside this window (checked), hence inside the
        // backing memory, valid while `self.backing` lives; `buf` is private memory that cannot
        // overlap shared memory. The shared bytes are plain data (any value is a valid `u8`) and
        // are only read: a concurrent writer can make us copy garbled bytes, nothing more.
        unsafe {
            std::ptr::copy_nonoverlapping(self.byte_ptr(offset), buf.as_mut_ptr(), buf.len());
        }
        #[cfg(loom)]
        for (i, b) in buf.iter_mut().enumerate() {
            *b = self.loom_byte(offset + i);
        }
        Ok(())
    }

    /// Copies `data` into the region at any `offset` (no alignment needed).
    pub fn write_bytes(&self, offset: usize, data: &[u8]) -> Result<(), MemError> {
        self.check_bytes(offset, data.len())?;
        #[cfg(not(loom))]
        // SAFETY: as in `read_bytes`, the destination range is inside the live backing memory
        // and `data` is private; writing plain bytes into shared memory can only garble what a
        // concurrent reader copies out, which that reader validates after the copy.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.byte_ptr(offset), data.len());
        }
        #[cfg(loom)]
        for (i, b) in data.iter().enumerate() {
            self.loom_set_byte(offset + i, *b);
        }
        Ok(())
    }

    /// Copies `len` bytes from `src` at `src_offset` into this region at `offset`, at any
    /// alignment and at `memmove` speed (the two ranges may overlap, e.g. two windows of one
    /// mapping). This is the bulk-data primitive of the RDMA engine.
    ///
    /// Unlike the word accessors it is not atomic: the payload is plain bytes that the guest
    /// may rewrite while we copy, so the copy may see a mix of old and new bytes (as with DMA on
    /// a real device); no reference is ever formed and no byte outside the two checked ranges
    /// is touched.
    pub fn copy_from(
        &self,
        offset: usize,
        src: &SharedRegion,
        src_offset: usize,
        len: usize,
    ) -> Result<(), MemError> {
        self.check_bytes(offset, len)?;
        src.check_bytes(src_offset, len)?;
        #[cfg(not(loom))]
        // SAFETY: both ranges are inside their windows (checked) and so inside live backing
        // memory; `ptr::copy` allows overlap. The bytes are plain data with no invariants, so a
        // concurrent writer (another domain) can only garble the copied payload.
        unsafe {
            std::ptr::copy(src.byte_ptr(src_offset), self.byte_ptr(offset), len);
        }
        #[cfg(loom)]
        {
            let mut tmp = vec![0u8; len];
            src.read_bytes(src_offset, &mut tmp)?;
            self.write_bytes(offset, &tmp)?;
        }
        Ok(())
    }

    /// Sets `len` bytes at any `offset` to `byte` (at `memset` speed, like [`Self::write_bytes`]).
    pub fn fill_bytes(&self, offset: usize, len: usize, byte: u8) -> Result<(), MemError> {
        self.check_bytes(offset, len)?;
        #[cfg(not(loom))]
        // SAFETY: as in `write_bytes`: the range is inside the live backing memory (checked),
        // and writing plain bytes can only garble what a concurrent reader copies out.
        unsafe {
            std::ptr::write_bytes(self.byte_ptr(offset), byte, len);
        }
        #[cfg(loom)]
        for i in 0..len {
            self.loom_set_byte(offset + i, byte);
        }
        Ok(())
    }

    #[cfg(not(loom))]
    #[inline(always)]
    fn byte_ptr(&self, offset: usize) -> *mut u8 {
        let b = &*self.backing;
        debug_assert!(self.offset + offset <= b.len);
        // SAFETY: callers checked `offset <= self.len`, and windows lie inside the backing, so
        // the result is within (or one past the end of) the backing allocation.
        unsafe { b.base.as_ptr().add(self.offset + offset) }
    }

    #[cfg(loom)]
    fn loom_byte(&self, offset: usize) -> u8 {
        let w = self.with_word(offset & !3, |w| w.load(Ordering::Relaxed));
        w.to_ne_bytes()[offset & 3]
    }

    #[cfg(loom)]
    fn loom_set_byte(&self, offset: usize, v: u8) {
        self.with_word(offset & !3, |w| {
            let mut b = w.load(Ordering::Relaxed).to_ne_bytes();
            b[offset & 3] = v;
            w.store(u32::from_ne_bytes(b), Ordering::Relaxed)
        });
    }

    // --- the only code that turns offsets into memory accesses ---------------------------------

    /// Runs `f` on the atomic word at `offset`, which the caller has bounds- and
    /// alignment-checked against `self.len`.
    #[inline(always)]
    fn with_word<R>(&self, offset: usize, f: impl FnOnce(&AtomicU32) -> R) -> R {
        debug_assert!(offset % 4 == 0 && offset + 4 <= self.len);
        #[cfg(not(loom))]
        {
            let b = &*self.backing;
            let abs = self.offset + offset;
            debug_assert!(abs + 4 <= b.len);
            // SAFETY: `abs + 4 <= b.len` because every caller checked `offset + 4 <= self.len`
            // and windows are only created inside their parent (`subregion` checks), so the
            // pointer is in bounds of the backing memory, which `from_raw_parts`/`alloc`
            // guarantee valid while `self.backing` is alive. It is 4-byte aligned because the
            // base is (checked in `from_raw_parts`, page-aligned in `alloc`) and all offsets
            // are multiples of 4 (checked). All accesses to this memory are atomic, so no
            // non-atomic access can race with this one.
            let word = unsafe { AtomicU32::from_ptr(b.base.as_ptr().add(abs).cast::<u32>()) };
            f(word)
        }
        #[cfg(loom)]
        {
            f(&self.backing.words[(self.offset + offset) / 4])
        }
    }

    /// Runs `f` on the `len / 4` atomic words from `offset`, which the caller has bounds- and
    /// alignment-checked against `self.len` (`offset` and `len` multiples of 4): a slot's
    /// words with one address computation instead of one per word.
    #[inline(always)]
    fn with_words<R>(&self, offset: usize, len: usize, f: impl FnOnce(&[AtomicU32]) -> R) -> R {
        debug_assert!(offset % 4 == 0 && len % 4 == 0 && offset + len <= self.len);
        #[cfg(not(loom))]
        {
            let b = &*self.backing;
            let abs = self.offset + offset;
            debug_assert!(abs + len <= b.len);
            // SAFETY: as in `with_word`, for each of the `len / 4` words: `abs + len <= b.len`
            // (the caller checked `offset + len <= self.len`, windows lie inside their
            // parent), so the words are inside the backing memory, valid while
            // `self.backing` lives; 4-byte aligned (aligned base, offsets multiples of 4);
            // `AtomicU32` has `u32`'s layout, and all accesses to this memory are atomic.
            let words = unsafe {
                std::slice::from_raw_parts(
                    b.base.as_ptr().add(abs).cast::<AtomicU32>().cast_const(),
                    len / 4,
                )
            };
            f(words)
        }
        #[cfg(loom)]
        {
            let first = (self.offset + offset) / 4;
            f(&self.backing.words[first..first + len / 4])
        }
    }

    #[inline]
    fn read_unchecked(&self, offset: usize, buf: &mut [u8]) {
        self.with_words(offset, buf.len(), |words| {
            for (w, chunk) in words.iter().zip(buf.chunks_exact_mut(4)) {
                chunk.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
            }
        });
    }

    #[inline]
    fn write_unchecked(&self, offset: usize, data: &[u8]) {
        self.with_words(offset, data.len(), |words| {
            for (w, chunk) in words.iter().zip(data.chunks_exact(4)) {
                let v = u32::from_ne_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                w.store(v, Ordering::Relaxed);
            }
        });
    }
}

/// One 32-bit word of shared memory (an index, an event word, a doorbell), checked once.
#[derive(Clone, Debug)]
pub struct SharedWord {
    region: SharedRegion,
    offset: usize,
}

impl SharedWord {
    /// Atomic load.
    #[inline]
    pub fn load(&self, order: Ordering) -> u32 {
        self.region.with_word(self.offset, |w| w.load(order))
    }
    /// Atomic store.
    #[inline]
    pub fn store(&self, value: u32, order: Ordering) {
        self.region
            .with_word(self.offset, |w| w.store(value, order))
    }
    /// Atomic swap, returning the previous value.
    #[inline]
    pub fn swap(&self, value: u32, order: Ordering) -> u32 {
        self.region.with_word(self.offset, |w| w.swap(value, order))
    }
    /// Atomic compare-and-exchange; `Ok(previous)` when it stored `new`.
    #[inline]
    pub fn compare_exchange(
        &self,
        current: u32,
        new: u32,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u32, u32> {
        self.region.with_word(self.offset, |w| {
            w.compare_exchange(current, new, success, failure)
        })
    }
    /// Offset of the word inside its region.
    pub fn offset(&self) -> usize {
        self.offset
    }
}

/// A power-of-two array of `N`-byte slots in shared memory, indexed by free-running `u32`
/// indexes (masked on access, so any index is in bounds).
#[derive(Clone, Debug)]
pub struct SlotArray<const N: usize> {
    region: SharedRegion,
    offset: usize,
    mask: u32,
}

impl<const N: usize> SlotArray<N> {
    const VALID: () = assert!(N > 0 && N % 4 == 0, "slot size must be a multiple of 4");

    /// Number of slots (a power of two).
    #[inline]
    pub fn count(&self) -> u32 {
        self.mask + 1
    }

    #[inline]
    fn slot_offset(&self, idx: u32) -> usize {
        self.offset + (idx & self.mask) as usize * N
    }

    /// Copies slot `idx` (masked) out of shared memory.
    #[inline]
    pub fn read(&self, idx: u32) -> [u8; N] {
        let mut out = [0u8; N];
        self.read_into(idx, &mut out);
        out
    }

    /// Copies slot `idx` (masked) out of shared memory into `out`.
    #[inline]
    pub fn read_into(&self, idx: u32, out: &mut [u8; N]) {
        let () = Self::VALID;
        self.region.read_unchecked(self.slot_offset(idx), out);
    }

    /// Loads the first `W` words of slot `idx` (masked) into `out`, in order (relaxed), each
    /// word once: word `i` holds the slot's bytes `4 i .. 4 i + 4` in native order, as
    /// [`Self::read_into`] copies them.
    #[inline]
    pub fn read_words_into<const W: usize>(&self, idx: u32, out: &mut [u32; W]) {
        let () = Self::VALID;
        const { assert!(W * 4 <= N) };
        self.region.with_words(self.slot_offset(idx), W * 4, |ws| {
            for (o, w) in out.iter_mut().zip(ws) {
                *o = w.load(Ordering::Relaxed);
            }
        });
    }

    /// Copies `data` into slot `idx` (masked).
    #[inline]
    pub fn write(&self, idx: u32, data: &[u8; N]) {
        let () = Self::VALID;
        self.region.write_unchecked(self.slot_offset(idx), data);
    }

    /// Copies the first `L` bytes of slot `idx` (masked); used to write a slot body before
    /// publishing its last word.
    #[inline]
    pub fn write_head<const L: usize>(&self, idx: u32, data: &[u8; L]) {
        const { assert!(L <= N && L % 4 == 0) };
        self.region.write_unchecked(self.slot_offset(idx), data);
    }

    /// Stores `words` into the first `W` words of slot `idx` (masked), in order (relaxed): a
    /// slot body built as words, written before its last word is published. Word `i` holds
    /// the slot's bytes `4 i .. 4 i + 4` in native order, as [`Self::write_head`] stores them.
    #[inline]
    pub fn write_head_words<const W: usize>(&self, idx: u32, words: &[u32; W]) {
        let () = Self::VALID;
        const { assert!(W * 4 <= N) };
        self.region.with_words(self.slot_offset(idx), W * 4, |ws| {
            for (w, v) in ws.iter().zip(words) {
                w.store(*v, Ordering::Relaxed);
            }
        });
    }

    /// [`Self::write_head_words`] with word `at` stored as `value` instead of `words[at]`, in
    /// its place in the order: a slot body whose owner word says "not yet", stored straight
    /// from the caller's words (no copy of them with the owner word changed, whose wide reloads
    /// of narrower stores cost the post path store-forwarding stalls).
    #[inline]
    pub fn write_head_words_with<const W: usize>(
        &self,
        idx: u32,
        words: &[u32; W],
        at: usize,
        value: u32,
    ) {
        let () = Self::VALID;
        const { assert!(W * 4 <= N) };
        self.region.with_words(self.slot_offset(idx), W * 4, |ws| {
            for (i, (w, v)) in ws.iter().zip(words).enumerate() {
                w.store(if i == at { value } else { *v }, Ordering::Relaxed);
            }
        });
    }

    /// Loads the word at byte `OFF` of slot `idx` (masked).
    #[inline]
    pub fn load_word<const OFF: usize>(&self, idx: u32, order: Ordering) -> u32 {
        const { assert!(OFF % 4 == 0 && OFF + 4 <= N) };
        self.region
            .with_word(self.slot_offset(idx) + OFF, |w| w.load(order))
    }

    /// Loads the word at byte `off` of slot `idx` (masked); `off` must be a word inside the
    /// slot (checked: panics otherwise, a caller's constant).
    #[inline]
    pub fn load_word_at(&self, idx: u32, off: usize, order: Ordering) -> u32 {
        assert!(
            off % 4 == 0 && off + 4 <= N,
            "word {off} outside a {N}-byte slot"
        );
        self.region
            .with_word(self.slot_offset(idx) + off, |w| w.load(order))
    }

    /// Stores the word at byte `off` of slot `idx` (masked); `off` as for
    /// [`Self::load_word_at`].
    #[inline]
    pub fn store_word_at(&self, idx: u32, off: usize, value: u32, order: Ordering) {
        assert!(
            off % 4 == 0 && off + 4 <= N,
            "word {off} outside a {N}-byte slot"
        );
        self.region
            .with_word(self.slot_offset(idx) + off, |w| w.store(value, order))
    }

    /// Stores the word at byte `OFF` of slot `idx` (masked).
    #[inline]
    pub fn store_word<const OFF: usize>(&self, idx: u32, value: u32, order: Ordering) {
        const { assert!(OFF % 4 == 0 && OFF + 4 <= N) };
        self.region
            .with_word(self.slot_offset(idx) + OFF, |w| w.store(value, order))
    }
}

impl SharedRegion {
    /// The chunk of [`Self::for_each_chunk`]: large enough for a CRC32c's three-way
    /// interleaved loop, small enough for L1.
    pub const CHUNK: usize = 4096;

    /// Calls `f` on copies of `[offset, offset + len)`, in order, in chunks of at most
    /// [`Self::CHUNK`] bytes (a stack bounce buffer that stays in L1): how a checksum is
    /// computed over shared bytes without a reference to them or a copy of the whole range.
    pub fn for_each_chunk(
        &self,
        offset: usize,
        len: usize,
        mut f: impl FnMut(&[u8]),
    ) -> Result<(), MemError> {
        self.check_bytes(offset, len)?;
        let mut buf = [0u8; Self::CHUNK];
        let mut at = 0;
        while at < len {
            let n = (len - at).min(buf.len());
            self.read_bytes(offset + at, &mut buf[..n])?;
            f(&buf[..n]);
            at += n;
        }
        Ok(())
    }

    /// CRC32c (Castagnoli, the iSCSI/MPA polynomial) of `[offset, offset + len)`, continued
    /// from `crc`, the finished CRC32c of whatever came before (0 for nothing): the same value
    /// as `crc32c::crc32c_append(crc, bytes)`.
    ///
    /// The bytes are read **once**, straight from the shared memory — aligned 8-byte volatile
    /// loads fed to SSE 4.2's `crc32` instruction in three interleaved streams (bytes one at a
    /// time at the unaligned edges) — with no copy and no reference to them: a checksum over
    /// payload costs one pass over it. Without SSE 4.2 (or under loom) it goes through
    /// [`Self::for_each_chunk`] and a table. A racing writer makes the result the CRC of
    /// whatever mix of old and new bytes was read, as with the copies above.
    pub fn crc32c_append(&self, crc: u32, offset: usize, len: usize) -> Result<u32, MemError> {
        self.check_bytes(offset, len)?;
        #[cfg(all(not(loom), target_arch = "x86_64"))]
        if crc32c_hw::available() {
            // SAFETY: `[offset, offset + len)` is inside this window (checked), so inside the
            // live backing memory, which `self` keeps alive for the call; SSE 4.2 is present
            // (checked at run time).
            return Ok(unsafe { crc32c_hw::append(crc, self.byte_ptr(offset), len) });
        }
        let mut state = !crc;
        self.for_each_chunk(offset, len, |b| state = crc32c_sw::update(state, b))?;
        Ok(!state)
    }
}

/// CRC32c by table, a byte at a time, over private bytes (the fallback of
/// [`SharedRegion::crc32c_append`], and its tests' reference). `state` is the CRC register
/// (the finished CRC, inverted).
mod crc32c_sw {
    /// The reflected CRC32c polynomial (RFC 3720 B.4).
    pub(super) const POLY: u32 = 0x82f6_3b78;

    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut r = i as u32;
            let mut k = 0;
            while k < 8 {
                r = if r & 1 != 0 { (r >> 1) ^ POLY } else { r >> 1 };
                k += 1;
            }
            t[i] = r;
            i += 1;
        }
        t
    };

    pub(super) fn update(mut state: u32, bytes: &[u8]) -> u32 {
        for &b in bytes {
            state = (state >> 8) ^ TABLE[((state ^ u32::from(b)) & 0xff) as usize];
        }
        state
    }
}

/// CRC32c with SSE 4.2 straight over shared memory. The register is linear in its input:
/// the CRC of `A ‖ B ‖ C` (each `L` bytes) from register `r` is
/// `shift(shift(crc(r, A)) ^ crc(0, B)) ^ crc(0, C)`, where `shift` feeds `L` zero bytes — so
/// three blocks are summed at once (the instruction's latency is three times its throughput)
/// and joined with two `shift`s, each four byte tables computed once per block length.
#[cfg(all(not(loom), target_arch = "x86_64"))]
mod crc32c_hw {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    use std::sync::OnceLock;

    /// Bytes per stream of the three-way rounds, longest first (a 64 KiB FPDU takes two long
    /// rounds, two middle ones, five short ones and 256 bytes one word at a time).
    const BLOCKS: [usize; 3] = [8192, 2048, 256];

    pub(super) fn available() -> bool {
        static SSE42: OnceLock<bool> = OnceLock::new();
        *SSE42.get_or_init(|| std::is_x86_feature_detected!("sse4.2"))
    }

    /// "Feed `len` zero bytes" as four byte tables: the register `r` becomes
    /// `t[0][r & 0xff] ^ t[1][(r >> 8) & 0xff] ^ t[2][(r >> 16) & 0xff] ^ t[3][r >> 24]`.
    struct Shift([[u32; 256]; 4]);

    impl Shift {
        fn new(len: usize) -> Shift {
            // The columns: what each single set bit becomes after `len` zero bytes, a byte
            // at a time through the table (`len` is a multiple of 256; once per length).
            let zeros = [0u8; 256];
            let mut col = [0u32; 32];
            for (i, c) in col.iter_mut().enumerate() {
                let mut r = 1u32 << i;
                for _ in 0..len / zeros.len() {
                    r = super::crc32c_sw::update(r, &zeros);
                }
                *c = r;
            }
            let mut t = [[0u32; 256]; 4];
            for (k, tk) in t.iter_mut().enumerate() {
                for (b, e) in tk.iter_mut().enumerate() {
                    *e = (0..8)
                        .filter(|j| b >> j & 1 != 0)
                        .fold(0, |acc, j| acc ^ col[8 * k + j]);
                }
            }
            Shift(t)
        }

        #[inline(always)]
        fn apply(&self, r: u32) -> u32 {
            let t = &self.0;
            t[0][(r & 0xff) as usize]
                ^ t[1][(r >> 8 & 0xff) as usize]
                ^ t[2][(r >> 16 & 0xff) as usize]
                ^ t[3][(r >> 24) as usize]
        }
    }

    fn shifts() -> &'static [Shift; 3] {
        static S: OnceLock<Box<[Shift; 3]>> = OnceLock::new();
        S.get_or_init(|| Box::new(BLOCKS.map(Shift::new)))
    }

    /// The register after one aligned 8-byte word of shared memory, read once.
    ///
    /// # Safety
    /// `p` is 8-byte aligned and valid for reads of 8 bytes; SSE 4.2 is present.
    #[inline]
    #[target_feature(enable = "sse4.2")]
    unsafe fn step8(r: u64, p: *const u8) -> u64 {
        // SAFETY: the caller's contract. A volatile load of plain bytes that another domain
        // may write at the same time can only change the value read.
        unsafe { _mm_crc32_u64(r, u64::from_le(std::ptr::read_volatile(p.cast::<u64>()))) }
    }

    /// The register after one byte of shared memory, read once.
    ///
    /// # Safety
    /// `p` is valid for a read of one byte; SSE 4.2 is present.
    #[inline]
    #[target_feature(enable = "sse4.2")]
    unsafe fn step1(r: u32, p: *const u8) -> u32 {
        // SAFETY: as in `step8`.
        unsafe { _mm_crc32_u8(r, std::ptr::read_volatile(p)) }
    }

    /// Three streams of `block` bytes from `p` (8-byte aligned), joined with `m`.
    ///
    /// # Safety
    /// `p` is 8-byte aligned and valid for reads of `3 * block` bytes; SSE 4.2 is present.
    #[target_feature(enable = "sse4.2")]
    unsafe fn three(r: u64, p: *const u8, block: usize, m: &Shift) -> u64 {
        let (mut a, mut b, mut c) = (r, 0u64, 0u64);
        let mut i = 0;
        while i < block {
            // SAFETY: `i + 8 <= block`, so the three loads are inside `[p, p + 3 * block)`,
            // aligned since `p`, `block` and `i` are multiples of 8.
            unsafe {
                a = step8(a, p.add(i));
                b = step8(b, p.add(block + i));
                c = step8(c, p.add(2 * block + i));
            }
            i += 8;
        }
        let ab = m.apply(m.apply(a as u32) ^ b as u32);
        u64::from(ab ^ c as u32)
    }

    /// `crc32c_append(crc, [p, p + len))`.
    ///
    /// # Safety
    /// `p` is valid for reads of `len` bytes; SSE 4.2 is present.
    #[target_feature(enable = "sse4.2")]
    pub(super) unsafe fn append(crc: u32, p: *const u8, len: usize) -> u32 {
        let mut r = !crc;
        let mut at = 0;
        // Bytes up to the first 8-byte boundary.
        let lead = p.align_offset(8).min(len);
        while at < lead {
            // SAFETY: `at < len`.
            r = unsafe { step1(r, p.add(at)) };
            at += 1;
        }
        let mut r = u64::from(r);
        for (&block, m) in BLOCKS.iter().zip(shifts()) {
            while len - at >= 3 * block {
                // SAFETY: `[p + at, p + at + 3 * block)` is inside `[p, p + len)`; `p + at`
                // is 8-byte aligned (past the lead, moved by multiples of 8).
                r = unsafe { three(r, p.add(at), block, m) };
                at += 3 * block;
            }
        }
        while len - at >= 8 {
            // SAFETY: 8 bytes inside the range, aligned as above.
            r = unsafe { step8(r, p.add(at)) };
            at += 8;
        }
        let mut r = r as u32;
        while at < len {
            // SAFETY: `at < len`.
            r = unsafe { step1(r, p.add(at)) };
            at += 1;
        }
        !r
    }
}

/// The byte ranges of one `sendmsg` or `readv` system call: pieces of shared regions (the
/// kernel copies straight to or from them, so payload needs no private buffer) and private
/// buffers. No Rust reference to shared memory is formed: the list holds raw pointers that
/// only the kernel dereferences, and the borrows (`'a`) keep every region and buffer alive
/// until the list is gone. `W` is `true` for a list the kernel writes into (`readv`).
#[cfg(not(loom))]
pub struct IoList<'a, const W: bool> {
    iov: Vec<libc::iovec>,
    bytes: usize,
    _borrows: std::marker::PhantomData<&'a mut [u8]>,
}

/// A list for [`IoList::send`]: the kernel reads the pieces.
#[cfg(not(loom))]
pub type SendList<'a> = IoList<'a, false>;
/// A list for [`IoList::recv`]: the kernel writes the pieces.
#[cfg(not(loom))]
pub type RecvList<'a> = IoList<'a, true>;

#[cfg(not(loom))]
impl<'a, const W: bool> IoList<'a, W> {
    /// Most pieces one call takes (Linux's `UIO_MAXIOV` is 1024).
    pub const MAX_PIECES: usize = 256;

    pub fn with_capacity(n: usize) -> Self {
        Self {
            iov: Vec::with_capacity(n.min(Self::MAX_PIECES)),
            bytes: 0,
            _borrows: std::marker::PhantomData,
        }
    }

    /// Pieces so far.
    pub fn pieces(&self) -> usize {
        self.iov.len()
    }

    /// Bytes so far.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether another piece fits.
    pub fn is_full(&self) -> bool {
        self.iov.len() >= Self::MAX_PIECES
    }

    /// Adds `[offset, offset + len)` of `region` (bounds-checked; empty pieces are skipped).
    /// A piece the kernel writes must lie in memory mapped writable; a read-only mapping
    /// makes the call fail with `EFAULT`, it cannot make it write elsewhere.
    pub fn push_shared(
        &mut self,
        region: &'a SharedRegion,
        offset: usize,
        len: usize,
    ) -> Result<(), MemError> {
        region.check_bytes(offset, len)?;
        if len > 0 {
            self.iov.push(libc::iovec {
                iov_base: region.byte_ptr(offset).cast(),
                iov_len: len,
            });
            self.bytes += len;
        }
        Ok(())
    }

    fn push_raw(&mut self, ptr: *mut u8, len: usize) {
        if len > 0 {
            self.iov.push(libc::iovec {
                iov_base: ptr.cast(),
                iov_len: len,
            });
            self.bytes += len;
        }
    }
}

#[cfg(not(loom))]
impl<'a> IoList<'a, false> {
    /// Adds a private buffer the kernel reads.
    pub fn push_private(&mut self, buf: &'a [u8]) {
        self.push_raw(buf.as_ptr().cast_mut(), buf.len());
    }

    /// Sends the pieces in order on the stream socket `fd` (one `sendmsg`, `MSG_NOSIGNAL`, so
    /// a closed peer is `EPIPE`, never a signal); returns the bytes the kernel took, which may
    /// be fewer than [`Self::bytes`] on a non-blocking socket.
    pub fn send(&self, fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        if self.iov.is_empty() {
            return Ok(0);
        }
        // SAFETY: an all-zero `msghdr` is valid (null name, no control data); the iovec
        // array lives in `self` for the duration of the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = self.iov.as_ptr().cast_mut();
        msg.msg_iovlen = self.iov.len() as _;
        // SAFETY: every iovec points into memory that `'a` keeps alive (shared regions,
        // bounds-checked in `push_shared`, or private buffers), valid for reads of its length;
        // the kernel only reads them. A concurrent writer of shared memory can only garble
        // the bytes sent.
        let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

#[cfg(not(loom))]
impl<'a> IoList<'a, true> {
    /// Adds a private buffer the kernel writes.
    pub fn push_private_mut(&mut self, buf: &'a mut [u8]) {
        self.push_raw(buf.as_mut_ptr(), buf.len());
    }

    /// Reads from `fd` into the pieces in order (one `readv`); returns the bytes read (0:
    /// end of stream).
    pub fn recv(&self, fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        if self.iov.is_empty() {
            return Ok(0);
        }
        // SAFETY: every iovec points into memory that `'a` keeps alive and that nothing in
        // this process reads or writes through a reference meanwhile: private buffers are
        // borrowed mutably, shared ranges were bounds-checked and are only ever accessed by
        // copies (this module's rules), so the kernel's writes race with nothing but another
        // domain, which can only garble the bytes.
        let n = unsafe { libc::readv(fd.as_raw_fd(), self.iov.as_ptr(), self.iov.len() as _) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn dma_addr_names_the_windows_first_byte() {
        let r = SharedRegion::alloc(8192).unwrap();
        let sub = r.subregion(4096 + 64, 128).unwrap();
        assert_eq!(
            sub.dma_addr().as_ptr() as usize - r.dma_addr().as_ptr() as usize,
            4096 + 64
        );
        assert_eq!(r.clone().dma_addr(), r.dma_addr());
        // What a device writes through the address is what the region reads at that offset.
        r.write(4096 + 64, &[1, 2, 3, 4]).unwrap();
        // SAFETY: 4 bytes inside the live allocation, read once through a raw pointer as a
        // device's DMA would; nothing else accesses them concurrently in this test.
        let seen = unsafe { std::ptr::read_volatile(sub.dma_addr().as_ptr().cast::<[u8; 4]>()) };
        assert_eq!(seen, [1, 2, 3, 4]);
    }

    #[test]
    fn bounds_and_alignment_are_checked() {
        let r = SharedRegion::alloc(64).unwrap();
        assert!(matches!(r.word(64), Err(MemError::OutOfBounds { .. })));
        assert!(matches!(r.word(2), Err(MemError::Misaligned { .. })));
        assert!(matches!(
            r.read(60, &mut [0; 8]),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.read(usize::MAX - 3, &mut [0; 8]),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.slots::<16>(0, 3),
            Err(MemError::BadSlotCount { .. })
        ));
        assert!(matches!(
            r.slots::<16>(16, 4),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(r.slots::<16>(0, 4).is_ok());
        assert!(matches!(
            SharedRegion::alloc(6),
            Err(MemError::BadRegionLength { .. })
        ));
        let sub = r.subregion(32, 32).unwrap();
        assert_eq!(
            sub.word(32).err(),
            Some(MemError::OutOfBounds {
                offset: 32,
                len: 4,
                region_len: 32
            })
        );
        assert_eq!(
            r.subregion(32, 36).err(),
            Some(MemError::OutOfBounds {
                offset: 32,
                len: 36,
                region_len: 64
            })
        );
    }

    #[test]
    fn slots_mask_indexes_and_copy_bytes_exactly() {
        let r = SharedRegion::alloc(128).unwrap();
        let s = r.slots::<8>(64, 8).unwrap();
        s.write(3, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(s.read(3 + 8 * 1000), [1, 2, 3, 4, 5, 6, 7, 8]);
        let mut raw = [0u8; 8];
        r.read(64 + 24, &mut raw).unwrap();
        assert_eq!(raw, [1, 2, 3, 4, 5, 6, 7, 8]);
        s.store_word::<4>(3, 0xdead_beef, Ordering::Release);
        assert_eq!(r.load_u32(64 + 28, Ordering::Acquire).unwrap(), 0xdead_beef);
    }

    #[test]
    fn byte_copies_at_any_alignment() {
        let r = SharedRegion::alloc(64).unwrap();
        r.write_bytes(3, &[1, 2, 3, 4, 5]).unwrap();
        let mut b = [0u8; 7];
        r.read_bytes(2, &mut b).unwrap();
        assert_eq!(b, [0, 1, 2, 3, 4, 5, 0]);
        r.copy_from(5, &r.clone(), 3, 5).unwrap(); // overlapping
        r.read_bytes(3, &mut b).unwrap();
        assert_eq!(b, [1, 2, 1, 2, 3, 4, 5]);
        let s = SharedRegion::alloc(16).unwrap();
        s.copy_from(15, &r, 63, 1).unwrap();
        assert_eq!(
            s.copy_from(15, &r, 63, 2).err(),
            Some(MemError::OutOfBounds {
                offset: 15,
                len: 2,
                region_len: 16
            })
        );
        assert_eq!(
            r.read_bytes(60, &mut [0; 5]).err(),
            Some(MemError::OutOfBounds {
                offset: 60,
                len: 5,
                region_len: 64
            })
        );
        assert_eq!(
            r.write_bytes(usize::MAX, &[0]).err(),
            Some(MemError::OutOfBounds {
                offset: usize::MAX,
                len: 1,
                region_len: 64
            })
        );
        assert_eq!(
            r.copy_from(0, &s, 1, 16).err(),
            Some(MemError::OutOfBounds {
                offset: 1,
                len: 16,
                region_len: 16
            })
        );
    }

    #[test]
    fn byte_copies_and_fills_at_every_alignment_touch_only_their_range() {
        let r = SharedRegion::alloc(64).unwrap();
        for off in 0..8 {
            for len in 0..20 {
                r.fill_bytes(0, 64, 0xee).unwrap();
                let data: Vec<u8> = (0..len as u8).map(|i| i + 1).collect();
                r.write_bytes(off, &data).unwrap();
                let mut all = [0u8; 64];
                r.read_bytes(0, &mut all).unwrap();
                for (i, b) in all.iter().enumerate() {
                    let want = if i >= off && i < off + len {
                        data[i - off]
                    } else {
                        0xee
                    };
                    assert_eq!(*b, want, "write: off {off} len {len} byte {i}");
                }
                let mut back = vec![0u8; len];
                r.read_bytes(off, &mut back).unwrap();
                assert_eq!(back, data);
                r.fill_bytes(off, len, 0x5a).unwrap();
                r.read_bytes(0, &mut all).unwrap();
                for (i, b) in all.iter().enumerate() {
                    let want = if i >= off && i < off + len {
                        0x5a
                    } else {
                        0xee
                    };
                    assert_eq!(*b, want, "fill: off {off} len {len} byte {i}");
                }
            }
        }
        assert_eq!(
            r.fill_bytes(60, 5, 0),
            Err(MemError::OutOfBounds {
                offset: 60,
                len: 5,
                region_len: 64
            })
        );
        assert_eq!(
            r.fill_bytes(usize::MAX, 2, 0),
            Err(MemError::OutOfBounds {
                offset: usize::MAX,
                len: 2,
                region_len: 64
            })
        );
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri cannot call sendmsg/readv (foreign functions); the workspace test run covers it"
    )]
    fn io_lists_move_bytes_between_a_socket_and_shared_ranges() {
        use std::os::fd::AsFd;
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let src = SharedRegion::alloc(64).unwrap();
        for i in 0..64 {
            src.write_bytes(i, &[i as u8]).unwrap();
        }
        let head = [0xaa, 0xbb];
        let mut out = SendList::with_capacity(4);
        out.push_private(&head);
        out.push_shared(&src, 3, 5).unwrap();
        out.push_shared(&src, 60, 0).unwrap();
        assert_eq!(out.pieces(), 2, "empty pieces are skipped");
        assert!(out.push_shared(&src, 60, 5).is_err(), "out of bounds");
        assert_eq!(out.send(a.as_fd()).unwrap(), 7);
        let dst = SharedRegion::alloc(64).unwrap();
        let mut first = [0u8; 1];
        let mut inl = RecvList::with_capacity(4);
        inl.push_private_mut(&mut first);
        inl.push_shared(&dst, 10, 6).unwrap();
        assert_eq!(inl.recv(b.as_fd()).unwrap(), 7);
        assert_eq!(first, [0xaa]);
        let mut got = [0u8; 8];
        dst.read_bytes(9, &mut got).unwrap();
        assert_eq!(got, [0, 0xbb, 3, 4, 5, 6, 7, 0]);
        let big = SharedRegion::alloc(9000).unwrap();
        let data: Vec<u8> = (0..9000).map(|i| (i % 251) as u8).collect();
        big.write_bytes(0, &data).unwrap();
        let (mut seen, mut chunks) = (Vec::new(), 0);
        big.for_each_chunk(1, 8999, |c| {
            seen.extend_from_slice(c);
            chunks += 1;
        })
        .unwrap();
        assert_eq!(seen, data[1..]);
        assert_eq!(chunks, 3, "4 KiB chunks");
        assert!(src.for_each_chunk(1, 64, |_| ()).is_err());
    }

    #[test]
    fn crc32c_over_shared_bytes_is_the_crc_of_those_bytes() {
        // The check value of CRC-32C (RFC 3720 B.4's polynomial): "123456789".
        let r = SharedRegion::alloc(64).unwrap();
        r.write_bytes(5, b"123456789").unwrap();
        assert_eq!(r.crc32c_append(0, 5, 9).unwrap(), 0xe306_9283);
        assert_eq!(r.crc32c_append(0, 5, 0).unwrap(), 0);
        // Against the table, a byte at a time, over a copy: every start alignment, lengths
        // around each round of the three-way loop (8 B words, 3 × 256 B, 3 × 2 KiB, 3 × 8 KiB).
        let size = if cfg!(miri) {
            2048
        } else {
            2 * 3 * 8192 + 4096
        };
        let big = SharedRegion::alloc(size).unwrap();
        let mut x = 0x9e37_79b9u32;
        let data: Vec<u8> = (0..size)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        big.write_bytes(0, &data).unwrap();
        let table = |seed: u32, b: &[u8]| !crc32c_sw::update(!seed, b);
        let mut lens = vec![0, 1, 7, 8, 9, 15, 16, 17, 255, 767, 768, 769, 1000];
        lens.extend([3 * 2048 - 1, 3 * 2048, 3 * 2048 + 9, 2 * 3 * 2048 + 768]);
        lens.extend([3 * 8192 - 1, 3 * 8192, 3 * 8192 + 775, 2 * 3 * 8192 + 3]);
        for off in 0..9 {
            for &len in lens.iter().filter(|&&l| off + l <= size) {
                let want = table(0x1234_5678, &data[off..off + len]);
                let got = big.crc32c_append(0x1234_5678, off, len).unwrap();
                assert_eq!(got, want, "offset {off} length {len}");
            }
        }
        // Continued piece by piece, it is the CRC of the whole.
        let n = size.min(3 * 8192 + 100);
        let first = big.crc32c_append(0, 0, 777).unwrap();
        let both = big.crc32c_append(first, 777, n - 777).unwrap();
        assert_eq!(both, table(0, &data[..n]));
        assert_eq!(
            big.crc32c_append(0, size - 3, 4).err(),
            Some(MemError::OutOfBounds {
                offset: size - 3,
                len: 4,
                region_len: size
            })
        );
        assert!(big.crc32c_append(0, usize::MAX, 2).is_err());
    }

    #[test]
    fn external_memory_is_kept_alive() {
        let mut buf: Vec<u32> = vec![0u32; 16];
        let ptr = std::ptr::NonNull::new(buf.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: the vector's heap buffer lives in keep_alive as long as the region and is
        // accessed only through the region from here on.
        let r = unsafe { SharedRegion::from_raw_parts(ptr, 64, Box::new(buf)) }.unwrap();
        r.store_u32(60, 7, Ordering::Relaxed).unwrap();
        assert_eq!(r.load_u32(60, Ordering::Relaxed).unwrap(), 7);
    }
}
