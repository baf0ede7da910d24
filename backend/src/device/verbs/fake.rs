//! A fake libibverbs for the verbs device's unit tests: one RoCE device `fake0` whose verbs
//! are functions of this file ([`VerbsLib::fake`]), so [`super::VerbsDevice::open`] runs
//! unchanged, threads and all, on any host.
//!
//! What it models of rdma-core and the kernel:
//! - the async events: [`push_event`] queues one and makes the async fd (a pipe) readable;
//!   `ibv_get_async_event` hands them out in order, then fails with `EAGAIN` (the fd is
//!   non-blocking), or with `EIO` once the device is gone ([`lose_device`], which also hangs
//!   the pipe up, as uverbs' fd polls `EPOLLERR` after a disassociation);
//! - `ibv_destroy_qp` waits until every async event read for the QP was acknowledged
//!   (rdma-core's `ibv_cmd_destroy_qp` waits for `events_completed` to reach the kernel's
//!   `events_reported`, the events read); events not read yet are dropped, as the kernel drops
//!   them. A wait that would never end is given up after 2 s and recorded ([`hung`]); the
//!   thread each QP was destroyed on is recorded ([`destroyed`]);
//! - a GID table with types ([`set_gids`]), `_ibv_query_gid_ex`;
//! - [`hold_err`]: `ibv_modify_qp` to ERR blocks until released (to stop a thread there).
//!
//! Completions, posts and registrations do nothing (the data path is tested on rxe).
//! Tests using it take [`setup`]'s guard: the state is global.

#![allow(dead_code)] // not every test uses every knob

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::abi::*;
use super::dl::Fns;
use super::VerbsLib;

/// What an event queued with [`push_event`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Elem {
    Qp(u32),
    Port(i32),
    Device,
}

struct State {
    link_layer: u8,
    gids: Vec<([u8; 16], u32)>,
    events: VecDeque<(u32, Elem)>,
    lost: bool,
    /// QP number → its `ibv_qp` (as an address).
    qps: HashMap<u32, usize>,
    reported: HashMap<u32, u32>,
    completed: HashMap<u32, u32>,
    destroyed: Vec<(u32, String)>,
    hung: Vec<u32>,
    next_qpn: u32,
    next_handle: u32,
    hold_err: bool,
    held: bool,
    /// The async fd's pipe (read end, write end; -1 once closed).
    pipe: (c_int, c_int),
}

impl State {
    fn new() -> State {
        let mut fds = [0 as c_int; 2];
        // SAFETY: a valid two-int array.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(rc, 0, "pipe2");
        let mut v2 = [0u8; 16];
        v2[10] = 0xff;
        v2[11] = 0xff;
        v2[12..].copy_from_slice(&[192, 0, 2, 1]);
        State {
            link_layer: IBV_LINK_LAYER_ETHERNET,
            gids: vec![(v2, IBV_GID_TYPE_ROCE_V2)],
            events: VecDeque::new(),
            lost: false,
            qps: HashMap::new(),
            reported: HashMap::new(),
            completed: HashMap::new(),
            destroyed: Vec::new(),
            hung: Vec::new(),
            next_qpn: 0x11,
            next_handle: 1,
            hold_err: false,
            held: false,
            pipe: (fds[0], fds[1]),
        }
    }
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
static CHANGED: Condvar = Condvar::new();
static SERIAL: Mutex<()> = Mutex::new(());

fn state() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    f(state().as_mut().expect("fake::setup first"))
}

fn set_errno(e: c_int) {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// A fresh fake (one device, one RoCE v2 GID, no events) and its library; the guard keeps
/// other fake tests out until dropped.
pub(crate) fn setup() -> (MutexGuard<'static, ()>, VerbsLib) {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut s = state();
    if let Some(old) = s.take() {
        for fd in [old.pipe.0, old.pipe.1] {
            if fd >= 0 {
                // SAFETY: the old pipe's fds, not used any more (its device is gone).
                unsafe { libc::close(fd) };
            }
        }
    }
    *s = Some(State::new());
    drop(s);
    (guard, VerbsLib::fake(fns()))
}

/// Sets the port's link layer and GID table (GID, `IBV_GID_TYPE_*`).
pub(crate) fn set_gids(link_layer: u8, gids: &[([u8; 16], u32)]) {
    with(|s| {
        s.link_layer = link_layer;
        s.gids = gids.to_vec();
    });
}

/// Queues an async event and makes the async fd readable.
pub(crate) fn push_event(kind: u32, elem: Elem) {
    with(|s| {
        s.events.push_back((kind, elem));
        // SAFETY: one byte from a live local to the pipe's write end.
        unsafe { libc::write(s.pipe.1, [1u8].as_ptr().cast(), 1) };
    });
}

/// The device is gone: the async fd hangs up, `ibv_get_async_event` fails with `EIO`.
pub(crate) fn lose_device() {
    with(|s| {
        s.lost = true;
        if s.pipe.1 >= 0 {
            // SAFETY: the write end, closed once.
            unsafe { libc::close(s.pipe.1) };
            s.pipe.1 = -1;
        }
    });
}

/// QPs destroyed so far: (QP number, name of the thread that destroyed it).
pub(crate) fn destroyed() -> Vec<(u32, String)> {
    with(|s| s.destroyed.clone())
}

/// QPs whose destroy waited in vain for their async events to be acknowledged.
pub(crate) fn hung() -> Vec<u32> {
    with(|s| s.hung.clone())
}

/// While `on`, `ibv_modify_qp` to ERR blocks.
pub(crate) fn hold_err(on: bool) {
    with(|s| {
        s.hold_err = on;
        if !on {
            s.held = false;
        }
    });
    CHANGED.notify_all();
}

/// Waits (up to `limit`) until a thread is blocked in a held `ibv_modify_qp` to ERR.
pub(crate) fn wait_held(limit: Duration) -> bool {
    wait_for(limit, |s| s.held)
}

/// Waits (up to `limit`) until `f` holds of the state.
fn wait_for(limit: Duration, f: impl Fn(&State) -> bool) -> bool {
    let end = Instant::now() + limit;
    let mut g = state();
    loop {
        if f(g.as_ref().expect("fake::setup first")) {
            return true;
        }
        let now = Instant::now();
        if now >= end {
            return false;
        }
        g = CHANGED
            .wait_timeout(g, end - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// Waits (up to `limit`) until QP `qpn` was destroyed.
pub(crate) fn wait_destroyed(qpn: u32, limit: Duration) -> bool {
    wait_for(limit, |s| s.destroyed.iter().any(|(q, _)| *q == qpn))
}

fn boxed<T>() -> *mut T {
    // SAFETY: used for verbs structures only, whose fields are pointers, integers, opaque
    // bytes and optional function pointers: all-zero is valid.
    Box::into_raw(Box::new(unsafe { std::mem::zeroed::<T>() }))
}

/// # Safety
/// `p` came from [`boxed`] and is freed once.
unsafe fn free<T>(p: *mut T) {
    // SAFETY: the caller's promise.
    drop(unsafe { Box::from_raw(p) });
}

unsafe extern "C" fn get_device_list(n: *mut c_int) -> *mut *mut ibv_device {
    let dev: *mut ibv_device = boxed();
    // SAFETY: a fresh device.
    let d = unsafe { &mut *dev };
    d.node_type = IBV_NODE_CA;
    d.transport_type = IBV_TRANSPORT_IB;
    for (i, b) in b"fake0".iter().enumerate() {
        d.name[i] = *b as c_char;
    }
    // SAFETY: the caller's out-pointer.
    unsafe { *n = 1 };
    // Leaked with the device (a few bytes per open, in tests).
    Box::leak(vec![dev, std::ptr::null_mut()].into_boxed_slice()).as_mut_ptr()
}

unsafe extern "C" fn free_device_list(_: *mut *mut ibv_device) {}

unsafe extern "C" fn poll_cq(_: *mut ibv_cq, _: c_int, _: *mut ibv_wc) -> c_int {
    0
}

unsafe extern "C" fn req_notify_cq(_: *mut ibv_cq, _: c_int) -> c_int {
    0
}

unsafe extern "C" fn post_send(
    _: *mut ibv_qp,
    _: *mut ibv_send_wr,
    _: *mut *mut ibv_send_wr,
) -> c_int {
    0
}

unsafe extern "C" fn post_recv(
    _: *mut ibv_qp,
    _: *mut ibv_recv_wr,
    _: *mut *mut ibv_recv_wr,
) -> c_int {
    0
}

unsafe extern "C" fn open_device(dev: *mut ibv_device) -> *mut ibv_context {
    let ctx: *mut ibv_context = boxed();
    // SAFETY: a fresh context.
    let c = unsafe { &mut *ctx };
    c.device = dev;
    c.ops.poll_cq = Some(poll_cq);
    c.ops.req_notify_cq = Some(req_notify_cq);
    c.ops.post_send = Some(post_send);
    c.ops.post_recv = Some(post_recv);
    c.cmd_fd = -1;
    c.async_fd = with(|s| s.pipe.0);
    ctx
}

unsafe extern "C" fn close_device(ctx: *mut ibv_context) -> c_int {
    // SAFETY: from open_device, closed once.
    unsafe { free(ctx) };
    0
}

unsafe extern "C" fn query_device(_: *mut ibv_context, a: *mut ibv_device_attr) -> c_int {
    // SAFETY: the caller's out-struct.
    let a = unsafe { &mut *a };
    a.max_qp = 64;
    a.max_qp_wr = 1024;
    a.max_sge = 4;
    a.max_cq = 64;
    a.max_cqe = 4096;
    a.max_mr = 64;
    a.max_pd = 64;
    a.max_mr_size = 1 << 30;
    a.phys_port_cnt = 1;
    0
}

unsafe extern "C" fn query_port(_: *mut ibv_context, port: u8, a: *mut ibv_port_attr) -> c_int {
    if port != 1 {
        return libc::EINVAL;
    }
    // SAFETY: the caller's out-struct.
    let a = unsafe { &mut *a };
    with(|s| {
        a.state = IBV_PORT_ACTIVE;
        a.max_mtu = IBV_MTU_4096;
        a.active_mtu = IBV_MTU_1024;
        a.gid_tbl_len = s.gids.len() as c_int;
        a.link_layer = s.link_layer;
        a.lid = if s.link_layer == IBV_LINK_LAYER_INFINIBAND {
            7
        } else {
            0
        };
    });
    0
}

unsafe extern "C" fn query_gid(_: *mut ibv_context, _: u8, i: c_int, g: *mut ibv_gid) -> c_int {
    match with(|s| usize::try_from(i).ok().and_then(|i| s.gids.get(i).copied())) {
        Some((raw, _)) => {
            // SAFETY: the caller's out-union.
            unsafe { *g = ibv_gid { raw } };
            0
        }
        None => {
            set_errno(libc::EINVAL);
            -1
        }
    }
}

unsafe extern "C" fn query_gid_ex(
    _: *mut ibv_context,
    port: u32,
    i: u32,
    e: *mut ibv_gid_entry,
    _: u32,
    size: usize,
) -> c_int {
    if size < std::mem::size_of::<ibv_gid_entry>() {
        return libc::EINVAL;
    }
    match with(|s| s.gids.get(i as usize).copied()) {
        Some((raw, ty)) => {
            // SAFETY: the caller's out-struct, of the size checked.
            unsafe {
                *e = ibv_gid_entry {
                    gid: ibv_gid { raw },
                    gid_index: i,
                    port_num: port,
                    gid_type: ty,
                    ndev_ifindex: 0,
                }
            };
            0
        }
        None => libc::ENODATA,
    }
}

unsafe extern "C" fn alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    let pd: *mut ibv_pd = boxed();
    // SAFETY: a fresh PD.
    unsafe { (*pd).context = ctx };
    pd
}

unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    // SAFETY: from alloc_pd, freed once.
    unsafe { free(pd) };
    0
}

unsafe extern "C" fn reg_mr(_: *mut ibv_pd, _: *mut c_void, _: usize, _: c_int) -> *mut ibv_mr {
    set_errno(libc::ENOSYS);
    std::ptr::null_mut()
}

unsafe extern "C" fn reg_mr_iova2(
    _: *mut ibv_pd,
    _: *mut c_void,
    _: usize,
    _: u64,
    _: c_uint,
) -> *mut ibv_mr {
    set_errno(libc::ENOSYS);
    std::ptr::null_mut()
}

unsafe extern "C" fn dereg_mr(_: *mut ibv_mr) -> c_int {
    0
}

unsafe extern "C" fn create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    let ch: *mut ibv_comp_channel = boxed();
    // SAFETY: a fresh channel; eventfd(2) without pointers.
    unsafe {
        (*ch).context = ctx;
        (*ch).fd = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
    }
    ch
}

unsafe extern "C" fn destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    // SAFETY: from create_comp_channel, destroyed once (its eventfd with it).
    unsafe {
        libc::close((*ch).fd);
        free(ch);
    }
    0
}

unsafe extern "C" fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    _: *mut c_void,
    ch: *mut ibv_comp_channel,
    _: c_int,
) -> *mut ibv_cq {
    let cq: *mut ibv_cq = boxed();
    let handle = with(|s| {
        s.next_handle += 1;
        s.next_handle
    });
    // SAFETY: a fresh CQ.
    let c = unsafe { &mut *cq };
    c.context = ctx;
    c.channel = ch;
    c.cqe = cqe;
    c.handle = handle;
    cq
}

unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: from create_cq, destroyed once.
    unsafe { free(cq) };
    0
}

unsafe extern "C" fn get_cq_event(
    _: *mut ibv_comp_channel,
    _: *mut *mut ibv_cq,
    _: *mut *mut c_void,
) -> c_int {
    set_errno(libc::EAGAIN);
    -1
}

unsafe extern "C" fn ack_cq_events(_: *mut ibv_cq, _: c_uint) {}

unsafe extern "C" fn create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    let qp: *mut ibv_qp = boxed();
    let num = with(|s| {
        s.next_qpn += 1;
        s.qps.insert(s.next_qpn, qp as usize);
        s.next_qpn
    });
    // SAFETY: a fresh QP; the caller's attributes.
    unsafe {
        let q = &mut *qp;
        q.context = (*pd).context;
        q.pd = pd;
        q.send_cq = (*attr).send_cq;
        q.recv_cq = (*attr).recv_cq;
        q.qp_num = num;
        q.qp_type = IBV_QPT_RC;
    }
    qp
}

unsafe extern "C" fn modify_qp(_: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    // SAFETY: the caller's attributes.
    let to_err = mask as u32 & IBV_QP_STATE != 0 && unsafe { (*attr).qp_state } == IBV_QPS_ERR;
    if to_err {
        let mut g = state();
        loop {
            let s = g.as_mut().expect("fake::setup first");
            if !s.hold_err {
                break;
            }
            s.held = true;
            CHANGED.notify_all();
            g = CHANGED.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
    0
}

unsafe extern "C" fn query_qp(
    _: *mut ibv_qp,
    _: *mut ibv_qp_attr,
    _: c_int,
    _: *mut ibv_qp_init_attr,
) -> c_int {
    0
}

unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: a live QP of create_qp.
    let num = unsafe { (*qp).qp_num };
    let thread = std::thread::current().name().unwrap_or("?").to_owned();
    let end = Instant::now() + Duration::from_secs(2);
    let mut g = state();
    loop {
        let s = g.as_mut().expect("fake::setup first");
        if s.reported.get(&num) == s.completed.get(&num) {
            break;
        }
        let now = Instant::now();
        if now >= end {
            s.hung.push(num);
            break;
        }
        g = CHANGED
            .wait_timeout(g, end - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    let s = g.as_mut().expect("fake::setup first");
    s.events.retain(|(_, e)| *e != Elem::Qp(num));
    s.qps.remove(&num);
    s.destroyed.push((num, thread));
    drop(g);
    CHANGED.notify_all();
    // SAFETY: from create_qp, destroyed once.
    unsafe { free(qp) };
    0
}

unsafe extern "C" fn get_async_event(_: *mut ibv_context, ev: *mut ibv_async_event) -> c_int {
    let mut g = state();
    let s = g.as_mut().expect("fake::setup first");
    let Some((kind, elem)) = s.events.pop_front() else {
        set_errno(if s.lost { libc::EIO } else { libc::EAGAIN });
        return -1;
    };
    let mut b = [0u8; 1];
    // SAFETY: one byte into a live local from the pipe's (non-blocking) read end.
    unsafe { libc::read(s.pipe.0, b.as_mut_ptr().cast(), 1) };
    // SAFETY: the caller's out-struct.
    let ev = unsafe { &mut *ev };
    ev.event_type = kind;
    match elem {
        Elem::Qp(n) => {
            ev.element.qp = s
                .qps
                .get(&n)
                .map_or(std::ptr::null_mut(), |&p| p as *mut ibv_qp);
            *s.reported.entry(n).or_default() += 1;
        }
        Elem::Port(p) => ev.element.port_num = p,
        Elem::Device => ev.element.qp = std::ptr::null_mut(),
    }
    0
}

unsafe extern "C" fn ack_async_event(ev: *mut ibv_async_event) {
    // SAFETY: an event of get_async_event; its QP (if any) is live until acknowledged.
    let num = unsafe {
        let ev = &*ev;
        match ev.event_type {
            IBV_EVENT_QP_FATAL
            | IBV_EVENT_QP_REQ_ERR
            | IBV_EVENT_QP_ACCESS_ERR
            | IBV_EVENT_COMM_EST
            | IBV_EVENT_SQ_DRAINED
            | IBV_EVENT_PATH_MIG
            | IBV_EVENT_PATH_MIG_ERR
            | IBV_EVENT_QP_LAST_WQE_REACHED
                if !ev.element.qp.is_null() =>
            {
                Some((*ev.element.qp).qp_num)
            }
            _ => None,
        }
    };
    if let Some(n) = num {
        with(|s| *s.completed.entry(n).or_default() += 1);
        CHANGED.notify_all();
    }
}

unsafe extern "C" fn wc_status_str(_: c_uint) -> *const c_char {
    c"fake status".as_ptr()
}

fn fns() -> Fns {
    Fns {
        get_device_list,
        free_device_list,
        open_device,
        close_device,
        query_device,
        query_port,
        query_gid,
        alloc_pd,
        dealloc_pd,
        reg_mr,
        reg_mr_iova2,
        dereg_mr,
        create_comp_channel,
        destroy_comp_channel,
        create_cq,
        destroy_cq,
        get_cq_event,
        ack_cq_events,
        create_qp,
        modify_qp,
        query_qp,
        destroy_qp,
        get_async_event,
        ack_async_event,
        wc_status_str,
        query_gid_ex: Some(query_gid_ex),
    }
}
