//! Grants, event channels and XenStore transport, on real Xen and on the simulated Xen host.
//!
//! This is the one place where real Xen and the simulator differ (docs/platform.md; where it
//! sits among the crates: docs/architecture.md). Code above it uses [`Platform`] and the handle
//! types ([`SharedPages`], [`ForeignMapping`], [`EventChannel`]) and never learns which
//! platform it runs on:
//!
//! - **real Xen**: `/dev/xen/gntalloc`, `/dev/xen/gntdev`, `/dev/xen/evtchn` through their
//!   ioctls ([`xen::abi`], checked against the C headers), no C Xen library;
//! - **simulated host** ([`sim`]): `vrdma-simhost` plays the hypervisor for processes on one
//!   machine — memfd pages and eventfds passed over per-domain Unix sockets.
//!
//! Shared memory is untrusted: it is never handed out as Rust references. A handle becomes a
//! `shared_ring::SharedRegion` (the audited accessors) with `into_region()`, or shows where it
//! is mapped as a [`PageSpan`]; see [`region`] for the contract.

pub mod detect;
pub mod error;
pub mod platform;
pub mod region;
pub mod sim;
pub mod types;
pub mod xen;

pub use detect::{detect, PlatformKind, ENV_SIM_DIR, ENV_SIM_DOMID};
pub use error::{Error, Result};
pub use platform::{EventChannel, ForeignMapping, Platform, SharedPages, XenStoreEndpoint};
pub use region::PageSpan;
pub use types::{Access, DomId, EvtchnPort, GrantRef, UnmapNotify, PAGE_SIZE};
/// The XenStore crate this platform speaks (its client types are part of this API).
pub use xenstore_proto;
