//! Mapping another domain's grants through `/dev/xen/gntdev`.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::abi::{self, VarBuf};
use super::GNTDEV_DEV;
use crate::error::{open_device, Error, Result};
use crate::region::Mapping;
use crate::types::{Access, DomId, GrantRef, UnmapNotify, PAGE_SIZE};

/// An open `/dev/xen/gntdev`.
#[derive(Debug)]
pub(crate) struct Gntdev {
    fd: OwnedFd,
}

/// Grants of one domain mapped here.
#[derive(Debug)]
pub(crate) struct XenMapping {
    dev: Arc<Gntdev>,
    index: u64,
    count: u32,
    map: Option<Mapping>,
}

fn refs_text(refs: &[GrantRef]) -> String {
    let v: Vec<String> = refs.iter().take(8).map(|r| r.0.to_string()).collect();
    if refs.len() > 8 {
        format!("[{}, ... ({} in all)]", v.join(", "), refs.len())
    } else {
        format!("[{}]", v.join(", "))
    }
}

pub(crate) fn refs_for_error(refs: &[GrantRef]) -> String {
    refs_text(refs)
}

impl Gntdev {
    pub(crate) fn open() -> Result<Gntdev> {
        Ok(Gntdev {
            fd: open_device(
                GNTDEV_DEV,
                "load the xen-gntdev module (modprobe xen-gntdev)",
            )?,
        })
    }

    pub(crate) fn map(
        self: &Arc<Self>,
        domid: DomId,
        refs: &[GrantRef],
        access: Access,
    ) -> Result<XenMapping> {
        let count = u32::try_from(refs.len())
            .ok()
            .filter(|&c| c > 0)
            .ok_or_else(|| Error::InvalidArgument(format!("cannot map {} grants", refs.len())))?;
        // Header (16 bytes) + refs[count] of {domid u32, ref u32}.
        let mut buf = VarBuf::new(16 + 8 * refs.len());
        buf.put_u32(0, count);
        for (i, r) in refs.iter().enumerate() {
            buf.put_u32(16 + 8 * i, u32::from(domid.0));
            buf.put_u32(20 + 8 * i, r.0);
        }
        // SAFETY: buf is laid out as ioctl_gntdev_map_grant_ref with room for `count` refs.
        unsafe { abi::ioctl_raw(&self.fd, abi::IOCTL_GNTDEV_MAP_GRANT_REF, buf.as_mut_ptr()) }
            .map_err(|e| {
                Error::os(
                    format!("{GNTDEV_DEV}: MAP_GRANT_REF of {count} grant(s) from domain {domid}"),
                    e,
                )
            })?;
        let mut m = XenMapping {
            dev: Arc::clone(self),
            index: buf.get_u64(8),
            count,
            map: None,
        };
        // The grant hypercall happens at mmap time: this is where Xen says no. A read-only
        // mmap makes gntdev ask for a read-only mapping (GNTMAP_readonly).
        match Mapping::map_fd(
            &self.fd,
            m.index,
            refs.len() * PAGE_SIZE,
            access.is_writable(),
        ) {
            Ok(map) => m.map = Some(map),
            Err(Error::Os { source, .. }) => {
                return Err(Error::GrantRefused {
                    domid,
                    refs: refs_text(refs),
                    errno: source.raw_os_error().unwrap_or(0),
                    reason: format!(
                        "Xen refused the mapping ({source}): the grant does not exist, is not \
                         granted to this domain, or is read-only and {access:?} was asked"
                    ),
                })
            }
            Err(e) => return Err(e),
        }
        Ok(m)
    }
}

impl XenMapping {
    pub(crate) fn mapping(&self) -> &Mapping {
        self.map.as_ref().expect("mapped until drop")
    }

    pub(crate) fn set_unmap_notify(&self, n: &UnmapNotify) -> Result<()> {
        let mut arg = abi::GntdevUnmapNotify {
            index: self.index + n.clear_byte.unwrap_or(0) as u64,
            action: n.action_bits(),
            event_channel_port: n.event.map_or(0, |p| p.0),
        };
        // SAFETY: arg is an ioctl_gntdev_unmap_notify (ABI-checked).
        unsafe { abi::ioctl_struct(&self.dev.fd, abi::IOCTL_GNTDEV_SET_UNMAP_NOTIFY, &mut arg) }
            .map_err(|e| Error::os(format!("{GNTDEV_DEV}: SET_UNMAP_NOTIFY"), e))?;
        Ok(())
    }
}

impl Drop for XenMapping {
    fn drop(&mut self) {
        self.map.take();
        let mut arg = abi::GntdevUnmapGrantRef {
            index: self.index,
            count: self.count,
            pad: 0,
        };
        // SAFETY: `arg` is a live, exclusive `ioctl_gntdev_unmap_grant_ref` (its layout is checked
        // against the C header in `abi`), which the kernel only reads. It names the grant range at
        // `self.index`, which this handle owns; the mmap of that range was unmapped just above,
        // so no pointer into the foreign pages is left in this process when they are released.
        let released =
            unsafe { abi::ioctl_struct(&self.dev.fd, abi::IOCTL_GNTDEV_UNMAP_GRANT_REF, &mut arg) };
        if let Err(e) = released {
            tracing::warn!("{GNTDEV_DEV}: UNMAP_GRANT_REF index {}: {e}", self.index);
        }
    }
}
