//! Verbs objects over `vrdma` objects — PD and MR (`mr.rs`), completion channel and CQ
//! (`cq.rs`), QP (`qp.rs`) — and the data-path ops of `ibv_context::ops` (post_send,
//! post_recv, poll_cq, req_notify_cq).
//!
//! Each object is a `#[repr(C)]` struct whose first field is the libibverbs struct the program
//! sees (`ibv_pd`, `ibv_mr`, …), so the program's pointer is the object's pointer.

use verbs_abi::verbs::ibv_context_ops;

pub(crate) use crate::cq::Watch;
use crate::set_errno;

/// The ops table every context carries.
pub(crate) fn context_ops() -> ibv_context_ops {
    // SAFETY: all-zero is a table of NULL ops.
    let mut ops: ibv_context_ops = unsafe { std::mem::zeroed() };
    ops.poll_cq = Some(crate::cq::poll_cq);
    ops.req_notify_cq = Some(crate::cq::req_notify_cq);
    ops.post_send = Some(crate::qp::post_send);
    ops.post_recv = Some(crate::qp::post_recv);
    ops
}

pub(crate) fn null_errno<T>(e: i32) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}
