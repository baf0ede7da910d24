//! Page lists in both directions: the guest's (memory regions: walk the directory, map the
//! grants) and the backend's (queue pages: share them, describe them inline or in directory
//! pages granted to the guest).

use shared_ring::abi::page_dir::{
    dir_pages_needed, write_page_list, PageDirWalker, PageList, INLINE_GREFS,
};
use shared_ring::SharedRegion;
use xen_platform::{Access, DomId, GrantRef, Platform, SharedPages};

/// Why a page list could not be resolved or built.
#[derive(Debug, thiserror::Error)]
pub enum PagesError {
    /// A grant of the guest could not be mapped.
    #[error("{0}")]
    BadGrant(String),
    /// The backend could not allocate or grant pages.
    #[error("{0}")]
    NoResources(String),
}

/// The grant references a guest's page list names. Directory pages are mapped read-only, one
/// at a time; `n_pages` was bounded by the caller (quota) before, and each directory page
/// consumes entries, so a looping chain ends.
pub fn resolve_guest_list(
    platform: &Platform,
    domid: DomId,
    list: &PageList,
) -> Result<Vec<GrantRef>, PagesError> {
    let mut walker = PageDirWalker::new(list);
    while let Some(dir) = walker.next_dir_gref() {
        let mapping = platform
            .map_grants(domid, &[GrantRef(dir)], Access::ReadOnly)
            .map_err(|e| {
                PagesError::BadGrant(format!("page-directory grant {dir} of domain {domid}: {e}"))
            })?;
        let region = mapping
            .into_region()
            .map_err(|e| PagesError::BadGrant(format!("page-directory grant {dir}: {e}")))?;
        walker
            .read_dir_page(&region)
            .map_err(|e| PagesError::BadGrant(format!("page-directory grant {dir}: {e}")))?;
    }
    Ok(walker.into_grefs().into_iter().map(GrantRef).collect())
}

/// Maps a guest's grants read-write, contiguously (memory registration).
pub fn map_guest_pages(
    platform: &Platform,
    domid: DomId,
    grefs: &[GrantRef],
) -> Result<(SharedRegion, bool), PagesError> {
    let mapping = platform
        .map_grants(domid, grefs, Access::ReadWrite)
        .map_err(|e| {
            PagesError::BadGrant(format!(
                "cannot map {} grants of domain {domid} read-write: {e}",
                grefs.len()
            ))
        })?;
    let writable = mapping.access().is_writable();
    let region = mapping
        .into_region()
        .map_err(|e| PagesError::BadGrant(e.to_string()))?;
    Ok((region, writable))
}

/// Allocates `count` zeroed pages granted to `domid` with `access` (the backend's own mapping
/// is always read-write); returns their region and grant references.
pub fn share(
    platform: &Platform,
    domid: DomId,
    count: usize,
    access: Access,
) -> Result<(SharedRegion, Vec<u32>), PagesError> {
    let pages = share_raw(platform, domid, count, access)?;
    let grefs = gref_values(&pages);
    let region = pages
        .into_region()
        .map_err(|e| PagesError::NoResources(format!("shared pages: {e}")))?;
    Ok((region, grefs))
}

fn share_raw(
    platform: &Platform,
    domid: DomId,
    count: usize,
    access: Access,
) -> Result<SharedPages, PagesError> {
    platform.share_pages(domid, count, access).map_err(|e| {
        PagesError::NoResources(format!("cannot grant {count} pages to domain {domid}: {e}"))
    })
}

fn gref_values(pages: &SharedPages) -> Vec<u32> {
    pages.grant_refs().iter().map(|g| g.0).collect()
}

/// Describes backend pages for the guest: inline when short, else in directory pages granted
/// to the guest read-only, which the caller keeps (returned) as long as the object lives.
pub fn describe(
    platform: &Platform,
    domid: DomId,
    grefs: &[u32],
) -> Result<(PageList, Vec<SharedRegion>), PagesError> {
    if grefs.len() <= INLINE_GREFS {
        let list = PageList::inline(grefs)
            .map_err(|e| PagesError::NoResources(format!("page list: {e}")))?;
        return Ok((list, Vec::new()));
    }
    let need = dir_pages_needed(grefs.len());
    let pages = share_raw(platform, domid, need, Access::ReadOnly)?;
    let dir_grefs = gref_values(&pages);
    let all = pages
        .into_region()
        .map_err(|e| PagesError::NoResources(format!("directory pages: {e}")))?;
    let dir_regions: Vec<SharedRegion> = (0..need)
        .map(|i| all.subregion(i * xen_platform::PAGE_SIZE, xen_platform::PAGE_SIZE))
        .collect::<Result<_, _>>()
        .map_err(|e| PagesError::NoResources(format!("directory pages: {e}")))?;
    let list = write_page_list(grefs, &dir_regions, &dir_grefs)
        .map_err(|e| PagesError::NoResources(format!("page directory: {e}")))?;
    Ok((list, vec![all]))
}

/// Pages needed for `entries` slots of `slot_len` bytes (at least one).
pub fn pages_for(entries: usize, slot_len: usize) -> usize {
    (entries * slot_len)
        .div_ceil(xen_platform::PAGE_SIZE)
        .max(1)
}
