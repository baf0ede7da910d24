//! The vrdma backend: dom0 daemon, toolstack CLI and software RDMA device.
//!
//! - [`daemon`]: the `vrdma-backend` daemon's control plane (platform start-up, XenStore event
//!   loop, signals); [`config`]: its configuration file.
//! - [`xenbus`]: the backend side of the xenbus handshake (devices and channels).
//! - [`control`]: the control-ring service of each channel; [`resources`]: quotas and what each
//!   channel holds.
//! - [`toolstack`]: attach/detach of a vrdma device as libxl does it.
//! - [`device`]: the RDMA device trait and the software device model.
//! - [`escape`]: guest-written text made safe for terminals and logs.

pub mod config;
pub mod control;
pub mod daemon;
pub mod device;
pub mod escape;
pub mod resources;
pub mod toolstack;
pub mod xenbus;
