//! The vrdma backend: dom0 daemon, toolstack CLI and software RDMA device.
//!
//! Empty so far: the split-driver issue fills this room. Nothing here pretends to work.

pub mod device;
