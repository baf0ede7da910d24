//! The crate's error type. Every variant says what failed in Xen terms and, where there is
//! one, which knob or device node the operator has to look at.

use std::io;
use std::path::PathBuf;

use crate::types::DomId;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the platform layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Neither real Xen nor a simulated host was found.
    #[error("no Xen platform: {0}")]
    NoPlatform(String),

    /// A device node or socket exists but this process may not open it.
    #[error("permission denied opening {path}: {source} (run as root, or give this user access to {path})")]
    DevicePermission {
        /// The node that refused us.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },

    /// A device node is missing.
    #[error("{path} does not exist: {hint}")]
    DeviceMissing {
        /// The missing node.
        path: PathBuf,
        /// What usually provides it.
        hint: &'static str,
    },

    /// No more pages may be granted.
    #[error("grant limit reached: {detail}; raise {knob}")]
    GrantLimit {
        /// The knob that sets the limit (a sysfs path, a Xen option, a simhost flag).
        knob: String,
        /// What was asked and what is in use, as far as known.
        detail: String,
    },

    /// The granting domain's grants do not allow this mapping (not granted to us, read-only,
    /// or no such grant). The simulated host reports exactly this with `EPERM`.
    #[error("mapping grants {refs} of domain {domid} refused: {reason}")]
    GrantRefused {
        /// The granting domain.
        domid: DomId,
        /// The references, as text.
        refs: String,
        /// Why.
        reason: String,
        /// The OS error code behind it (`EPERM` on the simulated host).
        errno: i32,
    },

    /// An event channel could not be bound.
    #[error("event channel: {0}")]
    Evtchn(String),

    /// The caller passed something that cannot be right (zero pages, offset past the end, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A system call failed.
    #[error("{op}: {source}")]
    Os {
        /// What we were doing.
        op: String,
        /// The OS error.
        source: io::Error,
    },

    /// Talking to XenStore failed.
    #[error("XenStore ({what}): {source}")]
    XenStore {
        /// Which store / what we did.
        what: String,
        /// The client's error.
        source: xenstore_proto::client::Error,
    },

    /// The simulated host refused or failed a request.
    #[error("simulated Xen host: {0}")]
    SimHost(String),

    /// The simulated host sent something that does not parse (or hung up mid-answer).
    #[error("simulated Xen host protocol: {0}")]
    Protocol(String),
}

impl Error {
    /// Wrap an OS error with what we were doing.
    pub fn os(op: impl Into<String>, source: io::Error) -> Error {
        Error::Os {
            op: op.into(),
            source,
        }
    }

    /// The `errno` behind this error, when there is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::DevicePermission { source, .. } | Error::Os { source, .. } => {
                source.raw_os_error()
            }
            Error::GrantRefused { errno, .. } => Some(*errno),
            Error::GrantLimit { .. } => Some(libc_errno::ENOSPC),
            _ => None,
        }
    }

    /// True when the error is a permission problem (EPERM/EACCES or a refused grant).
    pub fn is_permission_denied(&self) -> bool {
        matches!(
            self,
            Error::DevicePermission { .. } | Error::GrantRefused { .. }
        ) || matches!(
            self.raw_os_error(),
            Some(libc_errno::EPERM) | Some(libc_errno::EACCES)
        )
    }
}

/// The few errno values we name (Linux numbering; this crate is Linux-only).
pub(crate) mod libc_errno {
    pub const EPERM: i32 = 1;
    #[allow(dead_code)]
    pub const ENOENT: i32 = 2;
    pub const EACCES: i32 = 13;
    pub const EINVAL: i32 = 22;
    pub const ENOSPC: i32 = 28;
}

/// Open a device node, turning the common failures into errors that name the node.
pub(crate) fn open_device(path: &str, hint: &'static str) -> Result<std::os::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| device_error(path, hint, e.into()))
}

pub(crate) fn device_error(path: &str, hint: &'static str, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::NotFound => Error::DeviceMissing {
            path: path.into(),
            hint,
        },
        io::ErrorKind::PermissionDenied => Error::DevicePermission {
            path: path.into(),
            source: e,
        },
        _ => Error::os(format!("open {path}"), e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_device_names_the_module() {
        let e = device_error(
            "/dev/xen/gntalloc",
            "load the xen-gntalloc module",
            io::Error::from_raw_os_error(libc_errno::ENOENT),
        );
        let s = e.to_string();
        assert!(
            s.contains("/dev/xen/gntalloc") && s.contains("xen-gntalloc"),
            "{s}"
        );
    }

    #[test]
    fn permission_names_the_node() {
        let e = device_error(
            "/dev/xen/gntdev",
            "",
            io::Error::from_raw_os_error(libc_errno::EACCES),
        );
        assert!(e.is_permission_denied());
        assert!(e.to_string().contains("/dev/xen/gntdev"));
    }

    #[test]
    fn other_errors_stay_os_errors() {
        let e = device_error("/x", "", io::Error::from_raw_os_error(libc_errno::EINVAL));
        assert_eq!(e.raw_os_error(), Some(libc_errno::EINVAL));
        assert!(!e.is_permission_denied());
    }
}
