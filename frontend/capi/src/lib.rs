//! `libvrdma`: the C ABI of the vrdma frontend library. The header is `include/vrdma.h`
//! (hand-written; `tests/header_sync.rs` checks it against this library's exports and the
//! prototypes), the pkg-config template `vrdma.pc.in`.
//!
//! Conventions: opaque handles (`Box`ed Rust objects, freed by their `vrdma_*_destroy`/`free`/
//! `close` function, in any order: every object keeps what it needs alive); functions return
//! `0` (or a count) on success and a negative errno on failure, with a sentence for
//! `vrdma_last_error()` (thread-local); no Rust panic crosses the boundary (`catch_unwind`,
//! reported as `-EIO`). Calls on one handle from several threads are serialized by a mutex in
//! the handle.

#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use vrdma_rs::{
    AccessFlags, CompletionQueue, Context, Error, MemoryRegion, Mode, MrSlice, ProtectionDomain,
    QpEndpoint, QueuePair, RemoteMr, Status, WorkCompletion,
};

mod errno {
    pub const EPERM: i32 = 1;
    pub const EIO: i32 = 5;
    pub const EAGAIN: i32 = 11;
    pub const ENOMEM: i32 = 12;
    pub const EBUSY: i32 = 16;
    pub const ENODEV: i32 = 19;
    pub const EINVAL: i32 = 22;
    pub const ERANGE: i32 = 34;
    pub const EPROTO: i32 = 71;
    pub const EOPNOTSUPP: i32 = 95;
    pub const EADDRINUSE: i32 = 98;
    pub const ECONNRESET: i32 = 104;
    pub const ENOTCONN: i32 = 107;
    pub const ETIMEDOUT: i32 = 110;
    pub const ECONNREFUSED: i32 = 111;
    pub const EHOSTUNREACH: i32 = 113;
    pub const EDQUOT: i32 = 122;
}

/// `vrdma_open` mode: from `$VRDMA_MODE`, default bypass.
pub const VRDMA_MODE_DEFAULT: c_int = 0;
pub const VRDMA_MODE_BYPASS: c_int = 1;
pub const VRDMA_MODE_MEDIATED: c_int = 2;

/// Access flags of `vrdma_alloc_mr`.
pub const VRDMA_ACCESS_LOCAL_WRITE: u32 = 1;
pub const VRDMA_ACCESS_REMOTE_WRITE: u32 = 2;
pub const VRDMA_ACCESS_REMOTE_READ: u32 = 4;

/// A work completion (`struct vrdma_wc`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct vrdma_wc {
    pub wr_id: u64,
    /// `VRDMA_WC_SUCCESS` (0) or an error status.
    pub status: u32,
    /// `VRDMA_WC_SEND`, ...
    pub opcode: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub vendor_err: u32,
    pub has_imm: u8,
    pub solicited: u8,
    pub reserved: [u8; 6],
}

/// A peer's memory region (`struct vrdma_remote_mr`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct vrdma_remote_mr {
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
    pub reserved: u32,
}

/// Where a QP is reached (`struct vrdma_endpoint`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct vrdma_endpoint {
    pub addr: [u8; 16],
    pub qp_num: u32,
    pub reserved: u32,
}

/// Opaque handles.
pub struct vrdma_context(Context);
pub struct vrdma_pd(ProtectionDomain);
pub struct vrdma_mr(MemoryRegion);
pub struct vrdma_cq(Mutex<CompletionQueue>);
pub struct vrdma_qp(Mutex<QueuePair>);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// A failure: errno and sentence.
struct Fail(i32, String);

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        let code = match &e {
            Error::XenStore(_) => errno::EIO,
            Error::Platform(p) => p.raw_os_error().unwrap_or(errno::EIO),
            Error::NoDevice { .. } => errno::ENODEV,
            Error::BadDevice { .. } | Error::Protocol(_) => errno::EPROTO,
            Error::Timeout { .. } => errno::ETIMEDOUT,
            Error::ChannelRefused { .. } => errno::ECONNREFUSED,
            Error::Backend { status, .. } => match status {
                Status::QuotaExceeded => errno::EDQUOT,
                Status::NoResources => errno::ENOMEM,
                Status::InvalidArgument | Status::BadRequest => errno::EINVAL,
                Status::Busy => errno::EBUSY,
                Status::NotSupported => errno::EOPNOTSUPP,
                Status::ConnectionRefused => errno::ECONNREFUSED,
                Status::DeviceLost => errno::ENOTCONN,
                Status::NotPermitted => errno::EPERM,
                Status::AddressInUse => errno::EADDRINUSE,
                _ => errno::EIO,
            },
            Error::DeviceLost(_) => errno::ENOTCONN,
            Error::QueueFull { .. } => errno::EAGAIN,
            Error::InvalidArgument(_) => errno::EINVAL,
            Error::ConnectRejected { .. } => errno::ECONNREFUSED,
            Error::Unreachable { .. } => errno::EHOSTUNREACH,
            Error::ConnectionLost { .. } => errno::ECONNRESET,
        };
        Fail(code, e.to_string())
    }
}

fn invalid(what: &str) -> Fail {
    Fail(errno::EINVAL, format!("invalid argument: {what}"))
}

/// Runs `f`, turning errors and panics into a negative errno with a message.
fn guard(f: impl FnOnce() -> Result<c_int, Fail>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(n)) => n,
        Ok(Err(Fail(code, msg))) => {
            set_error(&msg);
            -code
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            set_error(&format!("internal error in libvrdma (panic): {what}"));
            -errno::EIO
        }
    }
}

/// Runs a destructor without letting a panic out.
fn guard_void(f: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(f));
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Borrows a handle, or fails with `EINVAL` if it is null.
///
/// # Safety
/// `p` is null or a live handle returned by this library and not yet destroyed.
unsafe fn handle<'a, T>(p: *const T, what: &str) -> Result<&'a T, Fail> {
    // SAFETY: the caller promises `p` is null or a live handle we created with Box::into_raw.
    unsafe { p.as_ref() }.ok_or_else(|| invalid(&format!("{what} is NULL")))
}

/// Stores a new handle in `*out`.
///
/// # Safety
/// `out` is null or valid for a pointer write.
unsafe fn put<T>(out: *mut *mut T, v: T) -> Result<c_int, Fail> {
    if out.is_null() {
        return Err(invalid("out is NULL"));
    }
    // SAFETY: `out` is non-null and the caller promises it is valid for writes.
    unsafe { out.write(Box::into_raw(Box::new(v))) };
    Ok(0)
}

/// Frees a handle made by [`put`].
///
/// # Safety
/// `p` is null or a live handle from [`put`], not used afterwards.
unsafe fn free<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: created by Box::into_raw in `put`; the caller gives up the handle.
        guard_void(|| drop(unsafe { Box::from_raw(p) }));
    }
}

/// Writes `v` to the caller's `*out`.
///
/// # Safety
/// `out` is null or valid for a write.
unsafe fn write_out<T>(out: *mut T, v: T) -> Result<c_int, Fail> {
    // SAFETY: the caller's promise on `out`.
    let o = unsafe { out.as_mut() }.ok_or_else(|| invalid("out is NULL"))?;
    *o = v;
    Ok(0)
}

/// Whether the caller's `len`-byte buffer `p` (`what` names it) has bytes to touch: false
/// when `len` is 0, an error when `p` is NULL.
fn nonempty<T>(p: *const T, len: usize, what: &str) -> Result<bool, Fail> {
    if len == 0 {
        return Ok(false);
    }
    if p.is_null() {
        return Err(invalid(&format!("{what} is NULL")));
    }
    Ok(true)
}

impl From<RemoteMr> for vrdma_remote_mr {
    fn from(r: RemoteMr) -> Self {
        vrdma_remote_mr {
            addr: r.addr,
            len: r.len,
            rkey: r.rkey,
            reserved: 0,
        }
    }
}

impl From<&vrdma_remote_mr> for RemoteMr {
    fn from(r: &vrdma_remote_mr) -> Self {
        RemoteMr {
            addr: r.addr,
            len: r.len,
            rkey: r.rkey,
        }
    }
}

impl From<QpEndpoint> for vrdma_endpoint {
    fn from(e: QpEndpoint) -> Self {
        vrdma_endpoint {
            addr: e.addr,
            qp_num: e.qp_num,
            reserved: 0,
        }
    }
}

impl From<&vrdma_endpoint> for QpEndpoint {
    fn from(e: &vrdma_endpoint) -> Self {
        QpEndpoint {
            addr: e.addr,
            qp_num: e.qp_num,
        }
    }
}

/// The message of the last failed call on this thread ("" if none). Valid until the next
/// failing call on this thread.
#[no_mangle]
pub extern "C" fn vrdma_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Opens vrdma device `devid` of this domain with `mode` (`VRDMA_MODE_*`).
///
/// # Safety
/// `out` is valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn vrdma_open(
    out: *mut *mut vrdma_context,
    devid: u32,
    mode: c_int,
) -> c_int {
    guard(|| {
        let mut b = Context::builder().devid(devid);
        match mode {
            VRDMA_MODE_DEFAULT => {}
            VRDMA_MODE_BYPASS => b = b.mode(Mode::Bypass),
            VRDMA_MODE_MEDIATED => b = b.mode(Mode::Mediated),
            m => return Err(invalid(&format!("mode {m}"))),
        }
        let ctx = b.open()?;
        // SAFETY: the caller's promise on `out`.
        unsafe { put(out, vrdma_context(ctx)) }
    })
}

/// Closes a context handle (the channel closes when its last object is gone).
///
/// # Safety
/// `ctx` is null or a live context handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn vrdma_close(ctx: *mut vrdma_context) {
    // SAFETY: the caller's promise.
    unsafe { free(ctx) }
}

/// This domain's id, or a negative errno.
///
/// # Safety
/// `ctx` is null or a live context handle.
#[no_mangle]
pub unsafe extern "C" fn vrdma_domid(ctx: *const vrdma_context) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let c = unsafe { handle(ctx, "ctx") }?;
        Ok(c_int::from(c.0.domid().0))
    })
}

/// `VRDMA_MODE_BYPASS` or `VRDMA_MODE_MEDIATED`, or a negative errno.
///
/// # Safety
/// `ctx` is null or a live context handle.
#[no_mangle]
pub unsafe extern "C" fn vrdma_mode(ctx: *const vrdma_context) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let c = unsafe { handle(ctx, "ctx") }?;
        Ok(match c.0.mode() {
            Mode::Bypass => VRDMA_MODE_BYPASS,
            Mode::Mediated => VRDMA_MODE_MEDIATED,
        })
    })
}

/// Allocates a protection domain.
///
/// # Safety
/// `ctx` is null or a live context handle; `out` is valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn vrdma_alloc_pd(ctx: *mut vrdma_context, out: *mut *mut vrdma_pd) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let c = unsafe { handle(ctx, "ctx") }?;
        let pd = c.0.alloc_pd()?;
        // SAFETY: the caller's promise on `out`.
        unsafe { put(out, vrdma_pd(pd)) }
    })
}

/// Frees a protection domain handle.
///
/// # Safety
/// `pd` is null or a live PD handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn vrdma_dealloc_pd(pd: *mut vrdma_pd) {
    // SAFETY: the caller's promise.
    unsafe { free(pd) }
}

fn access_flags(bits: u32) -> Result<AccessFlags, Fail> {
    let all = VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_REMOTE_WRITE | VRDMA_ACCESS_REMOTE_READ;
    if bits & !all != 0 {
        return Err(invalid(&format!("access flags {bits:#x}")));
    }
    let mut a = AccessFlags::LOCAL_READ;
    if bits & VRDMA_ACCESS_LOCAL_WRITE != 0 {
        a = a | AccessFlags::LOCAL_WRITE;
    }
    if bits & VRDMA_ACCESS_REMOTE_WRITE != 0 {
        a = a | AccessFlags::REMOTE_WRITE;
    }
    if bits & VRDMA_ACCESS_REMOTE_READ != 0 {
        a = a | AccessFlags::REMOTE_READ;
    }
    Ok(a)
}

/// Allocates and registers `len` bytes of grant-backed memory with `access`
/// (`VRDMA_ACCESS_*`).
///
/// # Safety
/// `pd` is null or a live PD handle; `out` is valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn vrdma_alloc_mr(
    pd: *mut vrdma_pd,
    len: usize,
    access: u32,
    out: *mut *mut vrdma_mr,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let p = unsafe { handle(pd, "pd") }?;
        let mr = p.0.alloc_mr(len, access_flags(access)?)?;
        // SAFETY: the caller's promise on `out`.
        unsafe { put(out, vrdma_mr(mr)) }
    })
}

/// Frees a memory region handle (the region goes back to its PD's registration cache).
///
/// # Safety
/// `mr` is null or a live MR handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn vrdma_free_mr(mr: *mut vrdma_mr) {
    // SAFETY: the caller's promise.
    unsafe { free(mr) }
}

/// The body of a copy between region `mr` and the caller's `len` bytes at `p` (`what`
/// names them): nothing to do for 0 bytes, else `copy`.
///
/// # Safety
/// `mr` is null or a live MR handle.
unsafe fn mr_copy<T>(
    mr: *const vrdma_mr,
    p: *const T,
    len: usize,
    what: &str,
    copy: impl FnOnce(&MemoryRegion) -> vrdma_rs::Result<()>,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let m = unsafe { handle(mr, "mr") }?;
        if nonempty(p, len, what)? {
            copy(&m.0)?;
        }
        Ok(0)
    })
}

/// Copies `len` bytes from `data` into the region at `offset`.
///
/// # Safety
/// `mr` is null or a live MR handle; `data` is valid for `len` bytes of reads.
#[no_mangle]
pub unsafe extern "C" fn vrdma_mr_write(
    mr: *mut vrdma_mr,
    offset: usize,
    data: *const c_void,
    len: usize,
) -> c_int {
    let copy = |m: &MemoryRegion| {
        // SAFETY: the caller promises `data` is valid for `len` bytes; it is private memory
        // of the caller, not the shared region (which is only touched through `write`).
        let src = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
        m.write(offset, src)
    };
    // SAFETY: the caller's promise on `mr`.
    unsafe { mr_copy(mr, data, len, "data", copy) }
}

/// Copies `len` bytes of the region at `offset` into `buf`.
///
/// # Safety
/// `mr` is null or a live MR handle; `buf` is valid for `len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn vrdma_mr_read(
    mr: *const vrdma_mr,
    offset: usize,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    let copy = |m: &MemoryRegion| {
        // SAFETY: the caller promises `buf` is valid for `len` bytes of writes and not
        // otherwise borrowed during the call.
        let dst = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
        m.read(offset, dst)
    };
    // SAFETY: the caller's promise on `mr`.
    unsafe { mr_copy(mr, buf, len, "buf", copy) }
}

/// Exported getters of a field of an MR handle: 0 for NULL.
macro_rules! mr_getter {
    ($(#[$doc:meta])* $name:ident -> $t:ty, $field:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `mr` is null or a live MR handle.
        #[no_mangle]
        pub unsafe extern "C" fn $name(mr: *const vrdma_mr) -> $t {
            // SAFETY: the caller's promise.
            unsafe { mr.as_ref() }.map_or(0, |m| m.0.$field())
        }
    };
}

mr_getter!(
    /// The region's length in bytes (0 for NULL).
    vrdma_mr_len -> usize, len
);
mr_getter!(
    /// The local key (0 for NULL).
    vrdma_mr_lkey -> u32, lkey
);
mr_getter!(
    /// The remote key (0 for NULL).
    vrdma_mr_rkey -> u32, rkey
);
mr_getter!(
    /// The region's address as RDMA READ/WRITE name it (0 for NULL).
    vrdma_mr_addr -> u64, iova
);

/// Fills `*out` with what a peer needs to reach this region (address, length, rkey).
///
/// # Safety
/// `mr` is null or a live MR handle; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn vrdma_mr_remote(mr: *const vrdma_mr, out: *mut vrdma_remote_mr) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let m = unsafe { handle(mr, "mr") }?;
        // SAFETY: the caller's promise on `out`.
        unsafe { write_out(out, m.0.remote().into()) }
    })
}

/// Writes `s` and a NUL into `buf` (`len` bytes) like snprintf: returns the length of `s`
/// (without NUL); truncates when it does not fit.
///
/// # Safety
/// `buf` is null (with `len` 0) or valid for `len` bytes of writes.
unsafe fn format_into(s: &str, buf: *mut c_char, len: usize) -> Result<c_int, Fail> {
    if len > 0 {
        if buf.is_null() {
            return Err(invalid("buf is NULL"));
        }
        let n = s.len().min(len - 1);
        // SAFETY: `buf` is valid for `len` bytes and `n + 1 <= len`; `s` is a distinct Rust
        // string, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
            buf.add(n).write(0);
        }
    }
    c_int::try_from(s.len()).map_err(|_| Fail(errno::ERANGE, "string too long".into()))
}

/// Reads a NUL-terminated UTF-8 string.
///
/// # Safety
/// `s` is null or a NUL-terminated string.
unsafe fn c_str<'a>(s: *const c_char) -> Result<&'a str, Fail> {
    if s.is_null() {
        return Err(invalid("string is NULL"));
    }
    // SAFETY: the caller promises a NUL-terminated string that outlives the call.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| invalid("string is not UTF-8"))
}

/// Formats a remote region as text (`addr:len:rkey`, hex) into `buf` like snprintf.
///
/// # Safety
/// `r` is valid for reads; `buf` is valid for `len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn vrdma_remote_mr_format(
    r: *const vrdma_remote_mr,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let s = RemoteMr::from(unsafe { handle(r, "remote") }?).to_string();
        // SAFETY: the caller's promise on `buf`.
        unsafe { format_into(&s, buf, len) }
    })
}

/// Parses what [`vrdma_remote_mr_format`] wrote.
///
/// # Safety
/// `s` is a NUL-terminated string; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn vrdma_remote_mr_parse(
    s: *const c_char,
    out: *mut vrdma_remote_mr,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let r: RemoteMr = unsafe { c_str(s) }?.parse()?;
        // SAFETY: the caller's promise on `out`.
        unsafe { write_out(out, r.into()) }
    })
}

/// Creates a completion queue of at least `min_cqe` entries.
///
/// # Safety
/// `ctx` is null or a live context handle; `out` is valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn vrdma_create_cq(
    ctx: *mut vrdma_context,
    min_cqe: u32,
    out: *mut *mut vrdma_cq,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let c = unsafe { handle(ctx, "ctx") }?;
        let cq = c.0.create_cq(min_cqe)?;
        // SAFETY: the caller's promise on `out`.
        unsafe { put(out, vrdma_cq(Mutex::new(cq))) }
    })
}

/// Destroys a completion queue handle (the CQ lives on while a QP uses it).
///
/// # Safety
/// `cq` is null or a live CQ handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn vrdma_destroy_cq(cq: *mut vrdma_cq) {
    // SAFETY: the caller's promise.
    unsafe { free(cq) }
}

fn to_c_wc(w: &WorkCompletion) -> vrdma_wc {
    vrdma_wc {
        wr_id: w.wr_id,
        status: w.status as u32,
        opcode: w.opcode as u32,
        byte_len: w.byte_len,
        imm_data: w.imm_data.unwrap_or(0),
        qp_num: w.qp_num,
        vendor_err: w.vendor_err,
        has_imm: u8::from(w.imm_data.is_some()),
        solicited: u8::from(w.solicited),
        reserved: [0; 6],
    }
}

/// Shared body of poll and wait: up to `n` completions into `wc`.
///
/// # Safety
/// `cq` is null or a live CQ handle; `wc` is valid for `n` writes.
unsafe fn take_wcs(
    cq: *mut vrdma_cq,
    wc: *mut vrdma_wc,
    n: c_int,
    timeout: Option<Option<Duration>>,
) -> Result<c_int, Fail> {
    // SAFETY: the caller's promise.
    let q = unsafe { handle(cq, "cq") }?;
    let n = usize::try_from(n).map_err(|_| invalid("n < 0"))?.min(256);
    if n == 0 {
        return Ok(0);
    }
    if wc.is_null() {
        return Err(invalid("wc is NULL"));
    }
    let mut tmp = [WorkCompletion::default(); 256];
    let mut q = lock(&q.0);
    let got = match timeout {
        None => q.poll(&mut tmp[..n])?,
        Some(t) => q.wait(&mut tmp[..n], t)?,
    };
    for (i, w) in got.iter().enumerate() {
        // SAFETY: `i < n` and the caller promises `wc` holds `n` entries.
        unsafe { wc.add(i).write(to_c_wc(w)) };
    }
    Ok(got.len() as c_int)
}

/// Polls up to `n` completions into `wc` without blocking; returns how many (0 if none).
///
/// # Safety
/// `cq` is null or a live CQ handle; `wc` is valid for `n` writes.
#[no_mangle]
pub unsafe extern "C" fn vrdma_poll_cq(cq: *mut vrdma_cq, wc: *mut vrdma_wc, n: c_int) -> c_int {
    // SAFETY: the caller's promise, passed on.
    guard(|| unsafe { take_wcs(cq, wc, n, None) })
}

/// Arms the CQ for one event; returns 1 if a completion is already waiting (poll then), 0.
///
/// # Safety
/// `cq` is null or a live CQ handle.
#[no_mangle]
pub unsafe extern "C" fn vrdma_arm_cq(cq: *mut vrdma_cq, solicited_only: c_int) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let q = unsafe { handle(cq, "cq") }?;
        Ok(c_int::from(lock(&q.0).arm(solicited_only != 0)?))
    })
}

/// Polls; if nothing is there, blocks on the event channel until completions arrive or
/// `timeout_ms` passes (negative: forever). Returns how many (0 on timeout).
///
/// # Safety
/// `cq` is null or a live CQ handle; `wc` is valid for `n` writes.
#[no_mangle]
pub unsafe extern "C" fn vrdma_wait_cq(
    cq: *mut vrdma_cq,
    wc: *mut vrdma_wc,
    n: c_int,
    timeout_ms: c_int,
) -> c_int {
    let t = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
    // SAFETY: the caller's promise, passed on.
    guard(|| unsafe { take_wcs(cq, wc, n, Some(t)) })
}

/// Creates an RC queue pair on `pd` with its CQs and queue sizes (0: default 128).
///
/// # Safety
/// `pd`, `send_cq`, `recv_cq` are null or live handles; `out` is valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn vrdma_create_qp(
    pd: *mut vrdma_pd,
    send_cq: *mut vrdma_cq,
    recv_cq: *mut vrdma_cq,
    sq_size: u32,
    rq_size: u32,
    out: *mut *mut vrdma_qp,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise on every handle.
        let (p, s, r) = unsafe {
            (
                handle(pd, "pd")?,
                handle(send_cq, "send_cq")?,
                handle(recv_cq, "recv_cq")?,
            )
        };
        let qp = {
            let sg = lock(&s.0);
            // The same CQ for both directions: lock it once.
            let rg;
            let rq: &CompletionQueue = if std::ptr::eq(s, r) {
                &sg
            } else {
                rg = lock(&r.0);
                &rg
            };
            let mut b = p.0.create_qp(&sg, rq);
            if sq_size > 0 {
                b = b.sq_size(sq_size);
            }
            if rq_size > 0 {
                b = b.rq_size(rq_size);
            }
            b.build()?
        };
        // SAFETY: the caller's promise on `out`.
        unsafe { put(out, vrdma_qp(Mutex::new(qp))) }
    })
}

/// Destroys a queue pair handle.
///
/// # Safety
/// `qp` is null or a live QP handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn vrdma_destroy_qp(qp: *mut vrdma_qp) {
    // SAFETY: the caller's promise.
    unsafe { free(qp) }
}

/// Fills `*out` with where a peer connects to this QP.
///
/// # Safety
/// `qp` is null or a live QP handle; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn vrdma_qp_endpoint(qp: *const vrdma_qp, out: *mut vrdma_endpoint) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let q = unsafe { handle(qp, "qp") }?;
        let e = lock(&q.0).endpoint();
        // SAFETY: the caller's promise on `out`.
        unsafe { write_out(out, e.into()) }
    })
}

/// Formats an endpoint as text (`ADDRESS/QPN`) into `buf` like snprintf.
///
/// # Safety
/// `ep` is valid for reads; `buf` is valid for `len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn vrdma_endpoint_format(
    ep: *const vrdma_endpoint,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let s = QpEndpoint::from(unsafe { handle(ep, "endpoint") }?).to_string();
        // SAFETY: the caller's promise on `buf`.
        unsafe { format_into(&s, buf, len) }
    })
}

/// Parses what [`vrdma_endpoint_format`] wrote.
///
/// # Safety
/// `s` is a NUL-terminated string; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn vrdma_endpoint_parse(s: *const c_char, out: *mut vrdma_endpoint) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let e: QpEndpoint = unsafe { c_str(s) }?.parse()?;
        // SAFETY: the caller's promise on `out`.
        unsafe { write_out(out, e.into()) }
    })
}

/// Connects to the peer QP at `remote` (both sides connect); ready to post when it returns.
///
/// # Safety
/// `qp` is null or a live QP handle; `remote` is valid for reads.
#[no_mangle]
pub unsafe extern "C" fn vrdma_qp_connect(
    qp: *mut vrdma_qp,
    remote: *const vrdma_endpoint,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let q = unsafe { handle(qp, "qp") }?;
        // SAFETY: the caller's promise.
        let r = unsafe { handle(remote, "remote") }?;
        lock(&q.0).connect(&r.into())?;
        Ok(0)
    })
}

/// The body of a post of `len` bytes of `mr` at `offset`: checks the QP, the region and
/// the range, then runs `post` on the locked QP with the region's slice.
///
/// # Safety
/// `qp` and `mr` are null or live handles.
unsafe fn post_on(
    qp: *mut vrdma_qp,
    mr: *const vrdma_mr,
    offset: usize,
    len: u32,
    post: impl FnOnce(&mut QueuePair, &[MrSlice<'_>]) -> vrdma_rs::Result<()>,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let (q, m) = unsafe { (handle(qp, "qp")?, handle(mr, "mr")?) };
        let end = offset
            .checked_add(len as usize)
            .filter(|e| *e <= m.0.len())
            .ok_or_else(|| {
                invalid(&format!(
                    "{offset}+{len} is outside the {}-byte region",
                    m.0.len()
                ))
            })?;
        post(&mut lock(&q.0), &[m.0.slice(offset..end)])?;
        Ok(0)
    })
}

/// Posts a receive of up to `len` bytes into `mr` at `offset`.
///
/// # Safety
/// `qp` and `mr` are null or live handles.
#[no_mangle]
pub unsafe extern "C" fn vrdma_post_recv(
    qp: *mut vrdma_qp,
    mr: *mut vrdma_mr,
    offset: usize,
    len: u32,
    wr_id: u64,
) -> c_int {
    // SAFETY: the caller's promise, passed on.
    unsafe { post_on(qp, mr, offset, len, |q, l| q.post_recv(l, wr_id)) }
}

/// Posts a SEND of `len` bytes of `mr` at `offset`.
///
/// # Safety
/// `qp` and `mr` are null or live handles.
#[no_mangle]
pub unsafe extern "C" fn vrdma_post_send(
    qp: *mut vrdma_qp,
    mr: *mut vrdma_mr,
    offset: usize,
    len: u32,
    wr_id: u64,
) -> c_int {
    // SAFETY: the caller's promise, passed on.
    unsafe { post_on(qp, mr, offset, len, |q, l| q.post_send(l, wr_id)) }
}

/// Posts a SEND with immediate data.
///
/// # Safety
/// `qp` and `mr` are null or live handles.
#[no_mangle]
pub unsafe extern "C" fn vrdma_post_send_imm(
    qp: *mut vrdma_qp,
    mr: *mut vrdma_mr,
    offset: usize,
    len: u32,
    imm: u32,
    wr_id: u64,
) -> c_int {
    // SAFETY: the caller's promise, passed on.
    unsafe {
        post_on(qp, mr, offset, len, |q, l| {
            q.post_send_with_imm(l, imm, wr_id)
        })
    }
}

/// Posts a SEND whose `len` bytes (≤ `VRDMA_MAX_INLINE`) are copied into the request.
///
/// # Safety
/// `qp` is null or a live QP handle; `data` is valid for `len` bytes of reads.
#[no_mangle]
pub unsafe extern "C" fn vrdma_post_send_inline(
    qp: *mut vrdma_qp,
    data: *const c_void,
    len: usize,
    wr_id: u64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let q = unsafe { handle(qp, "qp") }?;
        let bytes = if nonempty(data, len, "data")? {
            // SAFETY: the caller promises `data` is valid for `len` bytes (private memory).
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }
        } else {
            &[][..]
        };
        lock(&q.0).post_send_inline(bytes, wr_id)?;
        Ok(0)
    })
}

fn remote(addr: u64, len: u32, rkey: u32) -> RemoteMr {
    RemoteMr {
        addr,
        len: u64::from(len),
        rkey,
    }
}

/// Posts an RDMA WRITE of `len` bytes of `mr` at `offset` to the peer's `remote_addr`/`rkey`.
///
/// # Safety
/// `qp` and `mr` are null or live handles.
#[no_mangle]
pub unsafe extern "C" fn vrdma_post_write(
    qp: *mut vrdma_qp,
    mr: *mut vrdma_mr,
    offset: usize,
    len: u32,
    remote_addr: u64,
    rkey: u32,
    wr_id: u64,
) -> c_int {
    // SAFETY: the caller's promise, passed on.
    unsafe {
        post_on(qp, mr, offset, len, |q, l| {
            q.post_write(l, remote(remote_addr, len, rkey), wr_id)
        })
    }
}

/// Posts an RDMA WRITE with immediate data (consumes a receive at the peer).
///
/// # Safety
/// `qp` and `mr` are null or live handles.
#[no_mangle]
pub unsafe extern "C" fn vrdma_post_write_imm(
    qp: *mut vrdma_qp,
    mr: *mut vrdma_mr,
    offset: usize,
    len: u32,
    remote_addr: u64,
    rkey: u32,
    imm: u32,
    wr_id: u64,
) -> c_int {
    // SAFETY: the caller's promise, passed on.
    unsafe {
        post_on(qp, mr, offset, len, |q, l| {
            q.post_write_with_imm(l, remote(remote_addr, len, rkey), imm, wr_id)
        })
    }
}

/// Posts an RDMA READ of `len` bytes from the peer's `remote_addr`/`rkey` into `mr` at
/// `offset`.
///
/// # Safety
/// `qp` and `mr` are null or live handles.
#[no_mangle]
pub unsafe extern "C" fn vrdma_post_read(
    qp: *mut vrdma_qp,
    mr: *mut vrdma_mr,
    offset: usize,
    len: u32,
    remote_addr: u64,
    rkey: u32,
    wr_id: u64,
) -> c_int {
    // SAFETY: the caller's promise, passed on.
    unsafe {
        post_on(qp, mr, offset, len, |q, l| {
            q.post_read(l, remote(remote_addr, len, rkey), wr_id)
        })
    }
}

/// A static English name of a completion status (`"unknown"` for others).
#[no_mangle]
pub extern "C" fn vrdma_wc_status_str(status: u32) -> *const c_char {
    let s: &'static CStr = match status {
        0 => c"success",
        1 => c"local length error",
        2 => c"local QP operation error",
        3 => c"local protection error",
        4 => c"work request flushed",
        5 => c"remote access error",
        6 => c"remote operation error",
        7 => c"transport retry counter exceeded",
        8 => c"RNR retry counter exceeded",
        9 => c"general error",
        10 => c"bad response",
        11 => c"remote invalid request",
        12 => c"malformed work request",
        _ => c"unknown",
    };
    s.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Rust side of the prototype check: every exported function has exactly the type
    /// its declaration in include/vrdma.h spells (tests/header_sync.rs checks the header
    /// against the same list in C).
    #[test]
    fn exported_signatures() {
        type Ctx = vrdma_context;
        let _: extern "C" fn() -> *const c_char = vrdma_last_error;
        let _: unsafe extern "C" fn(*mut *mut Ctx, u32, c_int) -> c_int = vrdma_open;
        let _: unsafe extern "C" fn(*mut Ctx) = vrdma_close;
        let _: unsafe extern "C" fn(*const Ctx) -> c_int = vrdma_domid;
        let _: unsafe extern "C" fn(*const Ctx) -> c_int = vrdma_mode;
        let _: unsafe extern "C" fn(*mut Ctx, *mut *mut vrdma_pd) -> c_int = vrdma_alloc_pd;
        let _: unsafe extern "C" fn(*mut vrdma_pd) = vrdma_dealloc_pd;
        let _: unsafe extern "C" fn(*mut vrdma_pd, usize, u32, *mut *mut vrdma_mr) -> c_int =
            vrdma_alloc_mr;
        let _: unsafe extern "C" fn(*mut vrdma_mr) = vrdma_free_mr;
        let _: unsafe extern "C" fn(*mut vrdma_mr, usize, *const c_void, usize) -> c_int =
            vrdma_mr_write;
        let _: unsafe extern "C" fn(*const vrdma_mr, usize, *mut c_void, usize) -> c_int =
            vrdma_mr_read;
        let _: unsafe extern "C" fn(*const vrdma_mr) -> usize = vrdma_mr_len;
        let _: unsafe extern "C" fn(*const vrdma_mr) -> u32 = vrdma_mr_lkey;
        let _: unsafe extern "C" fn(*const vrdma_mr) -> u32 = vrdma_mr_rkey;
        let _: unsafe extern "C" fn(*const vrdma_mr) -> u64 = vrdma_mr_addr;
        let _: unsafe extern "C" fn(*const vrdma_mr, *mut vrdma_remote_mr) -> c_int =
            vrdma_mr_remote;
        let _: unsafe extern "C" fn(*const vrdma_remote_mr, *mut c_char, usize) -> c_int =
            vrdma_remote_mr_format;
        let _: unsafe extern "C" fn(*const c_char, *mut vrdma_remote_mr) -> c_int =
            vrdma_remote_mr_parse;
        let _: unsafe extern "C" fn(*mut Ctx, u32, *mut *mut vrdma_cq) -> c_int = vrdma_create_cq;
        let _: unsafe extern "C" fn(*mut vrdma_cq) = vrdma_destroy_cq;
        let _: unsafe extern "C" fn(*mut vrdma_cq, *mut vrdma_wc, c_int) -> c_int = vrdma_poll_cq;
        let _: unsafe extern "C" fn(*mut vrdma_cq, c_int) -> c_int = vrdma_arm_cq;
        let _: unsafe extern "C" fn(*mut vrdma_cq, *mut vrdma_wc, c_int, c_int) -> c_int =
            vrdma_wait_cq;
        let _: unsafe extern "C" fn(
            *mut vrdma_pd,
            *mut vrdma_cq,
            *mut vrdma_cq,
            u32,
            u32,
            *mut *mut vrdma_qp,
        ) -> c_int = vrdma_create_qp;
        let _: unsafe extern "C" fn(*mut vrdma_qp) = vrdma_destroy_qp;
        let _: unsafe extern "C" fn(*const vrdma_qp, *mut vrdma_endpoint) -> c_int =
            vrdma_qp_endpoint;
        let _: unsafe extern "C" fn(*const vrdma_endpoint, *mut c_char, usize) -> c_int =
            vrdma_endpoint_format;
        let _: unsafe extern "C" fn(*const c_char, *mut vrdma_endpoint) -> c_int =
            vrdma_endpoint_parse;
        let _: unsafe extern "C" fn(*mut vrdma_qp, *const vrdma_endpoint) -> c_int =
            vrdma_qp_connect;
        type Post = unsafe extern "C" fn(*mut vrdma_qp, *mut vrdma_mr, usize, u32, u64) -> c_int;
        let _: Post = vrdma_post_recv;
        let _: Post = vrdma_post_send;
        let _: unsafe extern "C" fn(*mut vrdma_qp, *mut vrdma_mr, usize, u32, u32, u64) -> c_int =
            vrdma_post_send_imm;
        let _: unsafe extern "C" fn(*mut vrdma_qp, *const c_void, usize, u64) -> c_int =
            vrdma_post_send_inline;
        type Rdma =
            unsafe extern "C" fn(*mut vrdma_qp, *mut vrdma_mr, usize, u32, u64, u32, u64) -> c_int;
        let _: Rdma = vrdma_post_write;
        let _: Rdma = vrdma_post_read;
        let _: unsafe extern "C" fn(
            *mut vrdma_qp,
            *mut vrdma_mr,
            usize,
            u32,
            u64,
            u32,
            u32,
            u64,
        ) -> c_int = vrdma_post_write_imm;
        let _: extern "C" fn(u32) -> *const c_char = vrdma_wc_status_str;
    }

    #[test]
    fn struct_layouts_match_the_header() {
        assert_eq!(std::mem::size_of::<vrdma_wc>(), 40);
        assert_eq!(std::mem::size_of::<vrdma_remote_mr>(), 24);
        assert_eq!(std::mem::size_of::<vrdma_endpoint>(), 24);
        assert_eq!(std::mem::offset_of!(vrdma_wc, byte_len), 16);
        assert_eq!(std::mem::offset_of!(vrdma_wc, has_imm), 32);
        assert_eq!(std::mem::offset_of!(vrdma_endpoint, qp_num), 16);
        assert_eq!(std::mem::offset_of!(vrdma_remote_mr, rkey), 16);
    }

    #[test]
    fn errors_are_negative_errno_with_a_message() {
        // SAFETY: null handles are allowed and refused.
        let r = unsafe { vrdma_alloc_pd(std::ptr::null_mut(), std::ptr::null_mut()) };
        assert_eq!(r, -errno::EINVAL);
        // SAFETY: vrdma_last_error returns a valid NUL-terminated string.
        let msg = unsafe { CStr::from_ptr(vrdma_last_error()) };
        assert!(msg.to_str().unwrap().contains("ctx is NULL"), "{msg:?}");
        let mut ep = vrdma_endpoint::default();
        // SAFETY: a valid C string and out pointer.
        let r = unsafe { vrdma_endpoint_parse(c"nonsense".as_ptr(), &mut ep) };
        assert_eq!(r, -errno::EINVAL);
        // SAFETY: a valid C string and out pointer.
        let r = unsafe { vrdma_endpoint_parse(c"::/1042".as_ptr(), &mut ep) };
        assert_eq!((r, ep.qp_num), (0, 1042));
        let mut buf = [0 as c_char; 8];
        // SAFETY: valid endpoint and an 8-byte buffer.
        let n = unsafe { vrdma_endpoint_format(&ep, buf.as_mut_ptr(), buf.len()) };
        assert_eq!(n, 7, "snprintf-like: the full length");
        // SAFETY: format_into NUL-terminated the buffer.
        assert_eq!(unsafe { CStr::from_ptr(buf.as_ptr()) }, c"::/1042");
        let mut short = [0 as c_char; 4];
        // SAFETY: valid endpoint and a 4-byte buffer.
        let n = unsafe { vrdma_endpoint_format(&ep, short.as_mut_ptr(), short.len()) };
        assert_eq!(n, 7);
        // SAFETY: truncated and NUL-terminated.
        assert_eq!(unsafe { CStr::from_ptr(short.as_ptr()) }, c"::/");
    }

    #[test]
    fn no_device_is_an_error_not_a_panic() {
        // No simulated host, no Xen here: vrdma_open fails cleanly.
        std::env::set_var("VRDMA_SIM", "/nonexistent/vrdma-capi-test");
        let mut ctx = std::ptr::null_mut();
        // SAFETY: a valid out pointer.
        let r = unsafe { vrdma_open(&mut ctx, 0, VRDMA_MODE_DEFAULT) };
        assert!(r < 0, "{r}");
        assert!(ctx.is_null());
        // SAFETY: a valid string.
        let msg = unsafe { CStr::from_ptr(vrdma_last_error()) };
        assert!(!msg.to_bytes().is_empty());
        // SAFETY: bad mode is refused before anything happens.
        let r = unsafe { vrdma_open(&mut ctx, 0, 7) };
        assert_eq!(r, -errno::EINVAL);
    }
}
