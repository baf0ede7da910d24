//! Verbs objects over `vrdma` objects: PD, MR, completion channel, CQ, QP, and the data-path
//! ops of `ibv_context::ops` (post_send, post_recv, poll_cq, req_notify_cq).
//!
//! Each object is a `#[repr(C)]` struct whose first field is the libibverbs struct the program
//! sees (`ibv_pd`, `ibv_mr`, …), so the program's pointer is the object's pointer.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use verbs_abi::verbs::*;
use vrdma::{AccessFlags, QpEndpoint, RemoteMr, SendOp, Sge, WcOpcode, WcStatus, WorkCompletion};

use crate::device::Ctx;
use crate::errno::*;
use crate::memory;
use crate::{fail, guard, set_errno};

/// The ops table every context carries.
pub(crate) fn context_ops() -> ibv_context_ops {
    // SAFETY: all-zero is a table of NULL ops.
    let mut ops: ibv_context_ops = unsafe { std::mem::zeroed() };
    ops.poll_cq = Some(poll_cq);
    ops.req_notify_cq = Some(req_notify_cq);
    ops.post_send = Some(post_send);
    ops.post_recv = Some(post_recv);
    ops
}

fn null_errno<T>(e: i32) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

// ---------------------------------------------------------------------------------------------
// Protection domains and memory regions
// ---------------------------------------------------------------------------------------------

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
    unsafe fn of<'a>(p: *mut ibv_pd) -> Option<&'a Pd> {
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

// ---------------------------------------------------------------------------------------------
// Completion channels, CQs and the watcher that turns armed CQs into channel events
// ---------------------------------------------------------------------------------------------

#[repr(C)]
pub(crate) struct CompChannel {
    pub ch: ibv_comp_channel,
    /// CQs with an event not yet taken by `ibv_get_cq_event` (one byte in the pipe each).
    ready: Mutex<VecDeque<usize>>,
    rd: OwnedFd,
    wr: OwnedFd,
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_create_comp_channel(
    c: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard(std::ptr::null_mut(), || {
        // SAFETY: C contract.
        if unsafe { Ctx::of(c) }.is_none() {
            return null_errno(EINVAL);
        }
        let (rd, wr) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
            Ok(p) => p,
            Err(e) => return null_errno(e.raw_os_error()),
        };
        let ch = Box::new(CompChannel {
            ch: ibv_comp_channel {
                context: c,
                fd: rd.as_raw_fd(),
                refcnt: 0,
            },
            ready: Mutex::new(VecDeque::new()),
            rd,
            wr,
        });
        Box::into_raw(ch).cast()
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    guard(EIO, || {
        if ch.is_null() {
            return EINVAL;
        }
        // SAFETY: from ibv_create_comp_channel.
        if unsafe { (*ch).refcnt } != 0 {
            return EBUSY;
        }
        // SAFETY: from Box::into_raw, destroyed once.
        drop(unsafe { Box::from_raw(ch.cast::<CompChannel>()) });
        0
    })
}

const EBUSY: i32 = libc::EBUSY;

#[repr(C)]
pub(crate) struct Cq {
    pub cq: ibv_cq,
    vr: Mutex<vrdma::CompletionQueue>,
}

impl Cq {
    /// # Safety
    /// `p` must be NULL or a live CQ of this library.
    unsafe fn of<'a>(p: *mut ibv_cq) -> Option<&'a Cq> {
        // SAFETY: the caller's contract.
        (!p.is_null()).then(|| unsafe { &*p.cast::<Cq>() })
    }
}

/// Armed CQs of a context, and the thread that waits for their notifications.
pub(crate) struct Watch {
    ctx: vrdma::Context,
    armed: Mutex<Vec<usize>>,
    stop: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Watch {
    pub fn new(ctx: vrdma::Context) -> Arc<Watch> {
        Arc::new(Watch {
            ctx,
            armed: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        })
    }

    fn arm(self: &Arc<Self>, cq: *const Cq) {
        let mut a = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        if !a.contains(&(cq as usize)) {
            a.push(cq as usize);
        }
        drop(a);
        let mut t = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        if t.is_none() {
            let me = self.clone();
            *t = std::thread::Builder::new()
                .name("vrdma-verbs-cq-events".into())
                .spawn(move || me.run())
                .ok();
        }
    }

    fn forget(&self, cq: *const Cq) {
        self.armed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|&p| p != cq as usize);
    }

    /// Delivers an event for every armed CQ with a completion waiting.
    fn scan(&self) {
        let mut a = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        a.retain(|&p| {
            // SAFETY: a CQ leaves this list (under this lock) before it is destroyed.
            let cq = unsafe { &*(p as *const Cq) };
            let ready = cq.vr.lock().unwrap_or_else(|e| e.into_inner()).ready();
            if ready {
                deliver(cq);
            }
            !ready
        });
    }

    fn run(&self) {
        while !self.stop.load(Ordering::Acquire) {
            self.scan();
            // Notifications wake us at once; the timeout bounds a missed one.
            if self
                .ctx
                .wait_notification(Duration::from_millis(20))
                .is_err()
            {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

/// Queues a completion event of `cq` on its channel (one byte in the pipe per event).
fn deliver(cq: &Cq) {
    let ch = cq.cq.channel.cast::<CompChannel>();
    if ch.is_null() {
        return;
    }
    // SAFETY: a channel outlives its CQs (destroy_comp_channel refuses while refcnt > 0).
    let ch = unsafe { &*ch };
    ch.ready
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push_back(cq as *const Cq as usize);
    let _ = rustix::io::write(&ch.wr, &[1]);
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_create_cq(
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut ibv_cq {
    guard(std::ptr::null_mut(), || {
        // SAFETY: C contract.
        let Some(ctx) = (unsafe { Ctx::of(c) }) else {
            return null_errno(EINVAL);
        };
        if cqe <= 0 {
            return null_errno(EINVAL);
        }
        // The device's CQs have at least 2 entries.
        let vr = match ctx.vr.create_cq((cqe as u32).max(2)) {
            Ok(q) => q,
            Err(e) => return null_errno(fail("ibv_create_cq", &e)),
        };
        let size = vr.size();
        if !channel.is_null() {
            // SAFETY: a live channel of ours.
            unsafe { (*channel).refcnt += 1 };
        }
        // SAFETY: all-zero mutex/cond are valid initial values on glibc.
        let mut cq: ibv_cq = unsafe { std::mem::zeroed() };
        cq.context = c;
        cq.channel = channel;
        cq.cq_context = cq_context;
        cq.handle = vr.handle();
        cq.cqe = size.min(i32::MAX as u32) as c_int;
        Box::into_raw(Box::new(Cq {
            cq,
            vr: Mutex::new(vr),
        }))
        .cast()
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_destroy_cq(p: *mut ibv_cq) -> c_int {
    guard(EIO, || {
        // SAFETY: C contract.
        let Some(cq) = (unsafe { Cq::of(p) }) else {
            return EINVAL;
        };
        // SAFETY: the CQ's context is live.
        if let Some(ctx) = unsafe { Ctx::of(cq.cq.context) } {
            ctx.watch.forget(cq);
        }
        if !cq.cq.channel.is_null() {
            // SAFETY: a channel outlives its CQs.
            let ch = unsafe { &*cq.cq.channel.cast::<CompChannel>() };
            ch.ready
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|&q| q != cq as *const Cq as usize);
            // SAFETY: as above.
            unsafe { (*cq.cq.channel).refcnt -= 1 };
        }
        // SAFETY: from Box::into_raw in create_cq, destroyed once.
        drop(unsafe { Box::from_raw(p.cast::<Cq>()) });
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    ctx_out: *mut *mut c_void,
) -> c_int {
    guard(-1, || {
        if ch.is_null() || cq_out.is_null() || ctx_out.is_null() {
            set_errno(EINVAL);
            return -1;
        }
        // SAFETY: a live channel of ours.
        let ch = unsafe { &*ch.cast::<CompChannel>() };
        let mut b = [0u8; 1];
        // Blocks unless the program made the fd non-blocking (then EAGAIN, as libibverbs).
        if let Err(e) = rustix::io::read(&ch.rd, &mut b) {
            set_errno(e.raw_os_error());
            return -1;
        }
        let Some(p) = ch
            .ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
        else {
            set_errno(EAGAIN);
            return -1;
        };
        let cq = p as *mut Cq;
        // SAFETY: queued CQs are live (destroy_cq removes them from the queue).
        unsafe {
            *cq_out = cq.cast();
            *ctx_out = (*cq).cq.cq_context;
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_ack_cq_events(p: *mut ibv_cq, n: c_uint) {
    guard((), || {
        if !p.is_null() {
            // SAFETY: a live CQ of ours; the counter is ours (libibverbs' field).
            unsafe { (*p).comp_events_completed = (*p).comp_events_completed.wrapping_add(n) };
        }
    })
}

unsafe extern "C" fn req_notify_cq(p: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(EIO, || {
        // SAFETY: C contract.
        let Some(cq) = (unsafe { Cq::of(p) }) else {
            return EINVAL;
        };
        // SAFETY: the CQ's context is live.
        let Some(ctx) = (unsafe { Ctx::of(cq.cq.context) }) else {
            return EINVAL;
        };
        let ready = match cq
            .vr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .arm(solicited_only != 0)
        {
            Ok(r) => r,
            Err(e) => return fail("ibv_req_notify_cq", &e),
        };
        if ready {
            // A completion came before the arm: its event is due now.
            deliver(cq);
        } else {
            ctx.watch.arm(cq);
        }
        0
    })
}

fn wc_status(s: WcStatus) -> ibv_wc_status {
    match s {
        WcStatus::Success => IBV_WC_SUCCESS,
        WcStatus::LocalLengthError => IBV_WC_LOC_LEN_ERR,
        WcStatus::LocalQpOperationError => IBV_WC_LOC_QP_OP_ERR,
        WcStatus::LocalProtectionError => IBV_WC_LOC_PROT_ERR,
        WcStatus::WrFlushError => IBV_WC_WR_FLUSH_ERR,
        WcStatus::RemoteAccessError => IBV_WC_REM_ACCESS_ERR,
        WcStatus::RemoteOperationError => IBV_WC_REM_OP_ERR,
        WcStatus::RetryExceeded => IBV_WC_RETRY_EXC_ERR,
        WcStatus::RnrRetryExceeded => IBV_WC_RNR_RETRY_EXC_ERR,
        WcStatus::GeneralError => IBV_WC_GENERAL_ERR,
        WcStatus::BadResponse => IBV_WC_BAD_RESP_ERR,
        WcStatus::RemoteInvalidRequest => IBV_WC_REM_INV_REQ_ERR,
        WcStatus::BadWqe => IBV_WC_LOC_QP_OP_ERR,
    }
}

fn to_ibv_wc(w: &WorkCompletion) -> ibv_wc {
    let opcode = match w.opcode {
        WcOpcode::Send => IBV_WC_SEND,
        WcOpcode::RdmaWrite => IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => IBV_WC_RDMA_READ,
        WcOpcode::Recv => IBV_WC_RECV,
        WcOpcode::RecvRdmaWithImm => IBV_WC_RECV_RDMA_WITH_IMM,
    };
    ibv_wc {
        wr_id: w.wr_id,
        status: wc_status(w.status),
        opcode,
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        imm_data: w.imm_data.unwrap_or(0),
        qp_num: w.qp_num,
        src_qp: 0,
        wc_flags: if w.imm_data.is_some() {
            IBV_WC_WITH_IMM
        } else {
            0
        },
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    }
}

/// Whether the program sees completion `w`. On InfiniBand an RC QP whose peer went away
/// stays in RTS with its receives posted (its next send fails with a retry error); the vrdma
/// backend instead fails the QP when the peer's is destroyed and flushes its receive queue.
/// A program that received its last message and waits for its last send's completion would
/// then see a flushed receive first (`ibv_rc_pingpong` fails on it). So flushed receives are
/// passed on only for QPs that reported an error of their own, or that the program moved to
/// ERR: then the whole queue flushes, as on InfiniBand.
fn deliver_wc(ctx: &Ctx, w: &WorkCompletion) -> bool {
    let flushing = || ctx.flushing.lock().unwrap_or_else(|e| e.into_inner());
    match w.status {
        WcStatus::Success => true,
        WcStatus::WrFlushError => w.opcode != WcOpcode::Recv || flushing().contains(&w.qp_num),
        _ => {
            flushing().insert(w.qp_num);
            true
        }
    }
}

unsafe extern "C" fn poll_cq(p: *mut ibv_cq, n: c_int, out: *mut ibv_wc) -> c_int {
    guard(-1, || {
        // SAFETY: C contract.
        let Some(cq) = (unsafe { Cq::of(p) }) else {
            return -1;
        };
        if n <= 0 {
            return 0;
        }
        if out.is_null() {
            return -1;
        }
        // SAFETY: the CQ's context is live.
        let Some(ctx) = (unsafe { Ctx::of(cq.cq.context) }) else {
            return -1;
        };
        let mut q = cq.vr.lock().unwrap_or_else(|e| e.into_inner());
        let mut buf = [WorkCompletion::default(); 16];
        let mut done = 0usize;
        while done < n as usize {
            let want = (n as usize - done).min(buf.len());
            let got = match q.poll(&mut buf[..want]) {
                Ok(g) => g.len(),
                Err(e) => {
                    fail("ibv_poll_cq", &e);
                    return if done > 0 { done as c_int } else { -1 };
                }
            };
            for w in &buf[..got] {
                if !deliver_wc(ctx, w) {
                    continue;
                }
                // SAFETY: the caller's array holds `n` entries; done < n (each pass asks for
                // at most n - done).
                unsafe { out.add(done).write(to_ibv_wc(w)) };
                done += 1;
            }
            if got < want {
                break;
            }
        }
        done as c_int
    })
}

// ---------------------------------------------------------------------------------------------
// Queue pairs
// ---------------------------------------------------------------------------------------------

#[repr(C)]
pub(crate) struct Qp {
    pub qp: ibv_qp,
    vr: Mutex<vrdma::QueuePair>,
    attr: Mutex<ibv_qp_attr>,
    init: ibv_qp_init_attr,
    sq_sig_all: bool,
    /// The pairing `Connect` of the move to RTR, answered once the peer names this QP too:
    /// the first post_send waits for it (see `modify_qp`).
    connecting: Mutex<Option<std::thread::JoinHandle<Result<(), i32>>>>,
}

impl Qp {
    /// Waits for a pending connect; its error, if it failed.
    fn connected(&self) -> Result<(), i32> {
        let pending = self
            .connecting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match pending {
            Some(t) => t.join().unwrap_or(Err(EIO)),
            None => Ok(()),
        }
    }
}

impl Qp {
    /// # Safety
    /// `p` must be NULL or a live QP of this library.
    unsafe fn of<'a>(p: *mut ibv_qp) -> Option<&'a Qp> {
        // SAFETY: the caller's contract.
        (!p.is_null()).then(|| unsafe { &*p.cast::<Qp>() })
    }
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_create_qp(
    p: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        // SAFETY: C contract.
        let Some(pd) = (unsafe { Pd::of(p) }) else {
            return null_errno(EINVAL);
        };
        if init.is_null() {
            return null_errno(EINVAL);
        }
        // SAFETY: the caller's init attributes.
        let ia = unsafe { &mut *init };
        if ia.qp_type != IBV_QPT_RC || !ia.srq.is_null() {
            // UD, UC, raw packet, XRC; shared receive queues.
            return null_errno(EOPNOTSUPP);
        }
        // SAFETY: CQs of ours or NULL.
        let (Some(scq), Some(rcq)) = (unsafe { Cq::of(ia.send_cq) }, unsafe { Cq::of(ia.recv_cq) })
        else {
            return null_errno(EINVAL);
        };
        let cap = ia.cap;
        let max_sge = vrdma::MAX_SGE as u32;
        if cap.max_send_sge > max_sge
            || cap.max_recv_sge > max_sge
            || cap.max_inline_data > vrdma::MAX_INLINE as u32
        {
            return null_errno(EINVAL);
        }
        // The device's queues have at least 2 slots.
        let sq = cap.max_send_wr.max(2);
        let rq = cap.max_recv_wr.max(2);
        let built = {
            let sg = scq.vr.lock().unwrap_or_else(|e| e.into_inner());
            if std::ptr::eq(scq, rcq) {
                pd.vr.create_qp(&sg, &sg).sq_size(sq).rq_size(rq).build()
            } else {
                let rg = rcq.vr.lock().unwrap_or_else(|e| e.into_inner());
                pd.vr.create_qp(&sg, &rg).sq_size(sq).rq_size(rq).build()
            }
        };
        let vr = match built {
            Ok(q) => q,
            Err(e) => return null_errno(fail("ibv_create_qp", &e)),
        };
        // What the QP really has (ibv_create_qp reports it back in `cap`).
        ia.cap = ibv_qp_cap {
            max_send_wr: sq.next_power_of_two(),
            max_recv_wr: rq.next_power_of_two(),
            max_send_sge: max_sge,
            max_recv_sge: max_sge,
            max_inline_data: vr.max_inline(),
        };
        // SAFETY: all-zero mutex/cond are valid initial values on glibc.
        let mut q: ibv_qp = unsafe { std::mem::zeroed() };
        // SAFETY: the PD's context.
        q.context = pd.pd.context;
        q.qp_context = ia.qp_context;
        q.pd = p;
        q.send_cq = ia.send_cq;
        q.recv_cq = ia.recv_cq;
        q.handle = vr.handle();
        q.qp_num = vr.qp_num();
        q.state = IBV_QPS_RESET;
        q.qp_type = IBV_QPT_RC;
        let attr = ibv_qp_attr {
            qp_state: IBV_QPS_RESET,
            cap: ia.cap,
            path_mtu: IBV_MTU_4096,
            ..Default::default()
        };
        Box::into_raw(Box::new(Qp {
            qp: q,
            vr: Mutex::new(vr),
            attr: Mutex::new(attr),
            init: *ia,
            sq_sig_all: ia.sq_sig_all != 0,
            connecting: Mutex::new(None),
        }))
        .cast()
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_destroy_qp(p: *mut ibv_qp) -> c_int {
    guard(EIO, || {
        // SAFETY: C contract.
        let Some(qp) = (unsafe { Qp::of(p) }) else {
            return EINVAL;
        };
        // SAFETY: the QP's context is live.
        if let Some(ctx) = unsafe { Ctx::of(qp.qp.context) } {
            ctx.flushing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&qp.qp.qp_num);
        }
        // SAFETY: from Box::into_raw in create_qp, destroyed once.
        drop(unsafe { Box::from_raw(p.cast::<Qp>()) });
        0
    })
}

/// The peer's address for `vrdma::QueuePair::connect` from an address vector: no GRH, or our
/// own GID, means "on this backend"; any other GID is the peer backend's address.
fn peer_addr(ctx: &Ctx, ah: &ibv_ah_attr) -> [u8; 16] {
    let own = ctx.vr.backend_addr_raw();
    if ah.is_global == 0 {
        return own;
    }
    let dgid = ah.grh.dgid.raw();
    if dgid == ctx.gid {
        own
    } else {
        dgid
    }
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_modify_qp(
    p: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard(EIO, || {
        // SAFETY: C contract.
        let Some(qp) = (unsafe { Qp::of(p) }) else {
            return EINVAL;
        };
        if attr.is_null() {
            return EINVAL;
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &*attr };
        let mask = mask as c_uint;
        // SAFETY: the QP's context is live.
        let Some(ctx) = (unsafe { Ctx::of(qp.qp.context) }) else {
            return EINVAL;
        };
        let mut cur = qp.attr.lock().unwrap_or_else(|e| e.into_inner());
        if mask & IBV_QP_RATE_LIMIT != 0 || mask & IBV_QP_ALT_PATH != 0 {
            return EOPNOTSUPP;
        }
        let to = if mask & IBV_QP_STATE != 0 {
            a.qp_state
        } else {
            cur.qp_state
        };
        let from = cur.qp_state;
        // The transitions of the IB spec that an RC QP of this library makes.
        let ok = matches!(
            (from, to),
            (IBV_QPS_RESET, IBV_QPS_RESET | IBV_QPS_INIT)
                | (IBV_QPS_INIT, IBV_QPS_INIT | IBV_QPS_RTR)
                | (IBV_QPS_RTR, IBV_QPS_RTS)
                | (IBV_QPS_RTS, IBV_QPS_RTS)
        ) || to == IBV_QPS_ERR;
        if !ok {
            return EINVAL;
        }
        if from == IBV_QPS_INIT && to == IBV_QPS_RTR {
            if mask & IBV_QP_AV == 0 || mask & IBV_QP_DEST_QPN == 0 {
                return EINVAL;
            }
            let ep = QpEndpoint {
                addr: peer_addr(ctx, &a.ah_attr),
                qp_num: a.dest_qp_num,
            };
            // The backend answers when both ends have named each other, which may be after
            // this program tells its peer our QP number: connect in the background, and let
            // the first post_send wait for it.
            let conn = qp.vr.lock().unwrap_or_else(|e| e.into_inner()).connector();
            let t = std::thread::Builder::new()
                .name("vrdma-verbs-connect".into())
                .spawn(move || {
                    conn.connect(&ep)
                        .map_err(|e| fail("ibv_modify_qp(RTR): connect", &e))
                });
            match t {
                Ok(t) => {
                    *qp.connecting.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
                }
                Err(_) => return EAGAIN,
            }
        }
        // Remember what was set (ibv_query_qp reports it).
        macro_rules! keep {
            ($bit:expr, $($f:ident),+) => {
                if mask & $bit != 0 { $( cur.$f = a.$f; )+ }
            };
        }
        keep!(IBV_QP_ACCESS_FLAGS, qp_access_flags);
        keep!(IBV_QP_PKEY_INDEX, pkey_index);
        keep!(IBV_QP_PORT, port_num);
        keep!(IBV_QP_QKEY, qkey);
        keep!(IBV_QP_AV, ah_attr);
        keep!(IBV_QP_PATH_MTU, path_mtu);
        keep!(IBV_QP_TIMEOUT, timeout);
        keep!(IBV_QP_RETRY_CNT, retry_cnt);
        keep!(IBV_QP_RNR_RETRY, rnr_retry);
        keep!(IBV_QP_RQ_PSN, rq_psn);
        keep!(IBV_QP_MAX_QP_RD_ATOMIC, max_rd_atomic);
        keep!(IBV_QP_MIN_RNR_TIMER, min_rnr_timer);
        keep!(IBV_QP_SQ_PSN, sq_psn);
        keep!(IBV_QP_MAX_DEST_RD_ATOMIC, max_dest_rd_atomic);
        keep!(IBV_QP_DEST_QPN, dest_qp_num);
        if to == IBV_QPS_ERR {
            ctx.flushing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(qp.qp.qp_num);
        }
        cur.qp_state = to;
        cur.cur_qp_state = to;
        // SAFETY: the program's ibv_qp is ours; `state` is libibverbs' public field.
        unsafe { (*p).state = to };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_query_qp(
    p: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard(EIO, || {
        // SAFETY: C contract.
        let Some(qp) = (unsafe { Qp::of(p) }) else {
            return EINVAL;
        };
        if attr.is_null() || init.is_null() {
            return EINVAL;
        }
        let cur = *qp.attr.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the caller's output structs.
        unsafe {
            attr.write(cur);
            init.write(qp.init);
        }
        0
    })
}

/// Local SGEs (addresses) as WQE SGEs (offsets into their region).
fn wqe_sges(
    pd: &Pd,
    list: *const ibv_sge,
    n: c_int,
    out: &mut [Sge; vrdma::MAX_SGE],
) -> Result<usize, i32> {
    if n < 0 || n as usize > vrdma::MAX_SGE || (n > 0 && list.is_null()) {
        return Err(EINVAL);
    }
    let keys = pd.lkeys.read().unwrap_or_else(|e| e.into_inner());
    for (i, o) in out.iter_mut().enumerate().take(n as usize) {
        // SAFETY: the work request's `sg_list` holds `num_sge` entries.
        let s = unsafe { list.add(i).read() };
        // An unknown lkey goes to the backend as is: it completes the request with an error,
        // as a device does.
        let base = keys.get(&s.lkey).copied().unwrap_or(0);
        *o = Sge {
            offset: s.addr.wrapping_sub(base),
            length: s.length,
            lkey: s.lkey,
        };
    }
    Ok(n as usize)
}

fn post_one_send(qp: &Qp, pd: &Pd, wr: &ibv_send_wr) -> Result<(), i32> {
    let mut sges = [Sge::default(); vrdma::MAX_SGE];
    let total: u64 = (0..wr.num_sge.max(0) as usize)
        .filter(|_| !wr.sg_list.is_null())
        // SAFETY: `sg_list` holds `num_sge` entries.
        .map(|i| u64::from(unsafe { wr.sg_list.add(i).read() }.length))
        .sum();
    // SAFETY: `wr.rdma` is the member RDMA opcodes use; plain integers.
    let rdma = unsafe { wr.wr.rdma };
    let remote = RemoteMr {
        addr: rdma.remote_addr,
        len: total,
        rkey: rdma.rkey,
    };
    let op = match wr.opcode {
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm(wr.imm_data),
        IBV_WR_RDMA_WRITE => SendOp::Write(remote),
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteWithImm(remote, wr.imm_data),
        IBV_WR_RDMA_READ => SendOp::Read(remote),
        // Atomics, memory windows, invalidation, TSO.
        _ => return Err(EINVAL),
    };
    let mut inline_buf = [0u8; vrdma::MAX_INLINE];
    let inline = if wr.send_flags & IBV_SEND_INLINE != 0 && wr.opcode != IBV_WR_RDMA_READ {
        if total > vrdma::MAX_INLINE as u64 {
            return Err(EINVAL);
        }
        let mut at = 0usize;
        for i in 0..wr.num_sge.max(0) as usize {
            // SAFETY: `sg_list` holds `num_sge` entries; an inline SGE's address is the
            // program's readable memory of `length` bytes (it needs no lkey).
            unsafe {
                let s = wr.sg_list.add(i).read();
                std::ptr::copy_nonoverlapping(
                    s.addr as usize as *const u8,
                    inline_buf.as_mut_ptr().add(at),
                    s.length as usize,
                );
                at += s.length as usize;
            }
        }
        Some(&inline_buf[..at])
    } else {
        None
    };
    let n = if inline.is_some() {
        0
    } else {
        wqe_sges(pd, wr.sg_list, wr.num_sge, &mut sges)?
    };
    let signaled = qp.sq_sig_all || wr.send_flags & IBV_SEND_SIGNALED != 0;
    qp.vr
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .post_send_sges(
            wr.wr_id,
            op,
            &sges[..n],
            inline,
            signaled,
            wr.send_flags & IBV_SEND_SOLICITED != 0,
            wr.send_flags & IBV_SEND_FENCE != 0,
        )
        .map_err(|e| fail("ibv_post_send", &e))
}

unsafe extern "C" fn post_send(
    p: *mut ibv_qp,
    mut wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    guard(EIO, || {
        // SAFETY: C contract.
        let Some(qp) = (unsafe { Qp::of(p) }) else {
            return EINVAL;
        };
        // SAFETY: the QP's PD is live.
        let Some(pd) = (unsafe { Pd::of(qp.qp.pd) }) else {
            return EINVAL;
        };
        if let Err(e) = qp.connected() {
            if !bad.is_null() {
                // SAFETY: the caller's out pointer.
                unsafe { *bad = wr };
            }
            return e;
        }
        while !wr.is_null() {
            // SAFETY: the program's work request list.
            let w = unsafe { &*wr };
            if let Err(e) = post_one_send(qp, pd, w) {
                if !bad.is_null() {
                    // SAFETY: the caller's out pointer.
                    unsafe { *bad = wr };
                }
                return e;
            }
            wr = w.next;
        }
        0
    })
}

unsafe extern "C" fn post_recv(
    p: *mut ibv_qp,
    mut wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(EIO, || {
        // SAFETY: C contract.
        let Some(qp) = (unsafe { Qp::of(p) }) else {
            return EINVAL;
        };
        // SAFETY: the QP's PD is live.
        let Some(pd) = (unsafe { Pd::of(qp.qp.pd) }) else {
            return EINVAL;
        };
        let mut q = qp.vr.lock().unwrap_or_else(|e| e.into_inner());
        while !wr.is_null() {
            // SAFETY: the program's work request list.
            let w = unsafe { &*wr };
            let mut sges = [Sge::default(); vrdma::MAX_SGE];
            let r = wqe_sges(pd, w.sg_list, w.num_sge, &mut sges).and_then(|n| {
                q.post_recv_sges(&sges[..n], w.wr_id)
                    .map_err(|e| fail("ibv_post_recv", &e))
            });
            if let Err(e) = r {
                if !bad.is_null() {
                    // SAFETY: the caller's out pointer.
                    unsafe { *bad = wr };
                }
                return e;
            }
            wr = w.next;
        }
        0
    })
}
