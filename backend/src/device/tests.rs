//! Unit tests of the key table and of gather/scatter.

use shared_ring::abi::control::access;
use shared_ring::abi::cqe::CqeStatus;
use shared_ring::abi::wqe::Sge;
use shared_ring::SharedRegion;

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
