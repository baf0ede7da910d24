//! The rest of libibverbs' API: status strings, fork support, and what this device does not
//! support (UD address handles, SRQs, multicast, imports, ECE, dmabuf and device memory, the
//! `ibv_wr_*` API): NULL or an error with `EOPNOTSUPP`, never a crash.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use verbs_abi::verbs::*;

use crate::errno::*;
use crate::set_errno;

static FORK_INIT: AtomicBool = AtomicBool::new(false);

#[no_mangle]
pub extern "C" fn vrdma_verbs_ibv_wc_status_str(status: ibv_wc_status) -> *const c_char {
    let s: &'static [u8] = match status {
        IBV_WC_SUCCESS => b"success\0",
        IBV_WC_LOC_LEN_ERR => b"local length error\0",
        IBV_WC_LOC_QP_OP_ERR => b"local QP operation error\0",
        IBV_WC_LOC_EEC_OP_ERR => b"local EE context operation error\0",
        IBV_WC_LOC_PROT_ERR => b"local protection error\0",
        IBV_WC_WR_FLUSH_ERR => b"Work Request Flushed Error\0",
        IBV_WC_MW_BIND_ERR => b"memory management operation error\0",
        IBV_WC_BAD_RESP_ERR => b"bad response error\0",
        IBV_WC_LOC_ACCESS_ERR => b"local access error\0",
        IBV_WC_REM_INV_REQ_ERR => b"remote invalid request error\0",
        IBV_WC_REM_ACCESS_ERR => b"remote access error\0",
        IBV_WC_REM_OP_ERR => b"remote operation error\0",
        IBV_WC_RETRY_EXC_ERR => b"transport retry counter exceeded\0",
        IBV_WC_RNR_RETRY_EXC_ERR => b"RNR retry counter exceeded\0",
        IBV_WC_LOC_RDD_VIOL_ERR => b"local RDD violation error\0",
        IBV_WC_REM_INV_RD_REQ_ERR => b"remote invalid RD request\0",
        IBV_WC_REM_ABORT_ERR => b"aborted error\0",
        IBV_WC_INV_EECN_ERR => b"invalid EE context number\0",
        IBV_WC_INV_EEC_STATE_ERR => b"invalid EE context state\0",
        IBV_WC_FATAL_ERR => b"fatal error\0",
        IBV_WC_RESP_TIMEOUT_ERR => b"response timeout error\0",
        IBV_WC_GENERAL_ERR => b"general error\0",
        IBV_WC_TM_ERR => b"TM error\0",
        IBV_WC_TM_RNDV_INCOMPLETE => b"TM software rendezvous\0",
        _ => b"unknown\0",
    };
    s.as_ptr().cast()
}

/// Registered memory is re-backed with shared pages, which a child shares after `fork`
/// (docs/verbs.md): nothing to prepare, the call succeeds.
#[no_mangle]
pub extern "C" fn vrdma_verbs_ibv_fork_init() -> c_int {
    FORK_INIT.store(true, Ordering::Relaxed);
    0
}

/// `enum ibv_fork_status`: DISABLED 0, ENABLED 1.
#[no_mangle]
pub extern "C" fn vrdma_verbs_ibv_is_fork_initialized() -> c_int {
    c_int::from(FORK_INIT.load(Ordering::Relaxed))
}

#[no_mangle]
pub extern "C" fn vrdma_verbs_ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn vrdma_verbs_ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

fn null_unsupported() -> *mut c_void {
    set_errno(EOPNOTSUPP);
    std::ptr::null_mut()
}

/// Entry points returning a pointer: NULL, errno EOPNOTSUPP. The arguments are not read.
macro_rules! unsupported_ptr {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> *mut c_void {
            null_unsupported()
        }
    )*};
}

/// Entry points returning an errno-style int: EOPNOTSUPP. The arguments are not read.
macro_rules! unsupported_int {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            set_errno(EOPNOTSUPP);
            EOPNOTSUPP
        }
    )*};
}

/// Entry points returning nothing.
macro_rules! unsupported_void {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() {}
    )*};
}

// A C caller passing arguments to a function declared without parameters is fine on x86_64
// (the System V ABI: the callee ignores registers it does not read).
unsupported_ptr!(
    vrdma_verbs_ibv_create_ah,
    vrdma_verbs_ibv_create_ah_from_wc,
    vrdma_verbs_ibv_create_srq,
    vrdma_verbs_ibv_import_device,
    vrdma_verbs_ibv_import_mr,
    vrdma_verbs_ibv_import_pd,
    vrdma_verbs_ibv_import_dm,
    vrdma_verbs_ibv_reg_dmabuf_mr,
    vrdma_verbs_ibv_qp_to_qp_ex,
);

unsupported_int!(
    vrdma_verbs_ibv_attach_mcast,
    vrdma_verbs_ibv_detach_mcast,
    vrdma_verbs_ibv_destroy_ah,
    vrdma_verbs_ibv_destroy_srq,
    vrdma_verbs_ibv_modify_srq,
    vrdma_verbs_ibv_query_srq,
    vrdma_verbs_ibv_resize_cq,
    vrdma_verbs_ibv_init_ah_from_wc,
    vrdma_verbs_ibv_query_ece,
    vrdma_verbs_ibv_set_ece,
    vrdma_verbs_ibv_resolve_eth_l2_from_gid,
);

unsupported_void!(
    vrdma_verbs_ibv_unimport_mr,
    vrdma_verbs_ibv_unimport_pd,
    vrdma_verbs_ibv_unimport_dm,
);

/// `ibv_rereg_mr` returns `IBV_REREG_MR_ERR_INPUT` (-1, the old region stays valid) with errno.
#[no_mangle]
pub extern "C" fn vrdma_verbs_ibv_rereg_mr() -> c_int {
    set_errno(EOPNOTSUPP);
    -1
}

/// `ibv_query_qp_data_in_order`: 0 (no in-order guarantee is claimed).
#[no_mangle]
pub extern "C" fn vrdma_verbs_ibv_query_qp_data_in_order() -> c_int {
    0
}
