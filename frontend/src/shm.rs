//! Pages shared with the backend, as `shared_ring::mem` regions.
//!
//! The platform hands out grant-backed pages as raw pointer + length; this module wraps them
//! once into [`SharedRegion`]s (the audited accessor module of `shared-ring`) and keeps the
//! platform handle alive inside the region, so the memory outlives every access. Nothing else
//! in the library sees a pointer. It also adds byte-granular copies on top of the word-granular
//! region API (memory regions are addressed by byte).

use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use shared_ring::SharedRegion;
use xen_platform::{Access, DomId, ForeignMapping, Platform, SharedPages};

use crate::error::{Error, Result};

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
    let ptr = NonNull::new(pages.as_ptr()).ok_or_else(|| Error::protocol("null page mapping"))?;
    let len = pages.len();
    let addr = ptr.as_ptr() as u64;
    // SAFETY: `pages` owns a mapping of `len` bytes at `ptr` that stays mapped until it is
    // dropped; it is moved into the region's keep-alive, so it lives as long as any handle to
    // the region. This process touches the pages only through the region (atomic word
    // accesses); no Rust reference into them is ever made.
    let region = unsafe { SharedRegion::from_raw_parts(ptr, len, Box::new(pages)) }?;
    Ok(Granted {
        region,
        grefs,
        addr,
    })
}

/// Maps the backend's grants `refs` (contiguously) as a region.
pub(crate) fn map(
    platform: &Platform,
    from: DomId,
    refs: &[u32],
    access: Access,
) -> Result<SharedRegion> {
    let refs: Vec<_> = refs.iter().map(|&g| xen_platform::GrantRef(g)).collect();
    let m: ForeignMapping = platform.map_grants(from, &refs, access)?;
    let ptr = NonNull::new(m.as_ptr()).ok_or_else(|| Error::protocol("null grant mapping"))?;
    let len = m.len();
    // SAFETY: as in `share`: the mapping is owned by the region's keep-alive and accessed only
    // through the region. A read-only mapping is only ever read (the CQ pages): the frontend
    // writes its CQ indexes in the doorbell page, never in the CQ.
    Ok(unsafe { SharedRegion::from_raw_parts(ptr, len, Box::new(m)) }?)
}

/// Copies `buf.len()` bytes at any byte `offset` of `region` into `buf`.
pub(crate) fn read_bytes(region: &SharedRegion, offset: usize, buf: &mut [u8]) -> Result<()> {
    check(region, offset, buf.len())?;
    let mut off = offset;
    let mut out = &mut buf[..];
    // Unaligned head: from the word containing it.
    if off % 4 != 0 && !out.is_empty() {
        let base = off & !3;
        let w = region.load_u32(base, Ordering::Relaxed)?.to_ne_bytes();
        let n = (4 - (off - base)).min(out.len());
        out[..n].copy_from_slice(&w[off - base..off - base + n]);
        off += n;
        out = &mut out[n..];
    }
    let whole = out.len() & !3;
    if whole > 0 {
        region.read(off, &mut out[..whole])?;
        off += whole;
        out = &mut out[whole..];
    }
    if !out.is_empty() {
        let w = region.load_u32(off, Ordering::Relaxed)?.to_ne_bytes();
        let n = out.len();
        out.copy_from_slice(&w[..n]);
    }
    Ok(())
}

/// Copies `data` to any byte `offset` of `region`. Partial words at the ends are merged with
/// a compare-exchange loop, so bytes next to the copied range are never overwritten with stale
/// values even if the backend writes them concurrently.
pub(crate) fn write_bytes(region: &SharedRegion, offset: usize, data: &[u8]) -> Result<()> {
    check(region, offset, data.len())?;
    let mut off = offset;
    let mut rest = data;
    if off % 4 != 0 && !rest.is_empty() {
        let base = off & !3;
        let n = (4 - (off - base)).min(rest.len());
        merge_word(region, base, off - base, &rest[..n])?;
        off += n;
        rest = &rest[n..];
    }
    let whole = rest.len() & !3;
    if whole > 0 {
        region.write(off, &rest[..whole])?;
        off += whole;
        rest = &rest[whole..];
    }
    if !rest.is_empty() {
        merge_word(region, off, 0, rest)?;
    }
    Ok(())
}

/// Sets `len` bytes at any byte `offset` to `byte`.
pub(crate) fn fill_bytes(region: &SharedRegion, offset: usize, len: usize, byte: u8) -> Result<()> {
    check(region, offset, len)?;
    const CHUNK: usize = 4096;
    let block = [byte; CHUNK];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(CHUNK);
        write_bytes(region, offset + done, &block[..n])?;
        done += n;
    }
    Ok(())
}

fn merge_word(region: &SharedRegion, base: usize, at: usize, bytes: &[u8]) -> Result<()> {
    let word = region.word(base)?;
    let mut cur = word.load(Ordering::Relaxed);
    loop {
        let mut b = cur.to_ne_bytes();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        match word.compare_exchange(
            cur,
            u32::from_ne_bytes(b),
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => return Ok(()),
            Err(now) => cur = now,
        }
    }
}

fn check(region: &SharedRegion, offset: usize, len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= region.len() => Ok(()),
        _ => Err(Error::InvalidArgument(format!(
            "{len} bytes at offset {offset} are outside the {}-byte region",
            region.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_copies_at_every_alignment() {
        let r = SharedRegion::alloc(64).unwrap();
        for off in 0..8 {
            for len in 0..20 {
                fill_bytes(&r, 0, 64, 0xee).unwrap();
                let data: Vec<u8> = (0..len as u8).map(|i| i + 1).collect();
                write_bytes(&r, off, &data).unwrap();
                let mut all = [0u8; 64];
                read_bytes(&r, 0, &mut all).unwrap();
                for (i, b) in all.iter().enumerate() {
                    let want = if i >= off && i < off + len {
                        data[i - off]
                    } else {
                        0xee
                    };
                    assert_eq!(*b, want, "off {off} len {len} byte {i}");
                }
                let mut back = vec![0u8; len];
                read_bytes(&r, off, &mut back).unwrap();
                assert_eq!(back, data);
            }
        }
        assert!(write_bytes(&r, 60, &[0; 5]).is_err());
        assert!(read_bytes(&r, usize::MAX, &mut [0; 2]).is_err());
    }
}
