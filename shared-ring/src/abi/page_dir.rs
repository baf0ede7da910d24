//! Lists of granted pages: inline in a control slot when short, otherwise in chained
//! page-directory pages (the `xendispl_page_directory` idea of displif.h).
//!
//! A directory page (4096 bytes):
//! ```text
//!    0  next_dir_gref u32   grant of the next directory page; meaningful only while entries
//!                           remain after this page, otherwise 0
//!    4  gref[1023] u32      grants of the listed pages, in order
//! ```
//! A [`PageList`] inside a control slot (24 bytes):
//! ```text
//!    0  n_pages u32         number of listed pages (1..)
//!    4  dir_gref u32        first directory page when n_pages > 4, else 0
//!    8  gref[4] u32         the pages themselves when n_pages <= 4, else 0 (unused ones 0)
//! ```
//! The reader bounds `n_pages` *before* it walks a directory (quota), and the walk consumes at
//! least one entry per page, so a directory chain that loops cannot make it run forever.

use super::{check_len, get_u32, set_u32, AbiError, GrantRef};
use crate::mem::{MemError, SharedRegion, PAGE_SIZE};

/// Grant references per directory page.
pub const GREFS_PER_DIR_PAGE: usize = PAGE_SIZE / 4 - 1;
/// Grant references carried inline in a [`PageList`].
pub const INLINE_GREFS: usize = 4;
/// Encoded size of a [`PageList`].
pub const PAGE_LIST_LEN: usize = 8 + 4 * INLINE_GREFS;

/// Byte offsets inside a directory page and a page list.
pub mod field {
    pub const DIR_NEXT: usize = 0;
    pub const DIR_GREFS: usize = 4;
    pub const LIST_N_PAGES: usize = 0;
    pub const LIST_DIR_GREF: usize = 4;
    pub const LIST_INLINE: usize = 8;
}

/// Number of directory pages needed for `n_pages` grants (0 when they fit inline).
pub fn dir_pages_needed(n_pages: usize) -> usize {
    if n_pages <= INLINE_GREFS {
        0
    } else {
        n_pages.div_ceil(GREFS_PER_DIR_PAGE)
    }
}

/// A list of granted pages as carried in a control slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PageList {
    /// Up to [`INLINE_GREFS`] pages listed in the slot.
    Inline {
        n_pages: u8,
        grefs: [GrantRef; INLINE_GREFS],
    },
    /// More pages, listed in a chain of directory pages starting at `first_dir_gref`.
    Directory {
        n_pages: u32,
        first_dir_gref: GrantRef,
    },
}

impl PageList {
    /// An inline list (at most [`INLINE_GREFS`] pages).
    pub fn inline(list: &[GrantRef]) -> Result<Self, AbiError> {
        if list.is_empty() || list.len() > INLINE_GREFS {
            return Err(AbiError::OutOfRange {
                what: "inline page count",
                value: list.len() as u64,
                max: INLINE_GREFS as u64,
            });
        }
        let mut grefs = [0; INLINE_GREFS];
        grefs[..list.len()].copy_from_slice(list);
        Ok(Self::Inline {
            n_pages: list.len() as u8,
            grefs,
        })
    }

    /// Number of listed pages.
    pub fn n_pages(&self) -> u32 {
        match self {
            Self::Inline { n_pages, .. } => u32::from(*n_pages),
            Self::Directory { n_pages, .. } => *n_pages,
        }
    }

    /// Parses the 24-byte encoding; `max_pages` is the reader's bound (quota).
    pub fn parse(b: &[u8], max_pages: u32) -> Result<Self, AbiError> {
        check_len(b.len(), PAGE_LIST_LEN)?;
        let n = get_u32(b, field::LIST_N_PAGES);
        let dir = get_u32(b, field::LIST_DIR_GREF);
        if n == 0 || n > max_pages {
            return Err(AbiError::OutOfRange {
                what: "page count",
                value: n.into(),
                max: max_pages.into(),
            });
        }
        let mut grefs = [0; INLINE_GREFS];
        for (i, g) in grefs.iter_mut().enumerate() {
            *g = get_u32(b, field::LIST_INLINE + 4 * i);
        }
        if n as usize <= INLINE_GREFS {
            if dir != 0 || grefs[n as usize..].iter().any(|&g| g != 0) {
                return Err(AbiError::Reserved {
                    field: "page_list.unused",
                });
            }
            Ok(Self::Inline {
                n_pages: n as u8,
                grefs,
            })
        } else {
            if grefs.iter().any(|&g| g != 0) {
                return Err(AbiError::Reserved {
                    field: "page_list.inline",
                });
            }
            Ok(Self::Directory {
                n_pages: n,
                first_dir_gref: dir,
            })
        }
    }

    /// Writes the 24-byte encoding into `b[..PAGE_LIST_LEN]`.
    pub fn emit(&self, b: &mut [u8]) {
        b[..PAGE_LIST_LEN].fill(0);
        match self {
            Self::Inline { n_pages, grefs } => {
                set_u32(b, field::LIST_N_PAGES, u32::from(*n_pages));
                for (i, g) in grefs.iter().enumerate().take(usize::from(*n_pages)) {
                    set_u32(b, field::LIST_INLINE + 4 * i, *g);
                }
            }
            Self::Directory {
                n_pages,
                first_dir_gref,
            } => {
                set_u32(b, field::LIST_N_PAGES, *n_pages);
                set_u32(b, field::LIST_DIR_GREF, *first_dir_gref);
            }
        }
    }
}

/// Writes `grefs` into the directory pages `dir_pages` (granted as `dir_grefs`, same order),
/// chaining them; returns the [`PageList`] to send. Short lists need no directory pages.
pub fn write_page_list(
    grefs: &[GrantRef],
    dir_pages: &[SharedRegion],
    dir_grefs: &[GrantRef],
) -> Result<PageList, PageDirError> {
    if grefs.len() <= INLINE_GREFS {
        return Ok(PageList::inline(grefs)?);
    }
    let need = dir_pages_needed(grefs.len());
    if dir_pages.len() < need || dir_grefs.len() < need {
        return Err(PageDirError::NotEnoughDirPages {
            need,
            have: dir_pages.len().min(dir_grefs.len()),
        });
    }
    let n_pages = u32::try_from(grefs.len()).map_err(|_| AbiError::OutOfRange {
        what: "page count",
        value: grefs.len() as u64,
        max: u32::MAX.into(),
    })?;
    for (i, chunk) in grefs.chunks(GREFS_PER_DIR_PAGE).enumerate() {
        let mut page = vec![0u8; PAGE_SIZE];
        let next = if i + 1 < need { dir_grefs[i + 1] } else { 0 };
        set_u32(&mut page, field::DIR_NEXT, next);
        for (j, g) in chunk.iter().enumerate() {
            set_u32(&mut page, field::DIR_GREFS + 4 * j, *g);
        }
        dir_pages[i].write(0, &page)?;
    }
    Ok(PageList::Directory {
        n_pages,
        first_dir_gref: dir_grefs[0],
    })
}

/// Errors while writing or walking a page directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PageDirError {
    #[error("page list needs {need} directory pages, {have} given")]
    NotEnoughDirPages { need: usize, have: usize },
    #[error("page directory walk is complete; no page to read")]
    Finished,
    #[error(transparent)]
    Abi(#[from] AbiError),
    #[error(transparent)]
    Mem(#[from] MemError),
}

/// Walks a directory chain on the reading side: the caller maps [`Self::next_dir_gref`],
/// hands the mapping to [`Self::read_dir_page`], and repeats until [`Self::is_done`].
#[derive(Debug, Clone)]
pub struct PageDirWalker {
    remaining: u32,
    next: GrantRef,
    grefs: Vec<GrantRef>,
}

impl PageDirWalker {
    /// Starts a walk of a parsed list (an inline list is complete at once).
    pub fn new(list: &PageList) -> Self {
        match *list {
            PageList::Inline { n_pages, grefs } => Self {
                remaining: 0,
                next: 0,
                grefs: grefs[..usize::from(n_pages).min(INLINE_GREFS)].to_vec(),
            },
            PageList::Directory {
                n_pages,
                first_dir_gref,
            } => Self {
                remaining: n_pages,
                next: first_dir_gref,
                grefs: Vec::new(),
            },
        }
    }
    /// The directory page to map and read next, if the walk is not done.
    pub fn next_dir_gref(&self) -> Option<GrantRef> {
        (self.remaining > 0).then_some(self.next)
    }
    /// Whether every gref has been read.
    pub fn is_done(&self) -> bool {
        self.remaining == 0
    }
    /// Copies the next directory page out of `page` (a mapping of [`Self::next_dir_gref`]).
    pub fn read_dir_page(&mut self, page: &SharedRegion) -> Result<(), PageDirError> {
        if self.remaining == 0 {
            return Err(PageDirError::Finished);
        }
        let mut buf = vec![0u8; PAGE_SIZE];
        page.read(0, &mut buf)?;
        let take = (self.remaining as usize).min(GREFS_PER_DIR_PAGE);
        self.grefs.reserve(take);
        for j in 0..take {
            self.grefs.push(get_u32(&buf, field::DIR_GREFS + 4 * j));
        }
        self.remaining -= take as u32;
        self.next = get_u32(&buf, field::DIR_NEXT);
        Ok(())
    }
    /// The grefs read so far (all of them once [`Self::is_done`]).
    pub fn grefs(&self) -> &[GrantRef] {
        &self.grefs
    }
    /// Consumes the walker, returning the grefs read.
    pub fn into_grefs(self) -> Vec<GrantRef> {
        self.grefs
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn inline_list_round_trips_and_checks_unused() {
        let l = PageList::inline(&[10, 11]).unwrap();
        let mut b = [0u8; PAGE_LIST_LEN];
        l.emit(&mut b);
        assert_eq!(
            &b[..16],
            &[2, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 11, 0, 0, 0]
        );
        assert_eq!(PageList::parse(&b, 16).unwrap(), l);
        b[20] = 1;
        assert_eq!(
            PageList::parse(&b, 16).err(),
            Some(AbiError::Reserved {
                field: "page_list.unused"
            })
        );
        assert_eq!(
            PageList::parse(&[0u8; PAGE_LIST_LEN], 16).err(),
            Some(AbiError::OutOfRange {
                what: "page count",
                value: 0,
                max: 16
            })
        );
    }

    #[test]
    fn directory_chain_round_trips() {
        let n = GREFS_PER_DIR_PAGE * 2 + 5;
        let grefs: Vec<u32> = (0..n as u32).map(|i| 1000 + i).collect();
        let pages: Vec<_> = (0..3)
            .map(|_| SharedRegion::alloc(PAGE_SIZE).unwrap())
            .collect();
        let list = write_page_list(&grefs, &pages, &[50, 51, 52]).unwrap();
        assert_eq!(
            list,
            PageList::Directory {
                n_pages: n as u32,
                first_dir_gref: 50
            }
        );
        let mut b = [0u8; PAGE_LIST_LEN];
        list.emit(&mut b);
        let parsed = PageList::parse(&b, 1 << 20).unwrap();
        assert_eq!(
            PageList::parse(&b, 100).err(),
            Some(AbiError::OutOfRange {
                what: "page count",
                value: 2051,
                max: 100
            })
        );
        let mut w = PageDirWalker::new(&parsed);
        let mut visited = vec![];
        while let Some(g) = w.next_dir_gref() {
            visited.push(g);
            w.read_dir_page(&pages[(g - 50) as usize]).unwrap();
        }
        assert_eq!(visited, [50, 51, 52]);
        assert_eq!(w.into_grefs(), grefs);
    }

    #[test]
    fn looping_directory_terminates() {
        let page = SharedRegion::alloc(PAGE_SIZE).unwrap();
        page.store_u32(0, 7, std::sync::atomic::Ordering::Relaxed)
            .unwrap(); // next = itself
        let mut w = PageDirWalker::new(&PageList::Directory {
            n_pages: 5000,
            first_dir_gref: 7,
        });
        let mut steps = 0;
        while w.next_dir_gref().is_some() {
            w.read_dir_page(&page).unwrap();
            steps += 1;
        }
        assert_eq!(steps, 5);
        assert_eq!(w.grefs().len(), 5000);
        assert_eq!(w.read_dir_page(&page), Err(PageDirError::Finished));
    }
}
