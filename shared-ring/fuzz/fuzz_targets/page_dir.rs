//! Page lists and directory chains on arbitrary bytes, as the backend reads them from a
//! guest: the 24-byte list in a control slot, then a walk of directory pages whose contents
//! (next pointers included, so loops and dangling grefs) are the input. The walk must end
//! after exactly the claimed number of grefs and never read more directory pages than needed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shared_ring::abi::page_dir::{
    dir_pages_needed, PageDirWalker, PageList, GREFS_PER_DIR_PAGE, PAGE_LIST_LEN,
};
use shared_ring::{SharedRegion, PAGE_SIZE};

/// Copies `bytes` into `p` at `offset`, zero-padded to the 4-byte multiple shared memory takes.
fn fill(p: &SharedRegion, offset: usize, bytes: &[u8]) {
    let mut v = bytes.to_vec();
    v.resize(bytes.len().next_multiple_of(4), 0);
    p.write(offset, &v).unwrap();
}
const DIR_PAGES: usize = 4;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 + PAGE_LIST_LEN {
        let _ = PageList::parse(data, u32::MAX);
        return;
    }
    // The reader's quota, kept small enough that a walk stays quick.
    let max_pages = u32::from_le_bytes(data[..4].try_into().unwrap()) % (4 * 1024 + 1);
    let list_bytes = &data[4..4 + PAGE_LIST_LEN];
    let Ok(list) = PageList::parse(list_bytes, max_pages) else {
        return;
    };
    assert!(list.n_pages() >= 1 && list.n_pages() <= max_pages);
    let mut again = [0u8; PAGE_LIST_LEN];
    list.emit(&mut again);
    assert_eq!(&again[..], list_bytes, "a parsed list re-emits its bytes");

    // Directory pages: gref g maps to page g % DIR_PAGES, filled from the rest of the input.
    let rest = &data[4 + PAGE_LIST_LEN..];
    let pages: Vec<SharedRegion> = (0..DIR_PAGES)
        .map(|i| {
            let p = SharedRegion::alloc(PAGE_SIZE).unwrap();
            let chunk = rest.chunks(PAGE_SIZE).nth(i).unwrap_or(&[]);
            fill(&p, 0, chunk);
            p
        })
        .collect();
    let mut w = PageDirWalker::new(&list);
    let mut reads = 0;
    while let Some(g) = w.next_dir_gref() {
        w.read_dir_page(&pages[g as usize % DIR_PAGES])
            .expect("a page-sized directory page reads");
        reads += 1;
        assert!(reads <= dir_pages_needed(list.n_pages() as usize).max(1));
    }
    assert!(w.is_done());
    assert_eq!(w.grefs().len(), list.n_pages() as usize);
    assert!(reads <= (list.n_pages() as usize).div_ceil(GREFS_PER_DIR_PAGE));
});
