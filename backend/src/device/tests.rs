//! Unit tests of the key table and of gather/scatter.

use shared_ring::abi::control::access;
use shared_ring::abi::cqe::CqeStatus;
use shared_ring::abi::wqe::Sge;
use shared_ring::SharedRegion;

use std::sync::Arc;

use super::mr::{scatter, EngineKeys, KeyTable, NewMr, Source};
use super::{ChannelId, PdId};

fn mr(t: &KeyTable, ch: u32, pd: u32, len: u64, acc: u32) -> (SharedRegion, u32, u32) {
    let pages = SharedRegion::alloc(8192).unwrap();
    let m = t
        .insert(
            NewMr {
                ch: ChannelId(ch),
                pd: PdId(pd),
                pages: pages.clone(),
                base: 100,
                len,
                iova: 0x10_000,
                access: acc,
            },
            16,
        )
        .unwrap();
    (pages, m.lkey, m.rkey)
}

#[test]
fn keys_are_bound_to_owner_access_and_bounds() {
    let t = KeyTable::default();
    let (_p, lkey, rkey) = mr(&t, 1, 2, 1000, access::REMOTE_READ);
    let sge = |offset, length, lkey| Sge {
        offset,
        length,
        lkey,
    };
    let (ch, pd) = (ChannelId(1), PdId(2));
    assert!(t.local(ch, pd, &sge(0, 1000, lkey), false).is_ok());
    let e = Err(CqeStatus::LocalProtectionError);
    assert_eq!(t.local(ch, pd, &sge(1, 1000, lkey), false).map(|_| ()), e);
    assert_eq!(
        t.local(ch, pd, &sge(0, 8, rkey), false).map(|_| ()),
        e,
        "rkey is no lkey"
    );
    assert_eq!(
        t.local(ChannelId(9), pd, &sge(0, 8, lkey), false)
            .map(|_| ()),
        e
    );
    assert_eq!(t.local(ch, PdId(3), &sge(0, 8, lkey), false).map(|_| ()), e);
    assert_eq!(
        t.local(ch, pd, &sge(0, 8, lkey), true).map(|_| ()),
        e,
        "no LOCAL_WRITE"
    );
    assert_eq!(
        t.local(ch, pd, &sge(u64::MAX, 8, lkey), false).map(|_| ()),
        e
    );
    let r = Err(CqeStatus::RemoteAccessError);
    let rd = access::REMOTE_READ;
    assert!(t.remote(ch, pd, rkey, 0x10_000, 1000, rd).is_ok());
    assert_eq!(t.remote(ch, pd, rkey, 0x10_001, 1000, rd).map(|_| ()), r);
    assert_eq!(t.remote(ch, pd, rkey, 0xffff, 1, rd).map(|_| ()), r);
    assert_eq!(t.remote(ch, pd, lkey, 0x10_000, 1, rd).map(|_| ()), r);
    assert_eq!(
        t.remote(ch, pd, rkey, 0x10_000, 1, access::REMOTE_WRITE)
            .map(|_| ()),
        r
    );
    assert_eq!(t.remote(ch, pd, rkey, u64::MAX, 2, rd).map(|_| ()), r);
    // a stale key misses after the slot is reused
    t.remove(lkey);
    let (_q, lkey2, _) = mr(&t, 1, 2, 1000, access::ALL);
    assert_ne!(lkey, lkey2);
    assert_eq!(
        t.local(ch, pd, &sge(0, 8, lkey), false).map(|_| ()),
        Err(CqeStatus::LocalProtectionError)
    );
    assert!(t.local(ch, pd, &sge(0, 8, lkey2), false).is_ok());
}

#[test]
fn engine_key_cache_misses_a_key_deregistered_while_a_segment_holds_its_region() {
    let t = KeyTable::default();
    let (_p, lkey, rkey) = mr(&t, 1, 2, 1000, access::ALL);
    let keys = EngineKeys::new(&t);
    let (ch, pd) = (ChannelId(1), PdId(2));
    let sge = Sge {
        offset: 0,
        length: 8,
        lkey,
    };
    let wr = access::REMOTE_WRITE;
    // Cached, and a segment (as a message in pieces would) keeps the region alive.
    let held = keys.local(ch, pd, &sge, false).unwrap();
    let held_r = keys.remote(ch, pd, rkey, 0x10_000, 8, wr).unwrap();
    assert!(keys.local(ch, pd, &sge, false).is_ok());
    assert!(keys.remote(ch, pd, rkey, 0x10_000, 8, wr).is_ok());
    t.remove(lkey);
    assert_eq!(
        keys.local(ch, pd, &sge, false).map(|_| ()),
        Err(CqeStatus::LocalProtectionError),
        "a cached lkey resolved after its deregistration"
    );
    assert_eq!(
        keys.remote(ch, pd, rkey, 0x10_000, 8, wr).map(|_| ()),
        Err(CqeStatus::RemoteAccessError),
        "a cached rkey resolved after its deregistration"
    );
    drop((held, held_r));
}

/// A region as `mr` makes it, with a `Weak` that tells whether anything still holds it.
fn mr_weak(t: &KeyTable) -> (std::sync::Weak<super::mr::Mr>, u32, u32) {
    let m = t
        .insert(
            NewMr {
                ch: ChannelId(1),
                pd: PdId(2),
                pages: SharedRegion::alloc(8192).unwrap(),
                base: 0,
                len: 1000,
                iova: 0x10_000,
                access: access::ALL,
            },
            16,
        )
        .unwrap();
    (Arc::downgrade(&m), m.lkey, m.rkey)
}

fn sge8(lkey: u32) -> Sge {
    Sge {
        offset: 0,
        length: 8,
        lkey,
    }
}

#[test]
fn engine_key_cache_lends_regions_and_misses_a_deregistered_key() {
    let t = KeyTable::default();
    let (_w, lkey, rkey) = mr_weak(&t);
    let keys = EngineKeys::new(&t);
    let (ch, pd, wr) = (ChannelId(1), PdId(2), access::REMOTE_WRITE);
    assert!(keys.local_ref(ch, pd, &sge8(lkey), false).is_ok());
    assert!(keys.remote_ref(ch, pd, rkey, 0x10_000, 8, wr).is_ok());
    // Owner and bounds are checked on a lent hit too.
    assert!(keys
        .local_ref(ChannelId(9), pd, &sge8(lkey), false)
        .is_err());
    assert!(keys.remote_ref(ch, pd, rkey, 0x10_000, 1001, wr).is_err());
    t.remove(lkey);
    assert_eq!(
        keys.local_ref(ch, pd, &sge8(lkey), false).map(|_| ()),
        Err(CqeStatus::LocalProtectionError),
        "a cached lkey lent after its deregistration"
    );
    assert!(
        keys.remote_ref(ch, pd, rkey, 0x10_000, 8, wr).is_err(),
        "a cached rkey lent after its deregistration"
    );
}

#[test]
fn engine_key_cache_lets_go_of_a_deregistered_region_at_its_next_sync() {
    let t = KeyTable::default();
    let (w, lkey, _) = mr_weak(&t);
    let mut keys = EngineKeys::new(&t);
    assert!(keys
        .local_ref(ChannelId(1), PdId(2), &sge8(lkey), false)
        .is_ok());
    t.remove(lkey);
    assert!(
        w.upgrade().is_some(),
        "the cache holds the region until it syncs"
    );
    keys.sync();
    assert!(
        w.upgrade().is_none(),
        "the cache still holds a deregistered region"
    );
    // A region still registered stays cached across a sync (the hit needs no table).
    let (w2, lkey2, _) = mr_weak(&t);
    assert!(keys
        .local_ref(ChannelId(1), PdId(2), &sge8(lkey2), false)
        .is_ok());
    t.remove(lkey2 ^ 0x100); // no such key: the epoch does not move
    keys.sync();
    assert!(w2.upgrade().is_some());
    // Emptied before the engine says it sleeps (deregistered meanwhile, not synced).
    t.remove(lkey2);
    assert!(w2.upgrade().is_some());
    keys.clear();
    assert!(w2.upgrade().is_none(), "clear left a region in the cache");
}

#[test]
fn engine_key_cache_keeps_a_lent_region_alive_when_a_miss_replaces_it() {
    let t = KeyTable::default();
    // Key numbers 1..=5: lkeys 2 and 10 take the same way of the cache.
    let regions: Vec<_> = (0..5).map(|_| mr_weak(&t)).collect();
    let (wa, la, _) = &regions[0];
    let (_, lb, _) = &regions[4];
    assert_eq!(la % 8, lb % 8, "test setup: the two lkeys share a way");
    let mut keys = EngineKeys::new(&t);
    let (ch, pd) = (ChannelId(1), PdId(2));
    let a = keys.local_ref(ch, pd, &sge8(*la), false).unwrap();
    t.remove(*la);
    // The miss on B replaces A's entry while `a` is lent: A must stay alive.
    let b = keys.local_ref(ch, pd, &sge8(*lb), false).unwrap();
    assert!(
        wa.upgrade().is_some(),
        "a lent region was dropped by a miss"
    );
    assert_eq!((a.lkey(), b.lkey()), (*la, *lb));
    // The pass ends (`a` and `b` are not used after this point).
    keys.sync();
    assert!(
        wa.upgrade().is_none(),
        "the retired region outlived the pass"
    );
}

#[test]
fn engine_key_cache_resolves_like_the_table_when_keys_share_a_way() {
    let t = KeyTable::default();
    let keys = EngineKeys::new(&t);
    let (ch, pd) = (ChannelId(1), PdId(2));
    // 16 regions (as many as `mr` allows): 32 keys, four in each of the cache's ways.
    let regions: Vec<_> = (0..16).map(|_| mr(&t, 1, 2, 1000, access::ALL)).collect();
    for round in 0..3 {
        for (i, (_, lkey, rkey)) in regions.iter().enumerate() {
            let sge = Sge {
                offset: 0,
                length: 1000,
                lkey: *lkey,
            };
            let wr = access::REMOTE_WRITE;
            let gone = round == 2 && i % 2 == 0;
            if gone {
                t.remove(*lkey);
            }
            assert_eq!(
                keys.local(ch, pd, &sge, true).is_ok(),
                !gone,
                "round {round}, region {i}"
            );
            assert_eq!(
                keys.remote(ch, pd, *rkey, 0x10_000, 1000, wr).is_ok(),
                !gone,
                "round {round}, region {i}"
            );
            // Owner and bounds are checked on a cache hit as on a table lookup.
            assert!(keys.local(ChannelId(9), pd, &sge, true).is_err());
            assert!(keys.remote(ch, pd, *rkey, 0x10_001, 1000, wr).is_err());
        }
    }
}

#[test]
fn scatter_crosses_segment_boundaries() {
    let t = KeyTable::default();
    let (pa, la, _) = mr(&t, 1, 1, 4000, access::ALL);
    let (pb, lb, _) = mr(&t, 1, 1, 4000, access::ALL);
    let (ch, pd) = (ChannelId(1), PdId(1));
    let data: Vec<u8> = (0..100u8).collect();
    pa.write_bytes(100 + 10, &data).unwrap();
    let sge = |offset, length, lkey| Sge {
        offset,
        length,
        lkey,
    };
    let src = [
        Some(t.local(ch, pd, &sge(10, 30, la), false).unwrap()),
        Some(t.local(ch, pd, &sge(40, 70, la), false).unwrap()),
    ];
    let dst = [
        Some(t.local(ch, pd, &sge(3, 7, lb), true).unwrap()),
        Some(t.local(ch, pd, &sge(500, 200, lb), true).unwrap()),
    ];
    scatter(&Source::Segs(&src), &dst);
    let mut got = vec![0u8; 7];
    pb.read_bytes(100 + 3, &mut got).unwrap();
    let mut rest = vec![0u8; 93];
    pb.read_bytes(100 + 500, &mut rest).unwrap();
    got.extend(rest);
    assert_eq!(got, data);
    scatter(&Source::Inline(b"abcdefghij"), &dst);
    let mut got = vec![0u8; 3];
    pb.read_bytes(100 + 500, &mut got).unwrap();
    assert_eq!(&got, b"hij");
}

/// The engine's fast path for a one-SGE RDMA WRITE (`exec::write_fast`) runs only when every
/// check passes: each refused WRITE below completes with the status of the general path,
/// moves nothing and puts the QP in Error, and the accepted ones copy their bytes.
#[test]
fn one_sge_write_is_checked_like_any_write() {
    use super::testkit::{wqe, Loopback, TestMr, HANG};
    use super::Device;
    use shared_ring::abi::control::QpState;
    use shared_ring::abi::wqe::WqeOpcode;
    use std::time::Duration;

    type Case = fn(&Loopback, &TestMr) -> (Sge, (u64, u32));
    let cases: [(&str, Case, CqeStatus); 9] = [
        (
            "fits",
            |l, _| (l.src.sge(0, 64), (l.dst.iova, l.dst.keys.rkey)),
            CqeStatus::Success,
        ),
        (
            "empty",
            |l, _| (l.src.sge(0, 0), (l.dst.iova, l.dst.keys.rkey)),
            CqeStatus::Success,
        ),
        (
            "unknown lkey",
            |l, _| {
                let mut s = l.src.sge(0, 64);
                s.lkey = s.lkey.wrapping_add(1 << 20);
                (s, (l.dst.iova, l.dst.keys.rkey))
            },
            CqeStatus::LocalProtectionError,
        ),
        (
            "local past the end",
            |l, _| (l.src.sge(4090, 64), (l.dst.iova, l.dst.keys.rkey)),
            CqeStatus::LocalProtectionError,
        ),
        (
            "rkey as lkey",
            |l, _| {
                let mut s = l.src.sge(0, 64);
                s.lkey = l.src.keys.rkey;
                (s, (l.dst.iova, l.dst.keys.rkey))
            },
            CqeStatus::LocalProtectionError,
        ),
        (
            "unknown rkey",
            |l, _| {
                (
                    l.src.sge(0, 64),
                    (l.dst.iova, l.dst.keys.rkey.wrapping_add(1 << 20)),
                )
            },
            CqeStatus::RemoteAccessError,
        ),
        (
            "lkey as rkey",
            |l, _| (l.src.sge(0, 64), (l.dst.iova, l.dst.keys.lkey)),
            CqeStatus::RemoteAccessError,
        ),
        (
            "remote past the end",
            |l, _| (l.src.sge(0, 64), (l.dst.iova + 4096 - 63, l.dst.keys.rkey)),
            CqeStatus::RemoteAccessError,
        ),
        (
            "read-only target",
            |l, ro| (l.src.sge(0, 64), (ro.iova, ro.keys.rkey)),
            CqeStatus::RemoteAccessError,
        ),
    ];
    for (name, case, status) in cases {
        let mut l = Loopback::with_spin(4096, Duration::ZERO);
        let ro = l.ch.mr(&l.dev, 4096, access::REMOTE_READ);
        let data: Vec<u8> = (1..=64).collect();
        l.src.fill(0, &data);
        ro.fill(0, &[0u8; 64]);
        let (sge, remote) = case(&l, &ro);
        let w = wqe(WqeOpcode::RdmaWrite, 7, &[sge], remote, 0);
        l.qp.post_send(&l.dev, &w);
        let c = l.cq.wait(&l.dev);
        assert_eq!((c.wr_id, c.status), (7, status), "{name}");
        let moved = l.dst.read(0, 64);
        if status == CqeStatus::Success {
            assert_eq!(c.byte_len, sge.length, "{name}");
            assert_eq!(
                moved[..sge.length as usize],
                data[..sge.length as usize],
                "{name}"
            );
            assert_eq!(
                l.dev.qp_state(l.ch.id, l.qp.num),
                Ok(QpState::Rts),
                "{name}"
            );
        } else {
            assert_eq!(moved, vec![0u8; 64], "{name}: nothing moved");
            assert_eq!(ro.read(0, 64), vec![0u8; 64], "{name}: nothing moved");
            let start = std::time::Instant::now();
            while l.dev.qp_state(l.ch.id, l.qp.num) != Ok(QpState::Error) {
                assert!(start.elapsed() < HANG, "{name}: QP not in Error");
                std::thread::yield_now();
            }
        }
    }
}

/// Memory whose keep-alive says when the last handle to it went, as a platform's grant mapping
/// is unmapped when the last handle goes.
fn tracked_pages(bytes: usize) -> (SharedRegion, Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    struct Mapping {
        _mem: Box<[u64]>,
        gone: Arc<AtomicBool>,
    }
    impl Drop for Mapping {
        fn drop(&mut self) {
            self.gone.store(true, Ordering::SeqCst);
        }
    }
    let mut mem = vec![0u64; bytes / 8].into_boxed_slice();
    let base = std::ptr::NonNull::new(mem.as_mut_ptr().cast::<u8>()).expect("non-null");
    let gone = Arc::new(AtomicBool::new(false));
    let keep = Mapping {
        _mem: mem,
        gone: gone.clone(),
    };
    // SAFETY: `base` points at the `bytes` bytes of `mem`'s heap allocation, which `keep`
    // owns (moving the box does not move them) and frees only when dropped; nothing but the
    // region touches them.
    let r = unsafe { SharedRegion::from_raw_parts(base, bytes, Box::new(keep)) }.expect("region");
    (r, gone)
}

/// Waits (bounded) until `gone` is set.
fn unmapped_within(gone: &std::sync::atomic::AtomicBool, limit: std::time::Duration) -> bool {
    let start = std::time::Instant::now();
    while !gone.load(std::sync::atomic::Ordering::SeqCst) {
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    true
}

/// A region deregistered while an awake engine's key cache holds it is let go by that engine
/// at its next pass (`EngineKeys::sync`): the deregistration itself waits for nobody, and the
/// engine here spins for an hour, so nothing else (no sleep, no stop) empties its cache.
#[test]
fn a_spinning_engine_lets_go_of_a_region_deregistered_while_cached() {
    use super::testkit::{wqe, Loopback};
    use super::{Device, MrSetup};
    use shared_ring::abi::wqe::WqeOpcode;
    use std::time::Duration;

    let mut l = Loopback::new(4096);
    let (pages, gone) = tracked_pages(4096);
    let iova = 0x7000_0000;
    let keys = l
        .dev
        .reg_mr(
            l.ch.id,
            MrSetup {
                pd: l.ch.pd,
                pages,
                writable: true,
                first_page_offset: 0,
                length: 4096,
                iova,
                access: access::ALL,
            },
        )
        .expect("reg_mr");
    // A WRITE into the region: the engine's cache now holds it (both keys, src and target).
    let w = wqe(
        WqeOpcode::RdmaWrite,
        7,
        &[l.src.sge(0, 64)],
        (iova, keys.rkey),
        0,
    );
    l.qp.post_send(&l.dev, &w);
    assert_eq!(l.cq.wait(&l.dev).status, CqeStatus::Success);
    assert!(!gone.load(std::sync::atomic::Ordering::SeqCst));
    let start = std::time::Instant::now();
    l.dev.dereg_mr(l.ch.id, keys.handle).expect("dereg_mr");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "the deregistration waited for the engine"
    );
    assert!(
        unmapped_within(&gone, Duration::from_secs(5)),
        "a spinning engine still maps a region deregistered 5 s ago"
    );
    // Its rkey misses now, as any unknown key.
    l.qp.post_send(&l.dev, &w);
    assert_eq!(l.cq.wait(&l.dev).status, CqeStatus::RemoteAccessError);
}

/// An engine thread that panics lets go of its cached regions while it unwinds, as one that
/// stops does (`EngineKeys::clear` at the end of the engine loop).
#[test]
fn an_engine_thread_that_dies_lets_go_of_its_cached_regions() {
    let t = KeyTable::default();
    let (w, lkey, _) = mr_weak(&t);
    let died = std::thread::scope(|s| {
        s.spawn(|| {
            let keys = EngineKeys::new(&t);
            assert!(keys
                .local_ref(ChannelId(1), PdId(2), &sge8(lkey), false)
                .is_ok());
            // Deregistered meanwhile: only the cache holds it now.
            t.remove(lkey);
            assert!(
                w.upgrade().is_some(),
                "test setup: the cache holds the region"
            );
            panic!("engine bug");
        })
        .join()
    });
    assert!(died.is_err());
    assert!(
        w.upgrade().is_none(),
        "a dead engine thread still holds a cached region"
    );
}

/// The benches' per-post WQE (`Loopback::write_wqe_words`, built straight as words) is the
/// WQE of `Loopback::write_wqe` (built as a `WqeRepr`), byte for byte, for every length the
/// benches post: a bench posting a different WQE would time something else (an error
/// completion, or a hang).
#[test]
fn loopback_write_words_are_the_write_wqe() {
    use super::testkit::Loopback;
    let l = Loopback::new(4096);
    for len in [0, 1, 64, 4096, 1 << 20] {
        let words = l.write_wqe_words(len);
        let mut bytes = [0u8; shared_ring::abi::wqe::WQE_LEN];
        for (b, w) in bytes.chunks_exact_mut(4).zip(words) {
            b.copy_from_slice(&w.to_ne_bytes());
        }
        assert_eq!(bytes, l.write_wqe(len), "len {len}");
    }
}

/// A WQE the engine refuses completes `BadWqe` with the `wr_id` the guest wrote in its bytes
/// 8..16 (the engine pops the slot as words and takes the `wr_id` from them), as the opcode,
/// the first rule, and a later rule (an SGE count past the limit) refuse it.
#[test]
fn a_refused_wqe_completes_bad_wqe_with_its_wr_id() {
    use super::testkit::{wqe, TestPair};
    use super::{ChannelMode, EngineConfig, SoftDevice};
    use shared_ring::abi::wqe::WqeOpcode;

    for (name, wr_id, mangle) in [
        ("opcode 0", 0x0123_4567_89ab_cdefu64, 0usize),
        ("three SGEs", 0xfedc_ba98_7654_3210, 2),
    ] {
        let dev = SoftDevice::new(EngineConfig::default()).unwrap();
        let mut p = TestPair::connected(&dev, (1, 2), ChannelMode::Bypass);
        let mut b = wqe(WqeOpcode::Send, wr_id, &[], (0, 0), 0).to_bytes();
        b[mangle] = if mangle == 0 { 0 } else { 3 };
        p.aqp.post_send_raw(&dev, &b);
        let c = p.acq.wait(&dev);
        assert_eq!((c.status, c.wr_id), (CqeStatus::BadWqe, wr_id), "{name}");
    }
}
