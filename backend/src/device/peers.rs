//! An engine thread's cache of the peer QPs it executes WRITEs into: what finding the peer of
//! a connected QP costs without `Weak::upgrade` — a compare of two pointers instead of two
//! locked instructions (the upgrade's increment and the drop's decrement of the peer's strong
//! count) on the path from a post to its completion (docs/benchmarks.md, "Ninth round").
//!
//! A QP names its peer by a `Weak` (`SendSide::peer`), so that two connected QPs do not keep
//! each other alive. The cache holds a strong `Arc` of each peer it has met, in a few ways
//! indexed by the allocation's address. A `Weak` whose pointer equals a cached `Arc`'s points
//! into that allocation (which the `Arc` keeps alive, so no other object can be at that
//! address): a hit lends `&T` for as long as the cache is borrowed, and touches no count.
//!
//! The cache never keeps an object alive for long: [`PeerCache::sync`], once per engine pass,
//! drops every entry that only the cache still holds (its QP was destroyed and every other
//! holder let go), and [`PeerCache::clear`] empties it before the engine sleeps and when it
//! stops. A miss that replaces an entry moves the old `Arc` to `retired` instead of dropping it,
//! so a reference lent earlier in the pass stays valid; `sync` and `clear` take `&mut self`, so
//! no lent reference is alive when they drop anything. The same discipline as the engine's key
//! cache (`mr::KeyCache`).

use std::cell::UnsafeCell;
use std::sync::{Arc, Weak};

/// Entries of a [`PeerCache`] (direct-mapped by address).
const WAYS: usize = 4;

struct Ways<T> {
    ways: [Option<Arc<T>>; WAYS],
    /// Entries a miss replaced during this pass (references lent earlier may point into them).
    retired: Vec<Arc<T>>,
}

/// See the module's documentation. Not `Sync` (an `UnsafeCell`): only the engine's thread
/// uses it.
pub(crate) struct PeerCache<T> {
    inner: UnsafeCell<Ways<T>>,
}

impl<T> Default for PeerCache<T> {
    fn default() -> Self {
        Self {
            inner: UnsafeCell::new(Ways {
                ways: std::array::from_fn(|_| None),
                retired: Vec::new(),
            }),
        }
    }
}

#[inline(always)]
fn way_of<T>(p: *const T) -> usize {
    // By cache line: a QP's allocation spans several, so neighbouring QPs rarely share a way.
    (p as usize >> 6) % WAYS
}

impl<T> PeerCache<T> {
    /// The object `w` points to, lent while `self` is borrowed; `None` if it is gone (every
    /// strong reference dropped). A hit compares pointers; a miss upgrades `w` once and keeps
    /// the result.
    #[inline(always)]
    pub(crate) fn get(&self, w: &Weak<T>) -> Option<&T> {
        let p = w.as_ptr();
        let i = way_of(p);
        // SAFETY: `PeerCache` is not `Sync`, so only this thread reaches `inner`; the `&mut`
        // made here does not escape this call and nothing called below reaches back into the
        // cache (an upgrade and a `Vec` push; no entry is dropped here), so no other reference
        // to `inner` exists meanwhile.
        let c = unsafe { &mut *self.inner.get() };
        let hit = matches!(&c.ways[i], Some(a) if std::ptr::eq(Arc::as_ptr(a), p));
        if !hit {
            let a = w.upgrade()?;
            if let Some(old) = c.ways[i].replace(a) {
                c.retired.push(old);
            }
        }
        c.ways[i].as_ref().map(|a| {
            let r: *const T = Arc::as_ptr(a);
            // SAFETY: the allocation outlives the borrow of `self`: the `Arc` in this way is
            // moved to `retired` (not dropped) if a later miss replaces it, and only `sync`
            // and `clear`, which take `&mut self` (so no lent reference is alive), drop
            // entries.
            unsafe { &*r }
        })
    }

    /// Once per engine pass: lets go of the entries a miss retired and of those only the cache
    /// still holds. A load of each occupied way's strong count.
    #[inline]
    pub(crate) fn sync(&mut self) {
        let c = self.inner.get_mut();
        if !c.retired.is_empty() {
            c.retired.clear();
        }
        for way in &mut c.ways {
            if way.as_ref().is_some_and(|a| Arc::strong_count(a) == 1) {
                *way = None;
            }
        }
    }

    /// Empties the cache (before the engine sleeps, and when it stops).
    pub(crate) fn clear(&mut self) {
        let c = self.inner.get_mut();
        c.ways = std::array::from_fn(|_| None);
        c.retired.clear();
    }

    /// Strong references the cache holds (tests).
    #[cfg(test)]
    fn held(&mut self) -> usize {
        let c = self.inner.get_mut();
        c.ways.iter().flatten().count() + c.retired.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hit lends the object without touching its strong count; a miss upgrades once.
    #[test]
    fn a_hit_touches_no_count_and_a_miss_upgrades_once() {
        let a = Arc::new(7u64);
        let w = Arc::downgrade(&a);
        let mut c = PeerCache::default();
        assert_eq!(c.get(&w), Some(&7));
        assert_eq!(
            Arc::strong_count(&a),
            2,
            "the miss keeps one strong reference"
        );
        for _ in 0..3 {
            assert_eq!(c.get(&w), Some(&7));
        }
        assert_eq!(Arc::strong_count(&a), 2, "hits take no reference");
        c.sync();
        assert_eq!(Arc::strong_count(&a), 2, "a live peer stays cached");
        c.clear();
        assert_eq!(Arc::strong_count(&a), 1);
    }

    /// A destroyed peer (the last holder besides the cache let go) is dropped by the next
    /// `sync`, not kept alive; a `Weak` whose object is gone finds nothing.
    #[test]
    fn sync_lets_go_of_a_peer_only_the_cache_holds() {
        let a = Arc::new(String::from("peer"));
        let w = Arc::downgrade(&a);
        let mut c = PeerCache::default();
        assert_eq!(c.get(&w).map(String::as_str), Some("peer"));
        drop(a);
        assert!(w.upgrade().is_some(), "still cached until the pass ends");
        c.sync();
        assert!(w.upgrade().is_none(), "sync dropped the last reference");
        assert_eq!(c.get(&w), None, "a peer that is gone is not found");
        assert_eq!(c.held(), 0);
    }

    /// Two objects in the same way: the miss retires the first (a reference lent before stays
    /// valid until `sync`), and each lookup finds its own object, never the other's.
    #[test]
    fn a_miss_in_an_occupied_way_retires_the_old_entry() {
        // Enough objects that two share a way.
        let objs: Vec<Arc<u64>> = (0..(4 * WAYS as u64)).map(Arc::new).collect();
        let (x, y) = objs
            .iter()
            .enumerate()
            .flat_map(|(i, a)| objs[i + 1..].iter().map(move |b| (a, b)))
            .find(|(a, b)| way_of(Arc::as_ptr(a)) == way_of(Arc::as_ptr(b)))
            .expect("two objects in one way");
        let (wx, wy) = (Arc::downgrade(x), Arc::downgrade(y));
        let mut c = PeerCache::default();
        let rx = c.get(&wx).expect("x");
        let ry = c.get(&wy).expect("y");
        assert_eq!((*rx, *ry), (**x, **y));
        assert_eq!(Arc::strong_count(x), 2, "x retired, not dropped");
        assert_eq!(c.get(&wx).copied(), Some(**x), "x again: its own value");
        c.sync();
        assert_eq!(c.held(), 1, "the retired entries are gone after the pass");
        drop(objs);
    }
}
