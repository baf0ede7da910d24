//! Host limits on grants that dom0 can read, and the facts about those it cannot.
//!
//! - gntalloc's host-wide `limit` (pages all gntalloc users of this domain may have granted at
//!   once; Linux's default is 1024) is a module parameter: [`GNTALLOC_LIMIT_KNOB`].
//! - dom0's maptrack (one entry per grant it maps, up to two per page for a PV dom0's gntdev,
//!   which maps for user space and for the kernel) is sized by Xen's `gnttab_max_maptrack_frames`
//!   boot option (default [`DEFAULT_MAPTRACK_FRAMES`] frames of [`MAPTRACK_ENTRIES_PER_FRAME`]
//!   entries). Xen 4.17 shows it only through hypfs (`/params/gnttab_max_maptrack_frames`),
//!   which needs a hypercall interface this crate does not use, so the backend takes it from
//!   its configuration.

use std::path::Path;

use super::GNTALLOC_LIMIT_KNOB;

/// Xen's default `gnttab_max_maptrack_frames` (dom0 gets it unless the boot line says else).
pub const DEFAULT_MAPTRACK_FRAMES: u64 = 1024;
/// Maptrack entries per 4 KiB frame (an entry is 8 bytes).
pub const MAPTRACK_ENTRIES_PER_FRAME: u64 = 512;
/// Maptrack entries a PV dom0 may use per guest page mapped through gntdev.
pub const MAPTRACK_ENTRIES_PER_MAPPED_PAGE: u64 = 2;
/// Linux's default gntalloc `limit`.
pub const DEFAULT_GNTALLOC_LIMIT: u64 = 1024;

/// A host limit and the knob that sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLimit {
    pub value: u64,
    pub knob: String,
}

/// What this domain can read about the host's limits on its grants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantLimits {
    /// Pages this domain may have granted at once, all its users together (gntalloc's `limit`
    /// on Xen, the domain's grant limit on the simulated host); `None` when not readable.
    pub grant_pages: Option<HostLimit>,
}

/// gntalloc's `limit` as the module parameter reads (`None` when the module is not loaded or
/// the value is not a number).
pub fn gntalloc_limit() -> Option<HostLimit> {
    read_number(Path::new(GNTALLOC_LIMIT_KNOB)).map(|value| HostLimit {
        value,
        knob: format!("gntalloc's limit ({GNTALLOC_LIMIT_KNOB})"),
    })
}

/// A sysfs-style file holding one decimal number.
pub fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_read_and_garbage_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("limit");
        std::fs::write(&p, "4096\n").unwrap();
        assert_eq!(read_number(&p), Some(4096));
        std::fs::write(&p, "lots").unwrap();
        assert_eq!(read_number(&p), None);
        assert_eq!(read_number(&dir.path().join("absent")), None);
    }
}
