//! librdmacm (`rdma_cm`, rdma-core 44) over `vrdma`'s connection manager: event channels,
//! CM ids, address and route resolution, listen / connect / accept / reject / disconnect,
//! and `rdma_create_qp` through this library's own `ibv_create_qp`.
//!
//! - **Device.** The first `rdma_bind_addr` or `rdma_resolve_addr` opens the first vrdma
//!   device once (through this library's `ibv_open_device`); every id uses that context
//!   (`id->verbs`), as librdmacm shares one context per device.
//! - **Events.** A channel is a pipe (its read end is `fd`, pollable) and a queue; each event
//!   is one byte in the pipe. Resolution events are queued at once (the address is the
//!   backend's: there is nothing to resolve). A listen runs a thread taking the backend's
//!   connection requests (`vrdma::Listener::get_request`) and queues `CONNECT_REQUEST` with a
//!   new id; `rdma_connect` runs the blocking `vrdma` call on a thread, `rdma_accept` runs it
//!   before it returns (the backend has the request's answer then: the program may destroy
//!   its listener), and they queue `ESTABLISHED` (or `REJECTED`, `UNREACHABLE`,
//!   `CONNECT_ERROR`); an established id
//!   has a thread waiting for the backend's `QpDisconnected` that queues `DISCONNECTED`.
//! - **Unsupported** (`rdma_create_ep`, `rdma_init_qp_attr`, `rdma_establish`, multicast,
//!   UD ids, ids without a channel, a QP not created by `rdma_create_qp`): -1 with errno
//!   `ENOSYS` or `EOPNOTSUPP`.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use verbs_abi::cma::*;
use verbs_abi::verbs::*;

use crate::device::Ctx;
use crate::errno::*;
use crate::qp::Qp;
use crate::{fail, guard, set_errno};

/// How long a connect waits for the peer's answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the listen and disconnection threads look whether their id is going away.
const POLL: Duration = Duration::from_millis(200);

/// -1 with errno `e` (librdmacm's convention for `int` functions).
fn err(e: i32) -> c_int {
    set_errno(e);
    -1
}

/// An event channel: the program sees `ch` (its `fd`, the pipe's read end).
#[repr(C)]
struct Channel {
    ch: rdma_event_channel,
    pipe: Arc<Pipe>,
}

/// A channel's pipe and queue. `rdma_get_cm_event` holds a reference while it blocks: a
/// channel destroyed under a blocked reader keeps its pipe (both ends) until that reader
/// returns (which it then never does: nothing writes), and one destroyed with no reader
/// closes both ends at once.
struct Pipe {
    rd: OwnedFd,
    wr: OwnedFd,
    q: Mutex<VecDeque<usize>>,
}

impl Drop for Pipe {
    fn drop(&mut self) {
        for e in self
            .q
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            // SAFETY: events queued by `push`, never handed out.
            drop(unsafe { Box::from_raw(e as *mut Event) });
        }
    }
}

/// An event with the private data its `param.conn.private_data` points at.
#[repr(C)]
struct Event {
    ev: rdma_cm_event,
    data: Vec<u8>,
}

/// A CM id: the program sees `id`.
#[repr(C)]
struct Id {
    id: rdma_cm_id,
    st: Mutex<IdState>,
    /// Set by `rdma_destroy_id`: the id's threads stop.
    stop: Arc<AtomicBool>,
}

#[derive(Default)]
struct IdState {
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    listener: Option<std::thread::JoinHandle<()>>,
    request: Option<vrdma::ConnRequest>,
    /// The id's threads; `rdma_destroy_id` joins them.
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Set (under the lock) by `rdma_destroy_id` as it takes `threads`: no thread starts
    /// after that, so every thread that did start is joined before the id is freed.
    closing: bool,
}

/// A pointer handed to a thread (the program keeps the object alive while the id is).
#[derive(Clone, Copy)]
struct Ptr(usize);

impl Id {
    /// # Safety
    /// `p` must be NULL or a live id of this library.
    unsafe fn of<'a>(p: *mut rdma_cm_id) -> Option<&'a Id> {
        // A misaligned pointer is no id of ours (an error, not an abort).
        if p.is_null() || (p as usize) % align_of::<Id>() != 0 {
            if !p.is_null() && std::env::var_os("VRDMA_VERBS_LOG").is_some() {
                eprintln!("vrdma-verbs: rdma_cm: {p:?} is not a CM id");
            }
            return None;
        }
        // SAFETY: the caller's contract.
        Some(unsafe { &*p.cast::<Id>() })
    }

    /// A new id on `channel` (RC, port 1), boxed: the program's pointer to it.
    fn create(
        channel: *mut rdma_event_channel,
        context: *mut c_void,
        ps: rdma_port_space,
        fill: impl FnOnce(&mut rdma_cm_id),
        st: IdState,
    ) -> *mut rdma_cm_id {
        // SAFETY: all-zero is a valid rdma_cm_id (NULL pointers, zero addresses).
        let mut id: rdma_cm_id = unsafe { std::mem::zeroed() };
        id.channel = channel;
        id.context = context;
        id.ps = ps;
        id.port_num = 1;
        id.qp_type = IBV_QPT_RC;
        fill(&mut id);
        Box::into_raw(Box::new(Id {
            id,
            st: Mutex::new(st),
            stop: Arc::new(AtomicBool::new(false)),
        }))
        .cast()
    }

    fn state(&self) -> MutexGuard<'_, IdState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on a thread of this id (rdma_destroy_id joins it): `Ok(false)` without
    /// starting it once the id is being destroyed. The thread starts and is registered under
    /// the id's lock, which `rdma_destroy_id` takes to close the registry: a thread is either
    /// among those it joins or never started (a connect thread that establishes the id while
    /// it is destroyed starts no disconnection thread, which would outlive the id).
    fn spawn(&self, name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<bool> {
        let mut st = self.state();
        if st.closing {
            return Ok(false);
        }
        let t = std::thread::Builder::new().name(name.into()).spawn(f)?;
        st.threads.push(t);
        Ok(true)
    }
}

/// Queues an event for `id` on its channel.
///
/// # Safety
/// `id` (and `listen_id`, if not NULL) must be live ids of this library with live channels.
unsafe fn push(
    id: *mut rdma_cm_id,
    listen_id: *mut rdma_cm_id,
    kind: rdma_cm_event_type,
    status: c_int,
    data: &[u8],
    ird_ord: (u8, u8),
) {
    // SAFETY: the caller's contract.
    let chp = unsafe {
        if listen_id.is_null() {
            (*id).channel
        } else {
            (*listen_id).channel
        }
    };
    if chp.is_null() {
        return;
    }
    // SAFETY: channels of ids are this library's.
    let ch = unsafe { &*chp.cast::<Channel>() }.pipe.as_ref();
    let mut e = Box::new(Event {
        // SAFETY: all-zero is a valid event (NULL pointers, integers).
        ev: unsafe { std::mem::zeroed() },
        data: data.to_vec(),
    });
    e.ev.id = id;
    e.ev.listen_id = listen_id;
    e.ev.event = kind;
    e.ev.status = status;
    let conn = rdma_conn_param {
        private_data: if e.data.is_empty() {
            std::ptr::null()
        } else {
            e.data.as_ptr().cast()
        },
        private_data_len: e.data.len().min(255) as u8,
        responder_resources: ird_ord.0,
        initiator_depth: ird_ord.1,
        ..Default::default()
    };
    e.ev.param.conn = conn;
    ch.q.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push_back(Box::into_raw(e) as usize);
    let _ = rustix::io::write(&ch.wr, &[1]);
}

/// Queues `kind` with `status` and no private data for `id` on its own channel.
///
/// # Safety
/// As [`push`].
unsafe fn push_own(id: *mut rdma_cm_id, kind: rdma_cm_event_type, status: c_int) {
    // SAFETY: the caller's contract.
    unsafe { push(id, std::ptr::null_mut(), kind, status, &[], (0, 0)) }
}

/// Queues `CONNECT_ERROR` for `id` after `what` failed with `e` (status: -errno).
///
/// # Safety
/// As [`push`].
unsafe fn push_connect_error(id: *mut rdma_cm_id, what: &str, e: &vrdma::Error) {
    let code = fail(what, e);
    // SAFETY: the caller's contract.
    unsafe { push_own(id, RDMA_CM_EVENT_CONNECT_ERROR, -code) }
}

/// The responder resources and initiator depth of an event, as librdmacm's `u8`s.
fn ird_ord(info: &vrdma::CmInfo) -> (u8, u8) {
    (info.ird.min(255) as u8, info.ord.min(255) as u8)
}

fn sockaddr_of(sa: *const sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the program's sockaddr; the family says how long it is.
    let fam = unsafe { (*sa).sa_family } as i32;
    match fam {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in.
            let s = unsafe { sa.cast::<sockaddr_in>().read_unaligned() };
            Some(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::from(u32::from_be(s.sin_addr))),
                u16::from_be(s.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
            let s = unsafe { sa.cast::<sockaddr_in6>().read_unaligned() };
            Some(SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from(s.sin6_addr)),
                u16::from_be(s.sin6_port),
            ))
        }
        _ => None,
    }
}

fn sockaddr_to(a: SocketAddr) -> rdma_sockaddr {
    // SAFETY: all-zero is a valid sockaddr union.
    let mut u: rdma_sockaddr = unsafe { std::mem::zeroed() };
    match a.ip() {
        IpAddr::V4(ip) => {
            u.sin = sockaddr_in {
                sin_family: libc::AF_INET as u16,
                sin_port: a.port().to_be(),
                sin_addr: u32::from(ip).to_be(),
                sin_zero: [0; 8],
            }
        }
        IpAddr::V6(ip) => {
            u.sin6 = sockaddr_in6 {
                sin6_family: libc::AF_INET6 as u16,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: ip.octets(),
                sin6_scope_id: 0,
            }
        }
    }
    u
}

/// The context every id uses: the first vrdma device, opened once.
fn device() -> Result<*mut ibv_context, i32> {
    static DEV: OnceLock<usize> = OnceLock::new();
    static OPENING: Mutex<()> = Mutex::new(());
    if let Some(&c) = DEV.get() {
        return Ok(c as *mut ibv_context);
    }
    let _g = OPENING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&c) = DEV.get() {
        return Ok(c as *mut ibv_context);
    }
    let mut n: c_int = 0;
    // SAFETY: this library's own entry points, with valid arguments.
    let c = unsafe {
        let list = crate::device::vrdma_verbs_ibv_get_device_list(&mut n);
        if list.is_null() || n == 0 {
            if !list.is_null() {
                crate::device::vrdma_verbs_ibv_free_device_list(list);
            }
            return Err(ENODEV);
        }
        let c = crate::device::vrdma_verbs_ibv_open_device(*list);
        crate::device::vrdma_verbs_ibv_free_device_list(list);
        c
    };
    if c.is_null() {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(ENODEV));
    }
    // SAFETY: just opened by this library.
    if let Some(ctx) = unsafe { Ctx::of(c) } {
        ctx.watch.cm_active.store(true, Ordering::Release);
    }
    let _ = DEV.set(c as usize);
    Ok(c)
}

/// The backend's address (the local address of every id), unspecified when it has none.
fn backend_ip(ctx: &Ctx) -> IpAddr {
    let raw = ctx.vr.backend_addr_raw();
    let v6 = Ipv6Addr::from(raw);
    v6.to_ipv4_mapped()
        .map(IpAddr::V4)
        .unwrap_or(IpAddr::V6(v6))
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(std::ptr::null_mut(), || {
        let (rd, wr) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
            Ok(p) => p,
            Err(e) => {
                set_errno(e.raw_os_error());
                return std::ptr::null_mut();
            }
        };
        let ch = Box::new(Channel {
            ch: rdma_event_channel { fd: rd.as_raw_fd() },
            pipe: Arc::new(Pipe {
                rd,
                wr,
                q: Mutex::new(VecDeque::new()),
            }),
        });
        Box::into_raw(ch).cast()
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    guard((), || {
        if ch.is_null() {
            return;
        }
        // SAFETY: from Box::into_raw in rdma_create_event_channel, destroyed once.
        let ch = unsafe { Box::from_raw(ch.cast::<Channel>()) };
        // The pipe's ends close and its queued events go, unless a thread is blocked in
        // rdma_get_cm_event on this channel: that thread holds the pipe, which it keeps
        // blocking on, as on librdmacm's closed fd, instead of reading EOF (rping destroys its
        // channel while its event thread waits there, and exits). The pipe goes when the
        // last reader returns.
        drop(ch);
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_create_id(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    guard(err(EIO), || {
        if out.is_null() {
            return err(EINVAL);
        }
        if ch.is_null() || !matches!(ps, RDMA_PS_TCP | RDMA_PS_IB) {
            // Synchronous ids (no channel) and UD port spaces.
            return err(EOPNOTSUPP);
        }
        let p = Id::create(ch, context, ps, |_| {}, IdState::default());
        // SAFETY: the caller's out pointer.
        unsafe { *out = p };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_destroy_id(p: *mut rdma_cm_id) -> c_int {
    guard(err(EIO), || {
        // SAFETY: C contract.
        let Some(id) = (unsafe { Id::of(p) }) else {
            return err(EINVAL);
        };
        id.stop.store(true, Ordering::Release);
        let (listener, threads, request) = {
            let mut st = id.state();
            st.closing = true;
            (
                st.listener.take(),
                std::mem::take(&mut st.threads),
                st.request.take(),
            )
        };
        // An unanswered request is rejected.
        drop(request);
        for t in listener.into_iter().chain(threads) {
            let _ = t.join();
        }
        // Events of this id not yet handed out go (their bytes in the pipe are skipped).
        // A connection request of a listening id the program never saw goes with its new
        // id (rejected); those it took stay the program's to accept or reject.
        let mut unseen = Vec::new();
        // SAFETY: a live id; its channel is live (the program destroys ids first).
        let chp = unsafe { (*p).channel };
        if !chp.is_null() {
            // SAFETY: channels of ids are this library's.
            let ch = unsafe { &*chp.cast::<Channel>() };
            ch.pipe
                .q
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|&e| {
                    // SAFETY: queued events are live until handed out.
                    let ev = unsafe { &(*(e as *const Event)).ev };
                    let mine = ev.id == p || ev.listen_id == p;
                    if mine {
                        if ev.listen_id == p && ev.event == RDMA_CM_EVENT_CONNECT_REQUEST {
                            unseen.push(Ptr(ev.id as usize));
                        }
                        // SAFETY: from Box::into_raw in `push`, never handed out.
                        drop(unsafe { Box::from_raw(e as *mut Event) });
                    }
                    !mine
                });
        }
        for c in unseen {
            // SAFETY: a request's id, created by the listen thread (joined above) and known
            // only to its event, which just went: no thread, no other event. Its request is
            // rejected as it drops.
            drop(unsafe { Box::from_raw(c.0 as *mut Id) });
        }
        // SAFETY: from Box::into_raw in rdma_create_id (or the listen thread), destroyed once.
        drop(unsafe { Box::from_raw(p.cast::<Id>()) });
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_migrate_id(
    p: *mut rdma_cm_id,
    ch: *mut rdma_event_channel,
) -> c_int {
    guard(err(EIO), || {
        if p.is_null() || ch.is_null() {
            return err(EINVAL);
        }
        // SAFETY: C contract: a live id; events already queued stay on the old channel.
        unsafe { (*p).channel = ch };
        0
    })
}

/// What binding or resolving needs: the id, the address, the device (or the errno).
///
/// # Safety
/// As [`Id::of`]; `addr` must be NULL or the program's sockaddr.
unsafe fn id_addr_device<'a>(
    p: *mut rdma_cm_id,
    addr: *const sockaddr,
) -> Result<(&'a Id, SocketAddr, *mut ibv_context), i32> {
    // SAFETY: the caller's contract.
    let id = unsafe { Id::of(p) }.ok_or(EINVAL)?;
    let a = sockaddr_of(addr).ok_or(EAFNOSUPPORT)?;
    Ok((id, a, device()?))
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_bind_addr(
    p: *mut rdma_cm_id,
    addr: *mut sockaddr,
) -> c_int {
    guard(err(EIO), || {
        // SAFETY: C contract.
        let (id, a, c) = match unsafe { id_addr_device(p, addr) } {
            Ok(t) => t,
            Err(e) => return err(e),
        };
        id.state().local = Some(a);
        // SAFETY: the program's id is ours; plain fields.
        unsafe {
            (*p).verbs = c;
            (*p).route.addr.src = sockaddr_to(a);
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_resolve_addr(
    p: *mut rdma_cm_id,
    src: *mut sockaddr,
    dst: *mut sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard(err(EIO), || {
        // SAFETY: C contract.
        let (id, peer, c) = match unsafe { id_addr_device(p, dst) } {
            Ok(t) => t,
            Err(e) => return err(e),
        };
        // SAFETY: just opened.
        let Some(ctx) = (unsafe { Ctx::of(c) }) else {
            return err(ENODEV);
        };
        let local = sockaddr_of(src).unwrap_or(SocketAddr::new(backend_ip(ctx), 0));
        {
            let mut st = id.state();
            st.peer = Some(peer);
            st.local = Some(local);
        }
        // SAFETY: the program's id is ours; its channel is live.
        unsafe {
            (*p).verbs = c;
            (*p).route.addr.src = sockaddr_to(local);
            (*p).route.addr.dst = sockaddr_to(peer);
            push_own(p, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_resolve_route(
    p: *mut rdma_cm_id,
    _timeout_ms: c_int,
) -> c_int {
    guard(err(EIO), || {
        // SAFETY: C contract.
        let Some(id) = (unsafe { Id::of(p) }) else {
            return err(EINVAL);
        };
        if id.state().peer.is_none() {
            return err(EINVAL);
        }
        // SAFETY: a live id with a live channel.
        unsafe { push_own(p, RDMA_CM_EVENT_ROUTE_RESOLVED, 0) };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_listen(p: *mut rdma_cm_id, backlog: c_int) -> c_int {
    guard(err(EIO), || {
        // SAFETY: C contract.
        let Some(id) = (unsafe { Id::of(p) }) else {
            return err(EINVAL);
        };
        let mut st = id.state();
        let Some(local) = st.local else {
            return err(EINVAL);
        };
        if st.listener.is_some() {
            return err(EINVAL);
        }
        // SAFETY: bound ids have our context.
        let Some(ctx) = (unsafe { Ctx::of(id.id.verbs) }) else {
            return err(EINVAL);
        };
        let backlog = backlog.max(0) as u32;
        let l = if local.ip().is_unspecified() {
            ctx.vr.listen(local.port(), backlog)
        } else {
            ctx.vr.listen_on(local, backlog)
        };
        let l = match l {
            Ok(l) => l,
            Err(e) => {
                let code = match e.status() {
                    Some(vrdma::Status::AddressInUse) => EADDRINUSE,
                    _ => crate::errno_of(&e),
                };
                fail("rdma_listen", &e);
                return err(code);
            }
        };
        let stop = id.stop.clone();
        let me = Ptr(p as usize);
        let t = std::thread::Builder::new()
            .name("vrdma-cm-listen".into())
            .spawn(move || listen_loop(me, l, stop));
        match t {
            Ok(t) => {
                st.listener = Some(t);
                0
            }
            Err(_) => err(EAGAIN),
        }
    })
}

/// Takes the listener's connection requests until the id goes: a new id and a
/// `CONNECT_REQUEST` event for each.
fn listen_loop(me: Ptr, l: vrdma::Listener, stop: Arc<AtomicBool>) {
    let lp = me.0 as *mut rdma_cm_id;
    while !stop.load(Ordering::Acquire) {
        let req = match l.get_request(Some(POLL)) {
            Ok(r) => r,
            Err(vrdma::Error::Timeout { .. }) => continue,
            Err(e) => {
                fail("rdma_listen: connection request", &e);
                return;
            }
        };
        // SAFETY: the listening id lives until rdma_destroy_id, which stops this thread first.
        let parent = unsafe { &*lp };
        let info = req.info().clone();
        let child = Id::create(
            parent.channel,
            parent.context,
            parent.ps,
            |id| {
                id.verbs = parent.verbs;
                id.route.addr.src = sockaddr_to(info.local);
                id.route.addr.dst = sockaddr_to(info.peer);
            },
            IdState {
                local: Some(info.local),
                peer: Some(info.peer),
                request: Some(req),
                ..Default::default()
            },
        );
        // SAFETY: both ids are live; the listening id's channel is live.
        unsafe {
            push(
                child,
                lp,
                RDMA_CM_EVENT_CONNECT_REQUEST,
                0,
                &info.private_data,
                ird_ord(&info),
            )
        };
    }
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_create_qp(
    p: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard(err(EIO), || {
        if p.is_null() || init.is_null() {
            return err(EINVAL);
        }
        // SAFETY: C contract: a live id of ours.
        let id = unsafe { &mut *p };
        if id.verbs.is_null() || !id.qp.is_null() {
            return err(EINVAL);
        }
        let pd = if pd.is_null() {
            // SAFETY: the id's context is ours.
            let pd = unsafe { crate::mr::vrdma_verbs_ibv_alloc_pd(id.verbs) };
            if pd.is_null() {
                return -1;
            }
            id.pd = pd;
            pd
        } else {
            // SAFETY: the program's PD.
            if unsafe { (*pd).context } != id.verbs {
                return err(EINVAL);
            }
            pd
        };
        // SAFETY: this library's ibv_create_qp with the program's attributes.
        let qp = unsafe { crate::qp::vrdma_verbs_ibv_create_qp(pd, init) };
        if qp.is_null() {
            return -1;
        }
        id.qp = qp;
        id.pd = pd;
        // SAFETY: the program's attributes.
        let ia = unsafe { &*init };
        id.send_cq = ia.send_cq;
        id.recv_cq = ia.recv_cq;
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_destroy_qp(p: *mut rdma_cm_id) {
    guard((), || {
        if p.is_null() {
            return;
        }
        // SAFETY: C contract: a live id of ours.
        let id = unsafe { &mut *p };
        if !id.qp.is_null() {
            // SAFETY: the QP rdma_create_qp made.
            unsafe { crate::qp::vrdma_verbs_ibv_destroy_qp(id.qp) };
            id.qp = std::ptr::null_mut();
        }
    })
}

/// The private data of a connection parameter block.
fn private_data(param: *const rdma_conn_param) -> Vec<u8> {
    if param.is_null() {
        return Vec::new();
    }
    // SAFETY: the program's parameters.
    let c = unsafe { &*param };
    if c.private_data.is_null() || c.private_data_len == 0 {
        return Vec::new();
    }
    // SAFETY: `private_data_len` bytes at `private_data`.
    unsafe {
        std::slice::from_raw_parts(c.private_data.cast::<u8>(), usize::from(c.private_data_len))
    }
    .to_vec()
}

/// After establishment: the QP is in RTS, `ESTABLISHED` is queued, and a thread queues
/// `DISCONNECTED` when the connection ends.
///
/// # Safety
/// `p` must be a live id of ours with a QP.
unsafe fn established(p: *mut rdma_cm_id, info: &vrdma::CmInfo) {
    // SAFETY: the caller's contract.
    let (id, raw) = unsafe { (Id::of(p).expect("live"), &*p) };
    // SAFETY: the id's QP is ours.
    let Some(qp) = (unsafe { Qp::of(raw.qp) }) else {
        return;
    };
    // SAFETY: the QP's own pointer.
    unsafe { qp.cm_established(raw.qp) };
    // SAFETY: the caller's contract.
    unsafe {
        push(
            p,
            std::ptr::null_mut(),
            RDMA_CM_EVENT_ESTABLISHED,
            0,
            &info.private_data,
            ird_ord(info),
        )
    };
    // SAFETY: the id's context is ours.
    let Some(ctx) = (unsafe { Ctx::of(raw.verbs) }) else {
        return;
    };
    let vr = ctx.vr.clone();
    let handle = qp.qp.handle;
    let stop = id.stop.clone();
    let me = Ptr(p as usize);
    let _ = id.spawn("vrdma-cm-disconnect", move || {
        let pick = |e: &vrdma::AsyncEvent| {
            e.handle == handle && e.kind == vrdma::EventKind::QpDisconnected
        };
        while !stop.load(Ordering::Acquire) {
            match vr.wait_async_event(pick, POLL) {
                Ok(None) => continue,
                Ok(Some(_)) | Err(_) => {
                    // SAFETY: the id lives until rdma_destroy_id, which joins this thread.
                    unsafe { push_own(me.0 as *mut rdma_cm_id, RDMA_CM_EVENT_DISCONNECTED, 0) };
                    return;
                }
            }
        }
    });
}

/// Runs `call` (a blocking CM call of `p`'s QP) on a thread of the id: 0, or -1 with
/// errno `EAGAIN` when no thread can be started.
fn spawn_on_qp(
    id: &Id,
    p: *mut rdma_cm_id,
    name: &str,
    call: impl FnOnce(*mut rdma_cm_id, &Qp) + Send + 'static,
) -> c_int {
    let me = Ptr(p as usize);
    let t = id.spawn(name, move || {
        let p = me.0 as *mut rdma_cm_id;
        // SAFETY: the id lives until rdma_destroy_id, which joins this thread.
        let Some(qp) = (unsafe { Qp::of((*p).qp) }) else {
            return;
        };
        call(p, qp);
    });
    match t {
        Ok(true) => 0,
        // The program is destroying the id meanwhile.
        Ok(false) => err(EINVAL),
        Err(_) => err(EAGAIN),
    }
}

/// What connecting or accepting needs: the id, with a QP of `rdma_create_qp`, and the
/// private data of `param` (or the errno).
///
/// # Safety
/// As [`Id::of`]; `param` must be NULL or the program's parameters.
unsafe fn id_qp_data<'a>(
    p: *mut rdma_cm_id,
    param: *const rdma_conn_param,
) -> Result<(&'a Id, Vec<u8>), i32> {
    // SAFETY: the caller's contract.
    let id = unsafe { Id::of(p) }.ok_or(EINVAL)?;
    if id.id.qp.is_null() {
        // A QP the program created itself (`qp_num` in the parameters).
        return Err(EOPNOTSUPP);
    }
    let data = private_data(param);
    if data.len() > vrdma::MAX_PRIVATE_DATA {
        return Err(EINVAL);
    }
    Ok((id, data))
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_connect(
    p: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    guard(err(EIO), || {
        // SAFETY: C contract.
        let (id, data) = match unsafe { id_qp_data(p, param) } {
            Ok(t) => t,
            Err(e) => return err(e),
        };
        let Some(peer) = id.state().peer else {
            return err(EINVAL);
        };
        spawn_on_qp(id, p, "vrdma-cm-connect", move |p, qp| {
            let r = qp.cm_connect(peer, &data, CONNECT_TIMEOUT);
            // SAFETY: the id lives until rdma_destroy_id, which joins this thread.
            unsafe {
                match r {
                    Ok(info) => established(p, &info),
                    Err(vrdma::Error::ConnectRejected { private_data, .. }) => {
                        // 28: IB_CM_REJ_CONSUMER_DEFINED, what librdmacm reports for a
                        // peer's rdma_reject.
                        push(
                            p,
                            std::ptr::null_mut(),
                            RDMA_CM_EVENT_REJECTED,
                            28,
                            &private_data,
                            (0, 0),
                        )
                    }
                    Err(e @ (vrdma::Error::Unreachable { .. } | vrdma::Error::Timeout { .. })) => {
                        fail("rdma_connect", &e);
                        push_own(p, RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT)
                    }
                    Err(e) => push_connect_error(p, "rdma_connect", &e),
                }
            }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_accept(
    p: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    guard(err(EIO), || {
        // SAFETY: C contract.
        let (id, data) = match unsafe { id_qp_data(p, param) } {
            Ok(t) => t,
            Err(e) => return err(e),
        };
        let Some(req) = id.state().request.take() else {
            return err(EINVAL);
        };
        // SAFETY: the id has a QP of rdma_create_qp (id_qp_data).
        let Some(qp) = (unsafe { Qp::of((*p).qp) }) else {
            return err(EINVAL);
        };
        // The backend's Accept and the wait for the connection run here, not on a thread:
        // when rdma_accept returns, the request is the connection's, no longer the
        // listener's. perftest -R destroys its listening id right after rdma_accept; a
        // listener closed before the backend has the Accept takes its requests with it
        // (they are rejected), and the client fails. Establishing needs nothing more from
        // this program (the backend moves both QPs to RTS), so waiting here cannot deadlock.
        let r = qp.cm_accept(req, &data);
        // SAFETY: a live id of ours with a QP and a live channel.
        unsafe {
            match r {
                Ok(info) => established(p, &info),
                Err(e) => push_connect_error(p, "rdma_accept", &e),
            }
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_reject(
    p: *mut rdma_cm_id,
    data: *const c_void,
    len: u8,
) -> c_int {
    guard(err(EIO), || {
        // SAFETY: C contract.
        let Some(id) = (unsafe { Id::of(p) }) else {
            return err(EINVAL);
        };
        let Some(req) = id.state().request.take() else {
            return err(EINVAL);
        };
        let bytes = if data.is_null() || len == 0 {
            Vec::new()
        } else {
            // SAFETY: `len` bytes at `data`.
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }.to_vec()
        };
        match req.reject(&bytes) {
            Ok(()) => 0,
            Err(e) => err(fail("rdma_reject", &e)),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_disconnect(p: *mut rdma_cm_id) -> c_int {
    guard(err(EIO), || {
        // SAFETY: C contract.
        if unsafe { Id::of(p) }.is_none() {
            return err(EINVAL);
        }
        // SAFETY: a live id.
        let qp = unsafe { (*p).qp };
        if qp.is_null() {
            return err(EINVAL);
        }
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_ERR,
            ..Default::default()
        };
        // The move to ERR sends the backend's Disconnect and flushes the QP's work requests;
        // both ends then get `DISCONNECTED`. A connection the peer ended already is no error.
        // SAFETY: the id's QP is ours.
        let _ =
            unsafe { crate::qp::vrdma_verbs_ibv_modify_qp(qp, &mut attr, IBV_QP_STATE as c_int) };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_get_cm_event(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_event,
) -> c_int {
    guard(err(EIO), || {
        if ch.is_null() || out.is_null() {
            return err(EINVAL);
        }
        // SAFETY: C contract: a channel of ours. Its pipe is held while this call blocks
        // (rdma_destroy_event_channel may free the channel meanwhile).
        let ch = unsafe { &*ch.cast::<Channel>() }.pipe.clone();
        // One byte per event: blocks until one is queued (EAGAIN on a non-blocking fd).
        // A byte whose event went with its id (rdma_destroy_id) is skipped.
        let mut b = [0u8; 1];
        let e = loop {
            match rustix::io::read(&ch.rd, &mut b) {
                Ok(1) => {}
                Ok(_) => return err(ENODEV),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return err(e.raw_os_error()),
            }
            if let Some(e) = ch.q.lock().unwrap_or_else(|e| e.into_inner()).pop_front() {
                break e;
            }
        };
        let e = e as *mut Event;
        // SAFETY: the event's id is live (the program destroys ids after their events); the
        // caller's out pointer.
        unsafe {
            let id = (*e).ev.id;
            if !id.is_null() {
                (*id).event = e.cast();
            }
            *out = e.cast();
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_ack_cm_event(e: *mut rdma_cm_event) -> c_int {
    guard(err(EIO), || {
        if e.is_null() {
            return err(EINVAL);
        }
        // SAFETY: an event rdma_get_cm_event handed out (Box::into_raw in `push`), acked once.
        let ev = unsafe { Box::from_raw(e.cast::<Event>()) };
        let id = ev.ev.id;
        // SAFETY: the event's id is live.
        unsafe {
            if !id.is_null() && (*id).event == e {
                (*id).event = std::ptr::null_mut();
            }
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_event_str(kind: rdma_cm_event_type) -> *const c_char {
    let s: &'static [u8] = match kind {
        RDMA_CM_EVENT_ADDR_RESOLVED => b"RDMA_CM_EVENT_ADDR_RESOLVED\0",
        RDMA_CM_EVENT_ADDR_ERROR => b"RDMA_CM_EVENT_ADDR_ERROR\0",
        RDMA_CM_EVENT_ROUTE_RESOLVED => b"RDMA_CM_EVENT_ROUTE_RESOLVED\0",
        RDMA_CM_EVENT_ROUTE_ERROR => b"RDMA_CM_EVENT_ROUTE_ERROR\0",
        RDMA_CM_EVENT_CONNECT_REQUEST => b"RDMA_CM_EVENT_CONNECT_REQUEST\0",
        RDMA_CM_EVENT_CONNECT_RESPONSE => b"RDMA_CM_EVENT_CONNECT_RESPONSE\0",
        RDMA_CM_EVENT_CONNECT_ERROR => b"RDMA_CM_EVENT_CONNECT_ERROR\0",
        RDMA_CM_EVENT_UNREACHABLE => b"RDMA_CM_EVENT_UNREACHABLE\0",
        RDMA_CM_EVENT_REJECTED => b"RDMA_CM_EVENT_REJECTED\0",
        RDMA_CM_EVENT_ESTABLISHED => b"RDMA_CM_EVENT_ESTABLISHED\0",
        RDMA_CM_EVENT_DISCONNECTED => b"RDMA_CM_EVENT_DISCONNECTED\0",
        RDMA_CM_EVENT_DEVICE_REMOVAL => b"RDMA_CM_EVENT_DEVICE_REMOVAL\0",
        RDMA_CM_EVENT_MULTICAST_JOIN => b"RDMA_CM_EVENT_MULTICAST_JOIN\0",
        RDMA_CM_EVENT_MULTICAST_ERROR => b"RDMA_CM_EVENT_MULTICAST_ERROR\0",
        RDMA_CM_EVENT_ADDR_CHANGE => b"RDMA_CM_EVENT_ADDR_CHANGE\0",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => b"RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
        _ => b"UNKNOWN EVENT\0",
    };
    s.as_ptr().cast()
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard(std::ptr::null_mut(), || {
        let list: Vec<*mut ibv_context> = match device() {
            Ok(c) => vec![c, std::ptr::null_mut()],
            Err(_) => vec![std::ptr::null_mut()],
        };
        if !num.is_null() {
            // SAFETY: the caller's out pointer.
            unsafe { *num = (list.len() - 1) as c_int };
        }
        Box::into_raw(list.into_boxed_slice()).cast()
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_free_devices(list: *mut *mut ibv_context) {
    guard((), || {
        if list.is_null() {
            return;
        }
        // The list's length: its entries up to the NULL, plus the NULL.
        let mut n = 0;
        // SAFETY: a NULL-terminated list from rdma_get_devices.
        while !unsafe { *list.add(n) }.is_null() {
            n += 1;
        }
        // SAFETY: from Box::into_raw of a boxed slice of n + 1 entries.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n + 1)) });
    })
}

/// librdmacm's `struct rdma_addrinfo` (`<rdma/rdma_cma.h>`).
#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: u32,
    pub ai_dst_len: u32,
    pub ai_src_addr: *mut sockaddr,
    pub ai_dst_addr: *mut sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

const RAI_PASSIVE: c_int = 1;

/// `rdma_getaddrinfo`: the first address `getaddrinfo(3)` gives for `node`/`service` (no
/// node: the unspecified address), as the source (`RAI_PASSIVE`) or the destination. The
/// vrdma device needs no route: `ai_route` stays NULL.
#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(err(EIO), || {
        if res.is_null() || (node.is_null() && service.is_null()) {
            return err(EINVAL);
        }
        // SAFETY: the program's hints, if any.
        let h = unsafe { hints.as_ref() };
        let flags = h.map_or(0, |h| h.ai_flags);
        // SAFETY: all-zero is a valid addrinfo hint block.
        let mut ghints: libc::addrinfo = unsafe { std::mem::zeroed() };
        ghints.ai_family = h.map_or(0, |h| h.ai_family);
        ghints.ai_socktype = libc::SOCK_STREAM;
        if flags & RAI_PASSIVE != 0 {
            ghints.ai_flags = libc::AI_PASSIVE;
        }
        let mut gres: *mut libc::addrinfo = std::ptr::null_mut();
        // SAFETY: NUL-terminated strings (or NULL) from the program; libc fills `gres`.
        let rc = unsafe { libc::getaddrinfo(node, service, &ghints, &mut gres) };
        if rc != 0 || gres.is_null() {
            return err(ENODEV);
        }
        // SAFETY: a result list from getaddrinfo; its first entry's address.
        let a = unsafe { sockaddr_of((*gres).ai_addr.cast()) };
        // SAFETY: the list getaddrinfo gave.
        unsafe { libc::freeaddrinfo(gres) };
        let Some(a) = a else {
            return err(EAFNOSUPPORT);
        };
        let sa = Box::into_raw(Box::new(sockaddr_to(a))).cast::<sockaddr>();
        let len = if a.is_ipv4() {
            size_of::<sockaddr_in>()
        } else {
            size_of::<sockaddr_in6>()
        } as u32;
        let passive = flags & RAI_PASSIVE != 0;
        let ai = Box::new(rdma_addrinfo {
            ai_flags: flags,
            ai_family: if a.is_ipv4() {
                libc::AF_INET
            } else {
                libc::AF_INET6
            },
            ai_qp_type: h.map_or(IBV_QPT_RC as c_int, |h| {
                if h.ai_qp_type == 0 {
                    IBV_QPT_RC as c_int
                } else {
                    h.ai_qp_type
                }
            }),
            ai_port_space: h.map_or(RDMA_PS_TCP as c_int, |h| {
                if h.ai_port_space == 0 {
                    RDMA_PS_TCP as c_int
                } else {
                    h.ai_port_space
                }
            }),
            ai_src_len: if passive { len } else { 0 },
            ai_dst_len: if passive { 0 } else { len },
            ai_src_addr: if passive { sa } else { std::ptr::null_mut() },
            ai_dst_addr: if passive { std::ptr::null_mut() } else { sa },
            ai_src_canonname: std::ptr::null_mut(),
            ai_dst_canonname: std::ptr::null_mut(),
            ai_route_len: 0,
            ai_route: std::ptr::null_mut(),
            ai_connect_len: 0,
            ai_connect: std::ptr::null_mut(),
            ai_next: std::ptr::null_mut(),
        });
        // SAFETY: the caller's out pointer.
        unsafe { *res = Box::into_raw(ai) };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard((), || {
        let mut p = res;
        while !p.is_null() {
            // SAFETY: from Box::into_raw in rdma_getaddrinfo, freed once.
            let ai = unsafe { Box::from_raw(p) };
            for sa in [ai.ai_src_addr, ai.ai_dst_addr] {
                if !sa.is_null() {
                    // SAFETY: a boxed `rdma_sockaddr` of rdma_getaddrinfo.
                    drop(unsafe { Box::from_raw(sa.cast::<rdma_sockaddr>()) });
                }
            }
            p = ai.ai_next;
        }
    })
}

/// `rdma_set_option`: the id-level options (`RDMA_OPTION_ID`: TOS, REUSEADDR, AFONLY,
/// ACK_TIMEOUT) are accepted and have no effect (the backend chooses); others `ENOSYS`.
#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_rdma_set_option(
    p: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    _optval: *mut c_void,
    _optlen: usize,
) -> c_int {
    guard(err(EIO), || {
        // SAFETY: C contract.
        if unsafe { Id::of(p) }.is_none() {
            return err(EINVAL);
        }
        if level == 0 && (0..=3).contains(&optname) {
            0
        } else {
            err(ENOSYS)
        }
    })
}

/// The calls librdmacm has and this library does not implement: -1, errno `ENOSYS`.
macro_rules! unsupported {
    ($($name:ident),+ $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            err(ENOSYS)
        }
    )+};
}

unsupported!(
    vrdma_verbs_rdma_create_ep,
    vrdma_verbs_rdma_init_qp_attr,
    vrdma_verbs_rdma_establish,
    vrdma_verbs_rdma_notify,
    vrdma_verbs_rdma_join_multicast,
    vrdma_verbs_rdma_join_multicast_ex,
    vrdma_verbs_rdma_leave_multicast,
    vrdma_verbs_rdma_create_qp_ex,
    vrdma_verbs_rdma_create_srq,
    vrdma_verbs_rdma_create_srq_ex,
    vrdma_verbs_rdma_get_request,
    vrdma_verbs_rdma_set_local_ece,
    vrdma_verbs_rdma_get_remote_ece,
    vrdma_verbs_rdma_reject_ece,
);

#[cfg(test)]
mod tests {
    use super::*;

    fn errno() -> i32 {
        // SAFETY: the calling thread's errno slot.
        unsafe { *libc::__errno_location() }
    }

    #[test]
    fn bad_arguments_are_errors_and_unsupported_calls_enosys() {
        // SAFETY: NULL objects everywhere: the library must refuse, not dereference.
        unsafe {
            let mut id = std::ptr::null_mut();
            assert_eq!(
                vrdma_verbs_rdma_create_id(
                    std::ptr::null_mut(),
                    &mut id,
                    std::ptr::null_mut(),
                    RDMA_PS_TCP
                ),
                -1
            );
            assert_eq!(errno(), EOPNOTSUPP);
            assert_eq!(vrdma_verbs_rdma_destroy_id(std::ptr::null_mut()), -1);
            assert_eq!(errno(), EINVAL);
            assert_eq!(vrdma_verbs_rdma_listen(std::ptr::null_mut(), 1), -1);
            assert_eq!(
                vrdma_verbs_rdma_connect(std::ptr::null_mut(), std::ptr::null_mut()),
                -1
            );
            assert_eq!(vrdma_verbs_rdma_disconnect(std::ptr::null_mut()), -1);
            assert_eq!(vrdma_verbs_rdma_ack_cm_event(std::ptr::null_mut()), -1);
            assert_eq!(vrdma_verbs_rdma_init_qp_attr(), -1);
            assert_eq!(errno(), ENOSYS);
            let s = std::ffi::CStr::from_ptr(vrdma_verbs_rdma_event_str(RDMA_CM_EVENT_ESTABLISHED));
            assert_eq!(s.to_str().unwrap(), "RDMA_CM_EVENT_ESTABLISHED");
        }
    }

    /// A non-blocking read on a duplicate of `fd`: Ok(0) at EOF (no write end left open),
    /// Err(EAGAIN) while some write end is open and nothing is buffered.
    fn read_nonblocking(fd: c_int) -> std::io::Result<usize> {
        let mut b = [0u8; 1];
        // SAFETY: plain fd calls on a duplicate this function owns and closes.
        unsafe {
            let d = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0);
            assert!(d >= 0, "dup of the channel's fd");
            let fl = libc::fcntl(d, libc::F_GETFL);
            assert_eq!(libc::fcntl(d, libc::F_SETFL, fl | libc::O_NONBLOCK), 0);
            let n = libc::read(d, b.as_mut_ptr().cast(), 1);
            let r = if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as usize)
            };
            libc::close(d);
            r
        }
    }

    #[test]
    fn a_destroyed_event_channel_closes_both_ends_of_its_pipe() {
        // SAFETY: channels of this library, used as the C API says; a duplicate of the
        // program's fd taken before the channel goes.
        unsafe {
            let ch = vrdma_verbs_rdma_create_event_channel();
            assert!(!ch.is_null());
            let fd = (*ch).fd;
            assert_eq!(
                read_nonblocking(fd).map_err(|e| e.raw_os_error()),
                Err(Some(EAGAIN)),
                "a live channel's pipe has its write end"
            );
            let d = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0);
            assert!(d >= 0);
            vrdma_verbs_rdma_destroy_event_channel(ch);
            // The duplicate reads EOF: no write end of the pipe is left open (no fd kept
            // per destroyed channel).
            let r = read_nonblocking(d).map_err(|e| e.raw_os_error());
            libc::close(d);
            assert_eq!(r, Ok(0), "the destroyed channel's write end is still open");
        }
    }

    #[test]
    fn a_reader_blocked_on_a_destroyed_channel_stays_blocked() {
        use std::sync::atomic::AtomicI32;
        // rping destroys its channel while its event thread waits in rdma_get_cm_event and
        // then exits: that thread must neither return an error (rping exits 255 then) nor
        // touch freed memory.
        // SAFETY: a new channel of ours (its address goes to the reader as an integer).
        let chp = unsafe { vrdma_verbs_rdma_create_event_channel() };
        assert!(!chp.is_null());
        let ch = Ptr(chp as usize);
        let tid = Arc::new(AtomicI32::new(0));
        let returned = Arc::new(AtomicBool::new(false));
        let (t2, r2) = (tid.clone(), returned.clone());
        std::thread::spawn(move || {
            // SAFETY: the calling thread's id.
            t2.store(unsafe { libc::gettid() }, Ordering::Release);
            let mut e = std::ptr::null_mut();
            // SAFETY: a live channel of ours when the call starts.
            let _ = unsafe { vrdma_verbs_rdma_get_cm_event(ch.0 as *mut _, &mut e) };
            r2.store(true, Ordering::Release);
        });
        // Wait (bounded) until the reader is in read(2) (syscall 0 on x86_64, 63 on aarch64).
        let read_nr = if cfg!(target_arch = "aarch64") { 63 } else { 0 };
        let mut blocked = false;
        for _ in 0..500 {
            let t = tid.load(Ordering::Acquire);
            if t != 0 {
                let s = std::fs::read_to_string(format!("/proc/self/task/{t}/syscall"))
                    .unwrap_or_default();
                if s.split_whitespace().next() == Some(&read_nr.to_string()) {
                    blocked = true;
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(blocked, "the reader never blocked in read(2)");
        // SAFETY: our channel, destroyed once, while its reader blocks.
        unsafe { vrdma_verbs_rdma_destroy_event_channel(chp) };
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !returned.load(Ordering::Acquire),
            "rdma_get_cm_event returned on a destroyed channel"
        );
        // The reader stays blocked until the test process ends (as rping's does).
    }

    #[test]
    fn an_event_channel_delivers_queued_events_in_order_and_is_pollable() {
        // SAFETY: a channel and an id of this library, used as the C API says.
        unsafe {
            let ch = vrdma_verbs_rdma_create_event_channel();
            assert!(!ch.is_null());
            let mut id = std::ptr::null_mut();
            assert_eq!(
                vrdma_verbs_rdma_create_id(ch, &mut id, std::ptr::null_mut(), RDMA_PS_TCP),
                0
            );
            push_own(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
            push(
                id,
                std::ptr::null_mut(),
                RDMA_CM_EVENT_REJECTED,
                28,
                b"no",
                (0, 0),
            );
            let mut pfd = libc::pollfd {
                fd: (*ch).fd,
                events: libc::POLLIN,
                revents: 0,
            };
            assert_eq!(libc::poll(&mut pfd, 1, 0), 1);
            let mut e = std::ptr::null_mut();
            assert_eq!(vrdma_verbs_rdma_get_cm_event(ch, &mut e), 0);
            assert_eq!((*e).event, RDMA_CM_EVENT_ADDR_RESOLVED);
            assert_eq!((*e).id, id);
            assert_eq!(vrdma_verbs_rdma_ack_cm_event(e), 0);
            assert_eq!(vrdma_verbs_rdma_get_cm_event(ch, &mut e), 0);
            assert_eq!((*e).event, RDMA_CM_EVENT_REJECTED);
            assert_eq!((*e).status, 28);
            let c = (*e).param.conn;
            assert_eq!(
                std::slice::from_raw_parts(c.private_data.cast::<u8>(), 2),
                b"no"
            );
            assert_eq!(vrdma_verbs_rdma_ack_cm_event(e), 0);
            assert_eq!(libc::poll(&mut pfd, 1, 0), 0, "no event left");
            // Events of a destroyed id are not handed out; the next id's are.
            let mut id2 = std::ptr::null_mut();
            assert_eq!(
                vrdma_verbs_rdma_create_id(ch, &mut id2, std::ptr::null_mut(), RDMA_PS_TCP),
                0
            );
            push_own(id, RDMA_CM_EVENT_DISCONNECTED, 0);
            assert_eq!(vrdma_verbs_rdma_destroy_id(id), 0);
            push_own(id2, RDMA_CM_EVENT_ESTABLISHED, 0);
            assert_eq!(vrdma_verbs_rdma_get_cm_event(ch, &mut e), 0);
            assert_eq!((*e).id, id2);
            assert_eq!((*e).event, RDMA_CM_EVENT_ESTABLISHED);
            assert_eq!(vrdma_verbs_rdma_ack_cm_event(e), 0);
            assert_eq!(vrdma_verbs_rdma_destroy_id(id2), 0);
            vrdma_verbs_rdma_destroy_event_channel(ch);
        }
    }
}
