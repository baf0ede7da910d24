//! The pieces of `vrdma-demo`: a simulated Xen host with the vrdma backend running in this
//! process and guest domains to run programs in ([`lab`]); Debian's unmodified verbs tools
//! between two guests ([`apps`], `--apps`). The C ABI tests
//! (`frontend/capi/tests`) stand on the same lab. This crate is the only one that links both
//! sides (dom0's `vrdma-backend` and the guest tool `vrdma-perf`); it is not published.

pub mod apps;
pub mod lab;
