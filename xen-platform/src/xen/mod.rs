//! Real Xen: `/dev/xen/gntalloc`, `/dev/xen/gntdev` and `/dev/xen/evtchn` through their ioctls.
//! No C Xen library is involved; the struct layouts and ioctl numbers are in [`abi`].

pub mod abi;
pub(crate) mod evtchn;
pub(crate) mod gntalloc;
pub(crate) mod gntdev;
pub mod limits;

/// Device nodes used on real Xen.
pub const GNTALLOC_DEV: &str = "/dev/xen/gntalloc";
/// See [`GNTALLOC_DEV`].
pub const GNTDEV_DEV: &str = "/dev/xen/gntdev";
/// See [`GNTALLOC_DEV`].
pub const EVTCHN_DEV: &str = "/dev/xen/evtchn";
/// The guest's XenStore device (also present in dom0).
pub const XENBUS_DEV: &str = "/dev/xen/xenbus";
/// The knob that caps how many pages gntalloc may grant.
pub const GNTALLOC_LIMIT_KNOB: &str = "/sys/module/xen_gntalloc/parameters/limit";
