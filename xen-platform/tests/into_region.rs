//! `SharedPages::into_region` and `ForeignMapping::into_region`: the one way platform pages
//! become `shared_ring` regions. The region is the same memory as the peer's, and it owns the
//! handle: the grant (or mapping) ends when the region's last clone is dropped, not before.

use std::sync::atomic::Ordering;
use std::time::Duration;

use xen_platform::sim::{SimHost, SimHostConfig};
use xen_platform::{Access, DomId, Platform, PlatformKind, UnmapNotify};

const WAIT: Option<Duration> = Some(Duration::from_secs(20));
const SHORT: Option<Duration> = Some(Duration::from_millis(200));

fn domain(host: &SimHost) -> (DomId, Platform) {
    let d = host.create_domain(None, None).unwrap();
    let p = Platform::open(PlatformKind::Sim {
        dir: host.dir().to_path_buf(),
        domid: d,
    })
    .unwrap();
    (d, p)
}

#[test]
fn shared_pages_region_owns_the_grant_until_its_last_clone() {
    let dir = tempfile::tempdir().unwrap();
    let host = SimHost::start(SimHostConfig::new(dir.path())).unwrap();
    let (d1, p1) = domain(&host);
    let (d2, p2) = domain(&host);
    let s = p1.share_pages(d2, 2, Access::ReadWrite).unwrap();
    let ev1 = p1.alloc_unbound(d2).unwrap();
    let ev2 = p2.bind_interdomain(d1, ev1.local_port()).unwrap();
    s.set_unmap_notify(UnmapNotify {
        clear_byte: Some(4096 + 8),
        event: Some(ev1.local_port()),
    })
    .unwrap();
    let refs = s.grant_refs().to_vec();
    let region = s.into_region().unwrap();
    assert_eq!(region.len(), 2 * 4096);
    region
        .store_u32(4096 + 8, 0x0102_0304, Ordering::Release)
        .unwrap();

    let m = p2.map_grants(d1, &refs, Access::ReadWrite).unwrap();
    let peer = m.into_region().unwrap();
    assert_eq!(
        peer.load_u32(4096 + 8, Ordering::Acquire).unwrap(),
        0x0102_0304
    );
    peer.write_bytes(5, b"abc").unwrap();
    let mut got = [0u8; 3];
    region.read_bytes(5, &mut got).unwrap();
    assert_eq!(&got, b"abc");

    // A clone keeps the pages granted: no unmap-notify, the byte stays.
    let clone = region.clone();
    drop(region);
    assert!(!ev2.wait_timeout(SHORT).unwrap());
    assert_eq!(
        peer.load_u32(4096 + 8, Ordering::Acquire).unwrap(),
        0x0102_0304
    );
    // The last clone releases them: the notify fires and clears its byte.
    drop(clone);
    assert!(ev2.wait_timeout(WAIT).unwrap());
    let mut cleared = 0x0102_0304u32.to_ne_bytes();
    cleared[0] = 0;
    assert_eq!(
        peer.load_u32(4096 + 8, Ordering::Acquire).unwrap(),
        u32::from_ne_bytes(cleared)
    );
    // The grants are gone: mapping them again is refused as "no grant" (EINVAL).
    let e = p2.map_grants(d1, &refs, Access::ReadOnly).unwrap_err();
    assert!(
        matches!(e, xen_platform::Error::GrantRefused { errno: 22, ref reason, .. } if reason.contains("has no grant")),
        "{e}"
    );
}

#[test]
fn foreign_mapping_region_unmaps_with_its_last_clone() {
    let dir = tempfile::tempdir().unwrap();
    let host = SimHost::start(SimHostConfig::new(dir.path())).unwrap();
    let (d1, p1) = domain(&host);
    let (d2, p2) = domain(&host);
    let s = p1.share_pages(d2, 1, Access::ReadOnly).unwrap();
    let ev1 = p1.alloc_unbound(d2).unwrap();
    let ev2 = p2.bind_interdomain(d1, ev1.local_port()).unwrap();
    let mine = s.span();
    assert!(mine.is_writable());
    let refs = s.grant_refs().to_vec();
    let own = s.into_region().unwrap();
    own.store_u32(64, 7, Ordering::Release).unwrap();

    let m = p2.map_grants(d1, &refs, Access::ReadOnly).unwrap();
    assert!(!m.span().is_writable());
    m.set_unmap_notify(UnmapNotify {
        clear_byte: None,
        event: Some(ev2.local_port()),
    })
    .unwrap();
    let ro = m.into_region().unwrap();
    assert_eq!(ro.load_u32(64, Ordering::Relaxed).unwrap(), 7);
    let clone = ro.clone();
    drop(ro);
    assert!(!ev1.wait_timeout(SHORT).unwrap());
    assert_eq!(clone.load_u32(64, Ordering::Relaxed).unwrap(), 7);
    drop(clone);
    assert!(ev1.wait_timeout(WAIT).unwrap());
}
