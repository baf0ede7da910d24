//! Sharing pages with another domain through `/dev/xen/gntalloc`.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::abi::{self, VarBuf};
use super::{GNTALLOC_DEV, GNTALLOC_LIMIT_KNOB};
use crate::error::{libc_errno, open_device, Error, Result};
use crate::region::Mapping;
use crate::types::{Access, DomId, GrantRef, UnmapNotify, PAGE_SIZE};

/// An open `/dev/xen/gntalloc`. Every allocation made through it is released when it closes,
/// which is how a dying process gives its grants back.
#[derive(Debug)]
pub(crate) struct Gntalloc {
    fd: OwnedFd,
}

/// Pages allocated by gntalloc and granted to one domain.
#[derive(Debug)]
pub(crate) struct XenShare {
    dev: Arc<Gntalloc>,
    index: u64,
    grefs: Vec<GrantRef>,
    map: Option<Mapping>,
}

/// The error for `ENOSPC` from gntalloc: the module's limit, or a full grant table.
pub(crate) fn grant_limit_error(domid: DomId, count: usize) -> Error {
    Error::GrantLimit {
        knob: format!(
            "gntalloc's `limit` ({GNTALLOC_LIMIT_KNOB}), or, if the grant table itself is full, \
             this domain's `max_grant_frames` (xl domain config / Xen's gnttab_max_frames)"
        ),
        detail: format!("gntalloc refused to grant {count} more page(s) to domain {domid}"),
    }
}

impl Gntalloc {
    pub(crate) fn open() -> Result<Gntalloc> {
        Ok(Gntalloc {
            fd: open_device(
                GNTALLOC_DEV,
                "load the xen-gntalloc module (modprobe xen-gntalloc)",
            )?,
        })
    }

    /// Allocate `count` pages granted to `domid`, and map them read-write here.
    pub(crate) fn share(
        self: &Arc<Self>,
        domid: DomId,
        count: usize,
        access: Access,
    ) -> Result<XenShare> {
        let count32 = u32::try_from(count)
            .ok()
            .filter(|&c| c > 0)
            .ok_or_else(|| Error::InvalidArgument(format!("cannot share {count} pages")))?;
        // Header (16 bytes) + gref_ids[count].
        let mut buf = VarBuf::new(16 + 4 * count.max(1));
        buf.put_u16(0, domid.0);
        buf.put_u16(
            2,
            if access.is_writable() {
                abi::GNTALLOC_FLAG_WRITABLE
            } else {
                0
            },
        );
        buf.put_u32(4, count32);
        // SAFETY: buf is laid out as ioctl_gntalloc_alloc_gref with room for `count` gref_ids.
        let r =
            unsafe { abi::ioctl_raw(&self.fd, abi::IOCTL_GNTALLOC_ALLOC_GREF, buf.as_mut_ptr()) };
        if let Err(e) = r {
            return Err(match e.raw_os_error() {
                Some(libc_errno::ENOSPC) => grant_limit_error(domid, count),
                _ => Error::os(
                    format!("{GNTALLOC_DEV}: granting {count} page(s) to domain {domid}"),
                    e,
                ),
            });
        }
        let index = buf.get_u64(8);
        let grefs = (0..count)
            .map(|i| GrantRef(buf.get_u32(16 + 4 * i)))
            .collect();
        let mut share = XenShare {
            dev: Arc::clone(self),
            index,
            grefs,
            map: None,
        };
        // The sharer always maps its own pages read-write; `access` limits the peer only.
        share.map = Some(Mapping::map_fd(&self.fd, index, count * PAGE_SIZE, true)?);
        Ok(share)
    }
}

impl XenShare {
    pub(crate) fn grant_refs(&self) -> &[GrantRef] {
        &self.grefs
    }

    pub(crate) fn mapping(&self) -> &Mapping {
        self.map.as_ref().expect("mapped until drop")
    }
    pub(crate) fn mapping_mut(&mut self) -> &mut Mapping {
        self.map.as_mut().expect("mapped until drop")
    }

    pub(crate) fn set_unmap_notify(&self, n: &UnmapNotify) -> Result<()> {
        let mut arg = abi::GntallocUnmapNotify {
            index: self.index + n.clear_byte.unwrap_or(0) as u64,
            action: n.action_bits(),
            event_channel_port: n.event.map_or(0, |p| p.0),
        };
        // SAFETY: arg is an ioctl_gntalloc_unmap_notify (ABI-checked).
        unsafe { abi::ioctl_struct(&self.dev.fd, abi::IOCTL_GNTALLOC_SET_UNMAP_NOTIFY, &mut arg) }
            .map_err(|e| Error::os(format!("{GNTALLOC_DEV}: SET_UNMAP_NOTIFY"), e))?;
        Ok(())
    }
}

impl Drop for XenShare {
    fn drop(&mut self) {
        // Unmap first; gntalloc frees the pages once both the dealloc and the unmap happened.
        self.map.take();
        let mut arg = abi::GntallocDeallocGref {
            index: self.index,
            count: self.grefs.len() as u32,
        };
        // SAFETY: `arg` is a live, exclusive `ioctl_gntalloc_dealloc_gref` (its layout is checked
        // against the C header in `abi`), which the kernel only reads. It names the grants at
        // `self.index`, which this handle owns; our mapping of them was unmapped just above, so
        // no pointer into those pages is left in this process when they are released.
        let released =
            unsafe { abi::ioctl_struct(&self.dev.fd, abi::IOCTL_GNTALLOC_DEALLOC_GREF, &mut arg) };
        if let Err(e) = released {
            tracing::warn!("{GNTALLOC_DEV}: DEALLOC_GREF index {}: {e}", self.index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_limit_names_the_gntalloc_knob() {
        let e = grant_limit_error(DomId(3), 16);
        let s = e.to_string();
        assert!(s.contains(GNTALLOC_LIMIT_KNOB), "{s}");
        assert!(s.contains("max_grant_frames"), "{s}");
        assert!(s.contains("domain 3"), "{s}");
        assert_eq!(e.raw_os_error(), Some(libc_errno::ENOSPC));
    }
}
