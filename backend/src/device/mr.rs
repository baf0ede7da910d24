//! Memory regions: the key table and the translation of SGEs and (rkey, address) pairs into
//! checked byte ranges of mapped guest memory.
//!
//! Keys are `number << 1 | remote`: bit 0 tells an rkey from an lkey, the number (31 bits,
//! never 0) comes from a device-wide counter that skips numbers still registered. A region's
//! keys are therefore not reused when it is deregistered: a stale key misses until the counter
//! has come round, i.e. for 2^31 minus (regions registered) further registrations — far more
//! than 2^24, whatever the order regions come and go in. Every lookup checks the key's owner
//! (channel and PD) and the access the operation needs; bounds are checked with overflow-free
//! arithmetic.
//!
//! Engine threads look keys up through their own [`KeyCache`] ([`EngineKeys`]): no lock, no
//! hash and no reference count per work request, the same checks, and a deregistered key
//! misses there as in the table. A deregistration waits for no engine: an engine's cache lets
//! go of a deregistered region within one pass of that engine ([`KeyCache`] says how).

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// Set (before the key leaves the table) when the region is deregistered: an engine's
    /// [`KeyCache`] entry for it no longer resolves.
    dead: AtomicBool,
}

/// A checked byte range of a region. `Seg` (the default) holds the region; a [`SegRef`]
/// borrows it from an engine's key cache for the length of one pass.
#[derive(Debug, Clone)]
pub(crate) struct Seg<M = Arc<Mr>> {
    mr: M,
    /// Offset in `mr.pages`.
    off: usize,
    pub(crate) len: usize,
}

/// A [`Seg`] that borrows its region from [`EngineKeys`] (no reference count touched): valid
/// while the engine's keys are borrowed, i.e. within one pass.
pub(crate) type SegRef<'a> = Seg<&'a Mr>;

impl<M: Deref<Target = Mr>> Seg<M> {
    /// The mapped pages the segment lies in and its offset there (for system calls that
    /// move payload between a socket and the segment).
    pub(crate) fn region(&self) -> (&SharedRegion, usize) {
        (&self.mr.pages, self.off)
    }

    /// The lkey of the segment's region.
    pub(crate) fn lkey(&self) -> u32 {
        self.mr.lkey
    }

    /// Copies `len` bytes from `src` at `src_at` (relative to the segment) to `self` at `at`.
    fn copy_from<N: Deref<Target = Mr>>(&self, at: usize, src: &Seg<N>, src_at: usize, len: usize) {
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
    /// A cursor `from` bytes into `segs`.
    fn skip(segs: &'a [Option<Seg>], from: usize) -> Self {
        let mut c = Cursor { segs, i: 0, at: 0 };
        let mut left = from;
        while left > 0 {
            let Some((_, _, n)) = c.next_chunk(left) else {
                break;
            };
            left -= n;
        }
        c
    }

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

/// Copies all of `src` into `dst`, which is at least as long: what [`scatter`] does with one
/// segment on each side.
#[inline]
pub(crate) fn copy_seg<D: Deref<Target = Mr>, S: Deref<Target = Mr>>(dst: &Seg<D>, src: &Seg<S>) {
    debug_assert!(dst.len >= src.len);
    dst.copy_from(0, src, 0, src.len);
}

/// Copies all of `src` into `dst` (whose total length is at least `src.len()`; extra source
/// bytes are dropped).
pub(crate) fn scatter(src: &Source<'_>, dst: &[Option<Seg>]) {
    // The common case, one segment on each side (what a small WRITE or SEND is): one copy,
    // without walking the lists.
    if let (Source::Segs([Some(s), rest @ ..]), [Some(d), ..]) = (src, dst) {
        if rest.iter().all(Option::is_none) && d.len >= s.len {
            copy_seg(d, s);
            return;
        }
    }
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

/// Copies bytes `[from, from + len)` of the message `src` (segments in order) to the same
/// bytes of `dst`: one piece of a message moved in several passes. Both lists were resolved
/// and checked to hold at least `from + len` bytes.
pub(crate) fn copy_part(src: &[Option<Seg>], dst: &[Option<Seg>], from: usize, len: usize) {
    let mut s = Cursor::skip(src, from);
    let mut d = Cursor::skip(dst, from);
    let mut left = len;
    while left > 0 {
        let Some((seg, at, n)) = s.next_chunk(left) else {
            return;
        };
        let mut off = 0;
        while off < n {
            let Some((dseg, dat, dn)) = d.next_chunk(n - off) else {
                return;
            };
            dseg.copy_from(dat, seg, at + off, dn);
            off += dn;
        }
        left -= n;
    }
}

/// Why an (rkey, address, length) was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RemoteFault {
    /// No region of the responder has that key.
    Key,
    /// The region does not allow the access.
    Access,
    /// The range is not inside the region.
    Bounds,
}

/// Key numbers are 31 bits (bit 0 of a key is the remote bit).
const KEY_NUMBERS: u32 = 1 << 31;

/// Hash of a key number: Fibonacci hashing, so the table's high and low hash bits both vary
/// (the numbers are dense and come from our counter; lookups of guest-chosen keys just miss).
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

#[derive(Debug, Default)]
struct Keys {
    /// Registered regions by key number.
    live: HashMap<u32, Arc<Mr>, BuildHasherDefault<KeyHasher>>,
    /// The last key number handed out (modulo 2^31).
    counter: u32,
}

/// All regions of the device, by key.
#[derive(Debug, Default)]
pub(crate) struct KeyTable {
    inner: RwLock<Keys>,
    /// Bumped by every [`Self::remove`] that removed a region (after its `dead` flag is set):
    /// an engine that reads a new value drops the dead regions from its [`KeyCache`]
    /// ([`EngineKeys::sync`]).
    epoch: AtomicU64,
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
        if t.live.len() >= max.min(1 << 24) {
            return None;
        }
        // Terminates: fewer than 2^24 numbers are live.
        let number = loop {
            t.counter = (t.counter + 1) % KEY_NUMBERS;
            if t.counter != 0 && !t.live.contains_key(&t.counter) {
                break t.counter;
            }
        };
        let lkey = number << 1;
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
            dead: AtomicBool::new(false),
        });
        t.live.insert(number, mr.clone());
        Some(mr)
    }

    /// Removes the region of `lkey` (if registered). Waits for no engine: a lookup that
    /// starts after this returns misses, and every engine's cache lets go of the region at its
    /// next pass ([`EngineKeys::sync`]) or sleep ([`EngineKeys::clear`]).
    pub(crate) fn remove(&self, lkey: u32) {
        let mut t = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let number = lkey >> 1;
        if t.live.get(&number).is_some_and(|m| m.lkey == lkey) {
            if let Some(m) = t.live.remove(&number) {
                // Before the deregistration returns: a cached lookup that starts after it
                // sees the flag (`KeyCache::get`).
                m.dead.store(true, Ordering::Release);
                // After the flag (Release): an engine that reads the new epoch (Acquire)
                // sees the flag too.
                self.epoch.fetch_add(1, Ordering::Release);
            }
        }
    }

    /// Test support: the next key number is `counter + 1` (modulo 2^31).
    pub(crate) fn set_counter(&self, counter: u32) {
        let mut t = self.inner.write().unwrap_or_else(|e| e.into_inner());
        t.counter = counter % KEY_NUMBERS;
    }

    fn get(&self, key: u32) -> Option<Arc<Mr>> {
        let t = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let mr = t.live.get(&(key >> 1))?;
        (mr.lkey == key || mr.rkey == key).then(|| mr.clone())
    }

    /// Resolves a local SGE of a QP of (`ch`, `pd`); `write` when the engine will write it.
    #[cfg(test)]
    pub(crate) fn local(
        &self,
        ch: ChannelId,
        pd: PdId,
        sge: &Sge,
        write: bool,
    ) -> Result<Seg, CqeStatus> {
        check_local(self.get(sge.lkey), ch, pd, sge, write)
    }

    /// Resolves `len` bytes at `addr` of the region `rkey` names, which must belong to the
    /// responder (`ch`, `pd`) and allow `need` ([`access::REMOTE_READ`] or `REMOTE_WRITE`).
    #[cfg(test)]
    pub(crate) fn remote(
        &self,
        ch: ChannelId,
        pd: PdId,
        rkey: u32,
        addr: u64,
        len: u64,
        need: u32,
    ) -> Result<Seg, CqeStatus> {
        self.remote_checked(ch, pd, rkey, addr, len, need)
            .map_err(|_| CqeStatus::RemoteAccessError)
    }

    /// [`Self::remote`], saying which check failed (a Terminate message names it).
    #[cfg(test)]
    pub(crate) fn remote_checked(
        &self,
        ch: ChannelId,
        pd: PdId,
        rkey: u32,
        addr: u64,
        len: u64,
        need: u32,
    ) -> Result<Seg, RemoteFault> {
        check_remote(self.get(rkey), ch, pd, rkey, addr, len, need)
    }
}

/// Checks a local SGE against the region found for its lkey (owner, access, bounds).
#[inline]
fn check_local<M: Deref<Target = Mr>>(
    mr: Option<M>,
    ch: ChannelId,
    pd: PdId,
    sge: &Sge,
    write: bool,
) -> Result<Seg<M>, CqeStatus> {
    let mr = mr
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

/// Checks (`rkey`, `addr`, `len`) against the region found for `rkey` (owner, access, bounds).
#[inline]
fn check_remote<M: Deref<Target = Mr>>(
    mr: Option<M>,
    ch: ChannelId,
    pd: PdId,
    rkey: u32,
    addr: u64,
    len: u64,
    need: u32,
) -> Result<Seg<M>, RemoteFault> {
    let mr = mr
        .filter(|m| m.rkey == rkey && m.ch == ch && m.pd == pd)
        .ok_or(RemoteFault::Key)?;
    if mr.access & need != need {
        return Err(RemoteFault::Access);
    }
    let start = addr.checked_sub(mr.iova).ok_or(RemoteFault::Bounds)?;
    let end = start.checked_add(len).ok_or(RemoteFault::Bounds)?;
    if end > mr.len {
        return Err(RemoteFault::Bounds);
    }
    Ok(Seg {
        off: mr.base + start as usize,
        len: len as usize,
        mr,
    })
}

/// Entries of an engine's [`KeyCache`] (direct-mapped by key).
const CACHE_WAYS: usize = 8;

/// An engine thread's cache of recent key lookups: what a lookup costs without the table's
/// lock and hash — one load of the entry's key and one of the region's `dead` flag; a hit
/// lends the region (no reference count touched, no locked instruction).
///
/// The cache holds its regions (`Arc`s, so each holds the region's mapping), and lets them go
/// without making anyone wait: [`KeyTable::remove`] sets the region's `dead` flag and then
/// bumps the table's key epoch; every hit checks the flag, so a lookup that starts after the
/// deregistration returned misses (as in the table) and the engine never uses the region
/// again; the engine reads the epoch once per pass ([`EngineKeys::sync`], one load) and drops
/// its dead entries when it moved; it empties the cache ([`EngineKeys::clear`]) before it
/// sleeps and when it stops, and dropping the cache (an engine thread that panics unwinds
/// through it) lets go of everything too. So a deregistered region stays mapped after the
/// DeregMr reply for at most the rest of the pass of each engine that caches it, at most
/// `CACHE_WAYS` regions per engine (plus those a miss replaced during that pass) — the same
/// class as a message in pieces, whose `Seg`s hold their regions until the message is done.
#[derive(Default)]
pub(crate) struct KeyCache {
    ways: [Option<(u32, Arc<Mr>)>; CACHE_WAYS],
    /// Regions a miss replaced during this pass: references lent out earlier in the pass may
    /// still point into them. Emptied only by the `&mut` methods of [`EngineKeys`].
    retired: Vec<Arc<Mr>>,
    /// The key epoch last seen ([`EngineKeys::sync`]).
    epoch: u64,
}

impl KeyCache {
    /// The way of `key` if it holds the live region of `key`, else the table's (then cached;
    /// the entry it replaces is retired, not dropped). The hit is inlined into the engine's
    /// per-WQE path; the miss is not.
    #[inline(always)]
    fn get(&mut self, table: &KeyTable, key: u32) -> Option<&Arc<Mr>> {
        // By the whole key: a region's lkey and rkey (numbers 2n, 2n + 1) take two ways.
        let i = key as usize % CACHE_WAYS;
        // Acquire: pairs with `remove`'s release store of the flag.
        let hit =
            matches!(&self.ways[i], Some((k, m)) if *k == key && !m.dead.load(Ordering::Acquire));
        if !hit {
            self.miss(table, key);
        }
        self.ways[i].as_ref().map(|(_, m)| m)
    }

    /// [`Self::get`] when the way does not hold a live region of `key`: the table's, cached.
    #[cold]
    #[inline(never)]
    fn miss(&mut self, table: &KeyTable, key: u32) {
        let m = table.get(key);
        let way = &mut self.ways[key as usize % CACHE_WAYS];
        if let Some((_, old)) = way.take() {
            self.retired.push(old);
        }
        *way = m.map(|m| (key, m));
    }
}

/// The key table as one engine thread sees it: lookups go through its [`KeyCache`].
///
/// Not `Sync` (the cache is an `UnsafeCell`): only the engine's thread uses it.
pub(crate) struct EngineKeys<'a> {
    table: &'a KeyTable,
    cache: UnsafeCell<KeyCache>,
}

impl<'a> EngineKeys<'a> {
    pub(crate) fn new(table: &'a KeyTable) -> Self {
        Self {
            table,
            cache: UnsafeCell::new(KeyCache::default()),
        }
    }

    /// The region of `key`, lent for as long as `self` is borrowed.
    #[inline(always)]
    fn get(&self, key: u32) -> Option<&Mr> {
        // SAFETY: `EngineKeys` is not `Sync`, so only this thread reaches the cache; the two
        // places that make a `&mut` into it from `&self` (here and `get_owned`) do not let it
        // escape the call, and `KeyCache::get` calls nothing that could reach back into
        // `EngineKeys` (the table's read lock, a hash lookup, a `Vec` push; no region is
        // dropped there): no other reference to the cache exists meanwhile. The `&Mr` returned points into the region's `Arc`
        // allocation, not into the cache, and that `Arc` stays alive while `self` is borrowed:
        // a miss moves a replaced `Arc` to `retired` instead of dropping it, and only `sync`
        // and `clear`, which take `&mut self` (so no lent reference is alive), drop entries.
        let c = unsafe { &mut *self.cache.get() };
        c.get(self.table, key).map(|m| {
            let p: *const Mr = &**m;
            // SAFETY: see above: the allocation outlives the borrow of `self`.
            unsafe { &*p }
        })
    }

    /// The region of `key`, held (for a segment that outlives the pass).
    #[inline]
    fn get_owned(&self, key: u32) -> Option<Arc<Mr>> {
        // SAFETY: as in `get`; the reference does not escape the call.
        let c = unsafe { &mut *self.cache.get() };
        c.get(self.table, key).cloned()
    }

    /// Once per engine pass: lets go of the regions retired during the last pass and, if the
    /// key epoch moved, of the deregistered ones. One load when nothing was deregistered.
    #[inline]
    pub(crate) fn sync(&mut self) {
        let c = self.cache.get_mut();
        if !c.retired.is_empty() {
            c.retired.clear();
        }
        // Acquire: pairs with `remove`'s bump, which follows its store of the `dead` flag.
        let e = self.table.epoch.load(Ordering::Acquire);
        if e != c.epoch {
            for way in &mut c.ways {
                if way
                    .as_ref()
                    .is_some_and(|(_, m)| m.dead.load(Ordering::Acquire))
                {
                    *way = None;
                }
            }
            c.epoch = e;
        }
    }

    /// Empties the cache (before the engine sleeps, and when it stops).
    pub(crate) fn clear(&mut self) {
        let c = self.cache.get_mut();
        c.ways = Default::default();
        c.retired.clear();
    }

    /// Resolves a local SGE of a QP of (`ch`, `pd`); `write` when the engine will write it.
    pub(crate) fn local(
        &self,
        ch: ChannelId,
        pd: PdId,
        sge: &Sge,
        write: bool,
    ) -> Result<Seg, CqeStatus> {
        check_local(self.get_owned(sge.lkey), ch, pd, sge, write)
    }

    /// [`Self::local`], borrowing the region for the pass.
    #[inline]
    pub(crate) fn local_ref(
        &self,
        ch: ChannelId,
        pd: PdId,
        sge: &Sge,
        write: bool,
    ) -> Result<SegRef<'_>, CqeStatus> {
        check_local(self.get(sge.lkey), ch, pd, sge, write)
    }

    /// Resolves `len` bytes at `addr` of the region `rkey` names, which must belong to the
    /// responder (`ch`, `pd`) and allow `need`.
    pub(crate) fn remote(
        &self,
        ch: ChannelId,
        pd: PdId,
        rkey: u32,
        addr: u64,
        len: u64,
        need: u32,
    ) -> Result<Seg, CqeStatus> {
        self.remote_checked(ch, pd, rkey, addr, len, need)
            .map_err(|_| CqeStatus::RemoteAccessError)
    }

    /// [`Self::remote`], saying which check failed (a Terminate message names it).
    #[inline]
    pub(crate) fn remote_checked(
        &self,
        ch: ChannelId,
        pd: PdId,
        rkey: u32,
        addr: u64,
        len: u64,
        need: u32,
    ) -> Result<Seg, RemoteFault> {
        check_remote(self.get_owned(rkey), ch, pd, rkey, addr, len, need)
    }

    /// [`Self::remote_checked`], borrowing the region for the pass.
    #[inline]
    pub(crate) fn remote_ref(
        &self,
        ch: ChannelId,
        pd: PdId,
        rkey: u32,
        addr: u64,
        len: u64,
        need: u32,
    ) -> Result<SegRef<'_>, RemoteFault> {
        check_remote(self.get(rkey), ch, pd, rkey, addr, len, need)
    }
}
