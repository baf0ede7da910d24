//! Loading `libibverbs.so.1` at run time and resolving the exported verbs the device calls.
//!
//! Nothing here links against rdma-core: the default build and the demo run on hosts without
//! it, and only `vrdma-backend --device verbs:…` (or the probe) loads the library. The
//! function pointers are copied out of the library once; [`VerbsLib`] keeps the library
//! mapped for as long as any clone of it, or any object made through it, is alive.
//!
//! The four data-path verbs (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`,
//! `ibv_req_notify_cq`) are static inlines in verbs.h, not exported symbols: they call
//! through `context->ops` of the object, which [`post_send_raw`] and friends do the same way.

use std::ffi::{c_char, c_int, c_uint, c_void, OsStr, OsString};
use std::path::Path;
use std::sync::Arc;

use verbs_abi::verbs::{
    ibv_async_event, ibv_comp_channel, ibv_context, ibv_cq, ibv_device, ibv_device_attr, ibv_gid,
    ibv_gid_entry, ibv_mr, ibv_pd, ibv_port_attr, ibv_qp, ibv_qp_attr, ibv_qp_init_attr,
    ibv_recv_wr, ibv_send_wr, ibv_wc,
};

use super::VerbsError;

/// The soname the loader opens (the runtime package `libibverbs1`).
pub const LIBIBVERBS_SONAME: &str = "libibverbs.so.1";
/// Environment variable that overrides the library path (tests, unusual installations).
pub const LIBIBVERBS_ENV: &str = "VRDMA_LIBIBVERBS";

/// The exported libibverbs functions the device uses, as C function pointers.
///
/// `ibv_query_port` is the exported symbol, not verbs.h's macro of the same name: the macro
/// calls the provider's extended `query_port` when the context has one and falls back to
/// this symbol, which fills the older, shorter `struct _compat_ibv_port_attr` (everything of
/// [`ibv_port_attr`] up to `link_layer`; `flags` and `port_cap_flags2` stay as the caller
/// zeroed them).
#[derive(Clone, Copy)]
pub(crate) struct Fns {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub reg_mr_iova2:
        unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr,
    pub dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub create_comp_channel: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_comp_channel,
        c_int,
    ) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub get_cq_event:
        unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
    pub ack_cq_events: unsafe extern "C" fn(*mut ibv_cq, c_uint),
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub query_qp:
        unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub get_async_event: unsafe extern "C" fn(*mut ibv_context, *mut ibv_async_event) -> c_int,
    pub ack_async_event: unsafe extern "C" fn(*mut ibv_async_event),
    pub wc_status_str: unsafe extern "C" fn(c_uint) -> *const c_char,
    /// `_ibv_query_gid_ex` (what verbs.h's inline `ibv_query_gid_ex` calls; rdma-core 32
    /// and later): `None` when the library lacks it (the GID type is then read from sysfs).
    pub query_gid_ex: Option<QueryGidExFn>,
}

/// `int _ibv_query_gid_ex(struct ibv_context *, uint32_t port_num, uint32_t gid_index,
/// struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)`: 0 or an errno value.
pub(crate) type QueryGidExFn =
    unsafe extern "C" fn(*mut ibv_context, u32, u32, *mut ibv_gid_entry, u32, usize) -> c_int;

struct LibInner {
    fns: Fns,
    path: OsString,
    // Dropped last (field order): the function pointers above point into it (`None`: the
    // unit tests' fake, whose functions are this binary's).
    _lib: Option<libloading::Library>,
}

/// libibverbs, loaded. Cheap to clone; every verbs object holds a clone, so the library stays
/// mapped until the last object is destroyed.
#[derive(Clone)]
pub struct VerbsLib {
    inner: Arc<LibInner>,
}

impl std::fmt::Debug for VerbsLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsLib")
            .field("path", &self.inner.path)
            .finish()
    }
}

impl VerbsLib {
    /// Loads `$VRDMA_LIBIBVERBS` if set, else `libibverbs.so.1` from the loader's path.
    pub fn open() -> Result<VerbsLib, VerbsError> {
        match std::env::var_os(LIBIBVERBS_ENV) {
            Some(p) if !p.is_empty() => VerbsLib::open_path(p),
            _ => VerbsLib::open_path(LIBIBVERBS_SONAME),
        }
    }

    /// Loads the library at `path` (a soname or a file path) and resolves every function.
    pub fn open_path(path: impl AsRef<OsStr>) -> Result<VerbsLib, VerbsError> {
        let path = path.as_ref().to_owned();
        let shown = Path::new(&path).display().to_string();
        // SAFETY: loading runs the library's initialisers. libibverbs' constructors only set
        // up its own state (no thread-unsafe global changes the rest of the process relies
        // on); RTLD_NOW resolves everything up front so a broken install fails here.
        let lib = unsafe {
            libloading::os::unix::Library::open(
                Some(&path),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL,
            )
        }
        .map_err(|e| VerbsError::LibraryMissing {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        let lib: libloading::Library = lib.into();
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the symbol is looked up by its C name and given the C signature
                // verbs.h declares for it (checked field by field in `Fns`' type, the
                // structures by verbs-abi's layout test); the pointer is used only while
                // `_lib` keeps the library mapped.
                let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| {
                    VerbsError::Symbol {
                        path: shown.clone(),
                        symbol: $name,
                        reason: e.to_string(),
                    }
                })?;
                *s
            }};
        }
        let fns = Fns {
            get_device_list: sym!("ibv_get_device_list"),
            free_device_list: sym!("ibv_free_device_list"),
            open_device: sym!("ibv_open_device"),
            close_device: sym!("ibv_close_device"),
            query_device: sym!("ibv_query_device"),
            query_port: sym!("ibv_query_port"),
            query_gid: sym!("ibv_query_gid"),
            alloc_pd: sym!("ibv_alloc_pd"),
            dealloc_pd: sym!("ibv_dealloc_pd"),
            reg_mr: sym!("ibv_reg_mr"),
            reg_mr_iova2: sym!("ibv_reg_mr_iova2"),
            dereg_mr: sym!("ibv_dereg_mr"),
            create_comp_channel: sym!("ibv_create_comp_channel"),
            destroy_comp_channel: sym!("ibv_destroy_comp_channel"),
            create_cq: sym!("ibv_create_cq"),
            destroy_cq: sym!("ibv_destroy_cq"),
            get_cq_event: sym!("ibv_get_cq_event"),
            ack_cq_events: sym!("ibv_ack_cq_events"),
            create_qp: sym!("ibv_create_qp"),
            modify_qp: sym!("ibv_modify_qp"),
            query_qp: sym!("ibv_query_qp"),
            destroy_qp: sym!("ibv_destroy_qp"),
            get_async_event: sym!("ibv_get_async_event"),
            ack_async_event: sym!("ibv_ack_async_event"),
            wc_status_str: sym!("ibv_wc_status_str"),
            // SAFETY: as in `sym!`: the C signature of verbs.h's declaration.
            query_gid_ex: unsafe { lib.get::<QueryGidExFn>(b"_ibv_query_gid_ex\0") }
                .ok()
                .map(|s| *s),
        };
        Ok(VerbsLib {
            inner: Arc::new(LibInner {
                fns,
                path,
                _lib: Some(lib),
            }),
        })
    }

    /// A library whose verbs are `fns` (the unit tests' fake layer, `super::fake`).
    #[cfg(test)]
    pub(crate) fn fake(fns: Fns) -> VerbsLib {
        VerbsLib {
            inner: Arc::new(LibInner {
                fns,
                path: "fake libibverbs".into(),
                _lib: None,
            }),
        }
    }

    pub(crate) fn fns(&self) -> &Fns {
        &self.inner.fns
    }

    /// The path or soname the library was loaded from.
    pub fn path(&self) -> &OsStr {
        &self.inner.path
    }

    /// `ibv_wc_status_str`: libibverbs' name of a completion status.
    pub fn wc_status_str(&self, status: u32) -> String {
        // SAFETY: ibv_wc_status_str accepts any value and returns a static NUL-terminated
        // string ("unknown" for values it does not know).
        let p = unsafe { (self.fns().wc_status_str)(status) };
        if p.is_null() {
            return format!("status {status}");
        }
        // SAFETY: non-null, NUL-terminated, static (see above).
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }
}

/// `errno` after a libibverbs call that returned NULL or -1.
pub(crate) fn last_errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// The error of a libibverbs call that returns an int: rdma-core returns the errno value
/// itself (positive) from most verbs, and -1 with `errno` set from a few.
pub(crate) fn rc_error(rc: c_int) -> std::io::Error {
    if rc > 0 {
        std::io::Error::from_raw_os_error(rc)
    } else {
        let e = last_errno();
        if e.raw_os_error().unwrap_or(0) == 0 {
            std::io::Error::from_raw_os_error(-rc)
        } else {
            e
        }
    }
}

/// `ibv_poll_cq` as verbs.h's static inline does it: `cq->context->ops.poll_cq(cq, n, wc)`.
/// Returns the number of completions written to `wc`, or the provider's error.
///
/// # Safety
/// `cq` is a live CQ of a live context whose `ops` the provider filled.
pub(crate) unsafe fn poll_cq_raw(cq: *mut ibv_cq, wc: &mut [ibv_wc]) -> Result<usize, VerbsError> {
    let n = c_int::try_from(wc.len()).unwrap_or(c_int::MAX);
    // SAFETY: the caller guarantees `cq` and its context are live; the ops table is plain data.
    let op = unsafe { (*(*cq).context).ops.poll_cq }.ok_or(VerbsError::MissingOp("poll_cq"))?;
    // SAFETY: the provider's poll_cq writes at most `n` entries into `wc`, which has `n`.
    let rc = unsafe { op(cq, n, wc.as_mut_ptr()) };
    if rc < 0 {
        return Err(VerbsError::PollFailed(rc));
    }
    Ok((rc as usize).min(wc.len()))
}

/// `ibv_req_notify_cq` through `cq->context->ops.req_notify_cq`.
///
/// # Safety
/// As [`poll_cq_raw`].
pub(crate) unsafe fn req_notify_cq_raw(
    cq: *mut ibv_cq,
    solicited_only: bool,
) -> Result<(), VerbsError> {
    // SAFETY: the caller guarantees `cq` and its context are live.
    let op = unsafe { (*(*cq).context).ops.req_notify_cq }
        .ok_or(VerbsError::MissingOp("req_notify_cq"))?;
    // SAFETY: a live CQ; the flag is a plain int.
    let rc = unsafe { op(cq, c_int::from(solicited_only)) };
    if rc != 0 {
        return Err(VerbsError::Call {
            op: "ibv_req_notify_cq",
            cause: rc_error(rc),
        });
    }
    Ok(())
}

/// `ibv_post_send` through `qp->context->ops.post_send`. On error, the index of the first
/// work request not posted (`bad_wr`) is returned with the error.
///
/// # Safety
/// `qp` is a live QP of a live context; `wr` heads a valid NULL-terminated chain whose
/// `sg_list`s point at `num_sge` valid entries, all valid for the duration of the call.
pub(crate) unsafe fn post_send_raw(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
) -> Result<(), (usize, VerbsError)> {
    // SAFETY: the caller guarantees `qp` and its context are live.
    let op =
        unsafe { (*(*qp).context).ops.post_send }.ok_or((0, VerbsError::MissingOp("post_send")))?;
    let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
    // SAFETY: valid QP and WR chain (caller); `bad` is a valid out-pointer.
    let rc = unsafe { op(qp, wr, &mut bad) };
    if rc != 0 {
        let next = |w: *mut ibv_send_wr| {
            // SAFETY: `w` is a non-null element of the caller's valid chain.
            unsafe { (*w).next }
        };
        // SAFETY: the chain is valid (caller), so walking it until `bad` reads live WRs.
        let index = unsafe { chain_index(wr, bad, next) };
        return Err((
            index,
            VerbsError::Call {
                op: "ibv_post_send",
                cause: rc_error(rc),
            },
        ));
    }
    Ok(())
}

/// `ibv_post_recv` through `qp->context->ops.post_recv`.
///
/// # Safety
/// As [`post_send_raw`], for a receive chain.
pub(crate) unsafe fn post_recv_raw(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
) -> Result<(), (usize, VerbsError)> {
    // SAFETY: the caller guarantees `qp` and its context are live.
    let op =
        unsafe { (*(*qp).context).ops.post_recv }.ok_or((0, VerbsError::MissingOp("post_recv")))?;
    let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
    // SAFETY: valid QP and WR chain (caller); `bad` is a valid out-pointer.
    let rc = unsafe { op(qp, wr, &mut bad) };
    if rc != 0 {
        let next = |w: *mut ibv_recv_wr| {
            // SAFETY: `w` is a non-null element of the caller's valid chain.
            unsafe { (*w).next }
        };
        // SAFETY: the chain is valid (caller), so walking it until `bad` reads live WRs.
        let index = unsafe { chain_index(wr, bad, next) };
        return Err((
            index,
            VerbsError::Call {
                op: "ibv_post_recv",
                cause: rc_error(rc),
            },
        ));
    }
    Ok(())
}

/// Position of `bad` in the chain starting at `head` (0 if not found).
///
/// # Safety
/// Every element reachable from `head` through `next` is readable.
unsafe fn chain_index<T>(head: *mut T, bad: *mut T, next: impl Fn(*mut T) -> *mut T) -> usize {
    let mut i = 0;
    let mut w = head;
    while !w.is_null() && i < 1 << 20 {
        if w == bad {
            return i;
        }
        w = next(w);
        i += 1;
    }
    0
}
