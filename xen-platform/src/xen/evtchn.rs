//! Event channels through `/dev/xen/evtchn`: one open file per channel, so each channel has its
//! own pollable descriptor.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{Mode, OFlags};

use super::abi;
use super::EVTCHN_DEV;
use crate::error::{device_error, Error, Result};
use crate::types::{DomId, EvtchnPort};

#[derive(Debug)]
pub(crate) struct XenEvtchn {
    fd: OwnedFd,
    port: EvtchnPort,
}

fn open() -> Result<OwnedFd> {
    rustix::fs::open(
        EVTCHN_DEV,
        OFlags::RDWR | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| {
        device_error(
            EVTCHN_DEV,
            "load the xen-evtchn module (modprobe xen-evtchn)",
            e.into(),
        )
    })
}

impl XenEvtchn {
    pub(crate) fn alloc_unbound(remote: DomId) -> Result<XenEvtchn> {
        let fd = open()?;
        let mut arg = abi::EvtchnBindUnboundPort {
            remote_domain: u32::from(remote.0),
        };
        // SAFETY: arg is an ioctl_evtchn_bind_unbound_port (ABI-checked).
        let port = unsafe { abi::ioctl_struct(&fd, abi::IOCTL_EVTCHN_BIND_UNBOUND_PORT, &mut arg) }
            .map_err(|e| Error::Evtchn(format!("allocating a port for domain {remote}: {e}")))?;
        Ok(XenEvtchn {
            fd,
            port: EvtchnPort(port as u32),
        })
    }

    pub(crate) fn bind_interdomain(remote: DomId, remote_port: EvtchnPort) -> Result<XenEvtchn> {
        let fd = open()?;
        let mut arg = abi::EvtchnBindInterdomain {
            remote_domain: u32::from(remote.0),
            remote_port: remote_port.0,
        };
        // SAFETY: arg is an ioctl_evtchn_bind_interdomain (ABI-checked).
        let port = unsafe { abi::ioctl_struct(&fd, abi::IOCTL_EVTCHN_BIND_INTERDOMAIN, &mut arg) }
            .map_err(|e| {
                Error::Evtchn(format!(
                    "binding to domain {remote} port {remote_port}: {e} (is the port unbound and \
                     offered to this domain?)"
                ))
            })?;
        Ok(XenEvtchn {
            fd,
            port: EvtchnPort(port as u32),
        })
    }

    pub(crate) fn port(&self) -> EvtchnPort {
        self.port
    }

    pub(crate) fn notify(&self) -> Result<()> {
        let mut arg = abi::EvtchnNotify { port: self.port.0 };
        // SAFETY: arg is an ioctl_evtchn_notify (ABI-checked).
        unsafe { abi::ioctl_struct(&self.fd, abi::IOCTL_EVTCHN_NOTIFY, &mut arg) }
            .map_err(|e| Error::os(format!("{EVTCHN_DEV}: notify port {}", self.port), e))?;
        Ok(())
    }

    /// Read pending events without blocking; re-enable (unmask) each port read, as the driver
    /// masks a port when it delivers it.
    pub(crate) fn try_consume(&self) -> Result<bool> {
        let mut buf = [0u8; 4 * 16];
        match rustix::io::read(&self.fd, &mut buf) {
            Ok(n) => {
                for chunk in buf[..n - n % 4].chunks_exact(4) {
                    rustix::io::write(&self.fd, chunk)
                        .map_err(|e| Error::os(format!("{EVTCHN_DEV}: unmask"), e.into()))?;
                }
                Ok(n >= 4)
            }
            Err(rustix::io::Errno::AGAIN) => Ok(false),
            Err(e) => Err(Error::os(format!("{EVTCHN_DEV}: read"), e.into())),
        }
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for XenEvtchn {
    fn drop(&mut self) {
        let mut arg = abi::EvtchnUnbind { port: self.port.0 };
        // SAFETY: arg is an ioctl_evtchn_unbind (ABI-checked). Closing the fd would unbind
        // too; doing it explicitly reports failures.
        if let Err(e) = unsafe { abi::ioctl_struct(&self.fd, abi::IOCTL_EVTCHN_UNBIND, &mut arg) } {
            tracing::debug!("{EVTCHN_DEV}: unbind port {}: {e}", self.port);
        }
    }
}
