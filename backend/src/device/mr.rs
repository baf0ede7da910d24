//! Memory regions: the key table and the translation of SGEs and (rkey, address) pairs into
//! checked byte ranges of mapped guest memory.
//!
//! Keys are `index << 8 | generation << 1 | remote`: bit 0 tells an rkey from an lkey, the
//! generation (1..=127) makes a stale key of a deregistered region miss instead of naming the
//! region registered next in the same slot. Every lookup checks the key's owner (channel and
//! PD) and the access the operation needs; bounds are checked with overflow-free arithmetic.

use std::sync::{Arc, RwLock};

use shared_ring::abi::control::access;
use shared_ring::abi::cqe::CqeStatus;
use shared_ring::abi::wqe::Sge;
use shared_ring::SharedRegion;

use super::{ChannelId, PdId};

/// A registered region.
#[derive(Debug)]
pub(crate) struct Mr {
    pub(crate) ch: ChannelId,
    pub(crate) pd: PdId,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    pages: SharedRegion,
    /// Offset of the region's first byte in `pages`.
    base: usize,
    pub(crate) len: u64,
    iova: u64,
    access: u32,
}

/// A checked byte range of a region.
#[derive(Debug, Clone)]
pub(crate) struct Seg {
    mr: Arc<Mr>,
    /// Offset in `mr.pages`.
    off: usize,
    pub(crate) len: usize,
}

impl Seg {
    /// Copies `len` bytes from `src` at `src_at` (relative to the segment) to `self` at `at`.
    fn copy_from(&self, at: usize, src: &Seg, src_at: usize, len: usize) {
        // Both ranges were checked when the segments were resolved; an error here would be a
        // bug of ours, reported rather than trusted.
        if let Err(e) = self
            .mr
            .pages
            .copy_from(self.off + at, &src.mr.pages, src.off + src_at, len)
        {
            tracing::error!("segment copy out of bounds (engine bug): {e}");
        }
    }
    fn write_bytes(&self, at: usize, data: &[u8]) {
        if let Err(e) = self.mr.pages.write_bytes(self.off + at, data) {
            tracing::error!("segment write out of bounds (engine bug): {e}");
        }
    }
}

/// Where the bytes of a message come from.
#[derive(Debug)]
pub(crate) enum Source<'a> {
    Segs(&'a [Option<Seg>]),
    Inline(&'a [u8]),
}

impl Source<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Source::Segs(s) => s.iter().flatten().map(|s| s.len).sum(),
            Source::Inline(b) => b.len(),
        }
    }
}

/// Walks destination segments chunk by chunk.
struct Cursor<'a> {
    segs: &'a [Option<Seg>],
    i: usize,
    at: usize,
}

impl<'a> Cursor<'a> {
    /// The next chunk of at most `max` bytes: (segment, offset in it, length).
    fn next_chunk(&mut self, max: usize) -> Option<(&'a Seg, usize, usize)> {
        let seg = loop {
            match self.segs.get(self.i)? {
                Some(seg) if seg.len > self.at => break seg,
                _ => {
                    self.i += 1;
                    self.at = 0;
                }
            }
        };
        let n = max.min(seg.len - self.at);
        let at = self.at;
        self.at += n;
        Some((seg, at, n))
    }
}

/// Copies all of `src` into `dst` (whose total length is at least `src.len()`; extra source
/// bytes are dropped).
pub(crate) fn scatter(src: &Source<'_>, dst: &[Option<Seg>]) {
    let mut c = Cursor {
        segs: dst,
        i: 0,
        at: 0,
    };
    match src {
        Source::Inline(bytes) => {
            let mut from = 0;
            while from < bytes.len() {
                let Some((seg, at, n)) = c.next_chunk(bytes.len() - from) else {
                    return;
                };
                seg.write_bytes(at, &bytes[from..from + n]);
                from += n;
            }
        }
        Source::Segs(segs) => {
            for s in segs.iter().flatten() {
                let mut from = 0;
                while from < s.len {
                    let Some((seg, at, n)) = c.next_chunk(s.len - from) else {
                        return;
                    };
                    seg.copy_from(at, s, from, n);
                    from += n;
                }
            }
        }
    }
}

const GEN_MAX: u8 = 127;

#[derive(Debug, Default)]
struct Slots {
    slots: Vec<(u8, Option<Arc<Mr>>)>,
    free: Vec<u32>,
}

/// All regions of the device, by key.
#[derive(Debug, Default)]
pub(crate) struct KeyTable {
    inner: RwLock<Slots>,
}

/// What to register (checked by the caller against limits).
pub(crate) struct NewMr {
    pub(crate) ch: ChannelId,
    pub(crate) pd: PdId,
    pub(crate) pages: SharedRegion,
    pub(crate) base: usize,
    pub(crate) len: u64,
    pub(crate) iova: u64,
    pub(crate) access: u32,
}

impl KeyTable {
    pub(crate) fn insert(&self, m: NewMr, max: usize) -> Option<Arc<Mr>> {
        let mut t = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let idx = match t.free.pop() {
            Some(i) => i,
            None => {
                if t.slots.len() >= max.min(1 << 24) {
                    return None;
                }
                t.slots.push((0, None));
                (t.slots.len() - 1) as u32
            }
        };
        let slot = &mut t.slots[idx as usize];
        slot.0 = if slot.0 >= GEN_MAX { 1 } else { slot.0 + 1 };
        let lkey = (idx << 8) | (u32::from(slot.0) << 1);
        let mr = Arc::new(Mr {
            ch: m.ch,
            pd: m.pd,
            lkey,
            rkey: lkey | 1,
            pages: m.pages,
            base: m.base,
            len: m.len,
            iova: m.iova,
            access: m.access,
        });
        slot.1 = Some(mr.clone());
        Some(mr)
    }

    pub(crate) fn remove(&self, lkey: u32) {
        let mut t = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let idx = lkey >> 8;
        if let Some(slot) = t.slots.get_mut(idx as usize) {
            if slot.1.as_ref().is_some_and(|m| m.lkey == lkey) {
                slot.1 = None;
                t.free.push(idx);
            }
        }
    }

    fn get(&self, key: u32) -> Option<Arc<Mr>> {
        let t = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let (_, mr) = t.slots.get((key >> 8) as usize)?;
        let mr = mr.as_ref()?;
        (mr.lkey == key || mr.rkey == key).then(|| mr.clone())
    }

    /// Resolves a local SGE of a QP of (`ch`, `pd`); `write` when the engine will write it.
    pub(crate) fn local(
        &self,
        ch: ChannelId,
        pd: PdId,
        sge: &Sge,
        write: bool,
    ) -> Result<Seg, CqeStatus> {
        let mr = self
            .get(sge.lkey)
            .filter(|m| m.lkey == sge.lkey && m.ch == ch && m.pd == pd)
            .ok_or(CqeStatus::LocalProtectionError)?;
        if write && mr.access & access::LOCAL_WRITE == 0 {
            return Err(CqeStatus::LocalProtectionError);
        }
        let end = sge
            .offset
            .checked_add(u64::from(sge.length))
            .ok_or(CqeStatus::LocalProtectionError)?;
        if end > mr.len {
            return Err(CqeStatus::LocalProtectionError);
        }
        let off = mr.base + sge.offset as usize;
        Ok(Seg {
            mr,
            off,
            len: sge.length as usize,
        })
    }

    /// Resolves `len` bytes at `addr` of the region `rkey` names, which must belong to the
    /// responder (`ch`, `pd`) and allow `need` ([`access::REMOTE_READ`] or `REMOTE_WRITE`).
    pub(crate) fn remote(
        &self,
        ch: ChannelId,
        pd: PdId,
        rkey: u32,
        addr: u64,
        len: u64,
        need: u32,
    ) -> Result<Seg, CqeStatus> {
        let mr = self
            .get(rkey)
            .filter(|m| m.rkey == rkey && m.ch == ch && m.pd == pd && m.access & need == need)
            .ok_or(CqeStatus::RemoteAccessError)?;
        let start = addr
            .checked_sub(mr.iova)
            .ok_or(CqeStatus::RemoteAccessError)?;
        let end = start.checked_add(len).ok_or(CqeStatus::RemoteAccessError)?;
        if end > mr.len {
            return Err(CqeStatus::RemoteAccessError);
        }
        Ok(Seg {
            off: mr.base + start as usize,
            len: len as usize,
            mr,
        })
    }
}
