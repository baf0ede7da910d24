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
//! It also carries librdmacm's `rdma_*` calls (`RDMACM_1.0`…, [`cma`]) over `vrdma`'s
//! connection manager, so rping and perftest `-R` find the same device.
//!
//! Every entry point runs under [`guard`]: a panic never unwinds into C; it becomes the
//! entry point's error value (errno `EIO`).

// The C entry points take raw pointers from the application; their safety contract is the C
// API's (valid objects of this library, valid buffers), documented in verbs.h.
#![allow(clippy::missing_safety_doc)]

use std::panic::{catch_unwind, AssertUnwindSafe};

mod cma;
mod cq;
mod device;
mod memory;
mod misc;
mod mr;
mod objects;
mod qp;

// `vrdma_verbs_<name>` → `<name>@@<version>` for every line of exports.txt (build.rs).
std::arch::global_asm!(include_str!(concat!(env!("OUT_DIR"), "/symver.s")));

pub(crate) mod errno {
    pub use libc::{
        EADDRINUSE, EAFNOSUPPORT, EAGAIN, EFAULT, EINVAL, EIO, ENODEV, ENOENT, ENOMEM, ENOSYS,
        EOPNOTSUPP, EPERM,
    };
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

#[cfg(test)]
mod tests {
    //! Bad arguments give errors, never a crash: NULL and foreign objects everywhere.
    use super::cq::*;
    use super::device::*;
    use super::misc::*;
    use super::mr::*;
    use super::objects::*;
    use super::qp::*;
    use std::ffi::CStr;
    use verbs_abi::verbs::*;

    fn errno() -> i32 {
        // SAFETY: the calling thread's errno slot.
        unsafe { *libc::__errno_location() }
    }

    #[test]
    fn null_objects_are_errors() {
        // SAFETY: every call gets NULL (or a pointer to a local) where an object goes: the
        // library must refuse, not dereference.
        unsafe {
            assert!(vrdma_verbs_ibv_open_device(std::ptr::null_mut()).is_null());
            assert_eq!(errno(), libc::EINVAL);
            let mut fake: ibv_device = std::mem::zeroed();
            assert!(
                vrdma_verbs_ibv_open_device(&mut fake).is_null(),
                "not one of ours"
            );
            assert!(vrdma_verbs_ibv_get_device_name(&mut fake).is_null());
            assert_eq!(
                vrdma_verbs_ibv_close_device(std::ptr::null_mut()),
                libc::EINVAL
            );
            let mut attr = ibv_device_attr::default();
            assert_eq!(
                vrdma_verbs_ibv_query_device(std::ptr::null_mut(), &mut attr),
                libc::EINVAL
            );
            let mut pattr = ibv_port_attr::default();
            assert_eq!(
                vrdma_verbs_ibv_query_port(std::ptr::null_mut(), 1, &mut pattr),
                libc::EINVAL
            );
            let mut gid = ibv_gid::default();
            assert_eq!(
                vrdma_verbs_ibv_query_gid(std::ptr::null_mut(), 1, 0, &mut gid),
                -1
            );
            assert!(vrdma_verbs_ibv_alloc_pd(std::ptr::null_mut()).is_null());
            assert_eq!(
                vrdma_verbs_ibv_dealloc_pd(std::ptr::null_mut()),
                libc::EINVAL
            );
            let mut buf = [0u8; 64];
            assert!(vrdma_verbs_ibv_reg_mr(
                std::ptr::null_mut(),
                buf.as_mut_ptr().cast(),
                64,
                IBV_ACCESS_LOCAL_WRITE as i32
            )
            .is_null());
            assert_eq!(errno(), libc::EINVAL);
            assert_eq!(vrdma_verbs_ibv_dereg_mr(std::ptr::null_mut()), libc::EINVAL);
            assert!(vrdma_verbs_ibv_create_cq(
                std::ptr::null_mut(),
                16,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0
            )
            .is_null());
            assert_eq!(
                vrdma_verbs_ibv_destroy_cq(std::ptr::null_mut()),
                libc::EINVAL
            );
            let mut init = ibv_qp_init_attr::default();
            assert!(vrdma_verbs_ibv_create_qp(std::ptr::null_mut(), &mut init).is_null());
            assert_eq!(
                vrdma_verbs_ibv_destroy_qp(std::ptr::null_mut()),
                libc::EINVAL
            );
            let mut qattr = ibv_qp_attr::default();
            assert_eq!(
                vrdma_verbs_ibv_modify_qp(std::ptr::null_mut(), &mut qattr, 0),
                libc::EINVAL
            );
            assert!(vrdma_verbs_ibv_create_comp_channel(std::ptr::null_mut()).is_null());
            let (mut cq, mut cqctx) = (std::ptr::null_mut(), std::ptr::null_mut());
            assert_eq!(
                vrdma_verbs_ibv_get_cq_event(std::ptr::null_mut(), &mut cq, &mut cqctx),
                -1
            );
            // The data-path ops programs reach through ctx->ops.
            let ops = context_ops();
            let mut wc = [ibv_wc::default(); 4];
            assert_eq!(
                (ops.poll_cq.unwrap())(std::ptr::null_mut(), 4, wc.as_mut_ptr()),
                -1
            );
            assert_eq!(
                (ops.req_notify_cq.unwrap())(std::ptr::null_mut(), 0),
                libc::EINVAL
            );
            let mut swr = ibv_send_wr::default();
            let mut bad = std::ptr::null_mut();
            assert_eq!(
                (ops.post_send.unwrap())(std::ptr::null_mut(), &mut swr, &mut bad),
                libc::EINVAL
            );
            let mut rwr = ibv_recv_wr::default();
            let mut rbad = std::ptr::null_mut();
            assert_eq!(
                (ops.post_recv.unwrap())(std::ptr::null_mut(), &mut rwr, &mut rbad),
                libc::EINVAL
            );
            vrdma_verbs_ibv_free_device_list(std::ptr::null_mut());
            vrdma_verbs_ibv_ack_cq_events(std::ptr::null_mut(), 1);
        }
    }

    #[test]
    fn unsupported_verbs_say_eopnotsupp() {
        assert!(vrdma_verbs_ibv_create_srq().is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
        assert!(vrdma_verbs_ibv_create_ah().is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
        assert!(vrdma_verbs_ibv_qp_to_qp_ex().is_null());
        assert_eq!(vrdma_verbs_ibv_attach_mcast(), libc::EOPNOTSUPP);
        assert_eq!(vrdma_verbs_ibv_rereg_mr(), -1);
        assert_eq!(vrdma_verbs_ibv_fork_init(), 0);
    }

    #[test]
    fn wc_status_strings_are_libibverbs_ones() {
        let s = |st| {
            // SAFETY: static NUL-terminated strings.
            unsafe { CStr::from_ptr(vrdma_verbs_ibv_wc_status_str(st)) }
                .to_str()
                .unwrap()
        };
        assert_eq!(s(IBV_WC_SUCCESS), "success");
        assert_eq!(s(IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error");
        assert_eq!(s(IBV_WC_REM_ACCESS_ERR), "remote access error");
        assert_eq!(s(9999), "unknown");
    }
}
