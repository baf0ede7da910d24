//! `libvrdma_verbs.so`: the libibverbs ABI of rdma-core 44 (Debian 12) over the `vrdma`
//! frontend library, so that unmodified verbs programs run in a Xen guest.
//!
//! `vrdma-exec` preloads it (`LD_PRELOAD`): the program's references to `ibv_open_device@
//! IBVERBS_1.1` and friends bind here, Debian's real libibverbs stays loaded for everything
//! this library does not define (pure helpers such as `ibv_node_type_str`). The static
//! inlines of verbs.h (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`)
//! jump through `ibv_context::ops`; `ibv_query_port` and `ibv_query_device_ex` look at
//! `struct verbs_context` in front of the `ibv_context` (see [`device`]). See docs/verbs.md.
//!
//! Every entry point runs under [`guard`]: a panic never unwinds into C; it becomes the
//! entry point's error value (errno `EIO`).

// The C entry points take raw pointers from the application; their safety contract is the C
// API's (valid objects of this library, valid buffers), documented in verbs.h.
#![allow(clippy::missing_safety_doc)]

use std::panic::{catch_unwind, AssertUnwindSafe};

mod device;
mod memory;
mod misc;
mod objects;

// `vrdma_verbs_<name>` → `<name>@@<version>` for every line of exports.txt (build.rs).
std::arch::global_asm!(include_str!(concat!(env!("OUT_DIR"), "/symver.s")));

pub(crate) mod errno {
    pub use libc::{EAGAIN, EFAULT, EINVAL, EIO, ENODEV, ENOENT, ENOMEM, EOPNOTSUPP, EPERM};
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, valid for the thread.
    unsafe { *libc::__errno_location() = e };
}

/// Runs an entry point's body; a panic becomes `on_panic` (and errno `EIO`), never an unwind
/// across the C boundary.
pub(crate) fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            set_errno(errno::EIO);
            on_panic
        }
    }
}

/// The errno for a `vrdma` error.
pub(crate) fn errno_of(e: &vrdma::Error) -> i32 {
    use vrdma::{Error, Status};
    match e {
        Error::InvalidArgument(_) => errno::EINVAL,
        Error::QueueFull { .. } => errno::ENOMEM,
        Error::NoDevice { .. } => errno::ENODEV,
        Error::Platform(p) => p.raw_os_error().unwrap_or(errno::EIO),
        Error::Backend { status, .. } => match status {
            Status::NoResources | Status::QuotaExceeded => errno::ENOMEM,
            Status::InvalidArgument | Status::BadRequest => errno::EINVAL,
            Status::NotSupported => errno::EOPNOTSUPP,
            Status::NotPermitted => errno::EPERM,
            _ => errno::EIO,
        },
        _ => errno::EIO,
    }
}

/// Logs a failed call (RUST_LOG-style filter in `VRDMA_VERBS_LOG`) and returns its errno.
pub(crate) fn fail(what: &str, e: &vrdma::Error) -> i32 {
    if std::env::var_os("VRDMA_VERBS_LOG").is_some() {
        eprintln!("vrdma-verbs: {what}: {e}");
    }
    tracing::debug!("{what}: {e}");
    errno_of(e)
}
