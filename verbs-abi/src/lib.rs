//! The C ABI of rdma-core 44 as Debian 12 ships it (`libibverbs-dev`, `librdmacm-dev`):
//! `#[repr(C)]` types and constants for the dom0 verbs device (`vrdma-backend`'s
//! `device::verbs`) and the guest's libibverbs-compatible library.
//!
//! Names are the C names (so the headers can be read side by side). Facts come from
//! `/usr/include/infiniband/verbs.h` and `/usr/include/rdma/rdma_cma.h`; every size, field
//! offset and constant listed in [`layout_table`] is compared with what a C program compiled
//! against those headers prints (`tests/layout.rs`, `tests/abi/verbs_abi.c`).
//!
//! Layouts are those of x86_64 Linux (glibc's `pthread_mutex_t`/`pthread_cond_t` sizes are
//! embedded in `ibv_context`, `ibv_cq`, `ibv_qp`); the crate refuses to build elsewhere.
#![allow(non_camel_case_types)]

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
compile_error!("verbs-abi describes the x86_64 Linux ABI of rdma-core only");

pub mod cma;
mod layout;
pub mod verbs;

pub use layout::layout_table;
