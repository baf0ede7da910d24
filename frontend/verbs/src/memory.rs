//! Application memory for `ibv_reg_mr`: the pages of a registered range are re-backed in place
//! by pages granted to the backend (their bytes copied in, the granted pages moved over the same
//! addresses with one `mremap`), so the program keeps its pointers and the backend reads and
//! writes the same bytes. A page re-backed for one region is reused (same grant) by every
//! other region that covers it; when the last region over a backing is deregistered, the
//! addresses get private memory back with the current bytes and the grant ends.
//!
//! Trade-offs (docs/verbs.md): writes by other threads to the range during the re-backing
//! are lost; the whole pages are granted (bytes outside the region on its first and last page
//! are shared with dom0 too, but the backend's keys only reach the region's bytes); a
//! re-backed range is `MAP_SHARED`, so a child after `fork` shares it with the parent instead
//! of getting a copy; hugepage and file-backed ranges lose what made them special; the program
//! must not `munmap`/`free` a range while it is registered (as with every RDMA device).

use std::collections::BTreeMap;
use std::sync::Mutex;

use xen_platform::{Access, DomId, Platform, SharedPages, PAGE_SIZE};

use crate::errno::*;

struct Backing {
    pages: SharedPages,
    grefs: Vec<u32>,
    /// Registered regions that use at least one of these pages.
    users: usize,
}

impl Backing {
    fn end(&self, start: usize) -> usize {
        start + self.grefs.len() * PAGE_SIZE
    }
}

/// Pages re-backed by one grant call at most (`vrdma-simhost` takes 16384 per call).
const MAX_RUN_PAGES: usize = 16384;

/// Re-backed ranges of this process, by start address.
static BACKINGS: Mutex<BTreeMap<usize, Backing>> = Mutex::new(BTreeMap::new());

/// A registration's hold on the backings it uses (their start addresses).
#[derive(Debug)]
pub(crate) struct Hold {
    starts: Vec<usize>,
}

/// The grant references covering `[addr, addr+len)` page by page, re-backing what is not yet.
/// On success the caller holds every backing it used until [`release`].
pub(crate) fn acquire(
    platform: &Platform,
    backend: DomId,
    addr: usize,
    len: usize,
) -> Result<(Vec<u32>, Hold), i32> {
    let start = addr & !(PAGE_SIZE - 1);
    let end = addr
        .checked_add(len)
        .and_then(|e| e.checked_next_multiple_of(PAGE_SIZE))
        .ok_or(EINVAL)?;
    let mut map = BACKINGS.lock().unwrap_or_else(|e| e.into_inner());
    let mut grefs = Vec::with_capacity((end - start) / PAGE_SIZE);
    let mut used: Vec<usize> = Vec::new();
    let mut made: Vec<usize> = Vec::new();
    let mut p = start;
    let result = (|| {
        while p < end {
            // The backing containing p, if any.
            let hit = map
                .range(..=p)
                .next_back()
                .filter(|(&s, b)| p < b.end(s))
                .map(|(&s, _)| s);
            match hit {
                Some(s) => {
                    let b = &map[&s];
                    let upto = b.end(s).min(end);
                    let first = (p - s) / PAGE_SIZE;
                    let n = (upto - p) / PAGE_SIZE;
                    grefs.extend_from_slice(&b.grefs[first..first + n]);
                    if !used.contains(&s) {
                        used.push(s);
                    }
                    p = upto;
                }
                None => {
                    // A run of pages not re-backed yet: up to the next backing or the end, at
                    // most what one grant call takes (the simulated host's limit).
                    let next = map
                        .range(p..)
                        .next()
                        .map_or(end, |(&s, _)| s.min(end))
                        .min(p + MAX_RUN_PAGES * PAGE_SIZE);
                    let b = rebacked(platform, backend, p, next - p)?;
                    grefs.extend_from_slice(&b.grefs);
                    map.insert(p, b);
                    made.push(p);
                    used.push(p);
                    p = next;
                }
            }
        }
        Ok(())
    })();
    match result {
        Ok(()) => {
            for s in &used {
                if let Some(b) = map.get_mut(s) {
                    b.users += 1;
                }
            }
            Ok((grefs, Hold { starts: used }))
        }
        Err(e) => {
            // Give back what this call re-backed; older backings are untouched.
            for s in made {
                if let Some(b) = map.remove(&s) {
                    give_back(b);
                }
            }
            Err(e)
        }
    }
}

/// Ends a registration's hold; backings nobody uses any more go back to private memory.
pub(crate) fn release(hold: Hold) {
    let mut map = BACKINGS.lock().unwrap_or_else(|e| e.into_inner());
    for s in hold.starts {
        let last = match map.get_mut(&s) {
            Some(b) => {
                b.users = b.users.saturating_sub(1);
                b.users == 0
            }
            None => false,
        };
        if last {
            if let Some(b) = map.remove(&s) {
                give_back(b);
            }
        }
    }
}

/// Runs `f` on a helper thread while the calling thread waits, blocked in the kernel: the
/// copy-then-`mremap` of a range must not miss writes, and a range may hold the calling
/// thread's own stack (a registered stack buffer shares pages with the frames of this call).
fn off_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| match s.spawn(f).join() {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    })
}

fn give_back(mut b: Backing) {
    // SAFETY: the backend's keys over these pages are gone (deregistered before release, or
    // never registered), so nobody else writes them.
    if let Err(e) = off_stack(|| unsafe { b.pages.release_as_private_copy() }) {
        // Leaving the grant mapped keeps the program's bytes where they are.
        tracing::warn!("giving re-backed pages back: {e}");
        std::mem::forget(b);
    }
}

/// Whether every page of `[start, start+len)` is mapped (`mincore` fails with ENOMEM on a
/// hole).
fn mapped(start: usize, len: usize) -> bool {
    let mut vec = vec![0u8; len / PAGE_SIZE];
    // SAFETY: mincore only reads the page tables of the range and writes `vec` (one byte per
    // page, sized above).
    unsafe { libc::mincore(start as *mut libc::c_void, len, vec.as_mut_ptr()) == 0 }
}

fn rebacked(platform: &Platform, backend: DomId, start: usize, len: usize) -> Result<Backing, i32> {
    if !mapped(start, len) {
        return Err(EFAULT);
    }
    let mut pages = platform
        .share_pages(backend, len / PAGE_SIZE, Access::ReadWrite)
        .map_err(|e| e.raw_os_error().unwrap_or(ENOMEM))?;
    // SAFETY: `[start, start+len)` is mapped (checked) and belongs to the program, which
    // registers it and so hands it to the device: it does not unmap it while registered (the
    // ibv_reg_mr contract). The calling thread is blocked while the helper thread copies and
    // moves; concurrent writes by the program's other threads are the documented limitation.
    off_stack(|| unsafe { pages.adopt_range(start as *mut u8) }).map_err(|e| {
        tracing::warn!("re-backing {len} bytes at {start:#x}: {e}");
        e.raw_os_error().unwrap_or(EFAULT)
    })?;
    let grefs = pages.grant_refs().iter().map(|g| g.0).collect();
    Ok(Backing {
        pages,
        grefs,
        users: 0,
    })
}
