//! Real-Xen device tests: `/dev/xen/{gntalloc,gntdev,evtchn}` and XenStore in one domain.
//! There is no Xen on the build machines, so these are `#[ignore]`d and show up as "ignored" in
//! every ordinary run; the Xen lab runs them with `cargo test --test real_xen -- --ignored`
//! (and runs `examples/platform-probe.rs` between two domains).

use xen_platform::{Access, Platform, PlatformKind, UnmapNotify};

fn xen() -> Platform {
    let kind = xen_platform::detect::detect_with(&xen_platform::detect::Probe {
        root: "/".into(),
        ..Default::default()
    })
    .expect("REAL XEN TEST DID NOT RUN: this machine is not a Xen domain");
    assert!(
        matches!(kind, PlatformKind::Xen { .. }),
        "not Xen: {kind:?}"
    );
    Platform::open(kind).unwrap()
}

#[test]
#[ignore = "needs real Xen (/dev/xen/*): run in the Xen lab with --ignored"]
fn grant_map_and_event_loopback_in_one_domain() {
    let p = xen();
    let me = p.domid().expect("own domid from XenStore");
    let s = p.share_pages(me, 2, Access::ReadWrite).unwrap();
    // SAFETY: s is 2 pages, mapped while s lives.
    unsafe { s.as_ptr().add(4096).write_volatile(0x42) };
    let m = p.map_grants(me, s.grant_refs(), Access::ReadOnly).unwrap();
    // SAFETY: m is 2 pages, mapped while m lives.
    assert_eq!(unsafe { m.as_ptr().add(4096).read_volatile() }, 0x42);
    let a = p.alloc_unbound(me).unwrap();
    let b = p.bind_interdomain(me, a.local_port()).unwrap();
    b.notify().unwrap();
    assert!(a
        .wait_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap());
    s.set_unmap_notify(UnmapNotify {
        clear_byte: Some(4096),
        event: Some(a.local_port()),
    })
    .unwrap();
    drop(s);
    assert!(b
        .wait_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap());
}

#[test]
#[ignore = "needs real Xen (/dev/xen/*): run in the Xen lab with --ignored"]
fn xenstore_is_reachable() {
    let p = xen();
    let xs = p.xenstore().unwrap();
    let d = p.domid().unwrap();
    assert_eq!(
        xs.read_string("domid").unwrap_or_else(|_| "0".into()),
        d.to_string()
    );
}
