//! Protection domains and memory regions (application memory re-backed by `memory.rs`).

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::RwLock;

use verbs_abi::verbs::*;
use vrdma::AccessFlags;

use crate::device::Ctx;
use crate::errno::*;
use crate::memory;
use crate::objects::null_errno;
use crate::{fail, guard};

#[repr(C)]
pub(crate) struct Pd {
    pub pd: ibv_pd,
    pub vr: vrdma::ProtectionDomain,
    /// lkey → the region's first byte's address (local SGEs carry addresses, the WQE an
    /// offset into the region).
    pub lkeys: RwLock<HashMap<u32, u64>>,
}

impl Pd {
    /// # Safety
    /// `p` must be NULL or a live PD of this library.
    pub(crate) unsafe fn of<'a>(p: *mut ibv_pd) -> Option<&'a Pd> {
        // SAFETY: the caller's contract.
        (!p.is_null()).then(|| unsafe { &*p.cast::<Pd>() })
    }
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_alloc_pd(c: *mut ibv_context) -> *mut ibv_pd {
    guard(std::ptr::null_mut(), || {
        // SAFETY: C contract: a live context of ours or NULL.
        let Some(ctx) = (unsafe { Ctx::of(c) }) else {
            return null_errno(EINVAL);
        };
        match ctx.vr.alloc_pd() {
            Ok(vr) => {
                let pd = Box::new(Pd {
                    pd: ibv_pd {
                        context: c,
                        handle: vr.handle(),
                    },
                    vr,
                    lkeys: RwLock::new(HashMap::new()),
                });
                Box::into_raw(pd).cast()
            }
            Err(e) => null_errno(fail("ibv_alloc_pd", &e)),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_dealloc_pd(p: *mut ibv_pd) -> c_int {
    guard(EIO, || {
        if p.is_null() {
            return EINVAL;
        }
        // SAFETY: from ibv_alloc_pd, freed once.
        drop(unsafe { Box::from_raw(p.cast::<Pd>()) });
        0
    })
}

#[repr(C)]
pub(crate) struct Mr {
    pub mr: ibv_mr,
    raw: vrdma::RawMr,
    hold: Option<memory::Hold>,
}

fn access_of(access: c_int) -> Result<AccessFlags, i32> {
    let a = access as c_uint;
    // Optional bits (IBV_ACCESS_OPTIONAL_RANGE: 20..29) may be ignored, as their name says.
    let a = a & !(0x3ff << 20);
    let known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if a & !known != 0 {
        // Atomics, memory windows, zero-based, on-demand paging, hugetlb hints.
        return Err(EOPNOTSUPP);
    }
    if a & IBV_ACCESS_REMOTE_WRITE != 0 && a & IBV_ACCESS_LOCAL_WRITE == 0 {
        return Err(EINVAL);
    }
    let mut f = AccessFlags::LOCAL_READ;
    if a & IBV_ACCESS_LOCAL_WRITE != 0 {
        f = f | AccessFlags::LOCAL_WRITE;
    }
    if a & IBV_ACCESS_REMOTE_WRITE != 0 {
        f = f | AccessFlags::REMOTE_WRITE;
    }
    if a & IBV_ACCESS_REMOTE_READ != 0 {
        f = f | AccessFlags::REMOTE_READ;
    }
    Ok(f)
}

fn reg_mr(p: *mut ibv_pd, addr: *mut c_void, len: usize, iova: u64, access: c_int) -> *mut ibv_mr {
    // SAFETY: C contract: a live PD of ours or NULL.
    let Some(pd) = (unsafe { Pd::of(p) }) else {
        return null_errno(EINVAL);
    };
    if addr.is_null() || len == 0 || len > (1 << 40) {
        // Includes the implicit on-demand region (NULL, SIZE_MAX).
        return null_errno(EINVAL);
    }
    let access = match access_of(access) {
        Ok(a) => a,
        Err(e) => return null_errno(e),
    };
    // SAFETY: the PD's context is live while the PD is.
    let ctx = unsafe { Ctx::of(pd.pd.context) }.expect("a PD has a context");
    let (grefs, hold) = match memory::acquire(
        ctx.vr.platform(),
        ctx.vr.backend_domid(),
        addr as usize,
        len,
    ) {
        Ok(v) => v,
        Err(e) => return null_errno(e),
    };
    let offset = (addr as usize % xen_platform::PAGE_SIZE) as u32;
    match pd.vr.reg_grants(&grefs, offset, len as u64, iova, access) {
        Ok(raw) => {
            pd.lkeys
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(raw.lkey, addr as u64);
            let mr = Box::new(Mr {
                mr: ibv_mr {
                    context: pd.pd.context,
                    pd: p,
                    addr,
                    length: len,
                    handle: raw.handle,
                    lkey: raw.lkey,
                    rkey: raw.rkey,
                },
                raw,
                hold: Some(hold),
            });
            Box::into_raw(mr).cast()
        }
        Err(e) => {
            memory::release(hold);
            null_errno(fail("ibv_reg_mr", &e))
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        reg_mr(pd, addr, len, addr as u64, access)
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || reg_mr(pd, addr, len, iova, access))
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        reg_mr(pd, addr, len, iova, access as c_int)
    })
}

/// Deregisters at once: the backend's keys are gone when this returns (no cache), then the
/// pages go back to private memory if no other region uses them.
#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_dereg_mr(m: *mut ibv_mr) -> c_int {
    guard(EIO, || {
        if m.is_null() {
            return EINVAL;
        }
        // SAFETY: from ibv_reg_mr, not yet deregistered.
        let mr = unsafe { &mut *m.cast::<Mr>() };
        // SAFETY: a region's PD outlives it (the program deallocates PDs after their MRs).
        let Some(pd) = (unsafe { Pd::of(mr.mr.pd) }) else {
            return EINVAL;
        };
        if let Err(e) = pd.vr.dereg_raw(mr.raw) {
            // The keys may still be live: keep the pages granted and the region.
            return fail("ibv_dereg_mr", &e);
        }
        pd.lkeys
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&mr.raw.lkey);
        if let Some(h) = mr.hold.take() {
            memory::release(h);
        }
        // SAFETY: from Box::into_raw in reg_mr.
        drop(unsafe { Box::from_raw(m.cast::<Mr>()) });
        0
    })
}
