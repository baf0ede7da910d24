//! Completion channels, CQs, polling, and the watcher that turns armed CQs into channel
//! events.

use std::collections::VecDeque;
use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use verbs_abi::verbs::*;
use vrdma::{WcOpcode, WcStatus, WorkCompletion};

use crate::device::Ctx;
use crate::errno::*;
use crate::objects::null_errno;
use crate::{fail, guard, set_errno};

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
    pub(crate) vr: Mutex<vrdma::CompletionQueue>,
}

impl Cq {
    /// # Safety
    /// `p` must be NULL or a live CQ of this library.
    pub(crate) unsafe fn of<'a>(p: *mut ibv_cq) -> Option<&'a Cq> {
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
    /// Asynchronous events for `ibv_get_async_event`, once a program asked for one.
    pub events: AsyncEvents,
    events_wanted: AtomicBool,
    /// Set once the rdma_cm part (`cma.rs`) uses this context: the connection manager's
    /// events are then left for it (it waits for them), not taken and dropped here.
    pub cm_active: AtomicBool,
}

/// The backend's asynchronous events that libibverbs has an equivalent for, queued for
/// `ibv_get_async_event` (one byte in the pipe each; `async_fd` is the read end).
pub(crate) struct AsyncEvents {
    pub q: Mutex<VecDeque<(vrdma::EventKind, u32)>>,
    pub rd: OwnedFd,
    wr: OwnedFd,
}

impl Watch {
    pub fn new(ctx: vrdma::Context, rd: OwnedFd, wr: OwnedFd) -> Arc<Watch> {
        Arc::new(Watch {
            ctx,
            armed: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            events: AsyncEvents {
                q: Mutex::new(VecDeque::new()),
                rd,
                wr,
            },
            events_wanted: AtomicBool::new(false),
            cm_active: AtomicBool::new(false),
        })
    }

    /// Collects the backend's asynchronous events from now on (from `ibv_open_device`: a
    /// program may poll `async_fd` before it calls `ibv_get_async_event`).
    pub fn want_events(self: &Arc<Self>) {
        self.events_wanted.store(true, Ordering::Release);
        self.start();
    }

    /// Moves the backend's events with a libibverbs equivalent into the queue. QP
    /// disconnection has none (on InfiniBand a peer's going away raises no event), nor have
    /// the connection manager's events (librdmacm's: left pending once `cm_active`).
    fn pump_events(&self) {
        use vrdma::EventKind as K;
        let got = if self.cm_active.load(Ordering::Acquire) {
            // Connection requests, outcomes of connects and accepts, disconnections: the CM's.
            self.ctx.async_events_where(|e| {
                !matches!(
                    e.kind,
                    K::ConnectRequest
                        | K::QpEstablished
                        | K::ConnectRejected
                        | K::ConnectUnreachable
                        | K::QpDisconnected
                )
            })
        } else {
            self.ctx.async_events()
        };
        let got = match got {
            Ok(v) => v,
            Err(_) => vec![vrdma::AsyncEvent {
                kind: K::DeviceLost,
                handle: 0,
                detail: 0,
            }],
        };
        for e in got {
            if !for_get_async_event(e.kind) {
                continue;
            }
            let mut q = self.events.q.lock().unwrap_or_else(|e| e.into_inner());
            // Device loss is reported once.
            if e.kind == K::DeviceLost && q.iter().any(|(k, _)| *k == K::DeviceLost) {
                continue;
            }
            q.push_back((e.kind, e.handle));
            let _ = rustix::io::write(&self.events.wr, &[1]);
            if e.kind == K::DeviceLost {
                self.events_wanted.store(false, Ordering::Release);
            }
        }
    }

    fn arm(self: &Arc<Self>, cq: *const Cq) {
        let mut a = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        if !a.contains(&(cq as usize)) {
            a.push(cq as usize);
        }
        drop(a);
        self.start();
    }

    fn start(self: &Arc<Self>) {
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
            if self.events_wanted.load(Ordering::Acquire) {
                self.pump_events();
            }
            // Notifications wake us at once; the timeout bounds a missed one (shorter while
            // a CQ is armed).
            let idle = self
                .armed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty();
            let t = Duration::from_millis(if idle { 200 } else { 20 });
            if self.ctx.wait_notification(t).is_err() {
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
        let handle = cq.handle;
        let p = Box::into_raw(Box::new(Cq {
            cq,
            vr: Mutex::new(vr),
        }));
        ctx.cqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(handle, p as usize);
        p.cast()
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
            ctx.cqs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&cq.cq.handle);
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

pub(crate) unsafe extern "C" fn req_notify_cq(p: *mut ibv_cq, solicited_only: c_int) -> c_int {
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

/// The environment variable that makes an empty `ibv_poll_cq` yield the CPU.
pub(crate) const POLL_YIELD_VAR: &str = "VRDMA_VERBS_POLL_YIELD";

/// Whether `value` (of [`POLL_YIELD_VAR`]) turns the yield on: `1`, nothing else.
fn poll_yield_on(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| v == "1")
}

/// `VRDMA_VERBS_POLL_YIELD=1`: an `ibv_poll_cq` that finds nothing calls `sched_yield`
/// before it returns, so a busy-polling program (perftest) gives its core to the peer and the
/// backend on a machine with fewer cores than spinning threads (what `vrdma-perf
/// --yield-poll` does in the benchmark itself). Off by default: the poll stays syscall-free.
fn poll_yield() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| poll_yield_on(std::env::var_os(POLL_YIELD_VAR).as_deref()))
}

pub(crate) unsafe extern "C" fn poll_cq(p: *mut ibv_cq, n: c_int, out: *mut ibv_wc) -> c_int {
    // SAFETY: the caller's contract (ibv_poll_cq's), passed on unchanged.
    let got = unsafe { poll_cq_inner(p, n, out) };
    if got == 0 && n > 0 && poll_yield() {
        std::thread::yield_now();
    }
    got
}

/// # Safety
/// `ibv_poll_cq`'s contract: `p` a CQ of this library, `out` room for `n` completions.
unsafe fn poll_cq_inner(p: *mut ibv_cq, n: c_int, out: *mut ibv_wc) -> c_int {
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

#[cfg(test)]
mod poll_yield_tests {
    use super::poll_yield_on;
    use std::ffi::OsStr;

    #[test]
    fn only_1_turns_the_yield_on() {
        assert!(poll_yield_on(Some(OsStr::new("1"))));
        for off in [
            None,
            Some(OsStr::new("0")),
            Some(OsStr::new("")),
            Some(OsStr::new("yes")),
        ] {
            assert!(!poll_yield_on(off), "{off:?}");
        }
    }
}

/// Whether `ibv_get_async_event` reports an event of this kind (device.rs turns each into
/// its `ibv_async_event`): the QP, CQ, port and device events. The connection manager's
/// kinds are rdma_cm's (`cma.rs`); the rest are not the application's.
pub(crate) fn for_get_async_event(kind: vrdma::EventKind) -> bool {
    use vrdma::EventKind as K;
    matches!(
        kind,
        K::QpFatal
            | K::CqOverrun
            | K::DeviceLost
            | K::QpCommEstablished
            | K::QpLastWqeReached
            | K::QpPathMigrated
            | K::QpPathMigrationError
            | K::PortActive
            | K::PortError
    )
}

#[cfg(test)]
mod async_event_tests {
    #[test]
    fn the_verbs_device_s_qp_and_port_events_reach_ibv_get_async_event() {
        use vrdma::EventKind as K;
        // The kinds the verbs device forwards from the HCA (backend.md, "HCA async events"),
        // each of which device.rs turns into its ibv_async_event: none may be dropped here.
        for k in [
            K::QpFatal,
            K::CqOverrun,
            K::DeviceLost,
            K::QpCommEstablished,
            K::QpLastWqeReached,
            K::QpPathMigrated,
            K::QpPathMigrationError,
            K::PortActive,
            K::PortError,
        ] {
            assert!(super::for_get_async_event(k), "{k:?} dropped");
        }
        for k in [
            K::ConnectRequest,
            K::QpEstablished,
            K::ConnectRejected,
            K::ConnectUnreachable,
            K::QpDisconnected,
        ] {
            assert!(!super::for_get_async_event(k), "{k:?} is rdma_cm's");
        }
    }
}
