//! `SharedPages::adopt_range` / `release_as_private_copy`: memory the process already has is
//! re-backed in place by granted pages (same addresses, same bytes, now seen by the grantee),
//! and given back as private memory with the bytes of that moment (libvrdma_verbs'
//! `ibv_reg_mr` on application memory, docs/verbs.md).

use xen_platform::sim::{SimHost, SimHostConfig};
use xen_platform::{Access, DomId, Platform, PlatformKind, PAGE_SIZE};

fn domain(host: &SimHost) -> (DomId, Platform) {
    let d = host.create_domain(None, None).unwrap();
    let p = Platform::open(PlatformKind::Sim {
        dir: host.dir().to_path_buf(),
        domid: d,
    })
    .unwrap();
    (d, p)
}

fn read(addr: *const u8, len: usize) -> Vec<u8> {
    // SAFETY: the test's own mapping of at least `len` bytes at `addr`; nothing writes it
    // concurrently (the peer's writes below happen before the read, on this thread).
    (0..len)
        .map(|i| unsafe { std::ptr::read_volatile(addr.add(i)) })
        .collect()
}

#[test]
fn adopted_memory_keeps_its_bytes_and_is_shared_until_released() {
    let dir = tempfile::tempdir().unwrap();
    let host = SimHost::start(SimHostConfig::new(dir.path())).unwrap();
    let (d1, p1) = domain(&host);
    let (d2, p2) = domain(&host);
    let len = 2 * PAGE_SIZE;
    // SAFETY: a fresh private anonymous range, owned by this test until munmap below.
    let addr = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::PRIVATE,
        )
    }
    .unwrap()
    .cast::<u8>();
    let pattern: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
    // SAFETY: our range of `len` bytes.
    unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), addr, len) };

    let mut pages = p1.share_pages(d2, 2, Access::ReadWrite).unwrap();
    // SAFETY: the range is ours, page-aligned (mmap), readable and writable, and quiescent.
    unsafe { pages.adopt_range(addr) }.unwrap();
    assert_eq!(
        pages.as_ptr(),
        addr,
        "the pages now sit at the adopted addresses"
    );
    assert_eq!(read(addr, len), pattern, "same bytes after the move");

    // The grantee sees those bytes, and its writes show at the same addresses.
    let peer = p2
        .map_grants(d1, pages.grant_refs(), Access::ReadWrite)
        .unwrap()
        .into_region()
        .unwrap();
    let mut got = vec![0u8; len];
    peer.read_bytes(0, &mut got).unwrap();
    assert_eq!(got, pattern);
    peer.write_bytes(PAGE_SIZE + 10, b"xyz").unwrap();
    let mut want = pattern.clone();
    want[PAGE_SIZE + 10..PAGE_SIZE + 13].copy_from_slice(b"xyz");
    assert_eq!(read(addr, len), want);

    // Released: private memory with the bytes of that moment; the grantee's later writes go
    // to the grant's pages, not to this process's memory.
    // SAFETY: the grantee does not write during the call.
    unsafe { pages.release_as_private_copy() }.unwrap();
    drop(pages);
    peer.write_bytes(0, b"late").unwrap();
    assert_eq!(read(addr, len), want);
    // The addresses are ordinary memory again (writable, not unmapped by the drop above).
    // SAFETY: our range.
    unsafe { addr.write_volatile(0xee) };
    assert_eq!(read(addr, 1), [0xee]);
    drop(peer);
    // SAFETY: the range mmap gave us; nothing references it any more.
    unsafe { rustix::mm::munmap(addr.cast(), len) }.unwrap();
}
